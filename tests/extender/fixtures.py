"""Small clusters as the apiserver would return them, built with the harness' own node builder."""
from __future__ import annotations

from typing import Any

from gpuaas.workloads import gpu_pod
from runtime.pools import parse_pool_spec, spec_node_objects

POOLS = {"pools": [
    {"name": "a100", "count": 3, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"},
    {"name": "h100", "count": 2, "gpu": {"model": "H100-80GB", "count": 4}, "cpu": "96", "memory": "1Ti"},
    {"name": "mig", "count": 1, "gpu": {"model": "A100-80GB", "count": 8, "mig": "all-3g.40gb"}, "cpu": "128",
     "memory": "1Ti"},
    {"name": "cpu", "count": 1, "cpu": "64", "memory": "256Gi"},
]}


def nodes() -> list[dict[str, Any]]:
    return spec_node_objects(parse_pool_spec(POOLS))


def bound(pod: dict[str, Any], node: str, devices: str | None = None) -> dict[str, Any]:
    pod = {**pod, "spec": {**pod["spec"], "nodeName": node}, "status": {"phase": "Running"}}
    pod["metadata"] = {**pod["metadata"], "uid": f"uid-{pod['metadata']['name']}"}
    if devices is not None:
        pod["metadata"]["annotations"] = {**pod["metadata"].get("annotations", {}), "gpuaas.io/devices": devices}
    return pod


def pending(name: str, **kwargs: Any) -> dict[str, Any]:
    pod = gpu_pod(name, "ml", **kwargs)
    pod["metadata"]["uid"] = f"uid-{name}"
    pod["status"] = {"phase": "Pending"}
    return pod


def names() -> list[str]:
    return [n["metadata"]["name"] for n in nodes()]

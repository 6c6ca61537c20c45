"""Fluent-enough builders of Node, Pod and PDB dicts (as the API returns them) for the node scaler's unit tests."""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from gpuaas.workloads import gpu_pod
from nodescaler.config import NodeScalerConfig
from nodescaler.provider import render_node
from nodescaler.snapshot import DRAIN_ANNOTATION, DrainRecord
from runtime.pools import parse_pool_spec, spec_node_objects

T0 = 1_800_000_000.0  # "now" of the tests, epoch seconds
A100X8 = {"gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"}
H100X8 = {"gpu": {"model": "H100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"}
A100X4 = {"gpu": {"model": "A100-80GB", "count": 4}, "cpu": "64", "memory": "512Gi"}


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def config(groups: list[dict] | None = None, **over: Any) -> NodeScalerConfig:
    data = {"groups": groups or [
        {"name": "a100x8", "template": A100X8, "max_size": 100, "cost_per_hour": 20},
        {"name": "h100x8", "template": H100X8, "max_size": 100, "cost_per_hour": 32},
        {"name": "a100x4", "template": A100X4, "max_size": 100, "cost_per_hour": 11},
    ], "scale_in": {"unneeded_s": 60, "delay_after_add_s": 60}, "scale_out": {"planner_time_limit_s": 0.5}}
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    return NodeScalerConfig.model_validate(data)


def nodes(pool: str, count: int, template: dict = A100X8, *, created: float = T0 - 3600) -> list[dict]:
    out = spec_node_objects(parse_pool_spec({"pools": [{"name": pool, "count": count, **template}]}))
    for n in out:
        n["metadata"]["creationTimestamp"] = iso(created)
        n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return out


def booting_node(cfg: NodeScalerConfig, group: str, name: str, *, created: float = T0 - 5) -> dict:
    n = render_node(cfg.group(group), name, created)
    n["metadata"]["creationTimestamp"] = iso(created)
    n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return n


def pod(name: str, *, node: str = "", ns: str = "default", phase: str | None = None, owner: str = "ReplicaSet",
        annotations: dict | None = None, labels: dict | None = None, unschedulable_since: float | None = None,
        terminating: bool = False, uid: str | None = None, created: float = T0 - 600, **res: Any) -> dict:
    p = gpu_pod(name, ns, labels=labels, **res)
    meta = p["metadata"]
    meta["uid"] = uid or f"uid-{name}"
    meta["creationTimestamp"] = iso(created)
    meta["annotations"].update(annotations or {})
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": f"{name}-owner", "controller": True, "apiVersion": "v1",
                                    "uid": "o"}]
    if terminating:
        meta["deletionTimestamp"] = iso(T0 - 1)
    p["status"] = {"phase": phase or ("Running" if node else "Pending")}
    if node:
        p["spec"]["nodeName"] = node
    elif unschedulable_since is not None:
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                      "lastTransitionTime": iso(unschedulable_since)}]
    return p


def pending(name: str, **kw: Any) -> dict:
    return pod(name, unschedulable_since=kw.pop("since", T0 - 1), **kw)


def pdb(name: str, app: str, allowed: int, ns: str = "default") -> dict:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": allowed}}


def draining(node: dict, *, started: float = T0 - 10, deadline: float = T0 + 600, drain_id: str = "d1") -> dict:
    node["metadata"]["annotations"][DRAIN_ANNOTATION] = DrainRecord(drain_id, "test", started, deadline).to_json()
    node["spec"]["unschedulable"] = True
    node["spec"]["taints"] = [{"key": "gpuaas.io/draining", "value": drain_id, "effect": "NoSchedule"}]
    return node


def mig_nodes(pool: str, count: int, layout: str = "all-1g.10gb") -> list[dict]:
    return nodes(pool, count, {**A100X8, "gpu": {**A100X8["gpu"], "mig": layout}})


def dump(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)

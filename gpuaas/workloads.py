"""Kubernetes objects for GPU workloads: what the demo submits and the end-to-end tests schedule."""
from __future__ import annotations

from typing import Any

from .cluster.stages import COMPLETE_AFTER_ANNOTATION

FAKE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: kwok plays the kubelet


def container(*, gpus: int = 0, mig: str | None = None, cpu: str = "1", memory: str = "1Gi",
              name: str = "main") -> dict[str, Any]:
    """One container asking for `gpus` whole GPUs, or one MIG instance of profile `mig` (e.g. "1g.10gb")."""
    limits: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if mig:
        limits[f"nvidia.com/mig-{mig}"] = "1"
    return {"name": name, "image": FAKE_IMAGE,
            "resources": {"requests": {"cpu": cpu, "memory": memory, **limits}, "limits": limits}}


def pod_template(*, labels: dict[str, str], annotations: dict[str, str] | None = None,
                 scheduler_name: str | None = None, **container_args: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container(**container_args)], "terminationGracePeriodSeconds": 1}
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    return {"metadata": {"labels": labels, "annotations": annotations or {}}, "spec": spec}


def gpu_pod(name: str, namespace: str = "default", *, complete_after: str | None = None,
            labels: dict[str, str] | None = None, **container_args: Any) -> dict[str, Any]:
    """A bare pod. `complete_after` (a Go duration, "5s") makes kwok finish it with Succeeded after that long."""
    annotations = {COMPLETE_AFTER_ANNOTATION: complete_after} if complete_after else {}
    template = pod_template(labels={"app": name, **(labels or {})}, annotations=annotations, **container_args)
    template["metadata"].update(name=name, namespace=namespace)
    if complete_after:
        template["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "v1", "kind": "Pod", **template}


def gpu_deployment(name: str, namespace: str = "default", *, replicas: int = 1, **container_args: Any) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": pod_template(labels=labels, **container_args)},
    }

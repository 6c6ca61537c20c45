"""Kubernetes objects for GPU workloads: what the demo submits and the end-to-end tests schedule."""
from __future__ import annotations

from typing import Any

from scoring.kubeobjects import GPU_RESOURCE, MODELS_ANNOTATION, SHARE_RESOURCE
from scoring.model import PodDemand

from .cluster.stages import COMPLETE_AFTER_ANNOTATION

FAKE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: kwok plays the kubelet


def container(*, gpus: int = 0, mig: str | None = None, gpu_share: int = 0, cpu: str = "1", memory: str = "1Gi",
              name: str = "main") -> dict[str, Any]:
    """One container asking for `gpus` whole GPUs, one MIG instance of profile `mig` (e.g. "1g.10gb"), or
    `gpu_share` thousandths of one GPU."""
    limits: dict[str, str] = {}
    if gpus:
        limits[GPU_RESOURCE] = str(gpus)
    if mig:
        limits[f"nvidia.com/mig-{mig}"] = "1"
    if gpu_share:
        limits[SHARE_RESOURCE] = str(gpu_share)
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


def gpu_deployment(name: str, namespace: str = "default", *, replicas: int = 1,
                   **container_args: Any) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": pod_template(labels=labels, **container_args)},
    }


def pod_for_demand(name: str, namespace: str, demand: PodDemand) -> dict[str, Any]:
    """The pod a model demand stands for (trace replays): the inverse of scoring.kubeobjects.pod_demand."""
    pod = gpu_pod(name, namespace, cpu=f"{demand.cpu_milli}m", memory=f"{demand.memory_mib}Mi",
                  gpus=demand.gpus if demand.takes_replicas else 0, mig=demand.mig_profile or None,
                  gpu_share=demand.gpu_milli if demand.is_share or demand.whole_share else 0)
    if demand.allowed_models:
        pod["metadata"]["annotations"][MODELS_ANNOTATION] = ",".join(sorted(demand.allowed_models))
    return pod

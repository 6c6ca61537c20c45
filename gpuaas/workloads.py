"""Kubernetes objects for GPU workloads: what the demo submits and the end-to-end tests schedule."""
from __future__ import annotations

import dataclasses
from typing import Any

from scoring.dra import DRIVER, GPU_CLASS, MIG_CLASS, SHARE_CAPACITY, SHARE_CLASS
from scoring.gangs import GANG_GATE
from scoring.gpus import GPU_MODELS
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


# -- DRA (docs/devices.md, "What a user writes in DRA mode") -----------------------------------------------------------

def dra_template_name(demand: PodDemand) -> str:
    """The name of the ResourceClaimTemplate `dra_claim_template` makes for the GPUs of `demand`: one template per
    shape, shared by every pod of that shape (each pod still gets its own claim)."""
    if not demand.gpus:
        raise ValueError(f"pod {demand.name or '?'} asks for no GPU: it needs no claim")
    if demand.mig_profile:
        name = f"mig-{demand.mig_profile.replace('.', '-')}"
    elif demand.is_share or demand.whole_share:
        name = f"share-{demand.gpu_milli}"
    else:
        name = f"gpu-{demand.gpus}"
    if demand.allowed_models:
        name += "-" + "-".join(sorted(demand.allowed_models)).lower().replace("_", "-")
    return name


def dra_claim_template(demand: PodDemand, namespace: str) -> dict[str, Any]:
    """The ResourceClaimTemplate a user writes for the GPUs of `demand`: N whole GPUs of class gpu.nvidia.com, one MIG
    partition of class mig.nvidia.com with a profile selector, or a share of class gpu-share.gpuaas.io asking
    capacity `share` in thousandths. A GPU model the pod is limited to becomes a productName selector (one model: a
    claim's selectors all hold at once)."""
    exactly: dict[str, Any]
    selectors = []
    if len(demand.allowed_models) > 1:
        raise ValueError(f"pod {demand.name or '?'} allows {len(demand.allowed_models)} GPU models; a claim's "
                         "selectors can name one")
    for model in demand.allowed_models:
        if model not in GPU_MODELS:
            raise ValueError(f"pod {demand.name or '?'}: GPU model {model!r} is not in the catalog")
        product = GPU_MODELS[model].product.replace("-", " ", 1)  # NVML's name (runtime.draslices.product_name)
        selectors.append({"cel": {"expression": f"device.attributes['{DRIVER}'].productName == '{product}'"}})
    if demand.mig_profile:
        selectors.insert(0, {"cel": {"expression": f"device.attributes['{DRIVER}'].profile == "
                                                   f"'{demand.mig_profile}'"}})
        exactly = {"deviceClassName": MIG_CLASS}
    elif demand.is_share or demand.whole_share:
        exactly = {"deviceClassName": SHARE_CLASS, "capacity": {"requests": {SHARE_CAPACITY: str(demand.gpu_milli)}}}
    else:
        exactly = {"deviceClassName": GPU_CLASS, **({"count": demand.gpus} if demand.gpus > 1 else {})}
    if selectors:
        exactly["selectors"] = selectors
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": dra_template_name(demand), "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}


def dra_pod_for_demand(name: str, namespace: str, demand: PodDemand, *, gated: bool = False) -> dict[str, Any]:
    """The pod `demand` stands for on DRA nodes: its CPU and memory as requests, its GPUs through a claim made from
    the template `dra_claim_template(demand)` names (no extended resource). `gated`: created with the gate
    gpuaas.io/gang, as the webhook gates pods with claims for gpuaas to allocate them."""
    cpu_only = dataclasses.replace(demand, gpus=0, gpu_milli=0, mig_profile="", allowed_models=frozenset(),
                                   whole_share=False)
    pod = pod_for_demand(name, namespace, cpu_only)
    if demand.gpus:
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": dra_template_name(demand)}]
        pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        if gated:
            pod["spec"]["schedulingGates"] = [{"name": GANG_GATE}]
    return pod

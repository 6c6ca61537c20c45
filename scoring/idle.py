"""Idle GPUs: which workloads hold GPUs they do not use. Pure: pods, owners and utilization samples in, a report out.

The utilization comes from dcgm-exporter (NVIDIA/dcgm-exporter, `etc/default-counters.csv`), one series per GPU with the
`namespace`, `pod` and `container` labels of the pod the GPU is assigned to (empty when none is):

- `DCGM_FI_DEV_GPU_UTIL`, a gauge in percent: the share of the last sample period in which a kernel ran;
- `DCGM_FI_PROF_GR_ENGINE_ACTIVE`, a gauge from 0 to 1: the share of time the graphics (compute) engine was active.

A pod's use over the window is the larger of the two (either may be missing: profiling metrics need a DCGM that
supports them), each averaged over the window and over the pod's GPUs. A workload (the pod's top owner: a Deployment
through its ReplicaSet, a CronJob through its Job, else the controller or the pod itself) is idle when the GPU-weighted
use of its judged pods is below the threshold. Pods younger than `min_age_s` are not judged (a model still loading),
nor pods without any sample (no dcgm-exporter on their node, or its labels renamed): they are listed as such.
GPU-hours held idle: each judged pod's GPUs times the part of the window it held them.
"""
from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .gpus import MIG_RESOURCE_PREFIX, GpuModel
from .kubeobjects import GPU_RESOURCE, SHARE_RESOURCE, holds_resources, pod_requests
from .model import MILLI

MIG_COMPUTE_SLICES = 7  # A100 and H100: a MIG instance "<n>g.<mem>" has n of a GPU's 7 compute slices
# The two-level chains Kubernetes' own controllers make; any other controller is the workload itself.
PARENT_KINDS = {"ReplicaSet": "Deployment", "Job": "CronJob"}


@dataclass(frozen=True, order=True)
class Workload:
    """What a user deployed: the top owner of a pod (kind "Pod" for a bare pod)."""
    namespace: str
    kind: str
    name: str
    uid: str = field(default="", compare=False)
    api_version: str = field(default="v1", compare=False)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind.lower()}/{self.name}"

    def ref(self) -> dict[str, str]:
        """An involvedObject for an event on it."""
        return {"apiVersion": self.api_version, "kind": self.kind, "namespace": self.namespace, "name": self.name,
                "uid": self.uid}


def controller_of(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with controller: true, if any."""
    return next((r for r in meta.get("ownerReferences") or () if r.get("controller")), None)


def owner_lookups(pods: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    """The (kind, namespace, name) of the owners `resolve_workload` needs read to go one level up."""
    out = set()
    for p in pods:
        ref = controller_of(p.get("metadata") or {})
        if ref and ref.get("kind") in PARENT_KINDS:
            out.add((ref["kind"], (p.get("metadata") or {}).get("namespace", "default"), ref["name"]))
    return out


def resolve_workload(pod: Mapping[str, Any], owners: Mapping[tuple[str, str, str], Mapping[str, Any] | None]) \
        -> Workload:
    """The pod's workload. `owners[(kind, namespace, name)]`: the metadata of that ReplicaSet or Job (None or absent:
    gone or not readable; the ReplicaSet or Job is then the workload)."""
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace", "default")
    ref = controller_of(meta)
    if ref is None:
        return Workload(ns, "Pod", meta.get("name", "?"), meta.get("uid", ""), "v1")
    if ref.get("kind") in PARENT_KINDS:
        owner = owners.get((ref["kind"], ns, ref["name"]))
        parent = controller_of(owner) if owner else None
        if parent is not None and parent.get("kind") == PARENT_KINDS[ref["kind"]]:
            return Workload(ns, parent["kind"], parent["name"], parent.get("uid", ""),
                            parent.get("apiVersion", "apps/v1"))
    return Workload(ns, ref.get("kind", "?"), ref.get("name", "?"), ref.get("uid", ""), ref.get("apiVersion", "v1"))


def pod_gpus(pod: Mapping[str, Any], model: GpuModel | None = None) -> float:
    """Whole-GPU equivalents the pod requests: whole GPUs, a share as its thousandths, a MIG instance as its compute
    slices over its GPU's (`model`'s when known, else over seven: A100 and H100, read from the profile's name)."""
    total = 0.0
    for name, qty in pod_requests(pod).items():
        if name == GPU_RESOURCE:
            total += float(qty)
        elif name == SHARE_RESOURCE:
            total += float(qty) / MILLI
        elif name.startswith(MIG_RESOURCE_PREFIX) and qty > 0:
            if model is not None and model.mig_capable:
                full = max(p.compute_slices for p in model.mig_profiles.values())
                total += float(qty) * model.mig_profile(name).compute_slices / full
                continue
            slices = name[len(MIG_RESOURCE_PREFIX):].split("g.", 1)[0]
            total += float(qty) * (int(slices) if slices.isdigit() else 1) / MIG_COMPUTE_SLICES
    return total


def pod_utilization(gpu_util_pct: Mapping[tuple[str, str], float],
                    engine_active: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """Per (namespace, pod): the larger of DCGM_FI_DEV_GPU_UTIL / 100 and DCGM_FI_PROF_GR_ENGINE_ACTIVE, each already
    averaged over the window and the pod's GPUs; NaN and infinite values are dropped, values clipped to 0..1."""
    out: dict[tuple[str, str], float] = {}
    for values, scale in ((gpu_util_pct, 100.0), (engine_active, 1.0)):
        for key, v in values.items():
            if math.isfinite(v):
                out[key] = max(out.get(key, 0.0), min(1.0, max(0.0, v / scale)))
    return out


@dataclass(frozen=True)
class PodUse:
    namespace: str
    pod: str
    gpus: float
    held_s: float  # since the pod started
    utilization: float | None  # None: no sample


@dataclass(frozen=True)
class WorkloadUse:
    workload: Workload
    pods: tuple[PodUse, ...]  # judged pods (measured, old enough)
    gpus: float  # held by the judged pods
    utilization: float  # GPU-weighted over the judged pods
    gpu_hours: float  # judged pods' GPUs x the part of the window they held them
    idle: bool

    @property
    def idle_gpu_hours(self) -> float:
        return self.gpu_hours if self.idle else 0.0


@dataclass(frozen=True)
class IdleReport:
    threshold: float
    window_s: float
    workloads: tuple[WorkloadUse, ...]  # every judged workload, idle ones first, most GPU-hours first
    unmeasured: tuple[tuple[Workload, PodUse], ...] = ()  # pods holding GPUs without any sample
    too_new: tuple[tuple[Workload, PodUse], ...] = ()  # pods younger than min_age_s

    @property
    def idle(self) -> tuple[WorkloadUse, ...]:
        return tuple(w for w in self.workloads if w.idle)

    @property
    def idle_gpu_hours(self) -> float:
        return sum(w.gpu_hours for w in self.idle)


def find_idle(pods: Iterable[Mapping[str, Any]], owners: Mapping[tuple[str, str, str], Mapping[str, Any] | None],
              utilization: Mapping[tuple[str, str], float], *, now: float, threshold: float, window_s: float,
              min_age_s: float) -> IdleReport:
    """The workloads whose pods hold GPUs (bound, not finished) and used less than `threshold` (0..1) of them over the
    last `window_s`. `now`: epoch seconds, against the pods' status.startTime (a pod without one has just started)."""
    if not 0 <= threshold <= 1:
        raise ValueError(f"threshold must be within 0..1, got {threshold}")
    if window_s <= 0:
        raise ValueError(f"window must be > 0 s, got {window_s}")
    judged: dict[Workload, list[PodUse]] = {}
    unmeasured, too_new = [], []
    for p in pods:
        gpus = pod_gpus(p)
        if gpus <= 0 or not holds_resources(p) or (p.get("status") or {}).get("phase") != "Running":
            continue
        meta = p.get("metadata") or {}
        ns, name = meta.get("namespace", "default"), meta.get("name", "?")
        started = _epoch((p.get("status") or {}).get("startTime"))
        held = max(0.0, now - started) if started is not None else 0.0
        use = PodUse(ns, name, gpus, held, utilization.get((ns, name)))
        workload = resolve_workload(p, owners)
        if held < min_age_s:
            too_new.append((workload, use))
        elif use.utilization is None:
            unmeasured.append((workload, use))
        else:
            judged.setdefault(workload, []).append(use)
    out = []
    for workload, uses in judged.items():
        gpus = sum(u.gpus for u in uses)
        util = sum(u.gpus * (u.utilization or 0.0) for u in uses) / gpus
        hours = sum(u.gpus * min(window_s, u.held_s) for u in uses) / 3600
        out.append(WorkloadUse(workload, tuple(sorted(uses, key=lambda u: u.pod)), gpus, util, hours,
                               idle=util < threshold))
    out.sort(key=lambda w: (not w.idle, -w.gpu_hours if w.idle else w.utilization, w.workload))
    return IdleReport(threshold, window_s, tuple(out), tuple(sorted(unmeasured, key=_first)),
                      tuple(sorted(too_new, key=_first)))


def _first(item: tuple[Workload, PodUse]) -> tuple[Workload, str]:
    return item[0], item[1].pod


def _epoch(timestamp: Any) -> float | None:
    if timestamp is None:
        return None
    if isinstance(timestamp, dt.datetime):
        return timestamp.timestamp()
    try:
        return dt.datetime.fromisoformat(str(timestamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None

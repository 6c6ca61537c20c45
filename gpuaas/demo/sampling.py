"""What the demo records about a cluster: one sample every few seconds, the events of the autoscalers, and the final
state. The functions here are pure (objects in, numbers out: Nodes, Pods and Deployments as the API returns them, plain
dicts); `ClusterReader` is the thin shell that lists them.

Counting rules (the end-to-end test checks `final` against `kubectl` with the same rules):
- nodes: every Node object; GPU nodes ready: Ready and advertising their GPUs (a node the nodescaler just added has
  neither until its device plugin registers);
- GPUs: whole-GPU equivalents. Total: the GPUs of the nodes that advertise them (a MIG-enabled GPU counts as one).
  Allocated: what pods bound to those nodes and not finished request: whole GPUs, a MIG instance as its compute
  slices over the GPU's (1g.10gb on an A100 = 1/7), a GPU share as its thousandths;
- pods: by phase, over all namespaces;
- fragmentation: FGD (scoring/fragmentation.py) on the scoring model of the snapshot, against the run's workload: the
  share of the free whole-GPU capacity that the workload's typical pods cannot use.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from nodescaler.snapshot import build_snapshot, node_info, parse_time
from scoring import idle
from scoring.fragmentation import FragmentationIndex, Workload
from scoring.gangs import GANG_LABEL
from scoring.gpus import MIG_RESOURCE_PREFIX, model_by_product
from scoring.kubeobjects import GPU_RESOURCE, PRODUCT_LABEL, SHARE_RESOURCE, holds_resources, pod_key, pod_requests

from ..cluster.stages import COMPLETE_AFTER_ANNOTATION

Obj = dict[str, Any]
EVENT_COMPONENTS = ("gpuaas-autoscaler", "gpuaas-nodescaler", "gpuaas-gangs")
OVERDUE_S = 10.0  # a job kwok has not finished this long after it was due is not waited for (kwok lags under load)


# -- GPUs -------------------------------------------------------------------------------------------------------------

def pod_gpus(pod: Obj, node: Obj | None) -> float:
    """Whole-GPU equivalents a pod requests (scoring.idle.pod_gpus), a MIG instance's on `node`'s GPU model."""
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    model = model_by_product(labels.get(PRODUCT_LABEL, ""))
    mig = [name for name, qty in pod_requests(pod).items() if name.startswith(MIG_RESOURCE_PREFIX) and qty > 0]
    if mig and (model is None or not model.mig_capable):
        raise ValueError(f"pod {pod_key(pod)} holds {mig[0]} on node {labels.get('kubernetes.io/hostname')} "
                         "whose GPU model has no MIG")
    return idle.pod_gpus(pod, model)


def gpu_ready(node: Obj) -> bool:
    info = node_info(node)
    return info.gpus > 0 and not info.booting


def gpus_total(nodes: Iterable[Obj]) -> int:
    return sum(node_info(n).gpus for n in nodes if gpu_ready(n))


def gpus_allocated(nodes: Iterable[Obj], pods: Iterable[Obj]) -> float:
    """On the GPU nodes counted in gpus_total (a pod whose node is gone, or not ready, holds none of those)."""
    by_name = {n["metadata"]["name"]: n for n in nodes if gpu_ready(n)}
    return sum(pod_gpus(p, by_name[p["spec"]["nodeName"]]) for p in pods
               if holds_resources(p) and p["spec"]["nodeName"] in by_name)


def whole_gpus_free(nodes: Iterable[Obj], pods: Iterable[Obj]) -> int:
    """Whole GPUs (`nvidia.com/gpu`) free on the GPU nodes counted in gpus_total: what a one-GPU replica could be bound
    to now (a node's CPU and memory are not checked: the demo's GPU nodes have room for their GPUs' pods)."""
    free = {n["metadata"]["name"]: int(str(((n.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0")))
            for n in nodes if gpu_ready(n)}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if node in free and holds_resources(p):
            free[node] -= int(pod_requests(p).get(GPU_RESOURCE, 0))
    return sum(max(0, v) for v in free.values())


def phase_counts(pods: Iterable[Obj]) -> dict[str, int]:
    out = {"Running": 0, "Pending": 0, "Succeeded": 0, "Failed": 0}
    for p in pods:
        phase = (p.get("status") or {}).get("phase") or "Pending"
        out[phase] = out.get(phase, 0) + 1
    return out


def fragmentation_ratio(nodes: list[Obj], pods: list[Obj], workload: Workload) -> float:
    """The share of the free whole-GPU capacity that the workload's typical pods cannot use (0 when none is free)."""
    state = build_snapshot(nodes, pods, [], 0.0).state
    fragmented, idle = FragmentationIndex(state, workload).cluster_fragmentation()
    return fragmented / idle if idle else 0.0


# -- serving ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Serving:
    """One inference service over one sample interval, in trace time (wall time x speed): arrivals per second, the
    queue depth Prometheus holds (what the autoscaler sees), and the waits of the requests that started."""
    arrival_rate: float | None
    queue_depth: float | None
    queue_wait_p99_s: float | None
    slo_attainment: float | None


def serving_interval(arrival_t: list[float], start_t: list[float], since: float, until: float, *, arrived_before: int,
                     arrived_now: int, speed: float, slo_s: float, queue_depth: float | None) -> Serving:
    """The readings of one interval (since, until] of the replayer's wall clock. `arrival_t`, `start_t`: per request,
    wall seconds (NaN: not started); `arrived_*`: requests that had arrived at the interval's ends."""
    span = until - since
    waits = sorted(speed * (s - a) for a, s in zip(arrival_t, start_t, strict=True) if since < s <= until)
    p99 = waits[min(len(waits) - 1, math.ceil(0.99 * len(waits)) - 1)] if waits else None
    met = sum(1 for w in waits if w <= slo_s)
    return Serving(arrival_rate=(arrived_now - arrived_before) / (span * speed) if span > 0 else None,
                   queue_depth=queue_depth, queue_wait_p99_s=p99,
                   slo_attainment=met / len(waits) if waits else None)


def slo_counts(arrival_t: list[float], start_t: list[float], slo_s: float) -> tuple[int, int]:
    """(requests that started within `slo_s` of arriving, requests that started); times in the same unit."""
    started = [(a, s) for a, s in zip(arrival_t, start_t, strict=True) if not math.isnan(s)]
    return sum(1 for a, s in started if s - a <= slo_s), len(started)


# -- one sample -------------------------------------------------------------------------------------------------------

def compute_sample(t: float, nodes: list[Obj], pods: list[Obj], deployments: list[Obj], *, workload: Workload,
                   serving: Mapping[str, Serving]) -> dict[str, Any]:
    """A sample of the run record (gpuaas.report.RunRecord) from the objects listed at time `t`."""
    total = gpus_total(nodes)
    allocated = gpus_allocated(nodes, pods)
    phases = phase_counts(pods)
    deps = {}
    for d in deployments:
        name = d["metadata"]["name"]
        if name not in serving:
            continue
        s = serving[name]
        deps[name] = {"replicas": int((d.get("spec") or {}).get("replicas") or 0),
                      "ready": int((d.get("status") or {}).get("readyReplicas") or 0),
                      "arrival_rate": s.arrival_rate, "queue_depth": s.queue_depth,
                      "queue_wait_p99_s": s.queue_wait_p99_s, "slo_attainment": s.slo_attainment}
    return {
        "t": round(t, 2),
        "nodes": len(nodes), "gpu_nodes_ready": sum(1 for n in nodes if gpu_ready(n)),
        "gpus_total": total, "gpus_allocated": round(allocated, 4),
        "allocation_ratio": round(allocated / total, 4) if total else 0.0,
        "fragmentation_ratio": round(fragmentation_ratio(nodes, pods, workload), 4),
        "pods_running": phases["Running"], "pods_pending": phases["Pending"], "pods_succeeded": phases["Succeeded"],
        "deployments": deps,
    }


# -- events -----------------------------------------------------------------------------------------------------------

def event_time(event: Obj) -> float | None:
    return parse_time(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
                      or (event.get("metadata") or {}).get("creationTimestamp"))


def component_events(events: Iterable[Obj], seen: set[str], started_at: float) -> list[dict[str, Any]]:
    """Events the autoscalers recorded that are not in `seen` (uids, updated), as run-record events."""
    out = []
    for e in events:
        uid = (e.get("metadata") or {}).get("uid", "")
        component = (e.get("source") or {}).get("component") or e.get("reportingComponent") or ""
        if uid in seen or component not in EVENT_COMPONENTS:
            continue
        seen.add(uid)
        obj = e.get("involvedObject") or {}
        ns = obj.get("namespace")
        when = event_time(e)
        out.append({"t": round(max(0.0, (when or started_at) - started_at), 2), "kind": e.get("reason", ""),
                    "object": f"{ns}/{obj.get('name')}" if ns else f"{obj.get('kind', '').lower()}/{obj.get('name')}",
                    "message": e.get("message", "")})
    out.sort(key=lambda e: e["t"])
    return out


# -- the end of the run ------------------------------------------------------------------------------------------------

def short_reason(message: str) -> str:
    """The scheduler's verdict without its preemption and DRA postscripts."""
    head = message.split(" preemption:")[0].replace(" no new claims to deallocate,", "")
    return head.rstrip(" ,.") + "."


def completion_due(pod: Obj) -> float | None:
    """When kwok will finish a running pod annotated with a completion delay (epoch seconds), or None."""
    delay = ((pod.get("metadata") or {}).get("annotations") or {}).get(COMPLETE_AFTER_ANNOTATION)
    status = pod.get("status") or {}
    if not delay or status.get("phase") != "Running":
        return None
    ready = next((c for c in status.get("conditions") or () if c.get("type") == "Ready" and c.get("status") == "True"),
                 None)
    since = parse_time(ready.get("lastTransitionTime")) if ready else None
    return None if since is None else since + go_duration(delay)


def go_duration(text: str) -> float:
    """A Go duration as the demo writes them ("12s", "1m30s", "500ms")."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    total, number = 0.0, ""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else ch
        if unit not in units or not number:
            raise ValueError(f"not a Go duration: {text!r}")
        total += float(number) * units[unit]
        number = ""
        i += len(unit)
    if number:
        raise ValueError(f"not a Go duration (no unit): {text!r}")
    return total


def settled(pods: Iterable[Obj], deployments: Iterable[Obj], now: float, quiet_s: float) -> str | None:
    """None when the cluster will look the same for `quiet_s` seconds with no controller acting on it; else what is
    still moving (a pod terminating or being started, a Deployment short of pods, a job about to finish)."""
    pods = list(pods)
    for p in pods:
        if (p.get("metadata") or {}).get("deletionTimestamp"):
            return f"pod {pod_key(p)} is terminating"
        if (p.get("spec") or {}).get("nodeName") and (p.get("status") or {}).get("phase") == "Pending":
            return f"pod {pod_key(p)} is bound and starting"
        due = completion_due(p)
        if due is not None and now - OVERDUE_S <= due <= now + quiet_s:
            return f"pod {pod_key(p)} finishes in {max(0.0, due - now):.0f}s"
    for d in deployments:
        meta = d["metadata"]
        want = int((d.get("spec") or {}).get("replicas") or 0)
        have = sum(1 for p in pods if p["metadata"]["namespace"] == meta["namespace"]
                   and _owned_by(p, meta["name"]) and (p.get("status") or {}).get("phase") in ("Pending", "Running"))
        if have != want:
            return f"Deployment {meta['namespace']}/{meta['name']} has {have} of {want} pods"
    return None


def _owned_by(pod: Obj, deployment: str) -> bool:
    # A Deployment's pods belong to its ReplicaSets, named <deployment>-<hash>.
    return any(o.get("kind") == "ReplicaSet" and o.get("name", "").rsplit("-", 1)[0] == deployment
               for o in (pod.get("metadata") or {}).get("ownerReferences") or ())


def final_state(nodes: list[Obj], pods: list[Obj], deployments: list[Obj],
                reasons: Mapping[str, str], gangs: Mapping[str, int] | None = None,
                end: float | None = None) -> dict[str, Any]:
    """The run record's `final`: counts as `kubectl get` shows them, pending pods with the scheduler's reason, where
    each pod that holds GPUs runs, and how each gang (`gangs`: name -> size) fared by `end` (epoch seconds)."""
    phases = phase_counts(pods)
    by_name = {n["metadata"]["name"]: n for n in nodes}
    pending, placements = [], []
    for p in sorted(pods, key=pod_key):
        key = pod_key(p)
        phase = (p.get("status") or {}).get("phase")
        if phase == "Pending" and not p["spec"].get("nodeName"):
            pending.append({"pod": key, "reason": reasons.get(key, "waiting for the scheduler"),
                            "request": request_text(p)})
        elif holds_resources(p):
            node = by_name.get(p["spec"]["nodeName"]) or {}
            labels = (node.get("metadata") or {}).get("labels") or {}
            placements.append({"pod": key, "node": p["spec"]["nodeName"], "gpu": labels.get(PRODUCT_LABEL),
                               "request": request_text(p)})
    return {
        "nodes": len(nodes), "gpus_total": gpus_total(nodes), "gpus_allocated": round(gpus_allocated(nodes, pods), 4),
        "pods_running": phases["Running"], "pods_pending": phases["Pending"], "pods_succeeded": phases["Succeeded"],
        "replicas": {f"{d['metadata']['namespace']}/{d['metadata']['name']}": int(d["spec"].get("replicas") or 0)
                     for d in deployments},
        "pending": pending, "placements": placements, "gpu_nodes": gpu_nodes(nodes, pods),
        "gangs": gang_report(pods, gangs or {}, GANG_LABEL, end if end is not None else time.time()),
    }


def _condition_time(pod: Obj, kind: str) -> float | None:
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind and c.get("status") == "True":
            return parse_time(c.get("lastTransitionTime"))
    return None


def gang_report(pods: Iterable[Obj], gangs: Mapping[str, int], label: str, end: float) -> list[dict[str, Any]]:
    """Per gang (label value -> its size): when it was submitted (its first member created), how long until every
    member was bound and running, and how long it was half-placed: some members bound, not all (until the last was
    bound, or until `end` if never). Times in seconds; None when it did not happen. A member that finished counts as
    bound and running (its conditions keep the times)."""
    members: dict[str, list[Obj]] = {g: [] for g in gangs}
    for p in pods:
        name = ((p.get("metadata") or {}).get("labels") or {}).get(label)
        if name in members:
            members[name].append(p)
    out = []
    for name, size in gangs.items():
        ps = members[name]
        created = [t for t in (parse_time(p["metadata"].get("creationTimestamp")) for p in ps) if t is not None]
        bound = sorted(t for t in (_condition_time(p, "PodScheduled") for p in ps) if t is not None)
        ready = [_condition_time(p, "Ready") or _condition_time(p, "PodScheduled") if (p.get("status") or {}).get(
            "phase") == "Succeeded" else _condition_time(p, "Ready") for p in ps]
        start = min(created) if created else None
        whole = len(bound) == size
        all_ran = whole and len(ps) == size and all(t is not None for t in ready)
        half = None
        if bound and len(bound) < size:
            half = end - bound[0]
        elif whole and size > 1:
            half = bound[-1] - bound[0]
        out.append({"gang": name, "size": size, "members": len(ps), "bound": len(bound),
                    "submitted": start, "all_bound_after_s": round(bound[-1] - start, 1) if whole and start else None,
                    "all_running_after_s": round(max(t for t in ready if t is not None) - start, 1)
                    if all_ran and start else None,
                    "half_placed_s": round(half, 1) if half is not None else None})
    return out


def gpu_nodes(nodes: list[Obj], pods: list[Obj]) -> list[dict[str, Any]]:
    """Each GPU node with its GPUs and what is allocated on it (the report counts whole nodes left free from this)."""
    out = []
    for n in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        info = node_info(n)
        if not info.gpus:
            continue
        name = n["metadata"]["name"]
        alloc = (n.get("status") or {}).get("allocatable") or {}
        out.append({"name": name, "pool": info.group or None, "gpus_total": info.gpus if gpu_ready(n) else 0,
                    "gpus_allocated": round(gpus_allocated([n], [p for p in pods
                                                                 if p["spec"].get("nodeName") == name]), 4),
                    "whole_gpus": int(str(alloc.get(GPU_RESOURCE, "0")))})
    return out


def request_text(pod: Obj) -> str:
    req = pod_requests(pod)
    parts = [f"{k.removeprefix('nvidia.com/')}={v.normalize():f}" for k, v in sorted(req.items())
             if k in (GPU_RESOURCE, SHARE_RESOURCE) or k.startswith(MIG_RESOURCE_PREFIX)]
    return ", ".join(parts) or "-"


# -- the shell --------------------------------------------------------------------------------------------------------

class ClusterReader:
    """Lists what the functions above read, as plain dicts."""

    def __init__(self, api: client.ApiClient):
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)

    @staticmethod
    def _items(resp) -> list[Obj]:
        return json.loads(resp.data)["items"]

    def nodes(self) -> list[Obj]:
        return self._items(self.core.list_node(_preload_content=False))

    def pods(self) -> list[Obj]:
        return self._items(self.core.list_pod_for_all_namespaces(_preload_content=False))

    def deployments(self) -> list[Obj]:
        return self._items(self.apps.list_deployment_for_all_namespaces(_preload_content=False))

    def events(self) -> list[Obj]:
        return self._items(self.core.list_event_for_all_namespaces(_preload_content=False))

    def scheduling_reasons(self, pods: Iterable[Obj]) -> dict[str, str]:
        """The latest FailedScheduling message of each pending pod."""
        out = {}
        for p in pods:
            if (p.get("status") or {}).get("phase") != "Pending" or p["spec"].get("nodeName"):
                continue
            meta = p["metadata"]
            events = self._items(self.core.list_namespaced_event(
                meta["namespace"], field_selector=f"involvedObject.name={meta['name']},reason=FailedScheduling",
                _preload_content=False))
            if events:
                latest = max(events, key=lambda e: event_time(e) or 0.0)
                out[pod_key(p)] = short_reason(latest.get("message", ""))
        return out


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

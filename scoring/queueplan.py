"""Joint placement of the pending queue: when many GPU pods wait at once (after an outage, a large submission, a
Deployment scaled up), place them together instead of in whatever order kube-scheduler takes them.

`plan_queue` places every waiting pod on a copy of the model with the same loop as everywhere else
(scoring.placement), largest first within windows of arrivals, which packs better than arrival order (big pods first
leave the small ones to fill the gaps, first-fit-decreasing style) while arrival order still holds between windows:
each pod gets a planned node, or none when the plan has no room for it.
The extender then steers each pod to its planned node (prioritize ranks it first), and judges pods the plan left out
on the model with every planned pod already placed (`reserved`), so that they cannot take the room promised to the
pods planned before them. A pod that has waited `max_wait_s` goes first in the next plan, so none waits for ever.
Pure.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from scoring.fragmentation import Workload
from scoring.model import ClusterState, PodDemand
from scoring.placement import Choice, Placer
from scoring.policies import make_policy


@dataclass(frozen=True)
class QueuedPod:
    key: str  # namespace/name
    demand: PodDemand
    waiting_since: float  # seconds, the caller's clock
    pinned: str | None = None  # the hostname a nodeSelector pins it to (a gang's released member): that node only
    # A pod gpuaas's gate holds for the gang controller (its DRA claims): where the controller takes it
    # (scoring.gangs.pod_release_order). Such pods are planned before the others, in that order, as the controller's
    # next round places them all at once.
    release_order: tuple[int, float, str] | None = None


@dataclass
class QueuePlan:
    planned: dict[str, Choice] = field(default_factory=dict)  # pod key -> model row and devices
    left_out: list[str] = field(default_factory=list)  # pods the plan has no room for (they wait)
    reserved: ClusterState | None = None  # the model with every planned pod placed
    made_at: float = 0.0

    def node_of(self, key: str) -> int | None:
        choice = self.planned.get(key)
        return None if choice is None else choice.node


def plan_order(queue: Sequence[QueuedPod], now: float, max_wait_s: float, window: int = 0) -> list[QueuedPod]:
    """Pods that waited max_wait_s first, oldest first; then by arrival in windows of `window` pods (0: one window),
    largest first (GPU share, then CPU) inside a window, oldest first among equals. Inside a window big pods go first,
    which packs; across windows arrival order holds, so a small pod is passed over only by the pods of its own window
    (with one window a burst of whole-GPU pods can take every GPU and leave every GPU share unplaced).
    Before all of them, the pods the gang controller places (`QueuedPod.release_order`), in its order: its next round
    places them all at once, whatever kube-scheduler does meanwhile."""
    held = sorted((p for p in queue if p.release_order is not None), key=lambda p: p.release_order or ())
    if held:
        queue = [p for p in queue if p.release_order is None]
    arrival = {p.key: i for i, p in enumerate(sorted(queue, key=lambda p: (p.waiting_since, p.key)))}

    def key(p: QueuedPod) -> tuple[bool, float, int, int, int, float, str]:
        overdue = now - p.waiting_since >= max_wait_s
        batch = arrival[p.key] // window if window > 0 else 0
        return (not overdue, p.waiting_since if overdue else 0.0, batch, -p.demand.total_gpu_milli,
                -p.demand.cpu_milli, p.waiting_since, p.key)
    return held + sorted(queue, key=key)


def plan_queue(state: ClusterState, policy: str, workload: Workload | None, queue: Sequence[QueuedPod], *,
               now: float, max_wait_s: float, window: int = 0,
               rows_by_hostname: Mapping[str, int] | None = None) -> QueuePlan:
    """Place the queue on a copy of `state`, in plan_order, with `policy`; `state` is not changed. Pods pinned to a
    node (`QueuedPod.pinned`, a hostname: `rows_by_hostname` finds its row) go first, and on that node only: they
    have no other choice, and the room they will take is not promised to another pod."""
    reserved = state.copy()
    placer = Placer(reserved, make_policy(policy, reserved, workload))
    plan = QueuePlan(reserved=reserved, made_at=now)
    hosts = rows_by_hostname or {}
    pinned = [p for p in queue if p.pinned is not None]
    for pod in sorted(pinned, key=lambda p: (p.waiting_since, p.key)):
        row = hosts.get(pod.pinned or "")
        only = np.arange(len(reserved)) == (row if row is not None else -1)
        choice = placer.place(pod.demand, only)
        if choice is None:
            plan.left_out.append(pod.key)
        else:
            plan.planned[pod.key] = choice
    for pod in plan_order([p for p in queue if p.pinned is None], now, max_wait_s, window):
        choice = placer.place(pod.demand)
        if choice is None:
            plan.left_out.append(pod.key)
        else:
            plan.planned[pod.key] = choice
    return plan

"""Joint placement of the pending queue: when many GPU pods wait at once (after an outage, a large submission, a
Deployment scaled up), place them together instead of in whatever order kube-scheduler takes them.

`plan_queue` places every waiting pod on a copy of the model with the same loop as everywhere else
(scoring.placement), largest first within windows of arrivals, which packs better than arrival order (big pods first
leave the small ones to fill the gaps, first-fit-decreasing style) while arrival order still holds between windows:
each pod gets a planned node, or none when the plan has no room for it.
The extender then steers each pod to its planned node (prioritize ranks it first), and judges pods the plan left out
on the model with every planned pod already placed (`reserved`), so that they cannot take the room promised to the
pods planned before them. A pod that has waited `max_wait_s` goes first in the next plan, so none waits for ever.

A plan is kept and updated (`update_plan`) instead of made again in full: in a burst most pods bind where they were
planned, and placing every waiting pod again every refresh cost as much per pod as the extender's three verbs
(docs/extender.md, issue 19). An update takes back from the live model the rows that changed there since, puts the
planned pods on them again where they still fit, and places only what is new to the plan: arrivals, pods whose
planned room is gone (taken by a pod bound elsewhere, a failed or expired binding given back, a node read anew) and
the pods left out before, in plan order. `replan_reason` says when a full plan is due instead: a pod not planned has
become overdue since the last full plan (it goes first only in a full plan), the updates have placed more than a
share of the pods the full plan took in, or the full plan is older than a maximum age.
Pure.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from scoring.fit import misfit_reason
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
    made_at: float = 0.0  # when it was last made in full
    placer: Placer | None = None  # places on `reserved`, with a policy whose tables follow it
    pods: dict[str, QueuedPod] = field(default_factory=dict)  # the planned pods as queued
    on_row: dict[int, dict[str, None]] = field(default_factory=dict)  # planned pod keys per row, in plan order
    full_size: int = 0  # pods the last full plan took in
    placed_since: int = 0  # pods updates placed since it (arrivals, pods whose planned room went)

    def node_of(self, key: str) -> int | None:
        choice = self.planned.get(key)
        return None if choice is None else choice.node

    def _assign(self, pod: QueuedPod, choice: Choice) -> None:
        self.planned[pod.key] = choice
        self.pods[pod.key] = pod
        self.on_row.setdefault(choice.node, {})[pod.key] = None

    def _unassign(self, key: str) -> Choice:
        choice = self.planned.pop(key)
        del self.pods[key]
        keys = self.on_row[choice.node]
        del keys[key]
        if not keys:
            del self.on_row[choice.node]
        return choice


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
    placer = Placer(reserved, make_policy(policy, reserved, workload), incremental=True)
    plan = QueuePlan(reserved=reserved, made_at=now, placer=placer, full_size=len(queue))
    _place_pods(plan, queue, now=now, max_wait_s=max_wait_s, window=window, rows_by_hostname=rows_by_hostname)
    return plan


def _place_pods(plan: QueuePlan, pods: Sequence[QueuedPod], *, now: float, max_wait_s: float, window: int,
                rows_by_hostname: Mapping[str, int] | None) -> None:
    """Place `pods` on the plan's reserved model, pinned ones first on their node only, then in plan_order; those
    that fit nowhere join `left_out`."""
    placer = plan.placer
    assert placer is not None
    hosts = rows_by_hostname or {}
    pinned = [p for p in pods if p.pinned is not None]
    for pod in sorted(pinned, key=lambda p: (p.waiting_since, p.key)):
        row = hosts.get(pod.pinned or "")
        only = np.arange(len(placer.state)) == (row if row is not None else -1)
        choice = placer.place(pod.demand, only)
        if choice is None:
            plan.left_out.append(pod.key)
        else:
            plan._assign(pod, choice)
    for pod in plan_order([p for p in pods if p.pinned is None], now, max_wait_s, window):
        choice = placer.place(pod.demand)
        if choice is None:
            plan.left_out.append(pod.key)
        else:
            plan._assign(pod, choice)


def replan_reason(plan: QueuePlan, queue: Sequence[QueuedPod], *, now: float, max_wait_s: float, max_age_s: float,
                  share: float) -> str | None:
    """Why the plan must be made again in full rather than updated, or None: "age" (its last full plan is max_age_s
    old), "overdue" (a pod it does not place has waited max_wait_s since before that plan was made: it goes first
    only in a full plan), "drift" (updates would have placed more than `share` of the pods the full plan took in:
    arrivals and pods whose planned room went, which an update places after the planned ones)."""
    if now - plan.made_at >= max_age_s:
        return "age"
    left_out = set(plan.left_out)
    arrivals = 0
    for pod in queue:
        if pod.key in plan.planned:
            continue
        if now - pod.waiting_since >= max_wait_s > plan.made_at - pod.waiting_since:
            return "overdue"
        arrivals += pod.key not in left_out
    if plan.placed_since + arrivals > share * max(plan.full_size, 1):
        return "drift"
    return None


def update_plan(plan: QueuePlan, state: ClusterState, queue: Sequence[QueuedPod], changed_rows: Iterable[int], *,
                now: float, max_wait_s: float, window: int = 0,
                rows_by_hostname: Mapping[str, int] | None = None) -> int:
    """Bring a plan made on an earlier `state` (the same nodes, in the same rows) up to date with `queue`, the pods
    waiting now, in time proportional to what changed: `changed_rows` are the rows of `state` changed since the plan
    last saw it. Planned pods no longer waiting (bound, being bound, deleted, or queued again as another pod: then
    placed anew) leave the plan; every row they or `state` changed is taken back from `state` with the pods still
    planned there put on it again, in plan order; those that no longer fit there, the arrivals and the pods left out
    before are placed anew. Afterwards `reserved` is `state` with every planned pod placed, as after plan_queue.
    Returns how many pods it placed or tried to."""
    reserved, placer = plan.reserved, plan.placer
    if reserved is None or placer is None:
        raise ValueError("update_plan needs a plan made by plan_queue")
    waiting = {p.key: p for p in queue}
    dirty = {int(r) for r in changed_rows}
    for key in [k for k, p in plan.pods.items() if waiting.get(k) != p]:  # gone, or queued anew as another pod
        dirty.add(plan._unassign(key).node)
    before = [waiting[k] for k in plan.left_out if k in waiting]
    seen = plan.planned.keys() | set(plan.left_out)
    arrivals = [p for k, p in waiting.items() if k not in seen]
    moved: list[QueuedPod] = []  # planned pods whose room went
    for row in sorted(dirty):
        reserved.copy_row(state, row)
        for key in list(plan.on_row.get(row, ())):
            pod, choice = plan.pods[key], plan.planned[key]
            if misfit_reason(reserved, pod.demand, row) is None:
                try:
                    reserved.place_or_refuse(row, pod.demand, choice.devices)
                    continue
                except (ValueError, KeyError, IndexError):  # its devices are taken (MigLayoutError is a ValueError)
                    pass
            plan._unassign(key)
            moved.append(pod)
        placer.policy.observe(row)
    plan.left_out = []
    pods = moved + before + arrivals
    _place_pods(plan, pods, now=now, max_wait_s=max_wait_s, window=window, rows_by_hostname=rows_by_hostname)
    plan.placed_since += len(moved) + len(arrivals)
    return len(pods)

"""Gangs: groups of pods placed all or nothing, for the groups users already label.

A pod is a member of a group by one of these labels (the first present wins):

  gpuaas.io/gang                  gpuaas's own; size in annotation gpuaas.io/gang-size (and gpuaas.io/gang-min-count
                                  to start with fewer members than the size)
  kueue.x-k8s.io/pod-group-name   Kueue's plain-pod groups; size in annotation kueue.x-k8s.io/pod-group-total-count
  scheduling.x-k8s.io/pod-group   the coscheduling plugin's; its size (the PodGroup's minMember) is not read from the
                                  PodGroup object: give it as gpuaas.io/gang-size

Members are created with the scheduling gate `gpuaas.io/gang` (the webhook adds it), which holds them out of
scheduling. `decide` plans the gangs that are complete on the live model, together (`scoring.planner.place_gang`,
honouring each member's nodeSelector, required node affinity and tolerations, and cordons), and says, per gang,
whether to release it (each member pinned to its planned node by a hostname nodeSelector, which a gated pod may gain,
then every gate removed), to let it wait (with the reason), or to reset it (members released but not bound within the
bound: a pinned pod can neither be gated again nor moved, so its members are deleted for their owner to create
again). Another component's gate (Kueue's admission gate) is waited for, never removed.

Order: by priority (highest member priority), then arrival (first member created), FIFO with backfill: a gang that
does not fit does not hold back a later one that does, until it has waited `reserve_after_s`; from then on later
gangs wait for it (so a large gang cannot be starved for ever by a stream of small ones). Pure.
"""
from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from scoring.constraints import HOSTNAME_LABEL, NodeConstraints, Taint, allows, node_taints
from scoring.fit import feasible
from scoring.fragmentation import Workload
from scoring.kubeobjects import planned_devices, pod_demand, pod_key
from scoring.model import ClusterState, PodDemand
from scoring.placement import Placer
from scoring.planner import GangPlan, place_gang
from scoring.policies import make_policy
from scoring.verdicts import devices_free

Obj = dict[str, Any]

GANG_GATE = "gpuaas.io/gang"  # the scheduling gate gpuaas removes once a gang is placed
GANG_LABEL = "gpuaas.io/gang"
GANG_SIZE_ANNOTATION = "gpuaas.io/gang-size"
GANG_MIN_ANNOTATION = "gpuaas.io/gang-min-count"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_GATE = "kueue.x-k8s.io/admission"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
Source = Literal["gpuaas", "kueue", "coscheduling", "pod"]  # "pod": a pod in no group, a gang of one (DRA claims)
GROUP_LABELS: dict[str, Source] = {GANG_LABEL: "gpuaas", KUEUE_GROUP_LABEL: "kueue",
                                   COSCHEDULING_LABEL: "coscheduling"}
RELEASED_ANNOTATION = "gpuaas.io/gang-released"  # when gpuaas pinned and released the pod (epoch seconds)
MAX_GANG_SIZE = 10_000
GREEDY_ONLY_S = 0.01  # CP-SAT's time once the planning budget is spent: it returns the greedy placement it is hinted


class GroupError(ValueError):
    """A pod labelled as a group member whose group cannot be read; the message names the label or annotation."""


@dataclass(frozen=True)
class GroupRef:
    namespace: str
    name: str
    source: Source
    size: int
    min_count: int

    @property
    def key(self) -> str:
        prefix = "" if self.source == "gpuaas" else f"{self.source}:"
        return f"{self.namespace}/{prefix}{self.name}"


def _count(value: str | None, what: str) -> int | None:
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise GroupError(f"{what} must be a whole number, not {value!r}") from None
    if not 1 <= n <= MAX_GANG_SIZE:
        raise GroupError(f"{what} must be between 1 and {MAX_GANG_SIZE}, not {n}")
    return n


def group_of(pod: Mapping[str, Any]) -> GroupRef | None:
    """The group `pod` is a member of, None if it has no group label. Raises GroupError naming what is wrong."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    label = next((k for k in GROUP_LABELS if k in labels), None)
    if label is None:
        return None
    source = GROUP_LABELS[label]
    name = labels[label]
    if not name:
        raise GroupError(f"label {label} is empty: it names the group")
    size_key = KUEUE_TOTAL_ANNOTATION if source == "kueue" else GANG_SIZE_ANNOTATION
    size = _count(annotations.get(size_key), f"annotation {size_key}")
    if size is None:
        raise GroupError(f"a pod labelled {label}={name} needs annotation {size_key} (the number of pods in the group)")
    min_count = _count(annotations.get(GANG_MIN_ANNOTATION), f"annotation {GANG_MIN_ANNOTATION}") or size
    if min_count > size:
        raise GroupError(f"annotation {GANG_MIN_ANNOTATION} ({min_count}) is more than the group's size ({size})")
    return GroupRef(meta.get("namespace") or "default", name, source, size, min_count)


def solo_group(pod: Mapping[str, Any]) -> GroupRef:
    """A pod in no group placed by gpuaas as a gang of one (a pod whose DRA claims gpuaas allocates): key
    `<namespace>/pod:<name>`."""
    meta = pod.get("metadata") or {}
    return GroupRef(meta.get("namespace") or "default", meta.get("name") or "?", "pod", 1, 1)


def created_at(pod: Mapping[str, Any]) -> float:
    """The pod's creationTimestamp in epoch seconds (0 without one): a member's arrival."""
    raw = (pod.get("metadata") or {}).get("creationTimestamp")
    return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp() if raw else 0.0


def release_order(priority: int, arrived: float, key: str) -> tuple[int, float, str]:
    """The order `decide` plans waiting gangs in: highest priority first, then arrival, then the gang's key."""
    return (-priority, arrived, key)


def pod_release_order(pod: Mapping[str, Any]) -> tuple[int, float, str]:
    """Where `decide` takes a gated pod: its gang's place in release_order, judged from the pod alone (its own
    priority and creation; a gang's members share its key, and its arrival is its first member's). The extender plans
    the pods gpuaas holds for their DRA claims in this order (scoring.queueplan), so that the room it keeps for them
    is the room the gang controller gives them."""
    try:
        ref = group_of(pod) or solo_group(pod)
    except GroupError:
        ref = solo_group(pod)
    return release_order(int((pod.get("spec") or {}).get("priority") or 0), created_at(pod), ref.key)


def gates(pod: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(g.get("name", "") for g in (pod.get("spec") or {}).get("schedulingGates") or ())


@dataclass(frozen=True)
class Member:
    key: str  # namespace/name
    uid: str
    created: float  # epoch seconds
    demand: PodDemand
    constraints: NodeConstraints
    gates: tuple[str, ...]
    node: str | None  # bound to
    pinned: str | None  # the hostname nodeSelector it carries
    released_at: float | None  # when gpuaas released it
    priority: int
    owned: bool  # has a controller owner that creates it again when deleted
    nodes: frozenset[str] | None = None  # the only nodes it may go to (a DRA claim's PCIe-root constraint); None: any
    planned: tuple[str, tuple[int, ...]] | None = None  # (node, GPUs) the release planned (planned-devices annotation)

    @property
    def gated(self) -> bool:
        return GANG_GATE in self.gates


def member(pod: Mapping[str, Any], created: float, *, demand: PodDemand | None = None, pinned: str | None = None,
           nodes: frozenset[str] | None = None) -> Member:
    """A member's record; `created` is the pod's creationTimestamp in epoch seconds. Raises ObjectError on a pod
    whose resources cannot be read. `demand`, `pinned` (a hostname) and `nodes` replace what the pod itself says:
    for a pod with DRA claims, what its claims still ask, the node its allocated claims hold it to, and the nodes a
    claim's constraint allows (scoring.draclaims)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    released = (meta.get("annotations") or {}).get(RELEASED_ANNOTATION)
    try:
        released_at = float(released) if released is not None else None
    except ValueError:
        released_at = None
    return Member(pod_key(pod), meta.get("uid", ""), created, demand if demand is not None else pod_demand(pod),
                  NodeConstraints.of(pod), gates(pod), spec.get("nodeName") or None,
                  pinned or (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL), released_at,
                  int(spec.get("priority") or 0), any(o.get("controller") for o in meta.get("ownerReferences") or ()),
                  nodes, planned_devices(pod))


@dataclass
class Gang:
    ref: GroupRef
    members: list[Member] = field(default_factory=list)

    @property
    def arrived(self) -> float:
        return min((m.created for m in self.members), default=math.inf)

    @property
    def priority(self) -> int:
        return max((m.priority for m in self.members), default=0)

    def foreign_gates(self) -> list[str]:
        return sorted({g for m in self.members for g in m.gates if g != GANG_GATE})


@dataclass(frozen=True)
class NodeFacts:
    """What node constraints are judged on, per model row."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeFacts:
        meta = node.get("metadata") or {}
        return cls(meta.get("name", ""), meta.get("labels") or {}, node_taints(node),
                   bool((node.get("spec") or {}).get("unschedulable")))


@dataclass(frozen=True)
class GangDecision:
    gang: str  # GroupRef.key
    action: Literal["release", "wait", "reset", "placed"]
    message: str
    pins: tuple[tuple[str, str], ...] = ()  # release: (member key, hostname) per gated member
    members: tuple[str, ...] = ()  # every member's key
    devices: tuple[tuple[str, str, tuple[int, ...]], ...] = ()  # release: (member key, node, GPU indices) per pin


@dataclass(frozen=True)
class GangSettings:
    policy: str = "gpuaas"
    time_limit_s: float = 1.0  # CP-SAT per gang; the greedy answer is used when it finds none in time
    bind_timeout_s: float = 120.0  # released members not bound by then: the gang is reset
    reserve_after_s: float = 300.0  # a gang that waited this long stops later gangs from backfilling past it
    plan_budget_s: float = 5.0  # past this much planning in one decide, gangs get the greedy placement only


def allowed_rows(member_: Member, facts: Sequence[NodeFacts]) -> np.ndarray:
    """bool[rows]: the nodes kube-scheduler's NodeAffinity, TaintToleration and NodeUnschedulable filters let the
    member onto, and that carry a hostname label to pin it with."""
    return np.array([not f.unschedulable and HOSTNAME_LABEL in f.labels
                     and allows(member_.constraints, f.labels, f.taints, ignored_taints=(), node_name=f.name)
                     for f in facts], dtype=bool)


def _hold_released(model: ClusterState, gangs: Sequence[Gang], row_of_host: Mapping[str, int], policy: str,
                   workload: Workload | None) -> None:
    """Released members not bound yet hold their planned node in `model` (the watch shows them bound later), so that
    the next gang is not planned onto the same GPUs."""
    pol = make_policy(policy, model, workload)
    for gang in gangs:
        for m in gang.members:
            if m.node is None and not m.gated and m.pinned is not None and m.released_at is not None:
                row = row_of_host.get(m.pinned)
                if row is None:
                    continue
                devices: tuple[int, ...] = ()
                if m.demand.gpus:  # the GPUs planned for it, which the extender binds it to while they are free
                    planned = m.planned
                    devices = planned[1] if planned is not None and planned[0] == model.names[row] and \
                        devices_free(model, row, m.demand, planned[1]) else tuple(pol.devices(model, m.demand, row))
                try:
                    model.place(row, m.demand, devices)
                    pol.observe(row)
                except (ValueError, IndexError):
                    pass  # taken meanwhile: the member will not bind, and the bound resets its gang


def place_alone(state: ClusterState, pod: PodDemand, policy: str, workload: Workload | None,
                allowed: np.ndarray | None, placer: Placer | None = None) -> GangPlan:
    """One pod: the place-one-pod loop (scoring.placement.Placer: the policy's node and its devices, as in the
    simulator and the extender), not place_gang's CP-SAT, whose 0..100 preference and own choice of GPUs placed lone
    pods worse (a 50-node DRA replay, one pod at a time: the first pod that did not fit came at 88.4 % allocated
    against the simulator's 95.8 %). A pod that fits nowhere is told so before any policy is built. `placer`: one on
    `state` whose policy is kept in step with it (decide's, for the gangs of one of a round), else a new one."""
    t0 = time.perf_counter()
    fits = feasible(state, pod) if allowed is None else feasible(state, pod) & allowed
    if placer is None and fits.any():
        placer = Placer(state, make_policy(policy, state, workload))
    choice = placer.choose(pod, allowed) if placer is not None and fits.any() else None
    if choice is None:
        return GangPlan("infeasible", wall_seconds=time.perf_counter() - t0,
                        notes=[f"pod {pod.name or '?'} fits on no node it may go to, even alone"])
    return GangPlan("greedy", wall_seconds=time.perf_counter() - t0, placements=[(choice.node, tuple(choice.devices))])


def decide(state: ClusterState, facts: Sequence[NodeFacts], gangs: Sequence[Gang], now: float,
           settings: GangSettings = GangSettings(), workload: Workload | None = None) -> list[GangDecision]:
    """One decision per gang that needs one (a gang wholly bound gets "placed"). `state`: the model of bound pods;
    `facts[i]`: node row i's labels, taints and cordon. `state` is not changed."""
    if len(facts) != len(state):
        raise ValueError(f"{len(facts)} node facts for {len(state)} model rows")
    started = time.perf_counter()
    model = state.copy()
    hostname = [f.labels.get(HOSTNAME_LABEL, "") for f in facts]
    row_of_host = {h: i for i, h in enumerate(hostname) if h}
    _hold_released(model, gangs, row_of_host, settings.policy, workload)
    out: list[GangDecision] = []
    waiting: list[Gang] = []
    for gang in gangs:
        keys = tuple(m.key for m in gang.members)
        pinned = [(m, m.released_at) for m in gang.members if m.released_at is not None]  # by gpuaas
        if pinned and any(not m.gated for m, _ in pinned):  # released
            late = [m for m, at in pinned if m.node is None and now - at > settings.bind_timeout_s]
            if late:
                bound = sum(1 for m in gang.members if m.node is not None)
                out.append(GangDecision(gang.ref.key, "reset", f"{len(late)} of {len(gang.members)} members released "
                                        f"{settings.bind_timeout_s:.0f} s ago are not bound ({bound} are): the gang "
                                        "is reset, all its members deleted for their owner to create again", (), keys))
            elif all(m.node is not None for m in gang.members):
                out.append(GangDecision(gang.ref.key, "placed", f"all {len(gang.members)} members bound", (), keys))
            continue
        if pinned and now - min(at for _, at in pinned) > settings.bind_timeout_s:
            # Pinned but never released (a release that did not finish), and the pins no longer hold: a pin cannot
            # be taken back from a pod, so only new pods can be placed elsewhere.
            out.append(GangDecision(gang.ref.key, "reset", f"{len(pinned)} of {len(gang.members)} members were "
                                    f"pinned over {settings.bind_timeout_s:.0f} s ago and never released: the gang "
                                    "is reset, all its members deleted for their owner to create again", (), keys))
            continue
        if any(m.gated for m in gang.members):
            waiting.append(gang)
    waiting.sort(key=lambda g: release_order(g.priority, g.arrived, g.ref.key))
    reserved_for: Gang | None = None
    masks: dict[NodeConstraints, np.ndarray] = {}
    # The gangs of one share one placer, its policy told of every placement of the round, as the simulator and the
    # extender's joint plan place a queue: a policy made anew per pod scores the same nodes, but its fragmentation
    # sums, made in another order, can differ in the last bit, and a node whose score lies on a band's edge (a pod
    # that changes no fragmentation: sigmoid 0.5) then falls one band (measured: the 50-node DRA burst's first round
    # placed 48 of 329 pods where the extender's plan did).
    placer: Placer | None = None
    for gang in waiting:
        keys = tuple(m.key for m in gang.members)
        present = len(gang.members)
        if present < gang.ref.min_count:
            out.append(GangDecision(gang.ref.key, "wait", f"waiting for members: {present} of "
                                    f"{gang.ref.min_count} created", (), keys))
            continue
        foreign = gang.foreign_gates()
        if foreign:
            out.append(GangDecision(gang.ref.key, "wait", f"waiting for {', '.join(foreign)} to be removed (gpuaas "
                                    "places the gang once no other component holds it)", (), keys))
            continue
        if reserved_for is not None:
            out.append(GangDecision(gang.ref.key, "wait", f"held behind gang {reserved_for.ref.key}, which has "
                                    f"waited over {settings.reserve_after_s:.0f} s for room", (), keys))
            continue
        members = [m for m in gang.members if m.gated]
        allowed = []
        for m in members:
            if m.constraints not in masks:
                masks[m.constraints] = allowed_rows(m, facts)
            may = masks[m.constraints]
            if m.pinned is not None:  # the user pinned it already: that node only
                may = may & (np.arange(len(facts)) == row_of_host.get(m.pinned, -1))
            if m.nodes is not None:
                may = may & np.array([f.name in m.nodes for f in facts], dtype=bool)
            allowed.append(may)
        need = sum(m.demand.total_gpu_milli for m in members)
        free = int(np.where(np.logical_or.reduce(allowed), model.gpu_left.sum(axis=1), 0).sum()) if allowed else 0
        if need > free:  # not enough GPU left where its members may go, whatever the arrangement: no planner
            out.append(GangDecision(gang.ref.key, "wait", f"{len(members)} pods do not fit together now: they ask "
                                    f"{need / 1000:g} GPUs, {free / 1000:g} are free where they may go", (), keys))
            if now - gang.arrived >= settings.reserve_after_s:
                reserved_for = gang
            continue
        if len(members) == 1:  # a pod alone (a DRA pod is a gang of one): placed as the simulator places one
            if placer is None:
                placer = Placer(model, make_policy(settings.policy, model, workload))
            plan = place_alone(model, members[0].demand, settings.policy, workload, allowed[0], placer)
        else:
            # A burst of gangs must not hold the next decision back: past the budget, the greedy answer only.
            limit = settings.time_limit_s if time.perf_counter() - started < settings.plan_budget_s else GREEDY_ONLY_S
            plan = place_gang(model, [m.demand for m in members], policy=settings.policy, workload=workload,
                              time_limit=limit, allowed=allowed)
        if not plan.ok:
            why = "; ".join(plan.notes) or "no placement holds all of its pods at once"
            out.append(GangDecision(gang.ref.key, "wait", f"{len(members)} pods do not fit together now: {why}",
                                    (), keys))
            if now - gang.arrived >= settings.reserve_after_s:
                reserved_for = gang
            continue
        pins = []
        placed = []
        for m, (row, devices) in zip(members, plan.placements, strict=True):
            model.place(row, m.demand, devices)  # the next gang is planned around this one
            if placer is not None:
                placer.policy.observe(row)
            pins.append((m.key, hostname[row]))
            placed.append((m.key, facts[row].name, tuple(devices)))
        nodes = sorted({h for _, h in pins})
        out.append(GangDecision(gang.ref.key, "release", f"all {len(members)} pods fit together on "
                                f"{', '.join(nodes)} (planner: {plan.status})", tuple(pins), keys, tuple(placed)))
    return out

"""Gang admission: the pods of a gang are created only once all of them fit the cluster as it is now, the way Kueue
admits a workload all-or-nothing, so that a gang never holds GPUs for some of its pods while the others wait (two
half-placed gangs can block each other for good).

The decision is `scoring.planner.place_gang` (CP-SAT, with a greedy fallback) on the scoring model of the Nodes and
bound Pods, built as the nodescaler builds it (nodescaler/snapshot.py). The scheduler then places the pods; they
fit as planned unless something else is bound in between, as with Kueue, which admits on quota and leaves placement to
the scheduler.

Queue order is Kueue's BestEffortFIFO: gangs are tried in arrival order, and one that does not fit does not hold back a
smaller one behind it. Pods of admitted gangs that are not bound yet are held where the plan put them in the next
snapshots, so that two gangs are never admitted onto the same free GPUs.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from nodescaler.snapshot import build_snapshot
from scoring.fragmentation import Workload
from scoring.kubeobjects import pod_demand, pod_key
from scoring.model import ClusterState, PodDemand
from scoring.planner import place_gang

log = logging.getLogger("gpuaas.admission")

Obj = dict[str, Any]


@dataclass(frozen=True)
class Gang:
    namespace: str
    name: str
    pods: tuple[Obj, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def demands(self) -> list[PodDemand]:
        return [pod_demand(p) for p in self.pods]


@dataclass(frozen=True)
class AdmissionDecision:
    admit: bool
    message: str
    placements: tuple[tuple[str, tuple[int, ...]], ...] = ()  # per pod: (node, GPU indices)


def decide(state: ClusterState, gang: Gang, *, workload: Workload, policy: str = "gpuaas",
           time_limit: float = 0.5) -> AdmissionDecision:
    """Admit `gang` if every one of its pods has a place on `state` at once; `workload` is what the policy weighs
    (it only breaks ties between placements here: the scheduler decides where the pods go). Pure."""
    demands = gang.demands()
    plan = place_gang(state, demands, policy=policy, workload=workload, time_limit=time_limit)
    if not plan.ok:
        why = "; ".join(plan.notes) or "no placement holds all of its pods at once"
        return AdmissionDecision(False, f"{len(demands)} pods do not fit together: {why}")
    placements = tuple((state.names[n], tuple(gpus)) for n, gpus in plan.placements)
    nodes = sorted({n for n, _ in placements})
    why = f"all {len(demands)} pods fit at once (on {', '.join(nodes)}; planner: {plan.status})"
    return AdmissionDecision(True, why, placements)


def hold(state: ClusterState, demands: Sequence[PodDemand], placements: Sequence[tuple[str, tuple[int, ...]]]) -> int:
    """Place `demands` on `state` where `placements` say (in place); return how many still fitted there."""
    held = 0
    for demand, (node, gpus) in zip(demands, placements, strict=True):
        i = state.index.get(node)
        if i is None:
            continue
        try:
            state.place(i, demand, gpus)
            held += 1
        except (ValueError, KeyError, IndexError):
            pass  # taken meanwhile by a pod bound past the plan: the scheduler will say where this one goes
    return held


@dataclass
class _Held:
    node: str
    gpus: tuple[int, ...]
    demand: PodDemand
    until: float


EventSink = Callable[[str, str, str], None]  # (reason, object, message)


@dataclass
class GangAdmission:
    """The shell: a queue of gangs, admitted by `run_once` against the cluster behind `api`."""
    api: client.ApiClient
    policy: str = "gpuaas"
    time_limit: float = 0.5
    hold_s: float = 60.0  # an admitted pod not bound by then is no longer held for
    on_event: EventSink | None = None
    clock: Callable[[], float] = time.monotonic
    waiting: list[Gang] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    _held: dict[str, _Held] = field(default_factory=dict)
    why_waiting: dict[str, str] = field(default_factory=dict)  # gang -> why it did not fit at its last try

    def submit(self, gang: Gang) -> None:
        self.waiting.append(gang)

    def _event(self, reason: str, gang: Gang, message: str) -> None:
        log.info("%s %s: %s", reason, gang.key, message)
        if self.on_event:
            self.on_event(reason, gang.key, message)

    def _list(self, what: str) -> list[Obj]:
        core = client.CoreV1Api(self.api)
        resp = core.list_node(_preload_content=False) if what == "nodes" else \
            core.list_pod_for_all_namespaces(_preload_content=False)
        return json.loads(resp.data)["items"]

    def run_once(self) -> list[str]:
        """Try every waiting gang once, in order; create the pods of those that fit. Returns the admitted gangs."""
        if not self.waiting:
            return []
        nodes, pods = self._list("nodes"), self._list("pods")
        snapshot = build_snapshot(nodes, pods, [], time.time(), policy=self.policy)
        state = snapshot.state
        self._hold_admitted(state, pods)
        out = []
        for gang in list(self.waiting):
            decision = decide(state, gang, workload=snapshot.workload, policy=self.policy,
                              time_limit=self.time_limit)
            if not decision.admit:
                if gang.key not in self.why_waiting:  # announced once, as a condition changing
                    self._event("GangWaiting", gang, decision.message)
                self.why_waiting[gang.key] = decision.message
                continue
            self._create(gang)
            demands = gang.demands()
            hold(state, demands, decision.placements)
            until = self.clock() + self.hold_s
            for pod, demand, (node, gpus) in zip(gang.pods, demands, decision.placements, strict=True):
                self._held[pod_key(pod)] = _Held(node, gpus, demand, until)
            self.waiting.remove(gang)
            self.why_waiting.pop(gang.key, None)
            self.admitted.append(gang.key)
            out.append(gang.key)
            self._event("GangAdmitted", gang, decision.message)
        return out

    def _hold_admitted(self, state: ClusterState, pods: list[Obj]) -> None:
        bound_or_gone = {pod_key(p) for p in pods if (p.get("spec") or {}).get("nodeName")}
        present = {pod_key(p) for p in pods}
        now = self.clock()
        for key in [k for k, h in self._held.items() if k in bound_or_gone or k not in present or h.until < now]:
            del self._held[key]
        if self._held:
            held = list(self._held.values())
            hold(state, [h.demand for h in held], [(h.node, h.gpus) for h in held])

    def _create(self, gang: Gang) -> None:
        core = client.CoreV1Api(self.api)
        for pod in gang.pods:
            try:
                core.create_namespaced_pod(gang.namespace, pod, _preload_content=False)
            except ApiException as err:
                if err.status != 409:  # already there: a retry after a partial failure
                    raise

"""The extender's verbs, independent of HTTP: wire models in, wire models out, the model and policy in between."""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from scoring import verdicts
from scoring.clusterview import ClusterView
from scoring.constraints import DEFAULT_SCHEDULER, NodeConstraints, bind_refusal, prefers_against, score_preference
from scoring.fit import feasible, misfit_reason
from scoring.gangs import created_at
from scoring.kubeobjects import (
    DEVICES_ANNOTATION,
    ObjectError,
    UnsupportedDemand,
    format_devices,
    planned_devices,
    pod_key,
)
from scoring.model import ClusterState, PodDemand
from scoring.names import InvalidName, dns1123_label, dns1123_subdomain
from scoring.policies import Policy
from scoring.queueplan import QueuePlan, plan_queue, replan_reason, update_plan

from .binder import Binder, BindError
from .metrics import Metrics
from .wire import ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult

log = logging.getLogger("gpuaas.extender")

PodLookup = Callable[[str, str], Awaitable[dict[str, Any] | None]]


class BadRequest(ValueError):
    """The request is well-formed JSON but cannot be answered as asked (HTTP 4xx)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class QueuePlanning:
    """When to plan the pending GPU pods jointly (scoring.queueplan; the extender's queue_* settings)."""

    min_pods: int = 0  # plan while at least this many wait; 0: never
    refresh_s: float = 2.0  # plan again after this long
    max_wait_s: float = 120.0  # a pod left out this long goes first
    window: int = 64  # arrivals reordered (largest first) only within windows of this many pods; 0: the whole queue
    # Plan again no sooner than this many times the last plan took: on a starved CPU a plan can take longer than
    # refresh_s, and planning at every filter then left kube-scheduler's calls to time out (a 200-node burst at load
    # average 30 bound 69 of 2,000 pods before going quiet). Planning takes at most 1 / (1 + this) of the time.
    min_gap_per_plan_second: float = 4.0
    # Every refresh_s the plan is updated with what changed (scoring.queueplan.update_plan); it is made in full again
    # when a pod it does not place turned overdue, when updates placed more than full_plan_share of the pods the last
    # full plan took in, or after full_plan_max_age_s (scoring.queueplan.replan_reason).
    full_plan_share: float = 0.5
    full_plan_max_age_s: float = 30.0


@dataclass(frozen=True)
class FilterMemo:
    """What filter found for one pod, kept for the prioritize call kube-scheduler makes next for the same pod with
    exactly the feasible names: their model rows, valid while the model is at the same version."""

    uid: str | None
    names: list[str]
    rows: np.ndarray | None
    version: int

    def rows_for(self, uid: str | None, names: list[str], version: int) -> np.ndarray | None:
        return self.rows if (uid, version, names) == (self.uid, self.version, self.names) else None


def filter_result(args: ExtenderArgs, feasible: list[str], failed: dict[str, str],
                  unresolvable: dict[str, str]) -> ExtenderFilterResult:
    """A filter verb's answer in the form the request came in: names with a node cache, else the full Node objects
    the scheduler sent (and wants back), each feasible one once."""
    nodes = None
    if args.NodeNames is None and args.Nodes is not None:
        keep = dict.fromkeys(feasible)  # popped when answered: a node sent twice comes back once
        nodes = {**args.Nodes, "items": [n for n in args.Nodes.get("items") or ()
                                         if keep.pop(n["metadata"]["name"], False) is None]}
    return ExtenderFilterResult.model_construct(  # built here, valid by construction: skip re-validation
        Nodes=nodes, NodeNames=feasible if args.NodeNames is not None else None,
        FailedNodes=failed, FailedAndUnresolvableNodes=unresolvable, Error="")


class ExtenderService:
    def __init__(self, view: ClusterView, binder: Binder, metrics: Metrics, pod_lookup: PodLookup, *,
                 scheduler_names: tuple[str, ...] = (DEFAULT_SCHEDULER,),
                 queue_planning: QueuePlanning = QueuePlanning(), wall_clock: Callable[[], float] = time.time,
                 decide_in_filter: bool = False):
        self.view = view
        self.decide_in_filter = decide_in_filter  # filter answers with gpuaas's pick alone where it decides anyway
        self.wall_clock = wall_clock  # epoch seconds, against pods' creationTimestamp
        self.queue_planning = queue_planning
        self.plan: QueuePlan | None = None
        self._plan_model = -1  # view.rows_version when the plan was made: its rows and its copy of the model
        self._plan_synced = 0  # view.row_changes when the plan last took the model's changed rows
        self._plan_due = 0.0  # view.clock() after which the plan is made again
        self.scheduler_names = scheduler_names  # bind refuses pods of other schedulers
        self.binder = binder
        self.metrics = metrics
        self.pod_lookup = pod_lookup
        self._last_filter: FilterMemo | None = None

    def _demand(self, pod: dict[str, Any]) -> PodDemand:
        try:
            return self.view.demand(pod)
        except (ObjectError, KeyError) as err:
            raise BadRequest(str(err)) from None

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        try:
            demand = self.view.demand(args.Pod)
        except UnsupportedDemand as err:
            # A valid pod gpuaas cannot place: kube-scheduler shows this Error in the pod's events.
            self.metrics.decision("filter", "unsupported").inc()
            return ExtenderFilterResult(Error=str(err))
        except (ObjectError, KeyError) as err:
            raise BadRequest(str(err)) from None
        state, policy = self.view.snapshot()
        plan = self._queue_plan(state)
        key = pod_key(args.Pod)
        steered = self._steer(args, demand, state, policy, plan, key)
        if steered is not None:
            return filter_result(args, [steered], {}, {})
        names = args.node_names()
        verdict = verdicts.filter_nodes(state, demand, names, self.view.bad_nodes)
        # A pod the plan left out, or one it does not place (asking for no GPU: a burst's CPU-only pods, with
        # all_pods, for a bounded time as the CPU-pods entry holds them), may not take the room promised to the
        # planned pods.
        if plan is not None and plan.reserved is not None and key not in plan.planned and \
                (key in self.view.queue or (not demand.gpus and self._may_hold_for_plan(args.Pod))):
            held = verdicts.hold_for_plan(verdict, plan.reserved, demand)
            self.metrics.decision("filter", "held-for-plan").inc(held)  # nodes, as feasible and failed
        if names and len(verdict.failed) == len(names) and all(m == verdicts.UNKNOWN_NODE
                                                               for m in verdict.failed.values()):
            sample = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
            raise BadRequest(f"none of the {len(names)} node names is known to gpuaas ({sample})", status=422)
        self.metrics.decision("filter", "feasible").inc(len(verdict.feasible))
        self.metrics.decision("filter", "failed").inc(len(verdict.failed))
        self.metrics.decision("filter", "unresolvable").inc(len(verdict.unresolvable))
        log.debug("filter", extra={"pod": demand.name, "candidates": len(names), "feasible": len(verdict.feasible)})
        if self.decide_in_filter and demand.gpus and len(verdict.feasible) > 1 and \
                self._scheduler_weighs(args.Pod, verdict.feasible) is None:
            # kube-scheduler's own scores rank these nodes alike, so gpuaas's ranking decides: its pick alone (steered
            # to the planned node where feasible; a planned pod _steer could place does not get here), with the GPUs
            # held there, is the answer. With one feasible node kube-scheduler runs no score plugin and no
            # prioritize, and the reasons for the other nodes are read only when none is feasible, so they are left out.
            pick = self._rank(args.Pod, demand, state, policy, verdict.feasible, verdict.feasible_rows, "filter").pick
            if pick is not None:
                self.metrics.decision("filter", "decided").inc()
                return filter_result(args, [pick], {}, {})
        # kube-scheduler's prioritize for this pod follows with exactly the feasible names: keep their rows.
        self._last_filter = FilterMemo(args.Pod["metadata"].get("uid"), verdict.feasible, verdict.feasible_rows,
                                       state.version)
        return filter_result(args, verdict.feasible, verdict.failed, verdict.unresolvable)

    def _steer(self, args: ExtenderArgs, demand: PodDemand, state: ClusterState, policy: Policy,
               plan: QueuePlan | None, key: str) -> str | None:
        """filter's answer for a GPU pod the joint plan places, when deciding at filter: its planned node, found
        without judging every candidate (only whether the planned node is among them and the pod still fits there),
        with the GPUs held there. None: filter judges every candidate, as it would have anyway, and that path picks
        the same node wherever this one answers."""
        planned = plan.node_of(key) if self.decide_in_filter and demand.gpus and plan is not None else None
        if planned is None:
            return None
        pick = state.names[planned]
        sent = args.NodeNames if args.NodeNames is not None else args.node_names()
        if pick not in sent or misfit_reason(state, demand, planned) is not None or \
                self._scheduler_weighs(args.Pod, sent) is not None:  # (the candidates: a superset of the feasible)
            return None
        self._hold(args.Pod, demand, state, policy, pick)
        self.metrics.decision("filter", "steered").inc()
        self.metrics.decision("filter", "decided").inc()
        self.metrics.decision("filter", "feasible").inc()
        return pick

    def _scheduler_weighs(self, pod: dict[str, Any], candidates: list[str]) -> str | None:
        """What kube-scheduler's own score plugins would weigh between the `candidates` for this pod (the feasible
        nodes, or a superset of them, which can only say so more often), or None: the pod's preferences
        (scoring.constraints.score_preference), a candidate's PreferNoSchedule taint it
        does not tolerate, or a placed pod's affinity term that selects it. Not checked: image locality, which can
        move a pod between nodes gpuaas ranks alike or a step apart; here gpuaas's ranking stands."""
        try:
            reason = score_preference(pod)
            if reason is not None:
                return reason
            if self.view.prefer_no_schedule:
                tolerations = NodeConstraints.of(pod).tolerations
                named = set(candidates)
                for name, taints in self.view.prefer_no_schedule.items():
                    if name in named and prefers_against(tolerations, taints):
                        return f"node {name} has a PreferNoSchedule taint the pod does not tolerate"
            for key, terms in self.view.pod_terms.items():
                if any(t.selects(pod) for t in terms):
                    return f"pod {key}'s affinity terms select it"
        except ObjectError as err:
            raise BadRequest(f"pod {pod_key(pod)}: {err}") from None
        return None

    def prioritize(self, args: ExtenderArgs) -> verdicts.Priorities:
        """A score per candidate: the wire's HostPriorityList, left as arrays because it can hold thousands."""
        demand = self._demand(args.Pod)
        state, policy = self.view.snapshot()
        names = args.node_names()
        memo = self._last_filter
        rows = memo.rows_for(args.Pod["metadata"].get("uid"), names, state.version) if memo is not None else None
        scored = self._rank(args.Pod, demand, state, policy, names, rows, "prioritize")
        self.metrics.decision("prioritize", "scored").inc(len(scored.names))
        return scored

    def _rank(self, pod: dict[str, Any], demand: PodDemand, state: ClusterState, policy: Policy, names: list[str],
              rows: np.ndarray | None, verb: str) -> verdicts.Priorities:
        """The policy's ranking of `names` (their model `rows` when known), steered to the pod's planned node, and
        the GPUs held on the pick: prioritize's answer, and filter's where gpuaas's pick is the decision."""
        scored = verdicts.prioritize(state, policy, demand, names, rows)
        planned = self.plan.node_of(pod_key(pod)) if self.plan is not None else None
        if planned is not None:
            scored = verdicts.steer(state, scored, demand, planned)
            self.metrics.decision(verb, "steered" if scored.pick == state.names[planned] else "plan-stale").inc()
        elif not demand.gpus:
            # A pod asking for no GPU keeps off the room promised to the planned GPU pods, a burst's gated DRA pods
            # among them (scoring.clusterview): the nodes beside it rank first (the CPU-pods entry's filter holds it
            # off them; this ranking is what remains of that where the entry is configured without its filter).
            plan = self._queue_plan(state)
            if plan is not None and plan.reserved is not None and len(plan.reserved) == len(state):
                kept = verdicts.keep_off_plan(scored, plan.reserved, demand)
                if kept is not scored:
                    self.metrics.decision(verb, "kept-off-plan").inc()
                scored = kept
        if scored.pick is not None:
            self._hold(pod, demand, state, policy, scored.pick)
        return scored

    def _hold(self, pod: dict[str, Any], demand: PodDemand, state: ClusterState, policy: Policy, pick: str) -> None:
        """kube-scheduler binds in the background and schedules the next pod at once: hold the GPUs on the node we
        expect it to choose, as the scheduler's own cache assumes the pod there; bind corrects a wrong guess. (A body
        naming a pod the watch shows bound: no hold.)"""
        key = pod_key(pod)
        if key in self.view.pods:
            return
        node = state.index[pick]
        fresh = key not in self.view.assumed
        self.view.assume(key, pick, demand, self._devices(pod, state, policy, demand, node))
        if not demand.gpus and fresh:
            # kube-scheduler binds it itself (the CPU-pod entry has no bind): from now on the plan's reserved model
            # holds it too, so that the next pods asking for no GPU are judged beside it.
            self._reserve_unplanned(key, node, demand, ())

    @staticmethod
    def _devices(pod: dict[str, Any], state: ClusterState, policy: Policy, demand: PodDemand,
                 node: int) -> tuple[int, ...]:
        """The GPUs for the pod on `node`: those a placement planned for it there (a gang's member: the gang
        controller planned every member's GPUs together, and another choice can leave a later member without room)
        when they are still free, else the policy's choice."""
        if not demand.gpus:
            return ()
        planned = planned_devices(pod)
        if planned is not None and planned[0] == state.names[node] and \
                verdicts.devices_free(state, node, demand, planned[1]):
            return planned[1]
        return tuple(policy.devices(state, demand, node))

    def _queue_plan(self, state: ClusterState) -> QueuePlan | None:
        """The joint plan of the pending GPU pods, updated with what changed once older than refresh_s
        (scoring.queueplan.update_plan), made in full when first needed, when a node's row changed (the model
        rebuilt, a node added, removed or read anew) or when scoring.queueplan.replan_reason says so; None while fewer
        than min_pods wait (each pod is then placed on its own)."""
        qp = self.queue_planning
        if qp.min_pods <= 0 or self.view.waiting_count() < qp.min_pods:
            self.plan = None
            return None
        now = self.view.clock()
        if self.plan is not None and now < self._plan_due and self._plan_model == self.view.rows_version:
            return self.plan
        waiting = self.view.waiting()
        started = time.perf_counter()
        full = self.plan is None or self._plan_model != self.view.rows_version or \
            replan_reason(self.plan, waiting, now=now, max_wait_s=qp.max_wait_s, max_age_s=qp.full_plan_max_age_s,
                          share=qp.full_plan_share) is not None
        if full or self.plan is None:
            self.plan = plan_queue(state, self.view.policy_name, self.view.workload(), waiting, now=now,
                                   max_wait_s=qp.max_wait_s, window=qp.window,
                                   rows_by_hostname=self.view.rows_by_hostname())
            self._plan_model = self.view.rows_version
        else:
            update_plan(self.plan, state, waiting, self.view.changed_rows(self._plan_synced), now=now,
                        max_wait_s=qp.max_wait_s, window=qp.window, rows_by_hostname=self.view.rows_by_hostname())
        self._plan_synced = self.view.row_changes
        took = time.perf_counter() - started
        # Counted from the plan's end, so a plan slower than refresh_s is not made again at the next filter.
        self._plan_due = self.view.clock() + max(qp.refresh_s, qp.min_gap_per_plan_second * took)
        self.metrics.queue_plan.observe(took)
        self.metrics.decision("queue-plan", "full" if full else "updated").inc()
        self.metrics.decision("queue-plan", "planned").inc(len(self.plan.planned))
        self.metrics.decision("queue-plan", "left-out").inc(len(self.plan.left_out))
        return self.plan

    def _reserve_unplanned(self, key: str, node: int, demand: PodDemand, devices: tuple[int, ...]) -> None:
        """A pod the plan left out is being bound: the plan's reserved model holds it too from now on. When it does
        not fit there (the plan was made again between filter and bind, or a node's row changed), the plan no
        longer matches the cluster: it is dropped and made again at the next filter, and the binding goes on."""
        plan = self.plan
        if plan is None or plan.reserved is None or key in plan.planned:
            return
        if self._plan_model != self.view.rows_version:
            self.plan = None
            return
        try:
            plan.reserved.place(node, demand, devices)
        except ValueError:  # MigLayoutError is one too
            self.plan = None

    def filter_cpu_pods(self, args: ExtenderArgs) -> ExtenderFilterResult:
        """The CPU-pod entry's filter (extender.schedconfig.cpu_pods_entry): every candidate passes (kube-scheduler's
        own filters judged the fit), except that while the pending GPU pods are planned jointly, a pod asking for no
        GPU is held off the nodes where it would take the room planned for them, a burst's gated DRA pods among them
        (in the gang controller's order, scoring.queueplan); not a pod with DRA claims, which the gang controller
        places. It waits (every node failed, resolvable: kube-scheduler tries it again as pods bind) where it fits
        beside the plan on no candidate, and while the plan places pods held for their DRA claims that arrived before
        it (verdicts.first_release: the gang controller places them in its next round), until it has waited
        queue_max_wait_seconds since its creation; from then on it is not held. A GPU pod, which that entry cannot
        leave out, passes at once: the GPU entry filters it."""
        demand = self._demand(args.Pod)
        names = args.node_names()
        failed: dict[str, str] = {}
        feasible_names = names
        if demand.gpus:
            self.metrics.decision("filter", "gpu-pod-skipped").inc()
        elif names and self._may_hold_for_plan(args.Pod):
            state, _ = self.view.snapshot()
            if self.plan is not None and any(k not in self.plan.planned and k not in self.plan.left_out
                                             for k in self.view.pinned):
                # A pod pinned since the plan was made (a DRA pod released onto its node, not bound yet): the plan
                # takes it in now, not refresh_s later, or this pod could take its room meanwhile. (One the plan
                # left out has been seen: it waits for the next update like any other.)
                self._plan_due = 0.0
            plan = self._queue_plan(state)
            first = verdicts.first_release(plan) if plan is not None else None
            if first is not None and first <= self._created(args.Pod):
                feasible_names, failed = [], dict.fromkeys(names, verdicts.HELD_FOR_EARLIER_GPU_PODS)
                self.metrics.decision("filter", "held-for-earlier-gpu-pods").inc(len(names))
            elif plan is not None and plan.reserved is not None and len(plan.reserved) == len(state):
                verdict = verdicts.FilterVerdict(list(names), feasible_rows=verdicts.node_indices(state, names))
                held = verdicts.hold_for_plan(verdict, plan.reserved, demand, reason=verdicts.HELD_BESIDE_PLAN)
                if held:
                    self.metrics.decision("filter", "held-beside-plan").inc(held)
                    feasible_names, failed = verdict.feasible, verdict.failed
                    self._last_filter = FilterMemo(args.Pod["metadata"].get("uid"), verdict.feasible,
                                                   verdict.feasible_rows, state.version)
        return filter_result(args, list(feasible_names), failed, {})

    def _may_hold_for_plan(self, pod: dict[str, Any]) -> bool:
        """Whether a pod asking for no GPU may still be held for the joint plan's room: until it has waited
        queue_max_wait_seconds since its creation, and never with DRA claims (such a pod reads as CPU and memory
        only: it is the gang controller's, pinned where its claims are allocated, and the plan's room is its own)."""
        return not pod["spec"].get("resourceClaims") and \
            self.wall_clock() - self._created(pod) < self.queue_planning.max_wait_s

    @staticmethod
    def _created(pod: dict[str, Any]) -> float:
        try:
            return created_at(pod)
        except (ValueError, AttributeError):
            raise BadRequest(f"Pod.metadata.creationTimestamp {pod['metadata'].get('creationTimestamp')!r} is not an "
                             "RFC 3339 time") from None

    def prioritize_cpu_pods(self, args: ExtenderArgs) -> verdicts.Priorities:
        """The CPU-pod entry's prioritize (extender.schedconfig.cpu_pods_entry): a pod that asks for no GPU is ranked
        as prioritize ranks it (the policy weighs the GPUs its CPU and memory would strand); a GPU pod, which that
        entry cannot leave out, gets an empty answer at once: the GPU entry ranks it."""
        demand = self._demand(args.Pod)
        if demand.gpus:
            self.metrics.decision("prioritize", "gpu-pod-skipped").inc()
            empty = np.empty(0, dtype=np.int64)
            return verdicts.Priorities([], empty, empty, None, [])
        return self.prioritize(args)

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        key = f"{args.PodNamespace}/{args.PodName}"
        pod = await self.pod_lookup(args.PodNamespace, args.PodName)
        if pod is None:
            raise BadRequest(f"pod {key} not found", status=404)
        if pod["metadata"].get("uid") and pod["metadata"]["uid"] != args.PodUID:
            raise BadRequest(f"pod {key} does not have uid {args.PodUID}", status=409)  # never the pod's own uid
        # What kube-scheduler's own filters would refuse, whoever asks: another scheduler's pod, a node it excludes.
        refused = bind_refusal(pod, self.view.nodes.get(args.Node), self.scheduler_names)
        if refused:
            self.metrics.decision("bind", "refused").inc()
            return ExtenderBindingResult(Error=f"{key} may not be bound to {args.Node} by gpuaas: {refused}")
        demand = self._demand(pod)
        held = self.view.placements.get(key) if key in self.view.assumed else None
        if held is not None and held.node != args.Node:
            self.metrics.decision("bind", "not-our-pick").inc()  # kube-scheduler overruled the ranking
        kept = (self.view.renew(key) if held is not None and held.node == args.Node and held.demand == demand
                else None)
        if kept is not None:
            # The usual case: kube-scheduler binds where prioritize held the GPUs, and the pod still fits there. The
            # hold stays as it is: what forget() and assume() below would make of it, at a third of the cost.
            devices = kept.devices
            node = self.view.snapshot()[0].index[args.Node]
        else:
            self.view.forget(key)  # the GPUs prioritize held for this pod, possibly on another node
            state, policy = self.view.snapshot()
            known = state.index.get(args.Node)
            if known is None:
                raise BadRequest(f"node {args.Node} is not known to gpuaas", status=422)
            node = known
            if not feasible(state, demand)[node]:
                # Another pod took the GPUs since filter ran: refuse, and the scheduler retries this pod.
                reason = verdicts.filter_nodes(state, demand, [args.Node]).failed.get(args.Node, "does not fit")
                self.metrics.decision("bind", "refused").inc()
                return ExtenderBindingResult(Error=f"{key} no longer fits on {args.Node}: {reason}")
            if (held is not None and held.node == args.Node
                    and verdicts.devices_free(state, node, demand, held.devices)):
                devices = held.devices  # what prioritize chose on this node, on the same state minus this pod
            else:
                devices = self._devices(pod, state, policy, demand, node)
            self.view.assume(key, args.Node, demand, tuple(devices))
        self._reserve_unplanned(key, node, demand, tuple(devices))
        started = time.perf_counter()
        try:
            await self.binder.bind(args.PodNamespace, args.PodName, args.PodUID, args.Node,
                                   {DEVICES_ANNOTATION: format_devices(devices)} if devices else {})
        except (BindError, OSError) as err:
            self.view.forget(key)
            self.metrics.decision("bind", "error").inc()
            log.warning("bind failed", extra={"pod": key, "node": args.Node, "error": str(err)})
            return ExtenderBindingResult(Error=str(err))
        self.metrics.decision("bind", "bound").inc()
        log.info("bound", extra={"pod": key, "node": args.Node, "devices": list(devices),
                                 "api_ms": round((time.perf_counter() - started) * 1000, 2)})
        return ExtenderBindingResult(Error="")

    async def explain(self, pod_ref: str, node: str) -> dict[str, Any]:
        namespace, _, name = pod_ref.rpartition("/")
        try:  # checked as the apiserver checks names before they reach a lookup (and its URL)
            namespace = dns1123_label(namespace or "default", "pod namespace")
            name = dns1123_subdomain(name, "pod name")
            dns1123_subdomain(node, "node")
        except InvalidName as err:
            raise BadRequest(f"explain ?pod=NAMESPACE/NAME&node=NODE: {err}") from None
        pod = await self.pod_lookup(namespace, name)
        if pod is None:
            raise BadRequest(f"pod {pod_ref} not found", status=404)
        demand = self._demand(pod)
        state, policy = self.view.snapshot()
        if node not in state.index:
            reason = self.view.bad_nodes.get(node)
            raise BadRequest(f"node {node}: {reason}" if reason else f"node {node} is not known to gpuaas", 404)
        out = verdicts.explain(state, policy, demand, node)
        out["pod"] = pod_key(pod)
        return out

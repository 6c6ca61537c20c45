"""The node scaler's reconcile: `decide` (pure: snapshot + memory -> what to do) and `NodeScaler.run_once(now)`,
which takes a snapshot, decides, and has the thin Kubernetes shell (`Cluster`) and the provider act, re-validating
what can have changed since the snapshot:

- a drain is started by a patch conditional on the node's resourceVersion (someone else cordoned it: skipped);
- a node is deleted only after the node's pods were listed from the apiserver (not the cache) and none must move,
  whether it was drained or never came up;
- pods are evicted through the Eviction API (the apiserver enforces PodDisruptionBudgets; 429 is retried later);
- a MIG config is set only if the node's label is still the one the plan read;
- before every write, the replica checks that it may still write (`may_act`: it holds the lease for at least the
  write's request timeout, and is not shutting down); `shutdown()` stops the reconcile and waits for it, so that the
  lease is released only once no write can start or be in flight.

A node that never became GPU-ready within its group's `max_provision_s` is a failed provision: its group backs off and
it is deleted (if no pod must move). So is a grow request the provider reports it failed to launch (`Provider.status`:
a NodeClaim Karpenter could not launch), or one that never became a node by then: the group backs off and the request
is withdrawn (`Provider.cancel`). Requests on their way are read back from the provider each reconcile (a NodeClaim
is an object of its own), so a restarted or new leader does not ask for them twice.

"Never" is known from the node itself: the first reconcile that sees a node GPU-ready writes the annotation
`gpuaas.io/gpu-ready-seen`, and pods bound to a node are evidence too. A node in service that goes unready (kubelet
trouble, a device-plugin restart, a MIG reconfiguration) keeps its pods: it is left alone, and after
`scale_in.unready_drain_s` drained like an idle node (scalein.Unready).

Order within a reconcile: nodes that never became GPU-ready are removed (their group backs off), scale-out (pods are
waiting on it), drains in progress go on, then scale-in (skipped in a reconcile that scaled out, as
cluster-autoscaler does), then nodes seen GPU-ready for the first time are annotated.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.events import EventRecorder, node_ref, pod_ref
from scoring.kubeobjects import MIG_CONFIG_LABEL, MIG_STATE_LABEL

from .config import NodeScalerConfig
from .drain import (
    DeleteNode,
    DrainAction,
    Evict,
    Rollback,
    Wait,
    drain_step,
    eviction_body,
    rollback_patch,
    start_patch,
)
from .metrics import Metrics
from .provider import LaunchFailure, NodeNotFound, Provider, ProviderError, ProviderStatus
from .scalein import Round, must_move, plan_scale_in, update_unneeded, update_unready
from .scaleout import ScaleOutPlan, SetMigConfig, Upcoming, plan_scale_out
from .snapshot import DRAIN_ANNOTATION, GPU_READY_SEEN_ANNOTATION, ClusterSnapshot, DrainRecord, in_service, pod_info

log = logging.getLogger("gpuaas.nodescaler")
COMPONENT = "gpuaas-nodescaler"


class NotLeader(RuntimeError):
    """This replica lost the lease during a reconcile: it stops acting at once."""


# ---- memory kept between reconciles (lost on restart by design: everything that must survive is on the nodes) ------
@dataclass
class Memory:
    unneeded: dict[str, float] = field(default_factory=dict)
    unready: dict[str, float] = field(default_factory=dict)  # node in service -> since when it is unready
    requested: list[Upcoming] = field(default_factory=list)
    backoff: dict[str, tuple[float, int]] = field(default_factory=dict)  # group -> (until, consecutive failures)
    next_evict: dict[str, float] = field(default_factory=dict)  # node -> earliest next eviction attempt
    evicted: dict[str, float] = field(default_factory=dict)  # pod uid -> when evicted (the cache may lag behind)

    def backed_off(self, now: float) -> set[str]:
        return {g for g, (until, _) in self.backoff.items() if until > now}


@dataclass
class ReconcilePlan:
    drains: list[DrainAction] = field(default_factory=list)
    failed_nodes: list[tuple[str, str]] = field(default_factory=list)  # (node, group) never became GPU-ready
    expired: list[Upcoming] = field(default_factory=list)  # asked for, never registered
    launch_failed: list[LaunchFailure] = field(default_factory=list)  # the provider could not launch them
    scale_out: ScaleOutPlan = field(default_factory=ScaleOutPlan)
    scale_in: Round | None = None
    unneeded: dict[str, float] = field(default_factory=dict)
    unready: dict[str, float] = field(default_factory=dict)  # nodes in service that are unready, since when
    seen_ready: list[str] = field(default_factory=list)  # GPU-ready, not annotated so yet: annotate them


def decide(snap: ClusterSnapshot, memory: Memory, config: NodeScalerConfig,
           failures: list[LaunchFailure] | tuple[LaunchFailure, ...] = ()) -> ReconcilePlan:
    """Everything one reconcile will do, from the snapshot and the memory alone (and the launch failures the
    provider reported since the last reconcile)."""
    d = ReconcilePlan()
    now = snap.now
    for n in sorted(snap.nodes.values(), key=lambda n: n.name):
        if n.drain is not None:
            if config.group(n.group) is None:  # the group left the config mid-drain: we may not delete its nodes
                d.drains.append(Rollback(n.name, f"node group {n.group or '(none)'} is not configured (any more)"))
            elif now < memory.next_evict.get(n.name, 0.0):
                d.drains.append(Wait(n.name, "eviction retry interval"))
            else:
                d.drains.append(drain_step(n, snap.pods_on(n.name), snap.pdbs, now, config.scale_in))
        group = config.group(n.group)
        if group is None or n.drain is not None:
            continue
        if not n.booting:
            if n.gpu_ready_seen is None:
                d.seen_ready.append(n.name)
        elif now - n.created > group.max_provision_s and not in_service(n, snap.pods_on(n.name)):
            d.failed_nodes.append((n.name, n.group))
    d.launch_failed = [f for f in failures if config.group(f.group) is not None]
    failed = {f.name for f in d.launch_failed}
    requested: list[Upcoming] = []
    for u in memory.requested:
        if snap.registered(u.name) or u.name in failed:
            continue  # registered: the snapshot tracks it from here
        (d.expired if now > u.deadline else requested).append(u)
    backed_off = memory.backed_off(now) | {g for _, g in d.failed_nodes} | {u.group for u in d.expired} \
        | {f.group for f in d.launch_failed}
    if config.scale_out.enabled:
        d.scale_out = plan_scale_out(snap, config, requested=requested, backed_off=backed_off)
    d.unneeded = update_unneeded(memory.unneeded, snap, config)
    d.unready = update_unready(memory.unready, snap, config)
    if not d.scale_out.acts and not d.failed_nodes:
        d.scale_in = plan_scale_in(snap, config, d.unneeded, unready=d.unready)
    return d


# ---- the Kubernetes shell -----------------------------------------------------------------------------------------
class Cluster(Protocol):
    def get_node(self, name: str) -> dict[str, Any] | None: ...

    def patch_node(self, name: str, patch: dict[str, Any]) -> bool:
        """False on a conflict (the node changed since it was read) or when it is gone."""

    def pods_on_node(self, name: str) -> list[dict[str, Any]]: ...

    def evict(self, namespace: str, name: str, body: dict[str, Any]) -> str:
        """'evicted', 'blocked' (429: a PodDisruptionBudget), 'gone' (404) or 'error: ...'."""

    def event(self, obj: dict[str, str], type_: str, reason: str, message: str) -> None: ...


class KubeCluster:
    """`Cluster` on the Kubernetes API. Every call is bounded by `request_timeout` (total seconds), so that a write
    issued while this replica may act cannot land long after it stopped leading; events, sent from a thread pool, are
    sent only while `may_act()` still holds."""

    def __init__(self, api, *, request_timeout: float | None = None, may_act: Callable[[], bool] = lambda: True):
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.api = api
        self.timeout = request_timeout
        self.may_act = may_act
        self.events = EventRecorder(self.core, COMPONENT, request_timeout=request_timeout, may_act=may_act)

    def get_node(self, name: str) -> dict[str, Any] | None:
        import json

        from kubernetes.client.rest import ApiException

        try:
            return json.loads(self.core.read_node(name, _preload_content=False, _request_timeout=self.timeout).data)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def patch_node(self, name: str, patch: dict[str, Any]) -> bool:
        from kubernetes.client.rest import ApiException

        try:
            # A JSON merge patch: null removes an annotation, a list replaces the taints (guarded by resourceVersion).
            self.core.patch_node(name, patch, _content_type="application/merge-patch+json", _preload_content=False,
                                 _request_timeout=self.timeout)
            return True
        except ApiException as err:
            if err.status in (404, 409):
                return False
            raise

    def pods_on_node(self, name: str) -> list[dict[str, Any]]:
        import json

        resp = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}", _preload_content=False,
                                                     _request_timeout=self.timeout)
        return json.loads(resp.data)["items"]

    def evict(self, namespace: str, name: str, body: dict[str, Any]) -> str:
        from kubernetes.client.rest import ApiException

        try:
            self.core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False,
                                                     _request_timeout=self.timeout)
            return "evicted"
        except ApiException as err:
            if err.status == 429:
                return "blocked"
            if err.status == 404:
                return "gone"
            return f"error: {err.status} {err.reason}"

    def event(self, obj: dict[str, str], type_: str, reason: str, message: str) -> None:
        self.events.event(obj, type_, reason, message)

    def close(self) -> None:
        """Wait for the events already submitted (each bounded by the request timeout, sent only while allowed)."""
        self.events.close()


# ---- the reconcile ------------------------------------------------------------------------------------------------
@dataclass
class Report:
    """What one reconcile did (for logs, tests and benchmarks)."""

    now: float
    grows: list[tuple[str, int, float]] = field(default_factory=list)  # (group, count, when the request was made)
    mig: list[tuple[str, str]] = field(default_factory=list)
    drains_started: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    marked_ready: list[str] = field(default_factory=list)  # annotated gpuaas.io/gpu-ready-seen
    skipped: list[str] = field(default_factory=list)
    decide_s: float = 0.0


class NodeScaler:
    def __init__(self, config: NodeScalerConfig, snapshot: Callable[[float], ClusterSnapshot], cluster: Cluster,
                 provider: Provider, *, metrics: Metrics | None = None, may_act: Callable[[], bool] = lambda: True,
                 wall: Callable[[], float] = time.time):
        self.config = config
        self.snapshot = snapshot
        self.cluster = cluster
        self.provider = provider
        self.metrics = metrics or Metrics()
        self.may_act = may_act
        self.wall = wall
        self.memory = Memory()
        self._stopping = threading.Event()
        self._acting = threading.Lock()  # held by a reconcile; shutdown() waits for it

    def _may_write(self) -> bool:
        return not self._stopping.is_set() and self.may_act()

    def _check(self) -> None:
        """Before every write: a replica that lost the lease, or is shutting down, stops acting at once."""
        if not self._may_write():
            raise NotLeader("shutting down" if self._stopping.is_set() else "lost the lease")

    def _event(self, obj: dict[str, str], type_: str, reason: str, message: str) -> None:
        if self._may_write():
            self.cluster.event(obj, type_, reason, message)

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop acting: no write starts once this is called, and it returns when no reconcile is running (the writes
        in flight have ended, each within its request timeout). Call it before releasing the lease. False if a
        reconcile was still running after `timeout` seconds."""
        self._stopping.set()
        if not self._acting.acquire(timeout=-1 if timeout is None else timeout):
            return False
        self._acting.release()
        return True

    def run_once(self, now: float, snap: ClusterSnapshot | None = None) -> Report:
        """One reconcile at `now` (epoch seconds) on `snap`, or on a snapshot taken now."""
        with self._acting:
            return self._run_once(now, snap)

    def _provider_status(self, now: float, snap: ClusterSnapshot) -> list[LaunchFailure]:
        """Read back the requests on their way from a provider whose requests are objects of their own (NodeClaims),
        into `memory.requested`; return the launch failures it reports."""
        fn = getattr(self.provider, "status", None)
        if fn is None:
            return []
        try:
            st: ProviderStatus = fn(now)
        except Exception as err:  # the API may fail; the next reconcile reads again
            self.metrics.errors.labels("provider_status").inc()
            log.warning("reading the provider's requests: %s", err)
            return []
        listed = {r.name for r in st.in_flight}
        self.memory.requested = [u for u in self.memory.requested if u.group not in st.complete or u.name in listed]
        known = {u.name for u in self.memory.requested}
        for r in st.in_flight:
            group = self.config.group(r.group)
            if group is not None and r.name not in known and not snap.registered(r.name):
                self.memory.requested.append(Upcoming(r.name, r.group, r.requested_at + group.max_provision_s))
        return st.failures

    def _run_once(self, now: float, snap: ClusterSnapshot | None) -> Report:
        t0 = time.perf_counter()
        snap = self.snapshot(now) if snap is None else snap
        failures = [] if self.config.dry_run else self._provider_status(now, snap)
        decision = decide(snap, self.memory, self.config, failures)
        report = Report(now, decide_s=time.perf_counter() - t0)
        newly_unready = sorted(set(decision.unready) - set(self.memory.unready))
        self.memory.unneeded = decision.unneeded
        self.memory.unready = decision.unready
        self._gauges(snap)
        if self.config.dry_run:
            log.info("dry run: %s", decision)
            return report
        try:
            # Scale-out first: pods are waiting on it; evictions of a drain can take a while.
            self._failed(decision, report)
            self._scale_out(snap, decision.scale_out, report)
            self._drains(snap, decision, report)
            if decision.scale_in is not None:
                self._scale_in(snap, decision.scale_in, report)
            self._mark_seen_ready(decision.seen_ready, report)
            window = self.config.scale_in.unready_drain_s
            for node in newly_unready:
                state = "no GPUs allocatable" if snap.nodes[node].ready else "NotReady"
                self._event(node_ref(node), "Warning", "NodeUnready",
                            f"node {node} was GPU-ready and is not ({state}); its pods stay"
                            + (f"; drained if still unready after {window:.0f}s" if window else ""))
        except NotLeader as err:
            log.warning("stopped acting in the middle of a reconcile: %s", err)
        finally:
            self.metrics.reconcile.observe(time.perf_counter() - t0)
        return report

    # -- drains in progress ------------------------------------------------------------------------------------------
    def _drains(self, snap: ClusterSnapshot, d: ReconcilePlan, report: Report) -> None:
        for action in d.drains:
            if isinstance(action, Evict):
                self._evict(action, report)
            elif isinstance(action, DeleteNode):
                self._delete_drained(action, report)
            elif isinstance(action, Rollback):
                self._rollback(action.node, action.why, report)

    def _evict(self, action: Evict, report: Report) -> None:
        blocked = 0
        now = self.wall()
        self.memory.evicted = {u: t for u, t in self.memory.evicted.items() if now - t < 30}
        for pod in action.pods:
            if pod.uid and pod.uid in self.memory.evicted:
                continue  # evicted a moment ago; the watch has not shown it terminating yet
            self._check()
            outcome = self.cluster.evict(pod.namespace, pod.name, eviction_body(pod, self.config.scale_in))
            self.metrics.decisions.labels("evict", outcome.split(":")[0]).inc()
            if outcome == "evicted":
                report.evicted.append(pod.key)
                self.memory.evicted[pod.uid] = now
                self._event(pod_ref(pod.key, pod.uid), "Normal", "ScaleDown",
                                   f"evicted by {COMPONENT}: node {action.node} is being removed")
            elif outcome == "blocked":
                blocked += 1
                report.blocked.append(pod.key)
            elif outcome.startswith("error"):
                self.metrics.errors.labels("evict").inc()
                log.warning("evicting %s: %s", pod.key, outcome)
        if blocked:
            self.memory.next_evict[action.node] = self.wall() + self.config.scale_in.eviction_retry_s

    def _delete_drained(self, action: DeleteNode, report: Report) -> None:
        self._delete_if_empty(action.node, action.group, "drained", report)

    def _delete_if_empty(self, node: str, group: str, reason: str, report: Report) -> None:
        # Re-validate from the apiserver, not the cache: nothing that must move may be on the node.
        left = must_move([pod_info(p) for p in self.cluster.pods_on_node(node)])
        if left:
            report.skipped.append(f"{node}: {len(left)} pods appeared (e.g. {left[0].key}); not deleting")
            return
        self._delete(node, group, reason, report)

    def _mark_seen_ready(self, nodes: list[str], report: Report) -> None:
        """Record on each node that it has been GPU-ready (once per node: a merge patch of one annotation)."""
        for node in nodes:
            self._check()
            if self.cluster.patch_node(node, {"metadata": {"annotations": {
                    GPU_READY_SEEN_ANNOTATION: f"{self.wall():.3f}"}}}):
                report.marked_ready.append(node)

    def _delete(self, node: str, group_name: str, reason: str, report: Report) -> None:
        group = self.config.group(group_name)
        if group is None:
            return
        self._check()
        try:
            self.provider.delete_node(group, node)
        except NodeNotFound:
            return  # deleted before (the cache still showed it)
        except ProviderError as err:
            self.metrics.errors.labels("delete_node").inc()
            log.warning("deleting %s: %s", node, err)
            return
        report.deleted.append(node)
        self.memory.next_evict.pop(node, None)
        self.metrics.decisions.labels("node_delete", reason).inc()
        self.metrics.nodes_removed.labels(group_name, reason).inc()
        self._event(node_ref(node), "Normal", "NodeRemoved", f"{COMPONENT} removed node {node} ({reason})")

    def _rollback(self, node: str, why: str, report: Report) -> None:
        obj = self.cluster.get_node(node)
        if obj is None or DRAIN_ANNOTATION not in (obj["metadata"].get("annotations") or {}):
            return
        self._check()
        if self.cluster.patch_node(node, rollback_patch(obj["spec"].get("taints") or [],
                                                        obj["metadata"]["resourceVersion"])):
            report.rolled_back.append(node)
            self.memory.next_evict.pop(node, None)
            self.metrics.decisions.labels("drain_rollback", "done").inc()
            self._event(node_ref(node), "Warning", "DrainRolledBack", f"drain rolled back: {why}")

    # -- nodes that never came up ------------------------------------------------------------------------------------
    def _failed(self, d: ReconcilePlan, report: Report) -> None:
        now = self.wall()
        groups = {g for _, g in d.failed_nodes} | {u.group for u in d.expired} | {f.group for f in d.launch_failed}
        for g in groups:
            _, failures = self.memory.backoff.get(g, (0.0, 0))
            failures += 1
            cfg = self.config.scale_out
            delay = min(cfg.backoff_initial_s * 2 ** (failures - 1), cfg.backoff_max_s)
            self.memory.backoff[g] = (now + delay, failures)
            self.metrics.decisions.labels("provision_failed", g).inc()
            why = "a launch failed" if g in {f.group for f in d.launch_failed} else \
                "nodes did not become GPU-ready in time"
            log.warning("group %s backs off for %.0fs: %s", g, delay, why)
        gone = {u.name for u in d.expired} | {f.name for f in d.launch_failed}
        self.memory.requested = [u for u in self.memory.requested if u.name not in gone]
        for f in d.launch_failed:
            self._event(f.obj, "Warning", "LaunchFailed", f"{f.reason}; group {f.group} backs off")
            log.warning("group %s: %s did not launch: %s", f.group, f.name, f.reason)
        # Withdraw what will not become a node: expired requests, failed launches still there (a NodeClaim).
        for name, group_name in [(u.name, u.group) for u in d.expired] + \
                [(f.name, f.group) for f in d.launch_failed if f.present]:
            cancel, gcfg = getattr(self.provider, "cancel", None), self.config.group(group_name)
            if cancel is None or gcfg is None:
                continue
            self._check()
            try:
                cancel(gcfg, name)
                report.skipped.append(f"{name}: withdrawn")
            except ProviderError as err:
                self.metrics.errors.labels("cancel").inc()
                log.warning("withdrawing %s: %s", name, err)
        for node, group in d.failed_nodes:
            self._event(node_ref(node), "Warning", "ProvisioningFailed",
                        f"never GPU-ready within max_provision_s; group {group} backs off")
            self._delete_if_empty(node, group, "provisioning-failed", report)

    # -- scale-out ---------------------------------------------------------------------------------------------------
    def _scale_out(self, snap: ClusterSnapshot, plan: ScaleOutPlan, report: Report) -> None:
        since = {p.key: p.unschedulable_since for p in snap.pending if p.unschedulable_since}
        for g in plan.grows:
            group = self.config.group(g.group)
            assert group is not None, "a plan grows only configured groups (made from this config)"
            self._check()
            t = self.wall()  # the request is made now; a provider may take a while to return (KWOK: N creates)
            try:
                names = self.provider.grow(group, g.count)
            except ProviderError as err:
                self.metrics.errors.labels("grow").inc()
                self.metrics.decisions.labels("scale_up", "error").inc()
                log.warning("growing %s by %d: %s", g.group, g.count, err)
                continue
            report.grows.append((g.group, g.count, t))
            deadline = t + group.max_provision_s
            self.memory.requested += [Upcoming(n, g.group, deadline) for n in names]
            self.metrics.decisions.labels("scale_up", "done").inc()
            self.metrics.nodes_added.labels(g.group).inc(g.count)
            oldest = min((since[k] for k in g.pods if k in since), default=None)
            if oldest is not None:
                self.metrics.scale_up_latency.observe(max(0.0, t - oldest))
            log.info("scale-up: group %s +%d for %d pods (%.2f/h each)", g.group, g.count, len(g.pods),
                     g.cost_per_hour, extra={"group": g.group, "count": g.count, "requested_at": t,
                                             "pods": list(g.pods), "snapshot_at": snap.now})
        for m in plan.mig:
            self._set_mig(m, report)
        # Events after the actions: they are records, not on the latency path.
        for g in plan.grows:
            for key in g.pods:
                self._event(pod_ref(key), "Normal", "TriggeredScaleUp",
                                   f"pod triggered scale-up: group {g.group} +{g.count} node(s)")
        for m in plan.mig:
            for key in m.pods:
                self._event(pod_ref(key), "Normal", "TriggeredMigRepartition",
                                   f"node {m.node} is being repartitioned to {m.config} for this pod")
        self.metrics.decisions.labels("wait_upcoming", "pods").inc(len(plan.wait_upcoming))
        self.metrics.decisions.labels("not_triggered", "pods").inc(len(plan.unplaceable))
        for key in plan.wait_upcoming:
            self._event(pod_ref(key), "Normal", "WaitingForNode",
                               "fits on a node being provisioned or repartitioned; no new scale-up for it")
        for key, why in plan.unplaceable.items():
            self._event(pod_ref(key), "Normal", "NotTriggerScaleUp", f"pod didn't trigger scale-up: {why}")

    def _set_mig(self, m: SetMigConfig, report: Report) -> None:
        obj = self.cluster.get_node(m.node)
        if obj is None:
            return
        labels = obj["metadata"].get("labels") or {}
        if obj["spec"].get("unschedulable") or labels.get(MIG_STATE_LABEL) == "pending":
            report.skipped.append(f"{m.node}: changed since the MIG plan")
            return
        self._check()
        patch = {"metadata": {"labels": {MIG_CONFIG_LABEL: m.config, MIG_STATE_LABEL: "pending"},
                              "resourceVersion": obj["metadata"]["resourceVersion"]}}
        if self.cluster.patch_node(m.node, patch):
            report.mig.append((m.node, m.config))
            self.metrics.decisions.labels("mig_repartition", "done").inc()
            self._event(node_ref(m.node), "Normal", "MigRepartition",
                               f"{MIG_CONFIG_LABEL} {labels.get(MIG_CONFIG_LABEL)} -> {m.config} for "
                               f"{len(m.pods)} pending pods")

    # -- scale-in ----------------------------------------------------------------------------------------------------
    def _scale_in(self, snap: ClusterSnapshot, r: Round, report: Report) -> None:
        for cmd in r.commands:
            obj = self.cluster.get_node(cmd.node)
            if obj is None:
                continue
            meta = obj["metadata"]
            if DRAIN_ANNOTATION in (meta.get("annotations") or {}) or obj["spec"].get("unschedulable"):
                report.skipped.append(f"{cmd.node}: cordoned since the snapshot")
                continue
            now = self.wall()
            record = DrainRecord(secrets.token_hex(4), f"{cmd.method}: {cmd.why}", now,
                                 now + self.config.scale_in.max_drain_s)
            self._check()
            if not self.cluster.patch_node(cmd.node, start_patch(record, obj["spec"].get("taints") or [],
                                                                 meta["resourceVersion"])):
                report.skipped.append(f"{cmd.node}: changed since it was read")
                continue
            report.drains_started.append(cmd.node)
            self.metrics.decisions.labels("drain_start", cmd.method).inc()
            self._event(node_ref(cmd.node), "Normal", "ScaleDown",
                               f"draining node {cmd.node} (drain {record.id}): {record.reason}")

    def _gauges(self, snap: ClusterSnapshot) -> None:
        self.metrics.pending.set(len(snap.pending))
        for g in self.config.groups:
            nodes = snap.group_nodes(g.name)
            self.metrics.group_size.labels(g.name, "draining").set(sum(1 for n in nodes if n.drain is not None))
            unready = sum(1 for n in nodes if n.name in self.memory.unready)
            self.metrics.group_size.labels(g.name, "unready").set(unready)
            self.metrics.group_size.labels(g.name, "booting").set(sum(1 for n in nodes if n.booting) - unready)
            self.metrics.group_size.labels(g.name, "ready").set(
                sum(1 for n in nodes if not n.booting and n.drain is None))
            self.metrics.backoff.labels(g.name).set(1 if g.name in self.memory.backed_off(snap.now) else 0)

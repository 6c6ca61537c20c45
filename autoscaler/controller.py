"""`gpuaas autoscaler`: the control loop. Thin shells around `QueueDepthPolicy.recommend`:

- `gather_signals` asks Prometheus (autoscaler/prom.py) for one target's signals and turns a failure into words;
- `KubeTargets` reads a Deployment's scale subresource and pods, writes the scale, events and the conditions;
- `Controller.sync_once(now)` builds a `TargetSnapshot` per target, asks the policy, acts, and records why. Only a
  replica that `may_act` (holds the Lease, autoscaler/service.py) writes; the others decide the same way and write
  nothing, so that the one taking over starts with the memory of the recent load (the policy's recommendation
  history).

Conditions live in the Deployment annotation `autoscaling.gpuaas.io/conditions` (a JSON list in the shape of HPA
conditions: type, status, reason, message, lastTransitionTime), as the HPA's v1 API kept its v2 conditions in
`autoscaling.alpha.kubernetes.io/conditions`: a Deployment's status belongs to its controller.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from .config import AutoscalerConfig, ConfigError, Target
from .policy import QueueDepthPolicy, QueueDepthState
from .prom import BadQuery, MetricsError, NoData, Prometheus, PrometheusUnavailable
from .snapshot import Recommendation, Signals, TargetSnapshot

log = logging.getLogger("gpuaas.autoscaler")

CONDITIONS_ANNOTATION = "autoscaling.gpuaas.io/conditions"
COMPONENT = "gpuaas-autoscaler"


# ---- Prometheus -> Signals -----------------------------------------------------------------------------------------
class Querier(Protocol):
    def query(self, promql: str) -> list: ...

    def scalar(self, promql: str) -> float: ...


def gather_signals(prom: Querier, target: Target, pods: list[str]) -> tuple[Signals | None, str | None]:
    """The target's signals, or (None, why) when the required ones cannot be had. Optional queries that fail leave
    their field empty; NaN in a pod's queue depth makes that pod missing and is reported."""
    notes: list[str] = []
    try:
        q = target.required_query("queue_per_pod", pods)
        queue: dict[str, float] = {}
        for s in prom.query(q):
            pod = s.labels.get("pod")
            if pod is None:
                raise NoData(f"{q!r} returned a series without a pod label (aggregate it by pod)")
            if math.isnan(s.value) or math.isinf(s.value):
                notes.append(f"queue depth of pod {pod} is {s.value}")
                continue
            queue[pod] = s.value
        arrival = prom.scalar(target.required_query("arrival_rate", pods))
    except PrometheusUnavailable as exc:
        return None, str(exc)
    except (NoData, BadQuery) as exc:
        return None, str(exc)

    def optional(name: str) -> float | None:
        q = target.query(name, pods)
        if q is None:
            return None
        try:
            return prom.scalar(q)
        except NoData:
            return None
        except MetricsError as exc:
            notes.append(str(exc))
            return None

    gateway = optional("gateway_waiting") or 0.0
    sig = Signals(queue_per_pod=queue, gateway_waiting=gateway, arrival_rate=arrival,
                  arrival_rate_short=optional("arrival_rate_short"), service_time=optional("service_time"))
    return sig, ("; ".join(notes) or None)


# ---- Kubernetes shell ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Observed:
    replicas: int
    pods: frozenset[str]
    pending: frozenset[str]
    uid: str
    annotations: dict[str, str] = field(default_factory=dict)


class Targets(Protocol):
    def observe(self, target: Target) -> Observed: ...

    def scale(self, target: Target, replicas: int) -> None: ...

    def event(self, target: Target, observed: Observed, type_: str, reason: str, message: str) -> None: ...

    def set_conditions(self, target: Target, conditions: list[dict[str, str]]) -> None: ...


class NotLeader(RuntimeError):
    """This replica lost the lease during a sync: it stops writing at once."""


class KubeTargets:
    """`Targets` on the Kubernetes API. Every call is bounded by `request_timeout` seconds, so that a write started
    while this replica leads ends (landed or timed out) before another replica can take over."""

    def __init__(self, api, *, instance: str = COMPONENT, request_timeout: float | None = None):
        from kubernetes import client

        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.instance = instance  # the events' reportingInstance: which replica acted
        self.timeout = request_timeout

    def observe(self, target: Target) -> Observed:
        dep = self.apps.read_namespaced_deployment(target.deployment, target.namespace, _request_timeout=self.timeout)
        scale = self.apps.read_namespaced_deployment_scale(target.deployment, target.namespace,
                                                           _request_timeout=self.timeout)
        selector = scale.status.selector or ",".join(f"{k}={v}" for k, v in dep.spec.selector.match_labels.items())
        pods = self.core.list_namespaced_pod(target.namespace, label_selector=selector,
                                             _request_timeout=self.timeout).items
        live = [p for p in pods if p.metadata.deletion_timestamp is None
                and p.status.phase not in ("Succeeded", "Failed")]
        return Observed(replicas=scale.spec.replicas or 0, pods=frozenset(p.metadata.name for p in live),
                        pending=frozenset(p.metadata.name for p in live if p.status.phase == "Pending"),
                        uid=dep.metadata.uid, annotations=dict(dep.metadata.annotations or {}))

    def scale(self, target: Target, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(target.deployment, target.namespace,
                                                    {"spec": {"replicas": replicas}}, _request_timeout=self.timeout)

    def event(self, target: Target, observed: Observed, type_: str, reason: str, message: str) -> None:
        now = dt.datetime.now(dt.UTC)
        self.core.create_namespaced_event(target.namespace, {
            "metadata": {"generateName": f"{target.deployment}.", "namespace": target.namespace},
            "involvedObject": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target.deployment,
                               "namespace": target.namespace, "uid": observed.uid},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT, "reportingInstance": self.instance,
            "firstTimestamp": now.isoformat(), "lastTimestamp": now.isoformat(), "count": 1,
        }, _request_timeout=self.timeout)

    def set_conditions(self, target: Target, conditions: list[dict[str, str]]) -> None:
        self.apps.patch_namespaced_deployment(target.deployment, target.namespace, {
            "metadata": {"annotations": {CONDITIONS_ANNOTATION: json.dumps(conditions, sort_keys=True)}}},
            _request_timeout=self.timeout)


# ---- the loop -------------------------------------------------------------------------------------------------------
def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(old: list[dict[str, str]], new: list[tuple[str, str, str, str]],
                     now: float) -> list[dict[str, str]]:
    """New (type, status, reason, message) conditions, keeping lastTransitionTime when the status did not change."""
    prior = {c.get("type"): c for c in old}
    out = []
    for type_, status, reason, message in new:
        was = prior.get(type_)
        since = was["lastTransitionTime"] if was and was.get("status") == status else _iso(now)
        out.append({"type": type_, "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": since})
    return out


@dataclass
class TargetMemory:
    state: QueueDepthState = field(default_factory=QueueDepthState)
    metrics_error: str | None = None  # the error of the last sync, to announce transitions once
    conditions: list[dict[str, str]] = field(default_factory=list)


class Controller:
    def __init__(self, config: AutoscalerConfig, prom: Querier, targets: Targets, *,
                 clock: Callable[[], float] = time.time, may_act: Callable[[], bool] = lambda: True):
        self.config = config
        self.prom = prom
        self.targets = targets
        self.clock = clock
        self.may_act = may_act
        self.policies = {t.key: QueueDepthPolicy(t.policy_config(config.interval_s)) for t in config.targets}
        self.memory = {t.key: TargetMemory() for t in config.targets}
        self.syncs = 0  # sync_once calls
        self.syncs_acting = 0  # of which this replica held the lease at the start
        self.first_acting_sync_at: float | None = None  # wall time; the service resets it when the lease changes hands

    def validate(self) -> None:
        """Run every configured query once (`validate_queries`)."""
        validate_queries(self.config, self.prom)

    def sync_once(self) -> dict[str, Recommendation]:
        out = {}
        if self.may_act():
            self.syncs_acting += 1
            if self.first_acting_sync_at is None:
                self.first_acting_sync_at = time.time()
        for t in self.config.targets:
            try:
                out[t.key] = self.sync_target(t)
            except NotLeader:
                log.warning("lost the lease while syncing %s: stopped writing", t.key)
            except Exception as exc:  # one target's API failure must not stop the others
                log.exception("sync of %s failed: %s", t.key, exc)
        self.syncs += 1
        return out

    def _check(self) -> None:
        """Before every write: a replica that no longer holds the lease must not write."""
        if not self.may_act():
            raise NotLeader("lost the lease")

    def sync_target(self, t: Target) -> Recommendation:
        now = self.clock()
        mem = self.memory[t.key]
        acting = self.may_act()
        observed = self.targets.observe(t)
        signals, error = gather_signals(self.prom, t, sorted(observed.pods))
        snap = TargetSnapshot(now=now, replicas=observed.replicas, pods=observed.pods, pending_pods=observed.pending,
                        signals=signals, error=error if signals is None else None)
        decision, mem.state = self.policies[t.key].recommend(snap, mem.state)
        if signals is not None and error:  # partial data: usable, but say so
            decision = replace(decision, message=f"{decision.message}; note: {error}")
        log.info("%s%s: %d -> %d %s: %s", "" if acting else "(standby, writes nothing) ", t.key, observed.replicas,
                 decision.desired, decision.reason, decision.message)

        # Metrics lost or back: announce the transition once, not every sync (a standby remembers what the leader
        # announced, so a takeover does not announce it again).
        failing = snap.error
        if acting and failing and failing != mem.metrics_error:
            self._check()
            self.targets.event(t, observed, "Warning", "MetricsUnavailable",
                               f"{failing}; no scale-down until metrics are back")
        elif acting and not failing and mem.metrics_error:
            self._check()
            self.targets.event(t, observed, "Normal", "MetricsRecovered", "metrics are back; scaling on them again")
        mem.metrics_error = failing
        if not acting:
            mem.conditions = []  # the leader's, read from the Deployment after a takeover
            return decision

        able = ("AbleToScale", "True", "ReadyForNewScale", "the last scale succeeded or none was needed")
        if decision.desired != observed.replicas:
            verb = "would scale" if self.config.dry_run else "scaled"
            msg = f"{verb} from {observed.replicas} to {decision.desired}: {decision.message}"
            self._check()
            if self.config.dry_run:
                self.targets.event(t, observed, "Normal", f"DryRun{decision.reason}", msg)
            else:
                try:
                    self.targets.scale(t, decision.desired)
                    self.targets.event(t, observed, "Normal", decision.reason, msg)
                    able = ("AbleToScale", "True", "SucceededRescale", msg)
                except Exception as exc:  # the API refused: say so where the operator looks
                    reason = getattr(exc, "reason", None) or type(exc).__name__
                    self.targets.event(t, observed, "Warning", "FailedRescale", f"{msg} failed: {reason}")
                    able = ("AbleToScale", "False", "FailedUpdateScale", f"{msg} failed: {reason}")
        active = (("ScalingActive", "False", "MetricsUnavailable",
                   f"{failing}; holding replicas, no scale-down on missing data") if failing else
                  ("ScalingActive", "True", "ValidMetricFound",
                   "scaling on the arrival rate, service time and queue depth read from Prometheus"))
        limited = (("ScalingLimited", "True", decision.limited, f"the desired count is outside [{t.min_replicas}, "
                    f"{t.max_replicas}]") if decision.limited else
                   ("ScalingLimited", "False", "DesiredWithinRange",
                    "the desired count is within the acceptable range"))
        if not mem.conditions and observed.annotations.get(CONDITIONS_ANNOTATION):
            # after a restart, keep the transition times already recorded on the Deployment
            with contextlib.suppress(ValueError, TypeError):
                mem.conditions = list(json.loads(observed.annotations[CONDITIONS_ANNOTATION]))
        conditions = merge_conditions(mem.conditions, [able, active, limited], now)
        if conditions != mem.conditions:
            self._check()
            try:
                self.targets.set_conditions(t, conditions)
                mem.conditions = conditions
            except Exception as exc:
                log.warning("could not write conditions of %s: %s", t.key, exc)
        return decision

    def run(self, stop: threading.Event, wake: threading.Event | None = None) -> None:
        """Sync every interval_s until `stop`; `wake` (cleared after each wait) starts the next sync early."""
        wake = wake or stop
        while not stop.is_set():
            started = time.monotonic()
            self.sync_once()
            wake.wait(max(0.0, self.config.interval_s - (time.monotonic() - started)))
            if wake is not stop:
                wake.clear()


def validate_queries(config: AutoscalerConfig, prom: Querier) -> None:
    """Run every configured query once; a query Prometheus rejects, or a Prometheus that cannot be reached, is a
    ConfigError naming the target and the query. Touches no Kubernetes."""
    for t in config.targets:
        for name in ("queue_per_pod", "gateway_waiting", "arrival_rate", "arrival_rate_short", "service_time"):
            q = t.query(name, [f"{t.deployment}-validate"])
            if q is None:
                continue
            try:
                prom.query(q)
            except BadQuery as exc:
                raise ConfigError(f"target {t.key}: query {name}: {exc}") from None
            except PrometheusUnavailable as exc:
                raise ConfigError(f"cannot validate the queries of target {t.key}: {exc}") from None


def kube_api(kubeconfig: str | None = None):
    """The ApiClient for `kubeconfig`; a kubeconfig that cannot be loaded is a ConfigError."""
    from kubernetes.config import ConfigException

    from runtime.kubeclient import api_client

    try:
        return api_client(kubeconfig)
    except (ConfigException, OSError) as exc:
        raise ConfigError(f"kubeconfig {kubeconfig or '(in-cluster, then ~/.kube/config)'}: {exc}") from None


def build(config: AutoscalerConfig, kubeconfig: str | None = None, *, api=None, instance: str = COMPONENT,
          may_act: Callable[[], bool] = lambda: True, request_timeout: float | None = None) -> Controller:
    """A controller wired to a real Prometheus and Kubernetes. The queries are validated first, then the kubeconfig
    is loaded; either failing is a ConfigError."""
    prom = Prometheus(config.prometheus.url, timeout_s=config.prometheus.timeout_s)
    validate_queries(config, prom)
    api = api if api is not None else kube_api(kubeconfig)
    return Controller(config, prom, KubeTargets(api, instance=instance, request_timeout=request_timeout),
                      may_act=may_act)

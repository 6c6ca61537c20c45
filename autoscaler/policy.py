"""Replica recommenders: pure functions of (snapshot, previous state) -> (decision, new state).

- `QueueDepthPolicy` (ours, "ours"): sizes replicas from the arrival rate and the measured service time with
  square-root staffing, adds capacity to drain what is already queued, looks one cold start ahead along the rate's
  trend, comes down step by step as the memory of its recent recommendations fades (linearly to nothing over 30 cold
  starts by default, so that no step down comes at once when an old burst leaves the window), and never scales down on
  missing data.
- `HpaPolicy` ("hpa"): a stock autoscaling/v2 HPA on a Pods metric (in-flight requests or queue depth per pod,
  AverageValue target) with the controller's defaults.
- `KedaPolicy` ("keda"): a KEDA ScaledObject with a Prometheus trigger on the total in flight or the total queue depth
  (AverageValue), with KEDA's defaults: 30 s polling for activation, activationThreshold 0, cooldown 300 s before
  scaling to zero, minReplicaCount 0; between 1 and N replicas the HPA KEDA generates does the scaling.
- `KpaPolicy` ("kpa"): Knative's Pod Autoscaler on concurrency with its defaults (stable and panic windows).
- `StaticPolicy` ("static"): a fixed count.

The emulations (hpa, keda, kpa) cite the source they follow in their docstrings; `gpuaas simulate autoscaling`
compares them with ours. Each policy has `sync_period_s`: how often its loop runs (the simulator calls it that often;
so does the controller), a `setting` (its configuration in words), and `initial_state(replicas)`: the memory of a
fresh policy, or of one that has held `replicas` up to now (the simulator's warm start).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from . import hpa
from .snapshot import Recommendation, Signals, TargetSnapshot, finite


class ReplicaPolicy(Protocol):
    # Read-only: the policies are frozen dataclasses (QueueDepthPolicy's sync_period_s is a property).
    @property
    def name(self) -> str: ...

    @property
    def sync_period_s(self) -> float: ...

    def initial_state(self, replicas: int = 0) -> Any:
        """A fresh policy's memory, or (`replicas` > 0, a warm start) that of one that has held `replicas` up to now."""
        ...

    def recommend(self, snap: TargetSnapshot, state: Any) -> tuple[Recommendation, Any]: ...


def _clamp(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, n))


# ---- ours ---------------------------------------------------------------------------------------------------------
HOLD_COLD_STARTS = 30  # the default scale-down memory, in cold starts
@dataclass(frozen=True)
class QueueDepthConfig:
    min_replicas: int = 1
    max_replicas: int = 100
    concurrency: int = 8  # requests one replica serves at once
    cold_start_s: float = 60.0  # from asking for a replica to its first request
    beta: float = 1.0  # square-root staffing: slots = R + beta * sqrt(R), R = arrival rate x service time
    max_trend_factor: float = 2.0  # the rate one cold start ahead is at most this multiple of the rate now
    hold_shape: str = "linear"  # "flat": hold the highest recommendation of the window; "linear": an older one counts
    hold_floor: float = 0.0  # less, down to this fraction of it at the window's end
    drain_s: float | None = None  # queued work is sized to drain within this long (default: cold_start_s)
    scale_down_window_s: float | None = None  # remember recommendations this long (default: 30 cold starts)
    default_service_time_s: float = 1.0  # until a request has finished
    sync_period_s: float = 15.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 0 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        for name in ("cold_start_s", "beta", "default_service_time_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.sync_period_s <= 0:
            raise ValueError(f"sync_period_s must be > 0, got {self.sync_period_s}")
        if self.hold_shape not in ("flat", "linear"):
            raise ValueError(f"hold_shape must be flat or linear, got {self.hold_shape!r}")
        if not 0 <= self.hold_floor <= 1:
            raise ValueError(f"hold_floor must be within [0, 1], got {self.hold_floor}")

    @property
    def window_s(self) -> float:
        if self.scale_down_window_s is not None:
            return self.scale_down_window_s
        return HOLD_COLD_STARTS * self.cold_start_s

    def weight(self, age: float) -> float:
        """The share of a past recommendation still held `age` seconds later ("linear"): all of it now, falling
        linearly to `hold_floor` at the window's end, nothing after (with the default floor 0 the memory fades out
        without a step)."""
        window = self.window_s
        if age >= window:
            return 0.0
        return 1.0 - (1.0 - self.hold_floor) * age / window if window > 0 else 1.0


@dataclass(frozen=True)
class QueueDepthState:
    recommendations: tuple[tuple[float, int], ...] = ()
    service_time: float | None = None  # last measured mean service time
    last_rate: tuple[float, float] | None = None  # (time, arrival rate) of the previous sync, for the trend


@dataclass(frozen=True)
class QueueDepthPolicy:
    config: QueueDepthConfig = field(default_factory=QueueDepthConfig)
    name: str = "ours"

    @property
    def sync_period_s(self) -> float:
        return self.config.sync_period_s

    @property
    def setting(self) -> str:
        return "the one configuration"

    def initial_state(self, replicas: int = 0) -> QueueDepthState:
        return QueueDepthState(recommendations=((0.0, replicas),) if replicas > 0 else ())

    def demand(self, snap: TargetSnapshot, state: QueueDepthState) -> tuple[int, int, str, QueueDepthState]:
        """(replicas to ask for now, replicas the current arrival rate needs in steady state, why, new state).

        The first looks one cold start ahead along the rate's trend and adds room to drain the queue; the second is what
        the scale-down window remembers (a burst's transient terms are not held after it)."""
        c = self.config
        sig = snap.signals
        assert sig is not None
        service = sig.service_time if finite(sig.service_time) and sig.service_time > 0 else (
            state.service_time or c.default_service_time_s)
        rates = [r for r in (sig.arrival_rate, sig.arrival_rate_short) if finite(r)]
        rate = max(rates) if rates else 0.0
        ahead = rate
        if state.last_rate and finite(sig.arrival_rate) and snap.now > state.last_rate[0]:
            slope = (sig.arrival_rate - state.last_rate[1]) / (snap.now - state.last_rate[0])
            if slope > 0:
                ahead = min(rate + slope * c.cold_start_s, rate * max(1.0, c.max_trend_factor))
        def staffed(load: float) -> float:  # square-root staffing: slots for `load` busy slots
            return load + c.beta * math.sqrt(load)
        queue = sig.total_queue
        drain = c.drain_s if c.drain_s is not None else c.cold_start_s
        backlog_slots = queue * service / drain if drain > 0 else queue
        up = math.ceil((staffed(ahead * service) + backlog_slots) / c.concurrency - 1e-9)
        steady = math.ceil(staffed(rate * service) / c.concurrency - 1e-9)
        why = (f"arrival {rate:.2f}/s (trend {ahead:.2f}/s in {c.cold_start_s:.0f}s) x service {service:.2f}s; "
               f"queue {queue:.0f} adds {backlog_slots:.1f} slots; {c.concurrency} slots/replica -> {up}")
        new_state = replace(state, service_time=service,
                            last_rate=(snap.now, sig.arrival_rate) if finite(sig.arrival_rate) else state.last_rate)
        return up, steady, why, new_state

    def recommend(self, snap: TargetSnapshot, state: QueueDepthState) -> tuple[Recommendation, QueueDepthState]:
        c = self.config
        current = snap.replicas
        sig = snap.signals
        if snap.error or sig is None or not finite(sig.arrival_rate):
            # No trustworthy data: never scale down on it. Scale up only if what did come back shows a queue.
            why = snap.error or "no arrival rate from Prometheus"
            want = current
            if sig is not None and sig.queue_per_pod and sig.total_queue > 0:
                need, _, _, state = self.demand(replace(snap, signals=replace(sig, arrival_rate=None)), state)
                want = max(current, need)
            desired = _clamp(want, c.min_replicas, c.max_replicas)
            return Recommendation(desired, "MetricsUnavailable",
                            f"{why}; holding {current} replicas (no scale-down on missing data)"
                            + (f", scaling up to {desired} on the queue that is visible" if desired > current else ""),
                            scale_down_blocked=True), state
        need, _steady, why, state = self.demand(snap, state)
        window = c.window_s
        recs = tuple((t, r) for t, r in state.recommendations if t > snap.now - window) + ((snap.now, need),)
        state = replace(state, recommendations=recs)
        if c.hold_shape == "linear":
            held = max(math.ceil(r * c.weight(snap.now - t) - 1e-9) for t, r in recs)
        else:
            held = max(r for _, r in recs)
        stabilized = need if need >= current else min(current, held)
        desired = _clamp(stabilized, c.min_replicas, c.max_replicas)
        if desired > current:
            reason = "ScaleUp"
        elif desired < current:
            reason = "ScaleDown"
            if held > need:
                why += f"; down to {held}: what the recommendations of the last {window:.0f}s still ask for"
        elif need < current:
            reason = "ScaleDownStabilized"
            why += f"; keeping {held}: what the recommendations of the last {window:.0f}s still ask for"
        else:
            reason = "Steady"
        limited = None
        if desired != stabilized:
            why += f"; clamped to [{c.min_replicas}, {c.max_replicas}]"
            limited = "TooManyReplicas" if stabilized > desired else "TooFewReplicas"
        return Recommendation(desired, reason, why, limited=limited), state


# ---- HPA ----------------------------------------------------------------------------------------------------------
Metric = Literal["queue", "inflight"]
METRICS: tuple[Metric, ...] = ("inflight", "queue")


def _pods_metric(sig: Signals, metric: Metric) -> dict[str, float]:
    """Per pod: `queue` = vllm:num_requests_waiting; `inflight` = vllm:num_requests_running + num_requests_waiting."""
    return sig.inflight_per_pod if metric == "inflight" else sig.queue_per_pod


@dataclass(frozen=True)
class HpaPolicy:
    """A stock autoscaling/v2 HorizontalPodAutoscaler on a Pods metric with an AverageValue target, as
    kube-controller-manager runs it (kubernetes/kubernetes pkg/controller/podautoscaler: replica_calculator.go
    `calcPlainMetricReplicas` and `groupPods`, horizontal.go `normalizeDesiredReplicasWithBehaviors`; defaults from
    pkg/controller/podautoscaler/config/v1alpha1/defaults.go and pkg/apis/autoscaling/v2/defaults.go; the arithmetic is
    in `hpa.py`). Every 15 s (--horizontal-pod-autoscaler-sync-period): desired = ceil(ready pods x average / target)
    unless the ratio is within the 0.1 tolerance; pods without a value yet (a starting vLLM is Running but not Ready and
    exports nothing) count as 0 on a scale-up and as the target on a scale-down; the highest recommendation of the last
    300 s bounds a scale-down (downscale stabilization); a scale-up adds at most max(4 pods, 100 %) per 15 s.

    `metric`: "inflight" (running + waiting per pod, what vLLM users give an HPA) or "queue" (waiting only)."""
    target: float  # average value per pod (AverageValue)
    metric: Metric = "queue"
    min_replicas: int = 1
    max_replicas: int = 100
    behavior: hpa.Behavior = hpa.Behavior()
    tolerance: float = hpa.TOLERANCE
    sync_period_s: float = hpa.SYNC_PERIOD_S
    name: str = "hpa"

    @property
    def setting(self) -> str:
        return f"{self.metric} {self.target:g}/pod, min {self.min_replicas}"

    def initial_state(self, replicas: int = 0) -> hpa.HpaState:
        """A fresh HPA, or (`replicas` > 0) one that has been recommending `replicas` up to now."""
        return hpa.HpaState(recommendations=((0.0, replicas),) if replicas > 0 else ())

    def recommend(self, snap: TargetSnapshot, state: hpa.HpaState) -> tuple[Recommendation, hpa.HpaState]:
        current = snap.replicas
        if current == 0:
            why = "scaling is disabled since the replica count of the target is zero"
            return Recommendation(0, "ScalingDisabled", why), state
        raw = None
        if not snap.error and snap.signals is not None:
            raw = hpa.pods_metric_replicas(current, _pods_metric(snap.signals, self.metric), self.target,
                                           pods=snap.pods, pending=snap.pending_pods, tolerance=self.tolerance)
        if raw is None:
            # FailedGetPodsMetric: the HPA keeps the current count (inside min/max) and records no recommendation.
            desired = _clamp(current, self.min_replicas, self.max_replicas)
            why = snap.error or "did not receive metrics for targeted pods"
            return Recommendation(desired, "FailedGetPodsMetric", why, scale_down_blocked=True), state
        n = hpa.normalize(current, raw, min_replicas=self.min_replicas, max_replicas=self.max_replicas, now=snap.now,
                          state=state, behavior=self.behavior)
        return Recommendation(n.desired, n.reason, f"raw recommendation {raw}: {n.message}"), n.state


# ---- KEDA ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KedaState:
    hpa: hpa.HpaState = hpa.HpaState()
    last_poll: float | None = None
    last_active: float | None = None


@dataclass(frozen=True)
class KedaPolicy:
    """A KEDA ScaledObject with a Prometheus trigger (metricType AverageValue), with KEDA's defaults
    (kedacore/keda-docs content/docs/2.x/reference/scaledobject-spec.md and concepts/scaling-deployments.md):
    pollingInterval 30 s, cooldownPeriod 300 s, minReplicaCount 0, activationThreshold 0, ignoreNullValues true.
    The operator polls every 30 s and owns 0 <-> 1: active when the value exceeds the activation threshold; at zero an
    active poll scales to 1; not active for the cooldown period (or never since creation) scales to 0. Between 1 and N
    the HPA KEDA generates (keda-hpa-NAME, External metric, AverageValue) scales with the HPA's defaults and 15 s sync:
    ceil(total / threshold) unless total / (threshold x replicas) is within the tolerance
    (`GetExternalPerPodMetricReplicas`).

    `metric`: the query's total over the Deployment, plus what waits at the gateway: "inflight" = sum of running +
    waiting, "queue" = sum of waiting."""
    target: float  # trigger threshold: the value per replica (metricType AverageValue)
    metric: Metric = "queue"
    min_replica_count: int = 0
    max_replica_count: int = 100
    polling_interval_s: float = 30.0
    cooldown_period_s: float = 300.0
    activation_threshold: float = 0.0
    behavior: hpa.Behavior = hpa.Behavior()
    sync_period_s: float = hpa.SYNC_PERIOD_S  # the generated HPA's loop; the operator polls every polling_interval_s
    name: str = "keda"

    @property
    def setting(self) -> str:
        return f"{self.metric} {self.target:g}/replica, min {self.min_replica_count}"

    def initial_state(self, replicas: int = 0) -> KedaState:
        """A fresh ScaledObject, or (`replicas` > 0) one whose HPA has been recommending `replicas` and whose trigger
        was active up to now."""
        if replicas <= 0:
            return KedaState()
        return KedaState(hpa=hpa.HpaState(recommendations=((0.0, replicas),)), last_active=0.0)

    def total(self, sig: Signals) -> float:
        per_pod = _pods_metric(sig, self.metric)
        return sum(per_pod.values()) + sig.gateway_waiting

    def recommend(self, snap: TargetSnapshot, state: KedaState) -> tuple[Recommendation, KedaState]:
        current = snap.replicas
        # The Prometheus scaler's `sum(...)` query; ignoreNullValues (default true) turns an empty answer into 0.
        total = self.total(snap.signals) if snap.signals is not None and not snap.error else None
        if total is not None and not finite(total):
            total = None
        poll_due = state.last_poll is None or snap.now - state.last_poll >= self.polling_interval_s - 1e-9
        if poll_due:
            state = replace(state, last_poll=snap.now)
            active = total is not None and total > self.activation_threshold
            if active:
                state = replace(state, last_active=snap.now)
            if current == 0 and active:
                return Recommendation(max(self.min_replica_count, 1), "KEDAScaleTargetActivated",
                                f"{self.metric} {total:.0f} > activation threshold {self.activation_threshold}"), state
            if (current > 0 and not active and total is not None and self.min_replica_count == 0
                    and (state.last_active is None or snap.now - state.last_active >= self.cooldown_period_s)):
                return Recommendation(0, "KEDAScaleTargetDeactivated",
                                f"inactive for the cooldown period {self.cooldown_period_s:.0f}s"), state
        if current == 0:
            why = "scaled to zero; the operator activates on its next poll"
            return Recommendation(0, "ScalingDisabled", why), state
        if total is None:
            desired = _clamp(current, max(self.min_replica_count, 1), self.max_replica_count)
            why = snap.error or "no value"
            return Recommendation(desired, "FailedGetExternalMetric", why, scale_down_blocked=True), state
        raw = hpa.external_average_replicas(total, self.target, len(snap.pods))
        n = hpa.normalize(current, raw, min_replicas=max(self.min_replica_count, 1),
                          max_replicas=self.max_replica_count, now=snap.now, state=state.hpa, behavior=self.behavior)
        recommendation = Recommendation(n.desired, n.reason, f"raw recommendation {raw}: {n.message}")
        return recommendation, replace(state, hpa=n.state)


# ---- KPA -------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KpaState:
    panic_time: float | None = None  # when the panic window last crossed the threshold (None: stable mode)
    max_panic_pods: int = 0  # the most pods asked for during this panic: panic mode never scales down
    zero_since: float | None = None  # since when the decider asks for zero (scale-to-zero grace period)


@dataclass(frozen=True)
class KpaPolicy:
    """Knative's Pod Autoscaler on concurrency, with the defaults of config-autoscaler
    (knative/serving pkg/autoscaler/config/config.go `defaultConfig`; docs: knative.dev/docs/serving/autoscaling/
    kpa-specific): stable window 60 s, panic window 10 % of it (6 s), panic threshold 200 %, target utilization 70 %,
    max scale-up rate 1000, max scale-down rate 2, tick interval 2 s, scale-to-zero on with a 30 s grace period,
    min-scale 0.

    Each tick (knative/serving pkg/autoscaler/scaling/autoscaler.go `Scale`): the collector's per-second averages of
    the requests in flight (queue-proxies plus the activator, pkg/autoscaler/metrics/collector.go, 1 s buckets) are
    averaged over the stable and the panic window; target value TV = target x utilization; desired = ceil(stable /
    TV), panic desired = ceil(panic / TV), both kept within [floor(ready / 2), ceil(1000 x ready)] (ready >= 1);
    panic starts when panic desired / ready >= 2 and lasts until a stable window passes below it; while panicking the
    count is the larger of the two and never goes down. Asking for zero keeps one replica until the grace period
    passes (pkg/reconciler/autoscaling/kpa/scaler.go). A new autoscaler over more than one pod starts in panic mode
    holding them (`newAutoscaler`), which is also this emulation's warm start."""
    target: float  # autoscaling.knative.dev/target: requests in flight per pod
    target_utilization: float = 0.7
    min_scale: int = 0
    max_scale: int = 100
    stable_window_s: float = 60.0
    panic_window_percentage: float = 10.0
    panic_threshold_percentage: float = 200.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_to_zero_grace_s: float = 30.0
    enable_scale_to_zero: bool = True
    sync_period_s: float = 2.0  # tick-interval
    name: str = "kpa"

    @property
    def setting(self) -> str:
        return f"target {self.target:g} x {self.target_utilization:g}, min {self.min_scale}"

    def initial_state(self, replicas: int = 0) -> KpaState:
        return KpaState(panic_time=0.0 if replicas > 1 else None, max_panic_pods=max(0, replicas))

    def recommend(self, snap: TargetSnapshot, state: KpaState) -> tuple[Recommendation, KpaState]:
        current = snap.replicas
        samples = snap.signals.concurrency_1s if snap.signals is not None else ()
        if not samples:
            return Recommendation(current, "NoData", "no concurrency reported yet", scale_down_blocked=True), state
        stable_n = max(1, round(self.stable_window_s))
        panic_n = max(1, round(self.stable_window_s * self.panic_window_percentage / 100))
        stable = sum(samples[-stable_n:]) / len(samples[-stable_n:])
        panic = sum(samples[-panic_n:]) / len(samples[-panic_n:])
        ready = snap.ready if snap.ready is not None else len(snap.pods - snap.pending_pods)
        ready_count = max(1.0, float(ready))
        tv = max(0.01, self.target * self.target_utilization)
        max_up = math.ceil(self.max_scale_up_rate * ready_count)
        max_down = math.floor(ready_count / self.max_scale_down_rate)
        dspc, dppc = math.ceil(stable / tv - 1e-9), math.ceil(panic / tv - 1e-9)
        want_stable = int(min(max(dspc, max_down), max_up))
        want_panic = int(min(max(dppc, max_down), max_up))
        over = dppc / ready_count >= self.panic_threshold_percentage / 100
        panic_time, max_panic = state.panic_time, state.max_panic_pods
        if over:
            panic_time = snap.now
        elif panic_time is not None and panic_time + self.stable_window_s < snap.now:
            panic_time, max_panic = None, 0
        desired = want_stable
        mode = "stable"
        if panic_time is not None:
            mode = "panic"
            desired = max(desired, want_panic)
            if desired > max_panic:
                max_panic = desired
            desired = max_panic
        why = (f"concurrency stable {stable:.1f} / panic {panic:.1f} over {ready} ready, target {tv:g} per pod: "
               f"{mode} mode -> {desired}")
        zero_since = state.zero_since
        bounded = _clamp(desired, self.min_scale, self.max_scale)
        if bounded == 0:
            if not self.enable_scale_to_zero:
                bounded = 1
            else:
                zero_since = snap.now if zero_since is None else zero_since
                if snap.now - zero_since < self.scale_to_zero_grace_s and current > 0:
                    bounded = 1
                    why += f"; one replica kept for the scale-to-zero grace period {self.scale_to_zero_grace_s:g}s"
        else:
            zero_since = None
        state = KpaState(panic_time, max_panic, zero_since)
        reason = "ScaleUp" if bounded > current else "ScaleDown" if bounded < current else "Steady"
        return Recommendation(bounded, reason, why), state


# ---- static ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StaticPolicy:
    replicas: int
    sync_period_s: float = 15.0
    name: str = "static"

    @property
    def setting(self) -> str:
        return f"{self.replicas} replicas"

    def initial_state(self, replicas: int = 0) -> None:
        return None

    def recommend(self, snap: TargetSnapshot, state: None) -> tuple[Recommendation, None]:
        return Recommendation(self.replicas, "Static", f"fixed at {self.replicas}"), None

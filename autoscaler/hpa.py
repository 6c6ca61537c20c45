"""The HorizontalPodAutoscaler's replica arithmetic, as kube-controller-manager does it (autoscaling/v2).

Reimplemented from kubernetes/kubernetes `pkg/controller/podautoscaler` (replica_calculator.go, horizontal.go) for two
uses: the `hpa` and `keda` policies of `gpuaas simulate autoscaling` emulate those systems with it, and our own
recommender starts from the same tolerance and rate-limit rules. Pure functions; time is an argument.

Defaults are kube-controller-manager's and `autoscaling/v2`'s: tolerance 0.1, sync period 15 s, scale-up stabilization
0 s with policies {4 pods, 100 %} per 15 s (selectPolicy Max), scale-down stabilization 300 s with {100 %} per 15 s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

TOLERANCE = 0.1
SYNC_PERIOD_S = 15.0


@dataclass(frozen=True)
class ScalingPolicy:
    type: Literal["Pods", "Percent"]
    value: int
    period_s: float


@dataclass(frozen=True)
class ScalingRules:
    stabilization_s: float
    policies: tuple[ScalingPolicy, ...]
    select: Literal["Max", "Min", "Disabled"] = "Max"


DEFAULT_SCALE_UP = ScalingRules(0.0, (ScalingPolicy("Pods", 4, 15.0), ScalingPolicy("Percent", 100, 15.0)))
DEFAULT_SCALE_DOWN = ScalingRules(300.0, (ScalingPolicy("Percent", 100, 15.0),))


@dataclass(frozen=True)
class Behavior:
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN


@dataclass(frozen=True)
class HpaState:
    """What the HPA controller remembers per target between syncs."""
    recommendations: tuple[tuple[float, int], ...] = ()  # (time, unstabilized recommendation)
    scale_up_events: tuple[tuple[float, int], ...] = ()  # (time, replicas added)
    scale_down_events: tuple[tuple[float, int], ...] = ()  # (time, replicas removed)


def within_tolerance(ratio: float, tolerance: float = TOLERANCE) -> bool:
    return abs(1.0 - ratio) <= tolerance


def pods_metric_replicas(current: int, values: dict[str, float], target: float, *, pods: frozenset[str],
                         pending: frozenset[str] = frozenset(), tolerance: float = TOLERANCE) -> int | None:
    """Replicas for a Pods metric with an AverageValue target (`calcPlainMetricReplicas`).

    `pods` are the target's pods (not deleted, not failed); `pending` of them are Pending (unready); pods with no value
    in `values` are missing. Missing pods count as the target on scale-down and 0 on scale-up; unready pods count as 0
    on scale-up. None when no ready pod reported (the HPA then keeps the current count and says so)."""
    metrics = {p: v for p, v in values.items() if p in pods and p not in pending}
    missing = [p for p in pods if p not in values and p not in pending]
    if not metrics:
        return None
    ready_count = len(metrics)
    ratio = sum(metrics.values()) / len(metrics) / target
    scale_up_with_unready = bool(pending) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        if within_tolerance(ratio, tolerance):
            return current
        return math.ceil(ratio * ready_count)
    if missing:
        fill = target if ratio < 1.0 else 0.0
        for p in missing:
            metrics[p] = fill
    if scale_up_with_unready:
        for p in pending:
            metrics[p] = 0.0
    new_ratio = sum(metrics.values()) / len(metrics) / target
    if within_tolerance(new_ratio, tolerance) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current
    new = math.ceil(new_ratio * len(metrics))
    if (new_ratio < 1.0 and new > current) or (new_ratio > 1.0 and new < current):
        return current
    return new


def external_average_replicas(total: float, target_per_pod: float, status_replicas: int,
                              tolerance: float = TOLERANCE) -> int:
    """Replicas for an External (or Object) metric with an AverageValue target (`GetExternalPerPodMetricReplicas`):
    ceil(total / target), unless total / (target * statusReplicas) is within tolerance of 1."""
    if status_replicas > 0 and within_tolerance(total / (target_per_pod * status_replicas), tolerance):
        return status_replicas
    return math.ceil(total / target_per_pod)


def _change_in_period(events: tuple[tuple[float, int], ...], now: float, period_s: float) -> int:
    return sum(n for t, n in events if t > now - period_s)


def scale_up_limit(current: int, state: HpaState, rules: ScalingRules, now: float) -> int:
    if rules.select == "Disabled":
        return current
    result = math.inf if rules.select == "Min" else -math.inf
    for p in rules.policies:
        start = (current - _change_in_period(state.scale_up_events, now, p.period_s)
                 + _change_in_period(state.scale_down_events, now, p.period_s))
        proposed = start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100))
        result = min(result, proposed) if rules.select == "Min" else max(result, proposed)
    return int(result)


def scale_down_limit(current: int, state: HpaState, rules: ScalingRules, now: float) -> int:
    if rules.select == "Disabled":
        return current
    result = -math.inf if rules.select == "Min" else math.inf
    for p in rules.policies:
        start = (current - _change_in_period(state.scale_up_events, now, p.period_s)
                 + _change_in_period(state.scale_down_events, now, p.period_s))
        proposed = start - p.value if p.type == "Pods" else int(start * (1 - p.value / 100))
        result = max(result, proposed) if rules.select == "Min" else min(result, proposed)
    return int(result)


@dataclass(frozen=True)
class Normalized:
    desired: int
    reason: str
    message: str
    state: HpaState = field(default_factory=HpaState)


def normalize(current: int, recommended: int, *, min_replicas: int, max_replicas: int, now: float,
              state: HpaState, behavior: Behavior = Behavior()) -> Normalized:
    """Stabilize a raw recommendation over the behavior windows and clamp it by the rate policies and min/max
    (`normalizeDesiredReplicasWithBehaviors`). The returned state records the raw recommendation and, when the count
    changes, the scale event."""
    up_cut = now - behavior.scale_up.stabilization_s
    down_cut = now - behavior.scale_down.stabilization_s
    up_rec = down_rec = recommended
    for t, rec in state.recommendations:
        if t > up_cut:
            up_rec = min(up_rec, rec)
        if t > down_cut:
            down_rec = max(down_rec, rec)
    stabilized = current
    reason, message = "ScaleUpStabilized" if up_rec < recommended else "ReadyForNewScale", "recommended size matches"
    if stabilized < up_rec:
        stabilized = up_rec
    if stabilized > down_rec:
        stabilized = down_rec
    if down_rec > recommended and stabilized > recommended:
        reason = "ScaleDownStabilized"
        message = "recent recommendations were higher than current one, applying the highest recent recommendation"
    keep = max(behavior.scale_up.stabilization_s, behavior.scale_down.stabilization_s)
    recs = tuple((t, r) for t, r in state.recommendations if t > now - keep) + ((now, recommended),)

    desired = stabilized
    if desired > current:
        limit = max(scale_up_limit(current, state, behavior.scale_up, now), current)
        allowed = min(max_replicas, limit)
        if desired > allowed:
            reason = "TooManyReplicas" if allowed == max_replicas else "ScaleUpLimit"
            bound = "maximum" if allowed == max_replicas else "rate limit"
            message = f"the desired replica count is more than the {bound}"
            desired = allowed
    elif desired < current:
        limit = min(scale_down_limit(current, state, behavior.scale_down, now), current)
        allowed = max(min_replicas, limit)
        if desired < allowed:
            reason = "TooFewReplicas" if allowed == min_replicas else "ScaleDownLimit"
            bound = "minimum" if allowed == min_replicas else "rate limit"
            message = f"the desired replica count is less than the {bound}"
            desired = allowed
    desired = max(min_replicas, min(desired, max_replicas))  # a count outside [min, max] is brought inside first

    horizon = max([p.period_s for p in behavior.scale_up.policies + behavior.scale_down.policies] + [0.0])
    ups = tuple(e for e in state.scale_up_events if e[0] > now - horizon)
    downs = tuple(e for e in state.scale_down_events if e[0] > now - horizon)
    if desired > current:
        ups += ((now, desired - current),)
    elif desired < current:
        downs += ((now, current - desired),)
    return Normalized(desired, reason, message, HpaState(recs, ups, downs))

"""What a replica recommender sees: one snapshot of a scale target and its metrics, taken at one instant.

The controller builds it from Kubernetes and Prometheus; the simulator builds it from simulated replicas and simulated
scrapes. Recommenders are pure functions of a snapshot and their own previous state (see `policy.py`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeGuard


@dataclass(frozen=True)
class Signals:
    """Metrics of one scale target, as Prometheus answered. `None` means the query returned nothing usable."""
    queue_per_pod: dict[str, float] = field(default_factory=dict)  # requests waiting, per pod that reported
    gateway_waiting: float = 0.0  # requests held in front of the target while no replica serves
    arrival_rate: float | None = None  # requests/s received, over the long rate window (1m)
    arrival_rate_short: float | None = None  # requests/s received, over the short window (30s)
    service_time: float | None = None  # mean seconds a request runs, over the service-time window
    running: float | None = None  # requests running now, summed over pods
    running_per_pod: dict[str, float] = field(default_factory=dict)  # requests running, per pod that reported
    # Average requests in flight (running + waiting on the pods + held at the gateway) in each of the last seconds,
    # oldest first: what Knative's queue-proxies and activator report to its autoscaler every second. Only the
    # simulator fills it (for the kpa emulation); the controller reads Prometheus.
    concurrency_1s: tuple[float, ...] = ()

    @property
    def inflight_per_pod(self) -> dict[str, float]:
        """Requests running plus waiting, per pod that reported its queue (vLLM's num_requests_running +
        num_requests_waiting): the metric users of vLLM give an HPA or KEDA."""
        return {p: q + self.running_per_pod.get(p, 0.0) for p, q in self.queue_per_pod.items()}

    @property
    def total_queue(self) -> float:
        return sum(self.queue_per_pod.values()) + self.gateway_waiting


@dataclass(frozen=True)
class TargetSnapshot:
    now: float  # seconds (the controller's clock or simulated time)
    replicas: int  # the target's desired replica count now (scale subresource spec.replicas)
    pods: frozenset[str]  # the target's pods that exist and are not being deleted
    pending_pods: frozenset[str] = frozenset()  # of those, pods not yet running (HPA: "unready")
    signals: Signals | None = None
    error: str | None = None  # why `signals` is missing or partial (Prometheus down, timeout, NaN, empty answer)
    ready: int | None = None  # of `pods`, those Ready now (endpoints that take requests), when known

    @property
    def missing_pods(self) -> frozenset[str]:
        """Running pods that reported no queue depth (starting, or their series is gone)."""
        reported = set(self.signals.queue_per_pod) if self.signals else set()
        return frozenset(p for p in self.pods if p not in reported and p not in self.pending_pods)


def finite(x: float | None) -> TypeGuard[float]:
    return x is not None and not math.isnan(x) and not math.isinf(x)


@dataclass(frozen=True)
class Recommendation:
    """A recommendation: the replica count to set, and why, in words an operator reads in an event."""
    desired: int
    reason: str  # short CamelCase reason (event reason / condition reason)
    message: str
    scale_down_blocked: bool = False  # True when data was missing and a scale-down was refused for that
    limited: str | None = None  # "TooManyReplicas" / "TooFewReplicas" when min/max changed the recommendation

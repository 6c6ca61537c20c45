"""The replica autoscaler's own metrics (/metrics of `gpuaas autoscaler`): who leads, and the idle GPUs it found."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from .idle import IdleMetrics


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.leader = Gauge("gpuaas_autoscaler_leader", "1 while this replica holds the lease", registry=r)
        self.idle = IdleMetrics(r)

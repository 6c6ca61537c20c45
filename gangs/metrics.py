"""Prometheus metrics of the gang controller."""
from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from .controller import Report


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.waiting = Gauge("gpuaas_gangs_waiting", "Gangs waiting to be placed (members missing, another gate, no "
                             "room)", registry=self.registry)
        self.released = Counter("gpuaas_gangs_released_total", "Gangs pinned and released whole",
                                registry=self.registry)
        self.reset = Counter("gpuaas_gangs_reset_total", "Gangs whose released members did not bind in time, reset",
                             registry=self.registry)
        self.failed_writes = Counter("gpuaas_gangs_failed_writes_total", "Pins, gate removals and deletions refused "
                                     "because the pod changed or went", registry=self.registry)
        self.reconcile = Histogram("gpuaas_gangs_reconcile_seconds", "Time to plan the waiting gangs and write the "
                                   "decisions", registry=self.registry,
                                   buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.leader = Gauge("gpuaas_gangs_leader", "1 while this replica holds the lease", registry=self.registry)

    def observe(self, report: Report) -> None:
        self.waiting.set(len(report.waiting))
        self.released.inc(len(report.released))
        self.reset.inc(len(report.reset))
        self.failed_writes.inc(report.failed_writes)

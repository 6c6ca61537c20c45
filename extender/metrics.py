"""Prometheus metrics of the extender, on a registry of its own (several apps can live in one test process)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Filter and prioritize run inside kube-scheduler's cycle: the interesting range is tens of microseconds to ~100 ms.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram("gpuaas_extender_request_duration_seconds", "Time to answer one request, by verb",
                                 ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.decisions = Counter("gpuaas_extender_decisions_total", "Node verdicts and bindings, by verb and outcome",
                                 ["verb", "outcome"], registry=self.registry)
        self.errors = Counter("gpuaas_extender_errors_total", "Requests answered with an error, by verb and HTTP code",
                              ["verb", "code"], registry=self.registry)
        self.cache = Gauge("gpuaas_extender_cache_objects", "Objects in the extender's cluster view, by kind",
                           ["kind"], registry=self.registry)
        self.queue_plan = Histogram("gpuaas_extender_queue_plan_seconds", "Time to plan the pending GPU pods "
                                    "jointly", buckets=LATENCY_BUCKETS, registry=self.registry)
        self._decisions: dict[tuple[str, str], Counter] = {}
        self.rebuilds = Gauge("gpuaas_extender_model_rebuilds", "Times the model was rebuilt after node changes",
                              registry=self.registry)

    def decision(self, verb: str, outcome: str) -> Counter:
        """The decisions counter of (verb, outcome), looked up once: `labels()` costs a lock and a tuple per call, and
        filter, prioritize and bind count several outcomes per pod."""
        child = self._decisions.get((verb, outcome))
        if child is None:
            child = self._decisions[(verb, outcome)] = self.decisions.labels(verb, outcome)
        return child

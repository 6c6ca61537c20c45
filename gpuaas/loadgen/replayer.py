"""The load replayer: drives `ServingSystem` by the wall clock against the pods of a real Deployment and exports, per
pod, what a vLLM server would, for a real Prometheus to scrape.

Every `poll_s` it lists the Deployment's pods: a pod that appears becomes a replica (serving `cold_start_s` later), a
pod that is deleted or finished stops taking requests (its running ones finish). `/metrics` on 127.0.0.1:`port`
serves, with `namespace` and `pod` labels (scrape with honor_labels):

    vllm:num_requests_waiting, vllm:num_requests_running                  gauges, per serving pod
    vllm:request_success_total, gpuaas_requests_received_total            counters, per pod
    vllm:request_inference_time_seconds_sum / _count                      seconds serving finished requests, per pod
    gpuaas_gateway_requests_total{deployment}, gpuaas_gateway_requests_waiting{deployment}   the gateway in front

A pod still starting exports nothing, like a vLLM server loading its model.

The replayer also keeps, per pod, when it first listed it, when it saw it bound to a node and when it saw it Running
(`pod_times`, on its clock): with the replicas' serving and gone times (`replica_times`), when each replica the
Deployment was asked for actually served, which `gpuaas demo` sets against the simulator's cold-start model.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .endpoint import MetricsEndpoint
from .serving import ServiceModel, ServingSystem
from .trace import Arrival

log = logging.getLogger("gpuaas.loadgen")


def render_metrics(system: ServingSystem, namespace: str, deployment: str) -> str:
    """The Prometheus text exposition of one ServingSystem."""
    rows: dict[str, list[str]] = {}

    def add(name: str, labels: str, value: float) -> None:
        rows.setdefault(name, []).append(f"{name}{{{labels}}} {value:.6g}" if isinstance(value, float)
                                         else f"{name}{{{labels}}} {value}")

    for pod, m in sorted(system.replica_metrics().items()):
        labels = f'namespace="{namespace}",pod="{pod}"'
        add("vllm:num_requests_waiting", labels, m.waiting)
        add("vllm:num_requests_running", labels, m.running)
        add("vllm:request_success_total", labels, m.finished_total)
        add("gpuaas_requests_received_total", labels, m.received_total)
        add("vllm:request_inference_time_seconds_sum", labels, float(m.service_seconds_total))
        add("vllm:request_inference_time_seconds_count", labels, m.finished_total)
    gw = f'namespace="{namespace}",deployment="{deployment}"'
    add("gpuaas_gateway_requests_total", gw, system.arrived_total())
    add("gpuaas_gateway_requests_waiting", gw, system.gateway_waiting())
    types = {"vllm:num_requests_waiting": "gauge", "vllm:num_requests_running": "gauge",
             "vllm:request_success_total": "counter", "gpuaas_requests_received_total": "counter",
             "vllm:request_inference_time_seconds_sum": "untyped",
             "vllm:request_inference_time_seconds_count": "untyped",
             "gpuaas_gateway_requests_total": "counter", "gpuaas_gateway_requests_waiting": "gauge"}
    out = []
    for name, lines in rows.items():
        out.append(f"# TYPE {name} {types[name]}")
        out.extend(lines)
    return "\n".join(out) + "\n"


@dataclass
class PodTimes:
    """When the replayer first saw one pod listed, bound to a node, and Running (its clock; None: not seen)."""
    listed: float
    bound: float | None = None
    running: float | None = None
    gone: float | None = None  # the replayer stopped routing to it (deleted, or not Running any more)


@dataclass(frozen=True)
class ReplicaTimes:
    """One pod of the Deployment, on the replayer's clock: listed (about when the ReplicaSet created it), bound,
    serving (its cold start over), gone (no longer routed to: deleted or not Running); None where it did not happen."""
    pod: str
    listed: float
    bound: float | None
    serving: float | None
    gone: float | None


class Replayer:
    def __init__(self, api, namespace: str, deployment: str, arrivals: list[Arrival], *,
                 model: ServiceModel = ServiceModel(), selector: str | None = None, port: int = 0,
                 poll_s: float = 0.5, clock: Callable[[], float] = time.monotonic):
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.namespace, self.deployment = namespace, deployment
        self.selector = selector or f"app={deployment}"
        self.system = ServingSystem(model, arrivals)
        self.poll_s = poll_s
        self.clock = clock
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.t0: float | None = None
        self.pod_times: dict[str, PodTimes] = {}
        self.endpoint = MetricsEndpoint(self._render, name="replayer", port=port)

    @property
    def port(self) -> int:
        return self.endpoint.port

    def _render(self) -> str:
        with self.lock:
            return render_metrics(self.system, self.namespace, self.deployment)

    def now(self) -> float:
        assert self.t0 is not None
        return self.clock() - self.t0

    def sync_pods(self, cold_start_s: float | None = None) -> None:
        """Follow the Deployment's pods; a new one serves after `cold_start_s` (default: the model's)."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector).items
        live = {p.metadata.name for p in pods if p.metadata.deletion_timestamp is None
                and p.status.phase == "Running"}
        with self.lock:
            t = self.now()
            for p in pods:
                seen = self.pod_times.setdefault(p.metadata.name, PodTimes(listed=t))
                if seen.bound is None and p.spec.node_name:
                    seen.bound = t
                if seen.running is None and p.metadata.name in live:
                    seen.running = t
            self.system.advance(t)
            for r in list(self.system.replicas.values()):
                if r.gone_at is None and not r.draining and r.name not in live:
                    self.system.remove_replica(r.name, t)
                    if r.name in self.pod_times:
                        self.pod_times[r.name].gone = t
            for name in live:
                if self.system.replicas.get(name) is None:
                    self.system.add_replica(name, t, cold_start_s)

    def replica_times(self) -> list[ReplicaTimes]:
        """Every pod the replayer saw, in the order it first listed them, with when it served and was gone."""
        with self.lock:
            out = []
            for name, seen in sorted(self.pod_times.items(), key=lambda kv: (kv[1].listed, kv[0])):
                r = self.system.replicas.get(name)
                serving = r.ready_at if r is not None and r.serving else None  # `serving` stays set once served
                out.append(ReplicaTimes(name, seen.listed, seen.bound, serving, seen.gone))
            return out

    def step(self) -> None:
        with self.lock:
            self.system.advance(self.now())

    def _drive(self) -> None:
        next_poll = 0.0
        while not self.stop_event.is_set():
            try:
                if self.clock() >= next_poll:
                    self.sync_pods()
                    next_poll = self.clock() + self.poll_s
                self.step()
            except Exception as exc:  # the API may blip; keep replaying
                log.warning("replayer: %s", exc)
            self.stop_event.wait(0.05)

    def start(self, *, warm: bool = False) -> Replayer:
        """Start the trace's clock. `warm`: the pods running now serve at once (a service already up when the trace
        begins), instead of after a cold start."""
        self.t0 = self.clock()
        self.sync_pods(cold_start_s=0.0 if warm else None)
        self.endpoint.start(self._drive)
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.endpoint.stop()

    def __enter__(self) -> Replayer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

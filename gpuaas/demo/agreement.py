"""The demo's SLO attainment per inference service beside what `gpuaas simulate autoscaling` gives for the same trace
window and policy, and the warm start both share.

The simulator's run is the one the command prints for

    gpuaas simulate autoscaling --trace T --policy ours --rate-scale K --offset O --duration D*speed --preroll 0 \\
        --fresh-memory --min-replicas MIN --max-replicas MAX

in trace time: the window the service replays, its first minute's need serving at t = 0 (`warm_start_replicas`), ours
with the demo's bounds and no memory (a controller started with the run, as the demo's is). The demo starts each
Deployment with that many replicas, serving when the trace starts. What still differs, and is the demo's doing, not
the policy's: Kubernetes adds to each cold start (scheduling, kwok, the replayer's 0.5 s poll), a replica the fleet has
no GPU for waits for the node scaler, Prometheus scrapes and the controller's syncs drift on a loaded machine, and the
demo counts requests until its load stops (a request still waiting then counts as missed once it has waited longer
than the SLO; the simulator runs until every request started).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.policy import QueueDepthConfig, QueueDepthPolicy

from ..loadgen.serving import ServiceModel
from ..loadgen.trace import Arrival, scale_rate, window
from ..simulate.autoscaling import simulate
from ..simulate.autoscaling_oracle import warm_start_replicas
from .timeline import InferenceService


def trace_window(trace: list[Arrival], svc: InferenceService, *, speed: float, duration_s: float) -> list[Arrival]:
    """The arrivals `svc` replays, in trace time (the simulator's `window` then `scale_rate`)."""
    return scale_rate(window(trace, svc.offset_s, duration_s * speed), svc.rate_scale)


def initial_replicas(trace: list[Arrival], svc: InferenceService, *, speed: float, duration_s: float) -> int:
    """What the first minute of the service's window needs (the simulator's warm start), within its bounds."""
    need = warm_start_replicas(trace_window(trace, svc, speed=speed, duration_s=duration_s), ServiceModel())
    return max(svc.min_replicas, min(svc.max_replicas, need))


@dataclass(frozen=True)
class Simulated:
    slo_attainment: float
    requests: int
    initial_replicas: int
    gpu_replica_hours: float
    command: str


def simulated(trace: list[Arrival], svc: InferenceService, *, speed: float, duration_s: float,
              trace_path: str = "TRACE") -> Simulated:
    """ours on the service's window, as `gpuaas simulate autoscaling ... --preroll 0 --fresh-memory` runs it."""
    arrivals = trace_window(trace, svc, speed=speed, duration_s=duration_s)
    model = ServiceModel()
    policy = QueueDepthPolicy(QueueDepthConfig(min_replicas=svc.min_replicas, max_replicas=svc.max_replicas,
                                               concurrency=model.concurrency, cold_start_s=model.cold_start_s))
    initial = initial_replicas(trace, svc, speed=speed, duration_s=duration_s)
    r = simulate(arrivals, policy, model, initial_replicas=initial, warm=False)
    command = (f"gpuaas simulate autoscaling --trace {trace_path} --policy ours --rate-scale {svc.rate_scale} "
               f"--offset {svc.offset_s:g} --duration {duration_s * speed:g} --preroll 0 --fresh-memory "
               f"--min-replicas {svc.min_replicas} --max-replicas {svc.max_replicas} --json -")
    return Simulated(r.slo_attainment, r.requests, initial, r.gpu_replica_hours, command)


def demo_slo(arrival_t: list[float], start_t: list[float], now: float, slo_s: float) -> tuple[int, int]:
    """(requests within the SLO, requests counted) of a replayer at `now` (its clock): every request that started,
    and those still waiting that have waited longer than `slo_s` already (missed whatever happens next)."""
    met = total = 0
    for a, s in zip(arrival_t, start_t, strict=False):
        if math.isnan(s):
            if now - a > slo_s:
                total += 1
            continue
        total += 1
        met += (s - a) <= slo_s + 1e-9
    return met, total


WHY = ("the demo's new replicas serve later than the simulator's: Kubernetes adds scheduling and kwok's start to each "
       "60 s cold start, and a replica the fleet has no GPU for waits Pending until the node scaler's node advertises "
       "its GPUs (10 s, 100 s of trace time at speed 10); the simulator has no GPU limit (docs/demo.md, 'SLO "
       "attainment: the demo against the simulator')")

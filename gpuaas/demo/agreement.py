"""The demo's SLO attainment per inference service beside what `gpuaas simulate autoscaling` gives for the same trace
window and policy, the warm start both share, and the measurements that say why they differ.

The simulator's run is the one the command prints for

    gpuaas simulate autoscaling --trace T --policy ours --rate-scale K --offset O --duration D*speed --preroll 0 \\
        --fresh-memory --min-replicas MIN --max-replicas MAX [--rate-windows R,S,V]

in trace time: the window the service replays, its first minute's need serving at t = 0 (`warm_start_replicas`), ours
with the demo's bounds and rate windows (`--rate-windows` when the demo's scrape interval stretches them) and no memory
(a controller started with the run, as the demo's is). The demo starts each Deployment with that many replicas,
serving when the trace starts.

What a single simulated number cannot hold, measured per run instead:

- phases: a real Prometheus and controller are in no particular phase with the trace or with each other; the range of
  the simulator over a grid of scrape and sync phases (`PHASES`) is what the demo may give for the same policy;
- the demo's replicas replayed (`replayed`): the serving model driven by the replica pods the demo had, when they
  served and when they went; equal to the demo's number when the demo's serving and counting are the simulator's;
- the demo's GPUs (`on_demo_gpus`): the simulator with the GPUs the demo's cluster left the service (its pods' GPUs plus
  the whole GPUs free, per sample) and what Kubernetes added to each cold start, at the default phase and over the
  phases; apart from the simulated number by what waiting for GPUs costs.

The demo counts requests until its load stops (a request still waiting then counts as missed once it has waited longer
than the SLO); the simulator runs until every request started.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from autoscaler.policy import QueueDepthConfig, QueueDepthPolicy

from ..loadgen.serving import ServiceModel, ServingSystem
from ..loadgen.trace import Arrival, scale_rate, window
from ..simulate.autoscaling import GpuLimit, RateWindows, simulate
from ..simulate.autoscaling_oracle import warm_start_replicas
from .sampling import go_duration
from .timeline import InferenceService, autoscaler_timing

# (first scrape, first sync after it) as fractions of the scrape interval: the default phase (0, 1/2), then a grid of
# 8 scrape phases x 4 sync phases
PHASES = ((0.0, 0.5),) + tuple((a / 8, (b + 0.5) / 4) for a in range(8) for b in range(4))
FAR_POINTS = 3.0  # the demo and the simulator agree within this many points of SLO attainment


def trace_window(trace: list[Arrival], svc: InferenceService, *, speed: float, duration_s: float) -> list[Arrival]:
    """The arrivals `svc` replays, in trace time (the simulator's `window` then `scale_rate`)."""
    return scale_rate(window(trace, svc.offset_s, duration_s * speed), svc.rate_scale)


def initial_replicas(trace: list[Arrival], svc: InferenceService, *, speed: float, duration_s: float) -> int:
    """What the first minute of the service's window needs (the simulator's warm start), within its bounds."""
    need = warm_start_replicas(trace_window(trace, svc, speed=speed, duration_s=duration_s), ServiceModel())
    return max(svc.min_replicas, min(svc.max_replicas, need))


def demo_windows(speed: float) -> RateWindows:
    """The rate windows the demo's autoscaler runs with, in trace seconds (stretched to span 2.5 scrapes)."""
    w = autoscaler_timing(speed)["windows"]
    return RateWindows(rate=go_duration(w["rate_window"]) * speed,
                       short_rate=go_duration(w["short_rate_window"]) * speed,
                       service=go_duration(w["service_window"]) * speed)


def _policy(svc: InferenceService, model: ServiceModel) -> QueueDepthPolicy:
    return QueueDepthPolicy(QueueDepthConfig(min_replicas=svc.min_replicas, max_replicas=svc.max_replicas,
                                             concurrency=model.concurrency, cold_start_s=model.cold_start_s))


@dataclass(frozen=True)
class Simulated:
    slo_attainment: float  # at the default phase: what the command prints
    requests: int
    initial_replicas: int
    gpu_replica_hours: float
    command: str
    low: float  # the lowest and highest SLO attainment over PHASES
    high: float


def simulated(trace: list[Arrival], svc: InferenceService, *, speed: float, duration_s: float,
              trace_path: str = "TRACE") -> Simulated:
    """ours on the service's window, as `gpuaas simulate autoscaling ... --preroll 0 --fresh-memory` runs it, with
    the demo's rate windows; and its range over the scrape and sync phases of PHASES."""
    arrivals = trace_window(trace, svc, speed=speed, duration_s=duration_s)
    model = ServiceModel()
    windows = demo_windows(speed)
    initial = initial_replicas(trace, svc, speed=speed, duration_s=duration_s)
    runs = [simulate(arrivals, _policy(svc, model), model, initial_replicas=initial, warm=False, windows=windows,
                     scrape_offset_s=a * model.scrape_interval_s, sync_offset_s=b * model.scrape_interval_s)
            for a, b in PHASES]
    r = runs[0]
    flag = "" if windows == RateWindows() else \
        f" --rate-windows {windows.rate:g},{windows.short_rate:g},{windows.service:g}"
    command = (f"gpuaas simulate autoscaling --trace {trace_path} --policy ours --rate-scale {svc.rate_scale} "
               f"--offset {svc.offset_s:g} --duration {duration_s * speed:g} --preroll 0 --fresh-memory "
               f"--min-replicas {svc.min_replicas} --max-replicas {svc.max_replicas}{flag} --json -")
    slo = [x.slo_attainment for x in runs]
    return Simulated(r.slo_attainment, r.requests, initial, r.gpu_replica_hours, command, min(slo), max(slo))


class ReplicaSeen(Protocol):
    """One replica pod as the demo's replayer saw it, wall seconds since the run's start (report.ReplicaRecord)."""
    @property
    def listed_s(self) -> float: ...
    @property
    def bound_s(self) -> float | None: ...
    @property
    def serving_s(self) -> float | None: ...
    @property
    def gone_s(self) -> float | None: ...


def replayed(trace: list[Arrival], svc: InferenceService, replicas: Sequence[ReplicaSeen], *, speed: float,
             duration_s: float, slo_s: float) -> float:
    """The share of the service's requests within the SLO when the simulator's serving model is driven by the demo's
    own replicas: each pod a replica from when it was listed, serving when the demo's served, gone when the demo's
    went; counted as the demo counts at the end of its load."""
    system = ServingSystem(ServiceModel(), trace_window(trace, svc, speed=speed, duration_s=duration_s))
    events = []
    for i, r in enumerate(replicas):
        cold = (r.serving_s - r.listed_s) * speed if r.serving_s is not None else math.inf
        events.append((r.listed_s * speed, 0, i, cold))
        if r.gone_s is not None:
            events.append((r.gone_s * speed, 1, i, 0.0))
    for t, kind, i, cold in sorted(events):
        system.advance(t)
        if kind == 0:
            system.add_replica(f"r{i}", t, cold_start_s=cold)
        else:
            system.remove_replica(f"r{i}", t)
    end = duration_s * speed
    system.advance(end)
    met, total = demo_slo(system.arrival_t, system.start_t, end, slo_s)
    return met / total if total else 1.0


def start_delay_s(replicas: Sequence[ReplicaSeen], *, speed: float) -> float:
    """What Kubernetes added to the cold start of the demo's new replicas, in trace seconds: the median, over the pods
    that served after a cold start (not the warm ones), of the time from being bound to serving, less the cold start
    (kwok starting the pod, the replayer's poll; waiting for a GPU comes before binding, the GPU limit's to model)."""
    cold = ServiceModel().cold_start_s / speed
    after = [r.serving_s - r.bound_s - cold for r in replicas
             if r.bound_s is not None and r.serving_s is not None and r.serving_s - r.listed_s >= cold - 1e-6]
    return max(0.0, statistics.median(after) * speed) if after else 0.0


@dataclass(frozen=True)
class OnDemoGpus:
    slo_attainment: float  # at the default phase
    low: float  # over PHASES
    high: float


def on_demo_gpus(trace: list[Arrival], svc: InferenceService, gpus: Sequence[tuple[float, int]],
                 replicas: Sequence[ReplicaSeen], *, speed: float, duration_s: float) -> OnDemoGpus:
    """ours on the service's window (as `simulated`, at each of PHASES), its replicas limited to the GPUs the demo's
    cluster left it (`gpus`: per sample, wall seconds and the GPUs its pods held plus the whole GPUs free) and each
    new one's cold start lengthened by what Kubernetes added in the demo (`start_delay_s`)."""
    if not gpus:
        raise ValueError(f"{svc.name}: no GPU samples to limit the simulator with")
    model = ServiceModel()
    limit = GpuLimit(tuple((t * speed, n) for t, n in gpus))
    arrivals = trace_window(trace, svc, speed=speed, duration_s=duration_s)
    initial = initial_replicas(trace, svc, speed=speed, duration_s=duration_s)
    delay = start_delay_s(replicas, speed=speed)
    slo = [simulate(arrivals, _policy(svc, model), model, initial_replicas=initial, warm=False,
                    windows=demo_windows(speed), gpus=limit, start_delay_s=delay,
                    scrape_offset_s=a * model.scrape_interval_s, sync_offset_s=b * model.scrape_interval_s
                    ).slo_attainment for a, b in PHASES]
    return OnDemoGpus(slo[0], min(slo), max(slo))


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


def explain(demo: float, simulated: float, low: float, high: float, replayed_slo: float | None,
            gpus: OnDemoGpus | None) -> str:
    """Why the demo's number is where it is against the simulator's, in the terms of the measurements above (all
    fractions). Empty when they are within FAR_POINTS."""
    gap = 100 * (demo - simulated)
    if abs(gap) <= FAR_POINTS:
        return ""

    def holds(lo: float, hi: float) -> bool:
        return lo - 1e-9 <= demo <= hi + 1e-9

    parts = []
    if replayed_slo is not None:
        off = 100 * (demo - replayed_slo)
        parts.append(f"the simulator's serving model on the demo's own replicas gives {100 * replayed_slo:.2f}% "
                     + ("(the same serving and counting: the gap is in when replicas were asked for and served)"
                        if abs(off) <= 0.5 else f"({off:+.2f} points from the demo: its serving or counting differ)"))
    parts.append(f"over scrape and controller phases the simulator gives {100 * low:.2f}-{100 * high:.2f}%"
                 + (", which holds the demo's number: the phases of its Prometheus and controller"
                    if holds(low, high) else ""))
    if gpus is not None:
        parts.append(f"limited to the GPUs the demo's cluster left it, {100 * gpus.slo_attainment:.2f}% "
                     f"({100 * (gpus.slo_attainment - simulated):+.2f} points for waiting for GPUs), "
                     f"{100 * gpus.low:.2f}-{100 * gpus.high:.2f}% over the phases"
                     + (", which holds the demo's number: the phases and the GPUs" if holds(gpus.low, gpus.high)
                        and not holds(low, high) else ""))
    return f"{gap:+.2f} points: " + "; ".join(parts)

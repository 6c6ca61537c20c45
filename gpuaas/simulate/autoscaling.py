"""Replaying a request trace in simulated time through a replica recommender.

The loop is what runs in a cluster, with simulated parts: `ServingSystem` plays the replicas
(gpuaas/loadgen/serving.py), `ScrapeLog` plays Prometheus (a scrape every `scrape_interval_s`; queries see only
scraped samples, so the recommender sees the same staleness it sees in production), and the recommender is the
production code from `autoscaler/policy.py` called every `sync_period_s` of its policy. Scrapes happen at multiples
of the scrape interval; syncs half a scrape interval later (a controller is not in phase with Prometheus; the phases
can be moved, `scrape_offset_s` and `sync_offset_s`). rate() is Prometheus's (`prometheus_rate`): where the samples
cover the window it is their slope, at a series' start it extrapolates as Prometheus does, and with fewer than two
samples there is no rate (the controller holds, as on an empty answer). Every
second the loop also records the average requests in flight over that second (running, waiting on a replica or at the
gateway), as Knative's queue-proxies and activator report them to its autoscaler (the kpa emulation reads them; nothing
else does).

A warm start (`warm=True`): the run begins with `initial_replicas` serving replicas (`warm_start_replicas`: what the
first minute needs) and the policy's memory as if it had held them up to then (`ReplicaPolicy.initial_state(replicas)`).
`gpuaas simulate autoscaling` and the benchmark also give every policy a pre-roll (`gpuaas.loadgen.trace.window`): the
run begins 15 minutes before t = 0 on the 15 minutes of the trace that precede it (wrapping around), and `warmup_s`
leaves those requests and that GPU time out, so that each policy meets t = 0 as a service that has been running does,
and every request from t = 0 on counts.

GPUs (`gpus`, optional): a step function of the GPUs the service may hold, as a cluster whose other tenants hold the
rest. A replica asked for beyond it waits Pending, holding no GPU, until one is free (oldest first; a scale-down drops
Pending replicas first, as a ReplicaSet deletes its unscheduled pods first), then starts its cold start. `start_delay_s`
adds to every new replica's cold start what the platform adds to the serving model's (scheduling, starting the pod).
Without them every replica starts its cold start when asked for: the published runs.

GPU-replica-hours integrate every replica from the moment it is asked for (holds a GPU, with `gpus`) until it is gone,
over the trace's span (first to last arrival). After the last arrival the loop keeps running until every request has
started, so that each request's queue wait is known.
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.policy import ReplicaPolicy
from autoscaler.snapshot import Signals, TargetSnapshot
from gpuaas.loadgen.serving import ReplicaMetrics, ServiceModel, ServingSystem
from gpuaas.loadgen.trace import Arrival

RATE_WINDOW_S = 60.0  # rate(...[1m])
SHORT_RATE_WINDOW_S = 30.0  # rate(...[30s])
SERVICE_WINDOW_S = 120.0  # rate(sum[2m]) / rate(count[2m])


@dataclass(frozen=True)
class RateWindows:
    """The controller's rate windows (autoscaler/config.py `windows`), in seconds."""
    rate: float = RATE_WINDOW_S
    short_rate: float = SHORT_RATE_WINDOW_S
    service: float = SERVICE_WINDOW_S

    def __post_init__(self) -> None:
        for name in ("rate", "short_rate", "service"):
            if not getattr(self, name) > 0:
                raise ValueError(f"rate window {name} must be > 0 seconds, got {getattr(self, name):g}")
CONCURRENCY_HISTORY = 60  # per-second in-flight averages kept (Knative's stable window)


def prometheus_rate(times: Sequence[float], values: Sequence[float], now: float, width: float) -> float | None:
    """rate(counter[width]) at `now` as Prometheus computes it from the samples of one series inside the window
    (promql/functions.go `extrapolatedRate`): the increase between the first and last sample (a drop is a counter
    reset), extrapolated towards each end of the window by at most half the average interval between samples unless
    the gap to that end is under 1.1 intervals (and, at the start, not below the counter's zero), divided by the
    window. None with fewer than two samples: Prometheus returns nothing then. Where the samples cover the window, as
    scrapes every interval do, this is (last - first) / (t_last - t_first); it differs for a series younger than the
    window, such as the gateway's counter at the start of a run."""
    if len(times) < 2:
        return None
    increase = values[-1] - values[0]
    for prev, cur in itertools.pairwise(values):
        if cur < prev:
            increase += prev
    sampled = times[-1] - times[0]
    if sampled <= 0:
        return None
    average = sampled / (len(times) - 1)
    to_start, to_end = times[0] - (now - width), now - times[-1]
    if increase > 0 and values[0] >= 0:
        to_start = min(to_start, sampled * values[0] / increase)
    threshold = 1.1 * average
    extrapolated = sampled + (to_start if to_start < threshold else average / 2) \
        + (to_end if to_end < threshold else average / 2)
    return increase * extrapolated / sampled / width


@dataclass
class ScrapeLog:
    """Scraped samples: time -> (metrics per replica, requests waiting at the gateway). Answers the queries the
    controller sends to Prometheus, computed the same way: instant vectors from the latest scrape (a series missing from
    it is stale), rate() as `prometheus_rate` over the samples of each series inside the window, nothing (None) where
    no series has two samples in it."""
    times: list[float] = field(default_factory=list)
    samples: list[dict[str, ReplicaMetrics]] = field(default_factory=list)
    gateway: list[int] = field(default_factory=list)
    arrived: list[int] = field(default_factory=list)
    windows: RateWindows = RateWindows()

    def scrape(self, t: float, metrics: dict[str, ReplicaMetrics], gateway_waiting: int, arrived_total: int) -> None:
        self.times.append(t)
        self.samples.append(metrics)
        self.gateway.append(gateway_waiting)
        self.arrived.append(arrived_total)

    def _gateway_rate(self, now: float, width: float) -> float | None:
        idx = self._window(now, width)
        return prometheus_rate([self.times[i] for i in idx], [self.arrived[i] for i in idx], now, width)

    def _window(self, now: float, width: float) -> range:
        hi = bisect.bisect_right(self.times, now)
        lo = bisect.bisect_right(self.times, now - width)
        return range(lo, hi)

    def _rate(self, now: float, width: float, value: Callable[[ReplicaMetrics], float]) -> float | None:
        series: dict[str, tuple[list[float], list[float]]] = {}
        for i in self._window(now, width):
            for name, m in self.samples[i].items():
                times, values = series.setdefault(name, ([], []))
                times.append(self.times[i])
                values.append(value(m))
        rates = [r for times, values in series.values()
                 if (r := prometheus_rate(times, values, now, width)) is not None]
        return sum(rates) if rates else None  # sum(rate(...)): nothing when no series has a rate

    def signals(self, now: float) -> Signals | None:
        i = bisect.bisect_right(self.times, now) - 1
        if i < 0:
            return None
        latest = self.samples[i]
        w = self.windows
        served = self._rate(now, w.service, lambda m: m.service_seconds_total)
        finished = self._rate(now, w.service, lambda m: m.finished_total)
        return Signals(
            queue_per_pod={n: float(m.waiting) for n, m in latest.items()},
            running_per_pod={n: float(m.running) for n, m in latest.items()},
            gateway_waiting=float(self.gateway[i]),
            arrival_rate=self._gateway_rate(now, w.rate),
            arrival_rate_short=self._gateway_rate(now, w.short_rate),
            service_time=served / finished if served is not None and finished else None,
            running=float(sum(m.running for m in latest.values())),
        )


@dataclass
class Result:
    policy: str
    target: float | None
    setting: str
    requests: int
    slo_attainment: float
    p99_queue_wait_s: float
    mean_queue_wait_s: float
    gpu_replica_hours: float
    max_replicas: int
    mean_replicas: float
    span_s: float
    decisions: int
    timeline: list[tuple[float, int, int, float]] = field(default_factory=list)  # (t, live, serving, queue)

    def summary(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.__dict__.items() if k != "timeline"}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


@dataclass(frozen=True)
class GpuLimit:
    """The GPUs a service may hold over time: `steps` are (from time t, at most n GPUs), in time order; before the
    first step, the first step's n."""
    steps: tuple[tuple[float, int], ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("a GPU limit needs at least one (time, GPUs) step")
        for i, (t, n) in enumerate(self.steps):
            if not math.isfinite(t) or n < 0:
                raise ValueError(f"GPU limit step {i}: time must be finite and GPUs >= 0, got ({t:g}, {n})")
            if i and t < self.steps[i - 1][0]:
                raise ValueError(f"GPU limit step {i}: time {t:g} is before the step before it "
                                 f"({self.steps[i - 1][0]:g}); steps must be in time order")

    def at(self, t: float) -> int:
        i = bisect.bisect_right([s[0] for s in self.steps], t) - 1
        return self.steps[max(0, i)][1]


def simulate(arrivals: list[Arrival], policy: ReplicaPolicy, model: ServiceModel = ServiceModel(), *,
             initial_replicas: int = 1, target: float | None = None, max_tail_s: float = 3600.0,
             warmup_s: float = 0.0, warm: bool = False, setting: str | None = None,
             gpus: GpuLimit | None = None, start_delay_s: float = 0.0, windows: RateWindows = RateWindows(),
             scrape_offset_s: float = 0.0, sync_offset_s: float | None = None) -> Result:
    """Replay `arrivals` through `policy`; the replica count starts at `initial_replicas`, all serving. `warm`: the
    policy starts with the memory of having held them (else it starts fresh). With `warmup_s`, requests arriving in
    the first `warmup_s` seconds and GPU time before then are left out of the results. `gpus`, `start_delay_s`: a
    cluster's GPU limit and what it adds to each cold start (the module's docstring). `windows`: the controller's rate
    windows. Phases: the first scrape at `scrape_offset_s`, the first sync `sync_offset_s` after it (default half a
    scrape interval); a real Prometheus and controller are in no particular phase with the trace or each other."""
    if start_delay_s < 0:
        raise ValueError(f"start_delay_s must be >= 0, got {start_delay_s:g}")
    if scrape_offset_s < 0 or (sync_offset_s is not None and sync_offset_s < 0):
        raise ValueError(f"phases must be >= 0, got scrape offset {scrape_offset_s:g}, sync offset {sync_offset_s}")
    system = ServingSystem(model, arrivals)
    span = arrivals[-1].t if arrivals else 0.0
    counter = 0
    pending: deque[str] = deque()  # asked for, waiting for a GPU (with `gpus`), oldest first

    def bind(now: float) -> None:
        """Pending replicas take the GPUs that are free now and start their cold start."""
        if not pending:
            return
        held = sum(1 for r in system.replicas.values() if r.gone_at is None)
        limit = gpus.at(now) if gpus is not None else math.inf
        while pending and held < limit:
            system.add_replica(pending.popleft(), now, cold_start_s=model.cold_start_s + start_delay_s)
            held += 1

    def add(n: int, now: float, cold: float | None = None) -> None:
        nonlocal counter
        for _ in range(n):
            counter += 1
            if cold is None and (gpus is not None or start_delay_s):
                pending.append(f"r{counter:05d}")
            else:
                system.add_replica(f"r{counter:05d}", now, cold_start_s=cold)
        bind(now)

    def remove(n: int, now: float) -> None:
        while n and pending:
            pending.pop()
            n -= 1
        system.remove_replicas(n, now)

    def live_names() -> list[str]:
        return [r.name for r in system.live()] + list(pending)

    add(initial_replicas, 0.0, cold=0.0)
    system.advance(0.0)
    log = ScrapeLog(windows=windows)
    state = policy.initial_state(initial_replicas if warm else 0)
    scrape_dt, sync_dt = model.scrape_interval_s, policy.sync_period_s
    next_scrape = scrape_offset_s
    next_sync = scrape_offset_s + (scrape_dt / 2 if sync_offset_s is None else sync_offset_s)
    next_tick, last_area = 1.0, 0.0
    concurrency: deque[float] = deque(maxlen=CONCURRENCY_HISTORY)
    timeline: list[tuple[float, int, int, float]] = []
    decisions = 0
    gpu_at_span: float | None = None
    gpu_at_warmup: float | None = None if warmup_s > 0 else 0.0
    max_live = initial_replicas
    while True:
        now = min(next_scrape, next_sync, next_tick)
        if gpu_at_warmup is None and now >= warmup_s:
            system.advance(warmup_s)
            gpu_at_warmup = system.gpu_seconds(warmup_s)
        if gpu_at_span is None and now >= span:
            system.advance(span)
            gpu_at_span = system.gpu_seconds(span)
        system.advance(now)
        bind(now)
        if now >= span and (system.done or now > span + max_tail_s):
            break
        if now == next_tick:
            area = system.inflight_seconds(now)
            concurrency.append(area - last_area)
            last_area, next_tick = area, next_tick + 1.0
            continue
        if now == next_scrape:
            log.scrape(now, system.replica_metrics(), system.gateway_waiting(), system.arrived_total())
            next_scrape += scrape_dt
            continue
        next_sync += sync_dt
        live = live_names()
        signals = log.signals(now)
        if signals is not None:
            signals = replace(signals, concurrency_1s=tuple(concurrency))
        snap = TargetSnapshot(now=now, replicas=len(live), pods=frozenset(live), signals=signals,
                              pending_pods=frozenset(pending), ready=len(system.serving()))
        decision, state = policy.recommend(snap, state)
        decisions += 1
        if decision.desired > len(live):
            add(decision.desired - len(live), now)
        elif decision.desired < len(live):
            remove(len(live) - decision.desired, now)
        n_live = len(live_names())
        max_live = max(max_live, n_live)
        if now <= span:
            sig = snap.signals
            timeline.append((now, n_live, len(system.serving()), sig.total_queue if sig else 0.0))
    # Waits exist for the requests that arrived by the end; the zip stops there.
    waits = [w for a, w in zip(system.arrival_t, system.queue_waits(), strict=False) if a >= warmup_s]
    slo = model.slo_queue_wait_s
    ok = sum(1 for w in waits if w <= slo + 1e-9)
    gpu_s = (gpu_at_span if gpu_at_span is not None else system.gpu_seconds(span)) - (gpu_at_warmup or 0.0)
    span -= warmup_s
    return Result(
        policy=policy.name, target=target, setting=setting if setting is not None else getattr(policy, "setting", ""),
        requests=len(waits),
        slo_attainment=ok / len(waits) if waits else 1.0,
        p99_queue_wait_s=percentile(waits, 99), mean_queue_wait_s=sum(waits) / len(waits) if waits else 0.0,
        gpu_replica_hours=gpu_s / 3600.0, max_replicas=max_live,
        mean_replicas=gpu_s / span if span > 0 else float(max_live), span_s=span, decisions=decisions,
        timeline=timeline,
    )


def peak_replicas(arrivals: list[Arrival], model: ServiceModel = ServiceModel(), window_s: float = 60.0) -> int:
    """The replica count the trace's peak needs: the most service-seconds that arrive in any `window_s` window, spread
    over that window, divided by the requests a replica serves at once."""
    if not arrivals:
        return 1
    t = [a.t for a in arrivals]
    s = [model.service_time(a.context_tokens, a.generated_tokens) for a in arrivals]
    best = acc = 0.0
    lo = 0
    for hi in range(len(t)):
        acc += s[hi]
        while t[hi] - t[lo] > window_s:
            acc -= s[lo]
            lo += 1
        best = max(best, acc)
    return max(1, math.ceil(best / window_s / model.concurrency))

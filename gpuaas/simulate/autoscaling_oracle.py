"""The oracle of `gpuaas simulate autoscaling`, and the warm start every policy shares.

The oracle knows the arrivals. It provisions each interval's need one cold start ahead:

1. **Need.** The sync period cuts time into intervals (boundaries at the sync instants, so that a decision at one
   boundary is in force until the next). Interval by interval, the need is the fewest replicas with which every request
   arriving in it starts within the queue-wait SLO, found by bisection on a pooled first-come-first-served queue of
   `replicas x concurrency` slots that carries over from the previous interval what is still running (on a scale-down
   the least busy replicas go, as a ReplicaSet picks them, so the busiest slots stay). The pooled queue starts a request
   on the first slot to free anywhere, which the real routing (least outstanding requests, then the replica's own queue)
   cannot beat, so the need is a lower bound on what the simulated service needs.
2. **Schedule.** Replica k (k = 1, 2, ...) is wanted in the intervals whose need is at least k. It is asked for one
   cold start before each run of such intervals and released at the run's end, except that a gap between two runs no
   longer than a cold start is bridged (keeping an idle replica through the gap costs less than the cold start of a new
   one). That is the cheapest schedule serving those needs: its GPU-time is the lower bound reported
   (`bound_gpu_hours` in the search's table).
   The first `initial` replicas serve from t = 0 (the warm start).

Nothing is tuned: the need follows from the arrivals, the service model and the SLO; the schedule from the cold start.
The simulated run of the schedule costs a little more than the bound (a released replica finishes what it runs) and may
miss the SLO for a few requests (the real routing is not pooled).
"""
from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass

from autoscaler.snapshot import Recommendation, TargetSnapshot
from gpuaas.loadgen.serving import ServiceModel
from gpuaas.loadgen.trace import Arrival

WARM_WINDOW_S = 60.0  # the warm start covers the first minute


def _serves(slots_free: list[float], replicas: int, concurrency: int, start: float, times: list[float],
            service: list[float], slo: float) -> list[float] | None:
    """With `replicas` from `start` on, the slots' free times after serving every request in `times` (a heap), or None
    when one of them waits more than `slo`. `slots_free`: free times of the slots carried over (any order)."""
    n = replicas * concurrency
    carried = sorted(slots_free)
    kept = carried[len(carried) - n:] if n < len(carried) else carried  # the busiest stay
    heap = [max(f, start) for f in kept] + [start] * (n - len(kept))
    if not heap:
        return None if times else []
    heapq.heapify(heap)
    for t, s in zip(times, service, strict=True):
        free = heap[0]
        begin = free if free > t else t
        if begin - t > slo + 1e-9:
            return None
        heapq.heapreplace(heap, begin + s)
    return heap


def _fewest(slots_free: list[float], concurrency: int, start: float, times: list[float], service: list[float],
            slo: float, hint: int) -> tuple[int, list[float]]:
    """The fewest replicas serving `times` within `slo`, and the slots' free times after them."""
    if not times:
        return 0, []
    lo, hi = 0, max(1, hint)
    got = _serves(slots_free, hi, concurrency, start, times, service, slo)
    while got is None:
        lo, hi = hi, hi * 2
        got = _serves(slots_free, hi, concurrency, start, times, service, slo)
    while lo + 1 < hi:  # invariant: lo fails (or is 0), hi serves
        mid = (lo + hi) // 2
        trial = _serves(slots_free, mid, concurrency, start, times, service, slo)
        if trial is None:
            lo = mid
        else:
            hi, got = mid, trial
    return hi, got


def interval_needs(arrivals: list[Arrival], model: ServiceModel, *, interval_s: float = 15.0,
                   first_boundary_s: float = 7.5) -> tuple[float, list[int]]:
    """(start of the first interval, the need of each interval): intervals of `interval_s` with a boundary at
    `first_boundary_s`; the first one starts at or before 0."""
    start = first_boundary_s - math.ceil(first_boundary_s / interval_s) * interval_s
    times = [a.t for a in arrivals]
    service = [model.service_time(a.context_tokens, a.generated_tokens) for a in arrivals]
    needs: list[int] = []
    slots: list[float] = []
    i, k = 0, 0
    while i < len(times):
        lo, hi = start + k * interval_s, start + (k + 1) * interval_s
        j = bisect.bisect_left(times, hi, lo=i)
        n, after = _fewest(slots, model.concurrency, lo, times[i:j], service[i:j], model.slo_queue_wait_s,
                           needs[-1] if needs else 1)
        slots = list(after) if n else [f for f in slots if f > hi]
        needs.append(n)
        i, k = j, k + 1
    return start, needs


def warm_start_replicas(arrivals: list[Arrival], model: ServiceModel = ServiceModel()) -> int:
    """The replicas the first minute needs: the fewest with which every request arriving in the first 60 s starts
    within the SLO (the pooled queue above, from empty), at least 1."""
    times = [a.t for a in arrivals if a.t < WARM_WINDOW_S]
    service = [model.service_time(a.context_tokens, a.generated_tokens) for a in arrivals[:len(times)]]
    n, _ = _fewest([], model.concurrency, 0.0, times, service, model.slo_queue_wait_s, 1)
    return max(1, n)


def schedule(start: float, needs: list[int], *, interval_s: float, cold_start_s: float,
             initial: int = 0) -> list[tuple[float, int]]:
    """The oracle's replica count as change points [(time, count), ...], from the needs (see the module's docstring).
    Levels up to `initial` serve from t = 0."""
    deltas: dict[float, int] = {}
    top = max(max(needs, default=0), initial)
    for level in range(1, top + 1):
        runs: list[list[float]] = [[0.0, 0.0]] if level <= initial else []
        for k, need in enumerate(needs):
            if need < level:
                continue
            a, b = start + k * interval_s, start + (k + 1) * interval_s
            if runs and a - runs[-1][1] <= cold_start_s + 1e-9:
                runs[-1][1] = b
            else:
                runs.append([a, b])
        for n, (a, b) in enumerate(runs):
            warm = level <= initial and n == 0
            ask = 0.0 if warm else max(0.0, a - cold_start_s)
            if b <= ask:
                b = ask + interval_s / 2 if warm else b  # a warm replica never needed goes at the first sync
            if b <= ask:
                continue
            deltas[ask] = deltas.get(ask, 0) + 1
            deltas[b] = deltas.get(b, 0) - 1
    out: list[tuple[float, int]] = []
    count = 0
    for t in sorted(deltas):
        count += deltas[t]
        out.append((t, count))
    return out


def schedule_gpu_hours(points: list[tuple[float, int]], begin: float, end: float) -> float:
    """The GPU-hours of a schedule between `begin` and `end`."""
    total = 0.0
    for (t, n), (t2, _) in zip(points, [*points[1:], (max(end, points[-1][0]), 0)], strict=True):
        total += n * max(0.0, min(t2, end) - max(t, begin))
    return total / 3600.0


@dataclass(frozen=True)
class OraclePolicy:
    """Sets, at each sync, the count the precomputed schedule holds then."""
    points: tuple[tuple[float, int], ...]
    sync_period_s: float = 15.0
    name: str = "oracle"

    @property
    def setting(self) -> str:
        return "hindsight"

    def initial_state(self, replicas: int = 0) -> None:
        return None

    def gpu_hours_between(self, begin: float, end: float) -> float:
        """The lower bound: the schedule's GPU-hours between `begin` and `end`."""
        return schedule_gpu_hours(list(self.points), begin, end)

    def count_at(self, t: float) -> int:
        i = bisect.bisect_right([p[0] for p in self.points], t + 1e-9) - 1
        return self.points[i][1] if i >= 0 else 0

    def recommend(self, snap: TargetSnapshot, state: None) -> tuple[Recommendation, None]:
        n = self.count_at(snap.now)
        return Recommendation(n, "Oracle", f"the schedule holds {n} now"), None


def oracle_policy(arrivals: list[Arrival], model: ServiceModel = ServiceModel(), *, sync_period_s: float = 15.0,
                  initial: int | None = None) -> OraclePolicy:
    """The oracle for `arrivals` under `model`, deciding at the simulator's sync instants (half a scrape interval
    after 0, then every `sync_period_s`)."""
    first = model.scrape_interval_s / 2
    start, needs = interval_needs(arrivals, model, interval_s=sync_period_s, first_boundary_s=first)
    warm = warm_start_replicas(arrivals, model) if initial is None else initial
    points = schedule(start, needs, interval_s=sync_period_s, cold_start_s=model.cold_start_s, initial=warm)
    return OraclePolicy(tuple(points), sync_period_s)

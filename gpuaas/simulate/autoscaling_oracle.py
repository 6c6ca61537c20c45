"""The oracle of `gpuaas simulate autoscaling`, and the warm start every policy shares.

The oracle knows the arrivals. It provisions each interval's need one cold start ahead:

1. **Need.** The sync period cuts time into intervals (boundaries at the sync instants, so that a decision at one
   boundary is in force until the next). Interval by interval, the need is the fewest serving replicas with which every
   request arriving in it starts within the queue-wait SLO, found by bisection on what-if copies of the simulated
   service itself (`ServingSystem.fork`: the same routing, queues and service times) carried over from the previous
   interval's need (on a scale-down the replicas go as a ReplicaSet picks them).
2. **Schedule.** Replica k (k = 1, 2, ...) is wanted in the intervals whose need is at least k. It is asked for one
   cold start before each run of such intervals and released at the run's end, except that a gap between two runs no
   longer than a cold start is bridged (keeping an idle replica through the gap costs less than the cold start of a new
   one). That is the cheapest schedule serving those needs: its GPU-time is the lower bound reported
   (`bound_gpu_hours` in the search's table). The first `initial` replicas serve from t = 0 (the warm start).

Nothing is tuned: the need follows from the arrivals, the service model and the SLO; the schedule from the cold start.
The need asks every request to start within the SLO (100 %), not 99 %: an oracle allowed to drop the costliest 1 % would
be cheaper still. The simulated run of the schedule costs a little more than the bound (a released replica finishes
what it runs, and the needs are computed greedily interval by interval).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from autoscaler.snapshot import Recommendation, TargetSnapshot
from gpuaas.loadgen.serving import ServiceModel, ServingSystem
from gpuaas.loadgen.trace import Arrival

WARM_WINDOW_S = 60.0  # the warm start covers the first minute


def _trial(system: ServingSystem, replicas: int, start: float, first: int, stop: int, slo: float,
           prefix: str) -> ServingSystem | None:
    """The system forked at `start` with `replicas` serving from then on (added ready, or removed as a ReplicaSet
    picks), if every arrival of `first`..`stop`-1 starts within `slo` with no later arrival; else None."""
    f = system.fork()
    f.advance(start)
    live = len(f.live())
    if replicas > live:
        for _ in range(replicas - live):
            f.add_replica(f"{prefix}{f._created + 1}", start, cold_start_s=0.0)
    elif replicas < live:
        f.remove_replicas(live - replicas, start)
    if stop <= first:
        return f
    f.arrival_limit = stop
    f.advance(f.arrival_t[stop - 1] + slo + 1e-6)
    begun, arrived = f.start_t, f.arrival_t
    for i in range(first, stop):
        if not begun[i] - arrived[i] <= slo + 1e-9:  # NaN (not started) fails too
            return None
    return f


def _fewest(system: ServingSystem, start: float, first: int, stop: int, slo: float, hint: int,
            prefix: str) -> int:
    """The fewest replicas with which every arrival of `first`..`stop`-1 starts within `slo` (bisection)."""
    if stop <= first:
        return 0
    lo, hi = 0, max(1, hint)
    while _trial(system, hi, start, first, stop, slo, prefix) is None:
        lo, hi = hi, hi * 2
    while lo + 1 < hi:  # invariant: lo fails (or is 0), hi serves
        mid = (lo + hi) // 2
        if _trial(system, mid, start, first, stop, slo, prefix) is None:
            lo = mid
        else:
            hi = mid
    return hi


def interval_needs(arrivals: list[Arrival], model: ServiceModel, *, interval_s: float = 15.0,
                   first_boundary_s: float = 7.5) -> tuple[float, list[int]]:
    """(start of the first interval, the need of each interval): intervals of `interval_s` with a boundary at
    `first_boundary_s`; the first one starts at or before 0."""
    start = first_boundary_s - math.ceil(first_boundary_s / interval_s) * interval_s
    times = [a.t for a in arrivals]
    system = ServingSystem(model, arrivals)
    needs: list[int] = []
    i, k = 0, 0
    while i < len(times):
        lo, hi = start + k * interval_s, start + (k + 1) * interval_s
        j = bisect.bisect_left(times, hi, lo=i)
        n = _fewest(system, max(lo, 0.0), i, j, model.slo_queue_wait_s, needs[-1] if needs else 1, "need")
        committed = _trial(system, n, max(lo, 0.0), i, i, model.slo_queue_wait_s, "need")
        assert committed is not None
        committed.arrival_limit = None
        committed.advance(hi)
        system = committed
        needs.append(n)
        i, k = j, k + 1
    return start, needs


def warm_start_replicas(arrivals: list[Arrival], model: ServiceModel = ServiceModel()) -> int:
    """The replicas the first minute needs: the fewest with which every request arriving in the first 60 s starts
    within the SLO (in the simulated service, from empty), at least 1."""
    stop = bisect.bisect_left([a.t for a in arrivals], WARM_WINDOW_S)
    return max(1, _fewest(ServingSystem(model, arrivals), 0.0, 0, stop, model.slo_queue_wait_s, 1, "warm"))


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

"""`gpuaas simulate autoscaling --search`: for each baseline, the cheapest setting on a documented grid that reaches
the SLO bar, beside ours and the oracle, in one table.

The grid (every run starts warm, counts every request from t = 0, and shares the service model):

- static: every replica count; the cheapest reaching the bar is found by bisection (attainment grows with the count).
- hpa and keda, on each metric (`inflight`: running + waiting per replica; `queue`: waiting per replica) and each
  target of INFLIGHT_TARGETS or QUEUE_TARGETS; kpa on each of KPA_TARGETS (autoscaling.knative.dev/target, in flight
  per pod, x 0.7 utilization). Each first with the system's default floor (HPA minReplicas 1, KEDA minReplicaCount 0,
  Knative min-scale 0); a setting that misses the bar is tried again with a floor (minReplicas, minReplicaCount,
  min-scale), the smallest that reaches the bar found by bisection between the default and the cheapest static count
  (a floor that high holds the static fleet). Floors whose GPU-time alone (floor x span) exceeds the cheapest
  setting found so far are not run: they cannot be cheaper.
- ours: its one configuration (`QueueDepthConfig()` with min/max replicas, concurrency and cold start of the run).
- oracle: computed from the arrivals (gpuaas/simulate/autoscaling_oracle.py); the ratio column divides by its GPU-hours.
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from autoscaler.policy import (
    HpaPolicy,
    KedaPolicy,
    KpaPolicy,
    Metric,
    QueueDepthConfig,
    QueueDepthPolicy,
    ReplicaPolicy,
    StaticPolicy,
)
from gpuaas.loadgen.serving import ServiceModel
from gpuaas.loadgen.trace import Arrival

from .autoscaling import Result, peak_replicas, simulate
from .autoscaling_oracle import oracle_policy, warm_start_replicas

INFLIGHT_TARGETS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)
QUEUE_TARGETS = (0.25, 0.5, 1.0, 2.0, 4.0)
KPA_TARGETS = (1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0)
# (family, targets, the system's default floor)
FAMILIES: tuple[tuple[str, tuple[float, ...], int], ...] = (
    ("hpa-inflight", INFLIGHT_TARGETS, 1), ("keda-inflight", INFLIGHT_TARGETS, 0),
    ("hpa-queue", QUEUE_TARGETS, 1), ("keda-queue", QUEUE_TARGETS, 0), ("kpa", KPA_TARGETS, 0))


@dataclass
class Search:
    arrivals: list[Arrival]
    model: ServiceModel = ServiceModel()
    bar: float = 0.99
    max_replicas: int = 200
    ours: QueueDepthConfig | None = None
    warmup_s: float = 0.0  # the pre-roll: requests before it and GPU time before it do not count
    progress: Callable[[str], None] | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    results: list[tuple[str, Result]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.warm = warm_start_replicas(self.arrivals, self.model)
        self.span = (self.arrivals[-1].t if self.arrivals else 0.0) - self.warmup_s

    def run(self, policy: ReplicaPolicy, *, family: str | None = None) -> Result:
        initial = policy.replicas if isinstance(policy, StaticPolicy) else self.warm
        t0 = time.perf_counter()
        r = simulate(self.arrivals, policy, self.model, initial_replicas=initial, warm=True, warmup_s=self.warmup_s)
        row = {**r.summary(), "family": family or r.policy, "wall_s": round(time.perf_counter() - t0, 2)}
        self.runs.append(row)
        self.results.append((row["family"], r))
        if self.progress:
            self.progress(f"{row['family']:<13} {r.setting:<32} SLO {100 * r.slo_attainment:6.2f}% "
                          f"p99 {r.p99_queue_wait_s:6.1f}s {r.gpu_replica_hours:7.2f} GPU-h")
        return r

    def ok(self, r: Result) -> bool:
        return r.slo_attainment >= self.bar

    def cheapest_static(self) -> tuple[Result | None, Result]:
        """(the cheapest static fleet reaching the bar or None, the peak-sized one)."""
        peak = peak_replicas([a for a in self.arrivals if a.t >= self.warmup_s], self.model)
        peak_run = self.run(StaticPolicy(peak))
        lo, hi = 1, self.max_replicas
        best: Result | None = None
        if self.ok(peak_run):
            hi, best = peak, peak_run
        else:
            lo = peak + 1
        top = self.run(StaticPolicy(hi)) if best is None else None
        if top is not None and not self.ok(top):
            return None, peak_run
        best = best or top
        while lo < hi:
            mid = (lo + hi) // 2
            r = self.run(StaticPolicy(mid))
            if self.ok(r):
                hi, best = mid, r
            else:
                lo = mid + 1
        return best, peak_run

    def make(self, family: str, target: float, floor: int) -> ReplicaPolicy:
        mx = self.max_replicas
        kind, _, metric = family.partition("-")
        m: Metric = "queue" if metric == "queue" else "inflight"
        if kind == "hpa":
            return HpaPolicy(target=target, metric=m, min_replicas=max(1, floor), max_replicas=mx)
        if kind == "keda":
            return KedaPolicy(target=target, metric=m, min_replica_count=floor, max_replica_count=mx)
        return KpaPolicy(target=target, min_scale=floor, max_scale=mx)

    def with_floor(self, make: Callable[[int], ReplicaPolicy], default: int, ceiling: int,
                   budget_gpu_h: float, family: str) -> Result | None:
        """The run with the smallest floor in (default, ceiling] reaching the bar (None if none does, or none could be
        cheaper than `budget_gpu_h`)."""
        affordable = math.floor(budget_gpu_h * 3600 / self.span) if self.span > 0 else ceiling
        lo, hi = default, min(ceiling, affordable)
        if hi <= lo:
            return None
        top = self.run(make(hi), family=family)
        if not self.ok(top):
            return None
        best = top
        while lo + 1 < hi:  # invariant: lo misses the bar, hi reaches it
            mid = (lo + hi) // 2
            r = self.run(make(mid), family=family)
            if self.ok(r):
                hi, best = mid, r
            else:
                lo = mid
        return best

    def search(self) -> dict[str, Any]:
        mx = self.max_replicas
        oracle = oracle_policy(self.arrivals, self.model, initial=self.warm)
        oracle_run = self.run(oracle)
        ours_cfg = self.ours or QueueDepthConfig(max_replicas=mx, concurrency=self.model.concurrency,
                                                 cold_start_s=self.model.cold_start_s)
        ours_run = self.run(QueueDepthPolicy(ours_cfg))
        static_best, _ = self.cheapest_static()
        ceiling = static_best.max_replicas if static_best else mx
        budget = static_best.gpu_replica_hours if static_best else math.inf
        best: dict[str, Result | None] = {"static": static_best}
        for family, targets, default in FAMILIES:
            found: Result | None = None
            for target in targets:
                r = self.run(self.make(family, target, default), family=family)
                if not self.ok(r):
                    budget_here = min(budget, found.gpu_replica_hours if found else math.inf)
                    r2 = self.with_floor(partial(self.make, family, target), default, ceiling, budget_here, family)
                    if r2 is None:
                        continue
                    r = r2
                if found is None or r.gpu_replica_hours < found.gpu_replica_hours:
                    found = r
                budget = min(budget, r.gpu_replica_hours)
            best[family] = found
        closest: dict[str, Result] = {}
        for family, r in self.results:  # per family, the run closest to the bar (the cheaper of equals)
            c = closest.get(family)
            if c is None or (r.slo_attainment, -r.gpu_replica_hours) > (c.slo_attainment, -c.gpu_replica_hours):
                closest[family] = r
        return self.table(oracle, oracle_run, ours_run, best, closest)

    def table(self, oracle, oracle_run: Result, ours_run: Result, best: dict[str, Result | None],
              closest: dict[str, Result]) -> dict[str, Any]:
        ref = oracle_run.gpu_replica_hours

        def row(family: str, r: Result, reaches: bool | None = None) -> dict[str, Any]:
            return {"policy": family, "setting": r.setting, "slo_attainment": round(r.slo_attainment, 6),
                    "p99_queue_wait_s": round(r.p99_queue_wait_s, 3),
                    "gpu_hours": round(r.gpu_replica_hours, 4),
                    "over_oracle": round(r.gpu_replica_hours / ref, 4) if ref > 0 else None,
                    "reaches_bar": r.slo_attainment >= self.bar if reaches is None else reaches,
                    "max_replicas": r.max_replicas}

        rows = [row("ours", ours_run)]
        for family in sorted(best, key=lambda f: (f == "static", f)):
            r = best[family]
            rows.append(row(family, r) if r is not None else {
                **row(family, closest[family]), "reaches_bar": False,
                "note": f"no setting reaches {100 * self.bar:g}% for less than the cheapest found: the closest"})
        bound = oracle.gpu_hours_between(self.warmup_s, self.warmup_s + self.span)
        rows.append({**row("oracle", oracle_run), "bound_gpu_hours": round(bound, 4)})
        reaching = [r for r in rows if r["policy"] not in ("ours", "oracle") and r["reaches_bar"]]
        # the cheapest; of equals, a static fleet (a floor at the static count is that fleet under another name)
        cheapest = min(reaching, key=lambda r: (r["gpu_hours"], r["policy"] != "static")) if reaching else None
        ours = rows[0]
        return {
            "bar": self.bar, "requests": oracle_run.requests, "warm_start_replicas": self.warm,
        "preroll_s": self.warmup_s,
            "rows": rows,
            "cheapest_baseline": cheapest and {"policy": cheapest["policy"], "setting": cheapest["setting"],
                                               "gpu_hours": cheapest["gpu_hours"]},
            "ours_over_cheapest_baseline": (round(ours["gpu_hours"] / cheapest["gpu_hours"], 4)
                                            if cheapest else None),
            "ours_over_oracle": ours["over_oracle"],
            "ours_reaches_bar": ours["reaches_bar"],
            "runs": self.runs,
        }


def format_search(result: dict[str, Any]) -> str:
    head = (f"{'policy':<14} {'setting':<32} {'SLO attain':>10} {'p99 wait s':>10} {'GPU-h':>8} "
            f"{'x oracle':>8}")
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        mark = "" if r["reaches_bar"] or r["policy"] == "oracle" else " *"
        ratio = "" if r["over_oracle"] is None else f"{r['over_oracle']:.2f}"
        lines.append(f"{r['policy']:<14} {r['setting']:<32} {100 * r['slo_attainment']:>9.2f}% "
                     f"{r['p99_queue_wait_s']:>10.1f} {r['gpu_hours']:>8.2f} {ratio:>8}{mark}")
    lines.append(f"* below the {100 * result['bar']:g}% bar: no setting of the grid reaches it for less than the "
                 "cheapest setting found; the closest shown")
    c = result["cheapest_baseline"]
    if c:
        lines.append(f"ours / cheapest baseline reaching the bar ({c['policy']}, {c['setting']}): "
                     f"{result['ours_over_cheapest_baseline']:.2f}; ours / oracle: {result['ours_over_oracle']:.2f}")
    return "\n".join(lines)


def stderr_progress(prefix: str = "") -> Callable[[str], None]:
    def say(line: str) -> None:
        print(prefix + line, file=sys.stderr, flush=True)
    return say

"""Benchmark: our queue-depth recommender against HPA and KEDA (documented defaults, target searched over a grid) and a
static fleet, on a request trace replayed in simulated time. Prints JSON.

    python bench/autoscaling_compare.py [--trace CSV] [--rate-scale 10] [--targets 0.25,0.5,...] [--warmup 0,300]
                                        [--min-replicas 1,20,40,60,70]

For each warm-up setting: every run's summary, and the must-show comparison: ours' SLO attainment and its GPU-replica-
hours over those of the cheapest hpa (and keda) target reaching the SLO bar (null when no target reaches it), and over
the cheapest static fleet that reaches the bar (found with hindsight, by bisection on the count).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.policy import HpaPolicy, KedaPolicy, QueueDepthConfig, QueueDepthPolicy, ReplicaPolicy, StaticPolicy
from gpuaas.loadgen.serving import ServiceModel
from gpuaas.loadgen.trace import Arrival, load_trace, scale_rate
from gpuaas.simulate.autoscaling import peak_replicas, simulate
from gpuaas.simulate.autoscaling_cli import format_table

DEFAULT_TRACE = "/work/shared/data/traces/AzureLLMInferenceTrace_code.csv"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=DEFAULT_TRACE)
    ap.add_argument("--rate-scale", type=int, default=10)
    ap.add_argument("--targets", default="0.25,0.5,1,2,3,4,6,8")
    ap.add_argument("--warmup", default="0,300", help="comma list of warm-up seconds to evaluate")
    ap.add_argument("--min-replicas", default=None,
                    help="comma list: also search hpa minReplicas and keda minReplicaCount over these (default: each "
                         "system's own default only, HPA 1 and KEDA 0); the initial fleet is that minimum")
    ap.add_argument("--max-replicas", type=int, default=200)
    ap.add_argument("--bar", type=float, default=0.99, help="SLO attainment bar")
    ap.add_argument("--smooth-seed", type=int, help="a robustness variant: move every arrival to a uniformly random "
                                                     "time within its minute (same per-minute counts, no sub-minute "
                                                     "bursts), with this seed")
    args = ap.parse_args()
    model = ServiceModel()
    raw = load_trace(args.trace)
    if args.smooth_seed is not None:
        rng = random.Random(args.smooth_seed)
        raw = sorted((Arrival(a.t // 60 * 60 + rng.random() * 60, a.context_tokens, a.generated_tokens) for a in raw),
                     key=lambda a: a.t)
    arrivals = scale_rate(raw, args.rate_scale)
    peak = peak_replicas(arrivals, model)
    targets = [float(x) for x in args.targets.split(",")]
    mx = args.max_replicas
    ours_config = QueueDepthConfig(max_replicas=mx)
    # (policy, target, initial replicas, floor): every fleet starts at its floor, and at least one replica.
    policies: list[tuple[ReplicaPolicy, float | None, int, int | None]] = [
        (QueueDepthPolicy(ours_config), None, 1, ours_config.min_replicas),
        (StaticPolicy(peak), None, peak, None)]
    floors = [int(x) for x in args.min_replicas.split(",")] if args.min_replicas else None
    policies += [(HpaPolicy(target=t, min_replicas=m, max_replicas=mx), t, max(1, m), m)
                 for m in floors or [HpaPolicy.min_replicas] for t in targets]
    policies += [(KedaPolicy(target=t, min_replica_count=m, max_replica_count=mx), t, max(1, m), m)
                 for m in floors or [KedaPolicy.min_replica_count] for t in targets]
    out = {"trace": args.trace, "smooth_seed": args.smooth_seed, "rate_scale": args.rate_scale,
           "requests": len(arrivals),
           "static_peak_replicas": peak, "service_model": model.__dict__, "bar": args.bar, "evaluations": []}
    for warmup in [float(w) for w in args.warmup.split(",")]:
        rows = []
        t0 = time.perf_counter()
        for policy, target, initial, floor in policies:
            r = simulate(arrivals, policy, model, initial_replicas=initial, target=target, warmup_s=warmup)
            rows.append({**r.summary(), "min_replicas": floor})
            print(f"warmup {warmup:g}: {r.policy} {target} min {floor}: {r.slo_attainment:.4f} "
                  f"{r.gpu_replica_hours:.2f}",
                  file=sys.stderr, flush=True)
        # The cheapest static fleet that reaches the bar, found with hindsight (bisection on the count).
        lo, hi = peak, mx
        hind = None
        while lo < hi:
            mid = (lo + hi) // 2
            r = simulate(arrivals, StaticPolicy(mid), model, initial_replicas=mid, warmup_s=warmup)
            if r.slo_attainment >= args.bar:
                hi, hind = mid, r
            else:
                lo = mid + 1
        if hind is None or hind.max_replicas != lo:
            hind = simulate(arrivals, StaticPolicy(lo), model, initial_replicas=lo, warmup_s=warmup)
        hindsight = {**hind.summary(), "policy": "static-hindsight"}
        rows.append(hindsight)
        ours = rows[0]
        comparison = {"ours_slo_attainment": ours["slo_attainment"],
                      "ours_gpu_replica_hours": ours["gpu_replica_hours"],
                      "ours_reaches_bar": ours["slo_attainment"] >= args.bar}
        for name in ("hpa", "keda"):
            ok = [r for r in rows if r["policy"] == name and r["slo_attainment"] >= args.bar]
            best = min(ok, key=lambda r: r["gpu_replica_hours"]) if ok else None
            best_slo = max((r for r in rows if r["policy"] == name), key=lambda r: r["slo_attainment"])
            comparison[name] = {
                "cheapest_target_reaching_bar": best["target"] if best else None,
                "its_min_replicas": best["min_replicas"] if best else None,
                "its_gpu_replica_hours": best["gpu_replica_hours"] if best else None,
                "ours_over_it": round(ours["gpu_replica_hours"] / best["gpu_replica_hours"], 4) if best else None,
                "best_slo_attainment_any_target": best_slo["slo_attainment"],
                "best_target": best_slo["target"], "best_target_min_replicas": best_slo["min_replicas"],
                "best_target_gpu_replica_hours": best_slo["gpu_replica_hours"],
            }
        out["evaluations"].append({"warmup_s": warmup, "wall_s": round(time.perf_counter() - t0, 1),
                                   "comparison": {**comparison, "static_hindsight": {
                                       "replicas": hindsight["max_replicas"],
                                       "slo_attainment": hindsight["slo_attainment"],
                                       "gpu_replica_hours": hindsight["gpu_replica_hours"],
                                       "ours_over_it": round(ours["gpu_replica_hours"]
                                                             / hindsight["gpu_replica_hours"], 4)}},
                                   "runs": rows})
        print(f"\nwarm-up {warmup:g} s\n" + format_table(rows), file=sys.stderr)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

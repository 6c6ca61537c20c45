"""`gpuaas simulate autoscaling`: replay a request trace in simulated time through a replica policy.

    gpuaas simulate autoscaling --trace CSV --policy ours|hpa|keda|static[,...] [--target X[,Y...]] [--rate-scale K]
                                [--warmup S] --json OUT [--plot PNG]

Registered as a sub-verb of `gpuaas simulate` through `gpuaas.simulate.cli.register_subverb`.
"""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .output import can_plot, write_json, write_plot

if TYPE_CHECKING:
    from autoscaler.policy import ReplicaPolicy

SERVICE_MODEL_HELP = """service model (defaults): one replica = one GPU; it serves up to 8 requests at once
(--concurrency); a request takes ContextTokens/5000 + GeneratedTokens/20 seconds (--prefill-tps, --decode-tps); a new
replica serves 60 s after it is asked for (--cold-start); Prometheus scrapes every 15 s (--scrape-interval); SLO: queue
wait at most 2 s (--slo); --rate-scale K replays each arrival K times, spread within its second. A gateway routes each
request to the serving replica with the fewest outstanding requests; a replica holds at most 8 waiting requests
(--max-waiting), the rest wait at the gateway. Policies: ours (queue depth + arrival rate, autoscaler/policy.py), hpa
(autoscaling/v2 Pods metric = queue depth per pod, AverageValue --target; 15 s sync, tolerance 0.1, 300 s scale-down
stabilization, scale-up {4 pods, 100%%}/15 s), keda (Prometheus trigger on the total queue, threshold --target,
AverageValue; 30 s polling, activationThreshold 0, cooldown 300 s, minReplicaCount 0, then KEDA's HPA with the defaults
above), static (the replica count the trace's peak minute needs, or --replicas). JSON keys: slo_attainment,
p99_queue_wait_s, gpu_replica_hours, max_replicas (and more)."""


def _floats(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not out or any(x <= 0 for x in out):
        raise argparse.ArgumentTypeError(f"targets must be > 0, got {text!r}")
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("autoscaling", help="replay a request trace through a replica autoscaling policy",
                       description=__doc__.splitlines()[0], epilog=SERVICE_MODEL_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True, help="CSV with TIMESTAMP,ContextTokens,GeneratedTokens (Azure LLM trace)")
    p.add_argument("--policy", required=True, help="ours, hpa, keda, static, or several comma-separated")
    p.add_argument("--target", type=_floats, help="hpa/keda: target average queue depth per replica (a comma list "
                                                  "runs each)")
    p.add_argument("--rate-scale", type=int, default=1, help="replay each arrival K times (default 1)")
    p.add_argument("--warmup", type=float, default=0.0, help="leave requests of the first S seconds and GPU time "
                                                             "before then out of the results (default 0)")
    p.add_argument("--min-replicas", type=int, default=1, help="ours and hpa (default 1; keda: minReplicaCount 0)")
    p.add_argument("--max-replicas", type=int, default=200, help="every policy (default 200)")
    p.add_argument("--replicas", type=int, help="static: the count to hold (default: what the peak minute needs)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-waiting", type=int, default=8)
    p.add_argument("--prefill-tps", type=float, default=5000.0)
    p.add_argument("--decode-tps", type=float, default=20.0)
    p.add_argument("--cold-start", type=float, default=60.0)
    p.add_argument("--scrape-interval", type=float, default=15.0)
    p.add_argument("--slo", type=float, default=2.0, help="queue-wait SLO in seconds (default 2)")
    p.add_argument("--json", dest="json_out", required=True, help="write results here ('-' for stdout)")
    p.add_argument("--plot", help="write a PNG of replicas and queue over time")
    p.set_defaults(func=run)


def build_policies(names: list[str], targets: list[float] | None, args: argparse.Namespace,
                   peak: int) -> list[tuple[ReplicaPolicy, float | None]]:
    """(policy, its --target or None) per policy name."""
    from autoscaler.policy import HpaPolicy, KedaPolicy, QueueDepthConfig, QueueDepthPolicy, StaticPolicy

    out: list[tuple[ReplicaPolicy, float | None]] = []
    for name in names:
        if name == "ours":
            out.append((QueueDepthPolicy(QueueDepthConfig(
                min_replicas=args.min_replicas, max_replicas=args.max_replicas, concurrency=args.concurrency,
                cold_start_s=args.cold_start)), None))
        elif name == "static":
            out.append((StaticPolicy(args.replicas or peak), None))
        elif name in ("hpa", "keda"):
            if not targets:
                raise ValueError(f"policy {name} needs --target (average queue depth per replica)")
            for t in targets:
                if name == "hpa":
                    out.append((HpaPolicy(target=t, min_replicas=args.min_replicas,
                                          max_replicas=args.max_replicas), t))
                else:
                    out.append((KedaPolicy(target=t, max_replica_count=args.max_replicas), t))
        else:
            raise ValueError(f"unknown policy {name!r}; known: ours, hpa, keda, static")
    return out


def format_table(rows: list[dict]) -> str:
    floors = any(r.get("min_replicas") is not None for r in rows)  # a column only when some row has a floor
    head = (f"{'policy':<8} {'target':>7}" + (f" {'min':>4}" if floors else "")
            + f" {'SLO attain':>10} {'p99 wait s':>11} {'GPU-h':>8} {'max repl':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        target = "" if r["target"] is None else f"{r['target']:g}"
        floor = f" {'' if r.get('min_replicas') is None else r['min_replicas']:>4}" if floors else ""
        lines.append(f"{r['policy']:<8} {target:>7}{floor} {100 * r['slo_attainment']:>9.2f}% "
                     f"{r['p99_queue_wait_s']:>11.1f} {r['gpu_replica_hours']:>8.2f} {r['max_replicas']:>8}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from autoscaler.policy import StaticPolicy
    from gpuaas.loadgen.serving import ServiceModel
    from gpuaas.loadgen.trace import TraceError, load_trace, scale_rate
    from gpuaas.simulate.autoscaling import peak_replicas, simulate

    if not can_plot(args.plot, "autoscaling"):
        return 1
    names = [n.strip().lower() for n in args.policy.split(",") if n.strip()]
    try:
        model = ServiceModel(concurrency=args.concurrency, prefill_tokens_per_s=args.prefill_tps,
                             decode_tokens_per_s=args.decode_tps, cold_start_s=args.cold_start,
                             scrape_interval_s=args.scrape_interval, slo_queue_wait_s=args.slo,
                             max_waiting=args.max_waiting)
        arrivals = scale_rate(load_trace(args.trace), args.rate_scale)
        peak = peak_replicas(arrivals, model)
        policies = build_policies(names, args.target, args, peak)
    except (TraceError, ValueError, OSError) as exc:
        print(f"gpuaas simulate autoscaling: {exc}", file=sys.stderr)
        return 2
    results = []
    for policy, target in policies:
        initial = policy.replicas if isinstance(policy, StaticPolicy) else max(1, args.min_replicas)
        r = simulate(arrivals, policy, model, initial_replicas=initial, target=target, warmup_s=args.warmup)
        results.append(r)
        print(f"{policy.name}{'' if target is None else f' target {target:g}'}: SLO {100 * r.slo_attainment:.2f}%, "
              f"p99 wait {r.p99_queue_wait_s:.1f}s, {r.gpu_replica_hours:.2f} GPU-h, max {r.max_replicas}",
              file=sys.stderr)
    rows = [r.summary() for r in results]
    meta = {"trace": str(args.trace), "rate_scale": args.rate_scale, "warmup_s": args.warmup,
            "static_peak_replicas": peak, "service_model": model.__dict__}
    payload = {**rows[0], **meta} if len(rows) == 1 else {"runs": rows, **meta}
    write_json(payload, args.json_out)
    if args.json_out != "-":
        print(format_table(rows))
    return write_plot(plot, results, args.plot, "autoscaling")


def plot(results, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for r in results:
        label = r.policy + ("" if r.target is None else f" {r.target:g}")
        t = [x[0] / 60 for x in r.timeline]
        ax.plot(t, [x[1] for x in r.timeline], label=label, lw=1)
        bx.plot(t, [x[3] for x in r.timeline], label=label, lw=1)
    ax.set_ylabel("replicas asked for")
    bx.set_ylabel("requests waiting (scraped)")
    bx.set_xlabel("minutes")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def register() -> None:
    from gpuaas.simulate.cli import SUBVERBS, register_subverb

    if "autoscaling" not in SUBVERBS:
        register_subverb("autoscaling", add_parser)


register()

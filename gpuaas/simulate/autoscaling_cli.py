"""`gpuaas simulate autoscaling`: replay a request trace in simulated time through replica policies.

    gpuaas simulate autoscaling --trace CSV --policy ours|hpa|keda|kpa|static|oracle[,...] [--metric inflight|queue]
                                [--target X[,Y...]] [--rate-scale K] [--offset S] [--duration S] [--preroll S]
                                --json OUT [--plot PNG]
    gpuaas simulate autoscaling --trace CSV --search [--rate-scale K] [--bar 0.99] --json OUT

Registered as a sub-verb of `gpuaas simulate` through `gpuaas.simulate.cli.register_subverb`.
"""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .output import can_plot, write_json, write_plot

if TYPE_CHECKING:
    from autoscaler.policy import Metric, ReplicaPolicy

SERVICE_MODEL_HELP = """service model (defaults): one replica = one GPU; it serves up to 8 requests at once
(--concurrency); a request takes ContextTokens/5000 + GeneratedTokens/20 seconds (--prefill-tps, --decode-tps); a new
replica serves 60 s after it is asked for (--cold-start); Prometheus scrapes every 15 s (--scrape-interval); SLO: queue
wait at most 2 s (--slo); --rate-scale K replays each arrival K times, spread within its second. A gateway routes each
request to the serving replica with the fewest outstanding requests; a replica holds at most 8 waiting requests
(--max-waiting), the rest wait at the gateway.

warm start: every run starts with the replicas the first minute needs, serving, and each policy with the memory of
having held them; it begins --preroll seconds (default 900) before t = 0 on the trace's preceding seconds (wrapping
around), so that every policy meets t = 0 as a running service does; requests and GPU time before t = 0 do not count.
--offset S starts the window S seconds into the trace (wrapping around), --duration limits it; --preroll 0 starts at
the window with the warm fleet, --fresh-memory without the policies' memory of it (a controller started just then).
Prometheus: rate() extrapolated as Prometheus does, nothing from fewer than two samples; scrapes from --scrape-offset
on, controller syncs --sync-offset after each (a real pair is in no particular phase); --rate-windows as configured.

policies: ours (autoscaler/policy.py, one configuration); hpa (autoscaling/v2 Pods metric --metric per pod, AverageValue
--target; 15 s sync, tolerance 0.1, 300 s scale-down stabilization, scale-up {4 pods, 100%%}/15 s; --min-replicas);
keda (Prometheus trigger on the total --metric, AverageValue threshold --target; 30 s polling, activationThreshold 0,
cooldown 300 s, minReplicaCount 0, then KEDA's HPA with the defaults above); kpa (Knative: target --target in flight per
pod x 0.7, stable window 60 s, panic window 6 s at 200%%, 2 s ticks, scale to zero after a 30 s grace); static (the
replica count the trace's peak minute needs, or --replicas); oracle (knows the arrivals: each 15 s interval's need,
provisioned one cold start ahead). Metrics: inflight = running + waiting per replica (vLLM num_requests_running +
num_requests_waiting), queue = waiting. --search: for each baseline the cheapest setting of the grid in
gpuaas/simulate/autoscaling_search.py reaching --bar, in one table with ours and the oracle. JSON keys: slo_attainment,
p99_queue_wait_s, gpu_replica_hours, max_replicas (and more)."""

POLICIES = ("ours", "hpa", "keda", "kpa", "static", "oracle")
PREROLL_S = 900.0


def _floats(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not out or any(x <= 0 for x in out):
        raise argparse.ArgumentTypeError(f"targets must be > 0, got {text!r}")
    return out


def _windows(text: str):
    from .autoscaling import RateWindows

    try:
        values = [float(x) for x in text.split(",")]
        if len(values) != 3:
            raise ValueError
        return RateWindows(*values)
    except ValueError as err:
        detail = f": {err}" if str(err) else ""
        raise argparse.ArgumentTypeError(f"expected RATE,SHORT,SERVICE window seconds, e.g. 60,30,120, got "
                                         f"{text!r}{detail}") from None


def _offset(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text!r}")
    return value


def _metrics(text: str) -> list[str]:
    out = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in out if m not in ("inflight", "queue")]
    if not out or bad:
        raise argparse.ArgumentTypeError(f"metric must be inflight or queue (or both, comma-separated), got {text!r}")
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("autoscaling", help="replay a request trace through replica autoscaling policies",
                       description=__doc__.splitlines()[0], epilog=SERVICE_MODEL_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True, help="CSV with TIMESTAMP,ContextTokens,GeneratedTokens (Azure LLM trace)")
    p.add_argument("--policy", help=f"{', '.join(POLICIES)}, or several comma-separated")
    p.add_argument("--search", action="store_true", help="the cheapest setting of every baseline reaching --bar, "
                                                         "beside ours and the oracle")
    p.add_argument("--bar", type=float, default=0.99, help="--search: the SLO attainment to reach (default 0.99)")
    p.add_argument("--metric", type=_metrics, default=["inflight"],
                   help="hpa/keda: inflight (running + waiting, default) or queue (waiting), or both")
    p.add_argument("--target", type=_floats, help="hpa/keda: value per replica; kpa: in flight per pod (a comma list "
                                                  "runs each)")
    p.add_argument("--rate-scale", type=int, default=1, help="replay each arrival K times (default 1)")
    p.add_argument("--offset", type=float, default=0.0, help="start S seconds into the trace (default 0)")
    p.add_argument("--duration", type=float, help="seconds of trace to replay (default: the rest of it)")
    p.add_argument("--preroll", type=float, default=PREROLL_S,
                   help="seconds of the trace before the window replayed first, not counted (default 900)")
    p.add_argument("--fresh-memory", action="store_true",
                   help="the policies start with the warm fleet but no memory of it (a controller started just now)")
    p.add_argument("--min-replicas", type=int, help="ours, hpa (default 1), keda and kpa (default 0): the floor")
    p.add_argument("--max-replicas", type=int, default=200, help="every policy (default 200)")
    p.add_argument("--replicas", type=int, help="static: the count to hold (default: what the peak minute needs)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-waiting", type=int, default=8)
    p.add_argument("--prefill-tps", type=float, default=5000.0)
    p.add_argument("--decode-tps", type=float, default=20.0)
    p.add_argument("--cold-start", type=float, default=60.0)
    p.add_argument("--scrape-interval", type=float, default=15.0)
    p.add_argument("--slo", type=float, default=2.0, help="queue-wait SLO in seconds (default 2)")
    p.add_argument("--rate-windows", type=_windows, default=None,
                   help="the controller's rate windows RATE,SHORT,SERVICE in seconds (default 60,30,120)")
    p.add_argument("--scrape-offset", type=_offset, default=0.0,
                   help="the first scrape this many seconds into the run (default 0)")
    p.add_argument("--sync-offset", type=_offset, default=None,
                   help="each controller sync this many seconds after a scrape (default half a scrape interval)")
    p.add_argument("--json", dest="json_out", required=True, help="write results here ('-' for stdout)")
    p.add_argument("--plot", help="write a PNG of replicas and queue over time")
    p.set_defaults(func=run)


def ours_config(args: argparse.Namespace):
    from autoscaler.policy import QueueDepthConfig

    return QueueDepthConfig(min_replicas=1 if args.min_replicas is None else args.min_replicas,
                            max_replicas=args.max_replicas, concurrency=args.concurrency,
                            cold_start_s=args.cold_start)


def build_policies(names: list[str], args: argparse.Namespace, arrivals, model,
                   peak: int) -> list[tuple[ReplicaPolicy, float | None]]:
    """(policy, its --target or None) per policy name (hpa and keda: per metric and target)."""
    from autoscaler.policy import HpaPolicy, KedaPolicy, KpaPolicy, QueueDepthPolicy, StaticPolicy

    from .autoscaling_oracle import oracle_policy

    targets = args.target
    floor = args.min_replicas
    out: list[tuple[ReplicaPolicy, float | None]] = []
    for name in names:
        if name == "ours":
            out.append((QueueDepthPolicy(ours_config(args)), None))
        elif name == "static":
            out.append((StaticPolicy(args.replicas or peak), None))
        elif name == "oracle":
            out.append((oracle_policy(arrivals, model), None))
        elif name in ("hpa", "keda", "kpa"):
            if not targets:
                raise ValueError(f"policy {name} needs --target (value per replica)")
            metrics: list[Metric] = ["queue" if m == "queue" else "inflight" for m in args.metric]
            for metric in (metrics if name != "kpa" else metrics[:1]):
                for t in targets:
                    if name == "hpa":
                        out.append((HpaPolicy(target=t, metric=metric, min_replicas=1 if floor is None else floor,
                                              max_replicas=args.max_replicas), t))
                    elif name == "keda":
                        out.append((KedaPolicy(target=t, metric=metric, min_replica_count=floor or 0,
                                               max_replica_count=args.max_replicas), t))
                    else:
                        out.append((KpaPolicy(target=t, min_scale=floor or 0, max_scale=args.max_replicas), t))
        else:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return out


def format_table(rows: list[dict]) -> str:
    floors = any(r.get("min_replicas") is not None for r in rows)  # a column only when some row has a floor
    settings = any(r.get("setting") for r in rows)
    head = (f"{'policy':<8} {'target':>7}" + (f" {'min':>4}" if floors else "")
            + (f" {'setting':<28}" if settings else "")
            + f" {'SLO attain':>10} {'p99 wait s':>11} {'GPU-h':>8} {'max repl':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        target = "" if r["target"] is None else f"{r['target']:g}"
        floor = f" {'' if r.get('min_replicas') is None else r['min_replicas']:>4}" if floors else ""
        setting = f" {r.get('setting') or '':<28}" if settings else ""
        lines.append(f"{r['policy']:<8} {target:>7}{floor}{setting} {100 * r['slo_attainment']:>9.2f}% "
                     f"{r['p99_queue_wait_s']:>11.1f} {r['gpu_replica_hours']:>8.2f} {r['max_replicas']:>8}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from autoscaler.policy import StaticPolicy
    from gpuaas.loadgen.serving import ServiceModel
    from gpuaas.loadgen.trace import TraceError, load_trace, scale_rate, window
    from gpuaas.simulate.autoscaling import RateWindows, peak_replicas, simulate

    from .autoscaling_oracle import warm_start_replicas
    from .autoscaling_search import Search, format_search, stderr_progress

    if not can_plot(args.plot, "autoscaling"):
        return 1
    if not args.search and not args.policy:
        print("gpuaas simulate autoscaling: give --policy or --search", file=sys.stderr)
        return 2
    names = [n.strip().lower() for n in (args.policy or "").split(",") if n.strip()]
    try:
        model = ServiceModel(concurrency=args.concurrency, prefill_tokens_per_s=args.prefill_tps,
                             decode_tokens_per_s=args.decode_tps, cold_start_s=args.cold_start,
                             scrape_interval_s=args.scrape_interval, slo_queue_wait_s=args.slo,
                             max_waiting=args.max_waiting)
        if args.preroll < 0:
            raise ValueError(f"--preroll must be >= 0, got {args.preroll:g}")
        arrivals = scale_rate(window(load_trace(args.trace), args.offset, args.duration, args.preroll),
                              args.rate_scale)
        if not arrivals:
            raise ValueError("the window holds no arrivals")
        counted = [a for a in arrivals if a.t >= args.preroll]
        peak = peak_replicas(counted or arrivals, model)
        policies = [] if args.search else build_policies(names, args, arrivals, model, peak)
    except (TraceError, ValueError, OSError) as exc:
        print(f"gpuaas simulate autoscaling: {exc}", file=sys.stderr)
        return 2
    meta = {"trace": str(args.trace), "rate_scale": args.rate_scale, "offset_s": args.offset,
            "duration_s": args.duration, "preroll_s": args.preroll, "static_peak_replicas": peak,
            "service_model": model.__dict__}
    if args.search:
        search = Search(arrivals, model, bar=args.bar, max_replicas=args.max_replicas, ours=ours_config(args),
                        warmup_s=args.preroll, progress=stderr_progress())
        result = search.search()
        write_json({**result, **meta}, args.json_out)
        if args.json_out != "-":
            print(format_search(result))
        return 0
    warm = warm_start_replicas(arrivals, model)
    results = []
    for policy, target in policies:
        initial = policy.replicas if isinstance(policy, StaticPolicy) else warm
        r = simulate(arrivals, policy, model, initial_replicas=initial, target=target, warmup_s=args.preroll,
                     warm=not args.fresh_memory, windows=args.rate_windows or RateWindows(),
                     scrape_offset_s=args.scrape_offset, sync_offset_s=args.sync_offset)
        results.append(r)
        print(f"{policy.name} {r.setting}: SLO {100 * r.slo_attainment:.2f}%, p99 wait {r.p99_queue_wait_s:.1f}s, "
              f"{r.gpu_replica_hours:.2f} GPU-h, max {r.max_replicas}", file=sys.stderr)
    rows = [r.summary() for r in results]
    meta["warm_start_replicas"] = warm
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
        label = r.policy + (f" {r.setting}" if r.setting else "")
        t = [x[0] / 60 for x in r.timeline]
        ax.plot(t, [x[1] for x in r.timeline], label=label, lw=1)
        bx.plot(t, [x[3] for x in r.timeline], label=label, lw=1)
    ax.set_ylabel("replicas asked for")
    bx.set_ylabel("requests waiting (scraped)")
    bx.set_xlabel("minutes (pre-roll included)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def register() -> None:
    from gpuaas.simulate.cli import SUBVERBS, register_subverb

    if "autoscaling" not in SUBVERBS:
        register_subverb("autoscaling", add_parser)


register()

"""`gpuaas simulate <sub-verb>`: offline what-if runs of the scoring core.

Sub-verbs register themselves in SUBVERBS (name -> function that adds its parser to the `simulate` sub-parsers and
sets `func`): another module adds its own by calling `register_subverb` at import time and being listed in
SUBVERB_MODULES (a listed module that does not exist yet is skipped).

    gpuaas simulate packing --nodes CSV --pods CSV --policy NAME[,NAME...] --seed N [--tune 1.3] --json OUT [--plot PNG]

JSON output: for one policy and seed, an object with `allocation_ratio` and `fragmentation_ratio` (keys "0".."130":
percent at that arrived percentage of cluster GPU capacity), `fragmentation_amount`, `failed_pods`, `pods`,
`wall_seconds`, `decision_ms` (p50, p99). Several policies or seeds: {"runs": [one such object per run]}.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable

from .output import can_plot, write_json, write_plot

SUBVERBS: dict[str, Callable[[argparse._SubParsersAction], None]] = {}
# Modules that contribute `gpuaas simulate <sub-verb>`s by calling register_subverb when imported.
SUBVERB_MODULES = ("gpuaas.simulate.autoscaling_cli",)


def register_subverb(name: str, add_parser: Callable[[argparse._SubParsersAction], None]) -> None:
    """Add a `gpuaas simulate <name>` sub-verb; `add_parser(subparsers)` must set `func` on its parser."""
    if SUBVERBS.get(name, add_parser) is not add_parser:
        raise ValueError(f"simulate sub-verb {name!r} already registered")
    SUBVERBS[name] = add_parser


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("simulate", help="offline simulations of gpuaas decisions",
                                   description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="simulate_verb", metavar="SUBVERB")
    for name in SUBVERB_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    for add_parser in SUBVERBS.values():
        add_parser(sub)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    if not out:
        raise argparse.ArgumentTypeError("no seed given")
    return out


def _add_packing(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("packing", help="static packing of a pod trace (the FGD evaluation protocol)",
                       description="Schedule a pod trace one by one on a cluster (no departures) and record the GPU "
                                   "allocation ratio at each arrived percentage 0..130.")
    p.add_argument("--nodes", required=True, help="node CSV (sn,cpu_milli,memory_mib,gpu,model)")
    p.add_argument("--pods", required=True, help="pod CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec])")
    p.add_argument("--policy", required=True, help="policy name, or several comma-separated (random, bestfit, fgd, "
                                                   "least-allocated, gpuaas)")
    p.add_argument("--seed", type=_seeds, default=[42], help="seed, list or range (42, 42,43, 42-51)")
    p.add_argument("--tune", type=float, default=1.3, help="inflate the pods to this multiple of GPU capacity")
    p.add_argument("--json", dest="json_out", help="write results here ('-' for stdout)")
    p.add_argument("--plot", help="write a PNG of allocation ratio vs arrived (policies side by side)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_packing)


def _progress_bar(label: str, stream=sys.stderr) -> Callable[[int, int], None]:
    start = time.perf_counter()

    def show(done: int, total: int) -> None:
        width = 30
        filled = width * done // total
        elapsed = time.perf_counter() - start
        stream.write(f"\r{label:<24} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {elapsed:5.1f}s")
        if done == total:
            stream.write("\n")
        stream.flush()

    return show


def run_packing(args: argparse.Namespace) -> int:
    from gpuaas.simulate.traces import TraceError, load_nodes, load_pods
    from scoring.policies import POLICIES
    from scoring.simulation import simulate

    policies = [p.strip().lower() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        print(f"gpuaas simulate packing: unknown policy {', '.join(unknown)}; known: {', '.join(POLICIES)}",
              file=sys.stderr)
        return 2
    if not can_plot(args.plot, "packing"):
        return 1
    try:
        nodes = load_nodes(args.nodes)
        pods = load_pods(args.pods)
    except (TraceError, OSError) as exc:
        print(f"gpuaas simulate packing: {exc}", file=sys.stderr)
        return 2
    results = []
    for policy in policies:
        for seed in args.seed:
            show = not args.quiet and sys.stderr.isatty()
            progress = _progress_bar(f"{policy} seed {seed}") if show else None
            r = simulate(nodes, pods, policy, seed, args.tune, progress=progress)
            alloc = r.allocation_ratio()
            results.append({
                "policy": policy, "seed": seed, "tune": args.tune, "nodes": args.nodes, "pods_csv": args.pods,
                "pods": r.pods, "failed_pods": r.failed, "total_gpus": r.total_gpu_milli // 1000,
                "wall_seconds": round(r.wall_seconds, 3),
                "decision_ms": {"p50": round(r.decision_ms(50), 4), "p99": round(r.decision_ms(99), 4)},
                "allocation_ratio": alloc,
                "fragmentation_ratio": r.fragmentation_ratio(),
                "fragmentation_amount": r.fragmentation_amount(),
            })
            print(f"{policy} seed {seed}: allocation {alloc.get('100')}% at 100% arrived, {alloc.get('130')}% at "
                  f"130%; {r.failed} failed; {r.wall_seconds:.1f}s; decision p50 {r.decision_ms(50):.3f} ms, "
                  f"p99 {r.decision_ms(99):.3f} ms", file=sys.stderr)
    payload = results[0] if len(results) == 1 else {"runs": results}
    if args.json_out:
        write_json(payload, args.json_out)
    return write_plot(plot_allocation, results, args.plot, "packing")


def plot_allocation(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    by_policy: dict[str, list[dict]] = {}
    for r in results:
        by_policy.setdefault(r["policy"], []).append(r)
    for policy, runs in by_policy.items():
        keys = sorted({int(k) for r in runs for k in r["allocation_ratio"]})
        mean = [sum(r["allocation_ratio"].get(str(k), 0.0) for r in runs) / len(runs) for k in keys]
        ax.plot(keys, mean, label=policy)
        bx.bar(policy, mean[-1])
        bx.text(policy, mean[-1], f"{mean[-1]:.2f}", ha="center", va="bottom")
    ax.plot([0, 130], [0, 130], color="grey", lw=0.5, ls="--")
    ax.set_xlabel("arrived GPU request (% of capacity)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.legend()
    bx.set_ylim(80, 100)
    bx.set_ylabel("allocation at the last point (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


register_subverb("packing", _add_packing)

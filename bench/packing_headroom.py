"""Where the unallocated GPU share sits at 130% arrived (FGD protocol), and how much any packing could do better.

    python bench/packing_headroom.py [--trace default] [--policies gpuaas,fgd] [--seeds 42-51] [--cut 95]

Prints JSON: one object per policy x seed, then one summary per policy.

Loss accounting (GPU-equivalents, at the end of the run):
  * idle: whole free GPUs, and partial remainders by size (0-99, 100-199, ... thousandths);
  * by node: idle on nodes where no arrived GPU pod shape fits because of CPU, because of memory, because of the GPUs
    themselves, and idle on nodes where some arrived shape still fits;
  * share patterns: what each shared GPU holds (e.g. [810] alone wastes 190) and the waste per pattern;
  * failed pods by kind and the first failure (pod index, arrived %).

Bounds (GPU dimension only; CPU, memory and node boundaries ignored, so both are optimistic):
  * `arrangement_bound`: the cutting-stock LP's least waste for exactly the shares this run placed, i.e. the best
    any arrangement of the same shares reaches (whole-GPU pods fill whole GPUs exactly);
  * `hindsight_bound`: per seed, policy-independent: shares that arrive before `--cut` % of capacity has arrived are
    mandatory, later shares optional. An online policy must also place a later share whenever it fits somewhere,
    which this bound does not ask, so it bounds every online policy that places everything arriving before the cut
    (check `first_share_failure.arrived_pct` >= the cut).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

import numpy as np

from bench.reproduce_fgd import DATA, parse_seeds
from gpuaas.simulate.traces import load_nodes, load_pods
from scoring.model import MILLI, PodDemand
from scoring.sharevalues import cutting_stock
from scoring.simulation import SimulationResult, simulate

TOP_PATTERNS = 12


def kind(pod: PodDemand) -> str:
    if pod.gpus == 0:
        return "cpu-only"
    if pod.is_share:
        return f"share-{pod.gpu_milli}"
    return f"{pod.gpus}-gpu"


def allocation_bound(waste_milli: float, capacity_milli: int) -> float:
    return round(100.0 * (1.0 - waste_milli / capacity_milli), 2)


def hindsight_bound(arrivals: list[PodDemand], capacity_milli: int, cut_pct: float) -> tuple[float, int]:
    """(allocation bound %, number of mandatory pods) for one arrival sequence."""
    cum = np.cumsum([p.total_gpu_milli for p in arrivals]) / capacity_milli * 100.0
    cut = int(np.searchsorted(cum, cut_pct))
    mandatory = Counter(p.gpu_milli for p in arrivals[:cut] if p.is_share)
    optional = Counter(p.gpu_milli for p in arrivals[cut:] if p.is_share)
    lp = cutting_stock(mandatory, {s: mandatory[s] + optional[s] for s in set(mandatory) | set(optional)})
    return allocation_bound(lp.waste_milli, capacity_milli), cut


def loss_accounting(r: SimulationResult) -> dict:
    state, node_of = r.final_state, r.node_of
    assert state is not None and node_of is not None, "simulate() sets both"
    cap = r.total_gpu_milli
    gl = state.gpu_left
    whole_free = gl == MILLI
    partial = (gl > 0) & (gl < MILLI)
    node_idle = gl.sum(axis=1)
    placed = node_of >= 0
    # Every arrived GPU pod shape, deduplicated: does it still fit a node by GPUs, CPU, memory?
    shapes = np.array(sorted({(p.cpu_milli, p.memory_mib, p.gpus, p.gpu_milli) for p in r.arrivals
                              if p.gpus and not p.mig_profile}), dtype=np.int64).reshape(-1, 4)
    share = shapes[:, 3] < MILLI
    gpu_fit = np.where(share[None, :], gl.max(axis=1)[:, None] >= shapes[None, :, 3],
                       whole_free.sum(axis=1)[:, None] >= shapes[None, :, 2])
    cpu_fit = state.cpu_left[:, None] >= shapes[None, :, 0]
    mem_fit = state.mem_left[:, None] >= shapes[None, :, 1]
    fits = (gpu_fit & cpu_fit & mem_fit).any(axis=1)
    gpu_ok = gpu_fit.any(axis=1)
    cpu_blocked = ~fits & gpu_ok & ~(gpu_fit & cpu_fit).any(axis=1)
    mem_blocked = ~fits & gpu_ok & ~cpu_blocked
    remainders = gl[partial]
    edges = np.arange(0, MILLI + 1, 100)
    hist = {f"{a}-{a + 99}": round(float(remainders[(remainders >= a) & (remainders < a + 100)].sum()) / MILLI, 2)
            for a in edges[:-1]}
    # What each shared GPU holds.
    content: dict[tuple[int, int], list[int]] = {}
    for node, pods in enumerate(state.pods_on):
        for pod, gpus in pods:
            if pod.is_share:
                content.setdefault((node, gpus[0]), []).append(pod.gpu_milli)
    patterns = Counter(tuple(sorted(v, reverse=True)) for v in content.values())
    by_waste = sorted(patterns.items(), key=lambda kv: -kv[1] * (MILLI - sum(kv[0])))
    failed = [p for p, n in zip(r.arrivals, node_of, strict=True) if n < 0]

    def first_failure(which: np.ndarray) -> dict | None:
        if not which.any():
            return None
        i = int(np.argmax(which))
        return {"pod": i, "kind": kind(r.arrivals[i]), "arrived_pct": round(float(r.arrived_milli[i]) / cap * 100, 2)}

    is_share = np.array([p.is_share for p in r.arrivals])
    shares_placed = Counter(p.gpu_milli for p, n in zip(r.arrivals, node_of, strict=True) if n >= 0 and p.is_share)
    arrangement = cutting_stock(shares_placed)
    g = lambda x: round(float(x) / MILLI, 2)  # noqa: E731 (thousandths -> GPUs)
    return {
        "allocation_130": r.allocation_ratio().get("130"),
        "final_allocation": round(100.0 * (1.0 - node_idle.sum() / cap), 2),
        "idle_gpus": g(node_idle.sum()),
        "whole_free_gpus": int(whole_free.sum()),
        "partial_remainders_gpus": hist,
        "idle_gpus_on_nodes": {"some_arrived_shape_fits": g(node_idle[fits].sum()),
                               "cpu_blocks_every_shape": g(node_idle[cpu_blocked].sum()),
                               "memory_blocks_every_shape": g(node_idle[mem_blocked].sum()),
                               "no_gpu_room_for_any_shape": g(node_idle[~fits & ~gpu_ok].sum())},
        "share_patterns": [{"gpu_holds": list(p), "gpus": n, "waste_gpus": g(n * (MILLI - sum(p)))}
                           for p, n in by_waste[:TOP_PATTERNS]],
        "shared_gpus": len(content),
        "share_waste_gpus": g(sum(n * (MILLI - sum(p)) for p, n in patterns.items())),
        "failed": dict(Counter(kind(p) for p in failed).most_common()),
        "first_failure": first_failure(~placed),
        "first_share_failure": first_failure(~placed & is_share),
        "arrangement_bound": {"waste_gpus": g(arrangement.waste_milli),
                              "allocation": allocation_bound(arrangement.waste_milli, cap)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="default")
    ap.add_argument("--policies", default="gpuaas,fgd")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--cut", type=float, default=95.0, help="arrived %% before which shares are mandatory (bound)")
    args = ap.parse_args()
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    pods = load_pods(DATA / f"openb_pod_list_{args.trace}.csv")
    seeds = parse_seeds(args.seeds)
    bounds: dict[int, tuple[float, int]] = {}
    summary: dict[str, list[dict]] = {}
    for policy in args.policies.split(","):
        for seed in seeds:
            r = simulate(nodes, pods, policy, seed)
            if seed not in bounds:  # the arrival sequence depends on the seed only
                bounds[seed] = hindsight_bound(r.arrivals, r.total_gpu_milli, args.cut)
            row = {"trace": args.trace, "policy": policy, "seed": seed, **loss_accounting(r),
                   "hindsight_bound": {"cut_arrived_pct": args.cut, "mandatory_pods": bounds[seed][1],
                                       "allocation": bounds[seed][0]},
                   "decision_ms_p50": round(r.decision_ms(50), 3), "decision_ms_p99": round(r.decision_ms(99), 3)}
            summary.setdefault(policy, []).append(row)
            print(json.dumps(row), flush=True)
    for policy, rows in summary.items():
        mean = lambda f, rows=rows: round(float(np.mean([f(x) for x in rows])), 3)  # noqa: E731
        print(json.dumps({"summary": True, "trace": args.trace, "policy": policy, "seeds": len(rows),
                          "allocation_130": mean(lambda x: x["allocation_130"]),
                          "idle_gpus": mean(lambda x: x["idle_gpus"]),
                          "share_waste_gpus": mean(lambda x: x["share_waste_gpus"]),
                          "arrangement_bound": mean(lambda x: x["arrangement_bound"]["allocation"]),
                          "hindsight_bound": mean(lambda x: x["hindsight_bound"]["allocation"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

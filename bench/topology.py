"""Topology benchmark: share of 2- and 4-GPU pods placed inside one NVLink/NUMA block, and allocation, per policy.

Cluster: the trace's 1213 nodes; 8-GPU boards are two NVLink blocks of 4 GPUs (HGX-style halves), smaller boards one
block. Pods: a multi-GPU-heavy trace (default: multigpu30), the FGD protocol (inflated to 130%, seeds). Prints JSON.

    python bench/topology.py [--trace multigpu30] [--seeds 42-44] [--policies gpuaas,least-allocated,bestfit]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from gpuaas.simulate.traces import load_nodes, load_pods
from scoring.simulation import simulate

DATA = Path("/work/shared/data/alibaba-gpu-2023")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="multigpu30")
    ap.add_argument("--seeds", default="42-44")
    ap.add_argument("--policies", default="gpuaas,least-allocated,bestfit,fgd")
    args = ap.parse_args()
    a, _, b = args.seeds.partition("-")
    seeds = list(range(int(a), int(b or a) + 1))
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    pods = load_pods(DATA / f"openb_pod_list_{args.trace}.csv")
    for policy in args.policies.split(","):
        inside: dict[int, list[float]] = {2: [], 4: []}
        alloc100, alloc130, decide = [], [], []
        for seed in seeds:
            counts = {2: [0, 0], 4: [0, 0]}

            def on_place(state, node, pod, gpus, counts=counts):
                if pod.gpus in counts and pod.gpu_milli == 1000:
                    blocks = {int(state.block[node, g]) for g in gpus}
                    counts[pod.gpus][0] += len(blocks) == 1
                    counts[pod.gpus][1] += 1

            r = simulate(nodes, pods, policy, seed, on_place=on_place)
            for k in (2, 4):
                inside[k].append(counts[k][0] / max(1, counts[k][1]))
            alloc = r.allocation_ratio()
            alloc100.append(alloc["100"])
            alloc130.append(alloc["130"])
            decide.append(r.decision_ms(99))
        print(json.dumps({
            "trace": args.trace, "policy": policy, "seeds": seeds,
            "two_gpu_in_one_block_pct": round(100 * float(np.mean(inside[2])), 2),
            "four_gpu_in_one_block_pct": round(100 * float(np.mean(inside[4])), 2),
            "allocation_100": round(float(np.mean(alloc100)), 2),
            "allocation_130": round(float(np.mean(alloc130)), 2),
            "decision_ms_p99": round(float(np.mean(decide)), 3),
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

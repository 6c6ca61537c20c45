"""Time one joint plan of a burst's pending GPU pods (scoring.queueplan.plan_queue, what the extender runs every
queue_plan_refresh_seconds while many pods wait): the same slices and pods as bench/extender_replay.py (the Alibaba
trace inflated to --tune x the slice's GPUs, shuffled by the seed), all GPU pods queued at once. Prints JSON: per
slice and seed, pods queued and planned, the median of three plans, and the time per queued pod.

    python bench/queue_plan.py --nodes CSV --pods CSV [--slices 100,200] [--seeds 42-44] [--tune 1.5]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import numpy as np

from gpuaas.simulate.traces import load_nodes, load_pods
from scoring.fragmentation import Workload
from scoring.model import ClusterState
from scoring.queueplan import QueuedPod, plan_queue
from scoring.simulation import inflate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", required=True, help="openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", required=True, help="openb_pod_list_default.csv")
    parser.add_argument("--slices", default="100,200")
    parser.add_argument("--seeds", default="42-44")
    parser.add_argument("--tune", type=float, default=1.5)
    parser.add_argument("--policy", default="gpuaas")
    parser.add_argument("--window", type=int, default=64, help="the extender's queue_plan_window (0: whole queue)")
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    seeds = range(int(first), int(last or first) + 1)
    all_nodes, trace = load_nodes(args.nodes), load_pods(args.pods)
    out = []
    for size in (int(s) for s in args.slices.split(",")):
        for seed in seeds:
            nodes = random.Random(seed).sample(all_nodes, size)  # the slice extender_replay.py takes
            pods = inflate(trace, ClusterState(nodes).total_gpu_milli, args.tune, np.random.default_rng(seed))
            queue = [QueuedPod(f"p{i:05d}", p, 0.0) for i, p in enumerate(pods) if p.gpus]
            workload = Workload.typical(pods)
            seconds = []
            for _ in range(3):
                started = time.perf_counter()
                plan = plan_queue(ClusterState(nodes), args.policy, workload, queue, now=0.0, max_wait_s=120.0,
                                  window=args.window)
                seconds.append(time.perf_counter() - started)
            median = statistics.median(seconds)
            out.append({"slice_nodes": size, "seed": seed, "queued_gpu_pods": len(queue),
                        "planned": len(plan.planned), "plan_seconds_median": round(median, 3),
                        "ms_per_queued_pod": round(1000 * median / len(queue), 3)})
    print(json.dumps({"bench": "queue_plan", "policy": args.policy, "tune": args.tune, "window": args.window,
                      "runs": out}, indent=2))


if __name__ == "__main__":
    main()

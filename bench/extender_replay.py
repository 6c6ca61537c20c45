"""Replay Alibaba trace pods into a KWOK slice of the trace's cluster through the real kube-scheduler and the gpuaas
extender, and compare the GPU allocation ratio with `gpuaas simulate packing`'s engine on the same slice and pods.

Both sides get the same pod list: the trace inflated to `--tune` x the slice's GPU capacity and shuffled by the seed,
exactly as the simulator does it (scoring.simulation.inflate with the seed's first random draws). The simulator places
them one by one; the cluster gets them all at once with the scheduler stopped, in order (the scheduler's queue takes
them in creation order), then the scheduler starts and the run ends when every pod is bound or unschedulable.
Prints JSON. Usage:
  python bench/extender_replay.py --nodes CSV --pods CSV [--slice 200] [--tune 1.5] [--seed 42] [--policy gpuaas]
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from kubernetes import client

from extender.schedconfig import extender_entry, gpuaas_profile
from gpuaas.cluster.components import extender_process
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.process import free_port
from gpuaas.simulate.traces import load_nodes, load_pods
from gpuaas.workloads import pod_for_demand
from runtime.pools import pools_from_node_specs
from scoring.kubeobjects import pod_demand
from scoring.model import ClusterState
from scoring.simulation import inflate, simulate

NAMESPACE = "replay"


def kind(pod) -> str:
    return "cpu-only" if not pod.gpus else "gpu-share" if pod.is_share else f"{pod.gpus}-gpu"


def settled(core: client.CoreV1Api) -> tuple[int, int, list[dict]]:
    """(bound, unschedulable, pods) right now."""
    pods = json.loads(core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)["items"]
    bound = sum(1 for p in pods if p["spec"].get("nodeName"))
    stuck = sum(1 for p in pods if not p["spec"].get("nodeName") and any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in p.get("status", {}).get("conditions") or ()))
    return bound, stuck, pods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", required=True, help="openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", required=True, help="openb_pod_list_default.csv")
    parser.add_argument("--slice", type=int, default=200, help="nodes sampled from the cluster")
    parser.add_argument("--tune", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--policy", default="gpuaas")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--gpu-only", action="store_true", help="leave CPU-only pods out of the replay")
    parser.add_argument("--all-pods", action="store_true",
                        help="send CPU-only pods to the extender too (extender_entry(all_pods=True))")
    parser.add_argument("--workdir", type=Path, help="keep the cluster's logs here (default: a temporary folder)")
    args = parser.parse_args()

    all_nodes = load_nodes(args.nodes)
    nodes = random.Random(args.seed).sample(all_nodes, args.slice)
    spec = pools_from_node_specs(nodes)
    trace = load_pods(args.pods)
    if args.gpu_only:
        trace = [p for p in trace if p.gpus]
    capacity = ClusterState(nodes).total_gpu_milli
    pods = inflate(trace, capacity, args.tune, np.random.default_rng(args.seed))

    placed_in_sim: Counter = Counter()
    sim = simulate(nodes, trace, args.policy, args.seed, tune=args.tune,
                   on_place=lambda state, node, pod, gpus: placed_in_sim.update([kind(pod)]))
    assert sim.pods == len(pods), "the replay must see the simulator's pod list"
    sim_ratio = 100.0 * sim.used_milli[-1] / sim.total_gpu_milli

    with tempfile.TemporaryDirectory(prefix="gpuaas-replay-") as tmp:
        workdir = args.workdir or Path(tmp)
        port = free_port()
        cluster = LocalCluster(workdir, name="replay",
                               extenders=[extender_entry(f"http://127.0.0.1:{port}", all_pods=args.all_pods)],
                               scheduler_profiles=[gpuaas_profile("default-scheduler", all_pods=args.all_pods)])
        ext = extender_process(workdir, cluster.kubeconfig, policy=args.policy, port=port)
        try:
            cluster.up(spec, timeout=300)
            ext.start(timeout=60)
            core = client.CoreV1Api(cluster.api)
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            cluster.control_plane.stop_scheduler()
            with ThreadPoolExecutor(16) as ex:
                list(ex.map(lambda i: core.create_namespaced_pod(
                    NAMESPACE, pod_for_demand(f"p{i:05d}", NAMESPACE, pods[i]), _preload_content=False),
                    range(len(pods))))
            time.sleep(2)  # let the extender see the arrivals (its workload estimate) before scheduling starts
            t0 = time.monotonic()
            cluster.control_plane.start_scheduler()
            while True:
                bound, stuck, objs = settled(core)
                if bound + stuck == len(pods):
                    break
                if time.monotonic() - t0 > args.timeout:
                    raise SystemExit(f"not settled after {args.timeout}s: {bound} bound, {stuck} unschedulable")
                time.sleep(1)
            elapsed = time.monotonic() - t0
            with urllib.request.urlopen(f"{ext.url}/metrics", timeout=5) as resp:
                decisions = {line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
                             for line in resp.read().decode().splitlines()
                             if line.startswith("gpuaas_extender_decisions_total{")}
        finally:
            ext.stop()
            cluster.down()

    used = sum(pod_demand(p).total_gpu_milli for p in objs if p["spec"].get("nodeName"))
    arrived = Counter(kind(p) for p in pods)
    placed_in_k8s = Counter(kind(pod_demand(p)) for p in objs if p["spec"].get("nodeName"))
    k8s_ratio = 100.0 * used / capacity
    print(json.dumps({
        "bench": "extender_replay", "policy": args.policy, "cpu_only_pods_sent_to_extender": args.all_pods,
        "gpu_only": args.gpu_only, "seed": args.seed, "slice_nodes": args.slice,
        "slice_gpus": capacity // 1000, "pods": len(pods), "tune": args.tune,
        "simulator": {"allocation_ratio": round(sim_ratio, 2), "failed_pods": sim.failed},
        "kubernetes": {"allocation_ratio": round(k8s_ratio, 2), "unschedulable_pods": stuck,
                       "bound_pods": bound, "seconds": round(elapsed, 1)},
        "difference_points": round(k8s_ratio - sim_ratio, 2), "target_abs_difference": 1.0,
        "extender_decisions": decisions,
        "failed_by_kind": {k: {"simulator": arrived[k] - placed_in_sim[k], "kubernetes": arrived[k] - placed_in_k8s[k],
                               "arrived": arrived[k]} for k in sorted(arrived)},
    }, indent=2))


if __name__ == "__main__":
    main()

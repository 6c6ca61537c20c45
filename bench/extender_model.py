"""The extender's model at scale: what a node event costs and how much memory the model and its caches take.

A ClusterView (the extender's live model) is fed N nodes (bench/extender_latency.py's fleet: 8-GPU A100 and H100, a
MIG pool, 4-GPU L40S) and P bound pods, as its informers would deliver them: on every node GPU pods (1 GPU each, with
their gpuaas.io/devices) on half its GPUs (none on the MIG pool) and CPU-only pods up to P / N per node.
Then, each timed `--events` times, from the event to the model the next request sees (`snapshot()`):
  node_added            a new 8-GPU node
  node_removed          that node deleted again
  label_changed_spec    a node's gpuaas.io/pool label changed (part of its NodeSpec: node group)
  label_changed_other   a label the model does not read (a heartbeat-like update)
  pod_bound             a 1-GPU pod bound with its devices (the in-place path, for comparison)
RSS of the process (VmRSS) is printed before the objects are built, after they are, and with the model built.
Usage: python bench/extender_model.py [--nodes 5000] [--pods 50000] [--events 5]
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import time
from pathlib import Path

from bench.extender_latency import cluster
from gpuaas.workloads import gpu_pod
from scoring.clusterview import ClusterView
from scoring.kubeobjects import DEVICES_ANNOTATION


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS in /proc/self/status")


def bound_pods(nodes: list[dict], per_node: int) -> list[dict]:
    pods = []
    for node in nodes:
        name = node["metadata"]["name"]
        gpus = 0 if name.startswith("mig") else int(node["status"]["allocatable"].get("nvidia.com/gpu", "0"))
        for i in range(per_node):
            pod = (gpu_pod(f"{name}-g{i}", "bench", gpus=1, cpu="2", memory="8Gi") if i < gpus // 2
                   else gpu_pod(f"{name}-c{i}", "bench", cpu="1", memory="1Gi"))
            pod["metadata"]["uid"] = f"uid-{name}-{i}"
            pod["spec"]["nodeName"] = name
            pod["status"] = {"phase": "Running"}
            if i < gpus // 2:
                pod["metadata"]["annotations"] = {DEVICES_ANNOTATION: str(i)}
            pods.append(pod)
    return pods


def timed(view: ClusterView, kind: str, old: dict | None, new: dict | None) -> float:
    t0 = time.perf_counter()
    view.on_change(kind, old, new)
    view.snapshot()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--events", type=int, default=5)
    args = parser.parse_args()
    rss_start = rss_mib()
    nodes, _ = cluster(args.nodes, 1)
    pods = bound_pods(nodes, max(1, args.pods // len(nodes)))
    rss_objects = rss_mib()
    view = ClusterView("gpuaas")
    t0 = time.perf_counter()
    for n in nodes:
        view.on_change("Node", None, n)
    for p in pods:
        view.on_change("Pod", None, p)
    view.snapshot()
    build_s = time.perf_counter() - t0
    gc.collect()
    rss_model = rss_mib()
    times: dict[str, list[float]] = {k: [] for k in ("node_added", "node_removed", "label_changed_spec",
                                                     "label_changed_other", "pod_bound")}
    template = next(n for n in nodes if n["metadata"]["name"].startswith("a100"))
    victim = nodes[len(nodes) // 2]
    for e in range(args.events):
        extra = copy.deepcopy(template)
        extra["metadata"]["name"] = f"zz-extra-{e}"
        extra["metadata"]["labels"]["kubernetes.io/hostname"] = f"zz-extra-{e}"
        times["node_added"].append(timed(view, "Node", None, extra))
        times["node_removed"].append(timed(view, "Node", extra, None))
        relabelled = copy.deepcopy(victim)
        relabelled["metadata"]["labels"]["gpuaas.io/pool"] = f"moved-{e}"
        times["label_changed_spec"].append(timed(view, "Node", victim, relabelled))
        victim = relabelled
        other = copy.deepcopy(victim)
        other["metadata"]["labels"]["example.com/heartbeat"] = str(e)
        times["label_changed_other"].append(timed(view, "Node", victim, other))
        victim = other
        pod = gpu_pod(f"extra-{e}", "bench", gpus=1, cpu="1", memory="1Gi")
        pod["metadata"]["uid"] = f"uid-extra-{e}"
        pod["spec"]["nodeName"] = template["metadata"]["name"]
        pod["status"] = {"phase": "Running"}
        times["pod_bound"].append(timed(view, "Pod", None, pod))
        view.on_change("Pod", pod, None)

    def ms(xs: list[float]) -> dict[str, float]:
        return {"median": round(1000 * statistics.median(xs), 2), "max": round(1000 * max(xs), 2)}

    print(json.dumps({"bench": "extender_model", "nodes": len(nodes), "bound_pods": len(pods),
                      "gpu_pods": sum(1 for p in pods if p["metadata"].get("annotations")),
                      "model_build_s": round(build_s, 2), "target_node_event_ms": 5.0,
                      "event_to_model_ms": {k: ms(v) for k, v in times.items()},
                      "rebuilds": view.rebuilds,
                      "rss_mib": {"start": rss_start, "with_node_and_pod_objects": rss_objects,
                                  "with_the_model_built": rss_model,
                                  "objects_and_model": round(rss_model - rss_start, 1)}}, indent=2))


if __name__ == "__main__":
    main()

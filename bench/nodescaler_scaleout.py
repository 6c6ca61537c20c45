"""Scale-out latency of `gpuaas nodescaler` in a KWOK cluster of N GPU nodes (default 1,000), printed as JSON.

The cluster: N A100x8 nodes, each already running a 6-GPU pod (so no 8-GPU pod fits anywhere), the fake MIG manager /
device plugin, the nodescaler as its own process (groups a100x8 20/h, h100x8 32/h, a100x4 11/h). Then a Deployment of
50 eight-GPU pods. Measured:

- per pod: from its PodScheduled=False lastTransitionTime (whole seconds, truncated: over-states the latency by up to
  1 s) to the grow request that gave it a node, matching pods and new nodes first come, first served (the pods are
  interchangeable: the k-th pod to turn unschedulable is served by the k-th node requested); request times are the
  `gpuaas.io/requested-at` annotation the KWOK provider writes on each node (milliseconds);
- the same from the eventTime of each pod's first FailedScheduling event (microseconds; kube-scheduler records it
  with the condition), the precise figure;
- the number of grow requests and the groups grown;
- the time until all 50 pods are Running (includes the 1 s provisioning delay of the group);
- the nodescaler's own scale-up latency histogram (same definition, from /metrics).

    python bench/nodescaler_scaleout.py [--nodes 1000] [--pods 50]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuaas.cluster.components import ComponentProcess
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.migmanager import FakeNodeAgent
from gpuaas.workloads import gpu_deployment
from nodescaler.provider import REQUESTED_AT_ANNOTATION
from runtime.pools import parse_pool_spec
from scoring.kubeobjects import POOL_LABEL
from tests.nodescaler.checks import failed_scheduling_times, fifo_latencies

A100X8 = {"gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"}


def running(core, ns, app) -> int:
    return sum(1 for p in core.list_namespaced_pod(ns, label_selector=f"app={app}").items
               if p.status.phase == "Running")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=50)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="nodescaler-bench-"))
    cluster = LocalCluster(workdir, name="nsbench")
    out: dict = {"nodes": args.nodes, "pods": args.pods}
    agent = scaler = None
    try:
        out["cluster_up"] = cluster.up(parse_pool_spec({"pools": [{"name": "base", "count": args.nodes, **A100X8}]}),
                                       timeout=600)
        core, apps = client.CoreV1Api(cluster.api), client.AppsV1Api(cluster.api)
        agent = FakeNodeAgent(cluster.api, interval=0.5).start()
        core.create_namespace({"metadata": {"name": "bench"}})
        t0 = time.monotonic()
        apps.create_namespaced_deployment("bench", gpu_deployment("filler", "bench", replicas=args.nodes, gpus=6))
        while running(core, "bench", "filler") < args.nodes:
            if time.monotonic() - t0 > 900:
                raise TimeoutError("filler pods not Running")
            time.sleep(2)
        out["filler_running_s"] = round(time.monotonic() - t0, 1)
        cfg = {"interval_s": 5, "groups": [
            {"name": "a100x8", "template": A100X8, "max_size": 200, "provisioning_delay_s": 1, "cost_per_hour": 20},
            {"name": "h100x8", "template": {**A100X8, "gpu": {"model": "H100-80GB", "count": 8}}, "max_size": 200,
             "provisioning_delay_s": 1, "cost_per_hour": 32},
            {"name": "a100x4", "template": {**A100X8, "gpu": {"model": "A100-80GB", "count": 4}}, "max_size": 200,
             "provisioning_delay_s": 1, "cost_per_hour": 11}],
            "scale_in": {"enabled": False}, "leader_election": {"namespace": "default"}}
        (workdir / "nodescaler.yaml").write_text(yaml.safe_dump(cfg))
        scaler = ComponentProcess("gpuaas-nodescaler", [], workdir)
        scaler.args = ["nodescaler", "--config", str(workdir / "nodescaler.yaml"), "--kubeconfig",
                       str(cluster.kubeconfig), "--host", "127.0.0.1", "--port", str(scaler.port)]
        scaler.start(timeout=120)
        time.sleep(3)  # leader election, informers synced
        t0 = time.monotonic()
        apps.create_namespaced_deployment("bench", gpu_deployment("big", "bench", replicas=args.pods, gpus=8))
        unsched: dict[str, float] = {}
        while True:
            pods = core.list_namespaced_pod("bench", label_selector="app=big").items
            for p in pods:
                for c in p.status.conditions or ():
                    if c.type == "PodScheduled" and c.status == "False":
                        unsched.setdefault(p.metadata.name, c.last_transition_time.timestamp())
            if sum(1 for p in pods if p.status.phase == "Running") == args.pods:
                break
            if time.monotonic() - t0 > 600:
                raise TimeoutError("big pods not Running")
            time.sleep(0.2)
        out["all_running_s"] = round(time.monotonic() - t0, 2)
        new = list(core.list_node(label_selector="gpuaas.io/provisioned-by").items)
        grows = sorted({float(n.metadata.annotations[REQUESTED_AT_ANNOTATION]) for n in new})
        groups: dict[str, int] = {}
        for n in new:
            g = n.metadata.labels[POOL_LABEL]
            groups[g] = groups.get(g, 0) + 1
        requested = [float(n.metadata.annotations[REQUESTED_AT_ANNOTATION]) for n in new]
        lat = fifo_latencies(list(unsched.values()), requested)
        failed = failed_scheduling_times(cluster.api, "bench", "big-")
        lat_ev = fifo_latencies(list(failed.values()), requested)
        out["from_failed_scheduling_event_s"] = {
            "min": round(min(lat_ev), 3), "median": round(statistics.median(lat_ev), 3), "max": round(max(lat_ev), 3),
            "n": len(lat_ev),
            # The target the end-to-end scale-out test used to assert on a shared machine: every pod within 2 s.
            "target_max_s": 2.0, "within_target": sum(1 for x in lat_ev if x <= 2.0)} if lat_ev else None
        out.update({
            "new_nodes_by_group": groups, "grow_requests": len(grows), "pods_seen_unschedulable": len(unsched),
            "unschedulable_to_grow_request_s": {"min": round(min(lat), 3), "median": round(statistics.median(lat), 3),
                                                "max": round(max(lat), 3), "n": len(lat)} if lat else None,
            "first_unschedulable_to_first_grow_s": round(grows[0] - min(unsched.values()), 3) if grows else None,
        })
        with urllib.request.urlopen(f"{scaler.url}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        out["nodescaler_metrics"] = [line for line in metrics.splitlines()
                                     if line.startswith(("gpuaas_nodescaler_scale_up_latency_seconds_sum",
                                                         "gpuaas_nodescaler_scale_up_latency_seconds_count",
                                                         "gpuaas_nodescaler_reconcile_duration_seconds_sum",
                                                         "gpuaas_nodescaler_reconcile_duration_seconds_count"))]
    finally:
        if scaler:
            scaler.stop()
        if agent:
            agent.stop()
        cluster.down()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

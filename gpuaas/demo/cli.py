"""`gpuaas demo`: the platform on a local KWOK cluster, end to end.

Today it brings up the demo fleet (A100 and H100 pools, one MIG-partitioned A100 pool), submits a handful of GPU
workloads through the real kube-scheduler and prints where each one landed, and why the ones left Pending are waiting.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from .cluster.cli import cluster_dir
from extender.schedconfig import extender_entry, gpuaas_profile

from .cluster.components import extender_process
from .cluster.controlplane import ControlPlaneError
from .cluster.process import free_port
from .cluster.local import LocalCluster, resolve_pool_spec
from .cluster.pools import PoolSpecError
from .cluster.tools import ToolsMissing
from .workloads import gpu_deployment, gpu_pod

NAMESPACE = "demo"


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    objects: tuple[dict[str, Any], ...]


def demo_workloads(ns: str = NAMESPACE) -> list[Workload]:
    return [
        Workload("pretrain", "8 GPUs", (gpu_pod("pretrain", ns, gpus=8, cpu="64", memory="512Gi"),)),
        Workload("finetune-a", "4 GPUs", (gpu_pod("finetune-a", ns, gpus=4, cpu="32", memory="256Gi"),)),
        Workload("finetune-b", "4 GPUs", (gpu_pod("finetune-b", ns, gpus=4, cpu="32", memory="256Gi"),)),
        Workload("eval", "2 GPUs, done after 20s", (gpu_pod("eval", ns, gpus=2, complete_after="20s"),)),
        Workload("notebook", "1 GPU", (gpu_pod("notebook", ns, gpus=1),)),
        Workload("llm-serve", "Deployment, 3 x 1 GPU", (gpu_deployment("llm-serve", ns, replicas=3, gpus=1),)),
        Workload("embed", "MIG 1g.10gb", (gpu_pod("embed", ns, mig="1g.10gb"),)),
        Workload("rerank", "MIG 2g.20gb", (gpu_pod("rerank", ns, mig="2g.20gb"),)),
        Workload("chat-small", "MIG 3g.40gb", (gpu_pod("chat-small", ns, mig="3g.40gb"),)),
        Workload("too-big", "16 GPUs in one pod", (gpu_pod("too-big", ns, gpus=16),)),
    ]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="run the platform demo on a local KWOK GPU cluster")
    parser.add_argument("--pools", default="demo", help="pool spec (file or built-in name); default: %(default)s")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running (stop it with "
                                                             "`gpuaas cluster down --name demo`)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for workloads to settle")
    parser.add_argument("--scheduler", choices=("gpuaas", "default"), default="gpuaas",
                        help="gpuaas: kube-scheduler calls the gpuaas extender (default); default: kube-scheduler "
                             "alone, for comparison")
    parser.set_defaults(func=run)


def submit(api: client.ApiClient, objects: list[dict[str, Any]]) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    for obj in objects:
        ns = obj["metadata"]["namespace"]
        if obj["kind"] == "Pod":
            core.create_namespaced_pod(ns, obj)
        elif obj["kind"] == "Deployment":
            apps.create_namespaced_deployment(ns, obj)
        else:
            raise ValueError(f"demo cannot submit a {obj['kind']}")


def _settled(pods: list[client.V1Pod]) -> bool:
    # Settled: every pod is bound and running or done, or the scheduler has said why it cannot be.
    return all(p.status.phase in ("Running", "Succeeded") or
               any(c.type == "PodScheduled" and c.status == "False" for c in p.status.conditions or ())
               for p in pods)


def placement_table(api: client.ApiClient, ns: str = NAMESPACE) -> list[dict[str, str]]:
    core = client.CoreV1Api(api)
    nodes = {n.metadata.name: n for n in core.list_node().items}
    rows = []
    for pod in sorted(core.list_namespaced_pod(ns).items, key=lambda p: p.metadata.name):
        node = nodes.get(pod.spec.node_name or "")
        requests = pod.spec.containers[0].resources.limits or {}
        gpu_request = ", ".join(f"{k.removeprefix('nvidia.com/')}={v}" for k, v in requests.items()) or "-"
        reason = ""
        if pod.status.phase == "Pending":
            events = core.list_namespaced_event(
                ns, field_selector=f"involvedObject.name={pod.metadata.name},reason=FailedScheduling").items
            reason = _short_reason(events[-1].message) if events else "waiting for the scheduler"
        rows.append({
            "pod": pod.metadata.name,
            "request": gpu_request,
            "node": pod.spec.node_name or "-",
            "gpu": node.metadata.labels.get("nvidia.com/gpu.product", "-") if node else "-",
            "phase": pod.status.phase,
            "reason": reason,
        })
    return rows


def _short_reason(message: str) -> str:
    """The scheduler's verdict without its preemption and DRA postscripts."""
    head = message.split(" preemption:")[0].replace(" no new claims to deallocate,", "")
    return head.rstrip(" ,.") + "."


def summary(api: client.ApiClient, rows: list[dict[str, str]], scheduler: str) -> str:
    """What the placement leaves for the next big job: GPU nodes left completely free."""
    nodes = [n for n in client.CoreV1Api(api).list_node().items
             if int(n.status.allocatable.get("nvidia.com/gpu", "0")) > 0]
    busy = {r["node"] for r in rows if r["phase"] in ("Running", "Pending") and r["node"] != "-"}
    free = [n.metadata.name for n in nodes if n.metadata.name not in busy]
    return (f"\nscheduler: {scheduler}; whole-GPU nodes left completely free for 8-GPU jobs: {len(free)} of "
            f"{len(nodes)} ({', '.join(free) or 'none'})")


def print_table(rows: list[dict[str, str]], out=sys.stdout) -> None:
    cols = ("pod", "request", "node", "gpu", "phase")
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    print("  ".join(c.upper().ljust(widths[c]) for c in cols), file=out)
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in cols), file=out)
        if r["reason"]:
            print(f"    why pending: {r['reason']}", file=out)


def run(args: argparse.Namespace) -> int:
    try:
        pools = resolve_pool_spec(args.pools)
    except PoolSpecError as err:
        print(f"gpuaas demo: {err}", file=sys.stderr)
        return 2
    workdir: Path = cluster_dir("demo")
    if workdir.exists() and not (workdir / "state.json").exists():
        shutil.rmtree(workdir)  # the previous demo's logs
    port = free_port()
    with_gpuaas = args.scheduler == "gpuaas"
    cluster = LocalCluster(workdir, name="demo", owned=not args.keep,
                           extenders=[extender_entry(f"http://127.0.0.1:{port}")] if with_gpuaas else None,
                           scheduler_profiles=[gpuaas_profile("default-scheduler")] if with_gpuaas else None)
    extender = extender_process(workdir, cluster.kubeconfig, port=port) if with_gpuaas else None
    try:
        print(f"starting a local control plane with {pools.node_count} KWOK GPU nodes ...", flush=True)
        timings = cluster.up(pools)
        print(f"cluster ready in {timings['total_s']:.1f}s; kubeconfig {cluster.kubeconfig}", flush=True)
        if extender:
            extender.start()
            print(f"gpuaas extender serving kube-scheduler at {extender.url} (log {extender.log})", flush=True)
        client.CoreV1Api(cluster.api).create_namespace({"metadata": {"name": NAMESPACE}})
        workloads = demo_workloads()
        for w in workloads:
            print(f"  submit {w.name:<12} {w.what}")
        submit(cluster.api, [o for w in workloads for o in w.objects])
        deadline = time.monotonic() + args.timeout
        core = client.CoreV1Api(cluster.api)
        expected = sum(o["spec"].get("replicas", 1) for w in workloads for o in w.objects)
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(NAMESPACE).items
            if len(pods) >= expected and _settled(pods):
                break
            time.sleep(0.5)
        print()
        rows = placement_table(cluster.api)
        print_table(rows)
        print(summary(cluster.api, rows, args.scheduler))
        if args.keep:
            print(f"\nthe cluster keeps running: export KUBECONFIG={cluster.kubeconfig}; "
                  f"stop it with `gpuaas cluster down --name demo`"
                  + (" (the extender stops when this command exits: GPU pods created later stay Pending)"
                     if extender else ""))
        return 0
    except (ToolsMissing, ControlPlaneError, TimeoutError) as err:
        print(f"gpuaas demo: {err}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            if extender:
                extender.stop()
            cluster.down()

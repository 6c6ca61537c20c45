"""kube-scheduler's throughput on a KWOK cluster with the gpuaas extender, as a ratio to the same run without it.

Both runs, in one invocation: a fresh cluster of N 8-GPU nodes; kube-scheduler is stopped, P GPU pods (1, 2 or 4
GPUs) are created, the scheduler is started and the clock runs until every pod is bound. Pods per second = P / that
time. Run A: the default scheduler. Run B: the same scheduler calling the extender (filter, prioritize, bind) with the
gpuaas profile. Run C: the default scheduler at the gpuaas profile's percentageOfNodesToScore, without the extender
(`ratio` is B/A, `ratio_to_same_sampling` B/C). Prints JSON.
Usage: python bench/scheduler_throughput.py [--nodes 1000] [--pods 3000]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from extender.schedconfig import extender_entries, gpuaas_profile
from gpuaas.cluster.components import extender_process
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.process import free_port
from gpuaas.workloads import gpu_pod
from runtime.pools import parse_pool_spec


def pools(nodes: int) -> dict:
    half = nodes // 2
    return {"pools": [
        {"name": "a100", "count": half, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"},
        {"name": "h100", "count": nodes - half, "gpu": {"model": "H100-80GB", "count": 8}, "cpu": "128",
         "memory": "1Ti"},
    ]}


def unbound(core: client.CoreV1Api, namespace: str) -> int:
    resp = core.list_namespaced_pod(namespace, field_selector="spec.nodeName=", _preload_content=False)
    return len(json.loads(resp.data)["items"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (what each component costs during the run)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)


def apiserver_requests(cluster: LocalCluster) -> Counter:
    """apiserver_request_total by verb/resource/subresource: where the apiserver's time goes."""
    text = cluster.control_plane.kubectl("get", "--raw", "/metrics").stdout
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.index("}")].split(","))
            key = "/".join(v.strip('"') for v in (labels.get("verb", ""), labels.get("resource", ""),
                                                 labels.get("subresource", "")) if v.strip('"'))
            out[key] += int(float(line.rsplit(" ", 1)[1]))  # a counter: whole requests
    return out


def one_run(nodes: int, pods: int, seed: int, with_extender: bool, timeout: float,
            sample_percent: int | None = None, *, cpu_entry: bool = False, all_pods: bool = False,
            cpu_share: float = 0.0) -> dict:
    """`cpu_entry`: with the CPU-pod entry as deploy/ ships it (extender.schedconfig.cpu_pods_entry) beside the GPU
    pods' entry. `all_pods`: every pod through the GPU entry's filter, prioritize and bind instead (the other scheme).
    `cpu_share`: this fraction of the pods asks for no GPU (2 cores, 4Gi)."""
    with tempfile.TemporaryDirectory(prefix="gpuaas-tput-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        extenders = (extender_entries(f"http://127.0.0.1:{port}", cpu_pods=cpu_entry, all_pods=all_pods)
                     if with_extender else None)
        profiles = None
        if with_extender or sample_percent is not None:
            profile: dict[str, Any] = (gpuaas_profile("default-scheduler", all_pods=all_pods) if with_extender
                                       else {"schedulerName": "default-scheduler"})
            if sample_percent is not None:  # 0: kube-scheduler's adaptive default sample
                profile["percentageOfNodesToScore"] = sample_percent
            profiles = [profile]
        cluster = LocalCluster(workdir, name="tput", extenders=extenders, scheduler_profiles=profiles)
        ext = extender_process(workdir, cluster.kubeconfig, port=port) if with_extender else None
        try:
            cluster.up(parse_pool_spec(pools(nodes)), timeout=300)
            if ext:
                ext.start(timeout=60)
            core = client.CoreV1Api(cluster.api)
            core.create_namespace({"metadata": {"name": "tput"}})
            cluster.control_plane.stop_scheduler()
            rng = random.Random(seed)
            sizes = [rng.choice((1, 1, 2, 4)) for _ in range(pods)]
            sizes = [0 if rng.random() < cpu_share else g for g in sizes]  # 0: a CPU-only pod

            def make(i: int) -> object:
                body = (gpu_pod(f"p{i:05d}", "tput", gpus=sizes[i], cpu="1", memory="1Gi") if sizes[i]
                        else gpu_pod(f"p{i:05d}", "tput", cpu="2", memory="4Gi"))
                return core.create_namespaced_pod("tput", body, _preload_content=False)

            with ThreadPoolExecutor(16) as ex:
                list(ex.map(make, range(pods)))
            state = cluster.control_plane.state
            assert state is not None, "up() sets it"
            procs = {name: comp.pid for name, comp in state.components.items()
                     if name != "kube-scheduler"}  # (the scheduler gets a new pid when it starts)
            if ext:
                assert ext.popen is not None, "started above"
                procs["gpuaas-extender"] = ext.popen.pid
            cpu_before = {name: cpu_seconds(pid) for name, pid in procs.items()}
            requests_before = apiserver_requests(cluster)
            t0 = time.monotonic()
            cluster.control_plane.start_scheduler()
            while (left := unbound(core, "tput")) > 0:
                if time.monotonic() - t0 > timeout:
                    raise SystemExit(f"{left} pods still unbound after {timeout}s (extender={with_extender})")
                time.sleep(0.25)
            elapsed = time.monotonic() - t0
            cpu = {name: round(cpu_seconds(pid) - cpu_before[name], 1) for name, pid in procs.items()}
            state = cluster.control_plane.state  # read again: the scheduler was started since
            assert state is not None
            cpu["kube-scheduler"] = cpu_seconds(state.components["kube-scheduler"].pid)
            requests = apiserver_requests(cluster)
            requests.subtract(requests_before)
            busiest = {k: int(v) for k, v in requests.most_common(8) if v > 0}
            return {"cpu_seconds_while_scheduling": cpu, "apiserver_requests_while_scheduling": busiest,
                    "extender": with_extender, "cpu_pods_entry": cpu_entry, "all_pods": all_pods, "nodes": nodes,
                    "pods": pods,
                    "cpu_only_pods": sizes.count(0), "gpus_requested": sum(sizes),
                    "seconds": round(elapsed, 2), "pods_per_second": round(pods / elapsed, 1)}
        finally:
            if ext:
                ext.stop()
            cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--percentage-of-nodes-to-score", type=int, default=None,
                        help="override the gpuaas profile's 100 (0 = kube-scheduler's adaptive sample)")
    parser.add_argument("--cpu-only-share", type=float, default=0.0,
                        help="fraction of the pods that ask for no GPU (default 0: GPU pods only)")
    parser.add_argument("--cpu-pods-entry", action="store_true",
                        help="instead: the extender with the GPU entry alone, with the CPU-pod entry (as deploy/ "
                             "ships it) and with every pod through the GPU entry (all_pods), same pods, one after "
                             "the other; ratio_cpu_pods_entry and ratio_all_pods are to the first")
    args = parser.parse_args()
    if args.cpu_pods_entry:  # the two extender runs first and back to back: the ratio that matters is theirs
        gpu_entry = one_run(args.nodes, args.pods, args.seed, True, args.timeout, cpu_share=args.cpu_only_share)
        both = one_run(args.nodes, args.pods, args.seed, True, args.timeout, cpu_entry=True,
                       cpu_share=args.cpu_only_share)
        every = one_run(args.nodes, args.pods, args.seed, True, args.timeout, all_pods=True,
                        cpu_share=args.cpu_only_share)
        print(json.dumps({"bench": "scheduler_throughput", "comparison": "cpu_pods_entry",
                          "gpu_entry_only": gpu_entry, "with_cpu_pods_entry": both, "all_pods_through_gpu_entry": every,
                          "ratio_cpu_pods_entry": round(both["pods_per_second"] / gpu_entry["pods_per_second"], 3),
                          "ratio_all_pods": round(every["pods_per_second"] / gpu_entry["pods_per_second"], 3)},
                         indent=2))
        return
    base = one_run(args.nodes, args.pods, args.seed, False, args.timeout, cpu_share=args.cpu_only_share)
    ours = one_run(args.nodes, args.pods, args.seed, True, args.timeout, args.percentage_of_nodes_to_score,
                   cpu_share=args.cpu_only_share)
    # The gpuaas profile scores every node (percentageOfNodesToScore 100), the default scheduler a sample: a third
    # run without the extender at the same setting tells that cost apart from the extender's.
    sampling = 100 if args.percentage_of_nodes_to_score is None else args.percentage_of_nodes_to_score
    same = (one_run(args.nodes, args.pods, args.seed, False, args.timeout, sampling, cpu_share=args.cpu_only_share)
            if sampling else None)
    out = {"bench": "scheduler_throughput",
           "percentage_of_nodes_to_score": args.percentage_of_nodes_to_score or "100 (gpuaas profile)",
           "without_extender": base, "with_extender": ours,
           "ratio": round(ours["pods_per_second"] / base["pods_per_second"], 3), "target_ratio": 0.8}
    if same is not None:
        out["without_extender_same_sampling"] = same
        out["ratio_to_same_sampling"] = round(ours["pods_per_second"] / same["pods_per_second"], 3)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""`gpuaas demo` end to end: a one-minute run with the comparison cluster, the report written, and run.json's final
state equal to what kubectl shows on the cluster the demo leaves running (--keep)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from gpuaas.cluster.tools import Tools
from gpuaas.loadgen.trace import synthetic_trace, write_trace
from gpuaas.report import load_run_record
from scoring.gpus import MIG_RESOURCE_PREFIX, model_by_product

REPO = Path(__file__).resolve().parents[2]


def demo_env(cache: Path) -> dict[str, str]:
    """Its own cache directory (clusters/demo lives there), so that a demo someone runs on this machine meanwhile is
    not touched; the binaries where setup put them."""
    tools = Tools.locate()
    env = {**os.environ, "GPUAAS_CACHE": str(cache), "PYTHONPATH": str(REPO),
           "GPUAAS_KUBE_BIN": str(tools.kubectl.parent), "GPUAAS_KWOK_BIN": str(tools.kwok),
           "GPUAAS_ETCD_BIN": str(tools.etcd)}
    if tools.prometheus:
        env["GPUAAS_PROMETHEUS_BIN"] = str(tools.prometheus)
    return env


def gpu_node_ready(node: dict) -> bool:
    alloc = node["status"].get("allocatable") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or ())
    return ready and any(int(v) > 0 for k, v in alloc.items()
                         if k == "nvidia.com/gpu" or k.startswith(MIG_RESOURCE_PREFIX))


def gpus_allocated(nodes: list[dict], pods: list[dict]) -> float:
    """Whole-GPU equivalents held by bound, unfinished pods on GPU nodes that are ready; a MIG instance counts its
    compute slices over 7."""
    products = {n["metadata"]["name"]: n["metadata"]["labels"].get("nvidia.com/gpu.product", "") for n in nodes
                if gpu_node_ready(n)}
    total = 0.0
    for p in pods:
        node = p["spec"].get("nodeName")
        if not node or node not in products or p["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        for c in p["spec"]["containers"]:
            for name, qty in (c.get("resources", {}).get("limits") or {}).items():
                if name == "nvidia.com/gpu":
                    total += int(qty)
                elif name.startswith(MIG_RESOURCE_PREFIX):
                    slices = model_by_product(products[node]).mig_profile(name).compute_slices
                    total += int(qty) * slices / 7
    return total


def test_demo_writes_the_report_and_its_final_state_is_what_kubectl_shows(tmp_path):
    env = demo_env(tmp_path / "cache")
    out = tmp_path / "out"
    trace = tmp_path / "trace.csv"
    write_trace(trace, synthetic_trace(3600, seed=3))  # the test's own; the Azure trace stays outside the repo
    cli = [sys.executable, "-m", "gpuaas.cli"]
    started = time.monotonic()
    try:
        run = subprocess.run([*cli, "demo", "--duration", "60s", "--keep", "--out", str(out), "--trace", str(trace)],
                             env=env, cwd=REPO,
                             capture_output=True, text=True, timeout=900)
        wall = time.monotonic() - started
        assert run.returncode == 0, f"stdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-4000:]}"
        print(f"\ngpuaas demo --duration 60s (with the comparison): {wall:.0f}s wall")

        assert (out / "report.html").stat().st_size > 0
        html = (out / "report.html").read_text()
        for png in ("allocation.png", "nodes.png", "replicas.png", "queue_wait.png"):
            assert (out / png).stat().st_size > 0, png
            assert png in html
        record = load_run_record(out / "run.json")  # the report's own schema check
        assert set(record.runs) == {"gpuaas", "default"}
        for r in record.runs.values():
            assert len(r.samples) >= 10 and r.samples[-1].t >= 55
            kinds = Counter(e.kind for e in r.events)
            assert kinds["ScaleUp"] >= 1, kinds  # the replica autoscaler acted on the trace
            assert r.final is not None and {g.gang for g in r.final.gangs} == {"pretrain", "finetune", "sweep", "rl"}
            assert any(g.all_bound_after_s is not None for g in r.final.gangs), r.final.gangs
            # the idle-GPU look at the end names the MIG service nobody calls, and nothing busy
            assert r.idle is not None and not r.idle.error, r.idle
            assert [(w.kind, w.name) for w in r.idle.workloads] == [("Pod", "rerank-0")], r.idle
            assert "inference/deployment/llm-code" in r.idle.busy, r.idle
            # per service, the demo's SLO attainment beside the simulator's for the same window and policy
            assert set(r.services) == {"llm-code", "llm-code-b"}, r.services
            assert all(s.demo_requests > 0 and s.simulated_requests > 0 for s in r.services.values()), r.services
            for name, s in r.services.items():
                assert s.simulated_low is not None and s.simulated_high is not None
                assert s.simulated_low - 1e-9 <= s.simulated <= s.simulated_high + 1e-9, (name, s)
                # what the replayer saw of each pod, in order: the warm ones serving at once
                warm = [p for p in s.replicas if p.serving_s is not None and p.serving_s < 1.0]  # no cold start
                assert len(warm) == s.initial_replicas, (name, s.replicas)
                for p in s.replicas:
                    assert p.bound_s is None or p.listed_s <= p.bound_s, p
                    assert p.serving_s is None or (p.bound_s is not None and p.bound_s <= p.serving_s), p
                assert s.gpus and all(g.held <= s.initial_replicas + 16 for g in s.gpus), s.gpus
                # the simulator's serving model on the demo's own replicas counts what the demo counted
                assert s.replayed is not None and abs(s.replayed - s.demo) <= 0.01, (name, s.replayed, s.demo)
                assert s.on_demo_gpus is not None
        # gpuaas: gangs submitted as a user writes them, gated by the webhook, released whole by the controller
        gpuaas_run = record.runs["gpuaas"]
        assert Counter(e.kind for e in gpuaas_run.events)["GangReleased"] >= 1, gpuaas_run.events
        for g in gpuaas_run.final.gangs:
            assert not 0 < g.bound < g.size, g  # never half-placed at the end
            if g.all_bound_after_s is not None:  # bound together (conditions have whole seconds)
                assert g.half_placed_s is not None and g.half_placed_s <= 2, g
            assert r.summary is not None and r.summary.mean_allocation_ratio

        final = json.loads((out / "run.json").read_text())["runs"]["gpuaas"]["final"]
        kubeconfig = tmp_path / "cache" / "clusters" / "demo" / "kubeconfig"

        def get(kind: str) -> list[dict]:
            res = subprocess.run([str(Tools.locate().kubectl), "--kubeconfig", str(kubeconfig), "get", kind, "-A",
                                  "-o", "json"], capture_output=True, text=True, check=True)
            return json.loads(res.stdout)["items"]

        nodes, pods, deployments = get("nodes"), get("pods"), get("deployments")
        phases = Counter(p["status"].get("phase") for p in pods)
        assert final["nodes"] == len(nodes)
        assert final["gpus_total"] == sum(int(n["metadata"]["labels"]["nvidia.com/gpu.count"]) for n in nodes
                                          if gpu_node_ready(n))
        assert (final["pods_running"], final["pods_pending"], final["pods_succeeded"]) == \
            (phases["Running"], phases["Pending"], phases["Succeeded"])
        assert final["gpus_allocated"] == round(gpus_allocated(nodes, pods), 4)
        assert final["replicas"] == {f"{d['metadata']['namespace']}/{d['metadata']['name']}": d["spec"]["replicas"]
                                     for d in deployments}
        pending = sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods
                         if p["status"].get("phase") == "Pending")
        assert [p["pod"] for p in final["pending"]] == pending
        assert "training/too-big" in pending
        # The table the demo prints: where each pod landed, and why the pending ones wait.
        assert "why pending: 0/" in run.stdout and "training/too-big" in run.stdout
    finally:
        down = subprocess.run([*cli, "cluster", "down", "--name", "demo"], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=120)
    assert down.returncode == 0, down.stderr

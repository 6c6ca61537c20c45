"""bench/scheduler_throughput.py on a small KWOK cluster: the gpuaas profile without an extender and against the floor
extender that binds (filter answers one node, bind makes the Binding) place every pod, and each run reports every
component's CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_floor_extender_binds_every_pod_through_kube_scheduler():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "scheduler_throughput.py"), "--nodes", "12", "--pods",
                          "24", "--repeats", "1", "--configs", "same_profile,floor,floor_watching,floor_bare",
                          "--idle-s", "1"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)},
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    (floor,), (same,), (watching,), (bare,) = (report["runs"][c] for c in ("floor", "same_profile", "floor_watching",
                                                                            "floor_bare"))
    for run in (floor, same, watching, bare):
        assert run["pods"] == 24 and run["pods_per_second"] > 0  # the clock stops only once every pod is bound
        # kube-scheduler's idle rate, read after the run, is taken off its CPU like every other component's.
        assert run["idle_cpu_per_s"]["kube-scheduler"] >= 0
        assert run["cpu_ms_per_pod_above_idle"]["kube-scheduler"] <= run["cpu_ms_per_pod"]["kube-scheduler"]
    for run in (floor, watching, bare):
        assert run["cpu_ms_per_pod"]["floor-extender"] > 0
        assert run["apiserver_requests_while_scheduling"]["POST/pods/binding"] == 24  # the floor made the Bindings
    assert "floor-extender" not in same["cpu_ms_per_pod"]
    # floor_watching holds the extender's two watches on top of what the floor's cluster has open.
    for resource in ("nodes", "pods"):
        assert watching["apiserver_watches"][resource] >= floor["apiserver_watches"].get(resource, 0) + 1, resource
    assert set(report["summary"]) >= {"floor_to_same_profile", "floor_watching_to_floor", "floor_bare_to_floor"}


def test_gpuaas_on_the_bare_server_decides_and_binds_every_pod():
    # extender_bare: gpuaas's own service (its model, decisions and Bindings with the GPUs chosen) behind
    # bench/bare_http.py's server, against the extender as shipped.
    out = subprocess.run([sys.executable, str(REPO / "bench" / "scheduler_throughput.py"), "--nodes", "12", "--pods",
                          "24", "--repeats", "1", "--configs", "extender,extender_bare", "--idle-s", "1"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)},
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    for config in ("extender", "extender_bare"):
        (run,) = report["runs"][config]
        assert run["cpu_ms_per_pod"]["gpuaas-extender"] > 0
        assert run["apiserver_requests_while_scheduling"]["POST/pods/binding"] == 24  # gpuaas made the Bindings
        assert run["extender_calls"]["filter"] >= 24 and run["extender_calls"]["bind"] == 24, run["extender_calls"]
    assert "extender_bare_to_extender" in report["summary"]


def test_cpu_split_says_where_the_extenders_cpu_went():
    # On a machine with two CPUs or more, the extender runs alone on one of them (--extender-cpu) in the same run.
    cpus = sorted(os.sched_getaffinity(0))
    pinned = ["--extender-cpu", str(cpus[-1])] if len(cpus) >= 2 else []
    out = subprocess.run([sys.executable, str(REPO / "bench" / "scheduler_throughput.py"), "--nodes", "12", "--pods",
                          "24", "--repeats", "1", "--configs", "extender", "--idle-s", "1", "--cpu-split", *pinned],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)},
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = json.loads(out.stdout)["runs"]["extender"]
    if pinned:
        assert run["cpus"] == {"extender": cpus[-1:], "the_others": cpus[:-1]}
    split = run["extender_cpu_split_ms_per_pod"]
    assert "error" not in split, split
    # Every pod went through filter and its watch events were decoded and handled; bind renewed each hold.
    for part in ("filter", "request.validate", "reply.encode", "watch.decode", "watch.on_change", "bind.renew"):
        assert split[part] > 0, (part, split)
    parts = sum(v for k, v in split.items() if k not in ("total", "other"))
    assert abs(parts + split["other"] - split["total"]) < 0.01 and split["other"] > 0

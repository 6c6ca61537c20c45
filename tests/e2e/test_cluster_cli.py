"""`gpuaas cluster up|status|down` as a user runs it: the cluster outlives `up`, and `down` leaves no process."""
from __future__ import annotations

import json
import subprocess
import sys

from gpuaas.cluster.process import process_alive


def gpuaas(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuaas.cli", *args], capture_output=True, text=True, timeout=180)


def test_up_status_down_leaves_no_process(tmp_path):
    spec = tmp_path / "pools.yaml"
    spec.write_text("pools:\n- {name: t4, count: 5, gpu: {model: T4, count: 4}}\n"
                    "- {name: h100, count: 2, gpu: {model: H100-80GB, count: 8, mig: all-1g.10gb}}\n")
    workdir = tmp_path / "cluster"
    try:
        up = gpuaas("cluster", "up", "--pools", str(spec), "--dir", str(workdir))
        assert up.returncode == 0, up.stderr
        assert "7 nodes, 36 GPUs" in up.stdout
        state = json.loads((workdir / "state.json").read_text())
        processes = [(c["pid"], c["argv"][0]) for c in state["components"].values()]
        assert len(processes) == 5 and all(process_alive(pid, argv0) for pid, argv0 in processes)

        status = gpuaas("cluster", "status", "--dir", str(workdir))
        assert status.returncode == 0, status.stdout + status.stderr
        assert "nodes: 7/7 Ready" in status.stdout
    finally:
        down = gpuaas("cluster", "down", "--dir", str(workdir))
    assert down.returncode == 0, down.stderr
    assert not any(process_alive(pid, argv0) for pid, argv0 in processes)
    assert (workdir / "logs" / "kube-apiserver.log").stat().st_size > 0  # logs stay for debugging
    assert gpuaas("cluster", "status", "--dir", str(workdir)).returncode == 1

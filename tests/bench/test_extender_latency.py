"""bench/extender_latency.py end to end on a small cluster: gpuaas's extender in both modes and the floor answer
every request (a prioritize reply may leave out hosts scoring 0, never list others), gpuaas as configured by default
answers plain GPU pods at filter, and the summary is printed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_small_run_measures_both_servers():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "extender_latency.py"), "--nodes", "60",
                          "--requests", "4", "--runs", "1"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["summary"]["runs"] == 1 and report["summary"]["names"] == 60
    (result,) = report["results"]
    for server in ("gpuaas", "gpuaas_full", "floor"):
        assert result[server]["requests"] == 4 and result[server]["per_pod_ms"]["p50"] > 0
    # the measured pods are a MIG instance and 1, 2 and 4 whole GPUs: the whole-GPU ones are decided at filter
    assert result["gpuaas_full"]["prioritize_calls"] == result["floor"]["prioritize_calls"] == 4
    assert result["gpuaas"]["prioritize_calls"] <= 1
    assert report["summary"]["gpuaas"]["prioritize_calls_per_run"] == [result["gpuaas"]["prioritize_calls"]]

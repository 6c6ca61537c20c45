"""bench/extender_latency.py end to end on a small cluster: gpuaas's extender and the floor answer every request
(a prioritize reply may leave out hosts scoring 0, never list others), and the summary is printed."""
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
    for server in ("gpuaas", "floor"):
        assert result[server]["requests"] == 4 and result[server]["filter_plus_prioritize_ms"]["p50"] > 0

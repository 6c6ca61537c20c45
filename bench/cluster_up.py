"""How long `gpuaas cluster up` takes with a pool spec (default: the 200-node `large-200`), and that teardown leaves no
process. Prints JSON. Usage: python bench/cluster_up.py [--pools SPEC] [--repeat N]"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuaas.cluster.local import resolve_pool_spec
from gpuaas.cluster.process import process_alive


def one_run(pools: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="gpuaas-bench-") as tmp:
        workdir = Path(tmp) / "cluster"
        t0 = time.monotonic()
        up = subprocess.run([sys.executable, "-m", "gpuaas.cli", "cluster", "up", "--pools", pools,
                             "--dir", str(workdir)], capture_output=True, text=True)
        up_s = time.monotonic() - t0
        if up.returncode != 0:
            raise SystemExit(f"cluster up failed: {up.stderr}")
        state = json.loads((workdir / "state.json").read_text())
        processes = [(c["pid"], c["argv"][0]) for c in state["components"].values()]
        t1 = time.monotonic()
        down = subprocess.run([sys.executable, "-m", "gpuaas.cli", "cluster", "down", "--dir", str(workdir)],
                              capture_output=True, text=True)
        down_s = time.monotonic() - t1
        left = [argv0 for pid, argv0 in processes if process_alive(pid, argv0)]
        return {"up_s": round(up_s, 2), "down_s": round(down_s, 2), "down_rc": down.returncode,
                "processes_left": left, "up_stdout": up.stdout.splitlines()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pools", default="large-200")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spec = resolve_pool_spec(args.pools)
    runs = [one_run(args.pools) for _ in range(args.repeat)]
    ups = sorted(r["up_s"] for r in runs)
    print(json.dumps({"bench": "cluster_up", "pools": args.pools, "nodes": spec.node_count,
                      "gpus": sum(p.count * (p.gpu.count if p.gpu else 0) for p in spec.pools),
                      "up_s_median": ups[len(ups) // 2], "up_s_max": ups[-1], "target_up_s": 120,
                      "processes_left_after_down": sum(len(r["processes_left"]) for r in runs),
                      "runs": runs}, indent=2))


if __name__ == "__main__":
    main()

"""Reproduce the FGD paper's curves: allocation ratio at 100% and 130% arrived, mean over seeds, per trace and policy,
against the authors' cached results. Prints JSON (one object per trace x policy, then a summary).

    python bench/reproduce_fgd.py [--traces default,cpu050] [--policies random,bestfit,fgd] [--seeds 42-51]
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

from gpuaas.simulate.traces import load_nodes, load_pods
from scoring.simulation import simulate

DATA = Path("/work/shared/data/alibaba-gpu-2023")
EXPECTED = DATA / "fgd-expected-results" / "analysis_allo_discrete.csv"
POLICY_COLUMN = {"random": "01-Random", "dotprod": "02-DotProd", "bestfit": "05-BestFit", "fgd": "06-FGD"}


def expected_means() -> dict[tuple[str, str], dict[str, float]]:
    acc: dict[tuple[str, str], list[dict[str, str]]] = {}
    with open(EXPECTED) as fh:
        for row in csv.DictReader(fh):
            trace = row["workload"].removeprefix("openb_pod_list_")
            acc.setdefault((trace, row["sc_policy"]), []).append(row)
    return {k: {p: float(np.mean([float(r[p]) for r in rows])) for p in ("100", "130")} for k, rows in acc.items()}


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default=None, help="comma list; default: every trace in the expected results")
    ap.add_argument("--policies", default="random,bestfit,fgd")
    ap.add_argument("--seeds", default="42-51")
    args = ap.parse_args()
    expected = expected_means()
    traces = args.traces.split(",") if args.traces else sorted({t for t, _ in expected})
    seeds = parse_seeds(args.seeds)
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    worst = 0.0
    rows = []
    for trace in traces:
        pods = load_pods(DATA / f"openb_pod_list_{trace}.csv")
        for policy in args.policies.split(","):
            t0 = time.perf_counter()
            runs = [simulate(nodes, pods, policy, seed) for seed in seeds]
            ours = {p: float(np.mean([r.allocation_ratio()[p] for r in runs])) for p in ("100", "130")}
            row = {"trace": trace, "policy": policy, "seeds": len(seeds),
                   "ours_100": round(ours["100"], 2), "ours_130": round(ours["130"], 2),
                   "wall_s_per_run": round((time.perf_counter() - t0) / len(seeds), 2),
                   "decision_ms_p50": round(float(np.median([r.decision_ms(50) for r in runs])), 3),
                   "decision_ms_p99": round(float(np.median([r.decision_ms(99) for r in runs])), 3)}
            ref = expected.get((trace, POLICY_COLUMN.get(policy, "")))
            if ref:
                row.update({"fgd_paper_100": round(ref["100"], 2), "fgd_paper_130": round(ref["130"], 2),
                            "diff_100": round(ours["100"] - ref["100"], 2),
                            "diff_130": round(ours["130"] - ref["130"], 2)})
                worst = max(worst, abs(row["diff_100"]), abs(row["diff_130"]))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps({"summary": True, "max_abs_diff": round(worst, 2), "runs": len(rows) * len(seeds)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

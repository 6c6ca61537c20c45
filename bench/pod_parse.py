"""How long reading one pod's demand takes, for pods with thousands of sidecars (issue 13, defect 7: summing requests
was quadratic, and 3,000 sidecars took 7 s in /filter). Prints JSON.

Two shapes, each with N sidecars (init containers with restartPolicy Always), a regular init container and the app:
  same_resources   every sidecar asks for cpu and memory (the common case)
  own_resources    every sidecar also asks for an extended resource of its own (what made the old sum quadratic)
and three readings of each:
  pod_demand       scoring.kubeobjects.pod_demand, the quantity cache warm (the same strings seen before)
  cold             the same with the quantity cache emptied first
  view_demand      ClusterView.demand on a fresh view: the content digest, then pod_demand (what /filter does)
Each time is the median of --repeats runs in one process. Target (issue 13): under 50 ms for 5,000 sidecars.

Usage: python bench/pod_parse.py [--sidecars 5000] [--repeats 15]"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from scoring.clusterview import ClusterView
from scoring.kubeobjects import _read_short_quantity, pod_demand


def pod(sidecars: int, own_resources: bool) -> dict:
    def requests(i: int) -> dict:
        base = {"cpu": "10m", "memory": "16Mi"}
        return base | {f"example.com/r{i}": "1"} if own_resources else base

    side = [{"name": f"s{i}", "image": "proxy", "restartPolicy": "Always", "resources": {"requests": requests(i)}}
            for i in range(sidecars)]
    init = {"name": "setup", "image": "setup", "resources": {"requests": {"cpu": "1"}}}
    app = {"name": "app", "image": "app", "resources": {"requests": {"cpu": "2", "memory": "8Gi"},
                                                        "limits": {"nvidia.com/gpu": "1"}}}
    return {"metadata": {"name": "many", "namespace": "bench", "uid": "u", "generation": 1},
            "spec": {"initContainers": side + [init], "containers": [app]}}


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sidecars", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    out: dict = {"sidecars": args.sidecars, "repeats": args.repeats, "target_ms": 50}
    for shape, own in (("same_resources", False), ("own_resources", True)):
        p = pod(args.sidecars, own)
        demand = pod_demand(p)
        assert demand.gpus == 1, demand

        def cold(p: dict = p) -> None:
            _read_short_quantity.cache_clear()
            pod_demand(p)

        out[shape] = {
            "pod_demand_ms": median_ms(lambda p=p: pod_demand(p), args.repeats),
            "cold_ms": median_ms(cold, args.repeats),
            "view_demand_ms": median_ms(lambda p=p: ClusterView().demand(p), args.repeats),
        }
    out["under_target"] = all(v < out["target_ms"] for shape in ("same_resources", "own_resources")
                              for v in out[shape].values())
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

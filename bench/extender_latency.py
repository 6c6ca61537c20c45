"""Latency of the extender's filter + prioritize against a 5,000-node snapshot, over HTTP on loopback as
kube-scheduler calls it (nodeCacheCapable: node names in, names and scores out). Prints JSON.

Usage: python bench/extender_latency.py [--nodes 5000] [--requests 300] [--policy gpuaas]"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import numpy as np
import orjson
from aiohttp.test_utils import TestClient, TestServer

from extender.config import ExtenderConfig
from extender.server import snapshot_app
from gpuaas.cluster.pools import parse_pool_spec, spec_node_objects
from gpuaas.workloads import gpu_pod


def cluster(nodes: int, seed: int) -> tuple[list[dict], list[dict]]:
    """A fleet like the demo's at scale: 8-GPU A100 and H100 nodes, a MIG pool and 4-GPU L40S nodes, half busy."""
    quarter = nodes // 4
    spec = parse_pool_spec({"pools": [
        {"name": "a100", "count": quarter, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"},
        {"name": "h100", "count": quarter, "gpu": {"model": "H100-80GB", "count": 8}, "cpu": "192", "memory": "2Ti"},
        {"name": "mig", "count": quarter, "gpu": {"model": "A100-80GB", "count": 8, "mig": "all-balanced"},
         "cpu": "128", "memory": "1Ti"},
        {"name": "l40s", "count": nodes - 3 * quarter, "gpu": {"model": "L40S", "count": 4}, "cpu": "64",
         "memory": "512Gi"},
    ]})
    node_objs = spec_node_objects(spec)
    rng = random.Random(seed)
    pods = []
    for i, node in enumerate(node_objs):
        if rng.random() < 0.5 and not node["metadata"]["name"].startswith("mig"):
            k = rng.choice((1, 2, 4))
            pod = gpu_pod(f"busy-{i}", "bench", gpus=k, cpu="4", memory="16Gi")
            pod["spec"]["nodeName"] = node["metadata"]["name"]
            pod["status"] = {"phase": "Running"}
            pod["metadata"]["annotations"] = {"gpuaas.io/devices": ",".join(str(d) for d in range(k))}
            pods.append(pod)
    return node_objs, pods


async def measure_all(app, names: list[str], pods: list[dict], requests: int, seed: int) -> list[dict]:
    async with TestClient(TestServer(app)) as c:
        return [await measure(c, names, pods, requests, sample, seed) for sample in (500, len(names))]


async def measure(c: TestClient, names: list[str], pods: list[dict], requests: int, sample: int, seed: int) -> dict:
    rng = random.Random(seed)
    filt, prio, both = [], [], []
    for i in range(requests + 20):
        cand = rng.sample(names, sample)
        body = orjson.dumps({"Pod": pods[i % len(pods)], "NodeNames": cand, "Nodes": None})
        # Timed as kube-scheduler sees it: send, the extender's work, receive and decode the reply. The client
        # encodes and decodes with orjson so that Python's json module does not stand in for Go's decoder.
        t0 = time.perf_counter()
        r = await c.post("/filter", data=body, headers={"Content-Type": "application/json"})
        feasible = orjson.loads(await r.read())["NodeNames"]
        t1 = time.perf_counter()
        body = orjson.dumps({"Pod": pods[i % len(pods)], "NodeNames": feasible, "Nodes": None})
        r = await c.post("/prioritize", data=body, headers={"Content-Type": "application/json"})
        orjson.loads(await r.read())
        t2 = time.perf_counter()
        if i >= 20:  # warm-up excluded
            filt.append(t1 - t0)
            prio.append(t2 - t1)
            both.append(t2 - t0)

    def ms(xs, q):
        return round(float(np.percentile(xs, q)) * 1000, 3)

    return {"names_per_request": sample, "requests": requests,
            "filter_ms": {"p50": ms(filt, 50), "p99": ms(filt, 99)},
            "prioritize_ms": {"p50": ms(prio, 50), "p99": ms(prio, 99)},
            "filter_plus_prioritize_ms": {"p50": ms(both, 50), "p99": ms(both, 99)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--policy", default="gpuaas")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    node_objs, bound = cluster(args.nodes, args.seed)
    t0 = time.perf_counter()
    app = snapshot_app(ExtenderConfig(policy=args.policy), node_objs + bound)
    app_s = time.perf_counter() - t0
    # Pods as they arrive: whole GPUs of each common size, a MIG instance.
    pods = [gpu_pod(f"p{i}", "bench", gpus=g, cpu="8", memory="32Gi") for i, g in enumerate((1, 2, 4, 8, 1, 2))]
    pods.append(gpu_pod("m", "bench", mig="2g.20gb"))
    names = [n["metadata"]["name"] for n in node_objs]
    results = asyncio.run(measure_all(app, names, pods, args.requests, args.seed))
    print(json.dumps({"bench": "extender_latency", "policy": args.policy, "nodes": args.nodes,
                      "bound_pods": len(bound), "build_view_s": round(app_s, 2), "target_p99_ms": 5.0,
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()

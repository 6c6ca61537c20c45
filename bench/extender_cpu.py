"""The extender's own CPU per pod, in one process without HTTP: each pod goes through what the server does for
kube-scheduler's three calls (parse and validate the body, the verb, encode the reply) and then through the watch
events of its binding and of kwok's Running, as in bench/scheduler_throughput.py (N 8-GPU nodes, half A100, half
H100; P pods of 1, 1, 2 or 4 GPUs; every node a candidate). The binder accepts every binding (no apiserver: what the
Binding costs is the HTTP client's, not measured here). CPU time (time.process_time) per stage, the first 20 pods
excluded; and a digest of every pod's node and devices, which must not change when the hot path is made cheaper.
`--queue-planning-min-pods 16` (the shipped default) plans the pods still waiting jointly every 2 s, as the extender
does in a burst; 0 places each pod on its own.
Usage: python bench/extender_cpu.py [--nodes 1000] [--pods 600] [--queue-planning-min-pods 0]"""
from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import json
import random
import time
from typing import Any

import orjson

from extender.config import ExtenderConfig
from extender.server import PRIORITY_ENCODER, SERVICE, snapshot_app
from extender.wire import ExtenderArgs, ExtenderBindingArgs
from gpuaas.workloads import gpu_pod
from runtime.pools import parse_pool_spec, spec_node_objects


class AcceptingBinder:
    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        return None


def fleet(nodes: int) -> list[dict[str, Any]]:
    half = nodes // 2
    return spec_node_objects(parse_pool_spec({"pools": [
        {"name": "a100", "count": half, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"},
        {"name": "h100", "count": nodes - half, "gpu": {"model": "H100-80GB", "count": 8}, "cpu": "128",
         "memory": "1Ti"}]}))


async def run(nodes: int, pods: int, min_pods: int, seed: int) -> dict[str, Any]:
    node_objs = fleet(nodes)
    names = [n["metadata"]["name"] for n in node_objs]
    rng = random.Random(seed)
    pending = []
    for i in range(pods):
        pod = gpu_pod(f"p{i:05d}", "tput", gpus=rng.choice((1, 1, 2, 4)), cpu="1", memory="1Gi")
        pod["metadata"]["uid"] = f"uid-{i}"
        pod["status"] = {"phase": "Pending"}
        pending.append(pod)
    app = snapshot_app(ExtenderConfig(queue_planning_min_pods=min_pods), [{"kind": "Node", **n} for n in node_objs])
    svc, encoder = app[SERVICE], app[PRIORITY_ENCODER]
    view = svc.view
    store = {p["metadata"]["name"]: p for p in pending}
    for p in pending:
        view.on_change("Pod", None, p)

    async def lookup(namespace: str, name: str) -> dict[str, Any] | None:
        return store.get(name)

    svc.pod_lookup, svc.binder = lookup, AcceptingBinder()
    view.snapshot()
    cpu = dict.fromkeys(("filter", "prioritize", "bind", "watch_events"), 0.0)
    placed: list[Any] = []
    for i, pod in enumerate(pending):
        c0 = time.process_time()
        args = ExtenderArgs.model_validate(orjson.loads(orjson.dumps({"Pod": pod, "NodeNames": names, "Nodes": None})))
        reply = orjson.dumps(dict(svc.filter(args)))
        c1 = time.process_time()
        feasible = orjson.loads(reply)["NodeNames"]
        if not feasible:
            placed.append(None)
            continue
        body = orjson.dumps({"Pod": pod, "NodeNames": feasible, "Nodes": None})
        c2 = time.process_time()
        scored = svc.prioritize(ExtenderArgs.model_validate(orjson.loads(body)))
        reply = encoder.encode(scored.names, scored.rows, scored.scores, scored.row_names)
        c3 = time.process_time()
        best = max(orjson.loads(reply), key=lambda e: e["Score"])["Host"]
        body = orjson.dumps({"PodName": pod["metadata"]["name"], "PodNamespace": "tput",
                             "PodUID": pod["metadata"]["uid"], "Node": best})
        c4 = time.process_time()
        result = await svc.bind(ExtenderBindingArgs.model_validate(orjson.loads(body)))
        orjson.dumps(dict(result))
        c5 = time.process_time()
        if result.Error:
            raise RuntimeError(f"bind of {pod['metadata']['name']} to {best}: {result.Error}")
        bound = copy.deepcopy(pod)
        bound["spec"]["nodeName"] = best
        running = copy.deepcopy(bound)
        running["status"] = {"phase": "Running"}
        c6 = time.process_time()
        view.on_change("Pod", pod, bound)
        view.on_change("Pod", bound, running)
        c7 = time.process_time()
        if i >= 20:
            for stage, spent in (("filter", c1 - c0), ("prioritize", c3 - c2), ("bind", c5 - c4),
                                 ("watch_events", c7 - c6)):
                cpu[stage] += spent
        placed.append((best, view.placements[f"tput/{pod['metadata']['name']}"].devices))
    counted = max(1, pods - 20)
    per_pod = {k: round(1000 * v / counted, 3) for k, v in cpu.items()}
    return {"bench": "extender_cpu", "nodes": nodes, "pods": pods, "queue_planning_min_pods": min_pods,
            "cpu_ms_per_pod": per_pod, "cpu_ms_per_pod_total": round(sum(per_pod.values()), 3),
            "target_ms": 1.0,
            "queue_plan_seconds": round(svc.metrics.registry.get_sample_value("gpuaas_extender_queue_plan_seconds_sum")
                                        or 0.0, 3),
            "placements_digest": hashlib.sha1(repr(placed).encode()).hexdigest()[:12],
            "bound": sum(p is not None for p in placed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=600)
    parser.add_argument("--queue-planning-min-pods", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.nodes, args.pods, args.queue_planning_min_pods, args.seed)), indent=2))


if __name__ == "__main__":
    main()

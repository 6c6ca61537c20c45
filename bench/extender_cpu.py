"""The extender's own CPU per pod, in one process without HTTP: each pod goes through what the server does for
kube-scheduler's three calls (parse and validate the body, the verb, encode the reply) and then through the watch
events of its binding and of kwok's Running, as in bench/scheduler_throughput.py (N 8-GPU nodes, half A100, half
H100; P pods of 1, 1, 2 or 4 GPUs; every node a candidate). The binder accepts every binding (no apiserver: what the
Binding costs is the HTTP client's, not measured here). CPU time (time.process_time) per stage, the first 20 pods
excluded; and a digest of every pod's node and devices, which must not change when the hot path is made cheaper.
`--queue-planning-min-pods 16` (the shipped default) plans the pods still waiting jointly every 2 s, as the extender
does in a burst; 0 places each pod on its own. `--pace 25`: the extender's clock moves 1/25 s per pod, as if
kube-scheduler placed 25 pods a second (the 1,000-node cluster run placed 17-33 with the extender), so that a burst
gets as many plans as in a cluster whatever this machine's speed; without it the clock is the wall clock.
`--cpu-pods-entry --cpu-only-share 0.3`: the schemes for pods that ask for no GPU (docs/extender.md) on the same pods,
`--repeats` rounds interleaved: the extender's own CPU per pod in each and the calls kube-scheduler would make per pod.
`--compare-decide-in-filter`: the extender as shipped (a plain GPU pod's filter answers with gpuaas's pick alone, so
kube-scheduler calls no prioritize) against decide_in_filter off, interleaved, with the placements compared.
Usage: python bench/extender_cpu.py [--nodes 1000] [--pods 600] [--queue-planning-min-pods 0]
       python bench/extender_cpu.py --nodes 1000 --pods 3000 --queue-planning-min-pods 16 --pace 25
       python bench/extender_cpu.py --nodes 300 --pods 1500 --cpu-only-share 0.3 --cpu-pods-entry
       python bench/extender_cpu.py --nodes 1000 --pods 400 --compare-decide-in-filter"""
from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import json
import random
import statistics
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


# cpu_pods_entry_prioritize_only: the CPU-pods entry as it was before it had a filter (issue 16), for comparison.
SCHEMES = ("gpu_entry_only", "cpu_pods_entry_prioritize_only", "cpu_pods_entry", "all_pods")


def make_pods(pods: int, seed: int, cpu_only_share: float) -> list[tuple[bool, dict[str, Any]]]:
    """(asks for no GPU, the pod); with cpu_only_share 0 the same pods as before the share existed."""
    rng = random.Random(seed)
    out = []
    for i in range(pods):
        cpu_only = cpu_only_share > 0 and rng.random() < cpu_only_share
        pod = (gpu_pod(f"p{i:05d}", "tput", gpus=0, cpu="4", memory="1Gi") if cpu_only else
               gpu_pod(f"p{i:05d}", "tput", gpus=rng.choice((1, 1, 2, 4)), cpu="1", memory="1Gi"))
        pod["metadata"]["uid"] = f"uid-{i}"
        if cpu_only:  # created now: the CPU-pods filter holds a pod only queue_max_wait_seconds after its creation
            pod["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        pod["status"] = {"phase": "Pending"}
        out.append((cpu_only, pod))
    return out


class PacedClock:
    """The extender's clock in a paced run: moved on by the benchmark, 1/pace seconds per pod."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def run(nodes: int, pods: int, min_pods: int, seed: int, scheme: str = "gpu_entry_only",
              cpu_only_share: float = 0.0, pace: float = 0.0, decide_in_filter: bool = True) -> dict[str, Any]:
    """`scheme`, for pods that ask for no GPU (docs/extender.md, "Pods that ask for no GPU"): gpu_entry_only (they
    never reach the extender; kube-scheduler puts them on the nodes in turn here), cpu_pods_entry (they get the CPU-pod
    entry's filter and prioritize, and every GPU pod its filter's every-node answer and empty ranking too),
    cpu_pods_entry_prioritize_only (that entry before it had a filter) or all_pods (filter, prioritize and bind, as
    GPU pods). Calls per pod are the HTTP requests kube-scheduler would make to the extender. `decide_in_filter`: the
    extender's setting (on as shipped: a GPU pod's filter answers with gpuaas's pick alone; no prioritize follows)."""
    node_objs = fleet(nodes)
    names = [n["metadata"]["name"] for n in node_objs]
    pending = make_pods(pods, seed, cpu_only_share)
    app = snapshot_app(ExtenderConfig(queue_planning_min_pods=min_pods, decide_in_filter=decide_in_filter),
                       [{"kind": "Node", **n} for n in node_objs])
    svc, encoder = app[SERVICE], app[PRIORITY_ENCODER]
    view = svc.view
    clock = PacedClock()
    if pace > 0:
        view.clock = clock
    store = {p["metadata"]["name"]: p for _, p in pending}
    for _, p in pending:
        view.on_change("Pod", None, p)

    async def lookup(namespace: str, name: str) -> dict[str, Any] | None:
        return store.get(name)

    svc.pod_lookup, svc.binder = lookup, AcceptingBinder()
    view.snapshot()
    stages = ["filter", "prioritize", "bind", "watch_events"]
    cpu_entry = scheme.startswith("cpu_pods_entry")
    cpu_filter = scheme == "cpu_pods_entry"
    if cpu_entry:
        stages += ["cpu_prioritize_gpu_pod", "cpu_prioritize_cpu_pod"]
    if cpu_filter:
        stages += ["cpu_filter_gpu_pod", "cpu_filter_cpu_pod"]
    cpu = dict.fromkeys(stages, 0.0)
    calls = 0
    reply_bytes = {"filter": 0, "prioritize": 0}  # what kube-scheduler decodes
    placed: list[Any] = []
    for i, (cpu_only, pod) in enumerate(pending):
        clock.t = i / pace if pace > 0 else 0.0
        spent = dict.fromkeys(stages, 0.0)
        if cpu_only and scheme != "all_pods":
            best = names[i % len(names)]
            if cpu_entry:
                candidates = names
                if cpu_filter:  # kube-scheduler calls the entry's filter first, then ranks what passed
                    c0 = time.process_time()
                    body = orjson.dumps({"Pod": pod, "NodeNames": names, "Nodes": None})
                    reply = orjson.dumps(dict(svc.filter_cpu_pods(ExtenderArgs.model_validate(orjson.loads(body)))))
                    candidates = orjson.loads(reply)["NodeNames"]
                    spent["cpu_filter_cpu_pod"] = time.process_time() - c0
                    calls += 1
                    if not candidates:  # held on every node: kube-scheduler would try it again later
                        placed.append(None)
                        continue
                c0 = time.process_time()
                body = orjson.dumps({"Pod": pod, "NodeNames": candidates, "Nodes": None})
                scored = svc.prioritize_cpu_pods(ExtenderArgs.model_validate(orjson.loads(body)))
                reply = encoder.encode(scored.names, scored.rows, scored.scores, scored.row_names)
                spent["cpu_prioritize_cpu_pod"] = time.process_time() - c0
                best = max(orjson.loads(reply), key=lambda e: e["Score"])["Host"]
                calls += 1
        else:
            c0 = time.process_time()
            args = ExtenderArgs.model_validate(orjson.loads(orjson.dumps({"Pod": pod, "NodeNames": names,
                                                                          "Nodes": None})))
            reply = orjson.dumps(dict(svc.filter(args)))
            c1 = time.process_time()
            reply_bytes["filter"] += len(reply)
            calls += 1
            feasible = orjson.loads(reply)["NodeNames"]
            if not feasible:
                placed.append(None)
                continue
            # kube-scheduler passes each extender's feasible names to the next, and with one left it neither scores
            # nor calls prioritize (decide_in_filter answers a plain GPU pod's filter with gpuaas's pick alone).
            body = orjson.dumps({"Pod": pod, "NodeNames": feasible, "Nodes": None})
            if cpu_filter:  # the CPU-pod entry's filter after the GPU entry's
                cf = time.process_time()
                passed = orjson.loads(orjson.dumps(dict(svc.filter_cpu_pods(ExtenderArgs.model_validate(
                    orjson.loads(body))))))["NodeNames"]
                assert passed == feasible
                spent["cpu_filter_gpu_pod"] = time.process_time() - cf
                calls += 1
            c2 = c3 = time.process_time()
            if len(feasible) == 1:
                best = feasible[0]
            else:
                scored = svc.prioritize(ExtenderArgs.model_validate(orjson.loads(body)))
                reply = encoder.encode(scored.names, scored.rows, scored.scores, scored.row_names)
                c3 = time.process_time()
                reply_bytes["prioritize"] += len(reply)
                calls += 1
                if cpu_entry:  # the CPU-pod entry is called beside the GPU entry's prioritize
                    cp = time.process_time()
                    empty = svc.prioritize_cpu_pods(ExtenderArgs.model_validate(orjson.loads(body)))
                    assert not empty.names
                    spent["cpu_prioritize_gpu_pod"] = time.process_time() - cp
                    calls += 1
                best = max(orjson.loads(reply), key=lambda e: e["Score"])["Host"]
            body = orjson.dumps({"PodName": pod["metadata"]["name"], "PodNamespace": "tput",
                                 "PodUID": pod["metadata"]["uid"], "Node": best})
            c4 = time.process_time()
            result = await svc.bind(ExtenderBindingArgs.model_validate(orjson.loads(body)))
            orjson.dumps(dict(result))
            c5 = time.process_time()
            calls += 1
            if result.Error:
                raise RuntimeError(f"bind of {pod['metadata']['name']} to {best}: {result.Error}")
            spent.update(filter=c1 - c0, prioritize=c3 - c2, bind=c5 - c4)
        bound = copy.deepcopy(pod)
        bound["spec"]["nodeName"] = best
        running = copy.deepcopy(bound)
        running["status"] = {"phase": "Running"}
        c6 = time.process_time()
        view.on_change("Pod", pod, bound)
        view.on_change("Pod", bound, running)
        spent["watch_events"] = time.process_time() - c6
        if i >= 20:
            for stage, t in spent.items():
                cpu[stage] += t
        placed.append((best, view.placements[f"tput/{pod['metadata']['name']}"].devices))
    counted = max(1, pods - 20)
    sample = svc.metrics.registry.get_sample_value
    plans = {kind: int(sample("gpuaas_extender_decisions_total", {"verb": "queue-plan", "outcome": kind}) or 0)
             for kind in ("full", "updated")}
    per_pod = {k: round(1000 * v / counted, 3) for k, v in cpu.items()}
    out = {"bench": "extender_cpu", "nodes": nodes, "pods": pods, "queue_planning_min_pods": min_pods,
           "decide_in_filter": decide_in_filter, "extender_calls_per_pod": round(calls / pods, 3),
           "cpu_ms_per_pod": per_pod, "cpu_ms_per_pod_total": round(sum(per_pod.values()), 3),
           "target_ms": 1.0,
           "queue_plan_seconds": round(svc.metrics.registry.get_sample_value("gpuaas_extender_queue_plan_seconds_sum")
                                       or 0.0, 3),
           "queue_plans": int(sample("gpuaas_extender_queue_plan_seconds_count") or 0), "queue_plans_by_kind": plans,
           "pace_pods_per_second": pace,
           "reply_bytes_per_gpu_pod": {k: round(v / max(1, sum(not c for c, _ in pending)))
                                       for k, v in reply_bytes.items()},
           "placements_digest": hashlib.sha1(repr(placed).encode()).hexdigest()[:12],
           "bound": sum(p is not None for p in placed)}
    if cpu_only_share > 0:
        out.update(scheme=scheme, cpu_only_pods=sum(c for c, _ in pending))
    return out


def compare_schemes(nodes: int, pods: int, min_pods: int, seed: int, cpu_only_share: float,
                    repeats: int) -> dict[str, Any]:
    """The three schemes on the same pods, `repeats` rounds interleaved; the median CPU per pod of each."""
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SCHEMES}
    for r in range(repeats):
        for k in range(len(SCHEMES)):
            scheme = SCHEMES[(r + k) % len(SCHEMES)]
            runs[scheme].append(asyncio.run(run(nodes, pods, min_pods, seed, scheme, cpu_only_share)))
    out: dict[str, Any] = {"bench": "extender_cpu", "comparison": "cpu_pods_entry", "nodes": nodes, "pods": pods,
                           "cpu_only_share": cpu_only_share, "queue_planning_min_pods": min_pods,
                           "repeats": repeats}
    for scheme, rs in runs.items():
        totals = sorted(r["cpu_ms_per_pod_total"] for r in rs)
        out[scheme] = {"cpu_ms_per_pod_total": statistics.median(totals), "range": [totals[0], totals[-1]],
                       "extender_calls_per_pod": rs[0]["extender_calls_per_pod"],
                       "cpu_ms_per_pod": {k: statistics.median(r["cpu_ms_per_pod"][k] for r in rs)
                                          for k in rs[0]["cpu_ms_per_pod"]},
                       "placements_digest": sorted({r["placements_digest"] for r in rs})}
    return out


def compare_decide_in_filter(nodes: int, pods: int, min_pods: int, seed: int, pace: float,
                             repeats: int) -> dict[str, Any]:
    """The extender with decide_in_filter on (as shipped) and off on the same pods, `repeats` rounds interleaved: the
    median CPU per pod of each, and whether every pod landed on the same node and devices."""
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for r in range(repeats):
        for decide in ((True, False) if r % 2 == 0 else (False, True)):
            runs[decide].append(asyncio.run(run(nodes, pods, min_pods, seed, pace=pace, decide_in_filter=decide)))
    out: dict[str, Any] = {"bench": "extender_cpu", "comparison": "decide_in_filter", "nodes": nodes, "pods": pods,
                           "queue_planning_min_pods": min_pods, "pace_pods_per_second": pace, "repeats": repeats}
    for decide, rs in runs.items():
        totals = sorted(r["cpu_ms_per_pod_total"] for r in rs)
        out["decide_in_filter" if decide else "every_feasible_node"] = {
            "cpu_ms_per_pod_total": statistics.median(totals), "range": [totals[0], totals[-1]],
            "extender_calls_per_pod": rs[0]["extender_calls_per_pod"],
            "cpu_ms_per_pod": {k: statistics.median(r["cpu_ms_per_pod"][k] for r in rs)
                               for k in rs[0]["cpu_ms_per_pod"]},
            "reply_bytes_per_gpu_pod": rs[0]["reply_bytes_per_gpu_pod"],
            "placements_digest": sorted({r["placements_digest"] for r in rs})}
    out["same_placements"] = out["decide_in_filter"]["placements_digest"] == \
        out["every_feasible_node"]["placements_digest"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=600)
    parser.add_argument("--queue-planning-min-pods", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pace", type=float, default=0.0,
                        help="pods per second of the extender's clock (0: the wall clock)")
    parser.add_argument("--cpu-only-share", type=float, default=0.0,
                        help="with --cpu-pods-entry: the fraction of pods that ask for no GPU")
    parser.add_argument("--cpu-pods-entry", action="store_true",
                        help="instead: the three schemes for CPU-only pods on the same pods, interleaved")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of --cpu-pods-entry or --compare-decide-in-filter")
    parser.add_argument("--no-decide-in-filter", action="store_true",
                        help="the extender with decide_in_filter off: every feasible node, then prioritize")
    parser.add_argument("--compare-decide-in-filter", action="store_true",
                        help="instead: decide_in_filter on and off on the same pods, interleaved")
    args = parser.parse_args()
    if args.cpu_pods_entry:
        if not 0 < args.cpu_only_share < 1:
            parser.error("--cpu-pods-entry needs --cpu-only-share between 0 and 1 (e.g. 0.3)")
        out = compare_schemes(args.nodes, args.pods, args.queue_planning_min_pods, args.seed, args.cpu_only_share,
                              args.repeats)
    elif args.compare_decide_in_filter:
        out = compare_decide_in_filter(args.nodes, args.pods, args.queue_planning_min_pods, args.seed, args.pace,
                                       args.repeats)
    else:
        out = asyncio.run(run(args.nodes, args.pods, args.queue_planning_min_pods, args.seed, pace=args.pace,
                              decide_in_filter=not args.no_decide_in_filter))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

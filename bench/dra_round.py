"""Time the gang controller's DRA round (gangs.controller.GangController.reconcile with its inputs, as
gangs.service.Service takes them) on a DRA slice of the Alibaba trace's cluster, without a cluster: the replay's pods
arrive one at a time (`--mode sequential`) or all at once (`--mode burst`), and an in-process stand-in for the
apiserver, the informers and kube-scheduler applies what the controller writes (allocations, pins, gate removals),
binds released pods on their pinned node and feeds every change to the view as the informers would, after the round.

The stand-in is not Kubernetes: it checks nothing (kube-scheduler re-checks CPU and memory at binding; here a released
pod always binds). What it measures is the controller's own time per round and where it goes (`--profile`), on the
same objects (runtime.pools node_objects, runtime.draslices resource_slices, gpuaas.workloads claim templates) the
local cluster serves. Prints one JSON object: per round the pods waiting and the seconds, the allocation ratio.

`--start-after pods-first|claims-first` (burst): the controller's view is built once the burst exists, from lists of
every object in that order, as a controller started then builds it (the replay's is).
`--request-ms` gives each request the controller makes a latency (a sleep; requests in flight at once overlap), which
shows what writing claims one after another costs against writing them in parallel.

Usage:
  python bench/dra_round.py --nodes CSV --pods CSV [--slice 200] [--mode sequential|burst] [--pods-max 300]
      [--request-ms 0] [--cpu-pods none|first|held [--cpu-pods-from DUMP]] [--start-after pods-first|claims-first]
      [--profile N]   (cProfile of round N, top functions by cumulative time, to stderr)
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import dataclasses
import json
import pstats
import random
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from gangs.controller import GangController, finished
from gangs.dra import DraInputs, wanted_pod
from gangs.service import _group_member
from gpuaas.simulate.traces import load_nodes, load_pods
from gpuaas.workloads import dra_claim_template, dra_pod_for_demand, pod_for_demand
from runtime.draslices import resource_slices
from runtime.pools import node_objects, pools_from_node_specs
from scoring.clusterview import ClusterView
from scoring.dra import claim_key
from scoring.draview import CLAIM_KIND, SLICE_KIND
from scoring.fit import cpu_fits, feasible, memory_fits
from scoring.gangs import GANG_GATE, GangSettings, NodeFacts, created_at
from scoring.model import ClusterState
from scoring.placement import Placer
from scoring.policies import make_policy
from scoring.simulation import inflate, simulate

NS = "replay"
CREATED = "2026-11-24T00:00:00Z"
Obj = dict[str, Any]


class Stand:
    """The apiserver's objects and the informers' view of them; writes are applied to the objects at once and reach
    the view (`flush`) after the round, as watch events do."""

    def __init__(self, view: ClusterView, request_s: float = 0.0):
        self.view = view
        self.request_s = request_s  # each request's latency (a sleep): KubeClaims.allocate makes 3, pin 1, ungate 2
        self.pods: dict[str, Obj] = {}
        self.claims: dict[str, Obj] = {}
        self.slices: dict[str, Obj] = {}
        self.events: list[tuple[str, Obj | None, Obj]] = []
        self.writes = 0

    def put(self, kind: str, store: dict[str, Obj], key: str, new: Obj, *, now: bool = False) -> None:
        old = store.get(key)
        store[key] = new
        if now:
            self.view.on_change(kind, old, new)
        else:
            self.events.append((kind, old, new))

    def flush(self) -> None:
        events, self.events = self.events, []
        for kind, old, new in events:
            self.view.on_change(kind, old, new)

    # -- gangs.controller.PodWriter
    def pin(self, key: str, uid: str, hostname: str, released_at: float, planned: str = "") -> bool:
        self.writes += 1
        time.sleep(self.request_s)
        pod = copy.deepcopy(self.pods[key])
        pod["spec"].setdefault("nodeSelector", {})["kubernetes.io/hostname"] = hostname
        pod["metadata"].setdefault("annotations", {})["gpuaas.io/gang-released"] = f"{released_at:.3f}"
        self.put("Pod", self.pods, key, pod)
        return True

    def ungate(self, key: str, uid: str) -> bool:
        self.writes += 1
        time.sleep(2 * self.request_s)
        pod = copy.deepcopy(self.pods[key])
        pod["spec"]["schedulingGates"] = [g for g in pod["spec"].get("schedulingGates") or ()
                                          if g.get("name") != GANG_GATE]
        self.put("Pod", self.pods, key, pod)
        return True

    def delete(self, key: str, uid: str) -> bool:
        return False

    def note(self, key: str, uid: str, type_: str, reason: str, message: str) -> None:
        pass

    # -- gangs.dra.ClaimWriter
    def allocate(self, key: str, uid: str, allocation: Mapping[str, Any], pod_uid: str) -> bool:
        self.writes += 2  # the metadata update, then the status
        time.sleep(3 * self.request_s)
        claim = copy.deepcopy(self.claims[key])
        if (claim.get("status") or {}).get("allocation"):
            return False
        claim.setdefault("status", {})["allocation"] = copy.deepcopy(dict(allocation))
        claim["metadata"].setdefault("annotations", {})["gpuaas.io/allocated-for"] = pod_uid
        self.put(CLAIM_KIND, self.claims, key, claim)
        return True

    def deallocate(self, key: str, uid: str) -> bool:
        return False

    # -- kube-scheduler: a released pod binds on its pinned node
    def bind_released(self, hostname_node: Mapping[str, str]) -> int:
        bound = 0
        for key, pod in list(self.pods.items()):
            spec = pod["spec"]
            if spec.get("nodeName") or spec.get("schedulingGates") or "nodeSelector" not in spec:
                continue
            pod = copy.deepcopy(pod)
            pod["spec"]["nodeName"] = hostname_node[spec["nodeSelector"]["kubernetes.io/hostname"]]
            pod["status"] = {**pod.get("status", {}), "phase": "Running"}
            self.put("Pod", self.pods, key, pod)
            for s in pod["status"].get("resourceClaimStatuses") or ():
                ckey = f"{NS}/{s['resourceClaimName']}"
                claim = copy.deepcopy(self.claims[ckey])
                claim["status"]["reservedFor"] = [{"resource": "pods", "name": pod["metadata"]["name"],
                                                   "uid": pod["metadata"]["uid"]}]
                self.put(CLAIM_KIND, self.claims, ckey, claim)
            bound += 1
        return bound


def inputs(stand: Stand, controller: GangController) -> tuple[ClusterState, list[NodeFacts], list[Obj], Any, DraInputs]:
    """What gangs.service.Service._inputs takes from its informers and view."""
    view = stand.view
    state, _ = view.snapshot()
    facts = [NodeFacts.of(view.nodes[name]) for name in state.names]
    pods = [p for p in stand.pods.values() if _group_member(p) or wanted_pod(p)]
    dra = DraInputs(list(stand.slices.values()), list(stand.claims.values()), dict(view.nodes),
                    frozenset(p["metadata"].get("uid", "") for p in stand.pods.values() if not finished(p)),
                    view.dra.parsed())
    return state.copy(), facts, pods, view.workload(), dra


def new_pod(stand: Stand, i: int, demand: Any) -> None:
    """Pod i with its claim generated from its template (what kube-controller-manager does)."""
    name = f"p{i:05d}"
    pod = dra_pod_for_demand(name, NS, demand, gated=True)
    pod["metadata"].update(uid=f"uid-{name}", creationTimestamp=CREATED)
    pod["status"] = {"phase": "Pending"}
    template = dra_claim_template(demand, NS)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": f"{name}-gpu", "namespace": NS, "uid": f"c-{name}",
                          "ownerReferences": [{"kind": "Pod", "name": name, "uid": f"uid-{name}"}]},
             "spec": copy.deepcopy(template["spec"]["spec"]), "status": {}}
    stand.put("Pod", stand.pods, f"{NS}/{name}", pod, now=True)
    stand.put(CLAIM_KIND, stand.claims, claim_key(claim), claim, now=True)
    pod = copy.deepcopy(pod)
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
    stand.put("Pod", stand.pods, f"{NS}/{name}", pod, now=True)


def bind_cpu_pod(stand: Stand, i: int, demand: Any, reserved: ClusterState | None,
                 where: Mapping[str, str] | None = None) -> bool:
    """CPU-only pod i bound where the gpuaas policy ranks best among the nodes it fits on in the view's model (and,
    with `reserved`, beside the GPU pods planned there too), or on the node `where` names for it; False when it fits
    nowhere."""
    name = f"p{i:05d}"
    state, _ = stand.view.snapshot()
    state = state.copy()
    if where is not None:
        if name not in where:  # not bound in that replay's run: after the rounds here
            return False
        node = where[name]
    else:
        ok = feasible(state, demand) & (feasible(reserved, demand) if reserved is not None else True)
        choice = Placer(state, make_policy("gpuaas", state, stand.view.workload())).choose(demand, ok) \
            if ok.any() else None
        if choice is None:
            return False
        if reserved is not None:
            reserved.place(choice.node, demand, ())
        node = state.names[choice.node]
    pod = pod_for_demand(name, NS, demand)
    pod["metadata"].update(uid=f"uid-{name}", creationTimestamp=CREATED)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    stand.put("Pod", stand.pods, f"{NS}/{name}", pod, now=True)
    return True


def cpu_first(stand: Stand, pods: Sequence[Any], cpu_pods: Sequence[tuple[int, Any]], *,
              held: bool, where: Mapping[str, str] | None = None) -> list[tuple[int, Any]]:
    """Bind the CPU-only pods before the first round (see --cpu-pods); the pods left for after the rounds."""
    reserved = None
    if held:  # the waiting GPU pods planned as the controller's first round will (the place-one-pod loop, in order)
        state, _ = stand.view.snapshot()
        reserved = state.copy()
        placer = Placer(reserved, make_policy("gpuaas", reserved, stand.view.workload()))
        for pod in pods:
            if pod.gpus:
                placer.place(dataclasses.replace(pod, claims=True))  # asks through its claim: DRA nodes only
    return [(i, d) for i, d in cpu_pods if not bind_cpu_pod(stand, i, d, reserved, where)]


def extender_cpu_pods(stand: Stand, cpu_pods: Sequence[tuple[int, Any]], *,
                      min_pods: int = 16) -> tuple[list[tuple[int, Any]], dict[str, float]]:
    """Bind the CPU-only pods before the first round as the shipped deployment places them: the extender's CPU-pods
    entry (extender.service.ExtenderService.filter_cpu_pods, then prioritize_cpu_pods) on a view of its own, built
    from lists of every object (pods first), with joint queue planning on; kube-scheduler's part is its resource fit
    (the candidates are the nodes whose CPU and memory fit the pod; the DRA nodes' GPUs are not its concern) and the
    best score. Returns the pods that fit nowhere (none here: kube-scheduler would retry them) and the extender's
    decision counts."""
    from extender.metrics import Metrics
    from extender.service import ExtenderService, QueuePlanning
    from extender.wire import ExtenderArgs

    async def no_lookup(namespace: str, name: str) -> dict[str, Any] | None:
        return None

    view = relisted(stand.view, stand.slices, [("Pod", stand.pods), (CLAIM_KIND, stand.claims)])
    metrics = Metrics()
    created = created_at({"metadata": {"creationTimestamp": CREATED}})  # the burst arrived just now
    service = ExtenderService(view, cast(Any, None), metrics, no_lookup,
                              queue_planning=QueuePlanning(min_pods=min_pods), wall_clock=lambda: created)
    left = []
    for i, demand in cpu_pods:
        name = f"p{i:05d}"
        pod = pod_for_demand(name, NS, demand)
        pod["metadata"].update(uid=f"uid-{name}", creationTimestamp=CREATED)
        state, _ = view.snapshot()
        fits = cpu_fits(state, demand) & memory_fits(state, demand)
        names = [state.names[r] for r in np.flatnonzero(fits)]
        if not names:
            left.append((i, demand))
            continue
        passed = service.filter_cpu_pods(ExtenderArgs(Pod=pod, NodeNames=names)).NodeNames or []
        if not passed:  # held on every node: kube-scheduler retries it later (after the rounds here)
            left.append((i, demand))
            continue
        scored = service.prioritize_cpu_pods(ExtenderArgs(Pod=pod, NodeNames=passed))
        node = scored.pick or passed[0]
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
        stand.put("Pod", stand.pods, f"{NS}/{name}", pod, now=True)
        view.on_change("Pod", None, pod)
    counts = {f"{s.labels['verb']}/{s.labels['outcome']}": s.value for m in metrics.decisions.collect()
              for s in m.samples if s.name.endswith("_total")}
    return left, counts


def relisted(view: ClusterView, slices: Mapping[str, Obj], lists: Sequence[tuple[str, Mapping[str, Obj]]]
              ) -> ClusterView:
    """A new view of the same objects, as a controller started now builds it: nodes, slices, then `lists` in order."""
    out = ClusterView("gpuaas")
    for node in view.nodes.values():
        out.on_change("Node", None, node)
    for s in slices.values():
        out.on_change(SLICE_KIND, None, s)
    for kind, store in lists:
        for obj in store.values():
            out.on_change(kind, None, obj)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--pods", required=True)
    parser.add_argument("--slice", type=int, default=200)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--tune", type=float, default=1.5)
    parser.add_argument("--mode", choices=("sequential", "burst"), default="sequential")
    parser.add_argument("--pods-max", type=int, default=300, help="GPU pods replayed (the first of the list)")
    parser.add_argument("--profile", type=int, default=0, help="profile this round (1-based)")
    parser.add_argument("--cpu-pods", choices=("none", "first", "held", "extender"), default="none",
                        help="burst: leave the trace's CPU-only pods out (none), or bind them before the controller's "
                             "first round, each where the gpuaas policy ranks best on the live model (first: what "
                             "the CPU-pods entry does while the GPU pods wait gated) or only where it fits beside a "
                             "plan of the waiting GPU pods (held; those that fit nowhere there bind after the rounds), "
                             "or through the extender's CPU-pods entry, filter and prioritize (extender)")
    parser.add_argument("--cpu-pods-from", type=Path,
                        help="with --cpu-pods first: bind each CPU-only pod on the node it has in this dump of a "
                             "replay of the same slice and pods (bench/extender_replay.py --dump)")
    parser.add_argument("--start-after", choices=("pods-first", "claims-first"),
                        help="burst: the controller starts once the burst exists (as the replay's does): its view is "
                             "built from lists of every object, the pods' before the claims' or after")
    parser.add_argument("--request-ms", type=float, default=0.0,
                        help="latency of each request of the stand-in apiserver (a sleep in the writing thread)")
    args = parser.parse_args()

    nodes = random.Random(args.seed).sample(load_nodes(args.nodes), args.slice)
    if args.cpu_pods != "none" and args.mode != "burst":
        parser.error("--cpu-pods first|held is a burst's question: use it with --mode burst")
    trace = [p for p in load_pods(args.pods) if p.gpus or args.cpu_pods != "none"]
    capacity = ClusterState(nodes).total_gpu_milli
    pods = inflate(trace, capacity, args.tune, np.random.default_rng(args.seed))[:args.pods_max]
    spec = pools_from_node_specs(nodes, dra=True)
    view = ClusterView("gpuaas")
    stand = Stand(view, args.request_ms / 1000)
    hostname_node = {}
    for pool in spec.pools:
        for n in node_objects(pool):
            name = n["metadata"]["name"]
            view.on_change("Node", None, n)
            hostname_node[n["metadata"]["labels"].get("kubernetes.io/hostname", name)] = name
            for s in resource_slices(pool, name):
                stand.put(SLICE_KIND, stand.slices, s["metadata"]["name"], s, now=True)
    settings = GangSettings(policy="gpuaas", time_limit_s=10.0, bind_timeout_s=1e6, reserve_after_s=1e7)
    controller = GangController(settings, stand, claims=stand)
    rounds: list[dict[str, Any]] = []
    now = 1_800_000_000.0
    profiler = cProfile.Profile() if args.profile else None

    def one_round() -> None:
        nonlocal now
        now += 1.0
        n = len(rounds) + 1
        t = time.perf_counter()
        if profiler is not None and n == args.profile:
            profiler.enable()
        state, facts, held, workload, dra = inputs(stand, controller)
        t_in = time.perf_counter()
        report = controller.reconcile(state, facts, held, now, workload, dra)
        if profiler is not None and n == args.profile:
            profiler.disable()
        t_end = time.perf_counter()
        stand.flush()
        bound = stand.bind_released(hostname_node)
        stand.flush()
        rounds.append({"round": n, "held": len(held), "released": len(report.released), "bound": bound,
                       "waiting": len(report.waiting), "inputs_s": round(t_in - t, 4),
                       "reconcile_s": round(t_end - t_in, 4)})

    started = time.perf_counter()
    extender_decisions = None
    if args.mode == "sequential":
        for i, demand in enumerate(pods):
            new_pod(stand, i, demand)
            one_round()
    else:
        for i, demand in enumerate(pods):
            if demand.gpus:
                new_pod(stand, i, demand)
        cpu_pods = [(i, d) for i, d in enumerate(pods) if not d.gpus]
        where = None
        if args.cpu_pods_from:  # where a replay's kube-scheduler put them (bench/extender_replay.py --dump)
            dump = json.loads(args.cpu_pods_from.read_text())
            where = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in dump["pods"]
                     if not p["spec"].get("resourceClaims") and p["spec"].get("nodeName")}
        if args.cpu_pods == "extender":
            later, extender_decisions = extender_cpu_pods(stand, cpu_pods)
        else:
            later = cpu_first(stand, pods, cpu_pods, held=args.cpu_pods == "held", where=where) if cpu_pods else []
        if args.start_after:  # the controller starts now: its view is its informers' first lists, in this order
            kinds = [("Pod", stand.pods), (CLAIM_KIND, stand.claims)]
            stand.view = relisted(stand.view, stand.slices, kinds if args.start_after == "pods-first" else kinds[::-1])
        while True:
            one_round()
            if not rounds[-1]["released"] or len(rounds) >= 20:
                break
        for i, demand in later:
            bind_cpu_pod(stand, i, demand, None)
    used = sum(d.total_gpu_milli for i, d in enumerate(pods)
               if f"{NS}/p{i:05d}" in stand.pods and stand.pods[f"{NS}/p{i:05d}"]["spec"].get("nodeName"))
    sim = simulate(nodes, trace, "gpuaas", args.seed, tune=args.tune)
    secs = [r["inputs_s"] + r["reconcile_s"] for r in rounds]
    print(json.dumps({
        "bench": "dra_round", "slice_nodes": args.slice, "mode": args.mode, "pods": len(pods),
        "cpu_pods": args.cpu_pods, "cpu_only_pods": sum(1 for d in pods if not d.gpus),
        "cpu_only_pods_bound": sum(1 for i, d in enumerate(pods) if not d.gpus and f"{NS}/p{i:05d}" in stand.pods),
        "request_ms": args.request_ms,
        "allocation_ratio": round(100 * used / capacity, 2),
        "simulator_first_pods_ratio": round(100 * sum(
            d.total_gpu_milli for d, node in zip(sim.arrivals[:len(pods)], sim.node_of[:len(pods)], strict=True)
            if node >= 0) / capacity, 2) if sim.node_of is not None else None,
        "rounds": len(rounds), "round_s_mean": round(sum(secs) / len(secs), 4),
        "round_s_last50_mean": round(sum(secs[-50:]) / len(secs[-50:]), 4),
        "inputs_s_mean": round(sum(r["inputs_s"] for r in rounds) / len(rounds), 4),
        "extender_decisions": extender_decisions,
        "writes": stand.writes, "total_s": round(time.perf_counter() - started, 1),
        "per_round": rounds if args.mode == "burst" else rounds[-3:],
    }, indent=1))
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()

"""Replay Alibaba trace pods into a KWOK slice of the trace's cluster through the real kube-scheduler and the gpuaas
extender, and compare with `gpuaas simulate packing`'s engine (scoring.simulation.simulate) on the same slice and pods,
in the same invocation.

Both sides get the same pod list: the trace inflated to `--tune` x the slice's GPU capacity and shuffled by the seed,
exactly as the simulator does it (scoring.simulation.inflate with the seed's first random draws). The simulator places
them one by one in that order. The cluster gets them in one of two ways (`--mode`):

  sequential  pod i is created only once pod i-1 is bound or has failed (its PodScheduled condition False, seen once:
              reason Unschedulable; any other reason counts too and is reported by reason), or after --pod-timeout;
              then the next one. A pod that failed stays in the scheduler's queue and may bind later: what counts is
              what is bound at the end.
  burst       every pod is created, in order, while kube-scheduler is stopped; then the scheduler is started.
              v1.36.3 does not take them in creation order (measured: Kendall's tau of bind order against creation
              order about 0, i.e. unrelated), so the bind order (watched) is recorded and the pairs bound out of
              creation order are counted.

Either way the run ends only after `--quiet-s` seconds without a new binding (or when every pod is bound): a pod
marked Unschedulable is retried and may bind later, so "every pod bound or Unschedulable" is not the end.

Printed for both sides (one JSON object): the GPU allocation ratio at the end and when the first GPU pod failed, pods
placed and failed by kind, GPUs left partly used (0 < used < 1000 milli; kubernetes: from each bound pod's
gpuaas.io/devices annotation), and where the free GPU capacity is at the end (GPUs an unplaced GPU pod would fit but
whose node is short of CPU or memory, fragments no unplaced pod fits, capacity an unplaced pod fits now).
Also printed: the simulator with the deployment's departures from it put in one at a time and together
(simulator_with_the_deployments_departures: where CPU-only pods go, the extender's learned workload and tie order),
which says how many of the points kubernetes lost each accounts for.

CPU-only pods: by default only GPU pods reach the extender (extender_entry's managedResources) and kube-scheduler
alone places the others; --cpu-pods-entry adds the prioritize-only entry for them (the shipped deployment's);
--all-pods sends every pod through every verb; --gpu-only leaves them out of the replay.

--dra (docs/devices.md, "DRA mode"): the slice's GPU pools are declared `dra: true` (the local cluster publishes their
GPUs as ResourceSlices in the NVIDIA driver's shape, no nvidia.com/gpu), and each GPU pod asks through a
ResourceClaimTemplate as a user writes it (gpuaas.workloads.dra_claim_template: N whole GPUs of gpu.nvidia.com, or a
share of gpu-share.gpuaas.io asking capacity `share` in thousandths); CPU-only pods are as without --dra.
`--dra-allocator gpuaas` (default): the pods are created with the gate gpuaas.io/gang (what the webhook adds) and
`gpuaas gangs` (dra_gangs_config) allocates each claim and releases the pod, kube-scheduler binds; in sequential mode a
pod failed when the controller decided it waits (its /explain), and in burst mode the controller starts after every
pod and claim exists. `--dra-allocator kube-scheduler`: gpuaas off, kube-scheduler's default configuration, no
extender, its DynamicResources plugin allocates first fit. The allocation ratio counts the bound pods' demands; the
claims' own allocations are read back and checked against them (kubernetes.dra: the ratio of what the claims hold,
devices given twice, claims not as asked or off the pod's node).
Usage:
  python bench/extender_replay.py --nodes CSV --pods CSV [--mode sequential|burst] [--slice 100] [--tune 1.5]
      [--seed 42] [--all-pods | --cpu-pods-entry] [--gpu-only] [--quiet-s 30]
      [--extender-option queue_planning_min_pods=0] [--dump FILE]
      [--dra [--dra-allocator gpuaas|kube-scheduler] [--gangs-option KEY=VALUE]]
"""
from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import threading
import time
import urllib.request
from bisect import bisect_right, insort
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from scoring.clusterview import EMPTY_CLUSTER_WORKLOAD_POD, WORKLOAD_WINDOW, workload_due
from scoring.fit import cpu_fits, devices_fit, feasible, memory_fits
from scoring.fragmentation import Workload
from scoring.kubeobjects import DEVICES_ANNOTATION, assigned_devices, node_spec, pod_demand
from scoring.model import MILLI, ClusterState, NodeSpec, PodDemand
from scoring.placement import Placer
from scoring.policies import make_policy
from scoring.simulation import SimulationResult, inflate, simulate

NAMESPACE = "replay"


# -- pure helpers (tests/bench/test_extender_replay.py) ---------------------------------------------------------------

def kind(pod: PodDemand) -> str:
    return "cpu-only" if not pod.gpus else "gpu-share" if pod.is_share else f"{pod.gpus}-gpu"


def kind_rank(name: str) -> tuple[int, int]:
    """Sort key of kind(): cpu-only, gpu-share, 1-gpu, 2-gpu, ..."""
    if name == "cpu-only":
        return (0, 0)
    if name == "gpu-share":
        return (1, 0)
    return (2, int(name.split("-")[0]))


def by_kind(arrived: Sequence[PodDemand], placed: Sequence[bool]) -> dict[str, dict[str, int]]:
    """{kind: {arrived, placed, failed}} in kind_rank order."""
    came: Counter[str] = Counter()
    got: Counter[str] = Counter()
    for pod, ok in zip(arrived, placed, strict=True):
        came[kind(pod)] += 1
        got[kind(pod)] += bool(ok)
    return {k: {"arrived": came[k], "placed": got[k], "failed": came[k] - got[k]} for k in sorted(came, key=kind_rank)}


def out_of_order(creation_ranks_in_bind_order: Sequence[int]) -> dict[str, float]:
    """How far the bind order departs from the creation order. The argument lists, in the order the pods were bound,
    each pod's position in the creation order. `adjacent`: consecutive binds whose pods were created the other way
    round; `pairs`: all pairs of bound pods bound in the opposite order to their creation (inversions), out of
    `pairs_total`."""
    ranks = list(creation_ranks_in_bind_order)
    adjacent = sum(1 for a, b in pairwise(ranks) if a > b)
    seen: list[int] = []
    pairs = 0
    for r in ranks:  # pods bound before r but created after it
        pairs += len(seen) - bisect_right(seen, r)
        insort(seen, r)
    n = len(ranks)
    total = n * (n - 1) // 2
    # Kendall's tau of bind order against creation order: 1 in order, 0 unrelated, -1 reversed.
    return {"binds": n, "adjacent": adjacent, "adjacent_total": max(0, n - 1), "pairs": pairs, "pairs_total": total,
            "kendall_tau": round(1 - 2 * pairs / total, 3) if total else 1.0}


def gpu_use(placements: Iterable[tuple[str, Sequence[int], PodDemand]]) -> dict[tuple[str, int], int]:
    """GPU milli in use per (node, GPU index) from (node, devices, demand) of bound pods. Pods without devices
    (CPU-only pods, or GPU pods bound without the gpuaas.io/devices annotation) add nothing."""
    use: Counter[tuple[str, int]] = Counter()
    for node, devices, pod in placements:
        if not pod.gpus or pod.mig_profile:
            continue
        for d in devices:
            use[(node, d)] += pod.gpu_milli
    return dict(use)


def partly_used(use: dict[tuple[str, int], int]) -> int:
    """GPUs with 0 < used < 1000 milli."""
    return sum(1 for v in use.values() if 0 < v < MILLI)


def partly_used_in_state(state: ClusterState) -> int:
    """The same count for a model cluster (the simulator's final_state): GPUs (not MIG) with 0 < free < 1000."""
    real = state.gpu_exists & ~state.mig_enabled
    return int(((state.gpu_left > 0) & (state.gpu_left < MILLI) & real).sum())


def ratio(used_milli: float, total_milli: float) -> float:
    return round(100.0 * used_milli / total_milli, 2) if total_milli else 0.0


def first_gpu_failure(pods: Sequence[PodDemand], placed: Sequence[bool]) -> int | None:
    """Index of the first GPU pod not placed, or None."""
    return next((i for i, (p, ok) in enumerate(zip(pods, placed, strict=True)) if p.gpus and not ok), None)


def free_gpu_breakdown(state: ClusterState, unplaced: Sequence[PodDemand]) -> dict[str, Any]:
    """Where the free GPU capacity of a final cluster is, against the GPU pods left unplaced: on nodes where one of
    them fits now (the scheduler has not placed it: a retry not yet made), on nodes where one fits by GPUs and model
    but not by CPU or memory (GPUs stranded by the CPU and memory other pods took), or elsewhere (fragments too small
    or of a model none of them accepts). Each node goes to the first class it meets in that order. Also the CPU-only
    pods on the nodes short of CPU or memory and the CPU they hold, and how many unplaced GPU pods fit now."""
    n = len(state)
    fits_now = np.zeros(n, dtype=bool)
    gpus_fit = np.zeros(n, dtype=bool)
    fit_somewhere = 0
    by_shape: dict[PodDemand, bool] = {}
    for pod in unplaced:
        if not pod.gpus:
            continue
        shape = replace(pod, name="")
        if shape not in by_shape:
            dev = state.model_allowed(pod) & devices_fit(state, pod)
            now = dev & cpu_fits(state, pod) & memory_fits(state, pod)
            gpus_fit |= dev
            fits_now |= now
            by_shape[shape] = bool(now.any())
        fit_somewhere += by_shape[shape]
    free = np.where(state.gpu_exists, state.gpu_left, 0).sum(axis=1)
    short = gpus_fit & ~fits_now
    cpu_pods = [(i, p) for i in np.flatnonzero(short) for p, _ in state.pods_on[i] if not p.gpus]
    return {
        "free_gpu_milli": int(free.sum()),
        "on_nodes_where_an_unplaced_gpu_pod_fits_now": int(free[fits_now].sum()),
        "on_nodes_short_of_cpu_or_memory": int(free[short].sum()),
        "elsewhere_fragments_or_model": int(free[~gpus_fit].sum()),
        "nodes_short_of_cpu_or_memory": int(short.sum()),
        "cpu_only_pods_on_those_nodes": len(cpu_pods),
        "cpu_milli_of_those_cpu_only_pods": int(sum(p.cpu_milli for _, p in cpu_pods)),
        "unplaced_gpu_pods_that_fit_now": int(fit_somewhere),
    }


def cpu_only_on_gpu_nodes(state: ClusterState) -> dict[str, int]:
    """CPU-only pods on nodes with GPUs, the nodes holding them, and the CPU they take."""
    pods = [(i, p) for i in range(len(state)) if state.gpu_count[i] for p, _ in state.pods_on[i] if not p.gpus]
    return {"pods": len(pods), "nodes": len({i for i, _ in pods}), "cpu_milli": sum(p.cpu_milli for _, p in pods)}



def place_in_order(nodes: Sequence[NodeSpec], trace: Sequence[PodDemand], pods: Sequence[PodDemand],
                   order: Sequence[int], policy: str, seed: int, tune: float, *, workload: Workload | str = "trace",
                   cpu_random: bool = False, cpu_first_fit: Sequence[int] | None = None,
                   cpu_nodes: dict[int, int] | None = None,
                   tie_rank: np.ndarray | None = None) -> tuple[ClusterState, list[bool]]:
    """The simulator's engine (scoring.simulation.simulate: same policy, random draws and tie order) on `pods` taken in
    `order` (indices), with one or more factors of the deployment changed. `workload`: "trace" (the simulator's,
    FGD's typical pods of the whole trace), "learned" (the extender's: re-derived from the pods arrived so far, as
    ClusterView does), or a Workload. `cpu_random`: CPU-only pods go to a feasible node drawn at random (kube-scheduler
    with the gpuaas profile when they are not sent to the extender: no resource scorer left, ties broken at random)
    instead of where the policy puts them; `cpu_first_fit` (node rows in order): CPU-only pods go to the first
    feasible node in that order (what kube-scheduler v1.36.3 nearly does with them, see first_fit_order);
    `cpu_nodes` (pod index -> node row): CPU-only pods go where kubernetes put them (those not in it stay unplaced).
    `tie_rank`: the node order ties go to (default: the simulator's random one). Returns the final state and, per
    pod index, whether it was placed."""
    rng = np.random.default_rng(seed)
    state = ClusterState(nodes)
    inflate(trace, state.total_gpu_milli, tune, rng)  # the draws simulate() makes before the policy's
    learned = workload == "learned"
    fixed = Workload.typical(trace) if workload == "trace" else workload if isinstance(workload, Workload) else None
    seen: list[PodDemand] = []

    def current() -> Workload:
        return fixed if fixed is not None else Workload.typical(seen[-WORKLOAD_WINDOW:] or [EMPTY_CLUSTER_WORKLOAD_POD])

    if learned and order:
        seen.append(pods[order[0]])
    chooser = make_policy(policy, state, current(), rng)
    drawn = rng.permutation(len(state))
    tie_rank = drawn if tie_rank is None else tie_rank
    placer = Placer(state, chooser, tie_rank)
    picks = np.random.default_rng([seed, 1])
    placed = [False] * len(pods)
    new = 0
    for k, i in enumerate(order):
        pod = pods[i]
        if learned and k:
            seen.append(pod)
            new += 1
            if workload_due(new, len(seen)):
                new = 0
                placer = Placer(state, make_policy(policy, state, current(), rng), tie_rank)
        if cpu_nodes is not None and not pod.gpus:
            if i in cpu_nodes:
                state.place(cpu_nodes[i], pod, ())
                placer.policy.observe(cpu_nodes[i])
                placed[i] = True
            continue
        if cpu_first_fit is not None and not pod.gpus:
            fits = feasible(state, pod)
            node = next((int(r) for r in cpu_first_fit if fits[r]), -1)
            if node >= 0:
                state.place(node, pod, ())
                placer.policy.observe(node)
                placed[i] = True
            continue
        if cpu_random and not pod.gpus:
            fit = np.flatnonzero(feasible(state, pod))
            if fit.size:
                node = int(fit[picks.integers(fit.size)])
                state.place(node, pod, ())
                placer.policy.observe(node)
                placed[i] = True
            continue
        placed[i] = placer.place(pod) is not None
    return state, placed


def cluster_names(nodes: Sequence[NodeSpec], pool_names: Sequence[str]) -> list[str]:
    """The name each of `nodes` has in the cluster runtime.pools.pools_from_node_specs makes of them: one pool per
    distinct (GPU model, GPUs, CPU, memory) in order of first appearance (`pool_names`, in that order), its nodes
    named <pool>-0000, <pool>-0001, ... in the order they appear in `nodes`."""
    pool_of: dict[tuple[str, int, int, int], int] = {}
    seen: Counter[int] = Counter()
    out = []
    for s in nodes:
        i = pool_of.setdefault((s.gpu_model if s.gpus else "", s.gpus, s.cpu_milli, s.memory_mib), len(pool_of))
        out.append(f"{pool_names[i]}-{seen[i]:04d}")
        seen[i] += 1
    return out


def first_fit_order(names: Sequence[str]) -> list[int]:
    """Rows of `names` (cluster_names) in the order the harness creates the nodes: pool by pool, then by index.
    kube-scheduler v1.36.3 breaks score ties at random only between nodes an extender scored
    (prioritizeNodes sets NodePluginScores.Randomizer there alone; kubernetes/kubernetes#141024): a pod no extender
    scores, with no resource scorer left in the profile, goes to the first node of its feasible list, which the
    parallel filter fills in roughly node order, so CPU-only pods land nearly first-fit in that order."""
    return sorted(range(len(names)), key=lambda i: (int(names[i].split("-")[0][1:]), names[i]))


def variant_summary(state: ClusterState, pods: Sequence[PodDemand], placed: Sequence[bool]) -> dict[str, Any]:
    used = sum(p.total_gpu_milli for p, ok in zip(pods, placed, strict=True) if ok)
    return {
        "allocation_ratio": ratio(used, state.total_gpu_milli),
        "failed_by_kind": {k: v["failed"] for k, v in by_kind(pods, placed).items()},
        "partly_used_gpus": partly_used_in_state(state),
        "free_gpu_at_end": free_gpu_breakdown(state, [p for p, ok in zip(pods, placed, strict=True) if not ok]),
    }


def simulator_variants(nodes: Sequence[NodeSpec], trace: Sequence[PodDemand], pods: Sequence[PodDemand],
                       args: argparse.Namespace, bind_order: Sequence[int] | None,
                       cpu_nodes: dict[int, int] | None = None, names: Sequence[str] | None = None
                       ) -> dict[str, Any]:
    """The simulator with the deployment's departures from it put in one at a time, then together: which of them
    accounts for the points kubernetes lost. `bind_order`: the creation indices in the order kubernetes bound them;
    `cpu_nodes`: the node row (of `nodes`) kubernetes put each bound CPU-only pod on; `names`: the cluster's name of
    each of `nodes` (the extender breaks ties by name order)."""
    creation = list(range(len(pods)))
    run = {"policy": args.policy, "seed": args.seed, "tune": args.tune}
    factors: dict[str, dict[str, Any]] = {"none (must equal the simulator)": {}}
    together: dict[str, Any] = {}
    if not args.all_pods and not getattr(args, "cpu_pods_entry", False):  # kube-scheduler alone places them
        factors["cpu_only_pods_at_random"] = {"cpu_random": True}
        if names is not None:
            factors["cpu_only_pods_first_fit_in_node_order"] = {"cpu_first_fit": first_fit_order(names)}
            together["cpu_first_fit"] = first_fit_order(names)
    if cpu_nodes is not None:  # pinned at arrival, whatever the GPU pods did meanwhile: only roughly the same state
        factors["cpu_only_pods_where_kubernetes_put_them"] = {"cpu_nodes": cpu_nodes}
    if names is not None:
        rank = np.empty(len(names), dtype=np.int64)
        rank[np.argsort(np.array(names), kind="stable")] = np.arange(len(names))
        factors["extender_tie_order"] = {"tie_rank": rank}
        together["tie_rank"] = rank
    if args.mode == "sequential":
        factors["workload_learned_from_arrivals"] = {"workload": "learned"}
        together["workload"] = "learned"
    else:
        # The extender saw every pod arrive before the scheduler started: its workload is the replayed pods'.
        factors["workload_of_the_replayed_pods"] = {"workload": Workload.typical(pods)}
        together["workload"] = Workload.typical(pods)
        if bind_order is not None:
            # Bound pods in bind order, then the rest in creation order: when kubernetes tried the pods it did not
            # bind is unknown, so this order favours the simulator (it meets kubernetes' winners first) and is left
            # out of all_of_the_above.
            rest = sorted(set(creation) - set(bind_order))
            factors["kubernetes_bind_order_then_the_unbound"] = {"order": [*bind_order, *rest]}
    if len(together) > 1:
        factors["all_of_the_above"] = together
    out: dict[str, Any] = {}
    for name, f in factors.items():
        f = dict(f)
        order = f.pop("order", creation)
        state, placed = place_in_order(nodes, trace, pods, order, **run, **f)
        out[name] = variant_summary(state, pods, placed)
    return out


def simulator_summary(sim: SimulationResult) -> dict[str, Any]:
    assert sim.node_of is not None and sim.final_state is not None
    placed = [bool(x >= 0) for x in sim.node_of]
    first = first_gpu_failure(sim.arrivals, placed)
    unplaced = [p for p, ok in zip(sim.arrivals, placed, strict=True) if not ok]
    return {
        "allocation_ratio": ratio(sim.used_milli[-1], sim.total_gpu_milli),
        "first_gpu_failure": None if first is None else {
            "pod_index": first, "allocation_ratio": ratio(sim.used_milli[first], sim.total_gpu_milli),
            "arrived_ratio": ratio(sim.arrived_milli[first], sim.total_gpu_milli)},
        "placed_pods": sum(placed), "failed_pods": sim.failed,
        "by_kind": by_kind(sim.arrivals, placed),
        "partly_used_gpus": partly_used_in_state(sim.final_state),
        "cpu_only_pods_on_gpu_nodes": cpu_only_on_gpu_nodes(sim.final_state),
        "free_gpu_at_end": free_gpu_breakdown(sim.final_state, unplaced),
        "seconds": round(sim.wall_seconds, 2),
    }


# -- the cluster side -------------------------------------------------------------------------------------------------

def unschedulable(pod: dict[str, Any]) -> str | None:
    """The reason of a PodScheduled=False condition, or None."""
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("reason") or "?")
    return None


class PodWatch:
    """Watches the replay namespace: the order and time pods are bound (first event with spec.nodeName; watch events
    come in etcd order, so this is the order the bindings were written), when each was first marked Unschedulable,
    and the GPU milli bound at any moment. Waiters use `cond`."""

    def __init__(self, core: Any, demand_of: dict[str, PodDemand], t0: float) -> None:
        self.core = core
        self.demand_of = demand_of
        self.t0 = t0
        self.cond = threading.Condition()
        self.bound: dict[str, float] = {}  # name -> seconds since t0, in bind order
        self.failed: dict[str, tuple[float, str]] = {}  # name -> (first seen, reason)
        self.bound_gpu_milli = 0
        self.last_bind = t0
        self._stop = False
        self.listed = threading.Event()  # the first list is in: bindings from now on are seen in order
        self.errors: list[str] = []
        self.not_failures: frozenset[str] = frozenset()  # PodScheduled=False reasons not counted (DRA: SchedulingGated)
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self.listed.wait(60):
            raise SystemExit("the pod watch could not list the replay namespace")

    def stop(self) -> None:
        self._stop = True
        self._thread.join(timeout=40)

    def _see(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        now = time.monotonic()
        with self.cond:
            if pod["spec"].get("nodeName") and name not in self.bound:
                self.bound[name] = now - self.t0
                self.last_bind = now
                demand = self.demand_of.get(name)
                self.bound_gpu_milli += demand.total_gpu_milli if demand else 0
                self.cond.notify_all()
            elif name not in self.failed and not pod["spec"].get("nodeName"):
                reason = unschedulable(pod)
                if reason is not None and reason not in self.not_failures:
                    self.failed[name] = (now - self.t0, reason)
                    self.cond.notify_all()

    def _run(self) -> None:
        from kubernetes import watch
        rv = None
        while not self._stop:
            try:
                if rv is None:
                    listed = json.loads(self.core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)
                    for pod in listed["items"]:
                        self._see(pod)
                    rv = listed["metadata"]["resourceVersion"]
                    self.listed.set()
                w = watch.Watch()
                for ev in w.stream(self.core.list_namespaced_pod, NAMESPACE, resource_version=rv,
                                   timeout_seconds=10, deserialize=False, allow_watch_bookmarks=True):
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        rv = None  # expired: list again
                        break
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self._see(obj)
                    if self._stop:
                        break
            except Exception as err:  # a dropped connection: list again, never lose a binding
                self.errors.append(repr(err)[:200])
                rv = None
                time.sleep(0.5)

    def wait(self, name: str, timeout: float, probe: Callable[[], bool] | None = None) -> str:
        """Until pod `name` is bound ("bound") or marked unschedulable ("failed"), or `timeout` ("timeout").
        `probe`: asked every 0.5 s (outside the lock) whether the pod failed by another measure (DRA with gpuaas: the
        gang controller decided it does not fit)."""
        end = time.monotonic() + timeout
        while True:
            with self.cond:
                if name in self.bound:
                    return "bound"
                if name in self.failed:
                    return "failed"
                left = end - time.monotonic()
                if left <= 0:
                    return "timeout"
                self.cond.wait(left if probe is None else min(left, 0.5))
                if name in self.bound or name in self.failed or probe is None:
                    continue
            if probe():
                with self.cond:
                    return "bound" if name in self.bound else "failed"

    def quiet(self, total: int, quiet_s: float, deadline: float, since: float) -> str:
        """Until every pod is bound ("all bound"), or `quiet_s` pass without a new binding ("quiet"), or `deadline`."""
        with self.cond:
            while True:
                if len(self.bound) >= total:
                    return "all bound"
                now = time.monotonic()
                if now - max(self.last_bind, since) >= quiet_s:
                    return "quiet"
                if now >= deadline:
                    return "timeout"
                self.cond.wait(min(1.0, deadline - now, quiet_s - (now - max(self.last_bind, since)) + 0.01))


def kubernetes_state(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
                     ) -> tuple[ClusterState, list[tuple[str, tuple[int, ...], PodDemand]], dict[str, int]]:
    """The cluster at the end as the model sees it: its nodes (from the Node objects) and its bound pods placed on the
    devices of their gpuaas.io/devices annotation. GPU pods bound without it (not by gpuaas) are placed on the first
    GPUs free enough, and counted."""
    specs = [node_spec(n) for n in nodes]
    state = ClusterState(specs)
    index = {s.name: i for i, s in enumerate(specs)}
    placements: list[tuple[str, tuple[int, ...], PodDemand]] = []
    issues = Counter({"gpu_pods_without_devices": 0, "placements_that_do_not_fit": 0})
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if not node:
            continue
        demand = pod_demand(pod)
        devices = assigned_devices(pod)
        if devices is None:
            devices = ()
            if demand.gpus:
                issues["gpu_pods_without_devices"] += 1
                free = [g for g in range(int(state.gpu_count[index[node]]))
                        if state.gpu_left[index[node], g] >= demand.gpu_milli]
                devices = tuple(free[:demand.gpus])
        else:
            placements.append((node, devices, demand))
        try:
            state.place(index[node], demand, devices)
        except (ValueError, KeyError):
            issues["placements_that_do_not_fit"] += 1
    return state, placements, dict(issues)


# -- DRA (--dra): the same pods asking for their GPUs through ResourceClaims ------------------------------------------

def dra_gangs_config(args: argparse.Namespace) -> dict[str, Any]:
    """`gpuaas gangs`'s config in the replay: a round at least every second, one replica (no Lease), the replay's
    policy; a released pod is given the whole run to bind; and reserve_after_s (a gang that waited this long for room
    holds every later one back: fairness where pods leave) beyond the run, since nothing leaves a replay and the first
    pod that did not fit would hold every later arrival. --gangs-option overrides."""
    return {"interval_s": 1, "leader_election": {"enabled": False}, "policy": args.policy,
            "bind_timeout_s": max(120.0, args.timeout), "reserve_after_s": 10 * args.timeout,
            **extender_options(args.gangs_option)}


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def gangs_waits_for_room(url: str, key: str) -> bool:
    """The gang controller's last decision for pod `key` (namespace/name) is to wait: it fits nowhere now (a pod of
    the replay is a gang of one; a pod whose claim is not generated yet is not decided on)."""
    try:
        return _get_json(f"{url}/explain?pod={key}").get("action") == "wait"
    except OSError:
        return False


def _reconciles(url: str) -> float:
    from bench.gang_replay import RECONCILE_METRIC, get_metrics
    return get_metrics(url).get(f"{RECONCILE_METRIC}_count", 0.0)


def controller_quiet(watcher: PodWatch, url: str, total: int, quiet_s: float, deadline: float, end: str) -> str:
    """After PodWatch.quiet said "quiet": also two reconciles of the controller finished with nothing bound meanwhile
    (a first plan of a burst can take longer than the quiet period)."""
    while end == "quiet":
        with watcher.cond:
            binds = len(watcher.bound)
        start = _reconciles(url)
        while _reconciles(url) < start + 2:
            if time.monotonic() >= deadline:
                return "timeout"
            time.sleep(0.5)
        with watcher.cond:
            if len(watcher.bound) == binds:
                return "quiet"
            since = watcher.last_bind
        end = watcher.quiet(total, quiet_s, deadline, since)
    return end


def claims_generated(resource: Any, count: int, timeout: float) -> None:
    """Until the replay namespace holds `count` ResourceClaims (kube-controller-manager makes one per pod from its
    template)."""
    end = time.monotonic() + timeout
    while True:
        have = len(json.loads(resource.list_namespaced_resource_claim(
            NAMESPACE, _preload_content=False).data)["items"])
        if have >= count:
            return
        if time.monotonic() > end:
            raise SystemExit(f"only {have} of {count} ResourceClaims generated after {timeout:.0f} s")
        time.sleep(1)


def controller_summary(ctl: Any) -> dict[str, Any]:
    from bench.gang_replay import RECONCILE_METRIC, get_metrics, histogram_summary
    metrics = get_metrics(ctl.url)
    log = ctl.log.read_text(errors="replace") if ctl.log.exists() else ""
    decisions = _get_json(f"{ctl.url}/gangs")
    waits = Counter(re.sub(r"\d+(\.\d+)?", "N", d["message"]) for d in decisions.values() if d["action"] == "wait")
    return {"reconcile_seconds": histogram_summary(metrics, RECONCILE_METRIC),
            "last_decisions_by_action": dict(Counter(d["action"] for d in decisions.values())),
            "wait_messages_by_shape": dict(waits.most_common(8)),
            "released_total": int(metrics.get("gpuaas_gangs_released_total", 0)),
            "failed_writes_total": int(metrics.get("gpuaas_gangs_failed_writes_total", 0)),
            "waiting": int(metrics.get("gpuaas_gangs_waiting", 0)),
            "log_errors": [ln[:300] for ln in log.splitlines() if '"ERROR"' in ln or "Traceback" in ln][:5]}


def dra_outcome(base: ClusterState, node_objs: list[dict[str, Any]], slice_objs: list[dict[str, Any]],
                claim_objs: list[dict[str, Any]], pods: dict[str, dict[str, Any]], demand_of: dict[str, PodDemand],
                capacity: int) -> tuple[dict[str, Any], ClusterState]:
    """What the claims hold at the end, read from their `status.allocation` (scoring.dramodel, as gpuaas reads them):
    the GPU allocation ratio of the devices allocated (a whole device 1000, a share its consumed `share`), checked
    against the bound pods: each bound GPU pod's claim allocated on its node with what it asked, no device given
    twice, no allocation without a bound pod. Also the cluster as the model sees it (`base`, the Nodes and bound pods,
    with the DRA GPUs and their usage), each pod's entry with its replay demand."""
    from scoring.draclaims import ALLOCATED_FOR_ANNOTATION
    from scoring.dramodel import dra_cluster, dra_model
    cluster = dra_cluster(slice_objs, claim_objs)
    nodes = {n["metadata"]["name"]: n for n in node_objs}
    model = dra_model(base, nodes, cluster, slice_objs)
    held = sum(MILLI * use.whole + use.share_milli for devices in cluster.usage.values() for use in devices.values())
    by: Counter[str] = Counter()
    issues: Counter[str] = Counter()
    examples: list[str] = []
    for claim in claim_objs:
        meta = claim["metadata"]
        pod = next((o["name"] for o in meta.get("ownerReferences") or () if o.get("kind") == "Pod"), "")
        alloc = (claim.get("status") or {}).get("allocation")
        node = (pods.get(pod) or {}).get("spec", {}).get("nodeName")
        demand = demand_of.get(pod)
        if not alloc:
            if node:
                issues["bound_pods_with_claim_not_allocated"] += 1
            continue
        by["gpuaas" if ALLOCATED_FOR_ANNOTATION in (meta.get("annotations") or {}) else "kube-scheduler"] += 1
        results = alloc.get("devices", {}).get("results") or []
        if not node:
            issues["allocated_claims_of_unbound_pods"] += 1
            continue
        got = sum(MILLI if not r.get("shareID") else int(str((r.get("consumedCapacity") or {}).get("share", 0)))
                  for r in results)
        wrong = [r for r in results if r.get("pool") != node]
        if wrong or demand is None or got != demand.total_gpu_milli:
            issues["claims_not_as_asked_or_off_node"] += 1
            if len(examples) < 5:
                examples.append(f"{meta['name']}: pod {pod} on {node} asked {demand and demand.total_gpu_milli}, "
                                f"got {got} on {[r.get('pool') + '/' + r.get('device') for r in results]}")
    state = model.state
    for row, entries in enumerate(state.pods_on):  # the replay's demand for each pod, not the CPU-only one base read
        state.pods_on[row] = [(demand_of.get(p.name.split("/", 1)[-1], p), d) for p, d in entries]
    return {
        "allocation_ratio_of_claims": ratio(held, capacity),
        "claims": len(claim_objs), "claims_allocated_by": dict(by),
        "devices_given_twice_or_overcommitted": len(model.errors), "examples_given_twice": model.errors[:5],
        "issues": {"bound_pods_with_claim_not_allocated": 0, "allocated_claims_of_unbound_pods": 0,
                   "claims_not_as_asked_or_off_node": 0, **issues},
        "examples_not_as_asked": examples,
        "unreadable_pools": cluster.errors,
    }, state


def extender_options(pairs: Sequence[str]) -> dict[str, Any]:
    """KEY=VALUE settings of the extender (fields of extender.config.ExtenderConfig); values read as JSON when they
    parse (numbers, true/false), as text otherwise."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--extender-option {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def code_version(*, with_gangs: bool = False) -> dict[str, Any]:
    """The commit the extender and the scheduler configuration ran from, and whether their files differed from it
    (the work tree is shared: a run measures what was on disk when it started); `with_gangs`: the gang controller's
    too (--dra)."""
    import subprocess
    root = Path(__file__).resolve().parent.parent

    def git(*argv: str) -> str:
        try:
            return subprocess.run(["git", *argv], cwd=root, capture_output=True, text=True, timeout=10).stdout.rstrip()
        except (OSError, subprocess.SubprocessError):
            return ""
    changed = git("status", "--porcelain", "--", "extender", "scoring", "runtime", "gpuaas/cluster",
                  *(("gangs", "gpuaas/workloads.py") if with_gangs else ()))
    return {"commit": git("rev-parse", "--short", "HEAD"), "uncommitted": [ln[3:] for ln in changed.splitlines()]}


def extender_decisions(url: str) -> dict[str, float]:
    """The extender's decision counters, and its requests by verb (`requests verb="..."`)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    out = {line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1]) for line in lines
           if line.startswith("gpuaas_extender_decisions_total{")}
    out.update({"requests " + line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1]) for line in lines
                if line.startswith("gpuaas_extender_request_duration_seconds_count{")})
    return out


def run_cluster(args: argparse.Namespace, spec: Any, pods: list[PodDemand], capacity: int) -> dict[str, Any]:
    from kubernetes import client

    from extender.schedconfig import extender_entries, gpuaas_profile
    from gpuaas.cluster.components import extender_process, gangs_process
    from gpuaas.cluster.local import LocalCluster
    from gpuaas.cluster.process import free_port
    from gpuaas.workloads import dra_claim_template, dra_pod_for_demand, pod_for_demand

    names = [f"p{i:05d}" for i in range(len(pods))]
    demand_of = dict(zip(names, pods, strict=True))
    timings: dict[str, float] = {}
    out: dict[str, Any] = {}
    dra = bool(args.dra)
    by_gpuaas = dra and args.dra_allocator == "gpuaas"  # the gang controller allocates the claims
    with tempfile.TemporaryDirectory(prefix="gpuaas-replay-") as tmp:
        workdir = args.workdir or Path(tmp)
        Path(workdir).mkdir(parents=True, exist_ok=True)
        port = free_port()
        ext = ctl = None
        if dra and not by_gpuaas:  # gpuaas off: kube-scheduler's default configuration, its DRA allocator alone
            cluster = LocalCluster(workdir, name="replay")
        else:
            cluster = LocalCluster(workdir, name="replay",
                                   extenders=extender_entries(f"http://127.0.0.1:{port}", all_pods=args.all_pods,
                                                              cpu_pods=args.cpu_pods_entry),
                                   scheduler_profiles=[gpuaas_profile("default-scheduler", all_pods=args.all_pods)])
            extra: list[str] = []
            if args.extender_option:
                config = Path(workdir) / "replay-extender.json"
                config.write_text(json.dumps(extender_options(args.extender_option)))
                extra = ["--config", str(config)]
            ext = extender_process(workdir, cluster.kubeconfig, policy=args.policy, port=port, extra=extra)
        if by_gpuaas:
            gangs_config = Path(workdir) / "replay-gangs.json"
            gangs_config.write_text(json.dumps(dra_gangs_config(args)))
            ctl = gangs_process(workdir, cluster.kubeconfig, gangs_config)
        watcher: PodWatch | None = None
        try:
            t = time.monotonic()
            cluster.up(spec, timeout=300)
            if ext is not None:
                ext.start(timeout=60)
            if ctl is not None and args.mode == "sequential":
                ctl.start(timeout=60)
            timings["cluster_up_s"] = time.monotonic() - t
            core = client.CoreV1Api(cluster.api)
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            if dra:
                resource = client.ResourceV1Api(cluster.api)
                for template in {dra_claim_template(p, NAMESPACE)["metadata"]["name"]: dra_claim_template(
                        p, NAMESPACE) for p in pods if p.gpus}.values():
                    resource.create_namespaced_resource_claim_template(NAMESPACE, template, _preload_content=False)

            def create(i: int) -> None:
                pod = dra_pod_for_demand(names[i], NAMESPACE, pods[i], gated=by_gpuaas) if dra else \
                    pod_for_demand(names[i], NAMESPACE, pods[i])
                core.create_namespaced_pod(NAMESPACE, pod, _preload_content=False)

            probe: Callable[[str], bool] | None = None
            if ctl is not None:
                ctl_url = ctl.url

                def probe(name: str) -> bool:  # the controller decided the pod waits for room: it did not fit
                    return gangs_waits_for_room(ctl_url, f"{NAMESPACE}/{name}")

            first_fail: dict[str, Any] | None = None
            first_marked: dict[str, Any] | None = None
            outcomes: Counter[str] = Counter()
            if args.mode == "sequential":
                t0 = time.monotonic()
                watcher = PodWatch(core, demand_of, t0)
                if by_gpuaas:
                    watcher.not_failures = frozenset({"SchedulingGated"})
                watcher.start()
                for i in range(len(pods)):
                    create(i)
                    outcome = watcher.wait(names[i], args.pod_timeout,
                                           partial(probe, names[i]) if probe is not None and pods[i].gpus else None)
                    outcomes[outcome] += 1
                    if outcome != "bound" and pods[i].gpus and first_fail is None:
                        with watcher.cond:
                            first_fail = {
                                "pod_index": i, "outcome": outcome,
                                "allocation_ratio": ratio(watcher.bound_gpu_milli, capacity),
                                "arrived_ratio": ratio(sum(p.total_gpu_milli for p in pods[:i + 1]), capacity),
                                "seconds": round(time.monotonic() - t0, 1)}
                    if time.monotonic() > t0 + args.timeout:
                        raise SystemExit(f"sequential replay not done after {args.timeout}s: pod {i} of {len(pods)}")
                timings["arrivals_s"] = time.monotonic() - t0
                with watcher.cond:
                    at_last = ratio(watcher.bound_gpu_milli, capacity)
                end = watcher.quiet(len(pods), args.quiet_s, t0 + args.timeout + args.quiet_s, time.monotonic())
                if ctl is not None:
                    end = controller_quiet(watcher, ctl.url, len(pods), args.quiet_s, t0 + args.timeout, end)
            else:
                cluster.control_plane.stop_scheduler()
                t = time.monotonic()
                for i in range(len(pods)):  # one at a time: creation order is index order, the simulator's order
                    create(i)
                timings["create_s"] = time.monotonic() - t
                if dra:  # the pods' claims, generated from their templates by kube-controller-manager, exist first
                    t = time.monotonic()
                    claims_generated(resource, sum(1 for p in pods if p.gpus), timeout=600)
                    timings["claims_generated_s"] = time.monotonic() - t
                time.sleep(2)  # let the extender see the arrivals (its workload estimate) before scheduling starts
                t0 = time.monotonic()
                watcher = PodWatch(core, demand_of, t0)
                if by_gpuaas:
                    watcher.not_failures = frozenset({"SchedulingGated"})
                watcher.start()
                cluster.control_plane.start_scheduler()
                if ctl is not None:  # the controller meets the whole burst at once, as the scheduler does
                    ctl.start(timeout=120)
                end = watcher.quiet(len(pods), args.quiet_s, t0 + args.timeout, t0)
                if ctl is not None:
                    end = controller_quiet(watcher, ctl.url, len(pods), args.quiet_s, t0 + args.timeout, end)
                at_last = None
            timings["schedule_s"] = time.monotonic() - t0  # includes the quiet period
            with watcher.cond:
                timings["last_bind_s"] = watcher.last_bind - t0
                bind_order = list(watcher.bound)
                bind_times = dict(watcher.bound)
                marked = dict(watcher.failed)
            watcher.stop()
            if args.mode == "burst":
                gpu_marked = sorted((t_, n) for n, (t_, _) in marked.items() if demand_of[n].gpus)
                if gpu_marked:
                    t_first, name = gpu_marked[0]
                    before = sum(demand_of[n].total_gpu_milli for n, tb in bind_times.items() if tb <= t_first)
                    first_marked = {"pod_index": names.index(name), "seconds": round(t_first, 1),
                                    "allocation_ratio": ratio(before, capacity), "binds_before": sum(
                                        1 for tb in bind_times.values() if tb <= t_first)}
            objs = json.loads(core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)["items"]
            node_objs = json.loads(core.list_node(_preload_content=False).data)["items"]
            claim_objs: list[dict[str, Any]] = []
            slice_objs: list[dict[str, Any]] = []
            if dra:
                claim_objs = json.loads(resource.list_namespaced_resource_claim(
                    NAMESPACE, _preload_content=False).data)["items"]
                slice_objs = json.loads(resource.list_resource_slice(_preload_content=False).data)["items"]
            if ext is not None:
                out["extender_decisions"] = extender_decisions(ext.url)
            if ctl is not None:
                out["gang_controller"] = controller_summary(ctl)
            if args.dump:
                args.dump.write_text(json.dumps({"pods": objs, "nodes": node_objs, "bind_seconds": bind_times,
                                                 "marked_unschedulable": marked,
                                                 **({"claims": claim_objs} if dra else {})}))
        finally:
            if watcher is not None:
                watcher.stop()
            if ctl is not None:
                ctl.stop()
            if ext is not None:
                ext.stop()
            cluster.down()

    by_name = {p["metadata"]["name"]: p for p in objs}
    bound_names = {n for n, p in by_name.items() if p["spec"].get("nodeName")}
    # Bind order: as watched; a pod bound but not seen bound by the watch (none expected) goes by its PodScheduled
    # lastTransitionTime.
    missing = sorted(bound_names - set(bind_order), key=lambda n: next(
        (c.get("lastTransitionTime", "") for c in by_name[n]["status"].get("conditions") or ()
         if c.get("type") == "PodScheduled"), ""))
    order = [n for n in bind_order if n in bound_names] + missing
    rank = {n: i for i, n in enumerate(names)}
    placed = [n in bound_names for n in names]
    used = sum(pod_demand(by_name[n]).total_gpu_milli for n in bound_names)
    state, placements, issues = kubernetes_state(node_objs, objs)
    if dra:  # the pods ask through claims, which pod_demand does not read; what the claims hold is checked below
        used = sum(demand_of[n].total_gpu_milli for n in bound_names)
        out["dra"], state = dra_outcome(state, node_objs, slice_objs, claim_objs, by_name, demand_of, capacity)
    unplaced = [pods[i] for i, ok in enumerate(placed) if not ok]
    late = [n for n in bound_names if n in marked]
    out.update({
        "allocation_ratio": ratio(used, capacity),
        "first_gpu_failure": first_fail,
        "first_gpu_failure_note": None if args.mode == "sequential" else (
            "null in burst mode: every pod is pending at once and kube-scheduler takes them in its own order, "
            "retrying Unschedulable ones later, so no moment of the run corresponds to 'the first GPU pod of the "
            "arrival order that did not fit' (the simulator's measure). first_gpu_pod_marked_unschedulable gives "
            "the allocation when the scheduler first marked a GPU pod Unschedulable, for reference only."),
        "first_gpu_pod_marked_unschedulable": first_marked,
        "allocation_ratio_when_last_pod_handled": at_last,
        "end": end, "bound_pods": len(bound_names), "unbound_pods": len(names) - len(bound_names),
        "by_kind": by_kind(pods, placed),
        "sequential_outcomes": dict(outcomes) if args.mode == "sequential" else None,
        "marked_unschedulable_pods": len(marked),
        "marked_unschedulable_reasons": dict(Counter(r for _, r in marked.values())),
        "bound_after_marked_unschedulable": {
            "pods": len(late), "gpu_milli": sum(demand_of[n].total_gpu_milli for n in late),
            "by_kind": dict(Counter(kind(demand_of[n]) for n in late)),
            "last_bind_s": round(max((bind_times.get(n, 0.0) for n in late), default=0.0), 1)},
        "bind_order_out_of_creation_order": out_of_order([rank[n] for n in order]),
        "bind_order": [rank[n] for n in order],
        "cpu_only_nodes": {rank[n]: by_name[n]["spec"]["nodeName"] for n in bound_names if not demand_of[n].gpus},
        "partly_used_gpus": partly_used_in_state(state) if dra else partly_used(gpu_use(placements)),
        "model_state_issues": issues,
        "cpu_only_pods_on_gpu_nodes": cpu_only_on_gpu_nodes(state),
        "free_gpu_at_end": free_gpu_breakdown(state, unplaced),
        "watch_errors": watcher.errors[:5] if watcher else [],
        "timings": {k: round(v, 1) for k, v in timings.items()},
    })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", required=True, help="openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", required=True, help="openb_pod_list_default.csv")
    parser.add_argument("--mode", choices=("sequential", "burst"), default="sequential")
    parser.add_argument("--slice", type=int, default=100, help="nodes sampled from the cluster")
    parser.add_argument("--tune", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--policy", default="gpuaas")
    parser.add_argument("--quiet-s", type=float, default=30.0,
                        help="the run ends after this long without a new binding (or when every pod is bound)")
    parser.add_argument("--pod-timeout", type=float, default=60.0,
                        help="sequential: move on if a pod is neither bound nor Unschedulable after this long")
    parser.add_argument("--timeout", type=float, default=1800, help="give up on the cluster side after this long")
    parser.add_argument("--gpu-only", action="store_true", help="leave CPU-only pods out of the replay")
    parser.add_argument("--all-pods", action="store_true",
                        help="send CPU-only pods to the extender too (extender_entry(all_pods=True))")
    parser.add_argument("--cpu-pods-entry", action="store_true",
                        help="add the CPU-pods extender entry (extender.schedconfig.cpu_pods_entry: prioritize only, "
                             "ignorable), as the shipped deployment does; without --all-pods only")
    parser.add_argument("--extender-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an extender setting (extender.config.ExtenderConfig), e.g. queue_planning_min_pods=0 "
                             "(joint planning of the queue off); repeatable")
    parser.add_argument("--dra", action="store_true",
                        help="the slice's GPU nodes are DRA nodes (ResourceSlices, no nvidia.com/gpu) and the GPU pods "
                             "ask through ResourceClaimTemplates (whole GPUs, N GPUs, a share as consumable capacity)")
    parser.add_argument("--dra-allocator", choices=("gpuaas", "kube-scheduler"), default="gpuaas",
                        help="with --dra: gpuaas (pods gated, `gpuaas gangs` allocates the claims, kube-scheduler "
                             "binds) or kube-scheduler (gpuaas off: its default configuration and DRA allocator alone)")
    parser.add_argument("--gangs-option", action="append", default=[], metavar="KEY=VALUE",
                        help="with --dra: a setting of `gpuaas gangs` (gangs.config.GangsConfig); repeatable")
    parser.add_argument("--dump", type=Path, help="write the final Pod and Node objects and bind times here (JSON)")
    parser.add_argument("--workdir", type=Path, help="keep the cluster's logs here (default: a temporary folder)")
    args = parser.parse_args()

    from gpuaas.simulate.traces import load_nodes, load_pods
    from runtime.pools import pools_from_node_specs

    started = time.monotonic()
    version = code_version(with_gangs=args.dra)
    all_nodes = load_nodes(args.nodes)
    nodes = random.Random(args.seed).sample(all_nodes, args.slice)
    spec = pools_from_node_specs(nodes, dra=args.dra)
    trace = load_pods(args.pods)
    if args.gpu_only:
        trace = [p for p in trace if p.gpus]
    capacity = ClusterState(nodes).total_gpu_milli
    pods = inflate(trace, capacity, args.tune, np.random.default_rng(args.seed))

    sim = simulate(nodes, trace, args.policy, args.seed, tune=args.tune)
    assert sim.pods == len(pods) and all(a == b for a, b in zip(sim.arrivals, pods, strict=True)), \
        "the replay must see the simulator's pod list"
    simulator = simulator_summary(sim)
    kubernetes = run_cluster(args, spec, pods, capacity)
    bind_order = kubernetes.pop("bind_order")
    names = cluster_names(nodes, [p.name for p in spec.pools])
    row = {n: i for i, n in enumerate(names)}
    cpu_nodes = {i: row[n] for i, n in kubernetes.pop("cpu_only_nodes").items()}
    variants = simulator_variants(nodes, trace, pods, args, bind_order, cpu_nodes, names)
    diff = round(kubernetes["allocation_ratio"] - simulator["allocation_ratio"], 2)
    print(json.dumps({
        "bench": "extender_replay",
        "inputs": {"mode": args.mode, "seed": args.seed, "slice_nodes": args.slice, "tune": args.tune,
                   "all_pods": args.all_pods, "gpu_only": args.gpu_only, "policy": args.policy,
                   "quiet_s": args.quiet_s, "cpu_pods_entry": args.cpu_pods_entry and not args.all_pods,
                   "extender_options": extender_options(args.extender_option),
                   "devices_annotation": DEVICES_ANNOTATION,
                   **({"dra": True, "dra_allocator": args.dra_allocator,
                       "gangs_options": dra_gangs_config(args) if args.dra_allocator == "gpuaas" else None}
                      if args.dra else {})},
        "code": version,
        "slice_gpus": capacity // MILLI, "pods": len(pods),
        "simulator": simulator,
        "kubernetes": kubernetes,
        "difference_points": diff, "target_abs_difference": 1.0,
        "simulator_with_the_deployments_departures": variants,
        "timings": {"simulator_s": simulator["seconds"], **kubernetes["timings"],
                    "total_s": round(time.monotonic() - started, 1)},
        "bind_order": bind_order,  # creation indices in the order kubernetes bound the pods
    }, indent=2))


if __name__ == "__main__":
    main()

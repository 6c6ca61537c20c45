"""Static packing simulation, the FGD evaluation protocol (Weng et al., ATC'23; kubernetes-scheduler-simulator):

1. the trace's pods are shuffled by the seed;
2. the list is inflated to `tune` x the cluster's GPU capacity by resampling trace pods (tuneUpPods: draw a random
   trace pod, stop at the first one whose per-GPU share would push the requested total past the target), appended
   after the shuffled trace;
3. pods are scheduled one at a time, never depart; a pod that fits nowhere fails and is skipped;
4. after every pod the arrived GPU request and the allocated GPU share are recorded; the curve at k% is the mean
   allocation ratio over records whose arrived ratio rounds to k (else within k +- 1), to two decimals. A pod placed
   on a time-sliced node is allocated its replicas' share (scoring.model), whatever it asked for.

Pure: the caller supplies nodes and pods and gets numbers back; `progress` is an optional callback(done, total).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from scoring.fragmentation import FragmentationIndex, Workload
from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.placement import Placer
from scoring.policies import make_policy

ARRIVED_POINTS = range(0, 131)


def inflate(pods: Sequence[PodDemand], capacity_milli: int, tune: float, rng: np.random.Generator) -> list[PodDemand]:
    """Shuffle the trace, then append resampled trace pods until the request reaches `tune` x capacity."""
    order = rng.permutation(len(pods))
    out = [pods[i] for i in order]
    if tune <= 0:
        return out
    total = sum(p.total_gpu_milli for p in pods)
    target = tune * capacity_milli
    if total > target:  # tuneDownPods: drop random pods until under the target
        while total > target and out:
            victim = out.pop(int(rng.integers(len(out))))
            total -= victim.total_gpu_milli
        return out
    while True:
        pod = pods[int(rng.integers(len(pods)))]
        # The simulator compares with the per-GPU share but adds the full request (kept for fidelity).
        if total + pod.gpu_milli * (1 if pod.gpus else 0) > target:
            break
        total += pod.total_gpu_milli
        out.append(pod)
    return out


@dataclass
class SimulationResult:
    policy: str
    seed: int
    tune: float
    pods: int
    failed: int
    total_gpu_milli: int
    arrived_milli: np.ndarray = field(repr=False)
    used_milli: np.ndarray = field(repr=False)
    frag_milli: np.ndarray = field(repr=False)
    idle_milli: np.ndarray = field(repr=False)
    decision_seconds: np.ndarray = field(repr=False)
    wall_seconds: float = 0.0
    # What arrived, in order, the node each pod went to (-1: failed), and the cluster at the end (for loss analysis).
    arrivals: list[PodDemand] = field(default_factory=list, repr=False)
    node_of: np.ndarray | None = field(default=None, repr=False)
    final_state: ClusterState | None = field(default=None, repr=False)

    def curve(self, values: np.ndarray) -> dict[str, float]:
        """Discretise per-pod values onto arrived-ratio points 0..130 the way merge_*_discrete.py does."""
        arrived = np.round(self.arrived_milli / self.total_gpu_milli * 100.0)  # numpy rounds half to even, as Python
        out: dict[str, float] = {}
        for k in ARRIVED_POINTS:
            sel = arrived == k
            if not sel.any():
                sel = (arrived >= k - 1) & (arrived <= k + 1)
                if not sel.any():
                    continue
            out[str(k)] = round(float(values[sel].mean()), 2)
        return out

    def allocation_ratio(self) -> dict[str, float]:
        return self.curve(np.round(self.used_milli / self.total_gpu_milli * 100.0, 2))

    def fragmentation_ratio(self) -> dict[str, float]:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(self.idle_milli > 0, self.frag_milli / self.idle_milli * 100.0, 0.0)
        return self.curve(ratio)

    def fragmentation_amount(self) -> dict[str, float]:
        return self.curve(self.frag_milli / self.total_gpu_milli * 100.0)

    def decision_ms(self, q: float) -> float:
        return float(np.percentile(self.decision_seconds, q) * 1000.0)


def simulate(nodes: Sequence[NodeSpec], trace: Sequence[PodDemand], policy: str, seed: int, tune: float = 1.3,
             progress: Callable[[int, int], None] | None = None, workload: Workload | None = None,
             on_place: Callable[[ClusterState, int, PodDemand, tuple[int, ...]], None] | None = None,
             ) -> SimulationResult:
    """Run the protocol for one policy and seed. `on_place(state, node, pod, gpus)` is called before each binding."""
    rng = np.random.default_rng(seed)
    state = ClusterState(nodes)
    typical = workload if workload is not None else Workload.typical(trace)
    pods = inflate(trace, state.total_gpu_milli, tune, rng)
    chooser = make_policy(policy, state, typical, rng)
    tie_rank = rng.permutation(len(state))  # the simulator's random "%04d-" node-name prefixes
    order = getattr(chooser, "tie_order", None)
    if order is not None:  # a policy may order ties itself (random order kept as the last key)
        by = np.lexsort((tie_rank, order(state)))
        tie_rank = np.empty_like(by)
        tie_rank[by] = np.arange(by.size)
    # The metric's fragmentation uses FGD's typical pods whatever the policy, so curves compare.
    index = getattr(chooser, "index", None)
    if isinstance(index, FragmentationIndex) and index.workload is typical and not index.cpu_aware:
        metric = index
    else:
        metric = FragmentationIndex(state, typical)
    n = len(pods)
    arrived = np.zeros(n, dtype=np.int64)
    used = np.zeros(n, dtype=np.int64)
    frag = np.zeros(n)
    idle = np.zeros(n)
    decide = np.zeros(n)
    node_of = np.full(n, -1, dtype=np.int64)
    arrived_total = used_total = failed = 0
    frag_total, idle_total = metric.cluster_fragmentation()
    placer = Placer(state, chooser, tie_rank)
    start = time.perf_counter()
    for i, pod in enumerate(pods):
        t0 = time.perf_counter()
        choice = placer.choose(pod)
        decide[i] = time.perf_counter() - t0
        arrived_total += pod.total_gpu_milli
        node = choice.node if choice is not None else -1
        if choice is None:
            failed += 1
        else:
            before_frag, before_idle = metric.frag[node], metric.idle[node]
            if on_place is not None:
                on_place(state, node, pod, choice.devices)
            placer.commit(pod, choice)
            if metric is not getattr(chooser, "index", None):
                metric.refresh([node])
            # What the pod took: on a time-sliced node nvidia.com/gpu: N is N replicas, not N GPUs.
            used_total += int(state.pod_gpu_milli(pod, np.array([node]))[0]) if state.any_time_sliced \
                else pod.total_gpu_milli
            frag_total += metric.frag[node] - before_frag
            idle_total += metric.idle[node] - before_idle
        arrived[i], used[i], frag[i], idle[i] = arrived_total, used_total, frag_total, idle_total
        node_of[i] = node
        if progress is not None and (i % 256 == 0 or i == n - 1):
            progress(i + 1, n)
    return SimulationResult(policy, seed, tune, n, failed, state.total_gpu_milli, arrived, used, frag, idle, decide,
                            time.perf_counter() - start, pods, node_of, state)

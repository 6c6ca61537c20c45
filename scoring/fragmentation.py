"""GPU fragmentation as FGD defines it (Weng et al., ATC'23), vectorised over nodes.

A workload is a set of typical pod shapes m with popularity p_m. A node's fragmentation is the GPU share (thousandths)
that the workload is expected to be unable to use there:

    F_n = sum_m p_m * F_n(m),  F_n(m) = idle_n                        if m cannot run on n (CPU, GPU, model, CPU-only m)
                                     = sum of free share on GPUs
                                       with less free than m needs    if m fits

Rewritten so that it is array work: F_n = idle_n - sum_m p_m * fits_m(n) * usable_m(n), where usable_m(n) is the free
share on GPUs with at least m's per-GPU share. Counts and sums per (node, shape) are cached and only the rows of nodes
that changed are recomputed.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from scoring.model import MILLI, ClusterState, PodDemand

# kube-scheduler counts a container without a CPU request as 100m when it ranks nodes (GetNonzeroRequests); FGD's
# typical pods inherit that.
DEFAULT_MILLI_CPU_REQUEST = 100
POPULARITY_THRESHOLD = 0.95  # FGD's podPopularityThreshold: 95 (generate_config_and_run.py)


@dataclass(frozen=True)
class Shape:
    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for CPU-only shapes
    gpus: int
    allowed_models: frozenset[str]

    @staticmethod
    def of(pod: PodDemand) -> Shape:
        cpu = pod.cpu_milli if pod.cpu_milli > 0 else DEFAULT_MILLI_CPU_REQUEST
        return Shape(cpu, pod.gpu_milli if pod.gpus else 0, pod.gpus, pod.allowed_models)

    def sort_key(self) -> tuple[int, int, int, str]:
        # The simulator's PodResource.Less order (cpu, milli, count, model string).
        return (self.cpu_milli, self.gpu_milli, self.gpus, "|".join(sorted(self.allowed_models)))


@dataclass(frozen=True)
class Workload:
    """Typical pod shapes and their popularity (sums to 1), and the memory GPU pods bring per thousandth of GPU
    (MiB; 0 = unknown). FGD groups pods into shapes by CPU and GPU only; memory is one rate for the whole workload."""

    shapes: tuple[Shape, ...]
    popularity: np.ndarray
    memory_per_gpu_milli: float = 0.0

    @staticmethod
    def typical(pods: Iterable[PodDemand], threshold: float = POPULARITY_THRESHOLD) -> Workload:
        """FGD's GetTypicalPods: most frequent shapes, added one at a time until they cover `threshold` of pods,
        popularity renormalised over the kept shapes. Equal counts are ordered as the simulator orders them. The memory
        rate is over all GPU pods given."""
        pods = list(pods)
        counts = Counter(Shape.of(p) for p in pods)
        if not counts:
            raise ValueError("cannot derive typical pods from an empty workload")
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0].sort_key()), reverse=True)
        kept, cum = [], 0
        for shape, n in ranked:
            if cum >= threshold * total:
                break
            kept.append((shape, n))
            cum += n
        pop = np.array([n for _, n in kept], dtype=np.float64) / cum
        gpu_pods = [p for p in pods if p.gpus and not p.mig_profile]
        gpu_milli = sum(p.total_gpu_milli for p in gpu_pods)
        memory = sum(p.memory_mib for p in gpu_pods) / gpu_milli if gpu_milli else 0.0
        return Workload(tuple(s for s, _ in kept), pop, memory)

    @staticmethod
    def of_shapes(shapes_and_weights: Iterable[tuple[Shape, float]]) -> Workload:
        items = list(shapes_and_weights)
        w = np.array([x for _, x in items], dtype=np.float64)
        return Workload(tuple(s for s, _ in items), w / w.sum())


class FragmentationIndex:
    """Cached per-(node, shape) statistics of one ClusterState for one Workload.

    After changing node i in the state, call `refresh([i])`.
    """

    def __init__(self, state: ClusterState, workload: Workload, *, cpu_aware: bool = False):
        self.state = state
        self.workload = workload
        # cpu_aware: a shape can use no more of a node's GPU share than the node's CPU lets it run pods for
        # (min(usable, floor(cpu_left / cpu_m) * share_m)); FGD itself checks CPU for one pod only.
        self.cpu_aware = cpu_aware
        shapes = workload.shapes
        self.p = workload.popularity
        self.cpu = np.array([s.cpu_milli for s in shapes], dtype=np.int64)
        # CPU-only shapes never "fit" a GPU: give them an impossible per-GPU share so they count all idle GPU.
        self.milli = np.array([s.gpu_milli if s.gpu_milli > 0 else MILLI + 1 for s in shapes], dtype=np.int64)
        self.num = np.array([s.gpus for s in shapes], dtype=np.int64)
        self.acc = self._acceptance(np.arange(len(state)))
        n = len(state)
        self.count = np.zeros((n, len(shapes)), dtype=np.int64)
        self.usable = np.zeros((n, len(shapes)), dtype=np.int64)
        self.idle = np.zeros(n, dtype=np.int64)
        self.frag = np.zeros(n, dtype=np.float64)
        self.refresh(np.arange(n))

    def _acceptance(self, rows: np.ndarray) -> np.ndarray:
        """bool[len(rows), shapes]: the shape may run on the node's GPU model (CPU-only shapes: never)."""
        acc = np.ones((len(rows), len(self.workload.shapes)), dtype=bool)
        for m, s in enumerate(self.workload.shapes):
            if s.allowed_models:
                acc[:, m] = self.state.model_allowed(PodDemand(gpus=1, gpu_milli=1,
                                                               allowed_models=s.allowed_models))[rows]
        acc[:, self.milli > MILLI] = False
        return acc

    # -- the node set changed (scoring.model.ClusterState.insert_node, delete_node, reset_node) ----------------------

    def insert_row(self, row: int) -> None:
        """The state has a new row `row` (the rows from there on moved down one): its statistics, the others kept."""
        for key in ("acc", "count", "usable", "idle", "frag"):
            old = getattr(self, key)
            setattr(self, key, np.insert(old, row, np.zeros(old.shape[1:], dtype=old.dtype), axis=0))
        self.reset_row(row)

    def delete_row(self, row: int) -> None:
        for key in ("acc", "count", "usable", "idle", "frag"):
            setattr(self, key, np.delete(getattr(self, key), row, axis=0))

    def reset_row(self, row: int) -> None:
        """Row `row` was made anew (its spec changed, its GPU model among it)."""
        self.acc[row] = self._acceptance(np.array([row]))[0]
        self.refresh([row])

    def reweigh(self, workload: Workload) -> None:
        """The same shapes with another popularity (scoring.policies.scarcity_weighted after the node set changed):
        every node's fragmentation again, from the counts kept."""
        if workload.shapes != self.workload.shapes:
            raise ValueError("reweigh keeps the shapes; make a new index for others")
        self.workload, self.p = workload, workload.popularity
        self.frag = self._frag(self.idle, self.count, self.usable, self.state.cpu_left, self.acc)

    def refresh(self, rows: ArrayLike) -> None:
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int64))
        left = self.state.gpu_left[rows]
        ge = left[:, :, None] >= self.milli[None, None, :]
        self.count[rows] = ge.sum(axis=1)
        self.usable[rows] = (left[:, :, None] * ge).sum(axis=1)
        self.idle[rows] = left.sum(axis=1)
        if self.state.any_time_sliced:
            # On a time-sliced node a whole-GPU shape (nvidia.com/gpu) runs on any free replica and a share shape on
            # none (scoring.fit): "GPUs with room" are its free replicas, and what it can use is their share.
            sliced = rows[self.state.time_sliced[rows]]
            if sliced.size:
                free = self.state.free_replicas(sliced)
                whole = self.milli == MILLI
                self.count[sliced] = np.where(whole[None, :], free[:, None], 0)
                self.usable[sliced] = np.where(whole[None, :], (free * self.state.replica_milli[sliced])[:, None], 0)
        if not self.state.all_share_nodes:
            # A share shape runs on no node without a sharing device plugin (scoring.fit): no GPU there has room for
            # it. (Time-sliced rows are done above.)
            plain = rows[~self.state.share_nodes[rows] & ~self.state.time_sliced[rows]]
            if plain.size:
                share = np.flatnonzero(self.milli < MILLI)
                self.count[plain[:, None], share[None, :]] = 0
                self.usable[plain[:, None], share[None, :]] = 0
        self.frag[rows] = self._frag(self.idle[rows], self.count[rows], self.usable[rows],
                                     self.state.cpu_left[rows], self.acc[rows])

    def _frag(self, idle: np.ndarray, count: np.ndarray, usable: np.ndarray, cpu_left: np.ndarray,
              acc: np.ndarray) -> np.ndarray:
        fits = acc & (count >= self.num) & (cpu_left[..., None] >= self.cpu)
        if self.cpu_aware:
            pods_by_cpu = np.maximum(cpu_left[..., None], 0) // self.cpu
            usable = np.minimum(usable, pods_by_cpu * self.milli * self.num)
        frag: np.ndarray = idle - (fits * usable) @ self.p  # numpy's stubs type this as Any
        return frag

    # -- what-if ---------------------------------------------------------------------------------------------------

    def frag_after_whole(self, rows: np.ndarray, pod: PodDemand) -> np.ndarray:
        """F of each node in `rows` after placing a pod that takes `pod.gpus` fully free GPUs (or none); on a
        time-sliced node, `pod.gpus` replicas."""
        k = pod.gpus
        taken = self.state.pod_gpu_milli(pod, rows) if k else np.zeros(len(rows), dtype=np.int64)
        # A fully free GPU has enough share for every shape, so it left every shape's count and usable sum; so does a
        # replica, for the shapes a time-sliced node runs (the others count none there).
        return self._frag(self.idle[rows] - taken, self.count[rows] - k, self.usable[rows] - taken[:, None],
                          self.state.cpu_left[rows] - pod.cpu_milli, self.acc[rows])

    def share_candidates(self, rows: np.ndarray, pod: PodDemand) -> tuple[np.ndarray, np.ndarray]:
        """(row position, gpu) pairs where a GPU share fits, one per distinct free amount on a node (lowest index)."""
        left = self.state.gpu_left[rows]
        ok = left >= pod.gpu_milli
        g = left.shape[1]
        same = left[:, :, None] == left[:, None, :]
        earlier = np.tril(np.ones((g, g), dtype=bool), k=-1)  # [g, g'] with g' < g
        dup = (same & earlier[None]).any(axis=2)
        pos, gpu = np.nonzero(ok & ~dup)
        return pos, gpu

    def frag_after_share(self, rows: np.ndarray, gpu: np.ndarray, pod: PodDemand) -> np.ndarray:
        """F after taking `pod.gpu_milli` from GPU `gpu[i]` of node `rows[i]` (rows may repeat)."""
        r = pod.gpu_milli
        before = self.state.gpu_left[rows, gpu]
        after = before - r
        a = before[:, None] >= self.milli[None, :]
        b = after[:, None] >= self.milli[None, :]
        count = self.count[rows] - a + b
        usable = self.usable[rows] - before[:, None] * a + after[:, None] * b
        return self._frag(self.idle[rows] - r, count, usable, self.state.cpu_left[rows] - pod.cpu_milli,
                          self.acc[rows])

    # -- cluster metrics -------------------------------------------------------------------------------------------

    def cluster_fragmentation(self) -> tuple[float, float]:
        """(fragmented thousandths, idle thousandths) over the cluster."""
        return float(self.frag.sum()), float(self.idle.sum())

"""Placement policies behind one small interface, kube-scheduler style: Filter, Score, NormalizeScore, then devices.

    scoring.fit.feasible(state, pod)      -> bool[N]                  (shared by every policy)
    policy.score(state, pod, feasible)    -> float[N] (higher better; only feasible entries are meaningful)
    policy.devices(state, pod, node)      -> GPU indices on the chosen node
    normalize(scores, feasible)           -> int[N] in 0..MAX_EXTENDER_PRIORITY (what the HTTP extender returns)
    select_node(scores, feasible, rank)   -> node index, ties to the lowest rank (a per-cluster random node order)

Policies are registered by name (POLICIES) and built with `make_policy(name, state, workload)`.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from itertools import combinations
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from scoring.fragmentation import FragmentationIndex, Workload
from scoring.model import MILLI, ClusterState, PodDemand
from scoring.rowwise import any_per_row, count_per_row, sum_per_row
from scoring.sharevalues import ShareValues

MAX_NODE_SCORE = 100  # kube-scheduler framework.MaxNodeScore
MAX_EXTENDER_PRIORITY = 10  # extender/v1 MaxExtenderPriority
MAX_SPEC_CPU = 128_000  # FGD simulator's normalisers (open-gpu-share/utils/const.go)
MAX_SPEC_GPU = 8_000


# -- Score helpers -----------------------------------------------------------------------------------------------------

def normalize(scores: np.ndarray, mask: np.ndarray, top: int = MAX_EXTENDER_PRIORITY) -> np.ndarray:
    """Min-max rescale the feasible entries onto 0..top (integers); infeasible entries get 0."""
    out = np.zeros(scores.shape, dtype=np.int64)
    if not mask.any():
        return out
    s = scores[mask]
    lo, hi = float(s.min()), float(s.max())
    if hi == lo:
        out[mask] = top
        return out
    # Divided first: x / x is exactly 1, so the best maps to `top`; (x * top) / x can round to just under it, and the
    # policy's pick then scored 9 beside other 9s, which kube-scheduler broke at random.
    out[mask] = np.floor((s - lo) / (hi - lo) * top).astype(np.int64)
    return out


def select_node(scores: np.ndarray, mask: np.ndarray, tie_rank: np.ndarray) -> int:
    """Highest score among feasible nodes; ties go to the lowest `tie_rank` (-1 if no node is feasible).

    The FGD simulator's scheduler breaks ties by the smallest node name, and names carry a per-seed random prefix: a
    fixed random order of nodes. That consistency packs ties onto the same nodes (and keeps others idle), which random
    per-pod tie-breaking would not, so it is kept as the rule; pass a random permutation for that behaviour."""
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return -1
    s = scores[idx]
    best = idx[s == s.max()]
    return int(best[0]) if best.size == 1 else int(best[np.argmin(tie_rank[best])])


def first_free_gpus(state: ClusterState, node: int, k: int) -> tuple[int, ...]:
    """The first k fully free GPUs by index (the simulator's AllocateExclusiveGpuId and the device plugin default)."""
    free = np.flatnonzero(state.gpu_left[node] == MILLI)
    return tuple(int(g) for g in free[:k])


def replica_devices(state: ClusterState, node: int, k: int) -> tuple[int, ...]:
    """The GPUs k replicas come from on a time-sliced node: the NVIDIA device plugin chooses them, not gpuaas, by its
    default `distributed` policy (rm/allocate.go greedyAlloc): each next replica from the GPU with the fewest replicas
    handed out (the most free), among equals the one this request took fewest from, then the lowest index. A GPU is
    listed once per replica it gives. Raises ValueError when the node has fewer than k free replicas."""
    return spread_replicas(state.gpu_left[node, : int(state.gpu_count[node])], int(state.replica_milli[node]), k)


def spread_replicas(gpu_left: Sequence[int] | np.ndarray, unit: int, k: int) -> tuple[int, ...]:
    """replica_devices over one node's free thousandths per GPU (`unit` per replica)."""
    free = [int(x) // unit for x in gpu_left]
    taken = [0] * len(free)
    out = []
    for _ in range(k):
        ok = [g for g in range(len(free)) if free[g] > taken[g]]
        if not ok:
            raise ValueError(f"{k} replicas asked, {sum(free)} free")
        g = min(ok, key=lambda g: (taken[g] - free[g], taken[g], g))  # fewest allocated = most still free
        taken[g] += 1
        out.append(g)
    return tuple(out)


def sigmoid(x: NDArray[np.float64]) -> NDArray[np.float64]:
    return 1.0 / (1.0 + np.exp(-x))


class Policy(Protocol):
    """Score nodes for a pod and pick devices on the chosen node. Implementations keep their own caches in step with
    the state through `observe(node)`, which the caller invokes after every change to that node."""

    name: str
    # A node's score depends on that node's row and the policy's tables alone (not on the other rows, the mask or a
    # random draw): a Placer may then score again only the rows that changed (Placer(incremental=True)).
    rowwise_scores: bool

    def score(self, state: ClusterState, pod: PodDemand, mask: np.ndarray) -> np.ndarray: ...

    def devices(self, state: ClusterState, pod: PodDemand, node: int) -> tuple[int, ...]: ...

    def observe(self, node: int) -> None: ...

    # The node set changed in place (scoring.model.ClusterState.insert_node, delete_node, reset_node): called right
    # after the state changed and before any pod is placed on a new or remade row, whose pods the caller places next
    # and then reports with `observe`. Afterwards the tables are those a policy made anew on the state would have.
    def node_added(self, row: int) -> None: ...

    def node_removed(self, row: int) -> None: ...

    def node_changed(self, row: int) -> None: ...


class _Base:
    name = "base"
    rowwise_scores = False

    def __init__(self, state: ClusterState, workload: Workload | None = None, rng: np.random.Generator | None = None):
        self.state = state
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def observe(self, node: int) -> None:
        pass

    def node_added(self, row: int) -> None:
        pass

    def node_removed(self, row: int) -> None:
        pass

    def node_changed(self, row: int) -> None:
        pass

    def devices(self, state: ClusterState, pod: PodDemand, node: int) -> tuple[int, ...]:
        if pod.gpus == 0:
            return ()
        if pod.takes_replicas and state.time_sliced[node]:
            return replica_devices(state, node, pod.gpus)
        if pod.mig_profile:
            return (mig_gpu_first_fit(state, pod, node),)
        if pod.is_share:
            return (self.share_gpu(state, pod, node),)
        return first_free_gpus(state, node, pod.gpus)

    def share_gpu(self, state: ClusterState, pod: PodDemand, node: int) -> int:
        """Best fit: the GPU with the least free share that still fits, lowest index on ties."""
        left = state.gpu_left[node]
        ok = left >= pod.gpu_milli
        return int(np.flatnonzero(ok)[np.argmin(left[ok])])


def mig_gpu_first_fit(state: ClusterState, pod: PodDemand, node: int, taken: Mapping[int, int] | None = None) -> int:
    """The first GPU of the node with a free instance of the pod's profile (the device plugin's order). `taken`:
    instances per GPU already promised to other pods of the same plan, which the state does not show yet."""
    col = state.mig_pos[pod.mig_profile]
    free = np.flatnonzero(state.mig_free[node, :, col] > 0)
    if taken:
        for g in free:
            if state.mig_free[node, g, col] > taken.get(int(g), 0):
                return int(g)
    return int(free[0])


# -- Baselines ---------------------------------------------------------------------------------------------------------

class RandomPolicy(_Base):
    """Any feasible node, uniformly; for a GPU share, any GPU with room, uniformly (FGD's 01-Random, gpusel=random)."""

    name = "random"

    def score(self, state: ClusterState, pod: PodDemand, mask: np.ndarray) -> np.ndarray:
        out = np.zeros(len(state))
        idx = np.flatnonzero(mask)
        if idx.size:
            out[idx[self.rng.integers(idx.size)]] = MAX_NODE_SCORE  # RandomScore's PreScore pick
        return out

    def share_gpu(self, state: ClusterState, pod: PodDemand, node: int) -> int:
        return int(self.rng.choice(np.flatnonzero(state.gpu_left[node] >= pod.gpu_milli)))


class LeastAllocatedPolicy(_Base):
    """kube-scheduler's default NodeResourcesLeastAllocated (CPU and memory, equal weights), 0..100."""

    name = "least-allocated"

    def score(self, state: ClusterState, pod: PodDemand, mask: np.ndarray) -> np.ndarray:
        return (least_allocated(state.cpu_left - pod.cpu_milli, state.cpu_cap)
                + least_allocated(state.mem_left - pod.memory_mib, state.mem_cap)) // 2


def least_allocated(free_after: np.ndarray, capacity: np.ndarray) -> NDArray[np.int64]:
    """(capacity - requested) * 100 / capacity per node, 0 where capacity is 0 or the request exceeds it."""
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where((capacity > 0) & (free_after >= 0), free_after * MAX_NODE_SCORE // np.maximum(capacity, 1), 0)
    return s.astype(np.int64)


class BestFitPolicy(_Base):
    """FGD's 05-BestFit: 100 * (1 - sum over CPU, GPU of 0.5 * (free - request) / maxSpec), truncated to an integer and
    min-max normalised over feasible nodes with integer division, as the simulator does."""

    name = "bestfit"

    def score(self, state: ClusterState, pod: PodDemand, mask: np.ndarray) -> np.ndarray:
        cpu_free = (state.cpu_left - pod.cpu_milli) / MAX_SPEC_CPU
        gpu_free = (state.gpu_left.sum(axis=1) - state.pod_gpu_milli(pod)) / MAX_SPEC_GPU
        raw = np.trunc((1.0 - (0.5 * cpu_free + 0.5 * gpu_free)) * MAX_NODE_SCORE).astype(np.int64)
        out = np.zeros(len(state), dtype=np.int64)
        if not mask.any():
            return out
        s = raw[mask]
        lo, hi = int(s.min()), int(s.max())
        out[mask] = 0 if hi == lo else (s - lo) * MAX_NODE_SCORE // (hi - lo)
        return out


class FgdPolicy(_Base):
    """Fragmentation Gradient Descent as the authors' simulator implements it (fgd_score.go):
    score = int(sigmoid((F_before - F_after) / 1000) * 100); for a GPU share every GPU with room is tried and the best
    one is both the node's score and the GPU used (lowest index on ties); whole GPUs take the first free ones."""

    name = "fgd"
    rowwise_scores = True  # (GpuaasPolicy's terms too: each reads the node's row, the index's row and constants)

    def __init__(self, state: ClusterState, workload: Workload | None = None,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__(state, workload, rng)
        if workload is None:
            raise ValueError("FGD needs a workload (typical pods)")
        self.index = FragmentationIndex(state, workload)

    def observe(self, node: int) -> None:
        self.index.refresh([node])

    def node_added(self, row: int) -> None:
        self.index.insert_row(row)
        self._node_set_changed()

    def node_removed(self, row: int) -> None:
        self.index.delete_row(row)
        self._node_set_changed()

    def node_changed(self, row: int) -> None:
        self.index.reset_row(row)
        self._node_set_changed()

    def _node_set_changed(self) -> None:
        """Tables that depend on the whole node set (FGD's: none)."""

    def _int_score(self, delta: np.ndarray) -> NDArray[np.float64]:
        return np.trunc(sigmoid(delta / 1000.0) * MAX_NODE_SCORE)

    def _adjust(self, state: ClusterState, pod: PodDemand, rows: np.ndarray) -> np.ndarray | float:
        """Extra fragmentation decrease per node in `rows` (thousandths), added before banding. FGD: none."""
        return 0.0

    def score(self, state: ClusterState, pod: PodDemand, mask: np.ndarray) -> np.ndarray:
        out = np.zeros(len(state))
        rows = np.flatnonzero(mask)
        if rows.size == 0:
            return out
        fx = self.index
        adjust = np.zeros(len(state))
        adjust[rows] = self._adjust(state, pod, rows)
        if pod.is_share:
            pos, gpu = fx.share_candidates(rows, pod)
            cand_rows = rows[pos]
            s = self._int_score(fx.frag[cand_rows] - fx.frag_after_share(cand_rows, gpu, pod) + adjust[cand_rows])
            best = np.full(len(state), -np.inf)
            np.maximum.at(best, cand_rows, s)
            out[rows] = best[rows]
        else:
            out[rows] = self._int_score(fx.frag[rows] - fx.frag_after_whole(rows, pod) + adjust[rows])
        return out

    def share_gpu(self, state: ClusterState, pod: PodDemand, node: int) -> int:
        fx = self.index
        gpus = np.flatnonzero(state.gpu_left[node] >= pod.gpu_milli)
        rows = np.full(gpus.size, node)
        s = self._int_score(fx.frag[rows] - fx.frag_after_share(rows, gpus, pod))
        return int(gpus[np.argmax(s)])  # argmax keeps the lowest index among equal scores


POLICIES: dict[str, Callable[..., Policy]] = {
    RandomPolicy.name: RandomPolicy,
    LeastAllocatedPolicy.name: LeastAllocatedPolicy,
    BestFitPolicy.name: BestFitPolicy,
    FgdPolicy.name: FgdPolicy,
}


def register_policy(name: str, factory: Callable[..., Policy]) -> None:
    if name in POLICIES:
        raise ValueError(f"policy {name!r} already registered")
    POLICIES[name] = factory


def known_policy(name: str) -> str:
    """`name` in lower case if a policy is registered under it; a ValueError naming the known ones if not."""
    if name.lower() not in POLICIES:
        raise ValueError(f"policy {name!r} is not one of {', '.join(POLICIES)}")
    return name.lower()


def make_policy(name: str, state: ClusterState, workload: Workload | None = None,
                rng: np.random.Generator | None = None) -> Policy:
    try:
        factory = POLICIES[name.lower()]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return factory(state, workload, rng)


class FirstFitPolicy(_Base):
    """The first feasible node in cluster order, the first GPU (or MIG instance) that fits on it."""

    name = "first-fit"

    def score(self, state: ClusterState, pod: PodDemand, mask: np.ndarray) -> np.ndarray:
        return -np.arange(len(state), dtype=float)

    def share_gpu(self, state: ClusterState, pod: PodDemand, node: int) -> int:
        return int(np.flatnonzero(state.gpu_left[node] >= pod.gpu_milli)[0])


class GpuaasPolicy(FgdPolicy):
    """Ours: FGD's expected-fragmentation gradient with CPU and memory look-ahead, GPU shares placed by their
    cutting-stock value, topology- and MIG-aware.

    Whole-GPU and CPU-only pods: dF = FGD's fragmentation decrease + the decrease in GPU share stranded by CPU and by
    memory (`stranded`: a node's idle GPUs need CPU and memory at the workload's per-GPU rates; GPU share beyond what
    the CPU, or the memory, left can feed is stranded). Shapes restricted to a few GPU models weigh more
    (`scarcity_weighted`), so unrestricted pods leave scarce models to the pods that can only run there.
    Node score = int(100 * sigmoid(dF / 1000)) (FGD's bands: nearly equal choices tie, and ties go to one consistent
    node order, which is what packs) + tie-breakers worth less than one band:
      * multi-GPU pods: +TOPOLOGY_BONUS if the node can hold the pod inside one NVLink/NUMA block;
      * consolidation: up to CONSOLIDATION of how full the node already is (GPU and CPU), so partly used nodes fill
        before idle ones are opened.
    GPU shares: the stranded decrease minus REGRET_WEIGHT x the share's regret on its best GPU (scoring.sharevalues:
    how far the GPU falls from an optimal cutting-stock pattern of the workload's share sizes), in the same bands, no
    FGD gradient and no consolidation: which remainder the rest of the workload can fill decides, FGD's binary "does
    a typical pod still fit" does not (on the Alibaba trace FGD's term there cost 0.04 points, consolidation 0.01).
    MIG requests: nodes already in use, then partly used MIG GPUs (idle GPUs stay available for repartitioning),
    then the same CPU look-ahead over free MIG compute slices.
    Devices: a GPU share goes to the GPU with the least regret, then the largest exact fragmentation decrease, then
    the tightest fit; whole GPUs stay inside one block and keep other aligned blocks free; a MIG instance on the most
    used GPU.
    """

    name = "gpuaas"
    TOPOLOGY_BONUS = 0.5
    CONSOLIDATION = 0.45
    # Regret dominates: one thousandth of regret outweighs 30 thousandths of stranded share (measured flat from 10
    # to 100 on the default trace; 3 loses 0.06 points).
    REGRET_WEIGHT = 30.0

    SCARCITY_EXPONENT = 0.5

    def __init__(self, state: ClusterState, workload: Workload | None = None,
                 rng: np.random.Generator | None = None) -> None:
        if workload is None:
            raise ValueError("gpuaas needs a workload (typical pods)")
        self.observed = workload
        super().__init__(state, scarcity_weighted(state, workload, self.SCARCITY_EXPONENT), rng)
        # Share values from the popularity as observed (scarcity weighting is about models, not sizes).
        self.share_values = ShareValues.of(workload)
        self.memory_per_gpu_milli = workload.memory_per_gpu_milli
        self.cpu_per_gpu_milli = cpu_per_gpu_milli(self.index.workload)

    def _node_set_changed(self) -> None:
        """The scarcity weights follow the GPUs each model has: a node of a model some shapes are restricted to, in
        or out, changes every node's fragmentation (array work over the kept counts, no row read again)."""
        weighted = scarcity_weighted(self.state, self.observed, self.SCARCITY_EXPONENT)
        if not np.array_equal(weighted.popularity, self.index.workload.popularity):
            self.index.reweigh(weighted)
            self.cpu_per_gpu_milli = cpu_per_gpu_milli(weighted)

    def stranded(self, idle: np.ndarray, cpu_left: np.ndarray,
                 mem_left: np.ndarray | None = None) -> NDArray[np.float64]:
        """Idle GPU share (thousandths) the node's CPU cannot feed at the workload's CPU-per-GPU rate, plus the share
        its memory cannot feed at the memory rate: the multi-pod look-ahead FGD lacks (FGD checks CPU for one pod of
        each shape, not for the GPUs left, and never looks at memory)."""
        out = np.zeros(np.shape(idle))
        for rate, left in ((self.cpu_per_gpu_milli, cpu_left), (self.memory_per_gpu_milli, mem_left)):
            if rate > 0 and left is not None:
                out += unfed(idle, rate, left)
        return out

    def _adjust(self, state: ClusterState, pod: PodDemand, rows: np.ndarray) -> np.ndarray:
        idle = self.index.idle[rows].astype(float)
        cpu = state.cpu_left[rows].astype(float)
        mem = state.mem_left[rows].astype(float)
        return (self.stranded(idle, cpu, mem)
                - self.stranded(idle - state.pod_gpu_milli(pod, rows), cpu - pod.cpu_milli, mem - pod.memory_mib))

    def score(self, state: ClusterState, pod: PodDemand, mask: np.ndarray) -> np.ndarray:
        if pod.mig_profile:
            return self._mig_score(state, pod, mask)
        if pod.is_share:
            return self._share_score(state, pod, mask)
        s = super().score(state, pod, mask)
        rows = np.flatnonzero(mask)  # tie-breakers only where the pod fits: the rest is never chosen
        if pod.gpus >= 2 and pod.gpu_milli >= MILLI:  # (the device plugin spreads replicas whatever the topology)
            s[rows] += self.TOPOLOGY_BONUS * fits_in_one_block(state, pod.gpus, rows) * ~state.time_sliced[rows]
        gpu_used = 1.0 - sum_per_row(state.gpu_left)[rows] / (np.maximum(state.gpu_count[rows], 1) * MILLI)
        cpu_used = 1.0 - state.cpu_left[rows] / np.maximum(state.cpu_cap[rows], 1)
        s[rows] += self.CONSOLIDATION * (0.5 * gpu_used + 0.5 * cpu_used)
        return s

    def _share_score(self, state: ClusterState, pod: PodDemand, mask: np.ndarray) -> np.ndarray:
        """Per node, the best GPU's int(100 * sigmoid((stranded decrease - REGRET_WEIGHT x regret) / 1000))."""
        out = np.zeros(len(state))
        rows = np.flatnonzero(mask)
        if rows.size == 0:
            return out
        pos, gpu = self.index.share_candidates(rows, pod)
        cand = rows[pos]
        relief = self._adjust(state, pod, rows)[pos]
        regret = self.share_values.regret(state.gpu_left[cand, gpu], pod.gpu_milli)
        s = self._int_score(relief - self.REGRET_WEIGHT * regret)
        best = np.full(len(state), -np.inf)
        np.maximum.at(best, cand, s)
        out[rows] = best[rows]
        return out

    def _mig_score(self, state: ClusterState, pod: PodDemand, mask: np.ndarray) -> np.ndarray:
        """MIG requests: nodes already in use, then instances on GPUs that already serve others (idle GPUs stay free
        to repartition), then the CPU look-ahead over free MIG compute slices (slices the node's CPU can no longer
        feed are stranded)."""
        col = state.mig_pos.get(pod.mig_profile)
        out = np.zeros(len(state))
        rows = np.flatnonzero(mask)  # only where the instance fits: the MIG arrays are N x G x profiles
        if col is None or rows.size == 0:
            return out
        slices = np.array([int(p.split("g.", 1)[0]) for p in state.mig_profiles], dtype=float)
        mig_free = state.mig_free[rows]
        free_slices = np.einsum("ngp,p->n", mig_free, slices)
        c = self.cpu_per_gpu_milli * MILLI / 7.0  # CPU per compute slice
        after = free_slices - slices[col]
        cpu = state.cpu_left[rows].astype(float)
        relief = (unfed(free_slices, c, cpu) - unfed(after, c, cpu - pod.cpu_milli)) if c > 0 else np.zeros(rows.size)
        partly_used = state.mig_mask[rows] > 0
        on_partial = any_per_row((mig_free[:, :, col] > 0) & partly_used)
        node_used = any_per_row(partly_used)
        # Consolidation first (untouched nodes keep their CPU for big requests and their GPUs for repartitioning),
        # the CPU look-ahead as the finer criterion.
        out[rows] = 2.0 * node_used + 1.0 * on_partial + 0.1 * np.round(relief, 3)
        return out

    def devices(self, state: ClusterState, pod: PodDemand, node: int) -> tuple[int, ...]:
        if pod.mig_profile:
            col = state.mig_pos[pod.mig_profile]
            gpus = np.flatnonzero(state.mig_free[node, :, col] > 0)
            used_slices = np.array([bin(int(m)).count("1") for m in state.mig_mask[node, gpus]])
            return (int(gpus[np.lexsort((gpus, -used_slices))[0]]),)
        if pod.gpus >= 2 and pod.gpu_milli >= MILLI and not state.time_sliced[node]:
            chosen = topology_gpus(state, node, pod.gpus)
            if chosen is None:  # only on a node the pod does not fit (a pod bound there past gpuaas)
                raise ValueError(f"{state.names[node]} has fewer than {pod.gpus} free GPUs")
            return chosen
        return super().devices(state, pod, node)

    def share_gpu(self, state: ClusterState, pod: PodDemand, node: int) -> int:
        fx = self.index
        gpus = np.flatnonzero(state.gpu_left[node] >= pod.gpu_milli)
        rows = np.full(gpus.size, node)
        left = state.gpu_left[node, gpus]
        value = (fx.frag[rows] - fx.frag_after_share(rows, gpus, pod)
                 - self.REGRET_WEIGHT * self.share_values.regret(left, pod.gpu_milli))
        return int(gpus[np.lexsort((gpus, left, -value))[0]])


def cpu_per_gpu_milli(workload: Workload) -> float:
    """CPU the workload's GPU pods bring per thousandth of GPU (popularity-weighted over the typical shapes)."""
    gpu = np.array([sh.gpus * sh.gpu_milli for sh in workload.shapes], dtype=float)
    cpu = np.array([sh.cpu_milli for sh in workload.shapes], dtype=float)
    g = gpu > 0
    return float((workload.popularity[g] * cpu[g]).sum() / (workload.popularity[g] * gpu[g]).sum()) \
        if g.any() else 0.0


def unfed(idle: NDArray[np.float64], rate: float, left: NDArray[np.float64]) -> NDArray[np.float64]:
    """How much of `idle` a node cannot feed when each unit needs `rate` of a resource it has `left` of (rate > 0)."""
    return np.minimum(idle, np.maximum(0.0, idle * rate - left) / rate)


def scarcity_weighted(state: ClusterState, workload: Workload, exponent: float) -> Workload:
    """Popularity x (cluster GPUs / GPUs the shape may use) ** exponent, renormalised. A no-op when no shape is
    restricted to some GPU models."""
    total = float(state.gpu_count.sum())
    if total == 0:  # no GPU in the cluster (yet): nothing is scarcer than anything else
        return workload
    supply = np.array([float(state.gpu_count[state.model_allowed(PodDemand(gpus=1, gpu_milli=1,
                                                                              allowed_models=sh.allowed_models))].sum())
                       if sh.allowed_models else total for sh in workload.shapes])
    weight = workload.popularity * (total / np.maximum(supply, 1.0)) ** exponent
    if np.allclose(weight, workload.popularity):
        return workload
    return replace(workload, popularity=weight / weight.sum())


def fits_in_one_block(state: ClusterState, k: int, rows: np.ndarray | None = None) -> np.ndarray:
    """float[len(rows)] (float[N] without rows): 1 where some NVLink/NUMA block on the node has k fully free GPUs."""
    # Over every node, then gathered: whole-array work beats copying [rows, G] slices of two arrays.
    free = state.gpu_left == MILLI
    block = state.block
    # The ids present, by counting rather than sorting (np.unique over every GPU of the cluster cost 0.5 ms).
    ids = np.flatnonzero(np.bincount(block.ravel())) if block.size and block.min() >= 0 else np.unique(block)
    best = np.zeros(len(block), dtype=np.int64)
    for b in ids:
        np.maximum(best, count_per_row(free & (block == b)), out=best)
    return (best >= k).astype(float) if rows is None else (best[rows] >= k).astype(float)


def topology_gpus(state: ClusterState, node: int, k: int) -> tuple[int, ...] | None:
    """k free GPUs spanning the fewest blocks; among those, the set that leaves the most blocks entirely free, then
    the most free GPUs in the emptiest remaining block (keeps big aligned sets for later), then lowest indices. None
    when the node has fewer than k free GPUs."""
    free = tuple(np.flatnonzero(state.gpu_left[node] == MILLI).tolist())
    return _topology_choice(free, tuple(state.block[node, :int(state.gpu_count[node])].tolist()), k)


@lru_cache(maxsize=8192)
def _topology_choice(free: tuple[int, ...], blocks: tuple[int, ...], k: int) -> tuple[int, ...] | None:
    # A pure function of (free GPUs, block per GPU, k), and few such keys exist: remembered, since trying every
    # k-subset costs up to 0.3 ms (70 sets of 4 out of 8) and it runs for every multi-GPU placement.
    size = Counter(blocks)
    best_key, best = None, None
    for combo in combinations(free, k):
        rest = Counter(blocks[g] for g in free if g not in combo)
        spanned = len({blocks[g] for g in combo})
        whole_free = sum(1 for b, n in rest.items() if n == size[b])
        key = (spanned, -whole_free, -max(rest.values(), default=0), combo)
        if best_key is None or key < best_key:
            best_key, best = key, combo
    return best


POLICIES[GpuaasPolicy.name] = GpuaasPolicy
POLICIES[FirstFitPolicy.name] = FirstFitPolicy


# -- extender-facing helpers -------------------------------------------------------------------------------------------


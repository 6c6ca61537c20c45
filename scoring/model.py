"""The cluster model every gpuaas decision reads: nodes, their GPUs, and pod demands.

One model for the extender, the node scaler's what-if and the packing simulator. Node state is kept column-wise in numpy
arrays (one row per node, one column per GPU slot) so that scoring a pod against every node is array work.

Units: CPU in millicores, memory in MiB, GPU share in thousandths of a GPU ("milli": 1000 = one whole GPU). A GPU's
MIG state is the 8-bit mask of memory slices in use (scoring.gpus). A GPU's `block` is its NVLink/NUMA group on the
node: GPUs in the same block talk over NVLink or at least share a CPU socket.

Time-slicing. A node whose device plugin time-slices its GPUs into R replicas (`nvidia.com/gpu.replicas: R`; it then
advertises R `nvidia.com/gpu` devices per GPU) has `NodeSpec.gpu_replicas = R`. One replica is a share of its GPU,
1000//R thousandths (`ClusterState.replica_milli`), kept in the same per-GPU `gpu_left` as every other share, and a pod
asking `nvidia.com/gpu: N` (`PodDemand.takes_replicas`) takes N replicas there instead of N whole GPUs. For N > 1 the
model is what the NVIDIA device plugin does unless `failRequestsGreaterThanOne` is set (then such a pod fails at the
kubelet, UnexpectedAdmissionError): it hands out any N free replicas of the node, spread by its default `distributed`
allocation policy (each next replica from the GPU with the fewest replicas handed out), so several may come from one GPU
once the others are taken, and the pod gets no more compute for them than CUDA's time-slicing gives any process. So the
pod fits when the node has N free replicas in all (what kube-scheduler counts too), takes N replicas, and gpuaas records
the GPUs the device plugin is expected to pick (scoring.policies.replica_devices), a GPU listed once per replica. A GPU
share gpuaas accounts (`gpuaas.io/gpu-share`) does not fit a time-sliced node: its device plugin hands out replicas,
nothing else, so the replicas are the only shares such a node can give (scoring.fit says so). MIG instances of a node
with MIG-enabled and time-sliced GPUs (mixed strategy) stay whole instances: `nvidia.com/gpu.replicas` counts the
`nvidia.com/gpu` devices only. With R not dividing 1000 (3, 6, 7, ...) a full GPU keeps the rest (1000 - R x 1000//R
thousandths) idle and unusable.

Shares. A GPU share (`gpuaas.io/gpu-share`, `PodDemand.is_share` or `whole_share`) is an extended resource only gpuaas
accounts: on a real node it reaches a GPU only through a device plugin that advertises `gpuaas.io/gpu-share` (the
kubelet drops the request for an extended resource its node does not advertise and starts the pod without it).
`NodeSpec.gpu_shares` says whether the node has one; `ClusterState.share_nodes` is the nodes a share fits at all
(share-capable and not time-sliced), and the fit rules, the fragmentation measure and the planners refuse shares
elsewhere. Nodes built by hand or from a trace can (the simulation models a cluster that shares GPUs, as FGD's does).

Channels. A node's GPUs reach pods one way: as the device plugin's extended resources, or as DRA devices
(`NodeSpec.dra`: published in ResourceSlices, allocated to ResourceClaims). A pod asking `nvidia.com/gpu`,
`nvidia.com/mig-<profile>` or `gpuaas.io/gpu-share` gets nothing from a DRA node (kube-scheduler filters the first two
itself, not the share it ignores), and a pod asking through claims (`PodDemand.claims`) nothing from a device-plugin
node: the fit rules and the planners keep each to its own nodes.

Device indices. Which GPU index a pod holds is a fact only where something on the node enforces gpuaas's choice (a
share-capable plugin reading `gpuaas.io/devices`, DRA allocations). With the NVIDIA device plugin the kubelet and the
plugin pick the devices of `nvidia.com/gpu` and `nvidia.com/mig-<profile>` pods themselves: there the per-GPU columns
are the model's bookkeeping, and every fit rule reads them as per-node counts only (free whole GPUs, free replicas,
free instances per profile), which are right whichever devices the plugin picked. Scores that look at single GPUs
(fragmentation, NVLink blocks) are preferences on that bookkeeping, not facts (docs/devices.md, "What is enforced").
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from scoring.gpus import GpuModel, MigLayoutError, get_model, layout_mask, resolve_mig_layout

MILLI = 1000
MAX_GPUS_PER_NODE = 8


@dataclass(frozen=True)
class NodeSpec:
    """A node as provisioned: capacity, GPU model, per-GPU NVLink/NUMA block and MIG layout."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int = 0
    gpu_model: str = ""  # catalog name (scoring.gpus); "" for CPU-only nodes
    # Block id per GPU (same id = same NVLink/NUMA island). Default: one block per 4 GPUs (2 x 4 on 8-GPU boards).
    gpu_blocks: tuple[int, ...] | None = None
    # MIG layout per GPU as {profile: count}; None = MIG disabled on every GPU.
    mig_layouts: tuple[dict[str, int] | None, ...] | None = None
    node_group: str = ""
    # Time-slicing replicas per GPU (`nvidia.com/gpu.replicas`): each nvidia.com/gpu device of the node is one replica,
    # MILLI // gpu_replicas thousandths of a GPU; 1 = exclusive GPUs (see the module docstring).
    gpu_replicas: int = 1
    # Whether the node can give a GPU share gpuaas accounts (`gpuaas.io/gpu-share`): in a cluster, whether a device
    # plugin on it advertises that resource (scoring.kubeobjects.node_spec; without one the kubelet starts such a pod
    # with no GPU); in simulation every node can (see the module docstring, "Shares").
    gpu_shares: bool = True
    # The GPUs are DRA devices (ResourceSlices; scoring.dra.dra_node_spec): only pods asking through ResourceClaims
    # (PodDemand.claims) get them, and such pods get no other node's GPUs (see the module docstring, "Channels").
    dra: bool = False

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.gpus > MAX_GPUS_PER_NODE:
            raise ValueError(f"node {self.name}: gpus must be 0..{MAX_GPUS_PER_NODE}, got {self.gpus}")
        if not 1 <= self.gpu_replicas <= MILLI:
            raise ValueError(f"node {self.name}: gpu_replicas must be 1..{MILLI}, got {self.gpu_replicas}")
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"node {self.name}: negative capacity")
        if self.gpu_blocks is not None and len(self.gpu_blocks) != self.gpus:
            raise ValueError(f"node {self.name}: {len(self.gpu_blocks)} gpu_blocks for {self.gpus} GPUs")


@dataclass(frozen=True)
class PodDemand:
    """What one pod asks for.

    gpus: whole GPUs (`nvidia.com/gpu`; on a time-sliced node that many replicas, see `takes_replicas`), or 1 with
    gpu_milli < 1000 for a share of one GPU (`gpuaas.io/gpu-share`, or a trace's fractional pod), or 1 with a
    mig_profile for one MIG instance. whole_share: 1 GPU with gpu_milli 1000 asked as `gpuaas.io/gpu-share: 1000`, a
    share only gpuaas accounts that happens to be whole (a time-sliced node cannot give it; every smaller share is
    `is_share`). allowed_models: catalog names the pod may run on; empty = any.
    """

    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_milli: int = 0  # per GPU; 1000 for whole GPUs
    mig_profile: str = ""
    allowed_models: frozenset[str] = field(default_factory=frozenset)
    name: str = ""
    whole_share: bool = False
    claims: bool = False  # the GPUs are asked through ResourceClaims (scoring.draclaims): DRA nodes only

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"pod {self.name}: negative request")
        if self.gpus and not self.mig_profile and not 0 < self.gpu_milli <= MILLI:
            raise ValueError(f"pod {self.name}: gpu_milli must be in 1..1000 when gpus > 0, got {self.gpu_milli}")
        if self.gpu_milli < MILLI and self.gpus > 1:
            raise ValueError(f"pod {self.name}: a GPU share (gpu_milli < 1000) is for one GPU, got gpus={self.gpus}")
        if self.mig_profile and self.gpus != 1:
            raise ValueError(f"pod {self.name}: a MIG profile request takes exactly one instance")
        if self.whole_share and (self.gpus != 1 or self.gpu_milli != MILLI or self.mig_profile):
            raise ValueError(f"pod {self.name}: whole_share is one GPU's 1000 thousandths")

    @property
    def is_share(self) -> bool:
        return self.gpus == 1 and self.gpu_milli < MILLI and not self.mig_profile

    @property
    def takes_replicas(self) -> bool:
        """The pod asks for `nvidia.com/gpu` devices: whole GPUs on an exclusive node, that many time-slicing replicas
        on a time-sliced one."""
        return self.gpus > 0 and self.gpu_milli == MILLI and not self.mig_profile and not self.whole_share

    @property
    def total_gpu_milli(self) -> int:
        """GPU demand in thousandths, as the FGD protocol counts it (MIG: compute slices / 7)."""
        return self.gpus * self.gpu_milli


class MigInstance(NamedTuple):
    """One configured MIG instance of a GPU: its profile, where its memory slices start, how many it spans, and
    whether a pod holds it."""

    profile: str
    start: int
    size: int
    allocated: bool


class ClusterState:
    """Mutable, column-wise cluster state. Rows are nodes; GPU columns beyond a node's count are padding.

    Arrays (N nodes, G = MAX_GPUS_PER_NODE):
      cpu_cap, cpu_left, mem_cap, mem_left   int64[N]
      gpu_count                              int64[N]
      replicas                               int64[N]   time-slicing replicas per GPU (1 = exclusive GPUs)
      replica_milli                          int64[N]   thousandths one nvidia.com/gpu device takes (MILLI // replicas)
      time_sliced                            bool[N]    replicas > 1
      share_nodes                            bool[N]    a GPU share (gpuaas.io/gpu-share) can be given there
      dra_rows                               bool[N]    the GPUs are DRA devices (pods asking through claims only)
      model_idx                              int64[N]   index into `models` (-1 for CPU nodes)
      gpu_left                               int64[N,G] thousandths free per GPU (0 for padding and MIG GPUs)
      gpu_exists                             bool[N,G]
      mig_enabled                            bool[N,G]
      mig_mask                               uint8[N,G] memory slices in use by *allocated* MIG instances
      mig_free                               int64[N,G,P] free instances per profile column (see mig_profiles)
      block                                  int64[N,G] NVLink/NUMA block id
    """

    def __init__(self, nodes: Sequence[NodeSpec]):
        self.nodes = list(nodes)
        n = len(self.nodes)
        # Copies allocated one after another: the extender looks up thousands of names per request in `index`, and
        # keys scattered across the heap (as parsed from Node objects) make that a third slower (0.40 -> 0.30 ms for
        # 5,000 names).
        self.names = [x.name.encode().decode() for x in self.nodes]
        self.index = {name: i for i, name in enumerate(self.names)}
        if len(self.index) != n:
            raise ValueError("duplicate node names")
        model_names = sorted({x.gpu_model for x in self.nodes if x.gpus})
        self.models: list[GpuModel] = [get_model(m) for m in model_names]
        self.model_names = [m.name for m in self.models]
        self.model_pos = {m: i for i, m in enumerate(self.model_names)}
        # MIG profile columns: union of profile names over models present.
        self.mig_profiles: list[str] = sorted({p for m in self.models for p in m.mig_profiles})
        self.mig_pos = {p: i for i, p in enumerate(self.mig_profiles)}

        c = self._columns(self.nodes)
        self.cpu_cap, self.mem_cap = c["cpu_cap"], c["mem_cap"]
        self.cpu_left, self.mem_left = c["cpu_left"], c["mem_left"]
        self.gpu_count, self.replicas, self.replica_milli = c["gpu_count"], c["replicas"], c["replica_milli"]
        self.time_sliced = c["time_sliced"]
        # Nodes a GPU share fits at all: a device plugin there gives shares, and it does not time-slice (see "Shares").
        self.share_nodes = c["share_nodes"]
        # DRA nodes (see "Channels"): their GPUs go to pods asking through claims, and only theirs do.
        self.dra_rows = c["dra_rows"]
        self.model_idx = c["model_idx"]
        self.gpu_exists, self.gpu_left = c["gpu_exists"], c["gpu_left"]
        self.mig_enabled, self.mig_mask, self.mig_free = c["mig_enabled"], c["mig_mask"], c["mig_free"]
        self.block = c["block"]
        self._flags()
        # Configured instances per node row: {gpu: instances in the layout's order}, for MIG-enabled GPUs.
        self.mig_instances: list[dict[int, list[MigInstance]]] = [{} for _ in range(n)]
        self.pods_on: list[list[tuple[PodDemand, tuple[int, ...]]]] = [[] for _ in range(n)]
        self.version = 0  # bumped on every change, lets callers cache per-state work
        for i, spec in enumerate(self.nodes):
            self._set_layouts(i, spec)

    # The per-node arrays, all indexed by row first: what inserting or deleting a node's row changes (every ndarray
    # attribute of the state is one of them; tests/scoring/test_node_rows.py checks that).
    ROW_ARRAYS = ("cpu_cap", "mem_cap", "cpu_left", "mem_left", "gpu_count", "replicas", "replica_milli", "time_sliced",
                  "share_nodes", "dra_rows", "model_idx", "gpu_exists", "gpu_left", "mig_enabled", "mig_mask",
                  "mig_free", "block")

    def _columns(self, specs: Sequence[NodeSpec]) -> dict[str, np.ndarray]:
        """The ROW_ARRAYS of idle nodes `specs` (MIG layouts not yet applied: `_set_layouts`). Their GPU models must
        be among `models`."""
        n, g = len(specs), MAX_GPUS_PER_NODE
        cpu_cap = np.array([x.cpu_milli for x in specs], dtype=np.int64)
        mem_cap = np.array([x.memory_mib for x in specs], dtype=np.int64)
        gpu_count = np.array([x.gpus for x in specs], dtype=np.int64)
        replicas = np.array([x.gpu_replicas for x in specs], dtype=np.int64)
        time_sliced = replicas > 1
        gpu_exists = np.arange(g)[None, :] < gpu_count[:, None]
        block = np.zeros((n, g), dtype=np.int64)
        for i, spec in enumerate(specs):
            block[i, : spec.gpus] = spec.gpu_blocks if spec.gpu_blocks is not None else default_blocks(spec.gpus)
        return {
            "cpu_cap": cpu_cap, "mem_cap": mem_cap, "cpu_left": cpu_cap.copy(), "mem_left": mem_cap.copy(),
            "gpu_count": gpu_count, "replicas": replicas, "replica_milli": MILLI // replicas,
            "time_sliced": time_sliced,
            "share_nodes": np.array([x.gpu_shares for x in specs], dtype=bool) & ~time_sliced,
            "dra_rows": np.array([x.dra for x in specs], dtype=bool),
            "model_idx": np.array([self.model_pos[get_model(x.gpu_model).name] if x.gpus else -1 for x in specs],
                                  dtype=np.int64),
            "gpu_exists": gpu_exists, "gpu_left": np.where(gpu_exists, MILLI, 0).astype(np.int64),
            "mig_enabled": np.zeros((n, g), dtype=bool), "mig_mask": np.zeros((n, g), dtype=np.uint8),
            "mig_free": np.zeros((n, g, max(1, len(self.mig_profiles))), dtype=np.int64), "block": block,
        }

    def _flags(self) -> None:
        self.any_time_sliced = bool(self.time_sliced.any())  # most clusters have none: the rules skip the work
        self.all_share_nodes = bool(self.share_nodes.all())  # simulations: every node; the rules skip the work
        self.any_dra = bool(self.dra_rows.any())

    def _set_layouts(self, row: int, spec: NodeSpec) -> None:
        for gi, layout in enumerate(spec.mig_layouts or ()):
            if layout is not None:
                self.set_mig_layout(row, gi, layout)

    # -- queries ---------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpu_count.sum()) * MILLI

    @property
    def used_gpu_milli(self) -> int:
        """Allocated GPU share in thousandths (a MIG instance counts compute_slices/7 of its GPU)."""
        return self.total_gpu_milli - int(self.gpu_idle_milli().sum())

    def gpu_idle_milli(self) -> np.ndarray:
        """Idle thousandths per node, counting free MIG compute slices on MIG GPUs."""
        idle: np.ndarray = self.gpu_left.sum(axis=1)  # numpy's stubs type an axis reduction as Any
        if self.mig_enabled.any():
            idle = idle + self._mig_idle_milli().sum(axis=1)
        return idle

    def _mig_idle_milli(self) -> np.ndarray:
        out = np.zeros(self.gpu_left.shape, dtype=np.int64)
        for i, gpus in enumerate(self.mig_instances):
            for gi, insts in gpus.items():
                profiles = self.models[self.model_idx[i]].mig_profiles
                used = sum(profiles[p].compute_slices for p, _, _, alloc in insts if alloc)
                out[i, gi] = (MILLI * (7 - used)) // 7
        return out

    def device_milli(self, node: int, pod: PodDemand) -> int:
        """Thousandths the pod takes from each GPU index it is given on `node` (a replica on a time-sliced node)."""
        return int(self.replica_milli[node]) if pod.takes_replicas else pod.gpu_milli

    def pod_gpu_milli(self, pod: PodDemand, rows: np.ndarray | None = None) -> NDArray[np.int64]:
        """int64[len(rows)] (int64[N] without rows): the GPU thousandths the pod takes on each node; a pod asking
        nvidia.com/gpu: N takes N replicas on a time-sliced node, N whole GPUs elsewhere."""
        unit = self.replica_milli if rows is None else self.replica_milli[rows]
        if pod.takes_replicas:
            return pod.gpus * unit
        return np.full(unit.shape, pod.total_gpu_milli, dtype=np.int64)

    def free_replicas(self, rows: np.ndarray | None = None) -> NDArray[np.int64]:
        """int64[len(rows)] (int64[N] without rows): the nvidia.com/gpu devices free on each node, as its device plugin
        counts them: whole free GPUs on an exclusive node, free replicas on a time-sliced one."""
        left = self.gpu_left if rows is None else self.gpu_left[rows]
        unit = self.replica_milli if rows is None else self.replica_milli[rows]
        free: NDArray[np.int64] = (left // unit[:, None]).sum(axis=1)  # exclusive: 1 per wholly free GPU, else 0
        return free

    def model_allowed(self, pod: PodDemand) -> NDArray[np.bool_]:
        """bool[N]: node's GPU model is one the pod accepts (always True for pods without a model constraint)."""
        if not pod.allowed_models:
            return np.ones(len(self), dtype=bool)
        ok_models = np.array([m in pod.allowed_models for m in self.model_names] + [False], dtype=bool)
        allowed: NDArray[np.bool_] = ok_models[self.model_idx]  # -1 indexes the trailing False (CPU nodes)
        return allowed

    # -- changes ---------------------------------------------------------------------------------------------------

    def set_mig_layout(self, node: int, gpu: int, layout: str | dict[str, int]) -> None:
        """Partition one idle GPU (or disable MIG with 'all-disabled'/{}); raises MigLayoutError if impossible."""
        model = self.models[self.model_idx[node]] if self.gpu_count[node] else None
        if model is None or gpu >= self.gpu_count[node]:
            raise MigLayoutError(f"node {self.names[node]} has no GPU {gpu}")
        insts = self.mig_instances[node].get(gpu)
        busy = self.gpu_left[node, gpu] < MILLI and not self.mig_enabled[node, gpu]
        if busy or (insts and any(a for *_, a in insts)):
            raise MigLayoutError(f"GPU {gpu} on {self.names[node]} is in use; repartition needs an idle GPU")
        placements = resolve_mig_layout(model, layout)
        disabled = layout == "all-disabled" or (not isinstance(layout, str) and not any(dict(layout).values()))
        self.mig_free[node, gpu, :] = 0
        self.mig_mask[node, gpu] = 0
        if disabled and not placements:
            self.mig_enabled[node, gpu] = False
            self.mig_instances[node].pop(gpu, None)
            self.gpu_left[node, gpu] = MILLI
        else:
            self.mig_enabled[node, gpu] = True
            self.gpu_left[node, gpu] = 0
            self.mig_instances[node][gpu] = [MigInstance(p.profile, p.start, p.size, False) for p in placements]
            for p in placements:
                self.mig_free[node, gpu, self.mig_pos[p.profile]] += 1
        self.version += 1

    def place(self, node: int, pod: PodDemand, gpus: Sequence[int] = ()) -> None:
        """Bind a pod to a node and the given GPU indices (what the extender records in gpuaas.io/devices)."""
        self.cpu_left[node] -= pod.cpu_milli
        self.mem_left[node] -= pod.memory_mib
        if pod.mig_profile:
            (gi,) = gpus
            insts = self.mig_instances[node][gi]
            for k, inst in enumerate(insts):
                if inst.profile == pod.mig_profile and not inst.allocated:
                    insts[k] = inst._replace(allocated=True)
                    self.mig_mask[node, gi] |= ((1 << inst.size) - 1) << inst.start
                    self.mig_free[node, gi, self.mig_pos[pod.mig_profile]] -= 1
                    break
            else:
                raise MigLayoutError(f"no free {pod.mig_profile} instance on GPU {gi} of {self.names[node]}")
        elif pod.gpus:
            if len(gpus) != pod.gpus:
                raise ValueError(f"pod {pod.name}: {len(gpus)} devices for {pod.gpus} GPUs")
            per = self.device_milli(node, pod)
            for gi in gpus:  # a GPU listed twice gives two replicas (time-slicing)
                self.gpu_left[node, gi] -= per
            if (self.gpu_left[node] < 0).any():
                raise ValueError(f"pod {pod.name}: GPU over-commit on {self.names[node]}")
        self.pods_on[node].append((pod, tuple(gpus)))
        self.version += 1

    def place_or_refuse(self, node: int, pod: PodDemand, gpus: Sequence[int] = ()) -> None:
        """`place`, or its error with the node as it was: `place` takes the CPU, memory and GPU share before it
        refuses (a DRA device allocated twice is held once that way, scoring.clusterview._hold)."""
        taken = self.cpu_left[node], self.mem_left[node], self.gpu_left[node].copy()
        try:
            self.place(node, pod, gpus)
        except (ValueError, KeyError, IndexError):
            self.cpu_left[node], self.mem_left[node], self.gpu_left[node] = taken
            raise

    def remove(self, node: int, pod: PodDemand, gpus: Sequence[int] = ()) -> None:
        """Undo `place` (pod departure, or a what-if revert)."""
        self.cpu_left[node] += pod.cpu_milli
        self.mem_left[node] += pod.memory_mib
        if pod.mig_profile:
            (gi,) = gpus
            insts = self.mig_instances[node][gi]
            for k, inst in enumerate(insts):
                if inst.profile == pod.mig_profile and inst.allocated:
                    insts[k] = inst._replace(allocated=False)
                    self.mig_mask[node, gi] &= ~np.uint8((((1 << inst.size) - 1) << inst.start) & 0xFF)
                    self.mig_free[node, gi, self.mig_pos[pod.mig_profile]] += 1
                    break
        else:
            per = self.device_milli(node, pod)
            for gi in gpus:
                self.gpu_left[node, gi] += per
        entry = (pod, tuple(gpus))
        self.pods_on[node].remove(entry)
        self.version += 1

    # -- the node set: a row in, out or made anew, in time for one node (and one copy of the columns) ---------------

    def covers(self, spec: NodeSpec) -> bool:
        """Whether a row of `spec` fits the model's columns: its GPU model (and so its MIG profiles) is one the model
        has. A node of another model changes what every row is measured in (the model and MIG profile columns):
        build the state anew."""
        return not spec.gpus or get_model(spec.gpu_model).name in self.model_pos

    def insert_node(self, row: int, spec: NodeSpec) -> None:
        """Add an idle node as row `row` (the rows from `row` on move down one): the state ends as a state built with
        `spec` at that position and the same pods placed. The caller keeps any row order it relies on (the live view:
        by name). Raises ValueError for a name already there or a GPU model the model lacks (`covers`)."""
        if spec.name in self.index:
            raise ValueError(f"node {spec.name} is already row {self.index[spec.name]}")
        if not self.covers(spec):
            raise ValueError(f"node {spec.name}: GPU model {spec.gpu_model} is not in the model; build it anew")
        n = len(self.nodes)
        if not 0 <= row <= n:
            raise ValueError(f"row {row} is outside 0..{n}")
        for key, value in self._columns([spec]).items():
            old = getattr(self, key)
            new = np.empty((n + 1, *old.shape[1:]), dtype=old.dtype)
            new[:row], new[row], new[row + 1:] = old[:row], value[0], old[row:]
            setattr(self, key, new)
        self.nodes.insert(row, spec)
        # A new list (not one changed in place): who keyed work on the old one (the prioritize encoder) sees the change.
        self.names = [*self.names[:row], spec.name.encode().decode(), *self.names[row:]]
        self.index.update(zip(self.names[row:], range(row, n + 1), strict=True))
        self.mig_instances.insert(row, {})
        self.pods_on.insert(row, [])
        self._flags()
        self._set_layouts(row, spec)
        self.version += 1

    def delete_node(self, row: int) -> None:
        """Remove row `row` and what its pods hold (the rows after it move up one)."""
        n = len(self.nodes)
        for key in self.ROW_ARRAYS:  # two slice copies (a boolean mask's gather is twice as slow)
            old = getattr(self, key)
            new = np.empty((n - 1, *old.shape[1:]), dtype=old.dtype)
            new[:row], new[row:] = old[:row], old[row + 1:]
            setattr(self, key, new)
        name = self.names[row]
        del self.nodes[row], self.mig_instances[row], self.pods_on[row]
        self.names = [*self.names[:row], *self.names[row + 1:]]  # a new list, as in insert_node
        del self.index[name]
        self.index.update(zip(self.names[row:], range(row, len(self.names)), strict=True))
        self._flags()
        self.version += 1

    def reset_node(self, row: int, spec: NodeSpec) -> None:
        """Make row `row` anew from `spec` (the same node name, a changed spec), idle: its pods are placed again by
        the caller. Raises ValueError for another name or a GPU model the model lacks."""
        if spec.name != self.names[row]:
            raise ValueError(f"row {row} is node {self.names[row]}, not {spec.name}")
        if not self.covers(spec):
            raise ValueError(f"node {spec.name}: GPU model {spec.gpu_model} is not in the model; build it anew")
        for key, value in self._columns([spec]).items():
            getattr(self, key)[row] = value[0]
        self.nodes[row] = spec
        self.mig_instances[row] = {}
        self.pods_on[row] = []
        self._flags()
        self._set_layouts(row, spec)
        self.version += 1

    def copy_row(self, other: ClusterState, row: int) -> None:
        """Make row `row` what it is in `other`, a state of the same nodes in the same rows (this state's copy went
        its own way): a plan made on a copy takes back the rows the live model changed since (scoring.queueplan)."""
        for key in self.ROW_ARRAYS:
            getattr(self, key)[row] = getattr(other, key)[row]
        self.mig_instances[row] = {gi: list(insts) for gi, insts in other.mig_instances[row].items()}
        self.pods_on[row] = list(other.pods_on[row])
        self.version += 1

    def copy(self) -> ClusterState:
        """An independent snapshot (what-if simulation forks the state, then throws it away)."""
        other = object.__new__(ClusterState)
        for k, v in self.__dict__.items():
            if isinstance(v, np.ndarray):
                setattr(other, k, v.copy())
            elif k == "mig_instances":  # the instances are immutable: new lists of the same ones
                setattr(other, k, [{gi: list(insts) for gi, insts in gpus.items()} if gpus else {} for gpus in v])
            elif k == "pods_on":
                setattr(other, k, [list(x) for x in v])
            else:
                setattr(other, k, v)
        return other


def default_blocks(gpus: int) -> tuple[int, ...]:
    """NVLink/NUMA block per GPU when the node does not say: 8-GPU boards are two 4-GPU halves, smaller boards one."""
    if gpus >= 8:
        return tuple(i // 4 for i in range(gpus))
    return (0,) * gpus


def mig_layout_masks(model: GpuModel, layouts: Iterable[dict[str, int]]) -> list[int]:
    return [layout_mask(resolve_mig_layout(model, lay)) for lay in layouts]

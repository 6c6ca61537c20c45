"""DRA nodes in the scoring model, and the devices gpuaas allocates on them (docs/devices.md, "DRA mode").

`dra_cluster(slices, claims)` reads what the NVIDIA driver's ResourceSlices publish per node (scoring.dra) and what
every allocated claim holds, whoever allocated it. `dra_model(base, nodes, cluster, wanted)` is the live model with
those nodes' GPUs in it: the rows of the nodes labelled gpuaas.io/dra (CPU-only in `base`, which reads Nodes alone)
get their GPUs from the slices and their usage from the claims; every other row, and every row's CPU and memory, is
`base`'s. So one ClusterState holds device-plugin GPUs and DRA GPUs, and the same policies and planners place on both.

A DRA GPU is, at any time, whole (`gpu-<i>` allocated), shared (shares of `gpu-<i>-shared` allocated, their thousandths
taken from the GPU's share), partitioned (MIG partitions allocated) or idle. In the model:

  whole or shared   gpu_left as for a device-plugin GPU
  partitioned       MIG-enabled, with a layout of the partitions allocated plus a completion: free placements of the
                    profiles the GPU offers that fit beside them (the profiles pending pods want first, as many as fit,
                    then the largest), so that a MIG pod can be placed beside the partitions already there
  idle              a whole free GPU; when pods wait for a profile that no partitioned GPU has room for, idle GPUs
                    offering it are opened (MIG-enabled with a completion of that profile) for this plan, as few as
                    cover the wait, GPUs of nodes with partitions first
  static MIG        (the driver's default mode: instances exist, the parent GPU is not published) its instances

`DeviceAssigner` turns a placement the policy chose (a model row and GPU indices) into the devices of each claim:
`gpu-<i>` per whole GPU (one PCIe root for a claim that asks for it), the MIG device of the profile at a free placement
on the chosen GPU (its completion's placements first), or the shared device with its consumed capacity, and keeps
what it gave so that the next pod of the same plan is not given the same device. Pure.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scoring.dra import (
    DRA_LABEL,
    DRIVER,
    Allocated,
    DraGpu,
    DraMig,
    DraNode,
    GpuUsage,
    by_device,
    devices_in_use,
    dra_node,
    dra_spec_of,
    gpu_usage,
    gpus_in_use,
    pool_slices,
)
from scoring.draclaims import DeviceResult, PodClaim, UnsupportedClaim, consumed_capacity
from scoring.gpus import COMPUTE_SLICES, MigLayoutError, MigPlacement, UnknownGpuModelError
from scoring.kubeobjects import ObjectError, node_spec
from scoring.model import MILLI, ClusterState, NodeSpec, PodDemand

Obj = Mapping[str, Any]


@dataclass
class DraCluster:
    """The DRA nodes' GPUs and what allocated claims hold of them."""

    nodes: dict[str, DraNode] = field(default_factory=dict)  # by node (= pool) name, pools with GPUs
    devices: dict[tuple[str, str], Obj] = field(default_factory=dict)  # (node, device) -> the published device
    usage: dict[str, dict[str, GpuUsage]] = field(default_factory=dict)  # node -> device -> what claims hold
    errors: dict[str, str] = field(default_factory=dict)  # node -> why its slices cannot be read


def dra_cluster(slices: Iterable[Obj], claims: Iterable[Obj], driver: str = DRIVER) -> DraCluster:
    """Every pool of `driver` read as a node's GPUs (complete pools only: kube-scheduler allocates nothing from an
    incomplete one), with the devices every allocated claim holds."""
    out = DraCluster()
    for pool, (group, incomplete) in pool_slices(slices, driver).items():
        if incomplete:
            out.errors[pool] = "its ResourceSlices are not all published yet"
            continue
        try:
            node = dra_node(pool, group, driver)
        except (ObjectError, UnknownGpuModelError, ValueError) as err:
            out.errors[pool] = str(err)
            continue
        if not node.gpus:
            continue
        out.nodes[pool] = node
        for s in group:
            for d in s["spec"].get("devices") or ():
                out.devices[(pool, str(d.get("name")))] = d
    in_use = devices_in_use(claims, driver)
    for name, node in out.nodes.items():
        out.usage[name] = gpu_usage(node, in_use)
    return out


def dra_cluster_of(nodes: Mapping[str, DraNode], devices: Mapping[tuple[str, str], Obj],
                   allocated: Iterable[Allocated], errors: Mapping[str, str] | None = None,
                   driver: str = DRIVER) -> DraCluster:
    """dra_cluster on what is read already (scoring.draview.DraView.parsed: the informer's slices and claims, each
    read once when it changed): the pools with GPUs, their devices, and every allocated claim's devices."""
    out = DraCluster(dict(nodes), dict(devices), {}, dict(errors or {}))
    in_use = by_device(allocated, driver)
    for name, node in out.nodes.items():
        out.usage[name] = gpu_usage(node, in_use)
    return out


def is_dra_node(node: Obj) -> bool:
    return ((node.get("metadata") or {}).get("labels") or {}).get(DRA_LABEL) == "true"


# -- MIG on partitionable GPUs -----------------------------------------------------------------------------------------

def _compute(node: DraNode, profile: str) -> int:
    if node.model is None:
        return COMPUTE_SLICES
    try:
        return node.model.mig_profile(profile).compute_slices
    except MigLayoutError:
        return COMPUTE_SLICES


def _mask(placements: Iterable[MigPlacement]) -> int:
    mask = 0
    for p in placements:
        mask |= p.mask
    return mask


def completion(node: DraNode, gpu: DraGpu, used: Sequence[MigPlacement], wanted: Sequence[str] = ()) -> list[DraMig]:
    """Free partitions of a partitionable GPU that fit beside `used` together: the `wanted` profiles first, as many
    of each as fit, then the other profiles it offers, largest first; lowest starts first."""
    mask, compute = _mask(used), sum(_compute(node, p.profile) for p in used)
    offered = list(dict.fromkeys(m.profile for m in gpu.migs if m.partition))
    sizes = {m.profile: m.size for m in gpu.migs}
    order = [p for p in wanted if p in offered] + sorted((p for p in offered if p not in wanted),
                                                          key=lambda p: (-sizes[p], -_compute(node, p), p))
    out = []
    for profile in dict.fromkeys(order):
        need = _compute(node, profile)
        for m in sorted((m for m in gpu.migs if m.partition and m.profile == profile), key=lambda m: m.start):
            if m.size and not (m.placement.mask & mask) and compute + need <= COMPUTE_SLICES:
                out.append(m)
                mask |= m.placement.mask
                compute += need
    return out


@dataclass
class DraModel:
    """The live model with the DRA nodes' GPUs in it."""

    state: ClusterState
    cluster: DraCluster
    completions: dict[tuple[str, int], list[DraMig]] = field(default_factory=dict)  # (node, GPU position) -> free
    errors: list[str] = field(default_factory=list)  # allocations the model could not hold (over-committed devices)

    def dra_row(self, row: int) -> DraNode | None:
        return self.cluster.nodes.get(self.state.names[row])


def _per_gpu(node: DraNode, usage: Mapping[str, GpuUsage]) -> tuple[GpuUsage, ...]:
    return gpus_in_use(node, usage)


def _layouts(node: DraNode, per_gpu: Sequence[GpuUsage], wanted: Sequence[str],
             open_gpus: set[int]) -> tuple[list[dict[str, int] | None], dict[int, list[DraMig]]]:
    layouts: list[dict[str, int] | None] = []
    free: dict[int, list[DraMig]] = {}
    for pos, (gpu, use) in enumerate(zip(node.gpus, per_gpu, strict=True)):
        if gpu.static_mig:
            layouts.append(dict(Counter(m.profile for m in gpu.migs if m.size)) or None)
            continue
        if use.migs or pos in open_gpus:
            extra = completion(node, gpu, use.migs, wanted)
            free[pos] = extra
            layouts.append(dict(Counter([p.profile for p in use.migs] + [m.profile for m in extra])))
            continue
        layouts.append(None)
    return layouts, free


def _spec(node_obj: Obj, dra: DraNode, usage: Mapping[str, GpuUsage],
          layouts: Sequence[dict[str, int] | None]) -> NodeSpec:
    spec = dra_spec_of(node_obj, node_spec(node_obj), dra, usage)
    if spec.gpus != len(dra.gpus):  # unready node (incomplete pool, unknown model): as node_spec reads it
        return spec
    return dataclasses.replace(spec, mig_layouts=tuple(layouts) if any(layouts) else None)


def _overlay(base: ClusterState, specs: Mapping[str, NodeSpec]) -> ClusterState:
    """A model of `base`'s nodes with the rows named in `specs` rebuilt from them (GPUs free), every other row's GPU
    state and every row's CPU and memory as `base` has them."""
    state = ClusterState([specs.get(s.name, s) for s in base.nodes])
    keep = np.array([s.name not in specs for s in base.nodes], dtype=bool)
    state.cpu_left[:] = base.cpu_left
    state.mem_left[:] = base.mem_left
    state.gpu_left[keep] = base.gpu_left[keep]
    state.mig_enabled[keep] = base.mig_enabled[keep]
    state.mig_mask[keep] = base.mig_mask[keep]
    for profile, col in base.mig_pos.items():
        state.mig_free[keep, :, state.mig_pos[profile]] = base.mig_free[keep, :, col]
    for row, gpus in enumerate(base.mig_instances):
        if keep[row]:
            state.mig_instances[row] = {gpu: list(instances) for gpu, instances in gpus.items()}
    state.pods_on = [list(x) for x in base.pods_on]
    state.version = base.version + 1
    return state


def dra_model(base: ClusterState, nodes: Mapping[str, Obj], cluster: DraCluster, slices: Iterable[Obj],
              wanted: Mapping[str, int] | None = None) -> DraModel:
    """`base` (the live model of Nodes and Pods) with the GPUs of its DRA nodes (`nodes`: Node objects by name)
    from `cluster`, and their usage. `wanted`: MIG profile -> pods waiting for one; idle partitionable GPUs are
    opened for them when the partitions in use leave too little room (see the module docstring). `slices` is not
    read: `cluster` holds the pools read from them."""
    wanted = dict(wanted or {})
    order = [p for p, _ in sorted(wanted.items(), key=lambda kv: (-kv[1], kv[0]))]
    rows = [s.name for s in base.nodes if s.name in cluster.nodes and s.name in nodes and is_dra_node(nodes[s.name])]
    per_gpu = {name: _per_gpu(cluster.nodes[name], cluster.usage.get(name, {})) for name in rows}
    # Room for each wanted profile in the completions of the GPUs already partitioned; then idle GPUs opened.
    opened: dict[str, set[int]] = {name: set() for name in rows}
    room: Counter[str] = Counter()
    for name in rows:
        node = cluster.nodes[name]
        for gpu, use in zip(node.gpus, per_gpu[name], strict=True):
            if gpu.static_mig:
                taken = Counter(p.profile for p in use.migs)
                room.update({p: n - taken[p] for p, n in Counter(m.profile for m in gpu.migs).items()})
            elif use.migs:
                room.update(m.profile for m in completion(node, gpu, use.migs, order))
    partitioned = {name for name in rows if any(use.migs for use in per_gpu[name])}
    for profile in order:
        short = wanted[profile] - room[profile]
        for name in sorted(rows, key=lambda n: (n not in partitioned, n)):
            if short <= 0:
                break
            node = cluster.nodes[name]
            for pos, (gpu, use) in enumerate(zip(node.gpus, per_gpu[name], strict=True)):
                if short <= 0:
                    break
                idle = not (use.whole or use.migs or use.share_milli) and pos not in opened[name]
                if idle and not gpu.static_mig and any(m.partition and m.profile == profile for m in gpu.migs):
                    opened[name].add(pos)
                    got = completion(node, gpu, (), [profile, *order])
                    room.update(m.profile for m in got)
                    short -= sum(1 for m in got if m.profile == profile)
    specs: dict[str, NodeSpec] = {}
    completions: dict[tuple[str, int], list[DraMig]] = {}
    for name in rows:
        node = cluster.nodes[name]
        layouts, free = _layouts(node, per_gpu[name], order, opened[name])
        specs[name] = _spec(nodes[name], node, cluster.usage.get(name, {}), layouts)
        completions.update({(name, pos): f for pos, f in free.items()})
    state = _overlay(base, specs) if specs else base.copy()
    model = DraModel(state, cluster, completions)
    for name in rows:
        row = state.index[name]
        if state.gpu_count[row] != len(cluster.nodes[name].gpus):
            continue
        for device, use in sorted(cluster.usage.get(name, {}).items()):
            if (use.whole or use.migs) and len(use.claims) > 1:
                model.errors.append(f"{name} {device} is held by {len(use.claims)} claims: {', '.join(use.claims)}")
            elif use.share_milli > MILLI:
                model.errors.append(f"{name} {device}: shares of {use.share_milli}/1000 held")
        for pos, use in enumerate(per_gpu[name]):
            _hold(model, row, pos, use, name)
    return model


def _hold(model: DraModel, row: int, pos: int, use: GpuUsage, name: str) -> None:
    """What claims hold of one GPU, placed in the model."""
    state = model.state
    held: list[PodDemand] = []
    if use.whole:
        held.append(PodDemand(gpus=1, gpu_milli=MILLI, name="(claims)"))
    if use.share_milli:
        held.append(PodDemand(gpus=1, gpu_milli=min(use.share_milli, MILLI), name="(claims)"))
    if not state.mig_enabled[row, pos]:  # a static-MIG GPU's instances, or a partition's, only on a MIG GPU
        if use.migs:
            model.errors.append(f"{name} GPU {pos}: MIG partitions held beside a whole GPU or shares")
    else:
        held += [PodDemand(gpus=1, gpu_milli=MILLI, mig_profile=p.profile, name="(claims)") for p in use.migs]
    for demand in held:
        try:
            state.place(row, demand, (pos,))
        except (ValueError, KeyError, IndexError) as err:  # held twice: a claim allocated past gpuaas
            if not demand.mig_profile:
                state.gpu_left[row, pos] = max(0, int(state.gpu_left[row, pos]))
            model.errors.append(f"{name} GPU {pos}: {err}")


def same_root_nodes(model: DraModel, count: int) -> frozenset[str]:
    """DRA nodes where one PCIe root has `count` wholly free GPUs (a claim's matchAttribute on the root)."""
    out = set()
    state = model.state
    for name, node in model.cluster.nodes.items():
        row = state.index.get(name)
        if row is None or state.gpu_count[row] != len(node.gpus):
            continue
        free: Counter[str] = Counter(g.pcie_root for pos, g in enumerate(node.gpus)
                                     if state.gpu_left[row, pos] == MILLI and not state.mig_enabled[row, pos])
        if free and max(free.values()) >= count:
            out.add(name)
    return frozenset(out)


# -- devices for a placement -------------------------------------------------------------------------------------------

@dataclass
class _GpuTaken:
    whole: bool = False
    share: int = 0  # the shared device's `share` consumed
    migs: list[MigPlacement] = field(default_factory=list)
    devices: set[str] = field(default_factory=set)  # MIG devices and whole devices given


class DeviceAssigner:
    """The devices of a plan's placements, one pod at a time; what it gives is taken for the next."""

    def __init__(self, model: DraModel, share_id: Callable[[], str]):
        self.model = model
        self.share_id = share_id
        self.taken: dict[tuple[str, int], _GpuTaken] = {}
        for name, node in model.cluster.nodes.items():
            usage = model.cluster.usage.get(name, {})
            for pos, use in enumerate(gpus_in_use(node, usage)):
                t = _GpuTaken(use.whole, 0, list(use.migs),
                              {d for d, u in usage.items() if node.devices[d][1] == pos and (u.whole or u.migs)})
                gpu = node.gpus[pos]
                t.share = use.share_milli * max(gpu.share_capacity, 1) // MILLI
                self.taken[(name, pos)] = t

    def _gpu(self, node: str, pos: int) -> _GpuTaken:
        return self.taken.setdefault((node, pos), _GpuTaken())

    def assign(self, node_name: str, claims: Sequence[PodClaim], gpus: Sequence[int]) -> dict[str, list[DeviceResult]]:
        """The devices of each claim (by claim key) for a pod placed on `node_name` on the GPUs at positions `gpus`.
        Raises UnsupportedClaim (a claim's constraint the placement breaks) or ValueError (a device taken)."""
        node = self.model.cluster.nodes.get(node_name)
        if node is None:
            raise ValueError(f"{node_name} publishes no GPUs through DRA")
        out: dict[str, list[DeviceResult]] = {}
        pending = list(gpus)
        for claim in claims:
            results: list[DeviceResult] = []
            roots: set[str] = set()
            for r in claim.demand.requests:
                for _ in range(r.count):
                    if not pending:
                        raise ValueError(f"the placement on {node_name} has fewer GPUs than claim {claim.claim} asks")
                    pos = pending.pop(0)
                    if not 0 <= pos < len(node.gpus):
                        raise ValueError(f"{node_name} has no GPU {pos}")
                    gpu, t = node.gpus[pos], self._gpu(node_name, pos)
                    if r.kind == "gpu":
                        results.append(DeviceResult(r.name, self._whole(node_name, gpu, t)))
                        if r.name in claim.demand.same_root:
                            roots.add(gpu.pcie_root)
                    elif r.kind == "mig":
                        results.append(DeviceResult(r.name, self._mig(node, pos, gpu, t, r.profile)))
                    else:
                        results.append(self._share(node_name, gpu, t, r.name, r.share))
            if len(roots) > 1:
                raise UnsupportedClaim(f"claim {claim.claim}: the GPUs planned on {node_name} are under "
                                       f"{len(roots)} PCIe roots; its constraint asks for one")
            out[claim.claim] = results
        return out

    def _whole(self, node: str, gpu: DraGpu, t: _GpuTaken) -> str:
        if not gpu.device or t.whole or t.share or t.migs:
            raise ValueError(f"{node} GPU {gpu.device or gpu.index} is not free as a whole GPU")
        t.whole = True
        t.devices.add(gpu.device)
        return gpu.device

    def _mig(self, node: DraNode, pos: int, gpu: DraGpu, t: _GpuTaken, profile: str) -> str:
        if t.whole or t.share:
            raise ValueError(f"{node.name} GPU {gpu.index} is given whole or shared: no MIG partition on it")
        mask = _mask(t.migs)
        compute = sum(_compute(node, p.profile) for p in t.migs)
        planned = [m.device for m in self.model.completions.get((node.name, pos), ())]
        ok = [m for m in gpu.migs if m.profile == profile and m.device not in t.devices
              and (not m.partition or (not (m.placement.mask & mask) and compute + _compute(node, profile)
                                       <= COMPUTE_SLICES))]
        if not ok:
            raise ValueError(f"{node.name} GPU {gpu.index} has no free {profile} placement")
        m = min(ok, key=lambda m: (m.device not in planned, m.start, m.device))
        t.migs.append(m.placement)
        t.devices.add(m.device)
        return m.device

    def _share(self, node: str, gpu: DraGpu, t: _GpuTaken, request: str, share: int) -> DeviceResult:
        if not gpu.shared_device or t.whole or t.migs:
            raise ValueError(f"{node} GPU {gpu.index} cannot be shared now")
        device = self.model.cluster.devices.get((node, gpu.shared_device), {"name": gpu.shared_device})
        consumed = consumed_capacity(device, {"share": share})
        amount = consumed.get("share", share)
        if t.share + amount > max(gpu.share_capacity, 0):
            raise ValueError(f"{node} {gpu.shared_device}: {gpu.share_capacity - t.share} of {gpu.share_capacity} "
                             f"left, {amount} asked")
        t.share += amount
        return DeviceResult(request, gpu.shared_device, self.share_id(), consumed)

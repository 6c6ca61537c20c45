"""DRA nodes in a live model fed by informers (scoring.clusterview.ClusterView: the extender's), docs/devices.md "DRA
mode": ResourceSlices and ResourceClaims in, per DRA node its GPUs (scoring.dra.dra_node_spec) and per allocated claim
what it holds of them, as placements the model keeps like a bound pod's.

The pods of DRA claims ask for no GPU resource: the model reads them as CPU and memory only (scoring.kubeobjects), and
their GPUs are held by their claims, whoever allocated them (gpuaas, kube-scheduler, another allocator). So a DRA GPU
in the view is whole-free, held whole (`gpu-<i>`), shared (the thousandths of `gpu-<i>-shared` its shares consume) or
partitioned (its MIG partitions allocated: the node's layout, so a change of partitions changes the node's spec). What
the view does not do is the gang controller's: free placements beside partitions, idle GPUs opened for MIG
(scoring.dramodel.dra_model), since the extender places no pod through claims.

`DraView` is pure bookkeeping: it remembers the objects, and says which nodes' specs and which claims' holds changed;
ClusterView applies them to its state. A pool whose slices are not all published, or cannot be read, reads as no GPUs
(kube-scheduler allocates nothing from it either); a claim holding a device its node does not publish holds nothing.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scoring.dra import (
    DRIVER,
    SHARE_CAPACITY,
    TYPE_MIG,
    TYPE_SHARED,
    Allocated,
    DraNode,
    GpuUsage,
    allocated_devices,
    claim_key,
    dra_node,
    dra_node_spec,
    pool_slices,
)
from scoring.draclaims import claim_demand, combined_demand
from scoring.dramodel import is_dra_node
from scoring.gpus import UnknownGpuModelError
from scoring.kubeobjects import ObjectError
from scoring.model import MILLI, NodeSpec, PodDemand

Obj = Mapping[str, Any]
SLICE_KIND = "ResourceSlice"
CLAIM_KIND = "ResourceClaim"
HOLD_PREFIX = "ResourceClaim:"  # placements of claims are keyed HOLD_PREFIX + namespace/name, apart from pods' keys


@dataclass(frozen=True)
class DraParsed:
    """What the view has read of the slices and claims, for a planner that reads it in another thread
    (gangs.dra.prepare; scoring.dramodel.dra_cluster_of): new mappings of values never changed in place."""

    pools: Mapping[str, DraNode] = field(default_factory=dict)  # pool (= node) -> its GPUs, readable pools only
    devices: Mapping[tuple[str, str], Obj] = field(default_factory=dict)  # (pool, device) -> the published device
    allocated: Mapping[str, tuple[Allocated, ...]] = field(default_factory=dict)  # claim key -> its devices
    errors: Mapping[str, str] = field(default_factory=dict)  # pool -> why its slices cannot be read


@dataclass(frozen=True)
class Hold:
    """One device a claim holds, as the model places it: `demand` on GPU `gpu` of node `node`."""

    node: str
    gpu: int
    demand: PodDemand
    device: str


class DraView:
    """The ResourceSlices and allocated ResourceClaims of the NVIDIA driver seen so far."""

    def __init__(self, driver: str = DRIVER):
        self.driver = driver
        self.slices: dict[str, Obj] = {}  # slice name -> slice
        self.claims: dict[str, Obj] = {}  # namespace/name -> claim, allocated ones only
        self.holds: dict[str, tuple[Hold, ...]] = {}  # namespace/name -> what the claim holds
        self.allocated: dict[str, tuple[Allocated, ...]] = {}  # namespace/name -> its allocation's devices, read once
        self.errors: dict[str, str] = {}  # pool -> why its slices cannot be read
        self._slices_of: dict[str, set[str]] = {}  # pool -> names of its slices
        self._pools: dict[str, DraNode | None] = {}  # pool (= node name) -> its GPUs, None: none readable; read lazily
        self._devices: dict[str, dict[str, Obj]] = {}  # pool -> its devices by name (of the group read in _pools)

    # ---- informer events: each returns the nodes whose spec may have changed --------------------------------------
    def on_slice(self, old: Obj | None, new: Obj | None) -> set[str]:
        obj = new or old
        if obj is None:
            raise ValueError("a change without an object")
        name = str((obj.get("metadata") or {}).get("name", ""))
        pools = {_pool_of(o) for o in (old, new, self.slices.get(name)) if o}
        self.slices.pop(name, None)
        for pool in pools:
            self._slices_of.get(pool, set()).discard(name)
        if new is not None:
            self.slices[name] = new
            self._slices_of.setdefault(_pool_of(new), set()).add(name)
        for pool in pools:
            self._pools.pop(pool, None)
            self._devices.pop(pool, None)
        for key, claim in self.claims.items():  # holds are read against the node's devices: read them again
            if any(h.node in pools for h in self.holds.get(key, ())) or not self.holds.get(key):
                self.holds[key] = self._read_holds(claim)
        return pools

    def on_claim(self, old: Obj | None, new: Obj | None) -> tuple[str, tuple[Hold, ...], tuple[Hold, ...]]:
        """(claim key, what it held, what it holds now)."""
        obj = new or old
        if obj is None:
            raise ValueError("a change without an object")
        key = claim_key(obj)
        before = self.holds.get(key, ())
        if new is None or not (new.get("status") or {}).get("allocation"):
            self.claims.pop(key, None)
            self.holds.pop(key, None)
            self.allocated.pop(key, None)
            return key, before, ()
        self.claims[key] = new
        self.allocated[key] = _allocated(new)
        self.holds[key] = self._read_holds(new)
        return key, before, self.holds[key]

    @staticmethod
    def pod_shape(claim: Obj, learned: Mapping[str, PodDemand]) -> tuple[str, PodDemand] | None:
        """For a claim generated for a pod (its owner) whose shape `learned` holds without GPUs (the pod reads as CPU
        and memory only): (pod key, that shape with the GPUs the claim asks), for the learned workload. None for a
        claim of no pod, of a pod not learned or learned with GPUs, or one gpuaas does not read."""
        key = claim_owner(claim)
        base = learned.get(key) if key else None
        if key is None or base is None or base.gpus:
            return None
        where = f"ResourceClaim {claim_key(claim)}"
        try:
            demand = claim_demand(claim.get("spec") or {}, where)
            return None if demand is None else (key, combined_demand(base, [demand], where))
        except (ObjectError, ValueError):
            return None

    # ---- reading ---------------------------------------------------------------------------------------------------
    def parsed(self) -> DraParsed:
        """Every pool and allocated claim as read so far (pools not read yet are read now)."""
        pools: dict[str, DraNode] = {}
        devices: dict[tuple[str, str], Obj] = {}
        for name in self._slices_of:
            node = self.pool(name)
            if node is None:
                continue
            pools[name] = node
            devices.update(((name, d), obj) for d, obj in self._devices.get(name, {}).items())
        return DraParsed(pools, devices, dict(self.allocated), dict(self.errors))

    def _group(self, pool: str) -> list[Obj]:
        """The pool's slices of the newest generation, or [] while it is incomplete."""
        names = self._slices_of.get(pool, ())
        group, incomplete = pool_slices([self.slices[n] for n in names], self.driver).get(pool, ([], False))
        return [] if incomplete else group

    def pool(self, name: str) -> DraNode | None:
        """The GPUs pool `name` publishes, or None (no slices, incomplete, unreadable, no GPUs)."""
        if name not in self._pools:
            node = None
            self.errors.pop(name, None)
            group = self._group(name)
            if not group and self._slices_of.get(name):
                self.errors[name] = "its ResourceSlices are not all published yet"
            elif group:
                try:
                    node = dra_node(name, group, self.driver)
                except (ObjectError, UnknownGpuModelError, ValueError) as err:
                    self.errors[name] = str(err)
            self._pools[name] = node if node is not None and node.gpus else None
            self._devices[name] = {str(d.get("name")): d for s in group for d in (s["spec"].get("devices") or ())} \
                if self._pools[name] is not None else {}
        return self._pools[name]

    def node_spec(self, node: Obj, base: NodeSpec) -> NodeSpec:
        """The spec of a Node (`base`: as scoring.kubeobjects.node_spec read it): a DRA node's GPUs from its slices,
        its MIG layout the partitions its claims hold; any other node, or a DRA node whose pool is not readable, as
        read."""
        if not is_dra_node(node) or self.pool(base.name) is None:
            return base
        group = self._group(base.name)
        usage = {h.device: GpuUsage() for holds in self.holds.values() for h in holds
                 if h.node == base.name and h.demand.mig_profile}
        return dra_node_spec(node, group, self.driver, usage)

    def _read_holds(self, claim: Obj) -> tuple[Hold, ...]:
        out = []
        for a in self.allocated.get(claim_key(claim)) or _allocated(claim):
            node = self.pool(a.pool) if a.driver == self.driver else None
            where = node.devices.get(a.device) if node is not None else None
            if node is None or where is None:
                continue
            kind, pos = where
            gpu = node.gpus[pos]
            if kind == TYPE_SHARED:
                milli = a.consumed.get(SHARE_CAPACITY, gpu.share_capacity) * MILLI // max(gpu.share_capacity, 1)
                demand = PodDemand(gpus=1, gpu_milli=max(1, min(milli, MILLI)), name=a.claim)
            elif kind == TYPE_MIG:
                mig = next(m for m in gpu.migs if m.device == a.device)
                demand = PodDemand(gpus=1, gpu_milli=MILLI, mig_profile=mig.profile, name=a.claim)
            else:
                demand = PodDemand(gpus=1, gpu_milli=MILLI, name=a.claim)
            out.append(Hold(a.pool, pos, demand, a.device))
        return tuple(out)


def claim_owner(claim: Obj) -> str | None:
    """The pod a claim was generated for (its owner, namespace/name), or None."""
    meta = claim.get("metadata") or {}
    owner = next((o.get("name") for o in meta.get("ownerReferences") or () if o.get("kind") == "Pod"), None)
    return f"{meta.get('namespace', '')}/{owner}" if owner else None


def _allocated(claim: Obj) -> tuple[Allocated, ...]:
    """A claim's allocated devices; none for one that cannot be read (it holds nothing in the view)."""
    try:
        return tuple(allocated_devices(claim))
    except (ObjectError, ValueError):
        return ()


def _pool_of(slice_: Obj) -> str:
    return str(((slice_.get("spec") or {}).get("pool") or {}).get("name", ""))

"""Dynamic Resource Allocation (resource.k8s.io/v1) objects, as plain dicts, into the scoring model: the GPUs a node's
ResourceSlices publish and the devices ResourceClaims hold (docs/devices.md, "DRA mode").

The slices are read in the shape of the NVIDIA DRA driver (github.com/NVIDIA/k8s-dra-driver-gpu, driver
`gpu.nvidia.com`), one pool per node named after it:

  gpu-<minor>                          a whole GPU: attributes type=gpu, uuid, productName, architecture, ...,
                                       resource.kubernetes.io/pcieRoot; capacity memory (bytes)
  gpu-<minor>-mig-<profile>-<id>-<s>   a MIG device (type=mig, profile, parentUUID) starting at memory slice <s>:
                                       a MIG instance that exists (the driver's static MIG mode: its parent GPU is not
                                       published) or, consuming counters of the parent's counter set, a partition
                                       the allocation creates (dynamic MIG, "partitionable devices")
  gpu-<minor>-shared                   gpuaas's own (the NVIDIA driver has none): the GPU shared by fractions, with
                                       allowMultipleAllocations and the consumable capacity `share` (thousandths of
                                       the GPU, gpuaas.io/gpu-share's unit) and `memory`

A claim's allocation names devices by (driver, pool, device); one with a shareID holds `consumedCapacity` of a shared
device, any other the whole device. `devices_in_use` reads every allocated claim, whoever allocated it; `gpu_usage`
turns that into what each GPU of a node has given out (whole, MIG placements, thousandths).

Everything here is pure: no I/O, no clock.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scoring.gpus import GpuModel, MigLayoutError, MigPlacement, model_by_product
from scoring.kubeobjects import ObjectError, _amount, _blocks, _list, _map, node_spec
from scoring.model import MAX_GPUS_PER_NODE, MILLI, NodeSpec

DRA_API = "/apis/resource.k8s.io/v1"  # the apiserver path of the API group version (GA from Kubernetes 1.34)
DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"  # the NVIDIA driver's DeviceClasses (deployments/helm/.../deviceclass-*.yaml)
MIG_CLASS = "mig.nvidia.com"
SHARE_CLASS = "gpu-share.gpuaas.io"  # gpuaas's: the shared devices (type=shared)
DRA_LABEL = "gpuaas.io/dra"  # "true" on nodes whose GPUs are published by the DRA driver, not the device plugin
FINALIZER = "resource.kubernetes.io/delete-protection"  # k8s.io/api/resource/v1.Finalizer
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
TYPE_GPU, TYPE_MIG, TYPE_SHARED = "gpu", "mig", "shared"
SHARE_CAPACITY = "share"  # thousandths of the GPU a share holds (consumable capacity of a shared device)
MEMORY_CAPACITY = "memory"  # bytes
MEMORY_SLICE_COUNTER = "memory-slice-{}"  # the driver's per-memory-slice counters (partitions.go memsliceCounterName)

_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")  # the driver's canonicalMigNameRegex (mig.go)
_GPU_NAME = re.compile(r"^gpu-(\d+)$")
_SHARED_NAME = re.compile(r"^gpu-(\d+)-shared$")

Object = Mapping[str, Any]  # an API object as JSON decodes it


@dataclass(frozen=True)
class DraMig:
    """A MIG device of a GPU: the instance at memory slices [start, start + size)."""

    device: str
    profile: str  # catalog spelling (1g.10gb+me for the driver's 1g.10gb+me)
    start: int
    size: int
    partition: bool  # consumes the parent's counters (dynamic MIG) rather than being an existing instance

    @property
    def placement(self) -> MigPlacement:
        return MigPlacement(self.profile, self.start, self.size)


@dataclass(frozen=True)
class DraGpu:
    """One physical GPU of a node as its ResourceSlices publish it."""

    index: int  # the GPU minor (gpu-<minor>)
    uuid: str
    product: str  # productName as published ("NVIDIA A100-SXM4-80GB")
    device: str = ""  # the whole-GPU device; "" when not published (a GPU in static MIG mode)
    memory_bytes: int = 0
    pcie_root: str = ""
    migs: tuple[DraMig, ...] = ()
    shared_device: str = ""  # the gpu-<minor>-shared device, if published
    share_capacity: int = 0  # its `share` capacity (thousandths)

    @property
    def static_mig(self) -> bool:
        """MIG instances that exist whatever is allocated (the driver's static MIG mode)."""
        return bool(self.migs) and not any(m.partition for m in self.migs)


@dataclass(frozen=True)
class DraNode:
    """The GPUs a node's pool of `driver` publishes, in minor order. `incomplete`: the pool's newest generation is
    not all there (kube-scheduler allocates nothing from it meanwhile)."""

    name: str
    driver: str
    gpus: tuple[DraGpu, ...]
    model: GpuModel | None
    incomplete: bool = False
    devices: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # device -> (type, GPU position in gpus)

    def gpu_of(self, device: str) -> DraGpu | None:
        where = self.devices.get(device)
        return self.gpus[where[1]] if where else None


@dataclass(frozen=True)
class Allocated:
    """One device result of a claim's allocation."""

    claim: str  # namespace/name
    request: str
    driver: str
    pool: str
    device: str
    share_id: str = ""  # set for a share of a device that allows multiple allocations
    consumed: Mapping[str, int] = field(default_factory=dict)  # consumedCapacity, in the quantity's integer value
    reserved_for: tuple[str, ...] = ()  # names of the consumers (pods) the claim is reserved for


@dataclass(frozen=True)
class GpuUsage:
    """What one GPU has given out to allocated claims."""

    whole: bool = False
    migs: tuple[MigPlacement, ...] = ()
    share_milli: int = 0
    claims: tuple[str, ...] = ()


def _int_quantity(value: Any, what: str) -> int:
    """A non-negative quantity's Value() (rounded up, as resource.Quantity.Value() does)."""
    return -(-_amount(value, what) // 10**9)


def _attribute(device: Mapping[str, Any], name: str, driver: str) -> Any:
    """An attribute's value, by its short name (the driver's domain) or its qualified name."""
    attrs = _map(device.get("attributes"), "device attributes")
    raw = attrs.get(name)
    if raw is None and "/" not in name:
        raw = attrs.get(f"{driver}/{name}")
    if not isinstance(raw, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            return raw[kind]
    return None


def _capacity(device: Mapping[str, Any], name: str, what: str) -> int:
    cap = _map(_map(device.get("capacity"), f"{what}: capacity").get(name), f"{what}: capacity {name}")
    return _int_quantity(cap["value"], f"{what}: capacity {name}") if "value" in cap else 0


def _catalog_profile(model: GpuModel | None, profile: str) -> tuple[str, int] | None:
    """(catalog profile name, memory slices) of a published profile name, None if the catalog does not know it."""
    if model is None or not model.mig_capable:
        return None
    try:
        p = model.mig_profile(profile)
    except MigLayoutError:
        return None
    return p.name, p.memory_slices


def _product_model(product: str) -> GpuModel | None:
    # NVML names ("NVIDIA A100-SXM4-80GB") are the GFD label with blanks for dashes.
    return model_by_product("-".join(product.split())) if product else None


def pool_slices(slices: Iterable[Object], driver: str = DRIVER) -> dict[str, tuple[list[Object], bool]]:
    """The slices of `driver` by pool name, each pool's newest generation only, with whether that generation is
    incomplete (fewer slices than its resourceSliceCount)."""
    by_pool: dict[str, list[Object]] = {}
    for s in slices:
        spec = _map(s.get("spec"), "ResourceSlice spec")
        if spec.get("driver") != driver:
            continue
        pool = _map(spec.get("pool"), "ResourceSlice spec.pool")
        by_pool.setdefault(str(pool.get("name", "")), []).append(s)
    out: dict[str, tuple[list[Object], bool]] = {}
    for name, group in by_pool.items():
        newest = max(_pool_int(s, "generation", 0) for s in group)
        current = [s for s in group if _pool_int(s, "generation", 0) == newest]
        want = max(_pool_int(s, "resourceSliceCount", 1) for s in current)
        out[name] = (current, len(current) < want)
    return out


def _pool_int(slice_: Mapping[str, Any], key: str, default: int) -> int:
    value = slice_["spec"]["pool"].get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ObjectError(f"ResourceSlice {slice_.get('metadata', {}).get('name', '?')}: spec.pool.{key} "
                          f"must be an integer, got {type(value).__name__}")
    return value


def dra_node(name: str, slices: Iterable[Mapping[str, Any]], driver: str = DRIVER) -> DraNode:
    """The GPUs that the slices of `driver` whose pool is named `name` (the node: the driver names its pool after
    the node) publish. Raises ObjectError for slices that cannot be read (a device name used twice, a MIG device
    whose parent is not known, more GPUs than gpuaas models)."""
    where = f"node {name}: ResourceSlices of {driver}"
    pools = pool_slices(slices, driver)
    if name not in pools:
        return DraNode(name, driver, (), None)
    current, incomplete = pools[name]
    devices: list[Mapping[str, Any]] = []
    partitions: set[str] = set()
    for s in current:
        for d in _list(s["spec"].get("devices"), f"{where}: devices"):
            device = _map(d, f"{where}: device")
            devices.append(device)
            if device.get("consumesCounters"):
                partitions.add(str(device.get("name")))
    gpus: dict[int, dict[str, Any]] = {}
    by_uuid: dict[str, int] = {}
    migs: list[tuple[Mapping[str, Any], str]] = []
    shared: list[tuple[int, Mapping[str, Any]]] = []
    seen: set[str] = set()
    for device in devices:
        dname = device.get("name")
        if not isinstance(dname, str) or not dname:
            raise ObjectError(f"{where}: a device without a name")
        if dname in seen:
            raise ObjectError(f"{where}: device {dname} is published twice")
        seen.add(dname)
        kind = _attribute(device, "type", driver)
        if kind == TYPE_GPU:
            m = _GPU_NAME.match(dname)
            index = int(m.group(1)) if m else len(gpus)
            uuid = str(_attribute(device, "uuid", driver) or "")
            gpus[index] = {"index": index, "uuid": uuid,
                           "product": str(_attribute(device, "productName", driver) or ""), "device": dname,
                           "memory_bytes": _capacity(device, MEMORY_CAPACITY, f"{where}: {dname}"),
                           "pcie_root": str(_attribute(device, PCIE_ROOT_ATTRIBUTE, driver) or "")}
            if uuid:
                by_uuid[uuid] = index
        elif kind == TYPE_MIG:
            migs.append((device, dname))
        elif kind == TYPE_SHARED:
            m = _SHARED_NAME.match(dname)
            if m is None:
                raise ObjectError(f"{where}: shared device {dname} is not named gpu-<minor>-shared")
            shared.append((int(m.group(1)), device))
    mig_parts: dict[int, list[DraMig]] = {}
    for device, dname in migs:
        parent_uuid = str(_attribute(device, "parentUUID", driver) or "")
        m = _MIG_NAME.match(dname)
        index = by_uuid.get(parent_uuid, int(m.group(1)) if m else -1)
        if index < 0:
            raise ObjectError(f"{where}: MIG device {dname} names no GPU of the node (parentUUID {parent_uuid!r})")
        if index not in gpus:  # static MIG: the parent GPU itself is not published
            gpus[index] = {"index": index, "uuid": parent_uuid,
                           "product": str(_attribute(device, "productName", driver) or ""),
                           "pcie_root": str(_attribute(device, PCIE_ROOT_ATTRIBUTE, driver) or "")}
            if parent_uuid:
                by_uuid[parent_uuid] = index
        published = str(_attribute(device, "profile", driver) or "")
        known = _catalog_profile(_product_model(gpus[index]["product"]), published)
        profile, size = known if known else (published, 0)
        start = _mig_start(device, m)
        mig_parts.setdefault(index, []).append(DraMig(dname, profile, start, size, dname in partitions))
    for index, device in shared:
        if index not in gpus:
            raise ObjectError(f"{where}: shared device gpu-{index}-shared has no GPU gpu-{index}")
        gpus[index]["shared_device"] = device["name"]
        gpus[index]["share_capacity"] = _capacity(device, SHARE_CAPACITY, f"{where}: {device['name']}")
    if len(gpus) > MAX_GPUS_PER_NODE:
        raise ObjectError(f"{where}: {len(gpus)} GPUs, more than the {MAX_GPUS_PER_NODE} per node gpuaas models")
    ordered = []
    positions: dict[str, tuple[str, int]] = {}
    for pos, index in enumerate(sorted(gpus)):
        g = gpus[index]
        parts = tuple(sorted(mig_parts.get(index, ()), key=lambda p: (p.start, p.size, p.device)))
        gpu = DraGpu(migs=parts, **g)
        ordered.append(gpu)
        if gpu.device:
            positions[gpu.device] = (TYPE_GPU, pos)
        for p in parts:
            positions[p.device] = (TYPE_MIG, pos)
        if gpu.shared_device:
            positions[gpu.shared_device] = (TYPE_SHARED, pos)
    products = {g.product for g in ordered if g.product}
    if len(products) > 1:
        raise ObjectError(f"{where}: GPUs of several models ({', '.join(sorted(products))}); gpuaas models one "
                          "per node")
    model = _product_model(next(iter(products))) if products else None
    if products and model is None:
        raise ObjectError(f"{where}: GPU model {next(iter(products))!r} is not in gpuaas's catalog")
    return DraNode(name, driver, tuple(ordered), model, incomplete, positions)


def _mig_start(device: Mapping[str, Any], name_match: re.Match[str] | None) -> int:
    """The first memory slice of a MIG device: from the counters it consumes, else from its name, else -1."""
    slices = []
    for consumption in _list(device.get("consumesCounters"), "consumesCounters"):
        for counter in _map(_map(consumption, "consumesCounters entry").get("counters"), "counters"):
            if counter.startswith("memory-slice-") and counter[len("memory-slice-"):].isdigit():
                slices.append(int(counter[len("memory-slice-"):]))
    if slices:
        return min(slices)
    return int(name_match.group(4)) if name_match else -1


def dra_node_spec(node: Mapping[str, Any], slices: Iterable[Mapping[str, Any]], driver: str = DRIVER,
                  usage: Mapping[str, GpuUsage] | None = None) -> NodeSpec:
    """The model of a node whose GPUs come from DRA: CPU, memory, pool and the GPU topology annotation as
    scoring.kubeobjects.node_spec reads them, the GPUs from the slices. A GPU in static MIG mode has its published
    instances as its MIG layout; a partitionable GPU has the partitions allocated now (`usage`, by device) as its
    layout, none while nothing is allocated on it (it is a whole GPU until a MIG claim partitions it). An incomplete
    pool reads as no GPUs, as kube-scheduler allocates nothing from it."""
    base = node_spec(node)
    return dra_spec_of(node, base, dra_node(base.name, slices, driver), usage)


def dra_spec_of(node: Mapping[str, Any], base: NodeSpec, dra: DraNode,
                usage: Mapping[str, GpuUsage] | None = None) -> NodeSpec:
    """dra_node_spec on what is read already: `base`, the Node as scoring.kubeobjects.node_spec reads it, and `dra`,
    its pool (scoring.dra.dra_node, e.g. kept by scoring.draview from the informer's slices)."""
    if not dra.gpus or dra.incomplete or dra.model is None:
        return base
    layouts: list[dict[str, int] | None] = []
    for gpu in dra.gpus:
        counts: dict[str, int] = {}
        for m in gpu.migs:
            if not m.partition or (usage is not None and m.device in usage):
                counts[m.profile] = counts.get(m.profile, 0) + 1
        layouts.append(counts or None)
    meta = _map(node.get("metadata"), "node metadata")
    blocks = _blocks(_map(meta.get("annotations"), "node annotations"), len(dra.gpus), f"node {base.name}")
    if blocks is None and any(g.pcie_root for g in dra.gpus):
        roots = {r: i for i, r in enumerate(dict.fromkeys(g.pcie_root for g in dra.gpus))}
        blocks = tuple(roots[g.pcie_root] for g in dra.gpus)
    return dataclasses.replace(base, gpus=len(dra.gpus), gpu_model=dra.model.name, gpu_blocks=blocks,
                               mig_layouts=tuple(layouts) if any(layouts) else None, dra=True)


def claim_key(claim: Mapping[str, Any]) -> str:
    meta = _map(claim.get("metadata"), "ResourceClaim metadata")
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def allocated_devices(claim: Mapping[str, Any]) -> list[Allocated]:
    """The devices a claim's allocation holds (none when it is not allocated). Results with adminAccess are left out:
    kube-scheduler does not count them as allocated (plugins/dynamicresources/allocateddevices.go)."""
    key = claim_key(claim)
    status = _map(claim.get("status"), f"ResourceClaim {key}: status")
    allocation = status.get("allocation")
    if not allocation:
        return []
    where = f"ResourceClaim {key}: status.allocation"
    consumers = tuple(str(_map(r, f"{key}: reservedFor").get("name", ""))
                      for r in _list(status.get("reservedFor"), f"ResourceClaim {key}: status.reservedFor"))
    out = []
    for r in _list(_map(_map(allocation, where).get("devices"), f"{where}.devices").get("results"),
                   f"{where}.devices.results"):
        result = _map(r, f"{where}.devices.results[]")
        if result.get("adminAccess"):
            continue
        consumed = {str(k): _int_quantity(v, f"{where}: consumedCapacity {k}")
                    for k, v in _map(result.get("consumedCapacity"), f"{where}: consumedCapacity").items()}
        out.append(Allocated(key, str(result.get("request", "")), str(result.get("driver", "")),
                             str(result.get("pool", "")), str(result.get("device", "")),
                             str(result.get("shareID") or ""), consumed, consumers))
    return out


def devices_in_use(claims: Iterable[Mapping[str, Any]],
                   driver: str = DRIVER) -> dict[str, dict[str, list[Allocated]]]:
    """pool -> device -> the allocations holding it, over every allocated claim of `driver`, whoever allocated it."""
    return by_device((a for claim in claims for a in allocated_devices(claim)), driver)


def by_device(allocated: Iterable[Allocated], driver: str = DRIVER) -> dict[str, dict[str, list[Allocated]]]:
    """devices_in_use on claims' allocations read already (allocated_devices)."""
    out: dict[str, dict[str, list[Allocated]]] = {}
    for a in allocated:
        if a.driver == driver:
            out.setdefault(a.pool, {}).setdefault(a.device, []).append(a)
    return out


def gpu_usage(node: DraNode, in_use: Mapping[str, Mapping[str, list[Allocated]]]) -> dict[str, GpuUsage]:
    """By device name of `node`, what allocated claims hold of it: the whole device (a GPU or a MIG device) or the
    thousandths of a shared device (the sum of the shares' consumed `share`). Devices the node does not publish
    (stale allocations) are left out."""
    out: dict[str, GpuUsage] = {}
    for device, allocations in in_use.get(node.name, {}).items():
        where = node.devices.get(device)
        if where is None:
            continue
        kind, pos = where
        gpu = node.gpus[pos]
        claims = tuple(a.claim for a in allocations)
        if kind == TYPE_SHARED:
            held = sum(a.consumed.get(SHARE_CAPACITY, gpu.share_capacity) for a in allocations)
            out[device] = GpuUsage(share_milli=held * MILLI // max(gpu.share_capacity, 1), claims=claims)
        elif kind == TYPE_MIG:
            mig = next(m for m in gpu.migs if m.device == device)
            out[device] = GpuUsage(migs=(mig.placement,), claims=claims)
        else:
            out[device] = GpuUsage(whole=True, claims=claims)
    return out


def gpus_in_use(node: DraNode, usage: Mapping[str, GpuUsage]) -> tuple[GpuUsage, ...]:
    """gpu_usage folded per GPU (in node.gpus order)."""
    per: list[GpuUsage] = [GpuUsage() for _ in node.gpus]
    for device, use in usage.items():
        where = node.devices.get(device)
        if where is None:
            continue
        pos = where[1]
        cur = per[pos]
        per[pos] = GpuUsage(cur.whole or use.whole, cur.migs + use.migs, cur.share_milli + use.share_milli,
                            cur.claims + use.claims)
    return tuple(per)

"""What a pod asks for through DRA ResourceClaims, and the allocations gpuaas writes for them (docs/devices.md, "DRA
mode"). Pure: plain dicts in, plain dicts out, no clock (timestamps and share IDs are passed in).

A pod names its claims in `spec.resourceClaims`: a ResourceClaim by name (`resourceClaimName`), or a
ResourceClaimTemplate (`resourceClaimTemplateName`) from which kube-controller-manager generates the pod's own claim
(named in `status.resourceClaimStatuses`). A claim's requests (`spec.devices.requests[].exactly`) that use one of the
DeviceClasses gpuaas allocates are read into the model's demand:

  deviceClassName       what it asks                     PodDemand
  gpu.nvidia.com        count N whole GPUs (default 1)   gpus=N (same PCIe root with a matchAttribute constraint on
                                                         resource.kubernetes.io/pcieRoot)
  mig.nvidia.com        one MIG device of a profile:     gpus=1, mig_profile
                        selector device.attributes["gpu.nvidia.com"].profile == "3g.40gb"
  gpu-share.gpuaas.io   a share of one GPU:              gpus=1, gpu_milli=share (thousandths; 1000 when not asked)
                        capacity.requests.share: 250

plus, on any of them, a selector `device.attributes["gpu.nvidia.com"].productName == "<NVML name>"` (the GPU models
the pod accepts). What the model cannot hold is refused with `UnsupportedClaim`, naming the field: several kinds of GPU
in one pod (as for extended resources), more than one MIG device or share, prioritized lists (`firstAvailable`),
allocationMode All, adminAccess, other selectors, capacity other than `share`, constraints other than matchAttribute
on the PCIe root, a claim mixing gpuaas's classes with other drivers' classes. Claims whose requests use only other
classes are not gpuaas's: kube-scheduler allocates them.

`allocation` builds a claim's `status.allocation` for devices chosen on a node: the results (request, driver, pool,
device; a share's shareID and consumedCapacity, every capacity of the device, rounded up by its requestPolicy as the
allocator does), the claim's opaque configuration, a node selector on metadata.name, and allocationTimestamp (which
kube-scheduler otherwise adds in PreBind, and the apiserver refuses, the allocation being immutable).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from scoring.dra import (
    DRIVER,
    GPU_CLASS,
    MIG_CLASS,
    PCIE_ROOT_ATTRIBUTE,
    SHARE_CAPACITY,
    SHARE_CLASS,
    Allocated,
    allocated_devices,
    claim_key,
)
from scoring.gpus import model_by_product
from scoring.kubeobjects import (
    ObjectError,
    UnsupportedDemand,
    _amount,
    _list,
    _map,
    _shown,
    _str,
    pod_demand,
    pod_key,
)
from scoring.model import MILLI, PodDemand

Kind = Literal["gpu", "mig", "share"]
MANAGED_CLASSES: Mapping[str, Kind] = {GPU_CLASS: "gpu", MIG_CLASS: "mig", SHARE_CLASS: "share"}
ALLOCATED_FOR_ANNOTATION = "gpuaas.io/allocated-for"  # on a claim gpuaas allocated: the uid of the pod it was for
MAX_REQUESTS = 32  # k8s.io/api/resource/v1 DeviceRequestsMaxSize
_NANO = 10**9
# device.attributes["gpu.nvidia.com"].<attribute> == "<value>" (either quote), what the NVIDIA driver's examples write.
_SELECTOR = re.compile(r"""\s*device\s*\.\s*attributes\s*\[\s*(['"])([^'"]+)\1\s*\]\s*\.\s*([A-Za-z][A-Za-z0-9]*)"""
                       r"""\s*==\s*(['"])([^'"]*)\4\s*""")


class UnsupportedClaim(UnsupportedDemand):
    """A claim (or a pod's set of claims) asking for something gpuaas does not allocate; the message names it."""


@dataclass(frozen=True)
class DeviceRequest:
    """One request of a claim for a class gpuaas allocates."""

    name: str
    kind: Kind
    count: int = 1  # whole GPUs; 1 for a MIG device or a share
    profile: str = ""  # mig: the profile (as published: 3g.40gb, 1g.10gb+me)
    share: int = MILLI  # share: the `share` capacity asked (thousandths of the GPU)
    models: frozenset[str] = frozenset()  # catalog names a productName selector allows; empty = any


@dataclass(frozen=True)
class ClaimDemand:
    """What one claim asks gpuaas for."""

    requests: tuple[DeviceRequest, ...]
    same_root: frozenset[str] = frozenset()  # names of whole-GPU requests whose devices must share a PCIe root
    config: tuple[Mapping[str, Any], ...] = ()  # spec.devices.config, copied into the allocation (FromClaim)

    @property
    def kinds(self) -> set[Kind]:
        return {r.kind for r in self.requests}


def _selector(expression: str, kind: Kind, where: str) -> tuple[str, str]:
    """(attribute, value) of a selector gpuaas reads; UnsupportedClaim otherwise."""
    m = _SELECTOR.fullmatch(expression)
    readable = {"mig": "profile or productName", "gpu": "productName", "share": "productName"}[kind]
    if m is None or m.group(2) != DRIVER or m.group(3) not in ("profile", "productName") or \
            (m.group(3) == "profile" and kind != "mig"):
        raise UnsupportedClaim(f"{where}: selector {_shown(expression)} is not one gpuaas reads: on this class it "
                               f"reads only device.attributes[\"{DRIVER}\"].<{readable}> == \"<value>\"")
    return m.group(3), m.group(5)


def _catalog_model(product: str, where: str) -> str:
    model = model_by_product("-".join(product.split()))  # NVML names are GFD's product labels with blanks for dashes
    if model is None:
        raise UnsupportedClaim(f"{where}: productName {product!r} is not a GPU model gpuaas knows")
    return model.name


def _positive_int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ObjectError(f"{what}: must be a positive integer, got {_shown(value)}")
    return value


def _request(raw: Any, where: str) -> DeviceRequest | str:
    """A request of a class gpuaas allocates, or the class name of another driver's request."""
    req = _map(raw, f"{where}: request")
    name = _str(req.get("name"), f"{where}: request name")
    at = f"{where}: request {name}"
    if req.get("firstAvailable") is not None:
        raise UnsupportedClaim(f"{at}: firstAvailable (a prioritized list) is not allocated by gpuaas; ask for one "
                               "device class with `exactly`")
    exactly = _map(req.get("exactly"), f"{at}: exactly")
    cls = _str(exactly.get("deviceClassName"), f"{at}: exactly.deviceClassName")
    kind = MANAGED_CLASSES.get(cls)
    if kind is None:
        return cls
    mode = exactly.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise UnsupportedClaim(f"{at}: allocationMode {_shown(mode)}: gpuaas allocates an exact count of devices")
    if exactly.get("adminAccess"):
        raise UnsupportedClaim(f"{at}: adminAccess is not allocated by gpuaas")
    count = _positive_int(exactly.get("count", 1), f"{at}: exactly.count")
    profile, models = "", set[str]()
    for i, s in enumerate(_list(exactly.get("selectors"), f"{at}: exactly.selectors")):
        cel = _map(_map(s, f"{at}: selectors[{i}]").get("cel"), f"{at}: selectors[{i}].cel")
        attribute, value = _selector(_str(cel.get("expression"), f"{at}: selectors[{i}].cel.expression"), kind,
                                     f"{at}: selectors[{i}]")
        if attribute == "profile":
            if profile and profile != value:
                raise UnsupportedClaim(f"{at}: selectors ask for profiles {profile} and {value} at once")
            profile = value
        else:
            found = {_catalog_model(value, f"{at}: selectors[{i}]")}
            models = found if not models else models & found
            if not models:
                raise UnsupportedClaim(f"{at}: its productName selectors exclude each other")
    share = MILLI
    for cap, value in _map(_map(exactly.get("capacity"), f"{at}: exactly.capacity").get("requests"),
                           f"{at}: exactly.capacity.requests").items():
        if kind != "share" or cap != SHARE_CAPACITY:
            raise UnsupportedClaim(f"{at}: capacity request {cap!r}: gpuaas reads only {SHARE_CAPACITY!r} (thousandths "
                                   f"of a GPU) on {SHARE_CLASS}")
        nanos = _amount(value, f"{at}: capacity.requests.{cap}")
        if nanos % _NANO or not 1 <= nanos // _NANO <= MILLI:
            raise UnsupportedClaim(f"{at}: capacity.requests.share {_shown(value)} must be a whole number of "
                                   f"thousandths of a GPU, 1..{MILLI}")
        share = nanos // _NANO
    if kind == "mig":
        if not profile:
            raise UnsupportedClaim(f"{at}: a {MIG_CLASS} request needs a selector naming the profile "
                                   f"(device.attributes[\"{DRIVER}\"].profile == \"3g.40gb\")")
        if count != 1:
            raise UnsupportedClaim(f"{at}: {count} MIG devices: gpuaas places one MIG device per pod")
    if kind == "share" and count != 1:
        raise UnsupportedClaim(f"{at}: {count} shares: gpuaas places one GPU share per pod")
    return DeviceRequest(name, kind, count, profile, share if kind == "share" else MILLI, frozenset(models))


def claim_demand(spec: Mapping[str, Any], where: str) -> ClaimDemand | None:
    """What a claim's spec (a ResourceClaim's `spec`, a template's `spec.spec`) asks gpuaas for; None when no request
    uses a class gpuaas allocates. Raises UnsupportedClaim (or ObjectError) naming the field."""
    devices = _map(_map(spec, f"{where}: spec").get("devices"), f"{where}: spec.devices")
    raw = _list(devices.get("requests"), f"{where}: spec.devices.requests")
    if len(raw) > MAX_REQUESTS:
        raise ObjectError(f"{where}: {len(raw)} requests, more than the {MAX_REQUESTS} a claim may have")
    ours: list[DeviceRequest] = []
    other: list[str] = []
    for r in raw:
        got = _request(r, where)
        if isinstance(got, str):
            other.append(got)
        else:
            ours.append(got)
    if not ours:
        return None
    if other:
        raise UnsupportedClaim(f"{where}: mixes gpuaas's device classes with {', '.join(sorted(set(other)))}; put "
                               "the other driver's requests in a claim of their own")
    names = {r.name for r in ours}
    same_root: set[str] = set()
    for i, c in enumerate(_list(devices.get("constraints"), f"{where}: spec.devices.constraints")):
        c = _map(c, f"{where}: constraints[{i}]")
        if c.get("distinctAttribute"):
            raise UnsupportedClaim(f"{where}: constraints[{i}]: distinctAttribute is not supported by gpuaas")
        attribute = _str(c.get("matchAttribute"), f"{where}: constraints[{i}].matchAttribute")
        if attribute != PCIE_ROOT_ATTRIBUTE:
            raise UnsupportedClaim(f"{where}: constraints[{i}]: matchAttribute {_shown(attribute)}: gpuaas places "
                                   f"devices by {PCIE_ROOT_ATTRIBUTE} only")
        applies = [_str(n, f"{where}: constraints[{i}].requests") for n in
                   _list(c.get("requests"), f"{where}: constraints[{i}].requests")] or sorted(names)
        whole = [n for n in applies if any(r.name == n and r.kind == "gpu" for r in ours)]
        if len(applies) > 1 and len(whole) != len(applies):
            raise UnsupportedClaim(f"{where}: constraints[{i}]: a PCIe-root constraint across requests of different "
                                   "kinds is not supported by gpuaas")
        same_root.update(whole)
    config = []
    for i, c in enumerate(_list(devices.get("config"), f"{where}: spec.devices.config")):
        c = _map(c, f"{where}: config[{i}]")
        entry: dict[str, Any] = {"source": "FromClaim", "opaque": c.get("opaque")}
        if c.get("requests"):
            entry["requests"] = c["requests"]
        config.append(entry)
    return ClaimDemand(tuple(ours), frozenset(same_root), tuple(config))


# -- a pod's claims ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PodClaim:
    """One entry of a pod's spec.resourceClaims that uses gpuaas's classes."""

    entry: str  # the name the pod gives it
    claim: str  # namespace/name of the ResourceClaim
    uid: str
    demand: ClaimDemand
    allocated: tuple[Allocated, ...] = ()  # its allocation's devices (none while not allocated)
    node: str = ""  # the node it is allocated on ("" while not allocated)
    by_gpuaas: str = ""  # the pod uid gpuaas allocated it for (ALLOCATED_FOR_ANNOTATION), "" otherwise
    allocated_at: str = ""  # status.allocation.allocationTimestamp
    reserved: bool = False  # status.reservedFor names a consumer


@dataclass(frozen=True)
class PodDra:
    """A pod's claims as gpuaas sees them."""

    claims: tuple[PodClaim, ...] = ()  # entries using gpuaas's classes, claims that exist
    missing: tuple[str, ...] = ()  # entries whose claim does not exist (yet): "entry: why"
    other: tuple[str, ...] = ()  # entries for other drivers' classes (kube-scheduler allocates them)
    demand: PodDemand = field(default_factory=PodDemand)  # CPU and memory, and the GPUs of the claims not allocated
    node: str = ""  # the node the allocated claims hold it to ("" when none is allocated)

    @property
    def ours(self) -> bool:
        """Some entry uses gpuaas's classes (or may: a claim not seen yet)."""
        return bool(self.claims or self.missing)

    @property
    def unallocated(self) -> tuple[PodClaim, ...]:
        return tuple(c for c in self.claims if not c.node)


def _claim_node(claim: Mapping[str, Any], allocated: Sequence[Allocated], where: str) -> str:
    """The node an allocated claim is for: its node selector's metadata.name, else the pool of its results (the
    driver names its pool after the node)."""
    allocation = _map(_map(claim.get("status"), f"{where}: status").get("allocation"), f"{where}: allocation")
    for term in _list(_map(allocation.get("nodeSelector"), f"{where}: nodeSelector").get("nodeSelectorTerms"),
                      f"{where}: nodeSelectorTerms"):
        for f in _list(_map(term, f"{where}: nodeSelectorTerms[]").get("matchFields"), f"{where}: matchFields"):
            f = _map(f, f"{where}: matchFields[]")
            values = _list(f.get("values"), f"{where}: matchFields values")
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    pools = {a.pool for a in allocated if a.driver == DRIVER}
    if len(pools) > 1:
        raise ObjectError(f"{where}: allocated on several nodes ({', '.join(sorted(pools))})")
    return next(iter(pools), "")


def read_claim(claim: Mapping[str, Any], entry: str = "") -> PodClaim | None:
    """A ResourceClaim as gpuaas sees it; None when it asks nothing of gpuaas's classes."""
    key = claim_key(claim)
    where = f"ResourceClaim {key}"
    demand = claim_demand(_map(claim.get("spec"), f"{where}: spec"), where)
    if demand is None:
        return None
    meta = _map(claim.get("metadata"), f"{where}: metadata")
    status = _map(claim.get("status"), f"{where}: status")
    allocated = tuple(allocated_devices(claim))
    allocation = _map(status.get("allocation"), f"{where}: allocation")
    node = _claim_node(claim, allocated, where) if allocation else ""
    if allocation and not node:
        node = "?"  # allocated without a node (a network device?): never this pod's to place
    by = _str(_map(meta.get("annotations"), f"{where}: annotations").get(ALLOCATED_FOR_ANNOTATION),
              f"{where}: annotation {ALLOCATED_FOR_ANNOTATION}")
    return PodClaim(entry, key, _str(meta.get("uid"), f"{where}: uid"), demand, allocated, node, by,
                    _str(allocation.get("allocationTimestamp"), f"{where}: allocationTimestamp"),
                    bool(_list(status.get("reservedFor"), f"{where}: reservedFor")))


def pod_claim_names(pod: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(entry, claim name or "", template name or "") per spec.resourceClaims entry; a template's generated claim
    is read from status.resourceClaimStatuses ("" until kube-controller-manager has made it)."""
    where = f"pod {pod_key(pod)}"
    spec = _map(pod.get("spec"), f"{where}: spec")
    generated = {}
    for s in _list(_map(pod.get("status"), f"{where}: status").get("resourceClaimStatuses"),
                   f"{where}: status.resourceClaimStatuses"):
        s = _map(s, f"{where}: resourceClaimStatuses[]")
        generated[_str(s.get("name"), f"{where}: resourceClaimStatuses[].name")] = \
            _str(s.get("resourceClaimName"), f"{where}: resourceClaimStatuses[].resourceClaimName")
    out = []
    for e in _list(spec.get("resourceClaims"), f"{where}: spec.resourceClaims"):
        e = _map(e, f"{where}: spec.resourceClaims[]")
        entry = _str(e.get("name"), f"{where}: spec.resourceClaims[].name")
        named = _str(e.get("resourceClaimName"), f"{where}: resourceClaims {entry}.resourceClaimName")
        template = _str(e.get("resourceClaimTemplateName"),
                        f"{where}: resourceClaims {entry}.resourceClaimTemplateName")
        out.append((entry, named or generated.get(entry, ""), template))
    return out


def has_claims(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("resourceClaims"))


def pod_dra(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]],
            templates: Mapping[str, Mapping[str, Any]] | None = None) -> PodDra | None:
    """The pod's claims (`claims`, `templates`: the objects by namespace/name) as gpuaas sees them, None for a pod
    without spec.resourceClaims. Its demand: CPU and memory as pod_demand reads them, and the GPUs of its claims not
    allocated yet, one kind per pod (a template's spec counts for a claim not generated yet). Raises UnsupportedClaim
    or ObjectError naming what is wrong."""
    if not has_claims(pod):
        return None
    where = f"pod {pod_key(pod)}"
    ns = (pod.get("metadata") or {}).get("namespace") or "default"
    base = pod_demand(pod)
    if base.gpus:
        raise UnsupportedClaim(f"{where}: asks for GPUs both as extended resources and through ResourceClaims; "
                               "gpuaas places one kind per pod")
    ours: list[PodClaim] = []
    missing: list[str] = []
    other: list[str] = []
    pending: list[ClaimDemand] = []  # demands to place: unallocated claims, and templates' not generated yet
    for entry, name, template in pod_claim_names(pod):
        obj = claims.get(f"{ns}/{name}") if name else None
        if obj is not None:
            got = read_claim(obj, entry)
            if got is None:
                other.append(entry)
                continue
            ours.append(got)
            if not got.node:
                pending.append(got.demand)
            continue
        source = (templates or {}).get(f"{ns}/{template}") if template else None
        if source is not None:
            spec = _map(_map(source.get("spec"), f"ResourceClaimTemplate {ns}/{template}: spec").get("spec"),
                        f"ResourceClaimTemplate {ns}/{template}: spec.spec")
            demand = claim_demand(spec, f"ResourceClaimTemplate {ns}/{template}")
            if demand is None:
                other.append(entry)
                continue
            pending.append(demand)
        if name:
            missing.append(f"{entry}: ResourceClaim {ns}/{name} not found")
        elif template:
            missing.append(f"{entry}: the claim of template {template} is not generated yet")
        else:
            raise ObjectError(f"{where}: resourceClaims entry {entry} names neither a claim nor a template")
    nodes = {c.node for c in ours if c.node}
    if len(nodes) > 1:
        raise ObjectError(f"{where}: its claims are allocated on different nodes ({', '.join(sorted(nodes))})")
    return PodDra(tuple(ours), tuple(missing), tuple(other), combined_demand(base, pending, where),
                  next(iter(nodes), ""))


def combined_demand(base: PodDemand, demands: Sequence[ClaimDemand], where: str) -> PodDemand:
    """`base` (CPU and memory) with the GPUs the claims ask for, as one PodDemand (one kind per pod)."""
    requests = [r for d in demands for r in d.requests]
    if not requests:
        return base
    kinds = sorted({r.kind for r in requests})
    if len(kinds) > 1:
        raise UnsupportedClaim(f"{where}: asks for GPUs of more than one kind through its claims ({', '.join(kinds)});"
                               " gpuaas places one kind per pod")
    models = set(base.allowed_models) if base.allowed_models else None
    for r in requests:
        if r.models:
            models = set(r.models) if models is None else models & r.models
    allowed = frozenset(models) if models else \
        frozenset({"(no model satisfies the pod's constraints)"}) if models is not None else frozenset()
    kind = kinds[0]
    if kind == "gpu":
        rooted = [d for d in demands if d.same_root]
        with_gpus = [d for d in demands if any(r.kind == "gpu" for r in d.requests)]
        if rooted and len(with_gpus) > 1:
            raise UnsupportedClaim(f"{where}: a PCIe-root constraint is supported when the pod's whole GPUs come from "
                                   "one claim")
        return dataclasses.replace(base, gpus=sum(r.count for r in requests), gpu_milli=MILLI,
                                   allowed_models=allowed, claims=True)
    if len(requests) > 1:
        what = "MIG devices" if kind == "mig" else "GPU shares"
        raise UnsupportedClaim(f"{where}: asks for {len(requests)} {what}; gpuaas places one per pod")
    r = requests[0]
    if kind == "mig":
        return dataclasses.replace(base, gpus=1, gpu_milli=MILLI, mig_profile=r.profile, allowed_models=allowed,
                                   claims=True)
    return dataclasses.replace(base, gpus=1, gpu_milli=r.share, whole_share=r.share == MILLI, allowed_models=allowed,
                               claims=True)


def same_root_count(dra: PodDra) -> int:
    """Whole GPUs of the pod's unallocated claims that must share one PCIe root (0: no such constraint)."""
    return sum(r.count for c in dra.unallocated for r in c.demand.requests if r.name in c.demand.same_root)


# -- allocations -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceResult:
    """One device allocated to one request."""

    request: str
    device: str
    share_id: str = ""  # a share of a device that allows multiple allocations
    consumed: Mapping[str, int] = field(default_factory=dict)  # its consumedCapacity


def _quantity(text: Any, what: str) -> int:
    return -(-_amount(text, what) // _NANO)


def consumed_capacity(device: Mapping[str, Any], requests: Mapping[str, int]) -> dict[str, int]:
    """What a share of a device that allows multiple allocations consumes of each of its capacities, as the allocator
    computes it (resource/v1 CapacityRequestPolicy): a requested amount rounded up to a valid value (validValues: the
    smallest one at least as large; validRange: min plus whole steps), an unrequested one at the policy's default, or
    the whole capacity without a policy. Raises UnsupportedClaim when a request is above what the device allows."""
    name = device.get("name", "?")
    out = {}
    for cap, raw in _map(device.get("capacity"), f"device {name}: capacity").items():
        spec = _map(raw, f"device {name}: capacity {cap}")
        value = _quantity(spec.get("value", 0), f"device {name}: capacity {cap}")
        policy = _map(spec.get("requestPolicy"), f"device {name}: capacity {cap}.requestPolicy")
        asked = requests.get(cap)
        if asked is None:
            out[cap] = _quantity(policy["default"], f"{name}: {cap} default") if "default" in policy else value
            continue
        amount = asked
        valid = [_quantity(v, f"{name}: {cap} validValues") for v in _list(policy.get("validValues"), "validValues")]
        rng = _map(policy.get("validRange"), f"device {name}: capacity {cap}.validRange")
        if valid:
            fit = sorted(v for v in valid if v >= asked)
            if not fit:
                raise UnsupportedClaim(f"{cap} {asked} is more than device {name} offers ({max(valid)})")
            amount = fit[0]
        elif rng:
            low = _quantity(rng.get("min", 0), f"{name}: {cap} min")
            step = _quantity(rng["step"], f"{name}: {cap} step") if "step" in rng else 0
            amount = max(amount, low)
            if step:
                amount = low + -(-(amount - low) // step) * step
            if "max" in rng and amount > _quantity(rng["max"], f"{name}: {cap} max"):
                raise UnsupportedClaim(f"{cap} {asked} is more than device {name} offers")
        if amount > value:
            raise UnsupportedClaim(f"{cap} {asked} is more than device {name} has ({value})")
        out[cap] = amount
    return out


def node_selector(node: str) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def allocation(node: str, results: Sequence[DeviceResult], timestamp: str,
               config: Sequence[Mapping[str, Any]] = (), driver: str = DRIVER) -> dict[str, Any]:
    """A claim's status.allocation: `results` on `node`'s pool (the driver names its pool after the node), the
    claim's configuration, a node selector on metadata.name, and `timestamp` (RFC 3339, seconds) as
    allocationTimestamp."""
    out: list[dict[str, Any]] = []
    for r in results:
        entry: dict[str, Any] = {"request": r.request, "driver": driver, "pool": node, "device": r.device}
        if r.share_id:
            entry["shareID"] = r.share_id
            entry["consumedCapacity"] = {k: str(v) for k, v in r.consumed.items()}
        out.append(entry)
    devices: dict[str, Any] = {"results": out}
    if config:
        devices["config"] = [dict(c) for c in config]
    return {"devices": devices, "nodeSelector": node_selector(node), "allocationTimestamp": timestamp}

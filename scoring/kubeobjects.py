"""Kubernetes Node and Pod objects (plain dicts, as the API returns them) into the scoring model.

The one place in gpuaas that reads what GPU feature discovery, the NVIDIA device plugin and gpuaas itself publish:

Node
  labels       nvidia.com/gpu.product   GPU model (scoring.gpus catalog, by product label)
               nvidia.com/gpu.count     physical GPUs on the node
               nvidia.com/gpu.replicas  time-slicing replicas per GPU (1 = exclusive)
               gpuaas.io/pool           node group
  allocatable  nvidia.com/gpu           whole GPUs not in MIG mode (mixed strategy)
               nvidia.com/mig-<profile> MIG instances; the MIG-enabled GPUs are gpu.count minus whole GPUs, and the
                                        instances are spread over them as the MIG manager lays them out
  annotation   gpuaas.io/gpu-topology   {"nvlinkDomains": [[0,1,2,3],...], "numaNodes": [[...],...]}

Pod (requests of all containers, init containers as kube-scheduler counts them)
  nvidia.com/gpu: k              k whole GPUs
  nvidia.com/mig-<profile>: 1    one MIG instance
  gpuaas.io/gpu-share: m         m thousandths of one GPU (a shared GPU; an extended resource only gpuaas accounts)
  annotation gpuaas.io/gpu-models: "A100-80GB,H100-80GB"   GPU models the pod accepts (names or product labels)
  annotation gpuaas.io/devices: "0,1"   GPU indices gpuaas assigned at bind (for MIG: the GPU holding the instance)

Everything here is pure: no I/O, no clock.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from scoring.gpus import MIG_RESOURCE_PREFIX, get_model, model_by_product
from scoring.model import MAX_GPUS_PER_NODE, MILLI, NodeSpec, PodDemand

GPU_RESOURCE = "nvidia.com/gpu"
SHARE_RESOURCE = "gpuaas.io/gpu-share"
MODELS_ANNOTATION = "gpuaas.io/gpu-models"
DEVICES_ANNOTATION = "gpuaas.io/devices"
TOPOLOGY_ANNOTATION = "gpuaas.io/gpu-topology"
POOL_LABEL = "gpuaas.io/pool"
PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"

_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}


class ObjectError(ValueError):
    """A Node or Pod that cannot be read; the message names the object and the field."""


class UnsupportedDemand(ObjectError):
    """A valid pod that asks for something gpuaas does not place (several kinds of GPU, several MIG instances, a GPU
    share outside 1..1000, a GPU model gpuaas does not know): the pod's own problem, reported to its owner."""


def parse_quantity(value: Any, what: str = "quantity") -> Decimal:
    """A Kubernetes resource quantity ("500m", "1Gi", "2", 3) as a Decimal."""
    text = str(value).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            number, mult = text[: -len(suffix)], _SUFFIXES[suffix]
            break
    else:
        number, mult = text, 1
    try:
        return Decimal(number) * Decimal(mult)
    except InvalidOperation:
        raise ObjectError(f"{what}: {value!r} is not a Kubernetes quantity") from None


def _milli(value: Any, what: str) -> int:
    return int(parse_quantity(value, what) * 1000)


def _mib(value: Any, what: str) -> int:
    return int(parse_quantity(value, what) / 2**20)


def _int(value: Any, what: str) -> int:
    q = parse_quantity(value, what)
    if q != int(q) or q < 0:
        raise ObjectError(f"{what}: {value!r} is not a non-negative whole number")
    return int(q)


# -- nodes ------------------------------------------------------------------------------------------------------------

def node_spec(node: Mapping[str, Any]) -> NodeSpec:
    """The model of one Node. Raises ObjectError (or UnknownGpuModelError for a product not in the catalog)."""
    meta = node.get("metadata") or {}
    name = meta.get("name") or "?"
    labels = meta.get("labels") or {}
    alloc = (node.get("status") or {}).get("allocatable") or {}
    where = f"node {name}"
    cpu = _milli(alloc.get("cpu", 0), f"{where}: allocatable cpu")
    mem = _mib(alloc.get("memory", 0), f"{where}: allocatable memory")
    whole = _int(alloc.get(GPU_RESOURCE, 0), f"{where}: allocatable {GPU_RESOURCE}")
    mig_alloc = {k[len(MIG_RESOURCE_PREFIX):]: _int(v, f"{where}: allocatable {k}")
                 for k, v in alloc.items() if k.startswith(MIG_RESOURCE_PREFIX)}
    replicas = _int(labels.get(REPLICAS_LABEL, 1), f"{where}: label {REPLICAS_LABEL}") or 1
    physical = labels.get(COUNT_LABEL)
    gpus = _int(physical, f"{where}: label {COUNT_LABEL}") if physical is not None else whole // replicas
    if gpus == 0 and (whole or any(mig_alloc.values())):
        gpus = whole // replicas + (1 if any(mig_alloc.values()) else 0)
    if not whole and not any(mig_alloc.values()):
        gpus = 0  # GFD labels a booting node before the device plugin registers its GPUs: nothing to place on yet
    if gpus > MAX_GPUS_PER_NODE:
        raise ObjectError(f"{where}: {gpus} GPUs, more than the {MAX_GPUS_PER_NODE} per node gpuaas models")
    if gpus == 0:
        return NodeSpec(name, cpu, mem, node_group=labels.get(POOL_LABEL, ""))
    product = labels.get(PRODUCT_LABEL, "")
    model = model_by_product(product) if product else None
    if model is None:
        model = get_model(product or "unknown")  # raises UnknownGpuModelError naming the catalog
    mig_gpus = max(0, gpus - whole // replicas) if any(mig_alloc.values()) else 0
    layouts = _mig_layouts(gpus, mig_gpus, {p: n for p, n in mig_alloc.items() if n}, where)
    return NodeSpec(name, cpu, mem, gpus=gpus, gpu_model=model.name,
                    gpu_blocks=_blocks(meta.get("annotations") or {}, gpus, where),
                    mig_layouts=layouts, node_group=labels.get(POOL_LABEL, ""))


def _mig_layouts(gpus: int, mig_gpus: int, counts: dict[str, int], where: str):
    """Spread the advertised instances over the MIG-enabled GPUs (the last `mig_gpus` indices), evenly, as the MIG
    manager applies one config to every GPU; remainders go to the first MIG GPUs."""
    if not mig_gpus:
        return None
    per_gpu: list[dict[str, int]] = [{} for _ in range(mig_gpus)]
    for profile, total in sorted(counts.items()):
        base, extra = divmod(total, mig_gpus)
        for i in range(mig_gpus):
            n = base + (1 if i < extra else 0)
            if n:
                per_gpu[i][profile] = n
    return tuple([None] * (gpus - mig_gpus) + per_gpu)


def _blocks(annotations: Mapping[str, str], gpus: int, where: str) -> tuple[int, ...] | None:
    raw = annotations.get(TOPOLOGY_ANNOTATION)
    if not raw:
        return None
    try:
        topo = json.loads(raw)
        nvlink = {g: i for i, group in enumerate(topo.get("nvlinkDomains") or [list(range(gpus))]) for g in group}
        numa = {g: i for i, group in enumerate(topo.get("numaNodes") or [list(range(gpus))]) for g in group}
        pairs = [(nvlink.get(g, 0), numa.get(g, 0)) for g in range(gpus)]
    except (ValueError, TypeError, AttributeError) as err:
        raise ObjectError(f"{where}: annotation {TOPOLOGY_ANNOTATION} is not valid: {err}") from None
    # A block is the GPUs that share both an NVLink domain and a NUMA node.
    ids = {p: i for i, p in enumerate(sorted(set(pairs)))}
    return tuple(ids[p] for p in pairs)


# -- pods -------------------------------------------------------------------------------------------------------------

def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """Effective requests as kube-scheduler computes them: max(app containers + sidecars, the largest init container
    plus the sidecars started before it). Sidecars are init containers with restartPolicy Always."""
    spec = pod.get("spec") or {}
    where = f"pod {pod_key(pod)}"
    app: dict[str, Decimal] = {}
    for c in spec.get("containers") or ():
        for k, v in _container_requests(c, where).items():
            app[k] = app.get(k, Decimal(0)) + v
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for c in spec.get("initContainers") or ():
        req = _container_requests(c, where)
        if c.get("restartPolicy") == "Always":
            for k, v in req.items():
                sidecars[k] = sidecars.get(k, Decimal(0)) + v
            req = {}
        for k in req.keys() | sidecars.keys():
            init_peak[k] = max(init_peak.get(k, Decimal(0)), req.get(k, Decimal(0)) + sidecars.get(k, Decimal(0)))
    keys = app.keys() | sidecars.keys() | init_peak.keys()
    return {k: max(app.get(k, Decimal(0)) + sidecars.get(k, Decimal(0)), init_peak.get(k, Decimal(0))) for k in keys}


def _container_requests(container: Mapping[str, Any], where: str) -> dict[str, Decimal]:
    res = container.get("resources") or {}
    # Extended resources may be given as limits only; Kubernetes copies them to requests.
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return {k: parse_quantity(v, f"{where}: container {container.get('name')} {k}") for k, v in merged.items()}


def requests_gpu(pod: Mapping[str, Any]) -> bool:
    req = pod_requests(pod)
    return any(v > 0 and (k in (GPU_RESOURCE, SHARE_RESOURCE) or k.startswith(MIG_RESOURCE_PREFIX))
               for k, v in req.items())


def pod_demand(pod: Mapping[str, Any]) -> PodDemand:
    """The model of one Pod's demand. Raises ObjectError naming the pod and field."""
    where = f"pod {pod_key(pod)}"
    req = pod_requests(pod)
    cpu = int(req.get("cpu", 0) * 1000)
    mem = int(req.get("memory", 0) / 2**20)
    whole = req.get(GPU_RESOURCE, Decimal(0))
    share = req.get(SHARE_RESOURCE, Decimal(0))
    migs = {k[len(MIG_RESOURCE_PREFIX):]: v for k, v in req.items() if k.startswith(MIG_RESOURCE_PREFIX) and v > 0}
    kinds = sum(bool(x) for x in (whole, share, migs))
    if kinds > 1:
        raise UnsupportedDemand(f"{where}: asks for more than one kind of GPU ({GPU_RESOURCE}, {SHARE_RESOURCE}, "
                          f"{MIG_RESOURCE_PREFIX}*); gpuaas places one kind per pod")
    allowed = _allowed_models(pod, where)
    name = pod_key(pod)
    try:
        if whole:
            return PodDemand(cpu, mem, gpus=_int(whole, f"{where}: {GPU_RESOURCE}"), gpu_milli=MILLI,
                             allowed_models=allowed, name=name)
        if share:
            milli = _int(share, f"{where}: {SHARE_RESOURCE}")
            if not 0 < milli <= MILLI:
                raise UnsupportedDemand(f"{where}: {SHARE_RESOURCE} must be 1..{MILLI} thousandths of a GPU, got {milli}")
            return PodDemand(cpu, mem, gpus=1, gpu_milli=milli, allowed_models=allowed, name=name)
        if migs:
            if len(migs) > 1 or next(iter(migs.values())) != 1:
                raise UnsupportedDemand(f"{where}: asks for {dict((k, str(v)) for k, v in migs.items())}; gpuaas places "
                                  "one MIG instance per pod")
            return PodDemand(cpu, mem, gpus=1, gpu_milli=MILLI, mig_profile=next(iter(migs)),
                             allowed_models=allowed, name=name)
    except ValueError as err:
        if isinstance(err, ObjectError):
            raise
        raise ObjectError(f"{where}: {err}") from None
    return PodDemand(cpu, mem, allowed_models=allowed, name=name)


def _allowed_models(pod: Mapping[str, Any], where: str) -> frozenset[str]:
    """GPU models the pod may run on: the gpuaas annotation, narrowed by a nodeSelector or required node affinity on
    the GFD product label (kube-scheduler enforces those itself; the model needs them to plan capacity for the pod).
    Empty means any model."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    spec = pod.get("spec") or {}
    constraints: list[set[str]] = []
    names = [x.strip() for x in annotations.get(MODELS_ANNOTATION, "").split(",") if x.strip()]
    if names:
        out = set()
        for n in names:
            model = model_by_product(n)
            if model is None:
                try:
                    model = get_model(n)
                except KeyError as err:
                    raise UnsupportedDemand(f"{where}: annotation {MODELS_ANNOTATION}: {err}") from None
            out.add(model.name)
        constraints.append(out)
    selected = (spec.get("nodeSelector") or {}).get(PRODUCT_LABEL)
    if selected:
        constraints.append(_catalog_names([selected]))
    terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    per_term = [[e for e in t.get("matchExpressions") or () if e.get("key") == PRODUCT_LABEL and
                 e.get("operator") == "In"] for t in terms]
    if per_term and all(per_term):  # terms are ORed: a term without a product constraint allows any model
        constraints.append(_catalog_names(v for exprs in per_term for e in exprs for v in e.get("values") or ()))
    if not constraints:
        return frozenset()
    allowed = set.intersection(*constraints)
    return frozenset(allowed) if allowed else frozenset({"(no model satisfies the pod's constraints)"})


def _catalog_names(products) -> set[str]:
    """Catalog names for product labels; an unknown product stays as it is (no modelled node has it)."""
    out = set()
    for product in products:
        model = model_by_product(product) or _maybe_model(product)
        out.add(model.name if model else product)
    return out


def _maybe_model(name: str):
    try:
        return get_model(name)
    except KeyError:
        return None


def assigned_devices(pod: Mapping[str, Any]) -> tuple[int, ...] | None:
    """GPU indices recorded by gpuaas at bind, or None when the pod carries no assignment."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(DEVICES_ANNOTATION)
    if raw is None:
        return None
    try:
        return tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise ObjectError(f"pod {pod_key(pod)}: annotation {DEVICES_ANNOTATION}={raw!r} is not a list of GPU "
                          "indices") from None


def format_devices(devices: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(d) for d in devices)


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """A pod bound to a node and not finished holds its requests there (kube-scheduler's accounting)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class BoundPod:
    key: str
    node: str
    demand: PodDemand
    devices: tuple[int, ...] | None

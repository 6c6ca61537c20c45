"""Kubernetes Node and Pod objects (plain dicts, as the API returns them) into the scoring model.

The one place in gpuaas that reads what GPU feature discovery, the NVIDIA device plugin and gpuaas itself publish:

Node
  labels       nvidia.com/gpu.product   GPU model (scoring.gpus catalog, by product label; "-SHARED" when time-sliced)
               nvidia.com/gpu.count     physical GPUs on the node
               nvidia.com/gpu.replicas  time-slicing (or MPS) replicas per GPU, 1..1000 (absent, 0 or 1 = exclusive):
                                        allocatable nvidia.com/gpu then counts replicas, and a pod asking
                                        nvidia.com/gpu: N takes N of them (scoring.model, "Time-slicing")
               nvidia.com/mig-<profile>.replicas  must be 1 (or absent): gpuaas does not model time-sliced MIG
               gpuaas.io/pool           node group
  allocatable  nvidia.com/gpu           whole GPUs not in MIG mode (mixed strategy), times their replicas
               nvidia.com/mig-<profile> MIG instances; the MIG-enabled GPUs are gpu.count minus whole GPUs, and the
                                        instances are spread over them as the MIG manager lays them out
               gpuaas.io/gpu-share      > 0: a sharing device plugin on the node serves gpuaas.io/gpu-share (and
                                        honours gpuaas.io/devices); without it no GPU share fits the node, as the
                                        kubelet would start such a pod without a GPU (scoring.model, "Shares")
  annotation   gpuaas.io/gpu-topology   {"nvlinkDomains": [[0,1,2,3],...], "numaNodes": [[...],...]}

Pod (requests of all containers, init containers as kube-scheduler counts them)
  nvidia.com/gpu: k              k whole GPUs
  nvidia.com/mig-<profile>: 1    one MIG instance
  gpuaas.io/gpu-share: m         m thousandths of one GPU (a shared GPU; an extended resource only gpuaas accounts)
  annotation gpuaas.io/gpu-models: "A100-80GB,H100-80GB"   GPU models the pod accepts (names or product labels)
  annotation gpuaas.io/devices: "0,1"   GPU indices gpuaas assigned at bind (for MIG: the GPU holding the instance);
                                        a fact only where the node honours it (a share on a share-capable node),
                                        the GPUs gpuaas expects where the NVIDIA device plugin picks (scoring.model,
                                        "Device indices")

Quantities are read as Kubernetes reads them (resource.ParseQuantity's grammar; see _read_quantity), requests and
allocatable must not be negative, and a value of the wrong JSON type is an ObjectError naming the field: nothing a
Node or Pod holds ends in another exception. The work one pod can cause is linear in its size and bounded by
MAX_CONTAINERS.

Everything here is pure: no I/O, no clock.
"""
from __future__ import annotations

import decimal
import functools
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from scoring.gpus import MIG_RESOURCE_PREFIX, GpuModel, MigLayoutError, get_model, model_by_product, resolve_mig_layout
from scoring.model import MAX_GPUS_PER_NODE, MILLI, NodeSpec, PodDemand

GPU_RESOURCE = "nvidia.com/gpu"
SHARE_RESOURCE = "gpuaas.io/gpu-share"
MODELS_ANNOTATION = "gpuaas.io/gpu-models"
DEVICES_ANNOTATION = "gpuaas.io/devices"
# "<node>:<i>,<j>": the GPUs a placement planned ahead of the scheduler (the gang controller, for a member it pinned):
# the extender binds the pod to them when it lands on that node and they are still free.
PLANNED_DEVICES_ANNOTATION = "gpuaas.io/planned-devices"
TOPOLOGY_ANNOTATION = "gpuaas.io/gpu-topology"
POOL_LABEL = "gpuaas.io/pool"
PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"  # none, time-slicing or mps (informational here)
MIG_CONFIG_LABEL = "nvidia.com/mig.config"  # the GPU operator's MIG manager: the layout asked for
MIG_STATE_LABEL = "nvidia.com/mig.config.state"  # and how far it got (pending, success, failed)

MAX_AMOUNT = 2**63 - 1  # the largest quantity whose Value() an int64 holds; binary-SI quantities are capped here
MAX_MODEL_AMOUNT = 2**48  # per node or pod, in the model's units (millicores, MiB, GPUs): node sums stay in int64
MAX_CONTAINERS = 10_000  # containers plus init containers one pod may have for gpuaas to read it
_NANO = 10**9
_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
# resource.ParseQuantity's grammar: <sign>?<digits>?(.<digits>?)? then a suffix scanned as [eEinumkKMGTP]*[+-]?[0-9]*
# and then looked up (a decimal or binary SI suffix, or e/E and a signed int64 exponent).
_QUANTITY = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[+-]?[0-9]*)")
_EXPONENT = re.compile(r"[+-]?[0-9]+")
# What Go's strings.TrimSpace strips (unicode.IsSpace); Python's str.strip() would also strip \x1c-\x1f.
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
            "\u2028\u2029\u202f\u205f\u3000"


class ObjectError(ValueError):
    """A Node or Pod that cannot be read; the message names the object and the field."""


class UnsupportedDemand(ObjectError):
    """A valid pod that asks for something gpuaas does not place (several kinds of GPU, several MIG instances, a GPU
    share outside 1..1000, a GPU model gpuaas does not know): the pod's own problem, reported to its owner."""


def _quantity_nanos(text: str) -> int:
    """_read_quantity, remembered for the short strings pods and nodes repeat ("500m", "16Gi"); a long one (valid
    ones can be megabytes of zeros) is read each time rather than kept."""
    return _read_short_quantity(text) if len(text) <= 40 else _read_quantity(text)


def _read_quantity(text: str) -> int:
    """A quantity string in billionths, as resource.ParseQuantity reads it (after the JSON decoder's TrimSpace): the
    same grammar, a value below a billionth rounded away from zero, a binary-SI value capped at MAX_AMOUNT, an
    exponent wrapped to int32 as Go does. A decimal value beyond MAX_AMOUNT is refused (Kubernetes keeps it, but
    every int64 accessor overflows on it). Raises ValueError with the reason. Work is linear in the length."""
    text = text.strip(_GO_SPACE)
    match = _QUANTITY.fullmatch(text)
    if not text or match is None:
        raise ValueError("expected <sign><digits>.<digits><suffix>, the suffix one of n u m k M G T P "
                         "E Ki Mi Gi Ti Pi Ei or e<exponent>)")
    sign, num, denom, suffix = match.group(1), match.group(2), match.group(3) or "", match.group(4)
    if suffix in _DECIMAL_SI:
        binary, exponent = False, _DECIMAL_SI[suffix]
    elif suffix in _BINARY_SI:
        binary, exponent = True, _BINARY_SI[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE" and _EXPONENT.fullmatch(suffix[1:]):
        parsed = int(suffix[1:])
        if not -2**63 <= parsed < 2**63:
            raise ValueError("exponent out of int64 range")
        binary, exponent = False, (parsed + 2**31) % 2**32 - 2**31  # Go: int32(parsed)
    else:
        raise ValueError(f"unknown suffix {suffix!r}")
    digits = (num + denom).lstrip("0")
    if not digits:
        return 0
    significant = digits.rstrip("0")
    scale = len(digits) - len(significant) - len(denom)  # value = significant * 10**scale (* 2**exponent if binary)
    top = len(significant) + scale  # digits before the decimal point
    if binary:
        if top > 19:  # >= 10**18 * 1024 > MAX_AMOUNT
            nanos = MAX_AMOUNT * _NANO
        else:
            with decimal.localcontext() as ctx:
                ctx.prec = len(significant) + 40
                ctx.Emax, ctx.Emin = decimal.MAX_EMAX, decimal.MIN_EMIN
                exact = (Decimal(significant) * (2**exponent * _NANO)).scaleb(scale)
                nanos = min(int(exact.to_integral_value(rounding=decimal.ROUND_CEILING)), MAX_AMOUNT * _NANO)
    else:
        top += exponent
        scale += exponent
        if top > 19:
            raise ValueError(f"larger than {MAX_AMOUNT}, the most any Kubernetes quantity reads as a number")
        if scale + 9 >= 0:
            nanos = int(significant) * 10 ** (scale + 9)
        else:
            keep = top + 9  # digits of whole billionths; the rest is non-zero (no trailing zeros) and rounds up
            nanos = (int(significant[:keep]) if keep > 0 else 0) + 1
        if nanos > MAX_AMOUNT * _NANO:
            raise ValueError(f"larger than {MAX_AMOUNT}, the most any Kubernetes quantity reads as a number")
    return -nanos if sign == "-" else nanos


_read_short_quantity = functools.lru_cache(maxsize=4096)(_read_quantity)


def _nanos(value: Any) -> int:
    """A quantity as JSON carries it (a string, or a number) in billionths; ValueError says why not."""
    if isinstance(value, str):
        return _quantity_nanos(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return _quantity_nanos(str(value))
    if isinstance(value, float) and math.isfinite(value):
        return _quantity_nanos(repr(value))
    raise ValueError(f"must be a quantity string or a number, got {type(value).__name__}")


def _decimal(nanos: int) -> Decimal:
    return Decimal(f"{nanos}E-9")  # exact: a string's digits are never rounded


def parse_quantity(value: Any, what: str = "quantity") -> Decimal:
    """A Kubernetes resource quantity ("500m", "1Gi", "2", 3) as a Decimal, exactly as resource.ParseQuantity reads it
    (see _read_quantity). Raises ObjectError naming `what`."""
    try:
        return _decimal(_nanos(value))
    except ValueError as err:
        raise ObjectError(f"{what}: {_shown(value)} is not a Kubernetes quantity: {err}") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"


def _amount(value: Any, what: str) -> int:
    """A non-negative quantity in billionths (requests and allocatable may not be negative in Kubernetes)."""
    try:
        nanos = _nanos(value)
    except ValueError as err:
        raise ObjectError(f"{what}: {_shown(value)} is not a Kubernetes quantity: {err}") from None
    if nanos < 0:
        raise ObjectError(f"{what}: {_shown(value)} must be non-negative")
    return nanos


def _model_units(nanos: int, unit: int, what: str) -> int:
    """Whole model units (millicores: 10**6 nanos, MiB: 2**20 * 10**9, count: 10**9), rounded down as before."""
    value = nanos // unit
    if value > MAX_MODEL_AMOUNT:
        raise ObjectError(f"{what}: {_decimal(nanos).normalize()} is more than gpuaas models ({MAX_MODEL_AMOUNT} in "
                          "millicores, MiB or GPUs)")
    return value


def _milli(value: Any, what: str) -> int:
    return _model_units(_amount(value, what), 10**6, what)


def _mib(value: Any, what: str) -> int:
    return _model_units(_amount(value, what), 2**20 * _NANO, what)


def _count(nanos: int, value: Any, what: str) -> int:
    if nanos % _NANO:
        raise ObjectError(f"{what}: {_shown(value)} is not a whole number")
    return _model_units(nanos, _NANO, what)


def _int(value: Any, what: str) -> int:
    return _count(_amount(value, what), value, what)


def _label_int(value: Any, what: str) -> int:
    """A label that holds a count (nvidia.com/gpu.count, gpu.replicas): decimal digits, as GFD writes them."""
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 9:
        raise ObjectError(f"{what}: {_shown(value)} is not a whole number of at most 9 digits")
    return int(value)


def _map(value: Any, what: str) -> Mapping[str, Any]:
    if type(value) is dict:
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ObjectError(f"{what}: must be an object, got {type(value).__name__}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ObjectError(f"{what}: must be a list, got {type(value).__name__}")
    return value


def _str(value: Any, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ObjectError(f"{what}: must be a string, got {type(value).__name__}")
    return value


# -- nodes ------------------------------------------------------------------------------------------------------------

def gpus_usable(node: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """Whether the GPUs a node advertises can take pods now: not while its kubelet reports it not Ready (a node with
    no Ready condition yet is judged by what it advertises), nor while the MIG manager repartitions it (the device
    plugin still advertises the old instances). The extender and the node scaler read nodes through node_spec, so
    neither places pods on such GPUs, and the what-if counts them as capacity on its way, not as free."""
    if labels.get(MIG_STATE_LABEL) == "pending":
        return False
    conditions = (node.get("status") or {}).get("conditions") or ()
    ready = [c.get("status") for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"]
    return not ready or ready[0] == "True"


def node_spec(node: Mapping[str, Any]) -> NodeSpec:
    """The model of one Node. Raises ObjectError (or UnknownGpuModelError for a product not in the catalog)."""
    meta = _map(node.get("metadata"), "node metadata")
    name = meta.get("name") or "?"
    where = f"node {name}"
    labels = _map(meta.get("labels"), f"{where}: metadata.labels")
    alloc = _map(_map(node.get("status"), f"{where}: status").get("allocatable"), f"{where}: status.allocatable")
    cpu = _milli(alloc.get("cpu", 0), f"{where}: allocatable cpu")
    mem = _mib(alloc.get("memory", 0), f"{where}: allocatable memory")
    whole = _int(alloc.get(GPU_RESOURCE, 0), f"{where}: allocatable {GPU_RESOURCE}")
    mig_alloc = {k[len(MIG_RESOURCE_PREFIX):]: _int(v, f"{where}: allocatable {k}")
                 for k, v in alloc.items() if k.startswith(MIG_RESOURCE_PREFIX)}
    replicas = gpu_replicas(labels, where)
    physical = labels.get(COUNT_LABEL)
    gpus = _label_int(physical, f"{where}: label {COUNT_LABEL}") if physical is not None else whole // replicas
    if gpus == 0 and (whole or any(mig_alloc.values())):
        gpus = whole // replicas + (1 if any(mig_alloc.values()) else 0)
    if not whole and not any(mig_alloc.values()):
        gpus = 0  # GFD labels a booting node before the device plugin registers its GPUs: nothing to place on yet
    elif not gpus_usable(node, labels):
        gpus = 0  # advertised, but not to be placed on now (see gpus_usable)
    if gpus > MAX_GPUS_PER_NODE:
        raise ObjectError(f"{where}: {gpus} GPUs, more than the {MAX_GPUS_PER_NODE} per node gpuaas models")
    pool = _str(labels.get(POOL_LABEL), f"{where}: label {POOL_LABEL}")
    if gpus == 0:
        return NodeSpec(name, cpu, mem, node_group=pool)
    product = _str(labels.get(PRODUCT_LABEL), f"{where}: label {PRODUCT_LABEL}")
    model = model_by_product(product) if product else None
    if model is None:
        model = get_model(product or "unknown")  # raises UnknownGpuModelError naming the catalog
    mig_gpus = max(0, gpus - whole // replicas) if any(mig_alloc.values()) else 0
    if mig_gpus:
        for key, value in labels.items():  # MIG instances the device plugin time-slices (mixed strategy)
            if key.startswith(MIG_RESOURCE_PREFIX) and key.endswith(".replicas") and value not in ("0", "1"):
                raise ObjectError(f"{where}: label {key}={_shown(value)}: its MIG instances are time-sliced, which "
                                  f"gpuaas does not model (only {REPLICAS_LABEL} on GPUs without MIG); set replicas "
                                  f"1 for the MIG resources in the device plugin's sharing config")
    layouts = _mig_layouts(gpus, mig_gpus, {p: n for p, n in mig_alloc.items() if n}, where)
    for layout in {tuple(sorted(per_gpu.items())) for per_gpu in layouts or () if per_gpu}:
        try:  # here, not when the model is built: one unreadable node must not stop every decision
            resolve_mig_layout(model, dict(layout))
        except MigLayoutError as err:
            raise ObjectError(f"{where}: its allocatable MIG instances do not fit its GPUs: {err}") from None
    shares = _int(alloc.get(SHARE_RESOURCE, 0), f"{where}: allocatable {SHARE_RESOURCE}") > 0
    return NodeSpec(name, cpu, mem, gpus=gpus, gpu_model=model.name,
                    gpu_blocks=_blocks(_map(meta.get("annotations"), f"{where}: metadata.annotations"), gpus, where),
                    mig_layouts=layouts, node_group=pool, gpu_replicas=replicas if gpus > mig_gpus else 1,
                    gpu_shares=shares)


def gpu_replicas(labels: Mapping[str, Any], where: str) -> int:
    """Time-slicing replicas per GPU from `nvidia.com/gpu.replicas` (GFD writes 0 when sharing is off, 1 when on without
    replicas): 1..1000, 1 = exclusive. Raises ObjectError naming the label."""
    replicas = _label_int(labels.get(REPLICAS_LABEL, "1"), f"{where}: label {REPLICAS_LABEL}") or 1
    if replicas > MILLI:
        raise ObjectError(f"{where}: label {REPLICAS_LABEL}={replicas}: gpuaas models at most {MILLI} replicas per GPU "
                          f"(a replica is 1/{MILLI} of a GPU at the least)")
    return replicas


def _mig_layouts(gpus: int, mig_gpus: int, counts: dict[str, int],
                 where: str) -> tuple[dict[str, int] | None, ...] | None:
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
    layouts: list[dict[str, int] | None] = [None] * (gpus - mig_gpus)  # GPUs without MIG first
    layouts.extend(per_gpu)
    return tuple(layouts)


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
    if not isinstance(meta, Mapping):
        return "?/?"
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def demand_key(pod: Mapping[str, Any]) -> bytes | None:
    """A digest of everything pod_demand reads, so that a cache keyed on it holds, for any key, the one demand that
    content yields, whoever sent it (a request body cannot make the same key mean something else, as a uid could).
    None when the content cannot be serialised (pod_demand then reads it uncached)."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    if isinstance(meta, Mapping):
        ann = meta.get("annotations")
        meta = (meta.get("namespace"), meta.get("name"),
                ann.get(MODELS_ANNOTATION) if isinstance(ann, Mapping) else ann)
    if isinstance(spec, Mapping):
        spec = (spec.get("containers"), spec.get("initContainers"), spec.get("nodeSelector"), spec.get("affinity"))
    try:
        return hashlib.blake2b(orjson.dumps((meta, spec)), digest_size=16).digest()
    except (orjson.JSONEncodeError, TypeError):
        return None


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """Effective requests as kube-scheduler computes them: max(app containers + sidecars, the largest init container
    plus the sidecars started before it). Sidecars are init containers with restartPolicy Always."""
    return {k: _decimal(v) for k, v in _request_nanos(pod).items()}


def _request_nanos(pod: Mapping[str, Any]) -> dict[str, int]:
    """pod_requests in billionths. Linear in the number of (container, resource) pairs: requests are non-negative,
    so the sidecars started before a regular init container never exceed all the sidecars, and only the resources
    that init container itself requests can make its peak the pod's maximum."""
    where = f"pod {pod_key(pod)}"
    spec = _map(pod.get("spec"), f"{where}: spec")
    containers = _list(spec.get("containers"), f"{where}: spec.containers")
    inits = _list(spec.get("initContainers"), f"{where}: spec.initContainers")
    if len(containers) + len(inits) > MAX_CONTAINERS:
        raise ObjectError(f"{where}: {len(containers) + len(inits)} containers and init containers, more than the "
                          f"{MAX_CONTAINERS} gpuaas reads in one pod")
    total: dict[str, int] = {}
    for i, c in enumerate(containers):
        for k, v in _container_requests(c, where, "containers", i):
            total[k] = total.get(k, 0) + v
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, c in enumerate(inits):
        req = _container_requests(c, where, "initContainers", i)
        if c.get("restartPolicy") == "Always":
            for k, v in req:
                sidecars[k] = sidecars.get(k, 0) + v
        else:
            for k, v in req:
                peak = v + sidecars.get(k, 0)
                if peak > init_peak.get(k, 0):
                    init_peak[k] = peak
    for k, v in sidecars.items():
        total[k] = total.get(k, 0) + v
    for k, v in init_peak.items():
        if v > total.get(k, 0):
            total[k] = v
        else:
            total.setdefault(k, 0)
    return total


def _container_requests(container: Any, where: str, field: str, i: int) -> list[tuple[str, int]]:
    if type(container) is not dict and not isinstance(container, Mapping):  # the exact type first: thousands a pod
        raise ObjectError(f"{where}: spec.{field}[{i}]: must be an object, got {type(container).__name__}")
    res = container.get("resources")
    if res is None:
        return []
    if type(res) is not dict:
        res = _map(res, f"{where}: spec.{field}[{i}].resources")
    limits, requests = res.get("limits"), res.get("requests")
    merged: Mapping[str, Any]
    if limits is not None and requests is not None:
        # Extended resources may be given as limits only; Kubernetes copies them to requests.
        merged = {**_map(limits, f"{where}: spec.{field}[{i}].resources.limits"),
                  **_map(requests, f"{where}: spec.{field}[{i}].resources.requests")}
    else:
        given = limits if requests is None else requests
        merged = given if type(given) is dict else \
            _map(given, f"{where}: spec.{field}[{i}].resources.{'requests' if limits is None else 'limits'}")
    out = []
    for k, v in merged.items():
        try:
            nanos = _quantity_nanos(v) if type(v) is str else _nanos(v)
        except ValueError as err:
            raise ObjectError(f"{where}: spec.{field}[{i}] {k}: {_shown(v)} is not a Kubernetes quantity: {err}") \
                from None
        if nanos < 0:
            raise ObjectError(f"{where}: spec.{field}[{i}] {k}: {_shown(v)} must be non-negative")
        out.append((k, nanos))
    return out


def requests_gpu(pod: Mapping[str, Any]) -> bool:
    req = _request_nanos(pod)
    return any(v > 0 and (k in (GPU_RESOURCE, SHARE_RESOURCE) or k.startswith(MIG_RESOURCE_PREFIX))
               for k, v in req.items())


def pod_demand(pod: Mapping[str, Any]) -> PodDemand:
    """The model of one Pod's demand. Raises ObjectError naming the pod and field."""
    where = f"pod {pod_key(pod)}"
    req = _request_nanos(pod)
    cpu = _model_units(req.get("cpu", 0), 10**6, f"{where}: cpu")
    mem = _model_units(req.get("memory", 0), 2**20 * _NANO, f"{where}: memory")
    whole = req.get(GPU_RESOURCE, 0)
    share = req.get(SHARE_RESOURCE, 0)
    migs = {k[len(MIG_RESOURCE_PREFIX):]: v for k, v in req.items() if k.startswith(MIG_RESOURCE_PREFIX) and v > 0}
    kinds = sum(bool(x) for x in (whole, share, migs))
    if kinds > 1:
        raise UnsupportedDemand(f"{where}: asks for more than one kind of GPU ({GPU_RESOURCE}, {SHARE_RESOURCE}, "
                          f"{MIG_RESOURCE_PREFIX}*); gpuaas places one kind per pod")
    allowed = _allowed_models(pod, where)
    name = pod_key(pod)
    try:
        if whole:
            return PodDemand(cpu, mem, gpus=_count(whole, _decimal(whole), f"{where}: {GPU_RESOURCE}"),
                             gpu_milli=MILLI, allowed_models=allowed, name=name)
        if share:
            milli = _count(share, _decimal(share), f"{where}: {SHARE_RESOURCE}")
            if not 0 < milli <= MILLI:
                raise UnsupportedDemand(f"{where}: {SHARE_RESOURCE} must be 1..{MILLI} thousandths of a GPU, "
                                        f"got {milli}")
            return PodDemand(cpu, mem, gpus=1, gpu_milli=milli, allowed_models=allowed, name=name,
                             whole_share=milli == MILLI)
        if migs:
            if len(migs) > 1 or next(iter(migs.values())) != _NANO:
                asked = {k: str(_decimal(v)) for k, v in migs.items()}
                raise UnsupportedDemand(f"{where}: asks for {asked}; "
                                        "gpuaas places one MIG instance per pod")
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
    meta = _map(pod.get("metadata"), f"{where}: metadata")
    annotations = _map(meta.get("annotations"), f"{where}: metadata.annotations")
    spec = _map(pod.get("spec"), f"{where}: spec")
    constraints: list[set[str]] = []
    wanted = _str(annotations.get(MODELS_ANNOTATION), f"{where}: annotation {MODELS_ANNOTATION}")
    names = [x.strip() for x in wanted.split(",") if x.strip()]
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
    selector = _map(spec.get("nodeSelector"), f"{where}: spec.nodeSelector")
    selected = _str(selector.get(PRODUCT_LABEL), f"{where}: spec.nodeSelector {PRODUCT_LABEL}")
    if selected:
        constraints.append(_catalog_names([selected]))
    path = f"{where}: spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = _map(_map(_map(spec.get("affinity"), f"{where}: spec.affinity").get("nodeAffinity"),
                         f"{where}: spec.affinity.nodeAffinity").get("requiredDuringSchedulingIgnoredDuringExecution"),
                    path)
    per_term = []
    for i, term in enumerate(_list(required.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms")):
        at = f"{path}.nodeSelectorTerms[{i}]"
        exprs = []
        for j, e in enumerate(_list(_map(term, at).get("matchExpressions"), f"{at}.matchExpressions")):
            e = _map(e, f"{at}.matchExpressions[{j}]")
            if e.get("key") == PRODUCT_LABEL and e.get("operator") == "In":
                values = _list(e.get("values"), f"{at}.matchExpressions[{j}].values")
                exprs.append([_str(v, f"{at}.matchExpressions[{j}].values") for v in values])
        per_term.append(exprs)
    if per_term and all(per_term):  # terms are ORed: a term without a product constraint allows any model
        constraints.append(_catalog_names(v for exprs in per_term for values in exprs for v in values))
    if not constraints:
        return frozenset()
    allowed = set.intersection(*constraints)
    return frozenset(allowed) if allowed else frozenset({"(no model satisfies the pod's constraints)"})


def _catalog_names(products: Iterable[str]) -> set[str]:
    """Catalog names for product labels; an unknown product stays as it is (no modelled node has it), cut to a label
    value's 63 characters (a longer one matches no node either; the demand cache keeps no megabyte of it)."""
    out: set[str] = set()
    for product in products:
        model = model_by_product(product) or _maybe_model(product)
        out.add(model.name if model else product if len(product) <= 63 else f"{product[:60]}...")
    return out


def _maybe_model(name: str) -> GpuModel | None:
    try:
        return get_model(name)
    except KeyError:
        return None


def assigned_devices(pod: Mapping[str, Any]) -> tuple[int, ...] | None:
    """GPU indices recorded by gpuaas at bind, or None when the pod carries no assignment."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    raw = annotations.get(DEVICES_ANNOTATION) if isinstance(annotations, Mapping) else None
    if raw is None:
        return None
    parts = [x.strip() for x in raw.split(",") if x.strip()] if isinstance(raw, str) else None
    if parts is None or not all(x.isascii() and x.isdigit() and int(x) < MAX_GPUS_PER_NODE for x in parts):
        raise ObjectError(f"pod {pod_key(pod)}: annotation {DEVICES_ANNOTATION}={_shown(raw)} is not a list of GPU "
                          f"indices 0..{MAX_GPUS_PER_NODE - 1}")
    return tuple(int(x) for x in parts)


def format_devices(devices: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(d) for d in devices)


def format_planned_devices(node: str, devices: tuple[int, ...] | list[int]) -> str:
    return f"{node}:{format_devices(devices)}"


def planned_devices(pod: Mapping[str, Any]) -> tuple[str, tuple[int, ...]] | None:
    """(node, GPU indices) a placement planned for the pod, or None when it carries none or one that cannot be read
    (a plan is advice: the extender checks the GPUs are free before it uses them)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(PLANNED_DEVICES_ANNOTATION)
    if not isinstance(raw, str) or ":" not in raw:
        return None
    node, _, listed = raw.rpartition(":")
    parts = [x.strip() for x in listed.split(",") if x.strip()]
    if not node or not parts or not all(x.isdigit() and int(x) < MAX_GPUS_PER_NODE for x in parts):
        return None
    return node, tuple(int(x) for x in parts)


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

"""Kubernetes Node and Pod objects (plain dicts, as the API returns them) -> the scoring model. Pure: no client.

What is read
------------
Node (GPU feature discovery labels and NVIDIA device plugin resources):
  labels  nvidia.com/gpu.product   GPU model (scoring.gpus.model_by_product; "-MIG-..." suffixes are stripped)
          nvidia.com/gpu.count     GPUs on the node (fallback: capacity nvidia.com/gpu)
          nvidia.com/gpu.memory    MiB per GPU (informational; the catalog knows the model's memory)
          nvidia.com/gpu.replicas  time-slicing replicas per GPU: nvidia.com/gpu then counts replicas, not GPUs
          nvidia.com/mig.config    MIG manager layout name (all-balanced, all-1g.10gb, ...) applied to every GPU
          gpuaas.io/gpu-blocks     optional NVLink/NUMA block per GPU, e.g. "0,0,0,0,1,1,1,1"
  status.allocatable  cpu, memory, nvidia.com/gpu, nvidia.com/mig-<profile> (mixed strategy)
Pod:
  spec.containers[*].resources.requests/limits  cpu, memory, nvidia.com/gpu, nvidia.com/mig-<profile>
  spec.initContainers                           effective request = max(sum of containers, largest init container)
  annotation gpuaas.io/gpu-milli                share of one GPU in thousandths (with nvidia.com/gpu: 1), for
                                                time-sliced GPUs; absent = whole GPUs
  annotation gpuaas.io/gpu-models               allowed models, comma-separated catalog names or product labels
  nodeSelector / required nodeAffinity on nvidia.com/gpu.product (In)   also restrict the allowed models

The device-assignment annotation
--------------------------------
gpuaas records which devices a bound pod holds in the pod annotation ``gpuaas.io/devices``: comma-separated entries,
each one of

    <gpu>                  a whole GPU by index on the node            "0,1,2,3"
    <gpu>:<milli>          a share of GPU <gpu> in thousandths          "3:250"
    <gpu>/<profile>@<s>    a MIG instance of <profile> at slice <s>     "5/3g.40gb@4"

`format_devices` and `parse_devices` convert between this string and the model.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scoring.gpus import MIG_CONFIGS, MIG_RESOURCE_PREFIX, MigLayoutError, get_model, model_by_product
from scoring.model import MILLI, ClusterState, NodeSpec, PodDemand

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
BLOCKS_LABEL = "gpuaas.io/gpu-blocks"
DEVICES_ANNOTATION = "gpuaas.io/devices"
GPU_MILLI_ANNOTATION = "gpuaas.io/gpu-milli"
GPU_MODELS_ANNOTATION = "gpuaas.io/gpu-models"


class KubeObjectError(ValueError):
    """A Node or Pod object the model cannot represent; the message names the object and the field."""


# -- quantities --------------------------------------------------------------------------------------------------------

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": 1e-3}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def parse_quantity(value, where: str = "quantity") -> float:
    """A Kubernetes resource quantity ("500m", "2", "16Gi", "1e3") as a float in base units."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise KubeObjectError(f"{where}: not a quantity: {value!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def cpu_milli(value, where: str = "cpu") -> int:
    return int(math.ceil(parse_quantity(value, where) * 1000 - 1e-9))


def memory_mib(value, where: str = "memory") -> int:
    return int(math.ceil(parse_quantity(value, where) / 2**20 - 1e-9))


# -- device annotation -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceAssignment:
    gpu: int
    milli: int = MILLI
    mig_profile: str = ""
    mig_start: int = -1


def format_devices(assignments: Iterable[DeviceAssignment]) -> str:
    parts = []
    for a in assignments:
        if a.mig_profile:
            parts.append(f"{a.gpu}/{a.mig_profile}@{a.mig_start}")
        elif a.milli < MILLI:
            parts.append(f"{a.gpu}:{a.milli}")
        else:
            parts.append(str(a.gpu))
    return ",".join(parts)


_DEVICE = re.compile(r"^(\d+)(?::(\d+)|/([0-9a-z.+]+)@(\d))?$")


def parse_devices(text: str, where: str = DEVICES_ANNOTATION) -> list[DeviceAssignment]:
    out = []
    for raw in (text or "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        m = _DEVICE.match(entry)
        if not m:
            raise KubeObjectError(f"{where}: bad device entry {entry!r} (want <gpu>, <gpu>:<milli> or "
                                  f"<gpu>/<profile>@<start>)")
        gpu = int(m.group(1))
        if m.group(2):
            milli = int(m.group(2))
            if not 0 < milli <= MILLI:
                raise KubeObjectError(f"{where}: share {milli} out of 1..1000 in {entry!r}")
            out.append(DeviceAssignment(gpu, milli))
        elif m.group(3):
            out.append(DeviceAssignment(gpu, 0, m.group(3), int(m.group(4))))
        else:
            out.append(DeviceAssignment(gpu))
    return out


# -- nodes -------------------------------------------------------------------------------------------------------------

def _meta(obj: Mapping) -> tuple[str, Mapping, Mapping]:
    meta = obj.get("metadata") or {}
    return meta.get("name", "?"), meta.get("labels") or {}, meta.get("annotations") or {}


def node_spec(node: Mapping) -> NodeSpec:
    """A NodeSpec from a Node object. Raises KubeObjectError naming the node and field on bad input."""
    name, labels, _ = _meta(node)
    status = node.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    where = f"node {name}"
    cpu = cpu_milli(alloc.get("cpu", 0), f"{where}: allocatable cpu")
    mem = memory_mib(alloc.get("memory", 0), f"{where}: allocatable memory")
    product = labels.get(PRODUCT_LABEL, "")
    mig_counts = {k[len(MIG_RESOURCE_PREFIX):]: int(parse_quantity(v, f"{where}: allocatable {k}"))
                  for k, v in alloc.items() if k.startswith(MIG_RESOURCE_PREFIX)}
    gpus = 0
    if COUNT_LABEL in labels:
        try:
            gpus = int(labels[COUNT_LABEL])
        except ValueError:
            raise KubeObjectError(f"{where}: label {COUNT_LABEL} is not an integer: {labels[COUNT_LABEL]!r}") from None
    elif GPU_RESOURCE in alloc:
        gpus = int(parse_quantity(alloc[GPU_RESOURCE], f"{where}: allocatable {GPU_RESOURCE}"))
        replicas = int(labels.get(REPLICAS_LABEL, "1") or 1)
        gpus //= max(replicas, 1)
    if gpus == 0:
        return NodeSpec(name, cpu, mem)
    model = model_by_product(product)
    if model is None:
        raise KubeObjectError(f"{where}: label {PRODUCT_LABEL}={product!r} is not a known GPU model")
    blocks = None
    if BLOCKS_LABEL in labels:
        try:
            blocks = tuple(int(x) for x in labels[BLOCKS_LABEL].split(","))
        except ValueError:
            raise KubeObjectError(f"{where}: label {BLOCKS_LABEL} must be comma-separated integers") from None
        if len(blocks) != gpus:
            raise KubeObjectError(f"{where}: label {BLOCKS_LABEL} names {len(blocks)} GPUs, node has {gpus}")
    layouts = _mig_layouts(model, labels.get(MIG_CONFIG_LABEL, ""), mig_counts, gpus, where)
    return NodeSpec(name, cpu, mem, gpus, model.name, blocks, layouts)


def _mig_layouts(model, config: str, counts: dict[str, int], gpus: int, where: str):
    if config and config in MIG_CONFIGS:
        layout = MIG_CONFIGS[config].get(model.name)
        if layout is None and config != "all-disabled":
            raise KubeObjectError(f"{where}: {MIG_CONFIG_LABEL}={config} has no layout for {model.name}")
        if config in ("all-disabled",) or not layout:
            return None
        return tuple(dict(layout) for _ in range(gpus))
    if not any(counts.values()):
        return None
    # Custom config: spread the advertised instances evenly over the GPUs (the MIG manager applies one layout per
    # device filter, so equal per-GPU layouts are the common case).
    per_gpu = {}
    for profile, n in counts.items():
        if n % gpus:
            raise KubeObjectError(f"{where}: {n} x mig-{profile} cannot be split evenly over {gpus} GPUs; "
                                  f"label the node with a known {MIG_CONFIG_LABEL}")
        per_gpu[profile.replace(".me", "+me")] = n // gpus
    try:
        from scoring.gpus import resolve_mig_layout
        resolve_mig_layout(model, per_gpu)
    except MigLayoutError as exc:
        raise KubeObjectError(f"{where}: advertised MIG instances do not fit one GPU: {exc}") from None
    return tuple(dict(per_gpu) for _ in range(gpus))


# -- pods --------------------------------------------------------------------------------------------------------------

def _requests(container: Mapping) -> dict[str, float]:
    res = container.get("resources") or {}
    merged = dict(res.get("limits") or {})  # extended resources are often given as limits only
    merged.update(res.get("requests") or {})
    return merged


def pod_demand(pod: Mapping) -> PodDemand:
    """A PodDemand from a Pod object. Raises KubeObjectError naming the pod and field on bad input."""
    name, labels, annotations = _meta(pod)
    spec = pod.get("spec") or {}
    where = f"pod {name}"
    totals: dict[str, float] = {}
    for c in spec.get("containers") or []:
        for k, v in _requests(c).items():
            totals[k] = totals.get(k, 0.0) + parse_quantity(v, f"{where}: container {c.get('name')} {k}")
    for c in spec.get("initContainers") or []:
        for k, v in _requests(c).items():
            totals[k] = max(totals.get(k, 0.0), parse_quantity(v, f"{where}: init container {c.get('name')} {k}"))
    cpu = int(math.ceil(totals.get("cpu", 0.0) * 1000 - 1e-9))
    mem = int(math.ceil(totals.get("memory", 0.0) / 2**20 - 1e-9))
    gpus = int(totals.get(GPU_RESOURCE, 0))
    mig = [k[len(MIG_RESOURCE_PREFIX):] for k, v in totals.items() if k.startswith(MIG_RESOURCE_PREFIX) and v > 0]
    allowed = _allowed_models(spec, annotations, where)
    if mig:
        if len(mig) > 1 or totals[MIG_RESOURCE_PREFIX + mig[0]] != 1 or gpus:
            raise KubeObjectError(f"{where}: one MIG instance per pod is supported (got {sorted(mig)}, gpus={gpus})")
        return PodDemand(cpu, mem, 1, 0, mig[0].replace(".me", "+me"), allowed, name)
    milli = MILLI
    if GPU_MILLI_ANNOTATION in annotations:
        try:
            milli = int(annotations[GPU_MILLI_ANNOTATION])
        except ValueError:
            raise KubeObjectError(f"{where}: annotation {GPU_MILLI_ANNOTATION} must be an integer") from None
        if not 0 < milli <= MILLI or (milli < MILLI and gpus != 1):
            raise KubeObjectError(f"{where}: annotation {GPU_MILLI_ANNOTATION}={milli} needs 1..1000 and "
                                  f"{GPU_RESOURCE}: 1")
    try:
        return PodDemand(cpu, mem, gpus, milli if gpus else 0, "", allowed, name)
    except ValueError as exc:
        raise KubeObjectError(f"{where}: {exc}") from None


def _allowed_models(spec: Mapping, annotations: Mapping, where: str) -> frozenset[str]:
    names: set[str] = set()
    if GPU_MODELS_ANNOTATION in annotations:
        names |= {x.strip() for x in annotations[GPU_MODELS_ANNOTATION].split(",") if x.strip()}
    selector = (spec.get("nodeSelector") or {}).get(PRODUCT_LABEL)
    if selector:
        names.add(selector)
    affinity = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in affinity.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == PRODUCT_LABEL and expr.get("operator") == "In":
                names |= set(expr.get("values") or [])
    out = set()
    for n in names:
        try:
            out.add(get_model(n).name)
        except KeyError as exc:
            raise KubeObjectError(f"{where}: allowed GPU model: {exc}") from None
    return frozenset(out)


# -- cluster -----------------------------------------------------------------------------------------------------------

def cluster_state(nodes: Iterable[Mapping], pods: Iterable[Mapping] = ()) -> ClusterState:
    """ClusterState with the bound, running pods applied. Pods without a device annotation get the first devices that
    fit (what the device plugin would pick) so that capacity is still accounted for."""
    state = ClusterState([node_spec(n) for n in nodes])
    for pod in pods:
        spec = pod.get("spec") or {}
        node_name = spec.get("nodeName")
        phase = (pod.get("status") or {}).get("phase", "")
        if not node_name or phase in ("Succeeded", "Failed") or node_name not in state.index:
            continue
        demand = pod_demand(pod)
        node = state.index[node_name]
        name, _, annotations = _meta(pod)
        devices = parse_devices(annotations.get(DEVICES_ANNOTATION, ""), f"pod {name}: {DEVICES_ANNOTATION}")
        gpus = tuple(d.gpu for d in devices) if devices else _first_fit(state, node, demand)
        state.place(node, demand, gpus)
    return state


def _first_fit(state: ClusterState, node: int, pod: PodDemand) -> tuple[int, ...]:
    if pod.gpus == 0:
        return ()
    if pod.mig_profile:
        col = state.mig_pos[pod.mig_profile]
        return (int((state.mig_free[node, :, col] > 0).argmax()),)
    if pod.gpu_milli < MILLI:
        return (int((state.gpu_left[node] >= pod.gpu_milli).argmax()),)
    free = [g for g in range(int(state.gpu_count[node])) if state.gpu_left[node, g] == MILLI]
    return tuple(free[: pod.gpus])

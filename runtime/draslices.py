"""The ResourceSlices and DeviceClasses of a pool declared `dra: true` (runtime/pools.py), in the shape the NVIDIA DRA
driver (github.com/NVIDIA/k8s-dra-driver-gpu) publishes on a real node, so that kube-scheduler's DynamicResources
plugin allocates claims on KWOK nodes as it would on GPU nodes; scoring/dra.py reads them back. docs/devices.md
("DRA mode") has the shape and the facts it rests on.

One pool per node, named after the node, `nodeName` set on every slice (as the driver's kubelet plugin does):

  counter slices   `sharedCounters` only (Kubernetes 1.35+ refuses a slice with both counters and devices): one
                   counter set `gpu-<i>-counter-set` per GPU, at most 8 per slice (ResourceSliceMaxCounterSets):
                   `memory` (bytes) and, on a GPU that offers MIG, `compute-slices` (7), `memory-slice-0..7` (1 each)
                   and `media-extensions` (1, when a +me profile is offered)
  device slices    one per GPU (as the driver's split mode, driver.go generateSplitResourceSlices):
                   gpu-<i>                           the whole GPU; consumes all of its counter set
                   gpu-<i>-mig-<p>-<id>-<start>      on a MIG GPU, every placement of every profile the pool's layout
                                                     names (dynamic MIG: the layout's counts are not fixed; any
                                                     non-overlapping mix fits); consumes its compute slices and
                                                     memory slices
                   gpu-<i>-shared                    gpuaas's (not the driver's): the GPU shared by fractions;
                                                     allowMultipleAllocations, consumable capacity `share` (1000
                                                     thousandths; default 1000, 1..1000) and `memory` (bytes; default
                                                     0); consumes all of the counter set once, whatever the number of
                                                     shares, so it excludes the whole GPU and MIG while shared

Attributes are the driver's (deviceinfo.go, mig.go): type, uuid, productName (NVML's spelling), brand, architecture,
cudaComputeCapability, driverVersion, cudaDriverVersion, resource.kubernetes.io/pcieRoot (one root per NUMA group of
the pool's topology); MIG devices carry profile and parentUUID and no uuid (they do not exist until allocated).
"""
from __future__ import annotations

import uuid
from typing import Any

from runtime.pools import GpuSpec, Pool
from scoring.dra import (
    DRIVER,
    GPU_CLASS,
    MEMORY_CAPACITY,
    MEMORY_SLICE_COUNTER,
    MIG_CLASS,
    PCIE_ROOT_ATTRIBUTE,
    SHARE_CAPACITY,
    SHARE_CLASS,
    TYPE_GPU,
    TYPE_MIG,
    TYPE_SHARED,
)
from scoring.gpus import COMPUTE_SLICES, MEMORY_SLICES, MigProfile

DRIVER_VERSION = "580.95.5"  # what the fake nodes say they run (a 580 branch driver, CUDA 13.0)
CUDA_DRIVER_VERSION = "13.0.0"
MAX_COUNTER_SETS = 8  # per ResourceSlice (k8s.io/api/resource/v1 ResourceSliceMaxCounterSets)
COMPUTE_COUNTER = "compute-slices"
MEDIA_COUNTER = "media-extensions"
_UUIDS = uuid.UUID("6f1d7c6e-3c57-4c39-9a51-3f4b2a1e0d11")  # namespace of the fake GPUs' UUIDs

# (architecture, CUDA compute capability) per catalog model; the Alibaba trace's undisclosed models are "unknown".
_ARCH = {
    "A100-40GB": ("Ampere", "8.0.0"), "A100-80GB": ("Ampere", "8.0.0"), "A30": ("Ampere", "8.0.0"),
    "A10": ("Ampere", "8.6.0"), "A10G": ("Ampere", "8.6.0"),
    "H100-80GB": ("Hopper", "9.0.0"), "H200-141GB": ("Hopper", "9.0.0"),
    "L4": ("Ada Lovelace", "8.9.0"), "L40S": ("Ada Lovelace", "8.9.0"),
    "T4": ("Turing", "7.5.0"), "V100-16GB": ("Volta", "7.0.0"), "V100-32GB": ("Volta", "7.0.0"),
    "P100-16GB": ("Pascal", "6.0.0"),
}


def _string(value: str) -> dict[str, str]:
    return {"string": value}


def _version(value: str) -> dict[str, str]:
    return {"version": value}


def gpu_uuid(node: str, index: int) -> str:
    """A stable UUID in NVML's spelling (GPU-xxxxxxxx-...) for GPU `index` of `node`."""
    return f"GPU-{uuid.uuid5(_UUIDS, f'{node}/{index}')}"


def product_name(gpu: GpuSpec) -> str:
    """The NVML name: GFD's label is it with dashes for blanks (NVIDIA-A100-SXM4-80GB <- NVIDIA A100-SXM4-80GB)."""
    return gpu.gpu_model.product.replace("-", " ", 1)


def counter_set(index: int) -> str:
    return f"gpu-{index}-counter-set"  # the driver's GetSharedCounterSetName


def mig_device_name(index: int, profile: MigProfile, start: int) -> str:
    """The driver's canonical MIG device name gpu-<minor>-mig-<profile without dots>-<profile id>-<start>
    (mig.go ToCanonicalName). The GPU-instance profile id is NVML's; gpuaas numbers profiles in catalog order."""
    pname = profile.name.replace(".", "").replace("+", "")
    return f"gpu-{index}-mig-{pname}-{_profile_id(profile)}-{start}"


def _profile_id(profile: MigProfile) -> int:
    # NVML's GPU-instance profile ids for the A100/H100 family (nvidia-smi mig -lgip): 1g 19, 1g+me 20, 1g-double 15,
    # 2g 14, 3g 9, 4g 5, 7g 0.
    if profile.media_extensions:
        return 20
    return {(1, 1): 19, (1, 2): 15, (2, 2): 14, (3, 4): 9, (4, 4): 5, (7, 8): 0}.get(
        (profile.compute_slices, profile.memory_slices), 99)


def _offered_profiles(gpu: GpuSpec) -> list[MigProfile]:
    """The profiles a MIG GPU of the pool offers: those its layout names, in catalog order."""
    names = set(gpu.mig_counts())
    return [p for p in gpu.gpu_model.mig_profiles.values() if p.name in names]


def _memory_bytes(gpu: GpuSpec) -> int:
    return (gpu.memory_mib or gpu.gpu_model.memory_mib) * 2**20


def _pcie_roots(gpu: GpuSpec) -> list[str]:
    size = gpu.topology.numa_node or gpu.count
    return [f"pci0000:{(i // size) * 0x10:02x}" for i in range(gpu.count)]


def _counters(gpu: GpuSpec, mig: bool) -> dict[str, dict[str, str]]:
    counters = {MEMORY_CAPACITY: {"value": str(max(_memory_bytes(gpu), 1))}}
    if mig:
        counters[COMPUTE_COUNTER] = {"value": str(COMPUTE_SLICES)}
        counters.update({MEMORY_SLICE_COUNTER.format(s): {"value": "1"} for s in range(MEMORY_SLICES)})
        if any(p.media_extensions for p in _offered_profiles(gpu)):
            counters[MEDIA_COUNTER] = {"value": "1"}
    return counters


def _gpu_attributes(gpu: GpuSpec, node: str, index: int, pcie_root: str) -> dict[str, Any]:
    arch, capability = _ARCH.get(gpu.gpu_model.name, ("unknown", "0.0.0"))
    return {
        "type": _string(TYPE_GPU), "uuid": _string(gpu_uuid(node, index)), "productName": _string(product_name(gpu)),
        "brand": _string("Nvidia"), "architecture": _string(arch), "cudaComputeCapability": _version(capability),
        "driverVersion": _version(DRIVER_VERSION), "cudaDriverVersion": _version(CUDA_DRIVER_VERSION),
        PCIE_ROOT_ATTRIBUTE: _string(pcie_root),
    }


def gpu_devices(gpu: GpuSpec, node: str, index: int, mig: bool) -> list[dict[str, Any]]:
    """The devices of GPU `index`: whole GPU, MIG partitions (if `mig`), shared GPU."""
    pcie_root = _pcie_roots(gpu)[index]
    attrs = _gpu_attributes(gpu, node, index, pcie_root)
    counters = _counters(gpu, mig)
    everything = [{"counterSet": counter_set(index), "counters": counters}]
    memory = str(_memory_bytes(gpu))
    devices: list[dict[str, Any]] = [{"name": f"gpu-{index}", "attributes": attrs,
                                      "capacity": {MEMORY_CAPACITY: {"value": memory}},
                                      "consumesCounters": everything}]
    if mig:
        mig_attrs = {k: v for k, v in attrs.items() if k not in ("type", "uuid")}
        for profile in _offered_profiles(gpu):
            for start in profile.starts:
                used = {COMPUTE_COUNTER: {"value": str(profile.compute_slices)}}
                used.update({MEMORY_SLICE_COUNTER.format(s): {"value": "1"}
                             for s in range(start, start + profile.memory_slices)})
                if profile.media_extensions:
                    used[MEDIA_COUNTER] = {"value": "1"}
                devices.append({
                    "name": mig_device_name(index, profile, start),
                    "attributes": {"type": _string(TYPE_MIG), "profile": _string(profile.name),
                                   "parentUUID": attrs["uuid"], **mig_attrs},
                    "capacity": {MEMORY_CAPACITY: {"value": str(profile.memory_gb * 2**30)}},
                    "consumesCounters": [{"counterSet": counter_set(index), "counters": used}],
                })
    devices.append({
        "name": f"gpu-{index}-shared",
        "attributes": {**attrs, "type": _string(TYPE_SHARED)},
        "allowMultipleAllocations": True,
        "capacity": {
            SHARE_CAPACITY: {"value": "1000", "requestPolicy": {
                "default": "1000", "validRange": {"min": "1", "max": "1000", "step": "1"}}},
            MEMORY_CAPACITY: {"value": memory, "requestPolicy": {"default": "0", "validRange": {"min": "0"}}},
        },
        "consumesCounters": everything,
    })
    return devices


def slice_name(node: str, i: int) -> str:
    return f"{node}-{DRIVER}-{i}"


def resource_slices(pool: Pool, node: str, generation: int = 1) -> list[dict[str, Any]]:
    """The ResourceSlices of one node of a DRA pool (none for a CPU-only pool or one without `dra`). No owner
    reference: who creates them adds the Node's (as the kubelet plugin does, so they go with the node)."""
    gpu = pool.gpu
    if gpu is None or not pool.dra:
        return []
    mig_gpus = set(range(gpu.count - gpu.mig_enabled_gpus, gpu.count))  # the last migGPUs GPUs, as node_objects says
    specs: list[dict[str, Any]] = []
    sets = [{"name": counter_set(i), "counters": _counters(gpu, i in mig_gpus)} for i in range(gpu.count)]
    for k in range(0, len(sets), MAX_COUNTER_SETS):
        specs.append({"sharedCounters": sets[k:k + MAX_COUNTER_SETS]})
    for i in range(gpu.count):
        specs.append({"devices": gpu_devices(gpu, node, i, i in mig_gpus)})
    return [{
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, n)},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": len(specs)}, **spec},
    } for n, spec in enumerate(specs)]


def device_classes() -> list[dict[str, Any]]:
    """The NVIDIA driver's DeviceClasses gpu.nvidia.com and mig.nvidia.com, and gpuaas's gpu-share.gpuaas.io. No
    extendedResourceName on gpu.nvidia.com (the driver's chart sets nvidia.com/gpu): with it, kube-scheduler
    (DRAExtendedResource, on in 1.36) would also place pods asking for nvidia.com/gpu on DRA nodes, past the device
    plugin's accounting gpuaas keeps."""
    def cls(name: str, kind: str) -> dict[str, Any]:
        expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}
    return [cls(GPU_CLASS, TYPE_GPU), cls(MIG_CLASS, TYPE_MIG), cls(SHARE_CLASS, TYPE_SHARED)]

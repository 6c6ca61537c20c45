"""Declarative GPU node pools and the Node objects they become: the local cluster's pool spec and the node scaler's
node-group templates (a pool without name and count) are rendered here, in the runtime layer both share.

A pool spec is YAML:

    pools:
    - name: a100                 # DNS label; nodes are named <name>-0000, <name>-0001, ...
      count: 4
      gpu:
        model: A100-80GB         # a name or product label from scoring.gpus
        count: 8                 # GPUs per node
        memoryMiB: 81920         # optional; the model's memory by default
        mig: all-1g.10gb         # optional; a MIG-manager config name, or a per-GPU layout {1g.10gb: 7}
        migGPUs: 8               # optional; how many of the GPUs have MIG enabled (default: all when mig is set)
        replicas: 4              # optional; time-slicing: each GPU without MIG is 4 nvidia.com/gpu devices (default 1)
        shares: false            # optional; a sharing device plugin serves gpuaas.io/gpu-share (GPU shares go here)
        topology: {nvlinkDomain: 8, numaNode: 4}   # GPUs per NVLink domain and per NUMA node
      cpu: "96"
      memory: 1Ti
      pods: 110
      labels: {team: research}
      taints: [{key: dedicated, value: research, effect: NoSchedule}]
      dra: false                 # optional: GPUs as DRA ResourceSlices (runtime/draslices.py), not extended resources
      autoscale:                 # optional: a node group `gpuaas nodescaler` grows and shrinks (count = initial size)
        minSize: 0
        maxSize: 6
        provisioningDelaySeconds: 30   # a new node's GPUs are allocatable this long after the grow request
        costPerHour: 32.77

Every field is checked before any process starts; an unknown field, a negative count or a MIG layout that does not fit
the GPU model is refused with a message naming the field. The nodes carry what GPU feature discovery and the NVIDIA
device plugin (MIG strategy `mixed`) publish on a real node; with `replicas: R` > 1, what they publish when the device
plugin's sharing config time-slices `nvidia.com/gpu` into R replicas: `nvidia.com/gpu.replicas: R`,
`nvidia.com/gpu.sharing-strategy: time-slicing`, the product label with `-SHARED` appended, and R `nvidia.com/gpu`
devices per GPU without MIG (scoring/model.py, "Time-slicing"). With `shares: true` the nodes advertise
`gpuaas.io/gpu-share` (1000 per GPU without MIG), as a sharing device plugin serving gpuaas's shares would: only such
nodes take GPU-share pods (scoring/model.py, "Shares").

The Node objects rendered here are provider-neutral: no provider ID and nothing a node provider needs to play or
create them. Who creates nodes adds its own: `nodescaler.provider.kwok_node` turns them into nodes kwok plays (the
KWOK node provider's new nodes and the local cluster's pools, gpuaas/cluster/local.py).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from kubernetes.utils.quantity import parse_quantity
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel

from scoring import gpus
from scoring.dra import DRA_LABEL
from scoring.kubeobjects import (
    COUNT_LABEL,
    GPU_RESOURCE,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    POOL_LABEL,
    PRODUCT_LABEL,
    REPLICAS_LABEL,
    SHARE_RESOURCE,
    SHARING_STRATEGY_LABEL,
    TOPOLOGY_ANNOTATION,
)
from scoring.model import MILLI

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class PoolSpecError(ValueError):
    """A pool spec that cannot become nodes; the message names the offending field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class Taint(_Strict):
    key: str = Field(min_length=1, description="taint key")
    value: str = Field("", description="taint value")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(description="what the taint does to pods "
                                                                           "that do not tolerate it")


class Topology(_Strict):
    nvlink_domain: int | None = Field(default=None, ge=1, alias="nvlinkDomain", description="GPUs per NVLink domain; "
                                      "divides gpu.count; unset: all GPUs in one domain")
    numa_node: int | None = Field(default=None, ge=1, alias="numaNode", description="GPUs per NUMA node; divides "
                                  "gpu.count; unset: all GPUs on one NUMA node")


class GpuSpec(_Strict):
    model: str = Field(description="GPU model: a catalog name or `nvidia.com/gpu.product` label (listed below)")
    count: int = Field(ge=1, le=16, description="GPUs per node")
    memory_mib: int | None = Field(default=None, ge=1, alias="memoryMiB", description="memory per GPU "
                                   "(`nvidia.com/gpu.memory`); unset: the model's")
    mig: str | dict[str, int] | None = Field(default=None, description="MIG layout of each MIG-enabled GPU: a "
                                             "MIG-manager config name (`all-1g.10gb`) or {profile: count}; it must "
                                             "fit the model; unset: MIG off")
    mig_gpus: int | None = Field(default=None, ge=0, alias="migGPUs", description="how many of the GPUs have MIG "
                                 "enabled, at most count; unset: all when mig is set")
    topology: Topology = Field(default=Topology(), description="NVLink and NUMA grouping of the GPUs (the "
                               "`gpuaas.io/gpu-topology` annotation)")
    replicas: int = Field(default=1, ge=1, le=1000, description="time-slicing replicas per GPU (the device plugin's "
                          "`sharing.timeSlicing`): each GPU without MIG is advertised as this many `nvidia.com/gpu` "
                          "devices, one replica (1/replicas of the GPU) each, with the labels GPU feature discovery "
                          "writes (`nvidia.com/gpu.replicas`, `-SHARED` on `nvidia.com/gpu.product`); 1: exclusive "
                          "GPUs")
    shares: bool = Field(default=False, description="a sharing device plugin on the node serves `gpuaas.io/gpu-share` "
                         "(advertised as 1000 per GPU without MIG) and honours the GPU gpuaas records in "
                         "`gpuaas.io/devices`: GPU shares may go there. Without it no share is placed on the node "
                         "(the kubelet would start the pod without a GPU; docs/devices.md)")

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        try:
            gpus.get_model(value)
        except gpus.UnknownGpuModelError as err:  # a KeyError, which pydantic would not report as a field error
            raise ValueError(str(err)) from None
        return value

    @field_validator("mig")
    @classmethod
    def _mig_fits(cls, value: str | dict[str, int] | None, info: ValidationInfo) -> str | dict[str, int] | None:
        if value is not None and "model" in info.data:  # (no model: that error is reported already)
            gpus.resolve_mig_layout(gpus.get_model(info.data["model"]), value)  # MigLayoutError names why
        return value

    @model_validator(mode="after")
    def _counts_fit(self) -> GpuSpec:
        if self.mig_gpus is not None and self.mig_gpus > self.count:
            raise ValueError(f"migGPUs {self.mig_gpus} is more than the node's {self.count} GPUs")
        if self.mig is None and self.mig_gpus:
            raise ValueError("migGPUs is set but mig (the layout) is not")
        if self.shares and self.replicas > 1:
            raise ValueError(f"shares and replicas {self.replicas}: a time-slicing device plugin hands out replicas of "
                             "nvidia.com/gpu only; ask for nvidia.com/gpu: 1 for a replica")
        if self.shares and self.mig_enabled_gpus == self.count:
            raise ValueError("shares is set but every GPU has MIG enabled: shares go on GPUs without MIG")
        for size, what in ((self.topology.nvlink_domain, "nvlinkDomain"), (self.topology.numa_node, "numaNode")):
            if size is not None and self.count % size:
                raise ValueError(f"topology.{what} {size} does not divide the node's {self.count} GPUs")
        return self

    @property
    def gpu_model(self) -> gpus.GpuModel:
        return gpus.get_model(self.model)

    @property
    def mig_enabled_gpus(self) -> int:
        if self.mig is None:
            return 0
        return self.count if self.mig_gpus is None else self.mig_gpus

    def mig_counts(self) -> dict[str, int]:
        """Instances of each profile on one MIG-enabled GPU."""
        counts: dict[str, int] = {}
        for placement in gpus.resolve_mig_layout(self.gpu_model, self.mig) if self.mig is not None else ():
            counts[placement.profile] = counts.get(placement.profile, 0) + 1
        return counts

    def mig_config_label(self) -> str:
        """The `nvidia.com/mig.config` value: the MIG-manager config name, or a spelled-out custom layout."""
        if self.mig is None:
            return "all-disabled"
        if isinstance(self.mig, str):
            return self.mig
        return "custom-" + "-".join(f"{n}x{p}" for p, n in sorted(self.mig.items()))


class Autoscale(_Strict):
    """A pool that is also a node group of `gpuaas nodescaler` (nodescaler/config.py NodeGroupConfig)."""
    min_size: int = Field(default=0, ge=0, description="the group never shrinks below this many nodes")
    max_size: int = Field(ge=1, description="the group never grows beyond this many nodes")
    provisioning_delay_s: float = Field(default=0.0, ge=0, alias="provisioningDelaySeconds",
                                        description="seconds from a grow request until a new node's GPUs are "
                                        "allocatable")
    cost_per_hour: float = Field(gt=0, description="price of one node per hour, which scale-out minimises")

    @model_validator(mode="after")
    def _order(self) -> Autoscale:
        if self.min_size > self.max_size:
            raise ValueError(f"minSize {self.min_size} is more than maxSize {self.max_size}")
        return self


class Pool(_Strict):
    name: str = Field(description="DNS label of at most 40 characters; nodes are named <name>-0000, <name>-0001, ...")
    count: int = Field(ge=0, le=5000, description="nodes in the pool")
    gpu: GpuSpec | None = Field(default=None, description="the GPUs of each node; unset: a CPU-only pool")
    cpu: str = Field("64", description="allocatable CPU per node (a Kubernetes quantity)")
    memory: str = Field("512Gi", description="allocatable memory per node (a Kubernetes quantity)")
    pods: int = Field(default=110, ge=1, description="allocatable pods per node")
    labels: dict[str, str] = Field({}, description="extra node labels")
    taints: list[Taint] = Field([], description="node taints")
    autoscale: Autoscale | None = Field(default=None, description="make the pool a node group the nodescaler grows "
                                        "and shrinks (the demo turns it into a group of `gpuaas nodescaler`)")
    dra: bool = Field(default=False, description="the GPUs are published by the NVIDIA DRA driver (ResourceSlices of "
                      "`gpu.nvidia.com`, claimed through ResourceClaims; docs/devices.md) instead of the device "
                      "plugin's extended resources; MIG is then partitioned at allocation, `mig` naming the profiles "
                      "offered")

    @model_validator(mode="after")
    def _count_within_group_bounds(self) -> Pool:
        a = self.autoscale
        if a is not None and not a.min_size <= self.count <= a.max_size:
            raise ValueError(f"count {self.count} is outside autoscale [minSize {a.min_size}, maxSize {a.max_size}]")
        return self

    @model_validator(mode="after")
    def _dra_pool(self) -> Pool:
        if self.dra and self.gpu is None:
            raise ValueError("dra is set on a pool without GPUs")
        if self.dra and self.gpu is not None and self.gpu.shares:
            raise ValueError("gpu.shares is a sharing device plugin's; a dra pool shares GPUs through claims of class "
                             "gpu-share.gpuaas.io")
        return self

    @model_validator(mode="after")
    def _replicas_need_the_device_plugin(self) -> Pool:
        if self.dra and self.gpu is not None and self.gpu.replicas > 1:
            raise ValueError(f"gpu.replicas {self.gpu.replicas} is the device plugin's time-slicing; a dra pool's GPUs "
                             "are not nvidia.com/gpu devices (share them through claims)")
        return self

    def template(self) -> dict[str, Any]:
        """The pool without name, count and autoscale: a node-group template (what each node of the pool is)."""
        return self.model_dump(by_alias=True, exclude={"name", "count", "autoscale"}, exclude_defaults=True)

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError(f"{value!r} is not a DNS label of at most 40 characters (lower case, digits, '-')")
        return value

    @field_validator("cpu", "memory", mode="before")
    @classmethod
    def _quantity(cls, value: Any) -> str:
        text = str(value)
        try:
            if parse_quantity(text) <= 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"{text!r} is not a positive Kubernetes quantity (e.g. 96, 500m, 1Ti)") from None
        return text

    @field_validator("labels")
    @classmethod
    def _label_values(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if len(value) > 63 or not _LABEL_VALUE.match(value):
                raise ValueError(f"label {key}: value {value!r} is not a valid label value")
        return labels


class PoolSpec(_Strict):
    pools: list[Pool] = Field(min_length=1, description="the node pools, each name once")

    @model_validator(mode="after")
    def _unique_names(self) -> PoolSpec:
        seen = set()
        for pool in self.pools:
            if pool.name in seen:
                raise ValueError(f"pool name {pool.name!r} is used twice")
            seen.add(pool.name)
        return self

    @property
    def node_count(self) -> int:
        return sum(p.count for p in self.pools)


def _format_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".") or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        lines.append(f"{where}: {msg.removeprefix('Value error, ')}")
    return "invalid pool spec:\n  " + "\n  ".join(lines)


def parse_pool_spec(data: Any) -> PoolSpec:
    """Validate a pool spec (already parsed from YAML); raise PoolSpecError naming every bad field."""
    try:
        return PoolSpec.model_validate(data)
    except ValidationError as err:
        raise PoolSpecError(_format_error(err)) from None


def load_pool_spec(path: Path | str) -> PoolSpec:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise PoolSpecError(f"{path}: not valid YAML: {err}") from None
    except OSError as err:
        raise PoolSpecError(f"{path}: {err.strerror}") from None
    try:
        return parse_pool_spec(data)
    except PoolSpecError as err:
        raise PoolSpecError(f"{path}: {err}") from None


def _groups(count: int, size: int | None) -> list[list[int]]:
    size = size or count
    return [list(range(i, min(i + size, count))) for i in range(0, count, size)]


def node_objects(pool: Pool) -> list[dict[str, Any]]:
    """The Node objects of one pool, as a real GPU node with GFD and the device plugin (mixed strategy) shows them;
    provider-neutral (no provider ID, nothing kwok needs: nodescaler.provider.kwok_node adds that)."""
    labels = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", POOL_LABEL: pool.name}
    annotations: dict[str, str] = {}
    resources: dict[str, str] = {"cpu": pool.cpu, "memory": pool.memory, "pods": str(pool.pods)}
    if pool.gpu is not None:
        g = pool.gpu
        model = g.gpu_model
        mig_gpus = g.mig_enabled_gpus
        labels.update({
            "nvidia.com/gpu.present": "true",
            PRODUCT_LABEL: model.product,
            COUNT_LABEL: str(g.count),
            "nvidia.com/gpu.memory": str(g.memory_mib or model.memory_mib),
            REPLICAS_LABEL: str(g.replicas),
        })
        if g.replicas > 1:  # what GFD writes for a time-sliced nvidia.com/gpu (renameByDefault off)
            labels.update({PRODUCT_LABEL: model.product + gpus.SHARED_SUFFIX, SHARING_STRATEGY_LABEL: "time-slicing"})
        if model.mig_capable and pool.dra:  # no MIG manager: the DRA driver partitions GPUs as claims ask
            labels["nvidia.com/mig.capable"] = "true"
        elif model.mig_capable:
            labels.update({"nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed",
                           MIG_CONFIG_LABEL: g.mig_config_label(), MIG_STATE_LABEL: "success"})
        # Mixed strategy: whole GPUs as nvidia.com/gpu (each `replicas` devices when time-sliced), each MIG instance
        # as nvidia.com/mig-<profile>. A DRA pool advertises no GPU resource: its GPUs are ResourceSlices
        # (runtime/draslices.py).
        if pool.dra:
            labels[DRA_LABEL] = "true"
        else:
            resources[GPU_RESOURCE] = str((g.count - mig_gpus) * g.replicas)
            if g.shares:  # what a sharing device plugin serving gpuaas.io/gpu-share advertises: thousandths per GPU
                resources[SHARE_RESOURCE] = str((g.count - mig_gpus) * MILLI)
        for profile, per_gpu in ({} if pool.dra else g.mig_counts()).items():
            resource = model.mig_profile(profile).resource_name
            resources[resource] = str(per_gpu * mig_gpus)
            labels[f"{resource}.count"] = str(per_gpu * mig_gpus)
        annotations[TOPOLOGY_ANNOTATION] = json.dumps(
            {"nvlinkDomains": _groups(g.count, g.topology.nvlink_domain),
             "numaNodes": _groups(g.count, g.topology.numa_node)}, separators=(",", ":"))
    labels.update(pool.labels)
    taints = [t.model_dump(exclude_defaults=False) for t in pool.taints]
    nodes = []
    for i in range(pool.count):
        name = f"{pool.name}-{i:04d}"
        nodes.append({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {**labels, "kubernetes.io/hostname": name},
                         "annotations": dict(annotations)},
            "spec": {"taints": taints} if taints else {},
            "status": {"capacity": dict(resources), "allocatable": dict(resources),
                       "phase": "Running"},
        })
    return nodes


def spec_node_objects(spec: PoolSpec) -> list[dict[str, Any]]:
    return [node for pool in spec.pools for node in node_objects(pool)]


def pools_from_node_specs(specs: list, prefix: str = "n", *, dra: bool = False) -> PoolSpec:
    """A pool spec that mirrors a list of model nodes (scoring.model.NodeSpec, e.g. a trace's cluster): one pool per
    distinct (GPU model, GPUs, CPU, memory), in order of first appearance. `dra`: the GPU pools are declared `dra:
    true` (their GPUs published as ResourceSlices)."""
    groups: dict[tuple, int] = {}
    for s in specs:
        key = (s.gpu_model if s.gpus else "", s.gpus, s.cpu_milli, s.memory_mib, s.gpu_replicas if s.gpus else 1,
               s.gpu_shares and s.gpus > 0 and s.gpu_replicas == 1)
        groups[key] = groups.get(key, 0) + 1
    pools = []
    for i, ((model, per_node, cpu, mem, replicas, shares), count) in enumerate(groups.items()):
        name = f"{prefix}{i}-{model.lower().replace('_', '-')}x{per_node}" if per_node else f"{prefix}{i}-cpu"
        pool: dict[str, Any] = {"name": re.sub(r"[^a-z0-9-]", "-", name)[:40].strip("-"), "count": count,
                                "cpu": f"{cpu}m", "memory": f"{mem}Mi", "pods": 1000}
        if per_node:
            pool["gpu"] = {"model": model, "count": per_node, **({"replicas": replicas} if replicas > 1 else {})}
            if dra:
                pool["dra"] = True
            if shares and not pool.get("dra"):  # the model's nodes give shares (NodeSpec.gpu_shares): a sharing
                pool["gpu"]["shares"] = True    # device plugin (a DRA pool shares through claims)
        pools.append(pool)
    return parse_pool_spec({"pools": pools})

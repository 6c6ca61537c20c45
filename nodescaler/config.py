"""Configuration of `gpuaas nodescaler`: node groups, scale-out, scale-in, leader election.

A node group's `template` is a pool of `runtime/pools.py` without name and count (GPU model, GPUs per node, MIG
layout, CPU, memory, labels, taints): the same validation, and for KWOK the same renderer of Node objects. Nodes belong
to a group by the label `gpuaas.io/pool: <group name>`, as pool nodes do.

    interval_s: 10
    groups:
    - name: a100x8
      template: {gpu: {model: A100-80GB, count: 8}, cpu: "128", memory: 1Ti}
      min_size: 0
      max_size: 100
      provisioning_delay_s: 90      # KWOK provider: GPUs become allocatable this long after the grow request
      max_provision_s: 900          # a node never GPU-ready by then counts as failed: group backs off
      cost_per_hour: 32.8
    - name: h100x8                  # nodes from Karpenter: standalone NodeClaims (nodescaler/karpenter.py)
      template: {gpu: {model: H100-80GB, count: 8}, cpu: "192", memory: 2Ti}
      max_size: 32
      cost_per_hour: 98.3
      provider: karpenter
      karpenter: {instance_type: p5.48xlarge, node_class: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: gpu}}
    - name: l40sx4                  # nodes from Cluster API: a MachineDeployment's replicas (nodescaler/clusterapi.py)
      template: {gpu: {model: L40S, count: 4}, cpu: "64", memory: 512Gi}
      max_size: 20
      cost_per_hour: 8.0
      provider: clusterapi
      clusterapi: {namespace: fleet, machine_deployment: gpu-l40s}
    scale_in: {utilization_threshold: 0.5, unneeded_s: 600}

Loaded with runtime.config.load_config (file, then GPUAAS_NODESCALER_* environment variables).
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runtime.config import ConfigError, load_config
from runtime.draslices import resource_slices
from runtime.leader import LeaderElectionConfig as LeaseConfig
from runtime.pools import Pool, PoolSpecError, node_objects, parse_pool_spec
from scoring.dra import dra_node, dra_node_spec
from scoring.dramodel import dra_cluster, dra_model
from scoring.kubeobjects import node_spec
from scoring.model import ClusterState, NodeSpec
from scoring.policies import known_policy

ENV_PREFIX = "GPUAAS_NODESCALER_"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


PROVIDERS = ("kwok", "karpenter", "clusterapi")
PROVIDER_PATTERN = "^(kwok|karpenter|clusterapi)$"


class NodeClassRef(_Strict):
    group: str = Field(default="karpenter.kwok.sh", min_length=1, description="API group of the node class "
                       "(`karpenter.k8s.aws` for EC2NodeClass on EKS)")
    kind: str = Field(default="KWOKNodeClass", min_length=1, description="kind of the node class "
                      "(`EC2NodeClass` on EKS)")
    name: str = Field(default="default", min_length=1, description="name of the node class object")


class KarpenterGroupConfig(_Strict):
    """How a node of the group is asked of Karpenter: one standalone NodeClaim per node (nodescaler/karpenter.py)."""

    instance_type: str = Field(min_length=1, description="the instance type a node of the group is: the NodeClaim's "
                               "requirement `node.kubernetes.io/instance-type In [it]`; the template must describe "
                               "what that instance type offers")
    node_class: NodeClassRef = Field(default=NodeClassRef(), description="the NodeClaim's nodeClassRef (the "
                                     "provider-specific settings: AMI, subnets, ...); must exist, or the launch "
                                     "fails and the group backs off")
    requirements: list[dict[str, Any]] = Field(default_factory=list, description="more NodeClaim requirements "
                                               "(`{key, operator, values}`), e.g. `karpenter.sh/capacity-type In "
                                               "[on-demand]` or a zone; not the instance type")
    termination_grace_period_s: int | None = Field(default=None, ge=0, description="the NodeClaim's "
                                                   "terminationGracePeriod: how long Karpenter's own drain of a "
                                                   "deleted NodeClaim may wait on pods (gpuaas has drained it first); "
                                                   "null: Karpenter waits as long as it takes")

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for r in v:
            if set(r) - {"key", "operator", "values", "minValues"} or not r.get("key") or not r.get("operator"):
                raise ValueError(f"requirement {r}: needs key and operator (and values), nothing else")
            if r["key"] == "node.kubernetes.io/instance-type":
                raise ValueError("the instance type is karpenter.instance_type, not a requirement")
        return v


# InfrastructureReady reasons that mean the instance will not come: the test infrastructure provider's
# (gpuaas/cluster/clusterapi.py) and common ones of cloud providers.
LAUNCH_FAILURE_REASONS = ("InsufficientCapacity", "InstanceProvisionFailed", "InstanceCreateFailed",
                          "LaunchFailed", "Failed")


class ClusterAPIGroupConfig(_Strict):
    """The MachineDeployment whose nodes the group's are (nodescaler/clusterapi.py): scaled through `/scale`."""

    namespace: str = Field(default="default", min_length=1, description="namespace of the MachineDeployment")
    machine_deployment: str = Field(min_length=1, description="name of the MachineDeployment; its nodes must carry "
                                    "the label `gpuaas.io/pool: <group name>` (kubelet's node labels in the "
                                    "bootstrap config)")
    launch_failure_reasons: list[str] = Field(default_factory=lambda: list(LAUNCH_FAILURE_REASONS),
                                              description="reasons of a Machine's `InfrastructureReady` condition "
                                              "(status False, mirrored from the infrastructure machine's `Ready`) "
                                              "that mean its instance will not come (the v1beta2 contract has no "
                                              "terminal failure field): the group backs off and the Machine is "
                                              "withdrawn. Any other reason waits up to max_provision_s")



class NodeGroupConfig(_Strict):
    name: str = Field(description="group name; its nodes carry the label `gpuaas.io/pool: <name>`")
    template: dict[str, Any] = Field(description="what a node of the group is: a pool of the pool spec without "
                                     "`name` and `count` (`gpu`, `cpu`, `memory`, `pods`, `labels`, `taints`)")
    min_size: int = Field(default=0, ge=0, description="scale-in never goes below this many nodes")
    max_size: int = Field(ge=0, description="scale-out never goes above this many nodes; at least min_size")
    provisioning_delay_s: float = Field(default=0.0, ge=0, description="KWOK provider: the new node's GPUs become "
                                        "allocatable this long after the grow request")
    max_provision_s: float = Field(default=900.0, gt=0, description="a new node that has not been GPU-ready (Ready, "
                                   "GPUs allocatable) by then counts as a failed provision: the group backs off and "
                                   "the node is deleted, unless pods other than DaemonSet pods are bound to it. A "
                                   "node that was GPU-ready once and goes unready is never a failed provision (see "
                                   "scale_in.unready_drain_s)")
    cost_per_hour: float = Field(gt=0, description="price of one node; scale-out buys the cheapest set of nodes")
    provider: str | None = Field(default=None, pattern=PROVIDER_PATTERN, description="where this group's nodes "
                                 "come from: `kwok` (Node objects kwok plays: local clusters, demos), `karpenter` "
                                 "(standalone NodeClaims: Karpenter launches and registers the node) or `clusterapi` "
                                 "(a MachineDeployment's replicas); null: the top-level `provider`")
    karpenter: KarpenterGroupConfig | None = Field(default=None, description="provider `karpenter`: the instance "
                                                   "type and node class of the NodeClaims")
    clusterapi: ClusterAPIGroupConfig | None = Field(default=None, description="provider `clusterapi`: the "
                                                     "MachineDeployment of the group")

    @model_validator(mode="after")
    def _check(self) -> NodeGroupConfig:
        if self.provider == "karpenter" and self.karpenter is None:
            raise ValueError(f"group {self.name}: provider karpenter needs a karpenter section (instance_type)")
        if self.provider == "clusterapi" and self.clusterapi is None:
            raise ValueError(f"group {self.name}: provider clusterapi needs a clusterapi section "
                             "(machine_deployment)")
        if self.min_size > self.max_size:
            raise ValueError(f"group {self.name}: min_size {self.min_size} is more than max_size {self.max_size}")
        for key in ("name", "count"):
            if key in self.template:
                raise ValueError(f"group {self.name}: template.{key} is not allowed (the group sets it)")
        try:
            parse_pool_spec({"pools": [{**self.template, "name": self.name, "count": 1}]})
        except PoolSpecError as err:
            raise ValueError(f"group {self.name}: template: " + str(err).replace("pools[0].", "").replace(
                "invalid pool spec:\n  ", "").replace("\n  ", "; ")) from None
        return self

    @classmethod
    def from_pool(cls, pool: Pool) -> NodeGroupConfig:
        """The node group a pool spec declares with `autoscale:` (runtime/pools.py)."""
        if pool.autoscale is None:
            raise ValueError(f"pool {pool.name} has no autoscale section: it is not a node group")
        a = pool.autoscale
        return cls(name=pool.name, template=pool.template(), min_size=a.min_size, max_size=a.max_size,
                   provisioning_delay_s=a.provisioning_delay_s, cost_per_hour=a.cost_per_hour)

    @property
    def pool(self) -> Pool:
        """The template as a one-node pool (the renderer of runtime/pools.py takes pools)."""
        return Pool.model_validate({**self.template, "name": self.name, "count": 1})

    @cached_property
    def rendered_node(self) -> dict[str, Any]:
        # cached_property writes the instance's __dict__ directly: pydantic's frozen check (in __setattr__) is not
        # involved, and the cache is not a field (not validated, dumped or compared).
        return node_objects(self.pool)[0]

    @cached_property
    def rendered_slices(self) -> list[dict[str, Any]]:
        """A DRA group's node's ResourceSlices, as the driver publishes them (runtime/draslices.py); [] otherwise."""
        return resource_slices(self.pool, self.rendered_node["metadata"]["name"])

    @cached_property
    def rendered_spec(self) -> NodeSpec:
        if self.pool.dra:  # the GPUs are the slices' (scoring.dra), as the extender's and the gangs' models read them
            return dra_node_spec(self.rendered_node, self.rendered_slices)
        return node_spec(self.template_node())  # scoring.kubeobjects.node_spec (the module's, not this method)

    @cached_property
    def pcie_roots(self) -> tuple[str, ...]:
        """A DRA group's node's PCIe root per GPU, as its slices publish them (`resource.kubernetes.io/pcieRoot`);
        () for other groups."""
        if not self.pool.dra:
            return ()
        return tuple(g.pcie_root for g in dra_node(self.rendered_node["metadata"]["name"], self.rendered_slices).gpus)

    def template_node(self) -> dict[str, Any]:
        """The Node object the template renders (runtime/pools.node_objects), computed once; a copy each call."""
        return copy.deepcopy(self.rendered_node)

    def node_spec(self, name: str, mig_wanted: Mapping[str, int] | None = None) -> NodeSpec:
        """The model of one node of this group, read back from the Node object the template renders, so the model of
        an upcoming node is exactly what scoring.kubeobjects (scoring.dra for a DRA group) will read once the node is
        there. `mig_wanted` (MIG profile -> pods waiting for one): a DRA node's GPUs are partitioned only as claims
        ask, so its idle GPUs that offer those profiles are opened for them, as few as cover the wait, as the gang
        controller opens a live node's (scoring.dramodel.dra_model); no effect on other groups."""
        wanted = tuple(sorted((p, n) for p, n in (mig_wanted or {}).items() if n > 0))
        spec = self._opened_spec(wanted) if wanted and self.pool.dra else self.rendered_spec
        return dataclasses.replace(spec, name=name)

    def _opened_spec(self, wanted: tuple[tuple[str, int], ...]) -> NodeSpec:
        cache = self.__dict__.setdefault("_opened", {})  # as cached_property: not a field
        if wanted not in cache:
            name = self.rendered_node["metadata"]["name"]
            model = dra_model(ClusterState([self.rendered_spec]), {name: self.rendered_node},
                              dra_cluster(self.rendered_slices, ()), self.rendered_slices, dict(wanted))
            cache[wanted] = model.state.nodes[0]
        spec: NodeSpec = cache[wanted]
        return spec

    def template_constraints(self) -> tuple[dict[str, str], tuple]:
        """(labels, taints) of a node of this group, for the pods' nodeSelector, affinity and tolerations."""
        from scoring.constraints import node_taints

        node = self.template_node()
        return node["metadata"]["labels"], node_taints(node)


class ScaleOutConfig(_Strict):
    enabled: bool = Field(default=True, description="grow groups and repartition MIG for unschedulable GPU pods")
    mig_repartition: bool = Field(default=True, description="reconfigure idle MIG nodes for pending MIG pods "
                                  "before buying nodes")
    planner_time_limit_s: float = Field(default=0.5, gt=0, description="per planner call (MIG, new nodes); past it "
                                        "the greedy answer is used")
    policy: str = Field(default="gpuaas", description="scoring policy of the what-if placements (as the extender's)")
    backoff_initial_s: float = Field(default=300.0, gt=0, description="first back-off of a group whose node failed "
                                     "to provision; doubles per failure (cluster-autoscaler's defaults)")
    backoff_max_s: float = Field(default=1800.0, gt=0, description="longest back-off of a group")
    # Pods younger than this are not acted on, so that one reconcile sees a burst whole (Karpenter batches 1 s).
    new_pod_delay_s: float = Field(default=0.0, ge=0, description="pods pending for less than this are left to the "
                                   "next reconcile")

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        return known_policy(v)


class ScaleInConfig(_Strict):
    enabled: bool = Field(default=True, description="drain and remove idle GPU nodes (and long-unready ones)")
    utilization_threshold: float = Field(default=0.5, ge=0, le=1, description="a node whose GPU requests / "
                                         "allocatable GPUs stay below this is a candidate (CA's GPU threshold)")
    unneeded_s: float = Field(default=600.0, ge=0, description="how long a node must stay below the threshold")
    delay_after_add_s: float = Field(default=600.0, ge=0, description="nodes GPU-ready for less than this are not "
                                     "candidates")
    max_drain_s: float = Field(default=600.0, gt=0, description="a drain not done by then is rolled back")
    eviction_retry_s: float = Field(default=5.0, gt=0, description="wait before retrying an eviction a "
                                    "PodDisruptionBudget refused (429)")
    max_concurrent_drains: int = Field(default=5, ge=1, description="drains in progress at once")
    max_graceful_termination_s: int = Field(default=600, ge=0, description="upper bound of an evicted pod's "
                                            "grace period")
    # cluster-autoscaler's --scale-down-unready-time (20 min): a node in service that went unready is not removed at
    # once (a kubelet hiccup, a device-plugin restart, a MIG reconfiguration gpuaas started all look like that).
    unready_drain_s: float | None = Field(default=1200.0, gt=0, description="a node that was GPU-ready and has been "
                                          "unready (NotReady, or no GPUs allocatable) this long, continuously, is "
                                          "drained like an idle node: cordoned, its pods evicted through the Eviction "
                                          "API (PodDisruptionBudgets hold), deleted only once no pod must move; "
                                          "never if it is marked scale-down-disabled or do-not-disrupt, or while its "
                                          "MIG layout is being changed. Counted from when this replica first saw "
                                          "it unready. null: unready nodes are left alone")


class LeaderElectionConfig(LeaseConfig):
    namespace: str | None = Field(default="kube-system", description="namespace of the Lease; empty: the namespace "
                                  "the nodescaler runs in")
    name: str = Field(default="gpuaas-nodescaler", description="name of the Lease")


class ClusterAPIDiscoveryConfig(_Strict):
    """Node groups read from annotated MachineDeployments (nodescaler/clusterapi.py `group_from_machine_deployment`)
    instead of being typed twice."""

    enabled: bool = Field(default=False, description="add a group of provider `clusterapi` for every "
                          "MachineDeployment that carries `label` (its value is the group name) and the "
                          "cluster-autoscaler annotations (node-group min/max size, capacity cpu, memory, gpu-count, "
                          "gpu-type, labels, taints) plus `gpuaas.io/cost-per-hour`; read again every "
                          "`interval_s`. A MachineDeployment without `label` is never touched")
    label: str = Field(default="gpuaas.io/node-group", min_length=1, description="the label that opts a "
                       "MachineDeployment in; its value names the group")
    namespaces: list[str] = Field(default_factory=list, description="namespaces to look in; empty: all")
    interval_s: float = Field(default=30.0, gt=0, description="seconds between reads of the MachineDeployments")


class NodeScalerConfig(_Strict):
    interval_s: float = Field(default=10.0, gt=0, description="seconds between reconciles (a pod turning "
                              "unschedulable also triggers one)")
    groups: list[NodeGroupConfig] = Field(default_factory=list, description="the node groups, each name once "
                                          "(at least one, unless clusterapi_discovery is enabled)")
    scale_out: ScaleOutConfig = Field(default=ScaleOutConfig(), description="adding capacity for pending pods")
    scale_in: ScaleInConfig = Field(default=ScaleInConfig(), description="removing idle nodes")
    leader_election: LeaderElectionConfig = Field(default=LeaderElectionConfig(), description="one active replica")
    provider: str = Field(default="kwok", pattern=PROVIDER_PATTERN, description="where the nodes of groups "
                          "that name no `provider` come from: `kwok`, `karpenter` or `clusterapi` "
                          "(docs/node-autoscaling.md)")
    clusterapi_discovery: ClusterAPIDiscoveryConfig = Field(default=ClusterAPIDiscoveryConfig(), description="node "
                                                            "groups from annotated Cluster API MachineDeployments")
    dry_run: bool = Field(default=False, description="decide and log, never change the cluster")
    max_watch_stale_s: float = Field(default=60.0, gt=0, description="/readyz fails once a node, pod or PDB watch "
                                     "has been broken this long (no watch open, no list, event or bookmark since), "
                                     "and says which and why")

    @model_validator(mode="after")
    def _unique(self) -> NodeScalerConfig:
        if not self.groups and not self.clusterapi_discovery.enabled:
            raise ValueError("groups: at least one node group (or clusterapi_discovery.enabled)")
        names = [g.name for g in self.groups]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"group names used twice: {', '.join(sorted(dup))}")
        for g in self.groups:
            if self.provider_of(g) == "karpenter" and g.karpenter is None:
                raise ValueError(f"group {g.name}: provider karpenter needs a karpenter section (instance_type)")
            if self.provider_of(g) == "karpenter" and len(g.name) > 56:
                raise ValueError(f"group {g.name}: longer than 56 characters (its NodeClaims are named "
                                 "<group>-<6 hex digits>, a label value of at most 63)")
            if self.provider_of(g) == "clusterapi" and g.clusterapi is None:
                raise ValueError(f"group {g.name}: provider clusterapi needs a clusterapi section "
                                 "(machine_deployment)")
        mds = [(g.clusterapi.namespace, g.clusterapi.machine_deployment) for g in self.groups if g.clusterapi]
        twice = {f"{ns}/{md}" for ns, md in mds if mds.count((ns, md)) > 1}
        if twice:
            raise ValueError(f"MachineDeployments in more than one group: {', '.join(sorted(twice))}")
        return self

    def with_groups(self, extra: list[NodeGroupConfig]) -> NodeScalerConfig:
        """This config plus `extra` groups (discovered ones), validated; a configured group wins over a discovered
        one of the same name or MachineDeployment."""
        names = {g.name for g in self.groups}
        mds = {(g.clusterapi.namespace, g.clusterapi.machine_deployment) for g in self.groups if g.clusterapi}
        keep = [g for g in extra if g.name not in names and g.clusterapi is not None
                and (g.clusterapi.namespace, g.clusterapi.machine_deployment) not in mds]
        return type(self).model_validate({**self.model_dump(), "groups": [
            *(g.model_dump() for g in self.groups), *(g.model_dump() for g in keep)]})

    def group(self, name: str) -> NodeGroupConfig | None:
        return next((g for g in self.groups if g.name == name), None)

    def provider_of(self, group: NodeGroupConfig) -> str:
        """The provider of `group`: its own `provider`, else the top-level one."""
        return group.provider or self.provider


def load_nodescaler_config(path: Path | str | None, *, environ: dict[str, str] | None = None,
                           overrides: dict[str, Any] | None = None) -> NodeScalerConfig:
    return load_config(NodeScalerConfig, path, env_prefix=ENV_PREFIX, environ=environ, overrides=overrides)


__all__ = [
    "PROVIDERS",
    "ClusterAPIDiscoveryConfig",
    "ClusterAPIGroupConfig",
    "ConfigError",
    "KarpenterGroupConfig",
    "LeaderElectionConfig",
    "NodeClassRef",
    "NodeGroupConfig",
    "NodeScalerConfig",
    "ScaleInConfig",
    "ScaleOutConfig",
    "load_nodescaler_config",
]

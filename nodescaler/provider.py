"""Where nodes come from: the provider interface, the KWOK provider, the per-group dispatcher and an in-memory fake.

A cloud provider plugs in behind `Provider` (each method's docstring says whether it is required). The controller
never assumes a node exists because it asked for one: it reads Nodes from the API, and a grow request that does not
turn into GPU-ready nodes within the group's `max_provision_s` backs the group off. Each group names its provider
(`NodeGroupConfig.provider`, default the top-level `provider`); `GroupProviders` sends each call to the group's.

Providers: `kwok` (here) and `karpenter` (nodescaler/karpenter.py: standalone NodeClaims that Karpenter launches). A
provider whose requests are objects of their own (a NodeClaim is not a Node) also implements `status` (requests still
on their way, and the ones that failed to launch, read from its objects so that they survive a restart) and `cancel`.

KWOK provider. A real GPU node registers first and advertises its GPUs only once the driver and the device plugin are
up; cluster-autoscaler and Karpenter both stumble on that gap (double scale-ups, autoscaler#1949, karpenter#1459). The
KWOK provider reproduces it: `grow` creates Node objects at once, rendered from the group's template by the
provider-neutral `runtime/pools.node_objects` and made kwok's by `kwok_node`, but with the GPU resources held back in
the annotation `gpuaas.io/kwok-gpu-resources` and the time they appear in `gpuaas.io/kwok-gpu-ready-at` (now +
`provisioning_delay_s`), and the label `gpuaas.io/kwok-gpu-registering`. The harness's node agent
(`gpuaas/cluster/migmanager.py`, playing the device plugin and the MIG manager) publishes them at that time, so the
delay survives a restart of the node scaler, as a cloud's would. A node of a DRA group has no GPU resource to hold
back: its GPUs are ResourceSlices, which the node agent publishes at that time from the template the node carries
(`gpuaas.io/kwok-dra-template`), as the NVIDIA DRA driver's kubelet plugin does once the driver is up.

This module is the one place in the components that knows KWOK: what makes a Node one kwok plays (`kwok_node`, also
applied by the local cluster harness to its pools' nodes) and the held-GPU protocol with the harness's node agent.
"""
from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from scoring.gpus import MIG_RESOURCE_PREFIX
from scoring.kubeobjects import GPU_RESOURCE

from .config import NodeGroupConfig

PROVIDER_LABEL = "gpuaas.io/provisioned-by"
REQUESTED_AT_ANNOTATION = "gpuaas.io/requested-at"  # when the grow request was made (epoch seconds)

# kwok plays the nodes that carry `kwok.x-k8s.io/node: fake` (the harness starts it with
# --manage-nodes-with-annotation-selector on this annotation; "paused" makes kwok leave a node alone).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TYPE_LABEL = "type"  # `type: kwok`, the label kwok's examples select its nodes by
# The KWOK provider holds a new node's GPUs back until its provisioning delay has passed; the harness's node agent
# (gpuaas/cluster/migmanager.py) publishes them then.
REGISTERING_LABEL = "gpuaas.io/kwok-gpu-registering"  # set by the KWOK provider until the GPUs are published
GPU_RESOURCES_ANNOTATION = "gpuaas.io/kwok-gpu-resources"  # the GPU resources to publish (JSON)
GPU_READY_AT_ANNOTATION = "gpuaas.io/kwok-gpu-ready-at"  # when to publish them (epoch seconds)
# A DRA group's node (template `dra: true`) advertises no GPU resource: its GPUs are the ResourceSlices the NVIDIA DRA
# driver's kubelet plugin publishes once the driver is up. The template (JSON) says what the node agent publishes then
# (runtime/draslices.py), at the same ready time.
DRA_TEMPLATE_ANNOTATION = "gpuaas.io/kwok-dra-template"


class ProviderError(RuntimeError):
    """A provider call failed; the controller records it and retries on a later reconcile."""


class NodeNotFound(ProviderError):
    """The node is already gone (delete is then done)."""


def is_not_found(err: BaseException) -> bool:
    return isinstance(err, NodeNotFound)


@dataclass(frozen=True)
class Requested:
    """A grow request still on its way, as the provider's own objects show it (a NodeClaim without a node yet)."""

    name: str  # what grow returned for it
    group: str
    requested_at: float  # epoch seconds


@dataclass(frozen=True)
class LaunchFailure:
    """A grow request the provider failed to launch (insufficient capacity, a missing node class, ...)."""

    name: str
    group: str
    reason: str
    obj: dict[str, str] = field(default_factory=dict)  # what events about it refer to (apiVersion, kind, name)
    present: bool = False  # the request's object still exists: `cancel` removes it


@dataclass
class ProviderStatus:
    in_flight: list[Requested] = field(default_factory=list)
    failures: list[LaunchFailure] = field(default_factory=list)
    # Groups whose requests on their way `in_flight` lists completely: a remembered request of such a group that is
    # not listed is no longer on its way (the clusterapi provider's placeholders for replicas without a Machine yet).
    complete: set[str] = field(default_factory=set)


class Provider(Protocol):
    def grow(self, group: NodeGroupConfig, count: int) -> list[str]:
        """Ask for `count` more nodes of `group`; return the names of the requests: the names of the Nodes, or of the
        objects that will own them (`NodeInfo.claim`). They may register later. Implementation required."""

    def delete_node(self, group: NodeGroupConfig, name: str) -> None:
        """Remove the node (instance and Node object). Raises NodeNotFound if it is already gone. Implementation
        required."""

    # Optional (looked up with getattr by the controller):
    #   status(now) -> ProviderStatus: the requests on their way and the launch failures not reported before; called
    #     once per reconcile.
    #   cancel(group, name): withdraw a request that has not become a node (it expired, or failed to launch).


class GroupProviders:
    """`Provider` over several providers: each call goes to the provider of the group it names."""

    def __init__(self, providers: dict[str, Provider], provider_of: Callable[[NodeGroupConfig], str]):
        self.providers = providers
        self.provider_of = provider_of

    def _for(self, group: NodeGroupConfig) -> Provider:
        name = self.provider_of(group)
        if name not in self.providers:
            raise ProviderError(f"group {group.name}: provider {name} is not set up")
        return self.providers[name]

    def grow(self, group: NodeGroupConfig, count: int) -> list[str]:
        return self._for(group).grow(group, count)

    def delete_node(self, group: NodeGroupConfig, name: str) -> None:
        self._for(group).delete_node(group, name)

    def status(self, now: float) -> ProviderStatus:
        out = ProviderStatus()
        for p in self.providers.values():
            fn = getattr(p, "status", None)
            if fn is not None:
                st = fn(now)
                out.in_flight += st.in_flight
                out.failures += st.failures
                out.complete |= st.complete
        return out

    def cancel(self, group: NodeGroupConfig, name: str) -> None:
        fn = getattr(self._for(group), "cancel", None)
        if fn is not None:
            fn(group, name)


def create_each(names: list[str], create: Callable[[str], Any], *, workers: int,
                may_act: Callable[[], bool]) -> dict[str, str]:
    """Run `create(name)` for every name, up to `workers` at once, each only while `may_act()` holds (the grow of the
    providers whose requests are objects they create one by one). Returns name -> why its create failed."""
    from kubernetes.client.rest import ApiException

    errors: dict[str, str] = {}

    def one(name: str) -> None:
        if not may_act():
            errors[name] = "not created, this replica may not act any more"
            return
        try:
            create(name)
        except ApiException as err:
            errors[name] = f"{err.status} {err.reason} {(err.body or '')[:300]}".rstrip()
        except Exception as err:  # a timeout: it may exist (a provider with `status` reads it back)
            errors[name] = str(err)

    with ThreadPoolExecutor(max_workers=min(workers, max(1, len(names)))) as pool:
        list(pool.map(one, names))
    return errors


def kwok_node(node: dict[str, Any]) -> dict[str, Any]:
    """`node` (a provider-neutral Node object of runtime/pools.node_objects) made one kwok plays, in place: the
    annotation kwok selects its nodes by, the `type: kwok` label (a pool's own `type` label wins), the TTL annotation
    kwok's nodes carry and a `kwok://<name>` provider ID. Returns `node`."""
    meta = node["metadata"]
    meta["labels"] = {KWOK_TYPE_LABEL: "kwok", **meta.get("labels", {})}
    meta["annotations"] = {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0",
                           **meta.get("annotations", {})}
    node["spec"] = {"providerID": f"kwok://{meta['name']}", **node.get("spec", {})}
    return node


def render_node(group: NodeGroupConfig, name: str, now: float) -> dict[str, Any]:
    """The Node object of a new node of `group` as kwok plays it, GPUs held back until the provisioning delay has
    passed."""
    node = group.template_node()
    meta = node["metadata"]
    meta["name"] = name
    meta["labels"]["kubernetes.io/hostname"] = name
    kwok_node(node)
    meta["labels"][PROVIDER_LABEL] = "gpuaas-nodescaler"
    meta["annotations"][REQUESTED_AT_ANNOTATION] = f"{now:.3f}"
    held = {k: v for k, v in node["status"]["allocatable"].items()
            if k == GPU_RESOURCE or k.startswith(MIG_RESOURCE_PREFIX)}
    if group.pool.dra:
        meta["annotations"][DRA_TEMPLATE_ANNOTATION] = json.dumps(group.template, sort_keys=True)
    if held or group.pool.dra:
        meta["annotations"][GPU_RESOURCES_ANNOTATION] = json.dumps(held, sort_keys=True)
        meta["annotations"][GPU_READY_AT_ANNOTATION] = f"{now + group.provisioning_delay_s:.3f}"
        meta["labels"][REGISTERING_LABEL] = "true"
        for part in ("capacity", "allocatable"):
            for k in held:
                node["status"][part][k] = "0"
    return node


class KwokProvider:
    """Nodes as Node objects played by kwok. Each create and delete is bounded by `request_timeout` (total seconds)
    and starts only while `may_act()` holds (the replica leads for at least that long), as the controller's own
    writes do."""

    def __init__(self, api, *, clock: Callable[[], float] = time.time, workers: int = 16,
                 request_timeout: float | None = None, may_act: Callable[[], bool] = lambda: True):
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.clock = clock
        self.workers = workers
        self.timeout = request_timeout
        self.may_act = may_act

    def grow(self, group: NodeGroupConfig, count: int) -> list[str]:
        now = self.clock()
        names = [f"{group.name}-{secrets.token_hex(3)}" for _ in range(count)]
        errors = create_each(names, lambda name: self.core.create_node(
            render_node(group, name, now), _preload_content=False, _request_timeout=self.timeout),
            workers=self.workers, may_act=self.may_act)
        if errors:
            name, why = next(iter(errors.items()))
            raise ProviderError(f"creating {len(errors)} of {count} nodes of {group.name} failed: {name}: {why}")
        return names

    def delete_node(self, group: NodeGroupConfig, name: str) -> None:
        from kubernetes.client.rest import ApiException

        if not self.may_act():
            raise ProviderError(f"not deleting node {name}: this replica may not act any more")
        try:
            self.core.delete_node(name, _preload_content=False, _request_timeout=self.timeout)
        except ApiException as err:
            if err.status == 404:
                raise NodeNotFound(f"node {name} is already gone") from None
            raise ProviderError(f"deleting node {name}: {err.status} {err.reason}") from None


@dataclass
class FakeProvider:
    """Records calls; `next_error` is raised (once) by the next call; `allowed_grows` caps how many grow calls pass."""

    grow_calls: list[tuple[str, int]] = field(default_factory=list)
    delete_calls: list[str] = field(default_factory=list)
    next_error: Exception | None = None
    allowed_grows: int | None = None
    _n: int = 0

    def _fail(self) -> None:
        if self.next_error is not None:
            err, self.next_error = self.next_error, None
            raise err

    def grow(self, group: NodeGroupConfig, count: int) -> list[str]:
        self._fail()
        if self.allowed_grows is not None:
            if self.allowed_grows <= 0:
                raise ProviderError(f"fake: no more grow calls allowed ({group.name})")
            self.allowed_grows -= 1
        self.grow_calls.append((group.name, count))
        names = [f"{group.name}-fake{self._n + i}" for i in range(count)]
        self._n += count
        return names

    def delete_node(self, group: NodeGroupConfig, name: str) -> None:
        self._fail()
        if name in self.delete_calls:
            raise NodeNotFound(f"node {name} is already gone")
        self.delete_calls.append(name)

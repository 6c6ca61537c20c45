"""The Cluster API provider: a node group is a MachineDeployment (cluster.x-k8s.io/v1beta2), run by the Cluster API
core and whichever infrastructure provider the cluster already uses (AWS, Azure, vSphere, metal3, ...). gpuaas decides
how many nodes of which group; Cluster API turns replicas into Machines and Machines into nodes.

Scale-out patches the MachineDeployment's `/scale` subresource (replicas + n, conditional on its resourceVersion) and
returns the Machines the MachineSet creates for it (waited for up to `MACHINE_WAIT_S`). `status` reads back every
request on its way: Machines without a node, and replicas the MachineSet has not made a Machine for yet, as
placeholders named `<machinedeployment>#replica-<i>` (the list is complete for the group: `ProviderStatus.complete`),
so that a lagging MachineSet is not asked twice; a placeholder that expires is withdrawn by lowering replicas. A
Machine is a request on its way until it has a `status.nodeRef`; Cluster API then annotates the Node with
`cluster.x-k8s.io/machine`, which tells the snapshot which request the node is (NodeInfo.claim).

Scale-in: gpuaas drains the node itself (cordon, Eviction API: PodDisruptionBudgets hold), then marks its Machine
`cluster.x-k8s.io/delete-machine` (a MachineSet deletes marked Machines first, whatever its deletePolicy:
core/reconcilers/machineset/machineset_deletion_order.go) and `machine.cluster.x-k8s.io/exclude-node-draining` (gpuaas
has drained it), and lowers replicas by one: exactly the drained Machine goes; Cluster API deletes the infrastructure
and then the Node. The replicas it lowered from are kept on the Machine (`gpuaas.io/scale-down-from`), so a call
repeated after a crash does not lower them twice.

Launch failures: the v1beta2 contract has no terminal failure field; an infrastructure provider reports why an
instance is not there on its `Ready` condition, which the core mirrors into the Machine's `InfrastructureReady`
condition. A Machine without a node whose `InfrastructureReady` is False with a reason in the group's
`launch_failure_reasons` (or with the deprecated v1beta1 failureReason) backs the group off and is withdrawn (marked
and replicas lowered, as scale-in); any other state waits until the group's max_provision_s, which every provider's
requests share.

Coexistence: gpuaas only scales the MachineDeployments its groups name (configured, or discovered by the opt-in label
of `clusterapi_discovery`), and only removes a Machine of the group's MachineDeployment. cluster-autoscaler must not
manage the same MachineDeployments (both would write replicas).

Discovery (`group_from_machine_deployment`): the annotations cluster-autoscaler's clusterapi provider reads for
scale-from-zero (cluster-autoscaler/cloudprovider/clusterapi/clusterapi_utils.go: `cluster.x-k8s.io/cluster-api-
autoscaler-node-group-{min,max}-size`, `capacity.cluster-autoscaler.kubernetes.io/{cpu,memory,gpu-count,gpu-type,
maxPods,labels,taints}`), read the same way, plus `gpuaas.io/cost-per-hour`; the GPU model is the
`nvidia.com/gpu.product` of the labels annotation (a MIG layout its `nvidia.com/mig.config`).

Every write is bounded by `request_timeout` and starts only while `may_act()` holds, as the controller's own.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from scoring.gpus import model_by_product
from scoring.kubeobjects import GPU_RESOURCE, MIG_CONFIG_LABEL, POOL_LABEL, PRODUCT_LABEL

from .config import NodeGroupConfig
from .provider import LaunchFailure, NodeNotFound, ProviderError, ProviderStatus, Requested
from .snapshot import MACHINE_ANNOTATION

GROUP, VERSION = "cluster.x-k8s.io", "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"  # on a MachineDeployment's MachineSets and Machines
CLUSTER_NAMESPACE_ANNOTATION = "cluster.x-k8s.io/cluster-namespace"
DELETE_MACHINE = "cluster.x-k8s.io/delete-machine"
EXCLUDE_DRAINING = "machine.cluster.x-k8s.io/exclude-node-draining"
SCALE_DOWN_FROM = "gpuaas.io/scale-down-from"  # the replicas gpuaas lowered by one for this Machine
OWNER = "gpuaas-nodescaler"
# cluster-autoscaler's clusterapi provider (clusterapi_utils.go)
MIN_SIZE = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
MAX_SIZE = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
CAPACITY = "capacity.cluster-autoscaler.kubernetes.io/"
COST_ANNOTATION = "gpuaas.io/cost-per-hour"
MACHINE_WAIT_S = 5.0  # how long grow waits for the MachineSet to create the Machines


def _time(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c.get("type") == type_), {})


def launch_problem(machine: dict[str, Any], reasons: Iterable[str]) -> str | None:
    """Why the Machine's instance will not come (None: it may still come)."""
    c = _condition(machine, "InfrastructureReady")
    if c.get("status") == "False" and c.get("reason") in set(reasons):
        return f"InfrastructureReady False: {c['reason']}: {c.get('message') or ''}".rstrip(": ")
    v1 = ((machine.get("status") or {}).get("deprecated") or {}).get("v1beta1") or {}
    if v1.get("failureReason"):
        return f"{v1['failureReason']}: {v1.get('failureMessage') or ''}".rstrip(": ")
    return None


def machine_ref(machine: dict[str, Any]) -> dict[str, str]:
    meta = machine["metadata"]
    return {"apiVersion": API_VERSION, "kind": "Machine", "namespace": meta["namespace"], "name": meta["name"],
            "uid": meta.get("uid", "")}


# ---- discovery (pure) ------------------------------------------------------------------------------------------------
def _pairs(text: str, what: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{what}: {item!r} is not key=value")
        out[key] = value
    return out


def _taints(text: str) -> list[dict[str, str]]:
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        kv, sep, effect = item.rpartition(":")
        key, _, value = kv.partition("=")
        if not sep or not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ValueError(f"{CAPACITY}taints: {item!r} is not key=value:Effect")
        out.append({"key": key, "value": value, "effect": effect})
    return out


def group_from_machine_deployment(md: Mapping[str, Any], label: str) -> NodeGroupConfig:
    """The node group an opted-in MachineDeployment describes with cluster-autoscaler's annotations (see the module
    docstring). Raises ValueError naming the MachineDeployment and what is missing or wrong."""
    meta = md["metadata"]
    where = f"MachineDeployment {meta.get('namespace')}/{meta.get('name')}"
    ann = meta.get("annotations") or {}
    try:
        name = (meta.get("labels") or {})[label]
        missing = [k for k in (MAX_SIZE, CAPACITY + "cpu", CAPACITY + "memory", COST_ANNOTATION) if not ann.get(k)]
        if missing:
            raise ValueError(f"missing annotations {', '.join(missing)}")
        labels = _pairs(ann.get(CAPACITY + "labels", ""), CAPACITY + "labels")
        template: dict[str, Any] = {"cpu": ann[CAPACITY + "cpu"], "memory": ann[CAPACITY + "memory"]}
        gpus = int(ann.get(CAPACITY + "gpu-count", "0") or 0)
        if gpus:
            gpu_type = ann.get(CAPACITY + "gpu-type", GPU_RESOURCE) or GPU_RESOURCE
            if gpu_type != GPU_RESOURCE:
                raise ValueError(f"{CAPACITY}gpu-type {gpu_type!r}: only {GPU_RESOURCE} is supported")
            product = labels.pop(PRODUCT_LABEL, "")
            if model_by_product(product) is None:
                raise ValueError(f"{CAPACITY}labels must name the GPU as {PRODUCT_LABEL}=<product> (a known "
                                 f"model); got {product!r}")
            gpu: dict[str, Any] = {"model": product, "count": gpus}
            if labels.get(MIG_CONFIG_LABEL):
                gpu["mig"] = labels.pop(MIG_CONFIG_LABEL)
            template["gpu"] = gpu
        if ann.get(CAPACITY + "maxPods"):
            template["pods"] = int(ann[CAPACITY + "maxPods"])
        labels.pop(POOL_LABEL, None)
        if labels:
            template["labels"] = labels
        if ann.get(CAPACITY + "taints"):
            template["taints"] = _taints(ann[CAPACITY + "taints"])
        return NodeGroupConfig.model_validate({
            "name": name, "template": template, "min_size": int(ann.get(MIN_SIZE, "0") or 0),
            "max_size": int(ann[MAX_SIZE]), "cost_per_hour": float(ann[COST_ANNOTATION]), "provider": "clusterapi",
            "clusterapi": {"namespace": meta["namespace"], "machine_deployment": meta["name"]}})
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{where}: {err}") from None


class ClusterAPIProvider:
    """Nodes as replicas of MachineDeployments (see the module docstring). `groups()` returns the current node
    groups (discovery may change them between reconciles)."""

    def __init__(self, api, groups: Callable[[], Iterable[NodeGroupConfig]], *, clock: Callable[[], float] = time.time,
                 request_timeout: float | None = None, may_act: Callable[[], bool] = lambda: True,
                 machine_wait_s: float = MACHINE_WAIT_S):
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.groups = groups
        self.clock = clock
        self.timeout = request_timeout
        self.may_act = may_act
        self.machine_wait_s = machine_wait_s
        self._reported: set[str] = set()  # failures already reported (namespace/name)
        self._since: dict[str, float] = {}  # placeholder -> when first on its way

    # -- the API ---------------------------------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[..., Any], *args: Any, not_found: Any = ProviderError, **kw: Any) -> Any:
        from kubernetes.client.rest import ApiException

        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kw)
        except ApiException as err:
            if err.status == 404 and not_found is not ProviderError:
                return not_found
            raise ProviderError(f"{what}: {err.status} {err.reason} {(err.body or '')[:300]}".rstrip()) from None
        except Exception as err:  # a timeout, a broken connection
            raise ProviderError(f"{what}: {err}") from None
        return json.loads(resp.data)

    def _write(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if not self.may_act():
            raise ProviderError(f"not {what}: this replica may not act any more")
        return self._call(what, fn, *args, **kw)

    def _machines(self, group: NodeGroupConfig) -> list[dict[str, Any]]:
        c = _cfg(group)
        return self._call(f"listing Machines of {c.namespace}/{c.machine_deployment}",
                          self.custom.list_namespaced_custom_object, GROUP, VERSION, c.namespace, "machines",
                          label_selector=f"{DEPLOYMENT_LABEL}={c.machine_deployment}")["items"]

    def _scale(self, group: NodeGroupConfig) -> dict[str, Any]:
        c = _cfg(group)
        return self._call(f"reading the scale of MachineDeployment {c.namespace}/{c.machine_deployment}",
                          self.custom.get_namespaced_custom_object_scale, GROUP, VERSION, c.namespace,
                          "machinedeployments", c.machine_deployment)

    def _set_replicas(self, group: NodeGroupConfig, change: Callable[[int], int], attempts: int = 5) -> tuple[int, int]:
        """Set the MachineDeployment's replicas to change(current) through /scale, conditional on the resourceVersion
        read (retried on a conflict). Returns (before, after)."""
        from kubernetes.client.rest import ApiException

        c = _cfg(group)
        what = f"scaling MachineDeployment {c.namespace}/{c.machine_deployment}"
        for _ in range(attempts):
            scale = self._scale(group)
            before = int((scale.get("spec") or {}).get("replicas") or 0)
            after = change(before)
            if after == before:
                return before, after
            if not self.may_act():
                raise ProviderError(f"not {what}: this replica may not act any more")
            body = {"metadata": {"resourceVersion": scale["metadata"]["resourceVersion"]},
                    "spec": {"replicas": after}}
            try:
                self.custom.patch_namespaced_custom_object_scale(
                    GROUP, VERSION, c.namespace, "machinedeployments", c.machine_deployment, body,
                    _preload_content=False, _request_timeout=self.timeout)
                return before, after
            except ApiException as err:
                if err.status == 409:
                    continue
                raise ProviderError(f"{what}: {err.status} {err.reason}") from None
            except Exception as err:
                raise ProviderError(f"{what}: {err}") from None
        raise ProviderError(f"{what}: the scale kept changing ({attempts} conflicts)")

    # -- Provider --------------------------------------------------------------------------------------------------
    def grow(self, group: NodeGroupConfig, count: int) -> list[str]:
        """Raise the MachineDeployment's replicas by `count`; return the Machines created for them (those seen within
        machine_wait_s; `status` reads back the others)."""
        before = {m["metadata"]["name"] for m in self._machines(group)}
        self._set_replicas(group, lambda r: r + count)
        deadline = time.monotonic() + self.machine_wait_s
        new: list[str] = []
        while True:
            machines = self._machines(group)
            new = sorted(m["metadata"]["name"] for m in machines
                         if m["metadata"]["name"] not in before and not m["metadata"].get("deletionTimestamp"))
            if len(new) >= count or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        # Replicas the MachineSet has not made Machines for yet are on their way too, as placeholders (`status` lists
        # them under the same names until their Machines appear).
        missing = max(0, self._replicas(group) - len(_live(machines)))
        now = self.clock()
        names = new[:count] + [placeholder(group, i) for i in range(min(missing, count - len(new[:count])))]
        for n in names:
            self._since.setdefault(n, now)
        return names

    def machine_of(self, group: NodeGroupConfig, node: dict[str, Any]) -> dict[str, Any] | None:
        """The Machine of the group's MachineDeployment that node `node` is: the one the node's annotation names, else
        the one whose nodeRef or providerID is the node's; None if no Machine of the group's is."""
        c = _cfg(group)
        meta = node["metadata"]
        ann = meta.get("annotations") or {}
        pid = (node.get("spec") or {}).get("providerID")
        for m in self._machines(group):
            st, spec = m.get("status") or {}, m.get("spec") or {}
            if (ann.get(MACHINE_ANNOTATION) == m["metadata"]["name"]
                    and ann.get(CLUSTER_NAMESPACE_ANNOTATION, c.namespace) == c.namespace) \
                    or (st.get("nodeRef") or {}).get("name") == meta["name"] or (pid and spec.get("providerID") == pid):
                return m
        return None

    def delete_node(self, group: NodeGroupConfig, name: str) -> None:
        """Remove node `name`: mark its Machine and lower the MachineDeployment's replicas (gpuaas has drained it)."""
        node = self._call(f"reading node {name}", self.core.read_node, name, not_found=None)
        if node is None:
            raise NodeNotFound(f"node {name} is already gone")
        if node["metadata"].get("deletionTimestamp"):
            raise NodeNotFound(f"node {name} is being deleted")
        machine = self.machine_of(group, node)
        if machine is None:
            c = _cfg(group)
            raise ProviderError(f"node {name} is no Machine of MachineDeployment {c.namespace}/"
                                f"{c.machine_deployment} (group {group.name}): not deleting it")
        self._remove(group, machine, f"node {name}")

    def cancel(self, group: NodeGroupConfig, name: str) -> None:
        """Withdraw Machine `name` (it expired or failed to launch), or a replica the MachineSet never made a Machine
        for (a placeholder: replicas lowered while they are more than the Machines). Gone already: nothing to do."""
        c = _cfg(group)
        machines = self._machines(group)
        if PLACEHOLDER in name:
            live = len(_live(machines))
            self._set_replicas(group, lambda r: r - 1 if r > live else r)
            return
        machine = next((m for m in machines if m["metadata"]["name"] == name), None)
        if machine is None:
            return
        self._remove(group, machine, f"Machine {c.namespace}/{name}")

    def _remove(self, group: NodeGroupConfig, machine: dict[str, Any], what: str) -> None:
        meta = machine["metadata"]
        if meta.get("deletionTimestamp"):
            raise NodeNotFound(f"{what}: Machine {meta['name']} is being deleted")
        ann = meta.get("annotations") or {}
        marked_from = ann.get(SCALE_DOWN_FROM)
        if marked_from is None:
            before = int((self._scale(group).get("spec") or {}).get("replicas") or 0)
            self._write(f"marking Machine {meta['namespace']}/{meta['name']}",
                        self.custom.patch_namespaced_custom_object, GROUP, VERSION, meta["namespace"], "machines",
                        meta["name"], {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": {
                            DELETE_MACHINE: OWNER, EXCLUDE_DRAINING: "drained by gpuaas-nodescaler",
                            SCALE_DOWN_FROM: str(before)}}})
            marked_from = str(before)
        # Lower by one unless that was done already for this Machine (a repeated call after a crash).
        with contextlib.suppress(ValueError):
            limit = int(marked_from)
            self._set_replicas(group, lambda r: r - 1 if r >= limit and r > 0 else r)

    def status(self, now: float) -> ProviderStatus:
        """Machines of the groups' MachineDeployments without a node yet (in flight), and those whose instance will
        not come (launch failures, reported once)."""
        out = ProviderStatus()
        present: set[str] = set()
        for group in self.groups():
            if group.clusterapi is None:
                continue
            machines = self._machines(group)
            out.complete.add(group.name)
            for i in range(max(0, self._replicas(group) - len(_live(machines)))):
                name = placeholder(group, i)
                present.add(name)
                out.in_flight.append(Requested(name, group.name, self._since.setdefault(name, now)))
            for m in machines:
                meta = m["metadata"]
                key = f"{meta['namespace']}/{meta['name']}"
                present.add(key)
                if (m.get("status") or {}).get("nodeRef") or meta.get("deletionTimestamp") \
                        or DELETE_MACHINE in (meta.get("annotations") or {}):
                    continue
                problem = launch_problem(m, group.clusterapi.launch_failure_reasons)
                if problem is not None:
                    if key not in self._reported:
                        self._reported.add(key)
                        out.failures.append(LaunchFailure(meta["name"], group.name, problem, machine_ref(m), True))
                    continue
                at = _time(meta.get("creationTimestamp"))
                out.in_flight.append(Requested(meta["name"], group.name, at if at is not None else now))
        self._reported &= present
        self._since = {k: v for k, v in self._since.items() if k in present}
        return out

    def _replicas(self, group: NodeGroupConfig) -> int:
        return int((self._scale(group).get("spec") or {}).get("replicas") or 0)


PLACEHOLDER = "#replica-"  # (a character no Machine name has)


def placeholder(group: NodeGroupConfig, i: int) -> str:
    """The name of the i-th replica of `group` the MachineSet has not made a Machine for yet."""
    return f"{_cfg(group).machine_deployment}{PLACEHOLDER}{i}"


def _live(machines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Machines that count against replicas: not being deleted, not marked for deletion."""
    return [m for m in machines if not m["metadata"].get("deletionTimestamp")
            and DELETE_MACHINE not in (m["metadata"].get("annotations") or {})]


def _cfg(group: NodeGroupConfig):
    if group.clusterapi is None:
        raise ProviderError(f"group {group.name}: no clusterapi section (machine_deployment)")
    return group.clusterapi


def discover(api, label: str, namespaces: Iterable[str] = (), *, request_timeout: float | None = None
             ) -> tuple[list[NodeGroupConfig], list[str]]:
    """The node groups of the MachineDeployments that carry `label` (in `namespaces`, or all), and why the others
    that carry it are not groups."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    kw = {"label_selector": label, "_preload_content": False, "_request_timeout": request_timeout}
    try:
        if namespaces:
            items = [md for ns in namespaces for md in json.loads(custom.list_namespaced_custom_object(
                GROUP, VERSION, ns, "machinedeployments", **kw).data)["items"]]
        else:
            items = json.loads(custom.list_cluster_custom_object(GROUP, VERSION, "machinedeployments",
                                                                 **kw).data)["items"]
    except Exception as err:
        raise ProviderError(f"listing MachineDeployments labelled {label}: {err}") from None
    groups, problems = [], []
    for md in items:
        try:
            groups.append(group_from_machine_deployment(md, label))
        except ValueError as err:
            problems.append(str(err))
    return groups, problems

"""The Karpenter provider: a node of a group is a standalone NodeClaim, launched and registered by the Karpenter a
cluster already runs (any cloud provider: AWS's EC2NodeClass, Azure's AKSNodeClass, the KWOK provider's
KWOKNodeClass, ...). gpuaas decides how many nodes of which group (its GPU-, MIG- and share-aware planner); Karpenter
turns each NodeClaim into an instance and a registered Node, and removes both when the NodeClaim is deleted.

What a NodeClaim of group G is (sigs.k8s.io/karpenter v1.15.0, pkg/apis/v1/nodeclaim.go; only `nodeClassRef` and
`requirements` are required):

- `requirements`: `node.kubernetes.io/instance-type In [G.karpenter.instance_type]` (the one instance type the
  template describes; the cloud provider launches exactly that) plus the group's extra requirements;
- `nodeClassRef`: G.karpenter.node_class; Karpenter acts only on NodeClaims whose node class kind its cloud provider
  supports (`IsManaged`);
- `expireAfter: Never` (the default is 720h: Karpenter would delete the node after 30 days, pods and all);
- labels: the template's node labels (`gpuaas.io/pool: G`, the GPU labels), `gpuaas.io/provisioned-by:
  gpuaas-nodescaler` and `gpuaas.io/nodeclaim: <its name>` (which request a node is, before Karpenter's registration
  adds the ownerReference: else the node and the request would both count as capacity on its way); annotations:
  the template's (GPU topology) and `gpuaas.io/requested-at`. Karpenter puts both on the Node when it registers (and
  the KWOK cloud provider when it creates it), so the node is in group G from the start. No `karpenter.sh/nodepool`
  label: such a NodeClaim is never a disruption candidate (consolidation, drift, emptiness, repair:
  state.StateNode.ValidateNodeDisruptable), so scale-in stays gpuaas's;
- `taints`: the template's; `resources.requests`: the template's GPU resources, so Karpenter marks the NodeClaim
  Initialized only once the device plugin advertises them.

Scale-in: gpuaas drains the node itself (cordon, Eviction API: PodDisruptionBudgets hold) and then deletes the
NodeClaim; Karpenter's termination finalizer deletes the Node (its own drain finds nothing left to evict) and the
instance. gpuaas deletes only NodeClaims that carry its label: a node of a Karpenter NodePool is never deleted here.

Launch failures: Karpenter deletes a NodeClaim it cannot launch for insufficient capacity or a node class that is
missing or not ready (pkg/controllers/nodeclaim/lifecycle/launch.go; the KWOK cloud provider reports a missing
KWOKNodeClass as insufficient capacity), and marks other errors on the `Launched` condition (Unknown with a reason, or
False) while it retries. `status` reports both: a NodeClaim of gpuaas's that disappears or is deleted by someone else
before its node registered, or whose `Launched` condition says why it did not launch. The controller backs the group
off (scale-out tries the next group) and withdraws a failed NodeClaim that is still there.

Every write is bounded by `request_timeout` and starts only while `may_act()` holds, as the controller's own.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from scoring.gpus import MIG_RESOURCE_PREFIX
from scoring.kubeobjects import GPU_RESOURCE, POOL_LABEL

from .config import NodeGroupConfig
from .provider import (
    PROVIDER_LABEL,
    REQUESTED_AT_ANNOTATION,
    LaunchFailure,
    NodeNotFound,
    ProviderError,
    ProviderStatus,
    Requested,
    create_each,
)
from .snapshot import CLAIM_LABEL

GROUP, VERSION, PLURAL = "karpenter.sh", "v1", "nodeclaims"
API_VERSION = f"{GROUP}/{VERSION}"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
OWNER = "gpuaas-nodescaler"  # the PROVIDER_LABEL value of gpuaas's NodeClaims (and of the KWOK provider's nodes)
# Labels Karpenter or the kubelet set from the instance itself: never copied from the template.
NOT_COPIED = ("kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch", INSTANCE_TYPE_LABEL)
# The Unknown reason of a condition nobody has worked on yet (github.com/awslabs/operatorpkg status.ConditionSet).
AWAITING = "AwaitingReconciliation"
# A `status` call longer than this after the previous one (a replica that leads again) does not read a NodeClaim
# gone meanwhile as a launch failure: it may have registered and been removed while another replica led.
FORGET_AFTER_S = 60.0


def _time(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def gpu_requests(allocatable: dict[str, Any]) -> dict[str, str]:
    """The GPU resources (whole GPUs, MIG instances) a node of the template advertises, those that are not zero."""
    return {k: str(v) for k, v in allocatable.items()
            if (k == GPU_RESOURCE or k.startswith(MIG_RESOURCE_PREFIX)) and str(v) not in ("0", "")}


def render_nodeclaim(group: NodeGroupConfig, name: str, now: float) -> dict[str, Any]:
    """The NodeClaim of one node of `group` (provider `karpenter`)."""
    k = group.karpenter
    if k is None:
        raise ProviderError(f"group {group.name}: no karpenter section (instance_type, node_class)")
    node = group.template_node()
    meta = node["metadata"]
    labels = {key: v for key, v in meta.get("labels", {}).items() if key not in NOT_COPIED}
    labels[POOL_LABEL] = group.name
    labels[PROVIDER_LABEL] = OWNER
    labels[CLAIM_LABEL] = name
    annotations = {**meta.get("annotations", {}), REQUESTED_AT_ANNOTATION: f"{now:.3f}"}
    spec: dict[str, Any] = {
        "nodeClassRef": k.node_class.model_dump(),
        "requirements": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [k.instance_type]},
                         *k.requirements],
        "expireAfter": "Never",
    }
    requests = gpu_requests(node["status"].get("allocatable", {}))
    if requests:
        spec["resources"] = {"requests": requests}
    taints = node.get("spec", {}).get("taints")
    if taints:
        spec["taints"] = taints
    if k.termination_grace_period_s is not None:
        spec["terminationGracePeriod"] = f"{k.termination_grace_period_s}s"
    return {"apiVersion": API_VERSION, "kind": "NodeClaim",
            "metadata": {"name": name, "labels": labels, "annotations": annotations}, "spec": spec}


def claim_ref(name: str) -> dict[str, str]:
    return {"apiVersion": API_VERSION, "kind": "NodeClaim", "name": name}


def _condition(claim: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (claim.get("status") or {}).get("conditions") or () if c.get("type") == type_), {})


def registered(claim: dict[str, Any]) -> bool:
    return bool((claim.get("status") or {}).get("nodeName")) or _condition(claim, "Registered").get("status") == "True"


def launch_problem(claim: dict[str, Any]) -> str | None:
    """Why Karpenter did not launch the NodeClaim, from its `Launched` condition (None: launched, or not tried yet)."""
    c = _condition(claim, "Launched")
    status, reason = c.get("status"), c.get("reason") or ""
    if status == "False" or (status == "Unknown" and reason not in ("", AWAITING)):
        return f"Launched {status}: {reason}: {c.get('message') or ''}".rstrip(": ")
    return None


class KarpenterProvider:
    """Nodes as standalone Karpenter NodeClaims (see the module docstring)."""

    def __init__(self, api, *, clock: Callable[[], float] = time.time, workers: int = 16,
                 request_timeout: float | None = None, may_act: Callable[[], bool] = lambda: True):
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.clock = clock
        self.workers = workers
        self.timeout = request_timeout
        self.may_act = may_act
        self._in_flight: dict[str, str] = {}  # NodeClaim -> group: seen without a node at the last `status`
        self._withdrawn: set[str] = set()  # NodeClaims this provider deleted (not failures when they go)
        self._reported: set[str] = set()  # failures already reported
        self._last_status: float | None = None

    # -- the API ---------------------------------------------------------------------------------------------------
    def _list(self) -> list[dict[str, Any]]:
        resp = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL,
                                                      label_selector=f"{PROVIDER_LABEL}={OWNER}",
                                                      _preload_content=False, _request_timeout=self.timeout)
        return json.loads(resp.data)["items"]

    def _get(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            resp = self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name, _preload_content=False,
                                                         _request_timeout=self.timeout)
        except ApiException as err:
            if err.status == 404:
                return None
            raise ProviderError(f"reading NodeClaim {name}: {err.status} {err.reason}") from None
        except Exception as err:  # a timeout, a broken connection
            raise ProviderError(f"reading NodeClaim {name}: {err}") from None
        return json.loads(resp.data)

    def _delete(self, name: str, uid: str | None = None) -> bool:
        """Delete NodeClaim `name` (only the object of `uid`, if given); False if it was gone."""
        from kubernetes.client.rest import ApiException

        if not self.may_act():
            raise ProviderError(f"not deleting NodeClaim {name}: this replica may not act any more")
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name, body=body, _preload_content=False,
                                                     _request_timeout=self.timeout)
        except ApiException as err:
            if err.status == 404:
                return False
            raise ProviderError(f"deleting NodeClaim {name}: {err.status} {err.reason}") from None
        except Exception as err:  # a timeout, a broken connection: the delete may have landed
            raise ProviderError(f"deleting NodeClaim {name}: {err}") from None
        finally:
            self._withdrawn.add(name)
        return True

    # -- Provider --------------------------------------------------------------------------------------------------
    def grow(self, group: NodeGroupConfig, count: int) -> list[str]:
        now = self.clock()
        names = [f"{group.name}-{secrets.token_hex(3)}" for _ in range(count)]
        # (a timed-out create may exist: `status` reads it back if it does)
        errors = create_each(names, lambda name: self.custom.create_cluster_custom_object(
            GROUP, VERSION, PLURAL, render_nodeclaim(group, name, now), _preload_content=False,
            _request_timeout=self.timeout), workers=self.workers, may_act=self.may_act)
        # In flight from now: one Karpenter deletes before the next `status` (insufficient capacity: within a second)
        # is a failure too, not a request that was never seen.
        self._in_flight.update({n: group.name for n in names if n not in errors})
        if errors:
            name, why = next(iter(errors.items()))
            raise ProviderError(f"creating {len(errors)} of {count} NodeClaims of {group.name} failed: {name}: {why}")
        return names

    def claim_of(self, node: dict[str, Any]) -> str | None:
        """The NodeClaim a Node belongs to: its ownerReference (Karpenter sets it at registration), else the one whose
        status names the node or its provider ID."""
        meta = node["metadata"]
        for o in meta.get("ownerReferences") or ():
            if o.get("kind") == "NodeClaim" and str(o.get("apiVersion", "")).startswith(f"{GROUP}/"):
                return str(o["name"])
        pid = (node.get("spec") or {}).get("providerID")
        try:
            listed = self._list()
        except Exception as err:
            raise ProviderError(f"listing NodeClaims: {err}") from None
        for c in listed:
            st = c.get("status") or {}
            if st.get("nodeName") == meta["name"] or (pid and st.get("providerID") == pid):
                return str(c["metadata"]["name"])
        return None

    def delete_node(self, group: NodeGroupConfig, name: str) -> None:
        """Delete the NodeClaim of node `name`; Karpenter removes the Node and the instance (its finalizer)."""
        from kubernetes.client.rest import ApiException

        try:
            node = json.loads(self.core.read_node(name, _preload_content=False, _request_timeout=self.timeout).data)
        except ApiException as err:
            if err.status == 404:
                raise NodeNotFound(f"node {name} is already gone") from None
            raise ProviderError(f"reading node {name}: {err.status} {err.reason}") from None
        except Exception as err:
            raise ProviderError(f"reading node {name}: {err}") from None
        if node["metadata"].get("deletionTimestamp"):
            raise NodeNotFound(f"node {name} is being deleted")
        claim_name = self.claim_of(node)
        if claim_name is None:
            raise ProviderError(f"node {name} has no NodeClaim (not registered by Karpenter): not deleting it")
        claim = self._get(claim_name)
        if claim is None:
            raise NodeNotFound(f"NodeClaim {claim_name} of node {name} is already gone")
        labels = claim["metadata"].get("labels") or {}
        if labels.get(PROVIDER_LABEL) != OWNER:
            owner = f"NodePool {labels[NODEPOOL_LABEL]}" if NODEPOOL_LABEL in labels else "another component"
            raise ProviderError(f"node {name}: NodeClaim {claim_name} belongs to {owner}, not to gpuaas: not "
                                "deleting it")
        if claim["metadata"].get("deletionTimestamp"):
            raise NodeNotFound(f"NodeClaim {claim_name} of node {name} is being deleted")
        if not self._delete(claim_name, claim["metadata"].get("uid")):
            raise NodeNotFound(f"NodeClaim {claim_name} of node {name} is already gone")

    def cancel(self, group: NodeGroupConfig, name: str) -> None:
        """Withdraw NodeClaim `name` (it expired or failed to launch). Gone already: nothing to do."""
        claim = self._get(name)
        if claim is None or claim["metadata"].get("deletionTimestamp"):
            self._withdrawn.add(name)
            return
        if (claim["metadata"].get("labels") or {}).get(PROVIDER_LABEL) != OWNER:
            raise ProviderError(f"NodeClaim {name} is not gpuaas's: not deleting it")
        self._delete(name, claim["metadata"].get("uid"))

    def status(self, now: float) -> ProviderStatus:
        """gpuaas's NodeClaims without a node yet (in flight), and those that failed to launch since the last call."""
        claims = self._list()
        fresh = self._last_status is not None and now - self._last_status <= FORGET_AFTER_S
        self._last_status = now
        out = ProviderStatus()
        present: set[str] = set()
        in_flight: dict[str, str] = {}
        for c in claims:
            meta = c["metadata"]
            name, group = str(meta["name"]), (meta.get("labels") or {}).get(POOL_LABEL, "")
            present.add(name)
            if registered(c):
                continue
            if meta.get("deletionTimestamp"):
                if name not in self._withdrawn:
                    self._fail(out, name, group, "deleted before its node registered (by Karpenter: insufficient "
                                                 "capacity, node class not ready, launch or registration timeout)")
                continue
            problem = launch_problem(c)
            if problem is not None:
                self._fail(out, name, group, problem, present=True)
                continue
            in_flight[name] = group
            at = _time(meta.get("creationTimestamp"))
            with contextlib.suppress(KeyError, ValueError):
                at = float((meta.get("annotations") or {})[REQUESTED_AT_ANNOTATION])
            out.in_flight.append(Requested(name, group, at if at is not None else now))
        if fresh:
            for name, group in self._in_flight.items():
                if name not in present and name not in self._withdrawn:
                    self._fail(out, name, group, "gone before its node registered (deleted by Karpenter: "
                                                 "insufficient capacity, node class missing or not ready, launch or "
                                                 "registration timeout)")
        self._in_flight = in_flight
        # Forget what can no longer matter: names not in the API any more.
        self._withdrawn &= present
        self._reported &= present
        return out

    def _fail(self, out: ProviderStatus, name: str, group: str, reason: str, present: bool = False) -> None:
        if name in self._reported:
            return
        self._reported.add(name)
        out.failures.append(LaunchFailure(name, group, reason, claim_ref(name), present))

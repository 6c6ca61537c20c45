"""DRA claims allocated by the gang controller (docs/devices.md, "DRA mode"): gpuaas, not kube-scheduler, chooses the
devices of every claim that uses gpuaas's device classes, with the same model and policy as every other placement.

A pod with such claims is created gated (the webhook adds `gpuaas.io/gang`; in no group, it is a gang of one). Each
round the controller:

  1. reads every gated or released pod's claims (scoring.draclaims): what its claims not allocated yet ask, the node
     its allocated claims hold it to (a claim allocated earlier, by gpuaas before a restart or by anyone for a shared
     claim), the nodes a PCIe-root constraint allows;
  2. builds the model with the DRA nodes' GPUs and every allocated claim's devices (scoring.dramodel), its own writes
     included until its informer shows them (`Assumed`), with idle GPUs opened for the MIG profiles pods wait for;
  3. decides on it (scoring.gangs.decide, the gangs' all-or-nothing, priority and FIFO);
  4. turns each release into devices per claim (`DeviceAssigner`) and writes, per claim, the finalizer
     resource.kubernetes.io/delete-protection and the annotation gpuaas.io/allocated-for (the pod's uid) in one
     metadata update, then `status.allocation` with its timestamp; only when every claim of every member of the gang
     is allocated are the members pinned and their gates removed. A write that fails deallocates what the round wrote
     for that gang, which stays gated whole;
  5. clears allocations it made that no pod will use: the pod gone before binding (kube-controller-manager deallocates
     only claims it saw reserved, or deleted ones), or still gated past the bind timeout (its gang could not be
     completed around it).

Pods gated by the webhook for their claims whose claims turn out to be other drivers' are let go (gate removed, no
pin): kube-scheduler allocates those. kube-controller-manager deallocates gpuaas's claims when their pods go (the
finalizer), as it does kube-scheduler's.
"""
from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Protocol

from urllib3.exceptions import HTTPError

from scoring.dra import FINALIZER, allocated_devices
from scoring.draclaims import (
    ALLOCATED_FOR_ANNOTATION,
    PodDra,
    UnsupportedClaim,
    allocation,
    has_claims,
    pod_dra,
    read_claim,
    same_root_count,
)
from scoring.dramodel import (
    DeviceAssigner,
    DraCluster,
    DraModel,
    dra_cluster,
    dra_cluster_of,
    dra_model,
    same_root_nodes,
)
from scoring.draview import DraParsed
from scoring.gangs import GANG_GATE, GROUP_LABELS, RELEASED_ANNOTATION, GangDecision, NodeFacts, gates
from scoring.kubeobjects import ObjectError, pod_key
from scoring.model import ClusterState

log = logging.getLogger("gpuaas.gangs")

Obj = dict[str, Any]
ASSUME_TTL_S = 30.0  # an allocation written and not seen by the informer within this long is forgotten
ORPHAN_GRACE_S = 10.0  # an allocation younger than this is never cleared as an orphan (informers lag)


@dataclass(frozen=True)
class Allocate:
    """Write `allocation` into claim `claim` (uid `uid`) for pod `pod` (uid `pod_uid`), member of `gang`."""

    gang: str
    claim: str
    uid: str
    pod: str
    pod_uid: str
    allocation: Mapping[str, Any]


@dataclass(frozen=True)
class Deallocate:
    """Clear the allocation gpuaas made of claim `claim` (uid `uid`), and its finalizer."""

    claim: str
    uid: str
    reason: str


@dataclass(frozen=True)
class Release:
    """Remove the gpuaas gate of a pod gated for claims that are not gpuaas's to allocate."""

    key: str
    uid: str


class ClaimWriter(Protocol):
    """Each write returns False when the claim is gone or changed under it (the next round sees why)."""

    def allocate(self, key: str, uid: str, allocation: Mapping[str, Any], pod_uid: str) -> bool: ...

    def deallocate(self, key: str, uid: str) -> bool: ...


@dataclass(frozen=True)
class DraInputs:
    """What a round reads besides the model, nodes and pods: the informers' ResourceSlices and ResourceClaims, the
    Node objects by name, and the uids of the pods that exist and are not finished. `parsed`: the slices and the
    claims' allocations as the live view read them when they changed (scoring.draview.DraView.parsed), so that a
    round reads again only the claims of the pods it places; without it the round reads every slice and claim."""

    slices: Sequence[Obj]
    claims: Sequence[Obj]
    nodes: Mapping[str, Obj]
    live_uids: frozenset[str]
    parsed: DraParsed | None = None


def rfc3339(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None
    except ValueError:
        return None


def wanted_pod(pod: Obj | None) -> bool:
    """Pods a round reads for DRA: gated by gpuaas, released by it, or with claims and not bound."""
    if not pod:
        return False
    meta = pod.get("metadata") or {}
    return GANG_GATE in gates(pod) or RELEASED_ANNOTATION in (meta.get("annotations") or {}) or \
        (has_claims(pod) and not (pod.get("spec") or {}).get("nodeName"))


@dataclass
class Assumed:
    uid: str
    allocation: Mapping[str, Any]
    pod_uid: str
    until: float


@dataclass
class DraRound:
    """One round's view of the DRA pods: their claims, the model with DRA nodes, what to write."""

    model: DraModel
    pods: dict[str, PodDra] = field(default_factory=dict)  # pod key -> its claims (pods with gpuaas's claims)
    errors: dict[str, str] = field(default_factory=dict)  # pod key -> why its claims cannot be read or placed
    waiting: dict[str, str] = field(default_factory=dict)  # pod key -> which claims are not there yet
    nodes: dict[str, frozenset[str]] = field(default_factory=dict)  # pod key -> the nodes its constraint allows
    hostname: dict[str, str] = field(default_factory=dict)  # node name -> its kubernetes.io/hostname
    release: list[Release] = field(default_factory=list)  # pods gated for claims gpuaas does not allocate
    claims: dict[str, Obj] = field(default_factory=dict)  # claim key -> the claim, assumed writes merged in

    def pinned(self, key: str) -> str | None:
        dra = self.pods.get(key)
        if dra is None or not dra.node:
            return None
        return self.hostname.get(dra.node, dra.node)


def _merge_assumed(claims: Sequence[Obj], assumed: dict[str, Assumed], now: float) -> dict[str, Obj]:
    """The informer's claims with gpuaas's allocations it does not show yet; assumptions it shows, or too old, or
    of claims gone or replaced, are dropped."""
    by_key: dict[str, Obj] = {}
    for c in claims:
        meta = c.get("metadata") or {}
        by_key[f"{meta.get('namespace', '')}/{meta.get('name', '')}"] = c
    for key, a in list(assumed.items()):
        seen = by_key.get(key)
        if seen is None or (seen.get("metadata") or {}).get("uid") != a.uid or \
                (seen.get("status") or {}).get("allocation") or now > a.until:
            del assumed[key]
            continue
        merged = copy.deepcopy(seen)
        merged.setdefault("status", {})["allocation"] = copy.deepcopy(dict(a.allocation))
        merged["metadata"].setdefault("annotations", {})[ALLOCATED_FOR_ANNOTATION] = a.pod_uid
        by_key[key] = merged
    return by_key


def _cluster(inputs: DraInputs, claims: Mapping[str, Obj], assumed: Mapping[str, Assumed]) -> DraCluster:
    """The DRA nodes and what every allocated claim holds, gpuaas's writes not seen yet included: from what the view
    read (only the assumed claims read here), or from every slice and claim."""
    if inputs.parsed is None:
        return dra_cluster(inputs.slices, claims.values())
    allocated = dict(inputs.parsed.allocated)
    for key in assumed:  # _merge_assumed kept those the informer does not show allocated
        try:
            allocated[key] = tuple(allocated_devices(claims[key]))
        except (KeyError, ObjectError, ValueError):
            continue
    return dra_cluster_of(inputs.parsed.pools, inputs.parsed.devices, chain.from_iterable(allocated.values()),
                          inputs.parsed.errors)


def prepare(state: ClusterState, facts: Sequence[NodeFacts], pods: Iterable[Obj], inputs: DraInputs,
            assumed: dict[str, Assumed], now: float) -> DraRound:
    """Read the pods' claims and build the model with the DRA nodes (see the module docstring, steps 1-2)."""
    claims = _merge_assumed(inputs.claims, assumed, now)
    pods = list(pods)
    read: dict[str, PodDra] = {}
    errors: dict[str, str] = {}
    waiting: dict[str, str] = {}
    release: list[Release] = []
    for pod in pods:
        if not has_claims(pod) or (pod.get("spec") or {}).get("nodeName"):
            continue
        key = pod_key(pod)
        try:
            dra = pod_dra(pod, claims)
        except (ObjectError, ValueError) as err:
            errors[key] = str(err)
            continue
        if dra is None:
            continue
        if dra.missing:
            waiting[key] = "waiting for its claims: " + "; ".join(dra.missing)
            continue
        if not dra.ours:
            labels = (pod.get("metadata") or {}).get("labels") or {}
            if GANG_GATE in gates(pod) and not any(k in labels for k in GROUP_LABELS):
                release.append(Release(key, (pod.get("metadata") or {}).get("uid", "")))
            continue
        read[key] = dra
    wanted: Counter[str] = Counter(d.demand.mig_profile for d in read.values() if d.demand.mig_profile)
    cluster = _cluster(inputs, claims, assumed)
    model = dra_model(state, inputs.nodes, cluster, inputs.slices, wanted)
    out = DraRound(model, read, errors, waiting, release=release, claims=claims,
                   hostname={f.name: f.labels.get("kubernetes.io/hostname", f.name) for f in facts})
    for key, dra in read.items():
        count = same_root_count(dra)
        if count:
            out.nodes[key] = same_root_nodes(model, count)
    return out


def allocations(decisions: Sequence[GangDecision], rnd: DraRound, uids: Mapping[str, str], now: float,
                share_id: Callable[[], str] = lambda: str(uuid.uuid4())
                ) -> tuple[dict[str, list[Allocate]], dict[str, str]]:
    """Per released gang, the allocations of its members' claims not allocated yet, on the devices the plan's GPU
    indices are (step 4); and the gangs whose plan cannot become devices, with the reason (they wait this round)."""
    assigner = DeviceAssigner(rnd.model, share_id)
    stamp = rfc3339(now)
    out: dict[str, list[Allocate]] = {}
    failed: dict[str, str] = {}
    for d in decisions:
        if d.action != "release":
            continue
        writes: list[Allocate] = []
        try:
            for key, node, gpus in d.devices:
                dra = rnd.pods.get(key)
                if dra is None or not dra.unallocated:
                    continue
                results = assigner.assign(node, dra.unallocated, gpus)
                for claim in dra.unallocated:
                    writes.append(Allocate(d.gang, claim.claim, claim.uid, key, uids.get(key, ""),
                                           allocation(node, results[claim.claim], stamp, claim.demand.config)))
        except (UnsupportedClaim, ValueError) as err:
            failed[d.gang] = f"its plan cannot be allocated: {err}"
            continue
        if writes:
            out[d.gang] = writes
    return out, failed


def cleanup(rnd: DraRound, inputs: DraInputs, decisions: Sequence[GangDecision], gang_of: Mapping[str, str],
            now: float, bind_timeout_s: float) -> list[Deallocate]:
    """Allocations gpuaas made that no pod will use (step 5)."""
    waiting = {d.gang for d in decisions if d.action == "wait"}
    pod_of_claim = {c.claim: key for key, dra in rnd.pods.items() for c in dra.claims if c.by_gpuaas}
    out = []
    for key, obj in rnd.claims.items():
        status = obj.get("status") or {}
        if not status.get("allocation") or status.get("reservedFor") or \
                not ((obj.get("metadata") or {}).get("annotations") or {}).get(ALLOCATED_FOR_ANNOTATION):
            continue  # not gpuaas's, not allocated, or in use: what read_claim would say, without reading it all
        try:
            claim = read_claim(obj)
        except (ObjectError, ValueError):
            continue
        if claim is None or not claim.node or not claim.by_gpuaas or claim.reserved:
            continue
        at = _epoch(claim.allocated_at)
        age = now - at if at is not None else 0.0
        if claim.by_gpuaas not in inputs.live_uids and age > ORPHAN_GRACE_S:
            out.append(Deallocate(key, claim.uid, "the pod it was allocated for is gone"))
        elif gang_of.get(pod_of_claim.get(key, ""), "") in waiting and age > bind_timeout_s:
            out.append(Deallocate(key, claim.uid, f"its pod is still gated {age:.0f} s after the allocation (its "
                                  "gang could not be completed around it)"))
    return out


def claim_assumption(write: Allocate, now: float) -> Assumed:
    return Assumed(write.uid, write.allocation, write.pod_uid, now + ASSUME_TTL_S)


# -- the Kubernetes API ------------------------------------------------------------------------------------------------

class KubeClaims:
    """`ClaimWriter` on the Kubernetes API (resource.k8s.io/v1); every request bounded by `request_timeout` and made
    only while `may_act()`. RBAC: resourceclaims get, update; resourceclaims/status update; resourceclaims/binding
    update (writing status.allocation needs it besides the status update)."""

    def __init__(self, api: Any, *, request_timeout: float | None = None, may_act: Callable[[], bool] = lambda: True):
        from kubernetes import client

        self.resource = client.ResourceV1Api(api)
        self.timeout = request_timeout
        self.may_act = may_act

    def _read(self, key: str) -> Obj | None:
        from kubernetes.client.rest import ApiException

        ns, name = key.split("/", 1)
        try:
            return json.loads(self.resource.read_namespaced_resource_claim(
                name, ns, _preload_content=False, _request_timeout=self.timeout).data)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        except (HTTPError, OSError) as err:  # timed out or cut: nothing to act on this round
            log.warning("read %s: %s", key, err)
            return None

    def _write(self, what: str, key: str, fn: Callable[[], Any]) -> Obj | None:
        from kubernetes.client.rest import ApiException

        if not self.may_act():
            return None
        try:
            return json.loads(fn().data)
        except ApiException as err:
            if err.status in (404, 409, 422):  # gone, changed since read, or refused (the message says why)
                log.info("%s %s: %s %s", what, key, err.status, (err.body or "")[:300])
                return None
            raise
        except (HTTPError, OSError) as err:  # timed out or cut: a failed write (if it landed, the informer shows
            log.warning("%s %s: %s", what, key, err)  # the claim allocated and the next round releases onto it)
            return None

    def allocate(self, key: str, uid: str, allocation: Mapping[str, Any], pod_uid: str) -> bool:
        ns, name = key.split("/", 1)
        claim = self._read(key)
        if claim is None or claim["metadata"].get("uid") != uid or (claim.get("status") or {}).get("allocation"):
            return False
        meta = claim["metadata"]
        if FINALIZER not in (meta.get("finalizers") or []) or \
                (meta.get("annotations") or {}).get(ALLOCATED_FOR_ANNOTATION) != pod_uid:
            meta.setdefault("finalizers", [])
            if FINALIZER not in meta["finalizers"]:
                meta["finalizers"].append(FINALIZER)
            meta.setdefault("annotations", {})[ALLOCATED_FOR_ANNOTATION] = pod_uid
            body = claim
            written = self._write("protect", key, lambda: self.resource.replace_namespaced_resource_claim(
                name, ns, body, _preload_content=False, _request_timeout=self.timeout))
            if written is None:
                return False
            claim = written
        claim.setdefault("status", {})["allocation"] = dict(allocation)
        body = claim
        return self._write("allocate", key, lambda: self.resource.replace_namespaced_resource_claim_status(
            name, ns, body, _preload_content=False, _request_timeout=self.timeout)) is not None

    def deallocate(self, key: str, uid: str) -> bool:
        ns, name = key.split("/", 1)
        claim = self._read(key)
        if claim is None or claim["metadata"].get("uid") != uid:
            return False
        status = claim.get("status") or {}
        if status.get("reservedFor"):
            return False  # in use: kube-controller-manager deallocates it when its pods go
        if status.get("allocation"):
            status.pop("allocation")
            claim["status"] = status
            body = claim
            written = self._write("deallocate", key, lambda: self.resource.replace_namespaced_resource_claim_status(
                name, ns, body, _preload_content=False, _request_timeout=self.timeout))
            if written is None:
                return False
            claim = written
        meta = claim["metadata"]
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != ALLOCATED_FOR_ANNOTATION}
        if finalizers == (meta.get("finalizers") or []) and annotations == (meta.get("annotations") or {}):
            return True
        meta["finalizers"], meta["annotations"] = finalizers, annotations
        body = claim
        return self._write("unprotect", key, lambda: self.resource.replace_namespaced_resource_claim(
            name, ns, body, _preload_content=False, _request_timeout=self.timeout)) is not None

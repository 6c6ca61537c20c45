"""The gang controller's reconcile: members read from the pods, the decision of scoring.gangs on the live model, and
the commands that carry it out, as data (Pin, Ungate, Delete, Note), applied by a `PodWriter`: `KubePods` on the
Kubernetes API, a recording fake in the tests.

A release is two rounds of writes: every member is pinned first (a hostname nodeSelector, which a gated pod may
gain, and the time in `gpuaas.io/gang-released`), and only when every pin succeeded is the gate removed from every
member, at once. A pin that fails (the pod changed or went) leaves the gang gated; the next reconcile plans it again
with the pins already made as constraints, or resets it once they are too old. The gate is removed with a JSON patch
that first tests the gate's name at that index, so gpuaas never removes another component's gate.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from urllib3.exceptions import HTTPError

from runtime.events import EventRecorder, pod_ref
from scoring.constraints import HOSTNAME_LABEL
from scoring.fragmentation import Workload
from scoring.gangs import (
    GANG_GATE,
    RELEASED_ANNOTATION,
    Gang,
    GangDecision,
    GangSettings,
    GroupError,
    NodeFacts,
    created_at,
    decide,
    gates,
    group_of,
    member,
    solo_group,
)
from scoring.kubeobjects import PLANNED_DEVICES_ANNOTATION, ObjectError, format_planned_devices, pod_key
from scoring.model import ClusterState, PodDemand

from .dra import Allocate, Assumed, ClaimWriter, DraInputs, DraRound, allocations, claim_assumption, cleanup, prepare
from .metrics import Metrics

log = logging.getLogger("gpuaas.gangs")

Obj = dict[str, Any]
COMPONENT = "gpuaas-gangs"
WRITERS = 8  # pins and gate removals in flight at once
DRA_SHAPES = 5000  # pods whose claims' demand is remembered for the learned workload (the view's window)
WRITTEN = 1000  # allocations /claims remembers


@dataclass(frozen=True)
class Pin:
    key: str
    uid: str
    hostname: str
    released_at: float
    planned: str = ""  # the GPUs planned for it ("<node>:<i>,<j>", scoring.kubeobjects.PLANNED_DEVICES_ANNOTATION)


@dataclass(frozen=True)
class Ungate:
    key: str
    uid: str


@dataclass(frozen=True)
class Delete:
    key: str
    uid: str


@dataclass(frozen=True)
class Note:
    key: str
    uid: str
    type_: str
    reason: str
    message: str


Command = Pin | Ungate | Delete | Note | Allocate


class PodWriter(Protocol):
    """Each write returns False when the pod is gone or changed under it (the next reconcile sees why)."""

    def pin(self, key: str, uid: str, hostname: str, released_at: float, planned: str = "") -> bool: ...

    def ungate(self, key: str, uid: str) -> bool: ...

    def delete(self, key: str, uid: str) -> bool: ...

    def note(self, key: str, uid: str, type_: str, reason: str, message: str) -> None: ...


def finished(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or \
        bool((pod.get("metadata") or {}).get("deletionTimestamp"))


@dataclass
class Members:
    gangs: dict[str, Gang] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)  # pod key -> why its group or resources cannot be read
    uids: dict[str, str] = field(default_factory=dict)


def read_members(pods: Iterable[Obj], dra: DraRound | None = None) -> Members:
    """The gangs of the pods that are in a group and not finished; with `dra`, also each pod gpuaas allocates DRA
    claims for and holds (gated or released) as a gang of one, and every such member's demand is what its claims
    still ask, pinned to the node its allocated claims hold it to (gangs.dra)."""
    out = Members()
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels")
        if (not labels and dra is None) or finished(pod):
            continue
        key = pod_key(pod)
        try:
            ref = group_of(pod) if labels else None
            claims = dra.pods.get(key) if dra is not None else None
            held = GANG_GATE in gates(pod) or RELEASED_ANNOTATION in (meta.get("annotations") or {})
            if ref is None and dra is not None and held and (key in dra.errors or key in dra.waiting or claims):
                ref = solo_group(pod)
            if ref is None:
                continue
            if dra is not None and (key in dra.errors or key in dra.waiting):
                out.unreadable[key] = dra.errors.get(key) or dra.waiting[key]
                continue
            if claims is not None and dra is not None:
                m = member(pod, created_at(pod), demand=claims.demand, pinned=dra.pinned(key),
                           nodes=dra.nodes.get(key))
            else:
                m = member(pod, created_at(pod))
        except (GroupError, ObjectError, ValueError) as err:
            out.unreadable[pod_key(pod)] = str(err)
            continue
        out.uids[m.key] = m.uid
        gang = out.gangs.setdefault(ref.key, Gang(ref))
        gang.members.append(m)
    return out


def commands(decisions: Sequence[GangDecision], members: Members, now: float,
             told: dict[str, str], allocations: Mapping[str, Sequence[Allocate]] | None = None) -> list[Command]:
    """What carries the decisions out. `told` (gang -> the message last noted on its members) is updated, so that a
    waiting gang's reason is noted when it changes, not every round. `allocations`: per released gang, its members'
    DRA claims to allocate, before any member is pinned."""
    out: list[Command] = []
    for d in decisions:
        gang = members.gangs[d.gang]
        by_key = {m.key: m for m in gang.members}
        if d.action == "release":
            out += list((allocations or {}).get(d.gang, ()))
            planned = {k: format_planned_devices(node, devices) for k, node, devices in d.devices if devices}
            out += [Pin(k, by_key[k].uid, host, now, planned.get(k, "")) for k, host in d.pins]
            out += [Ungate(k, by_key[k].uid) for k, _ in d.pins]
            out += [Note(k, by_key[k].uid, "Normal", "GangReleased", f"gang {d.gang}: {d.message}") for k, _ in d.pins]
            told.pop(d.gang, None)
        elif d.action == "wait":
            if told.get(d.gang) != d.message:
                told[d.gang] = d.message
                told_to = [m for m in gang.members if m.gated] or [m for m in gang.members if m.node is None]
                out += [Note(m.key, m.uid, "Normal", "GangWaiting", f"gang {d.gang}: {d.message}") for m in told_to]
        elif d.action == "reset":
            for m in gang.members:
                if m.owned:
                    out.append(Delete(m.key, m.uid))
                else:
                    out.append(Note(m.key, m.uid, "Warning", "GangReset", f"gang {d.gang}: {d.message}; this pod "
                                    "has no controller to create it again: delete and create the gang's pods"))
            out += [Note(m.key, m.uid, "Warning", "GangReset", f"gang {d.gang}: {d.message}")
                    for m in gang.members if m.owned]
            told.pop(d.gang, None)
        else:  # placed
            told.pop(d.gang, None)
    return out


def _stuck(d: GangDecision, gang: Gang) -> GangDecision:
    """A reset of a gang none of whose members has an owner to create it again would delete what no one brings back:
    such a gang waits on its pins (it binds if room frees there), and its members are told what to do."""
    if any(m.owned for m in gang.members):
        return d
    return GangDecision(d.gang, "wait", f"{d.message.split(':')[0]}; no member has a controller to create it "
                        "again, so gpuaas leaves them pinned: delete and create the gang's pods to place it anew",
                        (), d.members)


@dataclass
class Report:
    released: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    reset: list[str] = field(default_factory=list)
    failed_writes: int = 0
    allocated: int = 0  # DRA claims allocated
    deallocated: int = 0  # DRA allocations cleared (no pod will use them)
    dra_errors: int = 0  # devices held twice or more (allocations made past gpuaas)


class GangController:
    """Plans the waiting gangs and carries the decisions out through `writer`."""

    def __init__(self, settings: GangSettings, writer: PodWriter, metrics: Metrics | None = None, *,
                 claims: ClaimWriter | None = None):
        self.settings = settings
        self.writer = writer
        self.metrics = metrics
        self.claims = claims  # allocates DRA claims (gangs.dra); None: pods' claims are kube-scheduler's
        self.assumed: dict[str, Assumed] = {}  # claim key -> an allocation written, until the informer shows it
        self.dra_shapes: dict[str, PodDemand] = {}  # pod key -> what its claims ask, for the learned workload
        self.written: dict[str, dict[str, Any]] = {}  # claim key -> the allocation gpuaas wrote (last WRITTEN)
        self.told: dict[str, str] = {}
        self._pool = ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="gang-writes")
        self.last: dict[str, GangDecision] = {}  # gang -> its last decision, for /explain
        self.gang_of: dict[str, str] = {}  # member pod key -> gang
        self.unreadable: dict[str, str] = {}

    def reconcile(self, state: ClusterState, facts: Sequence[NodeFacts], pods: Iterable[Obj], now: float,
                  workload: Workload | None = None, dra: DraInputs | None = None) -> Report:
        pods = list(pods)
        rnd = None
        if dra is not None and self.claims is not None:
            rnd = prepare(state, facts, pods, dra, self.assumed, now)
            state = rnd.model.state
            self._remember_shapes(rnd)
        members = read_members(pods, rnd)
        decisions = decide(state, facts, list(members.gangs.values()), now, self.settings, workload)
        writes: dict[str, list[Allocate]] = {}
        if rnd is not None:
            writes, unplaceable = allocations(decisions, rnd, members.uids, now)
            decisions = [GangDecision(d.gang, "wait", unplaceable[d.gang], (), d.members) if d.gang in unplaceable
                         else d for d in decisions]
        decisions = [_stuck(d, members.gangs[d.gang]) if d.action == "reset" else d for d in decisions]
        self.last = {d.gang: d for d in decisions}
        self.gang_of = {m.key: g.ref.key for g in members.gangs.values() for m in g.members}
        self.unreadable = members.unreadable
        report = Report()
        pins_failed: set[str] = set()
        not_allocated: set[str] = set()  # gangs a claim of which could not be allocated: no pin, no release
        gang_of_key = self.gang_of
        cmds = commands(decisions, members, now, self.told, writes)
        # DRA claims first: a gang any claim of which fails is neither pinned nor released. Each gang's claims one
        # after another, different gangs' in parallel (a burst's first round allocates a thousand claims).
        per_gang: dict[str, list[Allocate]] = {}
        for c in cmds:
            if isinstance(c, Allocate):
                per_gang.setdefault(c.gang, []).append(c)
        for gang, (written, failures) in zip(per_gang, self._in_parallel(self._allocate_gang, list(per_gang.values())),
                                             strict=True):
            report.failed_writes += failures
            if not written:
                not_allocated.add(gang)
                pins_failed.add(gang)
                continue
            for c in written:
                self.assumed[c.claim] = claim_assumption(c, now)
                self._record(c)
                report.allocated += 1
        # Every pin of every released gang, then every gate of the gangs pinned whole: each round of writes in
        # parallel (a burst releases hundreds of members; one by one they took a quarter of a second each).
        pins = [c for c in cmds if isinstance(c, Pin) and gang_of_key.get(c.key) not in not_allocated]
        for c, ok in zip(pins, self._in_parallel(
                lambda c: self.writer.pin(c.key, c.uid, c.hostname, c.released_at, c.planned), pins), strict=True):
            if not ok:
                pins_failed.add(gang_of_key[c.key])
                report.failed_writes += 1
        ungates = [c for c in cmds if isinstance(c, Ungate) and gang_of_key[c.key] not in pins_failed]
        report.failed_writes += sum(not ok for ok in self._in_parallel(
            lambda c: self.writer.ungate(c.key, c.uid), ungates))
        for c in cmds:
            if isinstance(c, Delete):
                if not self.writer.delete(c.key, c.uid):
                    report.failed_writes += 1
            elif isinstance(c, Note):
                self.writer.note(c.key, c.uid, c.type_, c.reason, c.message)
        if rnd is not None and dra is not None:
            self._dra_housekeeping(rnd, dra, decisions, now, report)
        for d in decisions:
            if d.action == "release" and d.gang not in pins_failed:
                report.released.append(d.gang)
            elif d.action == "wait":
                report.waiting[d.gang] = d.message
            elif d.action == "reset":
                report.reset.append(d.gang)
        if self.metrics is not None:
            self.metrics.observe(report)
        return report

    def _allocate_gang(self, writes: Sequence[Allocate]) -> tuple[list[Allocate], int]:
        """One gang's claims, in order: (the allocations written, failed writes). All or nothing: when a claim
        fails, what the gang got this round is deallocated and nothing is returned as written."""
        claims = self.claims
        if claims is None:
            return [], len(writes)
        done: list[Allocate] = []
        for c in writes:
            if claims.allocate(c.claim, c.uid, c.allocation, c.pod_uid):
                done.append(c)
                continue
            return [], 1 + sum(1 for w in done if not claims.deallocate(w.claim, w.uid))
        return done, 0

    def _in_parallel(self, write: Callable[[Any], Any], commands_: Sequence[Any]) -> list[Any]:
        if len(commands_) <= 1:
            return [write(c) for c in commands_]
        return list(self._pool.map(write, commands_))

    def _record(self, write: Allocate) -> None:
        """What /claims shows: the last WRITTEN allocations gpuaas made, by claim."""
        self.written.pop(write.claim, None)
        self.written[write.claim] = {"pod": write.pod, "gang": write.gang,
                                     "node": write.allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
                                     ["values"][0], "results": write.allocation["devices"]["results"],
                                     "allocationTimestamp": write.allocation["allocationTimestamp"]}
        while len(self.written) > WRITTEN:
            self.written.pop(next(iter(self.written)))

    def _remember_shapes(self, rnd: DraRound) -> None:
        for key, claims in rnd.pods.items():
            if claims.demand.gpus and key not in self.dra_shapes:
                self.dra_shapes[key] = claims.demand
        while len(self.dra_shapes) > DRA_SHAPES:
            self.dra_shapes.pop(next(iter(self.dra_shapes)))

    def _dra_housekeeping(self, rnd: DraRound, dra: DraInputs, decisions: Sequence[GangDecision], now: float,
                          report: Report) -> None:
        """Pods gated for other drivers' claims let go; allocations no pod will use cleared (gangs.dra)."""
        for r in rnd.release:
            if not self.writer.ungate(r.key, r.uid):
                report.failed_writes += 1
        for d in cleanup(rnd, dra, decisions, self.gang_of, now, self.settings.bind_timeout_s):
            log.info("deallocating %s: %s", d.claim, d.reason)
            if self.claims is not None and self.claims.deallocate(d.claim, d.uid):
                report.deallocated += 1
            else:
                report.failed_writes += 1
        report.dra_errors = len(rnd.model.errors)

    def explain(self, key: str) -> dict[str, Any]:
        """Why the pod `key` (namespace/name) is where it is, as far as gangs go."""
        if key in self.unreadable:
            return {"pod": key, "gang": None, "error": self.unreadable[key]}
        gang = self.gang_of.get(key)
        if gang is None:
            return {"pod": key, "gang": None, "message": "not a member of any group gpuaas sees"}
        d = self.last.get(gang)
        return {"pod": key, "gang": gang, "action": d.action if d else "released",
                "message": d.message if d else "released; waiting for every member to bind",
                "pins": dict(d.pins) if d else {}}


class KubePods:
    """`PodWriter` on the Kubernetes API; every request bounded by `request_timeout` and made only while `may_act()`."""

    def __init__(self, api: Any, *, request_timeout: float | None = None, may_act: Callable[[], bool] = lambda: True):
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.timeout = request_timeout
        self.may_act = may_act
        self.events = EventRecorder(self.core, COMPONENT, request_timeout=request_timeout, may_act=may_act)

    def _call(self, what: str, key: str, fn: Callable[[], Any]) -> bool:
        from kubernetes.client.rest import ApiException

        if not self.may_act():
            return False
        try:
            fn()
            return True
        except ApiException as err:
            if err.status in (404, 409, 422):  # gone, changed (a precondition or a patch test failed)
                log.info("%s %s: %s %s", what, key, err.status, (err.body or "")[:300])
                return False
            raise
        except (HTTPError, OSError) as err:  # timed out or cut: a failed write (it may have landed; the next round
            log.warning("%s %s: %s", what, key, err)  # reads what it did), not the end of the round
            return False

    def _read(self, key: str) -> Obj | None:
        from kubernetes.client.rest import ApiException

        ns, name = key.split("/", 1)
        try:
            return json.loads(self.core.read_namespaced_pod(name, ns, _preload_content=False,
                                                            _request_timeout=self.timeout).data)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        except (HTTPError, OSError) as err:  # timed out or cut: nothing to act on this round
            log.warning("read %s: %s", key, err)
            return None

    def pin(self, key: str, uid: str, hostname: str, released_at: float, planned: str = "") -> bool:
        """One merge patch, no read: the uid in it makes the apiserver refuse it for another pod of that name (uid
        is immutable), and a pod no longer gated refuses a new nodeSelector entry."""
        ns, name = key.split("/", 1)
        annotations = {RELEASED_ANNOTATION: f"{released_at:.3f}"}
        if planned:
            annotations[PLANNED_DEVICES_ANNOTATION] = planned
        patch = {"metadata": {"uid": uid, "annotations": annotations},
                 "spec": {"nodeSelector": {HOSTNAME_LABEL: hostname}}}
        return self._call("pin", key, lambda: self.core.patch_namespaced_pod(
            name, ns, patch, _content_type="application/merge-patch+json", _preload_content=False,
            _request_timeout=self.timeout))

    def ungate(self, key: str, uid: str) -> bool:
        ns, name = key.split("/", 1)
        pod = self._read(key)
        if pod is None or pod["metadata"].get("uid") != uid:
            return False
        names = list(gates(pod))
        if GANG_GATE not in names:
            return True  # removed already
        i = names.index(GANG_GATE)
        patch = [{"op": "test", "path": "/metadata/uid", "value": uid},
                 {"op": "test", "path": f"/spec/schedulingGates/{i}/name", "value": GANG_GATE},
                 {"op": "remove", "path": f"/spec/schedulingGates/{i}"}]
        return self._call("ungate", key, lambda: self.core.patch_namespaced_pod(
            name, ns, patch, _content_type="application/json-patch+json", _preload_content=False,
            _request_timeout=self.timeout))

    def delete(self, key: str, uid: str) -> bool:
        ns, name = key.split("/", 1)
        body = {"preconditions": {"uid": uid}}
        return self._call("delete", key, lambda: self.core.delete_namespaced_pod(
            name, ns, body=body, _preload_content=False, _request_timeout=self.timeout))

    def note(self, key: str, uid: str, type_: str, reason: str, message: str) -> None:
        self.events.event(pod_ref(key, uid), type_, reason, message)

    def close(self) -> None:
        self.events.close()


def _escape(key: str) -> str:
    """A map key as one JSON-pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")

"""The live view of the cluster: Nodes and Pods as informers deliver them, kept as a scoring model. The extender
decides on it and the node scaler plans on it; it is pure (objects in, model out, an injected clock), so both
feed it from their own watches.

Pods that hold resources (bound, not finished) are placed into the model on the GPUs gpuaas recorded for them
(`gpuaas.io/devices`), or, for pods bound by someone else, on the GPUs the policy would have chosen. Pods the extender
has just bound are *assumed*: placed at once, before the watch shows them bound, so that a burst of pods never
double-books a GPU; an assumption the watch does not confirm within `assume_ttl` seconds is dropped.

Pod changes are applied in place, and the policy is told which node changed (`Policy.observe`). So are changes of the
node set: a node added, removed or read differently (a label its NodeSpec holds, its capacity) changes that node's row
of the model and of the policy's tables at the next `snapshot()` (`ClusterState.insert_node`, `delete_node`,
`reset_node`; rows stay in name order) and places that node's pods on it again, as a rebuild would place them. The
model is built anew instead for the first snapshot, for a node whose GPU model the cluster did not have or no longer has
(the model's columns change), for a DRA node, and for more than REBUILD_BATCH node changes at once. Not thread-safe: one
thread (an event loop) owns it.

DRA nodes (scoring.draview): fed ResourceSlices and ResourceClaims too, a node labelled gpuaas.io/dra has the GPUs its
slices publish, and every allocated claim holds its devices in the model as a bound pod holds its GPUs (the claims'
pods themselves ask for CPU and memory only); a claim allocated, changed or deallocated is applied in place, a change
of slices or of MIG partitions rebuilds.
"""
from __future__ import annotations

import bisect
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from scoring.constraints import HOSTNAME_LABEL, PodTerm, Taint, node_taints, pod_terms
from scoring.draview import CLAIM_KIND, SLICE_KIND, DraView, Hold, claim_owner
from scoring.fit import misfit_reason
from scoring.fragmentation import Workload
from scoring.gangs import GANG_GATE, pod_release_order
from scoring.gpus import UnknownGpuModelError, get_model
from scoring.kubeobjects import (
    DEVICES_ANNOTATION,
    BoundPod,
    ObjectError,
    assigned_devices,
    demand_key,
    holds_resources,
    node_spec,
    pod_demand,
    pod_key,
)
from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.policies import Policy, make_policy
from scoring.queueplan import QueuedPod

log = logging.getLogger(__name__)

Obj = dict[str, Any]
WORKLOAD_WINDOW = 5000
EMPTY_CLUSTER_WORKLOAD_POD = PodDemand(cpu_milli=4000, memory_mib=16384, gpus=1, gpu_milli=1000)
# More node changes than this (or than a twentieth of the nodes) waiting at one snapshot build the model anew: applying
# each costs its own copy of the columns (about 1 ms at 5,000 nodes, bench/extender_model.py), a rebuild 0.3-0.7 s.
REBUILD_BATCH = 64


def workload_due(new: int, seen: int) -> bool:
    """Whether the learned workload is re-derived, `new` of the `seen` arrivals being new since it last was: once a
    tenth of the window is new, so after every one of the first ten pods. The first pods decide most (placed under
    the few shapes known so far, they set the layout later pods fill): waiting for 50 new pods first cost 0.43 points
    of GPU allocation on average and up to 1.7 against the whole trace's workload (100- and 200-node Alibaba slices,
    seeds 42-44, ten tie orders each); this schedule costs 0.17."""
    return new >= max(1, min(seen, WORKLOAD_WINDOW) // 10)


def _devices_note(pod: Obj) -> str | None:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(DEVICES_ANNOTATION)


@dataclass
class Placement:
    node: str
    demand: PodDemand
    devices: tuple[int, ...]


class ClusterView:
    def __init__(self, policy: str = "gpuaas", *, assume_ttl: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 workload: Workload | None = None):
        self.policy_name = policy
        self.assume_ttl = assume_ttl
        self.clock = clock
        self.fixed_workload = workload
        self.nodes: dict[str, Obj] = {}
        self.specs: dict[str, NodeSpec] = {}
        self.bad_nodes: dict[str, str] = {}  # nodes that could not be read, with the reason (shown in filter)
        self.pods: dict[str, BoundPod] = {}  # pods holding resources, by namespace/name
        self.placements: dict[str, Placement] = {}  # what the model holds, by pod key
        self.assumed: dict[str, float] = {}  # pod key -> deadline, for the placements only this extender knows
        self.state: ClusterState | None = None
        self.policy: Policy | None = None
        self._dirty = True
        self.queue: dict[str, QueuedPod] = {}  # GPU pods waiting for a node (not bound, not finished), first seen
        self.pinned: dict[str, None] = {}  # the keys in `queue` of pods pinned to a node (QueuedPod.pinned)
        self.recent: OrderedDict[str, PodDemand] = OrderedDict()
        self._demands: dict[bytes, PodDemand] = {}
        self._new_arrivals = 0
        self.rebuilds = 0
        self.parse_errors = 0
        self.dra = DraView()
        # pods with claims held by gpuaas's gate alone -> first seen so, and where the gang controller takes them
        self._gated_claims: dict[str, tuple[float, tuple[int, float, str]]] = {}
        self._claim_allocated: dict[str, str | None] = {}  # pods whose generated claim is allocated -> its node
        self._claims_before_pod: dict[str, Obj] = {}  # pod key -> its claim, seen before the pod was
        self._held: dict[str, list[Hold]] = {}  # claim key -> the holds placed in `state`
        self._rebuilding = False  # re-placing everything: the policy's node tables are made once, at the end
        self._node_changes: dict[str, None] = {}  # nodes whose spec changed since the model last took them, in order
        self._bound_on: dict[str, dict[str, None]] = {}  # node -> keys of `pods` bound there, in `pods`' order
        self._placed_on: dict[str, dict[str, None]] = {}  # node -> keys of `placements` there, in their order
        # Bumped when the model's rows were renumbered or one was made anew (a rebuild, a node's row changed): work
        # keyed by row (the extender's queue plan and its copy of the model) is made again.
        self.rows_version = 0
        # Every change of a row's usage is counted, and the count stamped on the row: who keeps a copy of the model
        # (the extender's queue plan) takes back only the rows changed since it last looked (`changed_rows`).
        self.row_changes = 0
        self._row_stamps = np.zeros(0, dtype=np.int64)
        # What kube-scheduler's own scores weigh besides the pod (scoring.constraints): nodes' PreferNoSchedule
        # taints, and the pod affinity terms of the pods holding resources, by node name and pod key.
        self.prefer_no_schedule: dict[str, tuple[Taint, ...]] = {}
        self.pod_terms: dict[str, tuple[PodTerm, ...]] = {}

    # ---- informer events -------------------------------------------------------------------------------------------
    def on_change(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if kind == "Node":
            self._on_node(old, new)
        elif kind == "Pod":
            self._on_pod(old, new)
        elif kind == SLICE_KIND:
            self._respec(self.dra.on_slice(old, new))
            self._dirty = True  # the claims' holds were read again against the new devices
        elif kind == CLAIM_KIND:
            self._on_claim(old, new)

    def _on_node(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        if obj is None:  # the informer's DELETED event for an object it never stored: raised, as before, and logged
            raise ValueError("a change without an object")
        name = obj["metadata"]["name"]
        if new is None:
            self.nodes.pop(name, None)
            self.bad_nodes.pop(name, None)
            self.prefer_no_schedule.pop(name, None)
            gone = self.specs.pop(name, None)
            if gone is not None:
                self._node_changed(name, gone, None)
            return
        self.nodes[name] = new
        try:
            preferred = tuple(t for t in node_taints(new) if t[2] == "PreferNoSchedule")
        except (AttributeError, TypeError):  # taints the apiserver would not have stored: none to weigh
            preferred = ()
        if preferred:
            self.prefer_no_schedule[name] = preferred
        else:
            self.prefer_no_schedule.pop(name, None)
        try:
            spec = self.dra.node_spec(new, node_spec(new))
            self.bad_nodes.pop(name, None)
        except (ObjectError, UnknownGpuModelError, ValueError) as err:
            self.parse_errors += 1
            self.bad_nodes[name] = str(err)
            spec = None
        before = self.specs.get(name)
        if spec != before:  # heartbeats change conditions only: nothing to do for those
            if spec is None:
                self.specs.pop(name, None)
            else:
                self.specs[name] = spec
            self._node_changed(name, before, spec)

    def _node_changed(self, name: str, before: NodeSpec | None, after: NodeSpec | None) -> None:
        """Take the node's new spec at the next snapshot: its row alone, or the whole model for a DRA node (its
        claims' holds are placed per claim across nodes, with the slices read again)."""
        if (before is not None and before.dra) or (after is not None and after.dra):
            self._dirty = True
        else:
            self._node_changes[name] = None

    def _on_pod(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        if obj is None:  # the informer's DELETED event for an object it never stored: raised, as before, and logged
            raise ValueError("a change without an object")
        key = pod_key(obj)
        if new is not None and key not in self.recent:
            self._learn(key, new)
            early = self._claims_before_pod.pop(key, None)
            if early is not None:  # its claim came first (an informer's first list): what the pod asks is in it
                self._learn_claim(early)
        self._track_queue(key, new)
        self._track_gated_claims(key, new)
        if new is None or not holds_resources(new):
            self._forget_pod(key)
            self.pod_terms.pop(key, None)
            placement = self.placements.get(key)
            # An assumed pod seen before its binding (nodeName still empty) keeps its GPUs; a deleted or finished
            # one gives them back.
            finished = new is None or (new.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if placement is not None and (key not in self.assumed or finished):
                self._unplace(key)
            return
        if (old is not None and key in self.pods and key not in self.assumed and holds_resources(old)
                and old["spec"]["nodeName"] == new["spec"]["nodeName"]
                and _devices_note(old) == _devices_note(new)):
            return  # a status update (Running, conditions): nothing the model holds changed
        try:
            terms = pod_terms(new) if new["spec"].get("affinity") else ()
        except (KeyError, TypeError, AttributeError):  # terms the apiserver would not have stored: none to weigh
            terms = ()
        if terms:
            self.pod_terms[key] = terms
        else:
            self.pod_terms.pop(key, None)
        try:
            bound = BoundPod(key, new["spec"]["nodeName"], self.demand(new), assigned_devices(new))
        except (ObjectError, UnknownGpuModelError, ValueError) as err:
            self.parse_errors += 1
            log.warning("ignoring %s: %s", key, err)
            return
        self._keep_pod(bound)
        placement = self.placements.get(key)
        if placement is not None:
            same = placement.node == bound.node and (bound.devices is None or bound.devices == placement.devices)
            if same:
                self.assumed.pop(key, None)  # the watch confirms what was assumed
                return
            self._unplace(key)
        self._place(bound)

    def _keep_pod(self, bound: BoundPod) -> None:
        before = self.pods.get(bound.key)
        if before is not None and before.node != bound.node:  # (a pod's node never changes in Kubernetes)
            self._bound_on[before.node].pop(bound.key, None)
        self.pods[bound.key] = bound
        self._bound_on.setdefault(bound.node, {})[bound.key] = None

    def _forget_pod(self, key: str) -> None:
        bound = self.pods.pop(key, None)
        if bound is not None:
            on = self._bound_on[bound.node]
            del on[key]
            if not on:
                del self._bound_on[bound.node]

    def _record(self, key: str, placement: Placement) -> None:
        self.placements[key] = placement
        self._placed_on.setdefault(placement.node, {})[key] = None

    def _drop(self, key: str) -> Placement | None:
        placement = self.placements.pop(key, None)
        if placement is not None:
            on = self._placed_on[placement.node]
            del on[key]
            if not on:
                del self._placed_on[placement.node]
        return placement

    def _track_queue(self, key: str, pod: Obj | None) -> None:
        """Keep `queue`: GPU pods without a node that are neither finished nor being deleted, nor held out of
        scheduling by a gate (a gang's members until the gang controller releases them: planning them here would
        promise their room to no one), with the node a hostname nodeSelector pins them to (scoring.queueplan). Also a
        pod with DRA claims released onto its node and not bound yet: it reads as CPU and memory only (its claims hold
        its GPUs), and the plan keeps that room for it on its node, where kube-scheduler does not count it yet (a
        pod held off the plan's room, tried again meanwhile, took it: 8 released pods of a 50-node burst never
        bound). Such a pod is queued so from the moment its claim is allocated (_queue_gated_claims)."""
        spec = (pod or {}).get("spec") or {}
        if (pod is None or spec.get("nodeName") or spec.get("schedulingGates")
                or (pod.get("metadata") or {}).get("deletionTimestamp")
                or (pod.get("status") or {}).get("phase", "Pending") != "Pending"):
            self._dequeue(key)
            return
        queued = self.queue.get(key)
        if queued is not None and queued.release_order is None:  # (a gated pod's entry: it has just been released)
            return
        try:
            demand = self.demand(pod)
        except (ObjectError, UnknownGpuModelError, ValueError):
            return
        pinned = (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL)
        if demand.gpus or (pinned and spec.get("resourceClaims")):
            self._enqueue(QueuedPod(key, demand, self.clock(), pinned))

    def _learn_claim(self, claim: Obj) -> None:
        shape = self.dra.pod_shape(claim, self.recent)
        if shape is not None:
            self.recent[shape[0]] = shape[1]
            self._new_arrivals += 1

    def _track_gated_claims(self, key: str, pod: Obj | None) -> None:
        """`_gated_claims`: pods with claims that only gpuaas's gate holds (the gang controller allocates their claims
        and releases them), by the time first seen so, with the place the controller takes them in."""
        spec = (pod or {}).get("spec") or {}
        held = (pod is not None and bool(spec.get("resourceClaims")) and not spec.get("nodeName")
                and [g.get("name") for g in spec.get("schedulingGates") or ()] == [GANG_GATE]
                and not (pod.get("metadata") or {}).get("deletionTimestamp")
                and (pod.get("status") or {}).get("phase", "Pending") == "Pending")
        if held and key not in self._gated_claims and pod is not None:
            self._gated_claims[key] = (self.clock(), pod_release_order(pod))
        elif not held and key in self._gated_claims:
            del self._gated_claims[key]
        if pod is None:
            self._claim_allocated.pop(key, None)
        self._queue_gated_claims(key)

    def _queue_gated_claims(self, key: str) -> None:
        """A pod held for the gang controller is in `queue` as the GPUs its claim asks (learned from the claim) while
        the claim is not allocated: demand the joint plan keeps room for, so that what is ranked meanwhile (a burst's
        CPU-only pods, through the CPU-pods entry) keeps off it. Once allocated, the claim holds its GPUs itself, and
        the pod is queued as its CPU and memory pinned to the claim's node, until it binds."""
        shape = self.recent.get(key)
        entry = None
        if key in self._gated_claims and shape is not None:
            since, order = self._gated_claims[key]
            if key not in self._claim_allocated:
                if shape.gpus and shape.claims:
                    entry = QueuedPod(key, shape, since, release_order=order)
            else:  # allocated, not released yet: the claim holds the GPUs; the pod's CPU and memory wait for it on
                # the claim's node until it binds (kept once it is released: _track_queue)
                node = self._claim_allocated[key] or ""
                host = (((self.nodes.get(node) or {}).get("metadata") or {}).get("labels") or {}).get(HOSTNAME_LABEL)
                if host:
                    entry = QueuedPod(key, PodDemand(cpu_milli=shape.cpu_milli, memory_mib=shape.memory_mib,
                                                     name=shape.name), since, host)
        current = self.queue.get(key)
        if entry is not None:
            if current is None or (current.pinned, current.release_order) != (entry.pinned, entry.release_order):
                self._enqueue(entry)
        elif current is not None and (key in self._gated_claims or current.demand.claims):
            self._dequeue(key)

    def _enqueue(self, entry: QueuedPod) -> None:
        self.queue[entry.key] = entry
        if entry.pinned is not None:
            self.pinned[entry.key] = None
        else:
            self.pinned.pop(entry.key, None)

    def _dequeue(self, key: str) -> None:
        self.queue.pop(key, None)
        self.pinned.pop(key, None)

    def rows_by_hostname(self) -> dict[str, int]:
        """Model row of each node by its kubernetes.io/hostname label (what a pinning nodeSelector names)."""
        assert self.state is not None, "snapshot() first"
        out = {}
        for name, row in self.state.index.items():
            host = (((self.nodes.get(name) or {}).get("metadata") or {}).get("labels") or {}).get(HOSTNAME_LABEL)
            if host:
                out[host] = row
        return out

    def changed_rows(self, since: int) -> np.ndarray:
        """Rows of the model whose usage changed after `row_changes` was `since` (pods placed, removed, assumed, DRA
        holds); valid while `rows_version` stays the same (rows renumbered or made anew are not listed)."""
        n = len(self.state) if self.state is not None else 0
        return np.flatnonzero(self._row_stamps[:n] > since)

    def waiting(self) -> list[QueuedPod]:
        """The queue without the pods this extender holds GPUs for already (assumed, the binding not yet seen)."""
        return [p for k, p in self.queue.items() if k not in self.placements]

    def waiting_count(self) -> int:
        """len(waiting()) without a pass over the queue, which every filter asks for: a queued pod (no node yet) has
        a placement only while it is assumed, and few are."""
        return len(self.queue) - sum(1 for k in self.assumed if k in self.queue and k in self.placements)

    # ---- the model -------------------------------------------------------------------------------------------------
    def snapshot(self) -> tuple[ClusterState, Policy]:
        """The live model and its policy, rebuilt first if the node set changed; expired assumptions dropped."""
        self._expire_assumptions()
        if self._dirty or self.state is None or (self._node_changes and not self._apply_node_changes()):
            self._rebuild()
        elif self._workload_moved():
            self._new_arrivals = 0
            self.policy = make_policy(self.policy_name, self.state, self.workload())
        assert self.state is not None and self.policy is not None
        return self.state, self.policy

    def _learn(self, key: str, pod: Obj) -> None:
        """Remember the shape of a pod seen for the first time: the workload FGD-style scores weigh is the shapes of
        the last WORKLOAD_WINDOW pods that arrived, pending or placed, as FGD's target workload is the arrivals."""
        try:
            self.recent[key] = self.demand(pod)
        except (ObjectError, UnknownGpuModelError, ValueError):
            return
        if len(self.recent) > WORKLOAD_WINDOW:
            self.recent.popitem(last=False)
        self._new_arrivals += 1

    def workload(self) -> Workload:
        """The pod shapes FGD-style scores weigh: configured, or those of recently arrived pods."""
        if self.fixed_workload is not None:
            return self.fixed_workload
        demands = list(self.recent.values())
        if not demands:  # an empty cluster: assume one-GPU pods, the most common shape in every published trace
            demands = [EMPTY_CLUSTER_WORKLOAD_POD]
        return Workload.typical(demands)

    def _workload_moved(self) -> bool:
        # Re-deriving the workload rebuilds the policy's per-node tables: not for every pod (workload_due).
        return self.fixed_workload is None and workload_due(self._new_arrivals, len(self.recent))

    def _rebuild(self) -> None:
        self._new_arrivals = 0
        version = self.state.version if self.state is not None else -1
        self.state = ClusterState(sorted(self.specs.values(), key=lambda s: s.name))
        # Versions keep rising across rebuilds: work cached per (version, rows) must not match a renumbered model.
        self.state.version = version + 1
        self._node_changes = {}
        self.rows_version += 1
        workload = self.workload()
        # A policy for the device choices below (they read the state, not the policy's tables).
        self.policy = make_policy(self.policy_name, self.state, workload)
        self.rebuilds += 1
        self._dirty = False
        old, old_assumed = self.placements, self.assumed
        self.placements, self.assumed, self._placed_on = {}, {}, {}
        # Refreshing a node's tables after each pod re-placed made a rebuild cost O(pods x shapes) (extender_model).
        self._rebuilding = True
        try:
            # Re-place what was held: confirmed pods first (the apiserver's truth), then live assumptions.
            for key, bound in self.pods.items():
                self._place(bound, keep_assumed=old.get(key))
            for key, placement in old.items():
                if key not in self.placements and key in old_assumed:
                    self._reassume(key, placement)
            self._held = {}
            for key, holds in self.dra.holds.items():
                self._hold(key, holds)
        finally:
            self._rebuilding = False
        self.policy = make_policy(self.policy_name, self.state, workload)  # tables of the filled model

    def _reassume(self, key: str, placement: Placement) -> None:
        """Hold an assumption's GPUs again after its node's row was made anew; dropped if its node is gone or no
        longer has them (the binding, if it happens, is then placed from the watch)."""
        state = self.state
        assert state is not None
        row = state.index.get(placement.node)
        if row is None:
            log.warning("dropping the assumed binding of %s to %s: the node is gone", key, placement.node)
            return
        try:
            state.place_or_refuse(row, placement.demand, placement.devices)
        except (ValueError, KeyError, IndexError) as err:
            log.warning("dropping the assumed binding of %s to %s: %s", key, placement.node, err)
            return
        self._record(key, placement)
        self.assumed[key] = self.clock() + self.assume_ttl

    def _apply_node_changes(self) -> bool:
        """The waiting node changes, each on its own row; False (nothing changed) when the model must be built anew:
        too many at once, a GPU model the model lacks or would lose the last node of."""
        state, changes = self.state, self._node_changes
        assert state is not None
        if len(changes) > max(REBUILD_BATCH, len(state) // 20):
            return False
        nodes_of = np.bincount(state.model_idx[state.gpu_count > 0], minlength=len(state.models))
        models = dict(enumerate(nodes_of.tolist()))  # GPU nodes per model column
        for name in changes:
            row = state.index.get(name)
            before, after = (state.nodes[row] if row is not None else None), self.specs.get(name)
            if after is not None and not state.covers(after):
                return False
            for spec, step in ((before, -1), (after, 1)):
                if spec is not None and spec.gpus:
                    m = state.model_pos[get_model(spec.gpu_model).name]
                    models[m] = models.get(m, 0) + step
        if any(n <= 0 for n in models.values()):
            return False
        self._node_changes = {}
        for name in changes:
            self._apply_node(name)
        self.rows_version += 1
        return True

    def _apply_node(self, name: str) -> None:
        """Node `name`'s row as a rebuild would make it: its pods placed again (confirmed ones first, then live
        assumptions), the policy's tables for the row made once, after them."""
        state, policy = self.state, self.policy
        assert state is not None and policy is not None
        spec, row = self.specs.get(name), state.index.get(name)
        if row is not None and spec == state.nodes[row]:
            return  # changed and changed back
        old = {key: p for key in list(self._placed_on.get(name, ())) if (p := self._drop(key)) is not None}
        assumed = [key for key in old if self.assumed.pop(key, None) is not None]
        if spec is None:
            if row is not None:
                state.delete_node(row)
                policy.node_removed(row)
            return
        if row is None:
            row = bisect.bisect_left(state.names, name)
            state.insert_node(row, spec)
            policy.node_added(row)
        else:
            state.reset_node(row, spec)
            policy.node_changed(row)
        self._rebuilding = True
        try:
            for key in self._bound_on.get(name, ()):
                self._place(self.pods[key], keep_assumed=old.get(key))
            for key in assumed:
                if key not in self.placements:
                    self._reassume(key, old[key])
        finally:
            self._rebuilding = False
        policy.observe(row)

    def _observe(self, policy: Policy, node: int) -> None:
        """The policy's tables follow a node whose usage changed (not while a rebuild re-places everything)."""
        self.row_changes += 1
        if node >= len(self._row_stamps):
            grown = np.zeros(max(node + 1, len(self.state) if self.state is not None else 0), dtype=np.int64)
            grown[:len(self._row_stamps)] = self._row_stamps
            self._row_stamps = grown
        self._row_stamps[node] = self.row_changes
        if not self._rebuilding:
            policy.observe(node)

    # ---- DRA: what allocated claims hold ---------------------------------------------------------------------------
    def _respec(self, names: set[str]) -> None:
        """Read the specs of DRA nodes `names` again (their slices or partitions changed)."""
        for name in names:
            node = self.nodes.get(name)
            if node is not None:
                self._on_node(node, node)

    def _on_claim(self, old: Obj | None, new: Obj | None) -> None:
        key, before, after = self.dra.on_claim(old, new)
        owner = claim_owner(new or old or {})
        if new is not None and old is None:  # what its pod asks: the learned workload (the pod reads as CPU only)
            if owner is not None and owner not in self.recent:
                self._claims_before_pod[owner] = new  # learned with the pod (informers list claims and pods apart)
            else:
                self._learn_claim(new)
        elif new is None and owner is not None:
            self._claims_before_pod.pop(owner, None)
        if owner is not None:
            if new is not None and (new.get("status") or {}).get("allocation"):
                self._claim_allocated[owner] = after[0].node if after else None
            else:
                self._claim_allocated.pop(owner, None)
            self._queue_gated_claims(owner)
        if before == after:
            return
        partitions = {h.node for h in (*before, *after) if h.demand.mig_profile}
        if partitions:  # the layout of those nodes is their partitions
            self._respec(partitions)
        if self._dirty or self.state is None:
            return  # held at the next rebuild
        self._unhold(key)
        self._hold(key, after)

    def _hold(self, key: str, holds: tuple[Hold, ...]) -> None:
        if self.state is None or self.policy is None or self._dirty:
            return
        placed = []
        for h in holds:
            row = self.state.index.get(h.node)
            if row is None:
                continue
            try:
                self.state.place(row, h.demand, (h.gpu,))
            except (ValueError, KeyError, IndexError) as err:  # a device held twice (allocated past its allocator)
                if not h.demand.mig_profile:  # place() refuses after taking: held once, as scoring.dramodel does
                    self.state.gpu_left[row, h.gpu] = max(0, int(self.state.gpu_left[row, h.gpu]))
                self.parse_errors += 1
                log.warning("cannot account claim %s on %s %s: %s", key, h.node, h.device, err)
                continue
            placed.append(h)
            self._observe(self.policy, row)
        if placed:
            self._held[key] = placed

    def _unhold(self, key: str) -> None:
        for h in self._held.pop(key, []):
            if self.state is None or self.policy is None:
                return
            row = self.state.index.get(h.node)
            if row is not None:
                self.state.remove(row, h.demand, (h.gpu,))
                self._observe(self.policy, row)

    def _place(self, bound: BoundPod, keep_assumed: Placement | None = None) -> None:
        if self.state is None or self.policy is None or self._dirty:
            return  # placed at the next rebuild
        node = self.state.index.get(bound.node)
        if node is None:
            return  # a pod on a node we do not model (CPU-only node missing, or unreadable)
        devices = bound.devices
        if devices is None and keep_assumed is not None and keep_assumed.node == bound.node:
            devices = keep_assumed.devices
        demand, named = bound.demand, devices is not None
        try:
            if devices is None:  # the policy raises ValueError or IndexError when the node has no device left for it
                devices = self.policy.devices(self.state, demand, node) if demand.gpus else ()
            self.state.place_or_refuse(node, demand, devices)
        except (ValueError, KeyError, IndexError) as err:
            # The cluster holds more than the model thinks fits (a pod bound past gpuaas, or devices its annotation
            # names that another pod holds): count it, and place what the pod surely takes, so that its departure
            # gives back exactly that: its GPUs on devices still free if the node has them, else its CPU and memory.
            self.parse_errors += 1
            log.warning("cannot account %s on %s%s: %s", bound.key, bound.node, list(devices or ()), err)
            demand, devices = self._place_what_fits(node, demand, named=named)
        self._record(bound.key, Placement(bound.node, demand, tuple(devices)))
        self._observe(self.policy, node)

    def _place_what_fits(self, node: int, demand: PodDemand, *, named: bool) -> tuple[PodDemand, tuple[int, ...]]:
        """A refused pod's placement: on the devices the policy picks when those `named` for it (its annotation, or
        its assumption) were taken, else with its CPU and memory alone."""
        assert self.state is not None and self.policy is not None
        if named and demand.gpus:
            try:
                devices = tuple(self.policy.devices(self.state, demand, node))
                self.state.place_or_refuse(node, demand, devices)
                return demand, devices
            except (ValueError, KeyError, IndexError):
                pass
        cpu_only = PodDemand(cpu_milli=demand.cpu_milli, memory_mib=demand.memory_mib, name=demand.name)
        self.state.place(node, cpu_only)
        return cpu_only, ()

    def _unplace(self, key: str) -> None:
        self.assumed.pop(key, None)
        placement = self._drop(key)
        if placement is None or self.state is None or self.policy is None or self._dirty:
            return
        node = self.state.index.get(placement.node)
        if node is None:
            return
        self.state.remove(node, placement.demand, placement.devices)
        self._observe(self.policy, node)

    def assume(self, key: str, node_name: str, demand: PodDemand, devices: tuple[int, ...]) -> None:
        """Hold `devices` on `node_name` for a pod this extender is binding, until the watch confirms it."""
        state, policy = self.snapshot()
        node = state.index[node_name]
        self._unplace(key)
        state.place(node, demand, devices)
        self._record(key, Placement(node_name, demand, tuple(devices)))
        self.assumed[key] = self.clock() + self.assume_ttl
        self._observe(policy, node)

    def renew(self, key: str) -> Placement | None:
        """Keep the GPUs held for a pod being bound where they are held, when they would be held again as they are:
        the node without the pod still fits it (what bind re-checks). Renews the hold's time-to-live and returns it;
        None (nothing changed) when the pod holds nothing or no longer fits. The model ends as after forget() and
        assume() of the same placement, without refreshing the policy's tables for the node twice."""
        state, _ = self.snapshot()
        placement = self.placements.get(key)
        if key not in self.assumed or placement is None:
            return None
        node = state.index.get(placement.node)
        if node is None:
            return None
        state.remove(node, placement.demand, placement.devices)
        try:
            fits = misfit_reason(state, placement.demand, node) is None
        finally:
            state.place(node, placement.demand, placement.devices)  # the node as it was: the policy's tables hold
        if not fits:
            return None
        self.assumed[key] = self.clock() + self.assume_ttl
        return placement

    def forget(self, key: str) -> None:
        """Drop an assumption (the binding failed)."""
        if key in self.assumed:
            self._unplace(key)

    def _expire_assumptions(self) -> None:
        now = self.clock()
        for key in [k for k, deadline in self.assumed.items() if deadline < now]:
            log.warning("assumed binding of %s to %s not seen within %.0fs; releasing its GPUs",
                        key, self.placements[key].node, self.assume_ttl)
            self._unplace(key)

    # ---- reading -------------------------------------------------------------------------------------------------
    def demand(self, pod: Obj) -> PodDemand:
        """pod_demand, remembered by content (scoring.kubeobjects.demand_key): the same pod is read at arrival,
        filter, prioritize, bind and binding. Keyed on what pod_demand reads, never on what an object says it is (a
        uid and generation in a request body are the sender's word): any body with the same key has the same demand,
        so what a request says cannot change what the informer and bind believe."""
        key = demand_key(pod)
        if key is None:
            return pod_demand(pod)
        demand = self._demands.get(key)
        if demand is None:
            demand = self._demands[key] = pod_demand(pod)
            if len(self._demands) > 4 * WORKLOAD_WINDOW:
                self._demands.pop(next(iter(self._demands)))
        return demand

    def stats(self) -> dict[str, int]:
        return {"nodes": len(self.nodes), "gpu_nodes": sum(1 for s in self.specs.values() if s.gpus),
                "pods": len(self.pods), "assumed": len(self.assumed), "queued": len(self.queue),
                "unreadable_nodes": len(self.bad_nodes), "dra_claims_held": len(self._held)}

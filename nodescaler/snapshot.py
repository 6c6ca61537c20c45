"""What the node scaler decides on: Nodes, Pods and PodDisruptionBudgets (plain dicts, as the API returns them)
read once into frozen records plus the scoring model of the GPU-ready nodes. Pure: no I/O, the time is passed in.

The scoring model is built by `scoring.clusterview.ClusterView`, as in the extender (the one code path that turns Nodes
and bound Pods into a `ClusterState`), so the node scaler's what-if sees the cluster exactly as the extender does.

DRA (docs/devices.md, "DRA mode"): the view also takes ResourceSlices and ResourceClaims, so a DRA node has the GPUs
its slices publish and every allocated claim holds its devices. A DRA node is GPU-ready once its pool's slices are
all published (the driver's kubelet plugin publishes them once the driver is up). A pod's GPUs are what its claims
ask (`scoring.draclaims.pod_dra`, a ResourceClaimTemplate's spec for a claim not generated yet): a pod gpuaas holds
for its claims (gate `gpuaas.io/gang`, in no group: a gang of one) is a pending GPU pod like one kube-scheduler
found unschedulable, and a bound pod moves with the GPUs its claims hold.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scoring.clusterview import ClusterView
from scoring.constraints import Expr, NodeConstraints, Taint, matches, node_taints
from scoring.dra import DRA_LABEL, allocated_devices, claim_key
from scoring.draclaims import (
    PodDra,
    UnsupportedClaim,
    claim_demand,
    combined_demand,
    has_claims,
    pod_claim_names,
    pod_dra,
    same_root_count,
)
from scoring.draview import CLAIM_KIND, SLICE_KIND
from scoring.gangs import GANG_GATE, RELEASED_ANNOTATION, GroupError, gates, group_of
from scoring.gpus import MIG_RESOURCE_PREFIX, UnknownGpuModelError
from scoring.kubeobjects import (
    COUNT_LABEL,
    GPU_RESOURCE,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    POOL_LABEL,
    PRODUCT_LABEL,
    ObjectError,
    parse_quantity,
    pod_demand,
    pod_key,
    requests_gpu,
)
from scoring.model import ClusterState, PodDemand

Obj = dict[str, Any]

DRAIN_ANNOTATION = "gpuaas.io/drain"  # JSON DrainRecord: a drain in progress, so a restarted controller resumes it
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# When the node scaler first saw the node GPU-ready (epoch seconds). Written once per node, so that any replica, after
# any restart, tells a node that never came up (a failed provision: deleted) from one in service that went unready
# (kept, and drained only through the PDB-respecting path): nothing else on a Node records that it was ever ready.
GPU_READY_SEEN_ANNOTATION = "gpuaas.io/gpu-ready-seen"
# The NodeClaim a node was asked for as (the karpenter provider labels its NodeClaims so, and Karpenter puts a
# NodeClaim's labels on its node: at once with the KWOK cloud provider, through the kubelet's labels on AWS, at
# registration at the latest, when it also adds the ownerReference).
CLAIM_LABEL = "gpuaas.io/nodeclaim"
# The Cluster API Machine a node is (set by Cluster API with the Machine's nodeRef): the clusterapi provider's requests
# are Machines.
MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"
# The taint Karpenter puts on a node it launched until it has registered it (synced the NodeClaim's labels and taints):
# pods do not go there yet, Ready and GPUs allocatable or not.
UNREGISTERED_TAINT = "karpenter.sh/unregistered"


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class DrainRecord:
    """What the node annotation `gpuaas.io/drain` holds while a drain is under way."""

    id: str
    reason: str
    started: float
    deadline: float

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "reason": self.reason, "started": self.started, "deadline": self.deadline},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> DrainRecord:
        try:
            d = json.loads(raw)
            return cls(str(d["id"]), str(d["reason"]), float(d["started"]), float(d["deadline"]))
        except (ValueError, KeyError, TypeError) as err:
            # An unreadable record is still a drain: roll it back at once (deadline 0).
            return cls("unreadable", f"unreadable {DRAIN_ANNOTATION}: {err}", 0.0, 0.0)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    group: str
    created: float
    ready: bool
    gpus: int  # nvidia.com/gpu.count
    gpu_ready: bool  # the device plugin advertises the GPUs (a GPU node without them is still booting)
    unschedulable: bool
    drain: DrainRecord | None
    scale_down_disabled: bool
    mig_config: str | None
    mig_state: str | None
    product: str = ""  # nvidia.com/gpu.product
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    gpu_ready_seen: float | None = None  # GPU_READY_SEEN_ANNOTATION: when gpuaas first saw it GPU-ready
    # The NodeClaim the node belongs to (CLAIM_LABEL, or its ownerReference, set by Karpenter when the node
    # registers), or its Cluster API Machine (MACHINE_ANNOTATION), or "": a grow request of the Karpenter provider is a
    # NodeClaim, of the clusterapi provider a Machine, and this tells which node it became (before this is known, the
    # node and the request would both count as capacity on its way).
    claim: str = ""
    registering: bool = False  # carries UNREGISTERED_TAINT: Karpenter has not registered it yet
    dra: bool = False  # labelled gpuaas.io/dra: its GPUs are ResourceSlices (gpu_ready: all of them published)
    # Claims allocated on the node that no pod holds yet (status.reservedFor empty): their pods are on their way (the
    # gang controller allocated them before releasing the pods), so the node is not empty.
    claims_on_the_way: tuple[str, ...] = ()

    @property
    def booting(self) -> bool:
        """Not able to take GPU pods now: not Ready, or no GPUs allocatable (never up yet, or gone unready), or not
        registered by Karpenter yet (capacity on its way, as a node whose GPUs are not there yet)."""
        return not self.ready or not self.gpu_ready or self.registering

    @property
    def mig_pending(self) -> bool:
        return self.mig_state == "pending"


@dataclass(frozen=True)
class PodInfo:
    key: str
    namespace: str
    name: str
    uid: str
    node: str
    phase: str
    demand: PodDemand | None  # None when the pod cannot be read (the error is in `problem`)
    unschedulable: bool  # PodScheduled False, reason Unschedulable
    unschedulable_since: float | None
    created: float
    terminating: bool
    owner_kind: str
    safe_to_evict: bool | None  # the annotation, None when absent
    do_not_disrupt: bool
    grace_s: int
    labels: Mapping[str, str]
    gpu: bool
    problem: str = ""
    constraints: NodeConstraints = NodeConstraints()
    gang: str = ""  # the group gpuaas holds this pod in (scoring.gangs): gated, waiting to be placed whole
    claims: bool = False  # its GPUs come through DRA ResourceClaims of gpuaas's classes (demand: what they ask)
    same_root: int = 0  # whole GPUs its unallocated claims want under one PCIe root (a matchAttribute constraint)

    @property
    def daemon(self) -> bool:
        """Runs wherever its node is (DaemonSet or static pod): never moved, never blocks removal."""
        return self.owner_kind in ("DaemonSet", "Node")

    @property
    def holds(self) -> bool:
        return bool(self.node) and self.phase not in ("Succeeded", "Failed")

    @property
    def known_demand(self) -> PodDemand:
        """`demand` of a pod that could be read: the pods the what-ifs place are those (`ClusterSnapshot.pending`
        and the pods a drain moves are filtered on it)."""
        if self.demand is None:
            raise ValueError(f"pod {self.key} could not be read: {self.problem}")
        return self.demand


def in_service(node: NodeInfo, pods: Iterable[PodInfo]) -> bool:
    """The node has been in service: gpuaas saw it GPU-ready (the annotation it writes then), or pods other than
    DaemonSet and static pods are bound to it (`pods`: those on the node). Such a node is never a failed provision,
    nor capacity on its way, whatever its state now."""
    return node.gpu_ready_seen is not None or any(p.holds and not p.daemon for p in pods)


@dataclass(frozen=True)
class PdbInfo:
    key: str
    namespace: str
    match_labels: Mapping[str, str]
    match_expressions: tuple[Expr, ...]
    disruptions_allowed: int

    def selects(self, pod: PodInfo) -> bool:
        return pod.namespace == self.namespace and matches(self.match_labels, self.match_expressions, pod.labels)


@dataclass
class ClusterSnapshot:
    now: float
    nodes: dict[str, NodeInfo]
    pods: list[PodInfo]
    pdbs: list[PdbInfo]
    state: ClusterState  # GPU-ready nodes and everything bound to them; decisions copy it before changing it
    unreadable: dict[str, str] = field(default_factory=dict)  # object key -> why it could not be read
    workload: Any = None  # the pod shapes the policy weighs (scoring.fragmentation.Workload), as the extender learns it
    # DRA: the Node objects labelled gpuaas.io/dra by name, and every ResourceSlice and ResourceClaim, for the what-if
    # that opens idle DRA GPUs for waiting MIG pods (scoring.dramodel.dra_model; nodescaler.scaleout.open_dra_mig).
    dra_nodes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    dra_slices: Sequence[Mapping[str, Any]] = field(default_factory=list)
    dra_claims: Sequence[Mapping[str, Any]] = field(default_factory=list)
    _claims: set[str] | None = field(default=None, init=False, repr=False, compare=False)

    def pods_on(self, node: str) -> list[PodInfo]:
        return [p for p in self.pods if p.node == node and p.holds]

    @property
    def pending(self) -> list[PodInfo]:
        return [p for p in self.pods if p.unschedulable and p.gpu and p.demand is not None and not p.terminating]

    @property
    def waiting_gangs(self) -> dict[str, list[PodInfo]]:
        """The gangs gpuaas holds whole for room (`PodInfo.gang`), by group, members in creation order. A gang with
        a member that cannot be read is left out: it cannot be planned whole."""
        gangs: dict[str, list[PodInfo]] = {}
        broken = set()
        for p in self.pods:
            if p.gang and not p.terminating:
                gangs.setdefault(p.gang, []).append(p)
                if p.demand is None:
                    broken.add(p.gang)
        return {k: sorted(v, key=lambda p: (p.created, p.key)) for k, v in gangs.items() if k not in broken}

    def group_nodes(self, group: str) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if n.group == group]

    def registered(self, name: str) -> bool:
        """A grow request named `name` has become a node: a node of that name, or one its NodeClaim owns."""
        if name in self.nodes:
            return True
        if self._claims is None:
            self._claims = {n.claim for n in self.nodes.values() if n.claim}
        return name in self._claims


def _allocatable_gpus(node: Obj) -> int:
    alloc = (node.get("status") or {}).get("allocatable") or {}
    total = 0
    for k, v in alloc.items():
        if k == GPU_RESOURCE or k.startswith(MIG_RESOURCE_PREFIX):
            with contextlib.suppress(ValueError):
                total += int(str(v))
    return total


def node_info(node: Obj, dra_ready: bool | None = None, claims_on_the_way: tuple[str, ...] = ()) -> NodeInfo:
    """`dra_ready`: for a DRA node (gpuaas.io/dra), whether its pool's ResourceSlices are all published (None: not
    known, taken as not); `claims_on_the_way`: claims allocated on it that no pod holds yet."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    spec = node.get("spec") or {}
    conds = {c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or ()}
    try:
        gpus = int(labels.get(COUNT_LABEL, "0"))
    except ValueError:
        gpus = 0
    alloc = (node.get("status") or {}).get("allocatable") or {}
    try:
        cpu = int(parse_quantity(alloc.get("cpu", 0)) * 1000)
        mem = int(parse_quantity(alloc.get("memory", 0)) / 2**20)
    except ObjectError:
        cpu = mem = 0
    drain = DrainRecord.from_json(ann[DRAIN_ANNOTATION]) if DRAIN_ANNOTATION in ann else None
    dra = labels.get(DRA_LABEL) == "true"
    try:
        seen = float(ann[GPU_READY_SEEN_ANNOTATION]) if GPU_READY_SEEN_ANNOTATION in ann else None
    except ValueError:
        seen = 0.0  # present but unreadable: it was written, so the node was ready once
    return NodeInfo(
        name=meta["name"], group=labels.get(POOL_LABEL, ""), created=parse_time(meta.get("creationTimestamp")) or 0.0,
        ready=conds.get("Ready") == "True", gpus=gpus,
        gpu_ready=gpus == 0 or (bool(dra_ready) if dra else _allocatable_gpus(node) > 0), dra=dra,
        claims_on_the_way=claims_on_the_way,
        unschedulable=bool(spec.get("unschedulable")), drain=drain,
        scale_down_disabled=ann.get(SCALE_DOWN_DISABLED) == "true" or ann.get(DO_NOT_DISRUPT) == "true",
        mig_config=labels.get(MIG_CONFIG_LABEL), mig_state=labels.get(MIG_STATE_LABEL),
        product=labels.get(PRODUCT_LABEL, ""), cpu_milli=cpu, memory_mib=mem, labels=dict(labels),
        taints=node_taints(node), gpu_ready_seen=seen,
        claim=labels.get(CLAIM_LABEL) or _owner_claim(meta) or ann.get(MACHINE_ANNOTATION, ""),
        registering=any(t.get("key") == UNREGISTERED_TAINT for t in spec.get("taints") or ()))


def _owner_claim(meta: Obj) -> str:
    """The name of the Karpenter NodeClaim among the node's ownerReferences, or ""."""
    return next((o.get("name", "") for o in meta.get("ownerReferences") or ()
                 if o.get("kind") == "NodeClaim" and str(o.get("apiVersion", "")).startswith("karpenter.sh/")), "")


def pod_info(pod: Obj, claims: Mapping[str, Obj] | None = None, templates: Mapping[str, Obj] | None = None) -> PodInfo:
    """`claims`, `templates`: the ResourceClaims and ResourceClaimTemplates by namespace/name, for a pod with
    spec.resourceClaims (None: such a pod's GPUs are not read)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    ann = meta.get("annotations") or {}
    unsched, since = False, None
    for c in status.get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            unsched, since = True, parse_time(c.get("lastTransitionTime"))
    if claims is not None and has_claims(pod):
        return _dra_pod_info(pod, claims, templates or {})
    owners = meta.get("ownerReferences") or ()
    owner = next((o.get("kind", "") for o in owners if o.get("controller")),
                 owners[0].get("kind", "") if owners else "")
    if MIRROR_ANNOTATION in ann:
        owner = "Node"
    demand, problem, gpu = None, "", False
    try:
        demand = pod_demand(pod)
        gpu = requests_gpu(pod)
    except (ObjectError, UnknownGpuModelError, ValueError) as err:
        problem = str(err)
    safe = ann.get(SAFE_TO_EVICT)
    return PodInfo(gang=_waiting_gang(pod),
        key=pod_key(pod), namespace=meta.get("namespace", "default"), name=meta.get("name", "?"),
        uid=meta.get("uid", ""), node=spec.get("nodeName") or "", phase=status.get("phase") or "Pending",
        demand=demand, unschedulable=unsched and not spec.get("nodeName"), unschedulable_since=since,
        created=parse_time(meta.get("creationTimestamp")) or 0.0, terminating=bool(meta.get("deletionTimestamp")),
        owner_kind=owner, safe_to_evict=None if safe is None else safe == "true",
        do_not_disrupt=ann.get(DO_NOT_DISRUPT) == "true", grace_s=int(spec.get("terminationGracePeriodSeconds", 30)),
        labels=dict(meta.get("labels") or {}), gpu=gpu, problem=problem, constraints=NodeConstraints.of(pod))


def _dra_pod_info(pod: Obj, claims: Mapping[str, Obj], templates: Mapping[str, Obj]) -> PodInfo:
    """A pod with spec.resourceClaims: its GPUs are what its claims of gpuaas's classes ask. Not bound: the claims
    not allocated yet (templates' for claims not generated yet), as the gang controller places it; bound: all of
    them, the GPUs it takes along when it moves. A pod gpuaas holds for its claims alone (its gate, no group, not
    released) is pending for GPUs: unschedulable since it was created, as if kube-scheduler had found no node."""
    base = pod_info(pod)
    spec = pod.get("spec") or {}
    try:
        dra = pod_dra(pod, claims, templates)
    except (ObjectError, UnsupportedClaim, UnknownGpuModelError, ValueError) as err:
        return dataclasses.replace(base, demand=None, gpu=False, problem=str(err))
    if dra is None or not dra.ours:
        return base
    demand = _held_demand(pod, dra) if spec.get("nodeName") else dra.demand
    held = not base.gang and gates(pod) == (GANG_GATE,) and not spec.get("nodeName") and \
        RELEASED_ANNOTATION not in ((pod.get("metadata") or {}).get("annotations") or {}) and \
        _ungrouped(pod) and demand.gpus > 0
    return dataclasses.replace(base, demand=demand, gpu=demand.gpus > 0, claims=True,
                               same_root=0 if spec.get("nodeName") else _same_root(pod, dra, templates),
                               unschedulable=base.unschedulable or held,
                               unschedulable_since=base.unschedulable_since or (base.created if held else None))


def _held_demand(pod: Obj, dra: PodDra) -> PodDemand:
    """CPU and memory with the GPUs of every claim of the pod, allocated or not."""
    return combined_demand(pod_demand(pod), [c.demand for c in dra.claims], f"pod {pod_key(pod)}")


def _same_root(pod: Obj, dra: PodDra, templates: Mapping[str, Obj]) -> int:
    """Whole GPUs the pod's unallocated claims want under one PCIe root, templates' for claims not generated yet."""
    count = same_root_count(dra)
    ns = (pod.get("metadata") or {}).get("namespace") or "default"
    generated = {c.entry for c in dra.claims}
    for entry, _name, template in pod_claim_names(pod):
        source = templates.get(f"{ns}/{template}") if template and entry not in generated else None
        if source is not None:
            where = f"ResourceClaimTemplate {ns}/{template}"
            demand = claim_demand(((source.get("spec") or {}).get("spec")) or {}, where)
            count += sum(r.count for r in demand.requests if r.name in demand.same_root) if demand else 0
    return count


def _ungrouped(pod: Obj) -> bool:
    try:
        return group_of(pod) is None
    except GroupError:
        return False


def _waiting_gang(pod: Obj) -> str:
    """The group of a member that gpuaas holds for room: gated by gpuaas alone (another component's gate, such as
    Kueue's, means that component has not admitted it), not pinned by a release yet."""
    names = gates(pod)
    if names != (GANG_GATE,) or RELEASED_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {}):
        return ""
    try:
        ref = group_of(pod)
    except GroupError:
        return ""
    return ref.key if ref is not None else ""


def pdb_info(pdb: Obj) -> PdbInfo:
    meta = pdb.get("metadata") or {}
    sel = (pdb.get("spec") or {}).get("selector") or {}
    exprs = tuple((e["key"], e["operator"], tuple(e.get("values") or ())) for e in sel.get("matchExpressions") or ())
    return PdbInfo(key=f"{meta.get('namespace')}/{meta.get('name')}", namespace=meta.get("namespace", ""),
                   match_labels=dict(sel.get("matchLabels") or {}), match_expressions=exprs,
                   disruptions_allowed=int((pdb.get("status") or {}).get("disruptionsAllowed", 0)))


def build_snapshot(nodes: Iterable[Obj], pods: Iterable[Obj], pdbs: Iterable[Obj], now: float,
                   policy: str = "gpuaas", view: ClusterView | None = None, *, slices: Iterable[Obj] = (),
                   claims: Iterable[Obj] = (), templates: Iterable[Obj] = ()) -> ClusterSnapshot:
    """Records for every object, and the scoring model of the nodes that can take pods now (Ready, GPUs advertised,
    no MIG repartition under way) with the pods bound to them.

    `view`: a live ClusterView already fed with these objects, ResourceSlices and ResourceClaims included (the
    controller keeps one fed by its informers, so a reconcile does not rebuild the model of a thousand nodes); None
    builds one here, as the extender builds its own. `slices`, `claims`, `templates`: the ResourceSlices,
    ResourceClaims and ResourceClaimTemplates (DRA; empty where the cluster serves none)."""
    nodes, pods, claims = list(nodes), list(pods), list(claims)
    if view is None:
        view = ClusterView(policy)
        for n in nodes:
            view.on_change("Node", None, n)
        for s in slices:
            view.on_change(SLICE_KIND, None, s)
        for c in claims:
            view.on_change(CLAIM_KIND, None, c)
        for p in pods:
            view.on_change("Pod", None, p)
    on_the_way = _claims_on_the_way(claims)
    infos = {}
    for n in nodes:
        name = n["metadata"]["name"]
        infos[name] = node_info(n, view.dra.pool(name) is not None, tuple(on_the_way.get(name, ())))
    by_key = {claim_key(c): c for c in claims}
    by_template = {f"{(t.get('metadata') or {}).get('namespace', '')}/{(t.get('metadata') or {}).get('name', '')}": t
                   for t in templates}
    pod_infos = [pod_info(p, by_key, by_template) for p in pods]
    state, _ = view.snapshot()
    unreadable = dict(view.bad_nodes)
    unreadable.update({p.key: p.problem for p in pod_infos if p.problem})
    dra_nodes = {name: n for n in nodes if (name := n["metadata"]["name"]) in infos and infos[name].dra}
    return ClusterSnapshot(now=now, nodes=infos, pods=pod_infos, pdbs=[pdb_info(x) for x in pdbs], state=state.copy(),
                           unreadable=unreadable, workload=view.workload(), dra_nodes=dra_nodes,
                           dra_slices=list(view.dra.slices.values()) if dra_nodes else [],
                           dra_claims=claims if dra_nodes else [])


def _claims_on_the_way(claims: Iterable[Obj]) -> dict[str, list[str]]:
    """node -> claims allocated on it (results in its pool: the driver names the pool after the node) that no pod
    holds yet (status.reservedFor empty)."""
    out: dict[str, list[str]] = {}
    for c in claims:
        try:
            allocated = allocated_devices(c)
        except (ObjectError, ValueError):
            continue
        if allocated and not allocated[0].reserved_for:
            for pool in sorted({a.pool for a in allocated}):
                out.setdefault(pool, []).append(claim_key(c))
    return out

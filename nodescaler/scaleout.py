"""Scale-out: what to do for GPU pods the scheduler could not place. A pure function of the snapshot.

In order, each step only sees the pods the previous one left:

1. pods that fit on a schedulable, GPU-ready node now (the scheduler will retry them): nothing to do;
2. pods that fit on nodes already on their way (booting nodes whose GPUs are not allocatable yet, nodes asked for but
   not seen yet, nodes whose MIG layout is being changed): wait for them, never scale twice for the same pods;
3. MIG requests that new layouts of idle MIG-capable nodes serve (`scoring.planner.repartition_mig`): set
   `nvidia.com/mig.config` on those nodes instead of buying nodes;
4. the rest: `scoring.planner.cheapest_nodes` over the groups that are not backed off and have room below max_size.

5. gangs gpuaas holds whole (`ClusterSnapshot.waiting_gangs`: gated members are not pending pods), each as one unit:
   capacity for all of its members or for none.

DRA nodes (docs/devices.md, "DRA mode"): pods asking through claims go to DRA nodes only (`NodeSpec.dra`), a pod gpuaas
holds for its claims alone is pending like any (nodescaler.snapshot). A DRA GPU is partitioned only when a MIG claim
is allocated on it, so for MIG pods the what-if opens idle DRA GPUs that offer their profiles, on live nodes
(`open_dra_mig`: scoring.dramodel.dra_model, as the gang controller does), on nodes on their way and in the templates
of new nodes (`NodeGroupConfig.node_spec`). Step 3 never touches a DRA node: it has no MIG manager.

Placement in steps 1-3 is the extender's decision code (`scoring.placement.Placer`: the fit rules, the policy's score
and device choice), run on a copy of the model.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from scoring.constraints import NodeConstraints, allows
from scoring.dramodel import dra_cluster, dra_model
from scoring.fit import feasible
from scoring.gpus import MigLayoutError, mig_configs_for, model_by_product
from scoring.kubeobjects import ObjectError, gpu_replicas
from scoring.model import MILLI, ClusterState, NodeSpec
from scoring.placement import Placer
from scoring.planner import NodeGroup, cheapest_nodes, repartition_mig
from scoring.policies import make_policy, mig_gpu_first_fit

from .config import NodeGroupConfig, NodeScalerConfig
from .snapshot import ClusterSnapshot, NodeInfo, PodInfo, in_service


@dataclass(frozen=True)
class Grow:
    group: str
    count: int
    pods: tuple[str, ...]  # the pods it is for
    cost_per_hour: float


@dataclass(frozen=True)
class SetMigConfig:
    node: str
    config: str
    pods: tuple[str, ...]


@dataclass(frozen=True)
class Upcoming:
    """A node asked for but not yet seen in the API."""

    name: str
    group: str
    deadline: float


@dataclass
class ScaleOutPlan:
    grows: list[Grow] = field(default_factory=list)
    mig: list[SetMigConfig] = field(default_factory=list)
    fit_now: list[str] = field(default_factory=list)
    wait_upcoming: list[str] = field(default_factory=list)
    unplaceable: dict[str, str] = field(default_factory=dict)  # pod -> why no group can host it
    planner_status: str = ""
    notes: list[str] = field(default_factory=list)
    time_limit: float = 0.5

    @property
    def acts(self) -> bool:
        return bool(self.grows or self.mig)


def block_rows(state: ClusterState, rows: Iterable[int]) -> None:
    """Make nodes take nothing in a what-if copy (cordoned, draining, about to change)."""
    rows = list(rows)
    if rows:
        state.cpu_left[rows] = -1
        state.gpu_left[rows] = 0
        state.mig_free[rows] = 0


Rows = Sequence[tuple[Mapping[str, str], tuple]]  # (labels, taints) per model row


def snapshot_rows(snap: ClusterSnapshot, state: ClusterState) -> list[tuple[Mapping[str, str], tuple]]:
    return [(snap.nodes[n].labels, snap.nodes[n].taints) if n in snap.nodes else ({}, ()) for n in state.names]


def place_greedy(state: ClusterState, pods: Sequence[PodInfo], policy: str, workload=None, rows: Rows | None = None,
                 roots: Roots | None = None) -> tuple[list[tuple[PodInfo, int]], list[PodInfo]]:
    """Place pods one at a time, largest first, as the extender would (scoring.placement: feasibility, policy
    score, device choice), on the nodes whose labels and taints (`rows`, per model row) the pod accepts; changes
    `state`. `roots` (DRA rows' PCIe root per GPU): a pod whose claims want N GPUs under one root goes only where one
    root has N whole free GPUs, as the gang controller places it. Returns (placed with their node row, the pods that
    fit nowhere)."""
    if not len(state):
        return [], list(pods)
    placer = Placer(state, make_policy(policy, state, workload))
    placed, left = [], []
    allowed: dict[NodeConstraints, np.ndarray] = {}
    # Largest first; among equals the longest waiting first, so that capacity already on its way goes to the oldest
    # pods and a grow is for the newest (what the scale-up latency metric reads).
    for pod in sorted(pods, key=placement_order):
        if rows is not None and pod.constraints not in allowed:
            allowed[pod.constraints] = np.fromiter((allows(pod.constraints, lab, tnt) for lab, tnt in rows),
                                                   dtype=bool, count=len(rows))
        mask = allowed[pod.constraints] if rows is not None else None
        if pod.same_root and roots is not None:
            under_one = same_root_rows(state, roots, pod.same_root)
            mask = under_one if mask is None else mask & under_one
        choice = placer.place(pod.known_demand, mask)
        if choice is None:
            left.append(pod)
        else:
            placed.append((pod, choice.node))
    return placed, left


Roots = Mapping[int, Sequence[str]]  # model row -> PCIe root of each GPU (DRA rows)


def same_root_rows(state: ClusterState, roots: Roots, count: int) -> np.ndarray:
    """Rows where one PCIe root has `count` whole free GPUs (not partitioned, nothing shared), as
    scoring.dramodel.same_root_nodes judges live DRA nodes for the gang controller."""
    ok = np.zeros(len(state), dtype=bool)
    for row, per_gpu in roots.items():
        free = Counter(r for pos, r in enumerate(per_gpu)
                       if pos < state.gpu_left.shape[1] and state.gpu_left[row, pos] == MILLI
                       and not state.mig_enabled[row, pos])
        ok[row] = bool(free) and max(free.values()) >= count
    return ok


def live_roots(snap: ClusterSnapshot, state: ClusterState) -> dict[int, tuple[str, ...]]:
    """The PCIe roots of the GPUs of the snapshot's DRA nodes, by row of `state` (none without a pod that needs
    them: the slices are read only then)."""
    if not snap.dra_nodes or not any(p.same_root for p in snap.pods):
        return {}
    nodes = dra_cluster(snap.dra_slices, ()).nodes
    return {state.index[name]: tuple(g.pcie_root for g in node.gpus) for name, node in nodes.items()
            if name in state.index and state.gpu_count[state.index[name]] == len(node.gpus)}


def upcoming_roots(specs: Sequence[NodeSpec], config: NodeScalerConfig) -> dict[int, tuple[str, ...]]:
    """The PCIe roots of DRA nodes on their way (their group's template), by row."""
    out = {}
    for row, spec in enumerate(specs):
        group = config.group(spec.node_group) if spec.dra else None
        if group is not None and group.pcie_roots:
            out[row] = group.pcie_roots
    return out


def placement_order(pod: PodInfo) -> tuple:
    """The order the what-if places pending pods in: largest GPU demand first, then CPU, then the longest waiting."""
    d = pod.known_demand
    return (-d.total_gpu_milli, -d.cpu_milli, pod.unschedulable_since or 0.0, pod.created, pod.key)


def mig_wanted(pods: Iterable[PodInfo]) -> dict[str, int]:
    """MIG profile -> pods asking for one through claims (the profiles DRA GPUs are opened for)."""
    return dict(Counter(p.known_demand.mig_profile for p in pods if p.claims and p.known_demand.mig_profile))


def open_dra_mig(snap: ClusterSnapshot, state: ClusterState, wanted: Mapping[str, int]) -> ClusterState:
    """`state` (the snapshot's model, or a copy of it) with idle GPUs of the DRA nodes opened for the `wanted` MIG
    profiles when the partitions in use leave too little room for them (scoring.dramodel.dra_model); `state` itself
    when nothing is wanted or no node is a DRA node."""
    if not wanted or not snap.dra_nodes:
        return state
    return dra_model(state, snap.dra_nodes, dra_cluster(snap.dra_slices, snap.dra_claims), snap.dra_slices,
                     wanted).state


def _mig_target_spec(node: NodeInfo) -> NodeSpec | None:
    """The model of a node whose MIG layout is being changed, as it will be once the MIG manager is done."""
    model = model_by_product(node.product) if node.product else None
    if model is None or not node.gpus or node.mig_config is None:
        return None
    layout = mig_configs_for(model).get(node.mig_config)
    if layout is None:
        return None
    try:
        replicas = gpu_replicas(node.labels, f"node {node.name}")
    except ObjectError:
        return None
    # All GPUs in MIG mode leave no nvidia.com/gpu device to time-slice (as scoring.kubeobjects.node_spec reads it).
    return NodeSpec(node.name, node.cpu_milli, node.memory_mib, gpus=node.gpus, gpu_model=model.name,
                    mig_layouts=(layout or None,) * node.gpus if layout else None, node_group=node.group,
                    gpu_replicas=1 if layout else replicas)


def upcoming_specs(snap: ClusterSnapshot, config: NodeScalerConfig, requested: Iterable[Upcoming],
                   mig: Mapping[str, int] | None = None) -> tuple[list[NodeSpec], Rows]:
    """Capacity on its way, with each node's (labels, taints): booting nodes of managed groups (as their template),
    nodes asked for and not yet seen, and nodes in the middle of a MIG repartition (as their new layout). A node in
    service that went unready is not on its way: nothing says it comes back, and pods must not wait for it. `mig`:
    MIG profiles pods wait for through claims, for which a DRA template's idle GPUs are opened."""
    specs: list[NodeSpec] = []
    rows: list[tuple[Mapping[str, str], tuple]] = []
    for n in snap.nodes.values():
        group = config.group(n.group)
        if n.drain is not None or n.unschedulable:
            continue
        if n.booting and not n.mig_pending and in_service(n, snap.pods_on(n.name)):
            continue
        if n.booting and group is not None:
            # As the template says, not as it looks now: a registering node carries the lifecycle controller's
            # not-ready taint, which will be gone when its GPUs are there.
            specs.append(group.node_spec(n.name, mig))
            rows.append(group.template_constraints())
        elif n.mig_pending and not n.booting:
            spec = _mig_target_spec(n)
            if spec is not None:
                specs.append(spec)
                rows.append((n.labels, n.taints))
    for u in requested:
        group = config.group(u.group)
        if u.name not in snap.nodes and group is not None:
            specs.append(group.node_spec(u.name, mig))
            rows.append(group.template_constraints())
    return specs, rows


def unavailable_rows(snap: ClusterSnapshot) -> list[int]:
    """Rows of the model that take no new pods: cordoned or draining nodes."""
    return [snap.state.index[n.name] for n in snap.nodes.values()
            if (n.unschedulable or n.drain is not None) and n.name in snap.state.index]


def _idle_mig_nodes(state: ClusterState, rows: Sequence[int]) -> list[int]:
    """MIG-capable nodes on which no GPU is in use: the MIG manager reconfigures a whole node."""
    out = []
    for n in rows:
        if not state.gpu_count[n] or state.cpu_left[n] < 0:
            continue
        if not state.models[state.model_idx[n]].mig_capable or state.dra_rows[n]:  # DRA: no MIG manager
            continue
        if any(p.gpus for p, _ in state.pods_on[n]):
            continue
        out.append(int(n))
    return out


def _node_config(state: ClusterState, node: int, layouts: dict[int, dict[str, int]], need: Counter) -> str | None:
    """The named MIG config (mig-parted's config-default names) to put on the whole node: one equal to a layout the
    planner chose for one of its GPUs, else the all-<profile> config of the profile most needed."""
    model = state.models[state.model_idx[node]]
    configs = mig_configs_for(model)
    for lay in layouts.values():
        for name, cfg in configs.items():
            if cfg == lay:
                return name
    for profile, _ in need.most_common():
        name = f"all-{profile}"
        if name in configs:
            return name
    return None


def plan_mig(state: ClusterState, pods: Sequence[PodInfo], candidates: Sequence[int], policy: str, time_limit: float,
             workload=None, rows: Rows | None = None) -> tuple[list[SetMigConfig], list[PodInfo], list[str]]:
    """Repartition idle MIG nodes for pending MIG pods (changes `state`). Returns (commands, pods still left, notes)."""
    mig_pods = [p for p in pods if p.known_demand.mig_profile]
    if not mig_pods or not candidates:
        return [], list(pods), []
    plan = repartition_mig(state, [p.known_demand for p in mig_pods], nodes=candidates, time_limit=time_limit)
    notes = [f"MIG repartition plan: {plan.status}"] + plan.notes
    by_node: dict[int, dict[int, dict[str, int]]] = {}
    for (n, g), lay in plan.layouts.items():
        by_node.setdefault(n, {})[g] = lay
    need = Counter(p.known_demand.mig_profile for p in mig_pods)
    commands = []
    left = list(pods)
    for n, layouts in sorted(by_node.items()):
        config = _node_config(state, n, layouts, need)
        if config is None:
            notes.append(f"no named MIG config of {state.names[n]} matches the planned layouts {layouts}")
            continue
        trial = state.copy()
        try:
            for g in range(int(trial.gpu_count[n])):
                trial.set_mig_layout(n, g, config)
        except MigLayoutError as err:
            notes.append(f"{state.names[n]}: {err}")
            continue
        only = trial.copy()
        block_rows(only, [r for r in range(len(only)) if r != n])
        placed, rest = place_greedy(only, left, policy, workload, rows)
        if not placed:
            continue
        for g in range(int(state.gpu_count[n])):
            state.set_mig_layout(n, g, config)
        for pod, row in placed:
            state.place(row, pod.known_demand, (mig_gpu_first_fit(state, pod.known_demand, row),))
        commands.append(SetMigConfig(state.names[n], config, tuple(p.key for p, _ in placed)))
        left = rest
    return commands, left, notes


def nodes_needed(template: NodeSpec, pods: Sequence[PodInfo], room: int,
                 constraints: tuple[Mapping[str, str], tuple] = ({}, ())) -> int:
    """How many nodes of a template first-fit needs for the pods that fit it (at most `room`; 0 if none fits): the
    bound on new nodes per group handed to the planner, which keeps its model small."""
    if room <= 0:
        return 0
    state = ClusterState([replace(template, name=f"{template.name}-{i}") for i in range(min(room, len(pods)))])
    placed, _ = place_greedy(state, pods, "first-fit", rows=[constraints] * len(state))
    return len({row for _, row in placed})


def lower_bound(template: NodeSpec, pods: Sequence[PodInfo]) -> int:
    """No fewer nodes of `template` can hold these whole-GPU pods: total GPUs (nvidia.com/gpu devices: replicas on a
    time-sliced template), CPU and memory over one node's."""
    def ceil_div(a: int, b: int) -> int:
        return -(-a // b) if b > 0 else (0 if a == 0 else 1 << 30)

    return max(ceil_div(sum(p.known_demand.gpus for p in pods), template.gpus * template.gpu_replicas),
               ceil_div(sum(p.known_demand.cpu_milli for p in pods), template.cpu_milli),
               ceil_div(sum(p.known_demand.memory_mib for p in pods), template.memory_mib))


def _fits_alone(template: NodeSpec, pod: PodInfo) -> bool:
    return bool(feasible(ClusterState([template]), pod.known_demand)[0])


def _dominates(a: NodeGroup, b: NodeGroup, pods: Sequence[PodInfo]) -> bool:
    """Every node of `b` could be a node of `a` instead, at no higher price: `a` is at least as big in every
    dimension, has the same GPUs per node and MIG layout, and takes every pod `b` takes."""
    ta, tb = a.template, b.template
    if a.price > b.price or (ta.cpu_milli, ta.memory_mib) < (tb.cpu_milli, tb.memory_mib):
        return False
    if ta.cpu_milli < tb.cpu_milli or ta.memory_mib < tb.memory_mib or ta.gpus != tb.gpus \
            or ta.gpu_replicas != tb.gpu_replicas:
        return False
    if ta.mig_layouts != tb.mig_layouts or (ta.gpu_blocks or ()) != (tb.gpu_blocks or ()):
        return False
    return all(_fits_alone(ta, p) for p in pods if _fits_alone(tb, p))


def undominated(groups: list[NodeGroup], pods: Sequence[PodInfo], room: dict[str, int]) -> list[NodeGroup]:
    """Drop groups another group dominates when that one has room for all the nodes it could need: an optimal plan
    never needs them, and each group left out shrinks the planner's model by a pods x nodes x GPUs slab."""
    keep = []
    for b in groups:
        if not any(a is not b and _dominates(a, b, pods) and room[group_of_variant(a.name)] > a.max_new
                   and (a.price, a.name) < (b.price, b.name) for a in groups):
            keep.append(b)
    return keep


def group_room(snap: ClusterSnapshot, group: NodeGroupConfig, requested: Iterable[Upcoming]) -> int:
    seen = len(snap.group_nodes(group.name))
    unseen = sum(1 for u in requested if u.group == group.name and u.name not in snap.nodes)
    return max(0, group.max_size - seen - unseen)


def plan_scale_out(snap: ClusterSnapshot, config: NodeScalerConfig, *, requested: Sequence[Upcoming] = (),
                   backed_off: Iterable[str] = ()) -> ScaleOutPlan:
    out = ScaleOutPlan(time_limit=config.scale_out.planner_time_limit_s)
    cfg = config.scale_out
    pending = [p for p in snap.pending if snap.now - p.created >= cfg.new_pod_delay_s]
    gangs = {k: v for k, v in snap.waiting_gangs.items() if snap.now - v[0].created >= cfg.new_pod_delay_s}
    if not pending and not gangs:
        return out
    # 1. fits on a node that can take it now
    wanted = mig_wanted([*pending, *(m for members in gangs.values() for m in members)])
    state = open_dra_mig(snap, snap.state.copy(), wanted)
    block_rows(state, unavailable_rows(snap))
    booting_rows = [state.index[n.name] for n in snap.nodes.values() if n.name in state.index and n.booting]
    block_rows(state, booting_rows)
    rows = snapshot_rows(snap, state)
    roots = live_roots(snap, state)
    placed, left = place_greedy(state, pending, cfg.policy, snap.workload, rows, roots)
    out.fit_now = [p.key for p, _ in placed]
    # 2. fits on capacity already on its way
    upcoming, up_rows = upcoming_specs(snap, config, requested, wanted)
    up_state = ClusterState(upcoming)
    up_roots = upcoming_roots(upcoming, config)
    if upcoming and left:
        placed, left = place_greedy(up_state, left, cfg.policy, snap.workload, up_rows, up_roots)
        out.wait_upcoming = [p.key for p, _ in placed]
    # 3. MIG repartition of idle nodes
    if cfg.mig_repartition and left:
        candidates = _idle_mig_nodes(state, range(len(state)))
        out.mig, left, notes = plan_mig(state, left, candidates, cfg.policy, cfg.planner_time_limit_s,
                                        snap.workload, rows)
        out.notes += notes
    if not left and not gangs:
        return out
    # 4. new nodes: the planner per set of pods that accept the same groups (by labels and taints)
    backed_off = set(backed_off)
    room = {}
    for g in config.groups:
        room[g.name] = group_room(snap, g, requested)
        if g.name in backed_off:
            out.notes.append(f"group {g.name} is backed off")
            room[g.name] = 0
        elif room[g.name] <= 0:
            out.notes.append(f"group {g.name} is at max_size {g.max_size}")
    by_groups: dict[tuple[str, ...], list[PodInfo]] = {}
    for pod in left:
        ok = tuple(g.name for g in config.groups if allows(pod.constraints, *g.template_constraints()))
        by_groups.setdefault(ok, []).append(pod)
    group = {g.name: g for g in config.groups}  # (the names are unique: NodeScalerConfig checks)
    grows: dict[str, list] = {}
    for names, pods in by_groups.items():
        _plan_new_nodes(out, pods, [group[n] for n in names], room, grows)
    # 5. gangs, each as one unit, oldest first, on what the pods above left
    for key, members in sorted(gangs.items(), key=lambda kv: (kv[1][0].created, kv[0])):
        state = _plan_gang(out, key, members, state, rows, up_state, up_rows, config, room, grows, snap.workload,
                           (roots, up_roots))
    for name, (count, keys) in sorted(grows.items()):
        out.grows.append(Grow(name, count, tuple(keys), group[name].cost_per_hour))
    return out


def _plan_gang(out: ScaleOutPlan, key: str, members: list[PodInfo], state: ClusterState, rows: Rows,
               up_state: ClusterState, up_rows: Rows, config: NodeScalerConfig, room: dict[str, int],
               grows: dict[str, list], workload: Any,
               roots: tuple[Roots, Roots] | None = None) -> ClusterState:
    """Capacity for the whole gang or for none of it: its members go first on the free room of nodes there now,
    then on nodes on their way, then on new nodes, and a grow is kept only if it serves every member that is left.
    Returns the model with the room the gang takes held (for the next gang)."""
    policy = config.scale_out.policy
    keys = [m.key for m in members]
    trial = state.copy()
    live, on_the_way = roots or (None, None)
    _placed, left = place_greedy(trial, members, policy, workload, rows, live)
    if not left:
        out.fit_now += keys  # the gang controller places it
        return trial
    _placed, rest = place_greedy(up_state.copy(), left, policy, workload, up_rows, on_the_way)
    if not rest:
        out.wait_upcoming += keys
        return trial
    groups = [g for g in config.groups
              if all(allows(m.constraints, *g.template_constraints()) for m in left)]
    trial_out = ScaleOutPlan(time_limit=out.time_limit)
    trial_room, trial_grows = dict(room), {k: [v[0], list(v[1])] for k, v in grows.items()}
    _plan_new_nodes(trial_out, left, groups, trial_room, trial_grows)
    out.notes += trial_out.notes
    if trial_out.unplaceable or not any(trial_grows.get(n, [0])[0] > grows.get(n, [0])[0] for n in trial_grows):
        why = next(iter(trial_out.unplaceable.values()), "no node group can take it")
        out.unplaceable.update({k: f"gang {key} ({len(members)} pods) cannot be grown for whole: {why}"
                                for k in keys})
        return state
    room.update(trial_room)
    grows.clear()
    grows.update(trial_grows)
    out.planner_status = trial_out.planner_status
    return trial


VARIANT = "#"  # <group>#<k>: a DRA group's template with k GPUs opened for MIG (group names are DNS labels)


def group_of_variant(name: str) -> str:
    return name.split(VARIANT, 1)[0]


def dra_variants(name: str, template: NodeSpec, pods: Sequence[PodInfo]) -> list[tuple[str, NodeSpec]]:
    """A DRA template opened for the MIG profiles pods wait for (`template`), and, when pods that want whole GPUs or
    shares wait too, the same node with fewer of those GPUs opened (k = 0 .. opened - 1), as planner groups of their
    own: a DRA node's GPUs are partitioned as claims ask, so one new node may be opened for MIG on one GPU and another
    on two. Without them every new node would be opened as for all the MIG pods, and whole-GPU pods would need more
    nodes (5 MIG and 5 whole-GPU pods on 4-GPU nodes of 2 MIG GPUs: 3 nodes instead of 2)."""
    out = [(name, template)]
    if not template.dra or not template.mig_layouts or \
            not any(p.known_demand.gpus and not p.known_demand.mig_profile for p in pods):
        return out
    opened = [i for i, layout in enumerate(template.mig_layouts) if layout]
    for k in range(len(opened) - 1, -1, -1):
        layouts = tuple(layout if i in opened[:k] else None for i, layout in enumerate(template.mig_layouts))
        out.append((f"{name}{VARIANT}{k}", replace(template, mig_layouts=layouts if any(layouts) else None)))
    return out


def _plan_new_nodes(out: ScaleOutPlan, left: list[PodInfo], candidates: list[NodeGroupConfig], room: dict[str, int],
                    grows: dict[str, list]) -> None:
    """cheapest_nodes for pods that accept the same groups; records grows and unplaceable pods, uses up room."""
    groups = []
    wanted = mig_wanted(left)
    for g in candidates:
        for name, template in dra_variants(g.name, g.node_spec(f"{g.name}-template", wanted), left):
            bound = nodes_needed(template, left, room[g.name], g.template_constraints())
            if bound:
                groups.append(NodeGroup(name, template, g.cost_per_hour, max_new=bound))
    groups = undominated(groups, left, room)
    if len(groups) == 1 and all(p.known_demand.gpus and not p.known_demand.mig_profile
                                and not p.known_demand.is_share for p in left):
        only = groups[0]
        fits = [p for p in left if _fits_alone(only.template, p)]
        if len(fits) == len(left) and only.max_new == lower_bound(only.template, left):
            # One group, and first-fit reaches the resource lower bound: that is the optimum, no solver needed.
            t = only.template
            trial = ClusterState([replace(t, name=f"n{i}", mig_layouts=None) for i in range(only.max_new)])
            _placed, rest = place_greedy(trial, left, "first-fit")
            if not rest:
                out.planner_status = "optimal (first-fit meets the lower bound)"
                room[only.name] -= only.max_new
                entry = grows.setdefault(only.name, [0, []])
                entry[0] += only.max_new
                entry[1] += [p.key for p in left]
                return
    if not groups:
        full = [g.name for g in candidates if room[g.name] <= 0]
        why = (f"no node group can grow ({', '.join(full)}: backed off or at max size)" if full
               else "fits no node group's template" if candidates
               else "no node group's labels and taints admit it")
        out.unplaceable.update({p.key: why for p in left})
        return
    plan, served = _cheapest(left, groups, out.time_limit)
    used: Counter[str] = Counter()
    for name, count in plan.new_nodes.items():
        used[group_of_variant(name)] += count
    if any(used[g] > room[g] for g in used):  # variants of one group together past its room: without variants
        plan, served = _cheapest(left, [grp for grp in groups if VARIANT not in grp.name], out.time_limit)
    out.planner_status = plan.status
    out.notes += plan.notes
    if not plan.ok:
        served = []
    unplaceable = {served[i] for i in plan.unplaceable} if plan.ok else set()
    for i, pod in enumerate(left):
        if i not in served or i in unplaceable:
            out.unplaceable[pod.key] = ("fits no node group's template" if i in unplaceable
                                        else "the node groups' max sizes leave no room for it")
    placed_pods = [i for i in served if i not in unplaceable]
    for name, count in plan.new_nodes.items():
        room[group_of_variant(name)] -= count
        entry = grows.setdefault(group_of_variant(name), [0, []])
        entry[0] += count
        entry[1] += [left[placed_pods[k]].key for k, (grp, _) in enumerate(plan.assignments) if grp == name]


def _cheapest(left: list[PodInfo], groups: list[NodeGroup], time_limit: float) -> tuple[Any, list[int]]:
    """cheapest_nodes for `left`, or for the largest prefix the groups' max sizes can serve: (plan, indices served)."""
    plan = cheapest_nodes([p.known_demand for p in left], groups, time_limit=time_limit)
    served = list(range(len(left)))
    while not plan.ok and len(served) > 1:  # max sizes too small for all of them: serve the largest prefix that fits
        served = served[: len(served) // 2]
        plan = cheapest_nodes([left[i].known_demand for i in served], groups, time_limit=time_limit)
    return plan, served

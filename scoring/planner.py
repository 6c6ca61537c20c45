"""OR-Tools CP-SAT planning for what one pod at a time cannot do.

* `place_gang`       all-or-nothing placement of a group of pods on existing nodes (fewest nodes, NVLink blocks kept
                     whole, policy scores as the tie-breaker).
* `repartition_mig`  new MIG layouts for idle GPUs so that pending MIG requests fit (most requests served, then
                     fewest GPUs touched).
* `cheapest_nodes`   the cheapest set of new nodes, per node group, that hosts a pending set of pods.

Each takes a time limit, falls back to a greedy answer when the solver finds nothing in time (or to improve on it),
and reports `status` ("optimal", "feasible", "greedy", "infeasible") and the optimality `gap`
(|objective - best bound| / max(1, |objective|); None when unknown). Pure: states are copied, never changed.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from ortools.sat.python import cp_model

from scoring.fit import feasible, shares_refused
from scoring.fragmentation import Workload
from scoring.gpus import GpuModel, get_model, resolve_mig_layout
from scoring.model import MILLI, ClusterState, NodeSpec, PodDemand, default_blocks
from scoring.placement import Placer
from scoring.policies import FirstFitPolicy, make_policy, mig_gpu_first_fit, spread_replicas

DEFAULT_TIME_LIMIT = 2.0
MAX_CANDIDATE_NODES = 48  # per gang: the best-scoring feasible nodes, to keep the model small


@dataclass
class PlanResult:
    status: str
    objective: float | None = None
    bound: float | None = None
    wall_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None:
            return None
        return abs(self.objective - self.bound) / max(1.0, abs(self.objective))

    @property
    def ok(self) -> bool:
        return self.status in ("optimal", "feasible", "greedy")


def _status(solver: cp_model.CpSolver, code: cp_model.CpSolverStatus) -> str:
    return {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible"}.get(code, "infeasible")


def _solver(time_limit: float, seed: int = 0) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    solver.parameters.num_workers = 1  # deterministic and polite on shared machines
    solver.parameters.random_seed = seed
    # CP-SAT otherwise installs its own SIGINT handler and leaves the default one behind: a later Ctrl-C then kills the
    # process outright, past Python's KeyboardInterrupt and every cleanup.
    solver.parameters.catch_sigint_signal = False
    return solver


# -- bins: existing nodes or new-node templates, as free capacity ------------------------------------------------------

@dataclass
class _Bin:
    cpu: int
    mem: int
    gpu_left: list[int]
    model: str
    blocks: list[int]
    mig_free: dict[str, int] = field(default_factory=dict)
    node: int = -1  # index in the state for existing nodes
    group: str = ""  # node group for new nodes
    cost: float = 0.0
    replicas: int = 1  # time-slicing replicas per GPU (scoring.model): its nvidia.com/gpu devices are replicas
    shares: bool = True  # a GPU share can be given here (scoring.model, "Shares": ClusterState.share_nodes)
    dra: bool = False  # DRA GPUs: only pods asking through claims (scoring.model, "Channels")

    def free_replicas(self) -> int:
        """The nvidia.com/gpu devices free on a time-sliced bin (its device plugin picks which GPUs they are on)."""
        return sum(left // (MILLI // self.replicas) for left in self.gpu_left)


def _assignment_model(pods: Sequence[PodDemand], bins: Sequence[_Bin], *, must_place: bool,
                      allowed: Sequence[Sequence[bool] | None] | None = None,
                      ) -> tuple[cp_model.CpModel, dict[tuple[int, int], cp_model.IntVar],
                                 dict[tuple[int, int, int], cp_model.IntVar]]:
    """CP-SAT variables shared by the planners: x[p][b] pod on bin, a[p][b][g] pod uses GPU g of bin b.
    `allowed[p][b]`: whether pod p may go to bin b at all (None: any bin)."""
    m = cp_model.CpModel()
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    a: dict[tuple[int, int, int], cp_model.IntVar] = {}
    for p, pod in enumerate(pods):
        may = allowed[p] if allowed is not None else None
        for b, bn in enumerate(bins):
            if may is not None and not may[b]:
                continue
            if pod.cpu_milli > bn.cpu or pod.memory_mib > bn.mem:
                continue
            if pod.gpus and pod.allowed_models and bn.model not in pod.allowed_models:
                continue
            if pod.gpus and bn.dra != pod.claims:  # the GPUs reach pods the other way (scoring.fit)
                continue
            if pod.mig_profile:
                if bn.mig_free.get(pod.mig_profile, 0) <= 0:
                    continue
            elif pod.gpus and bn.replicas > 1:  # replicas, counted per node (scoring.fit); no GPU share fits
                if not pod.takes_replicas or bn.free_replicas() < pod.gpus:
                    continue
            elif pod.gpus and not bn.shares and shares_refused(pod):  # no sharing device plugin (scoring.fit)
                continue
            elif pod.gpus:
                ok_gpus = [g for g, left in enumerate(bn.gpu_left) if left >= pod.gpu_milli]
                if len(ok_gpus) < pod.gpus:
                    continue
            v = m.new_bool_var(f"x{p}_{b}")
            x[p, b] = v
            if pod.gpus and not pod.mig_profile and bn.replicas == 1:
                gs = [g for g, left in enumerate(bn.gpu_left) if left >= pod.gpu_milli]
                for g in gs:
                    a[p, b, g] = m.new_bool_var(f"a{p}_{b}_{g}")
                m.add(sum(a[p, b, g] for g in gs) == pod.gpus * v)
    for p in range(len(pods)):
        choices = [x[p, b] for b in range(len(bins)) if (p, b) in x]
        if must_place:
            m.add(sum(choices) == 1) if choices else m.add_bool_or([])  # empty OR = infeasible
        else:
            m.add(sum(choices) <= 1)
    for b, bn in enumerate(bins):
        on = [(p, x[p, b]) for p in range(len(pods)) if (p, b) in x]
        if not on:
            continue
        m.add(sum(pods[p].cpu_milli * v for p, v in on) <= bn.cpu)
        m.add(sum(pods[p].memory_mib * v for p, v in on) <= bn.mem)
        if bn.replicas > 1:
            replicas = [(pods[p].gpus, v) for p, v in on if pods[p].takes_replicas]
            if replicas:
                m.add(sum(k * v for k, v in replicas) <= bn.free_replicas())
        for g, left in enumerate(bn.gpu_left):
            users = [(p, a[p, b, g]) for p in range(len(pods)) if (p, b, g) in a]
            if users:
                m.add(sum(pods[p].gpu_milli * v for p, v in users) <= left)
        for profile, free in bn.mig_free.items():
            instances = [v for p, v in on if pods[p].mig_profile == profile]
            if instances:
                m.add(sum(instances) <= free)
    return m, x, a


def _bins_from_state(state: ClusterState, nodes: Sequence[int]) -> list[_Bin]:
    out = []
    for n in nodes:
        k = int(state.gpu_count[n])
        mig_free = {p: int(state.mig_free[n, :, c].sum()) for p, c in state.mig_pos.items()
                    if state.mig_free[n, :, c].sum() > 0}
        out.append(_Bin(int(state.cpu_left[n]), int(state.mem_left[n]), [int(v) for v in state.gpu_left[n, :k]],
                        state.model_names[state.model_idx[n]] if k else "", [int(v) for v in state.block[n, :k]],
                        mig_free, node=int(n), replicas=int(state.replicas[n]),
                        shares=bool(state.share_nodes[n]), dra=bool(state.dra_rows[n])))
    return out


# -- gangs -------------------------------------------------------------------------------------------------------------

@dataclass
class GangPlan(PlanResult):
    placements: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # per pod: (node, gpu indices)


def place_gang(state: ClusterState, pods: Sequence[PodDemand], *, policy: str = "gpuaas",
               workload: Workload | None = None,
               time_limit: float = DEFAULT_TIME_LIMIT, max_nodes: int = MAX_CANDIDATE_NODES,
               allowed: Sequence[np.ndarray | None] | None = None) -> GangPlan:
    """Place every pod of the gang or none. Objective: fewest nodes, then fewest NVLink/NUMA blocks spanned by
    multi-GPU pods, then the policy's preference (0..100 per pod and node). `allowed`: per pod, the rows it may go
    to (its nodeSelector, affinity and tolerations; cordons), None for any."""
    import time

    t0 = time.perf_counter()
    masks = list(allowed) if allowed is not None else [None] * len(pods)
    if len(masks) != len(pods):
        raise ValueError(f"allowed has {len(masks)} masks for {len(pods)} pods")
    greedy = _greedy_gang(state, pods, policy, workload, masks)
    pol = make_policy(policy, state, workload)
    # Candidate nodes: union over pods of the best-scoring feasible nodes, capped.
    score = np.zeros(len(state))
    cand: set[int] = set()
    for pod, may in zip(pods, masks, strict=True):
        mask = feasible(state, pod) if may is None else feasible(state, pod) & may
        if not mask.any():
            return GangPlan("infeasible", wall_seconds=time.perf_counter() - t0,
                            notes=[f"pod {pod.name or '?'} fits on no node it may go to, even alone"])
        s = np.asarray(pol.score(state, pod, mask), dtype=float)
        s = np.where(mask, s, -np.inf)
        top = np.argsort(-s, kind="stable")[: max(4, max_nodes // max(1, len(pods)))]
        cand.update(int(i) for i in top if mask[i])
        score = np.maximum(score, np.where(mask, s, 0))
    if greedy:
        cand.update(n for n, _ in greedy)
    nodes = sorted(cand)[: max_nodes * 2]
    bins = _bins_from_state(state, nodes)
    m, x, a = _assignment_model(pods, bins, must_place=True,
                                allowed=[None if may is None else [bool(may[b.node]) for b in bins] for may in masks])
    used = {b: m.new_bool_var(f"used{b}") for b in range(len(bins))}
    for (_p, b), v in x.items():
        m.add_implication(v, used[b])
    spans = []
    for p, pod in enumerate(pods):
        if pod.gpus < 2:
            continue
        for b, bn in enumerate(bins):
            if (p, b) not in x:
                continue
            for blk in set(bn.blocks):
                use_blk = m.new_bool_var(f"blk{p}_{b}_{blk}")
                for g, gb in enumerate(bn.blocks):
                    if gb == blk and (p, b, g) in a:
                        m.add_implication(a[p, b, g], use_blk)
                spans.append(use_blk)
    # Policy scores, scaled to 0..100 per pod (higher better) -> cost 100 - s.
    lo, hi = float(score[nodes].min()) if nodes else 0.0, float(score[nodes].max()) if nodes else 1.0
    pref: dict[tuple[int, int], int] = {}
    for p, b in x:
        node_score = float(score[bins[b].node])
        pref[p, b] = round(100 * (node_score - lo) / (hi - lo)) if hi > lo else 100
    m.minimize(10_000 * sum(used.values()) + 100 * sum(spans) + sum((100 - pref[k]) * v for k, v in x.items()))
    if greedy:  # hint the solver with the greedy answer
        for p, (n, _gpus) in enumerate(greedy):
            b = nodes.index(n)
            for (pp, bb), v in x.items():
                if pp == p:
                    m.add_hint(v, bb == b)
    solver = _solver(time_limit)
    code = solver.solve(m)
    status = _status(solver, code)
    if status != "infeasible":
        placements: list[tuple[int, tuple[int, ...]]] = []
        left = {b: list(bn.gpu_left) for b, bn in enumerate(bins) if bn.replicas > 1}  # replicas handed out so far
        for p in range(len(pods)):
            b = next(b for b in range(len(bins)) if (p, b) in x and solver.value(x[p, b]))
            gpus = tuple(g for g in range(len(bins[b].gpu_left)) if (p, b, g) in a and solver.value(a[p, b, g]))
            if b in left and pods[p].takes_replicas:  # the device plugin's choice, as scoring.policies models it
                unit = MILLI // bins[b].replicas
                gpus = spread_replicas(left[b], unit, pods[p].gpus)
                for g in gpus:
                    left[b][g] -= unit
            if pods[p].mig_profile:
                taken = Counter(g for n, gs in placements if n == bins[b].node for g in gs)
                gpus = (mig_gpu_first_fit(state, pods[p], bins[b].node, taken),)
            placements.append((bins[b].node, gpus))
        return GangPlan(status, solver.objective_value, solver.best_objective_bound, time.perf_counter() - t0,
                        placements=placements)
    if greedy:
        return GangPlan("greedy", wall_seconds=time.perf_counter() - t0, placements=greedy,
                        notes=["CP-SAT found no solution in time; greedy placement returned"])
    return GangPlan("infeasible", wall_seconds=time.perf_counter() - t0,
                    notes=["no all-or-nothing placement found (solver and greedy)"])


def _greedy_gang(state: ClusterState, pods: Sequence[PodDemand], policy: str, workload: Workload | None,
                 allowed: Sequence[np.ndarray | None]) -> list[tuple[int, tuple[int, ...]]] | None:
    """One pod at a time with the policy on a copy, largest first; None if any pod does not fit."""
    fork = state.copy()
    placer = Placer(fork, make_policy(policy, fork, workload))
    order = sorted(range(len(pods)), key=lambda i: (-pods[i].total_gpu_milli, -pods[i].cpu_milli))
    out: dict[int, tuple[int, tuple[int, ...]]] = {}
    for i in order:
        choice = placer.place(pods[i], allowed[i])
        if choice is None:
            return None
        out[i] = (choice.node, choice.devices)
    return [out[i] for i in range(len(pods))]


# -- MIG repartitioning ------------------------------------------------------------------------------------------------

@dataclass
class MigPlan(PlanResult):
    layouts: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)  # (node, gpu) -> new layout
    served: dict[str, int] = field(default_factory=dict)


def _layout_options(model: GpuModel) -> list[dict[str, int]]:
    """Distinct maximal profile multisets that fit one GPU (no +me profiles)."""
    names = [p for p in model.mig_profiles if "+me" not in p]
    profs = [model.mig_profiles[p] for p in names]
    seen: set[tuple[int, ...]] = set()
    out: list[dict[str, int]] = []

    def rec(i: int, mask: int, counts: list[int]) -> None:
        if i == len(profs):
            key = tuple(counts)
            if key not in seen and any(counts):
                seen.add(key)
                out.append({names[j]: c for j, c in enumerate(counts) if c})
            return
        p = profs[i]
        # place 0..k more of profile i at the lowest free aligned starts
        rec(i + 1, mask, counts)
        m, c = mask, 0
        for s in p.starts:
            pm = p.placement_mask(s)
            if m & pm:
                continue
            m |= pm
            c += 1
            counts2 = counts.copy()
            counts2[i] += c
            if sum(q.compute_slices * counts2[j] for j, q in enumerate(profs)) <= 7:
                rec(i + 1, m, counts2)

    rec(0, 0, [0] * len(profs))
    valid = []
    for lay in out:
        try:
            resolve_mig_layout(model, lay)
        except ValueError:
            continue
        valid.append(lay)
    return valid


WHOLE_GPU_CONVERSION_COST = 4  # a whole GPU turned into MIG counts as this many re-layouts of MIG GPUs


def repartition_mig(state: ClusterState, pending: Sequence[PodDemand], *, time_limit: float = DEFAULT_TIME_LIMIT,
                    max_gpus: int = 256, nodes: Sequence[int] | None = None) -> MigPlan:
    """New layouts for idle MIG-capable GPUs (no allocated instance, no share in use) that serve the most pending MIG
    requests beyond what free instances already serve; then touch the fewest GPUs. `nodes` limits the candidates
    (e.g. to nodes with CPU and memory left for the pending pods)."""
    import time

    t0 = time.perf_counter()
    demand = Counter(p.mig_profile for p in pending if p.mig_profile)
    if not demand:
        return MigPlan("optimal", 0.0, 0.0, 0.0)
    # Requests already covered by free instances are not planned for.
    free_now = Counter({p: int(state.mig_free[:, :, c].sum()) for p, c in state.mig_pos.items()})
    need = Counter({p: max(0, n - free_now.get(p, 0)) for p, n in demand.items()})
    need = +need
    idle = []
    for n in (range(len(state)) if nodes is None else nodes):
        if not state.gpu_count[n]:
            continue
        model = state.models[state.model_idx[n]]
        if not model.mig_capable:
            continue
        for g in range(int(state.gpu_count[n])):
            insts = state.mig_instances[n].get(g)
            busy = ((insts and any(i.allocated for i in insts))
                    or (not state.mig_enabled[n, g] and state.gpu_left[n, g] < MILLI))
            if not busy:
                idle.append((n, g, model))
    # GPUs already in MIG mode first: converting a whole GPU costs a GPU reset and takes it from whole-GPU jobs.
    idle.sort(key=lambda ngm: not state.mig_enabled[ngm[0], ngm[1]])
    idle = idle[:max_gpus]
    if not need or not idle:
        return MigPlan("optimal", 0.0, 0.0, time.perf_counter() - t0,
                       served={p: demand[p] - need.get(p, 0) for p in demand},
                       notes=[] if need else ["free instances already serve every request"])
    m = cp_model.CpModel()
    opts_by_model = {mod.name: _layout_options(mod) for _, _, mod in idle}
    choose: dict[tuple[int, int], tuple[cp_model.IntVar, dict[str, int]]] = {}
    keep: dict[int, cp_model.IntVar] = {}
    gain_terms: dict[str, list[tuple[int, cp_model.IntVar]]] = {p: [] for p in need}
    changes = []
    for i, (n, g, model) in enumerate(idle):
        current = Counter(x.profile for x in state.mig_instances[n].get(g, []))
        keep[i] = m.new_bool_var(f"keep{i}")
        opts: list[cp_model.IntVar] = []
        for j, lay in enumerate(opts_by_model[model.name]):
            if not any(p in need for p in lay):
                continue
            v = m.new_bool_var(f"c{i}_{j}")
            choose[i, j] = (v, lay)
            opts.append(v)
            for p, cnt in lay.items():
                if p in need:
                    # instances gained relative to the free ones the GPU has now
                    gain_terms[p].append((cnt - current.get(p, 0), v))
        m.add_exactly_one([keep[i], *opts])
        changes.append((1 if state.mig_enabled[n, g] else WHOLE_GPU_CONVERSION_COST) * sum(opts) if opts else 0)
    served: dict[str, cp_model.IntVar] = {}
    for p, n_need in need.items():
        served[p] = m.new_int_var(0, n_need, f"served_{p}")
        m.add(served[p] <= sum(c * v for c, v in gain_terms[p])) if gain_terms[p] else m.add(served[p] == 0)
    # Serve the most requests, weighted by size (compute slices), then change the fewest GPUs, whole GPUs last.
    weight = {p: next(mod.mig_profiles[p].compute_slices for _, _, mod in idle if p in mod.mig_profiles)
              if any(p in mod.mig_profiles for _, _, mod in idle) else 1 for p in need}
    m.maximize(1000 * sum(weight[p] * served[p] for p in need) - sum(changes))
    greedy = _greedy_mig(idle, opts_by_model, need, state)
    solver = _solver(time_limit)
    code = solver.solve(m)
    status = _status(solver, code)
    if status == "infeasible":
        greedy_layouts, greedy_got = greedy
        return MigPlan("greedy", wall_seconds=time.perf_counter() - t0, layouts=greedy_layouts,
                       served={p: greedy_got.get(p, 0) + (demand[p] - need.get(p, 0)) for p in demand},
                       notes=["CP-SAT found no solution in time; greedy layouts returned"])
    layouts = {}
    for (i, _j), (v, lay) in choose.items():
        if solver.value(v):
            n, g, _ = idle[i]
            layouts[(n, g)] = dict(lay)
    got = {p: solver.value(served[p]) for p in need}
    return MigPlan(status, solver.objective_value, solver.best_objective_bound, time.perf_counter() - t0,
                   layouts=layouts, served={p: got.get(p, 0) + (demand[p] - need.get(p, 0)) for p in demand})


def _greedy_mig(idle: Sequence[tuple[int, int, GpuModel]], opts_by_model: Mapping[str, list[dict[str, int]]],
                need: Counter[str], state: ClusterState) -> tuple[dict[tuple[int, int], dict[str, int]], Counter[str]]:
    """Largest pending profile first: give each idle GPU the layout holding the most instances still needed."""
    left = Counter(need)
    layouts: dict[tuple[int, int], dict[str, int]] = {}
    got: Counter[str] = Counter()
    for n, g, model in idle:
        if not +left:
            break
        best: dict[str, int] | None = None
        best_gain = 0
        for lay in opts_by_model[model.name]:
            gain = sum(min(c, left[p]) * model.mig_profiles[p].compute_slices for p, c in lay.items() if p in left)
            if gain > best_gain:
                best, best_gain = lay, gain
        if best is None:
            continue
        layouts[(n, g)] = dict(best)
        for p, c in best.items():
            take = min(c, left[p])
            left[p] -= take
            got[p] += take
    return layouts, got


def apply_mig_plan(state: ClusterState, plan: MigPlan) -> None:
    for (n, g), lay in plan.layouts.items():
        state.set_mig_layout(n, g, lay)


# -- new nodes ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeGroup:
    """A node group the autoscaler can grow: a node template, a price per node and how many more it may add."""

    name: str
    template: NodeSpec
    price: float
    max_new: int = 16


@dataclass
class ScaleUpPlan(PlanResult):
    new_nodes: dict[str, int] = field(default_factory=dict)  # group -> count
    cost: float = 0.0
    assignments: list[tuple[str, int]] = field(default_factory=list)  # per pod: (group, new-node ordinal)
    unplaceable: list[int] = field(default_factory=list)  # pod indices that fit no group template


def cheapest_nodes(pending: Sequence[PodDemand], groups: Sequence[NodeGroup], *,
                   time_limit: float = DEFAULT_TIME_LIMIT) -> ScaleUpPlan:
    """Fewest-cost new nodes (any mix of groups, each up to max_new) that host every placeable pending pod."""
    import time

    t0 = time.perf_counter()
    bins: list[_Bin] = []
    specs: list[NodeSpec] = []  # the same new nodes as a model, for the fit rules and the greedy plan
    for grp in groups:
        t = grp.template
        model_name = get_model(t.gpu_model).name if t.gpus else ""
        blocks = list(t.gpu_blocks or default_blocks(t.gpus))
        mig_free: dict[str, int] = {}
        if t.mig_layouts:
            for lay in t.mig_layouts:
                for p, c in (lay or {}).items():
                    mig_free[p] = mig_free.get(p, 0) + c
        cap = min(grp.max_new, max(1, len(pending)))
        for _ in range(cap):
            gpu_left = [0 if (t.mig_layouts and t.mig_layouts[g]) else MILLI for g in range(t.gpus)]
            bins.append(_Bin(t.cpu_milli, t.memory_mib, gpu_left, model_name, blocks, dict(mig_free),
                             group=grp.name, cost=grp.price, replicas=t.gpu_replicas, shares=t.gpu_shares,
                             dra=t.dra))
            specs.append(replace(t, name=f"{grp.name}-{len(specs)}"))
    # Pods no template can host at all are reported, not planned.
    empty = ClusterState(specs)
    unplaceable: list[int] = []
    placeable: list[int] = []
    for i, pod in enumerate(pending):
        (placeable if feasible(empty, pod).any() else unplaceable).append(i)
    pods = [pending[i] for i in placeable]
    m, x, _a = _assignment_model(pods, bins, must_place=True)
    used = [m.new_bool_var(f"u{b}") for b in range(len(bins))]
    for (_p, b), v in x.items():
        m.add_implication(v, used[b])
    # Symmetry: within a group, new node k+1 only if node k.
    for b in range(1, len(bins)):
        if bins[b].group == bins[b - 1].group:
            m.add_implication(used[b], used[b - 1])
    scale = 100  # prices to integer cents
    m.minimize(sum(round(bins[b].cost * scale) * used[b] for b in range(len(bins))))
    greedy = _greedy_new_nodes(pods, bins, specs)
    if greedy is not None:
        for b, v in enumerate(used):
            m.add_hint(v, b in greedy[1])
    solver = _solver(time_limit)
    code = solver.solve(m)
    status = _status(solver, code)
    if status == "infeasible":
        if greedy is None:
            return ScaleUpPlan("infeasible", wall_seconds=time.perf_counter() - t0, unplaceable=unplaceable,
                               notes=["the pending pods do not fit within the groups' max_new"])
        assign, used_bins = greedy
        return _scale_plan("greedy", None, None, t0, bins, used_bins, assign, unplaceable,
                           ["CP-SAT found no solution in time; greedy first-fit returned"])
    used_bins = {b for b in range(len(bins)) if solver.value(used[b])}
    assign = [next(b for b in range(len(bins)) if (p, b) in x and solver.value(x[p, b])) for p in range(len(pods))]
    return _scale_plan(status, solver.objective_value / scale, solver.best_objective_bound / scale, t0, bins,
                       used_bins, assign, unplaceable)


def _scale_plan(status: str, obj: float | None, bound: float | None, t0: float, bins: Sequence[_Bin],
                used_bins: set[int], assign: Sequence[int], unplaceable: list[int],
                notes: Sequence[str] = ()) -> ScaleUpPlan:
    import time

    ordinal: dict[int, int] = {}
    counts: Counter[str] = Counter()
    for b in sorted(used_bins):
        ordinal[b] = counts[bins[b].group]
        counts[bins[b].group] += 1
    cost = sum(bins[b].cost for b in used_bins)
    return ScaleUpPlan(status, obj, bound, time.perf_counter() - t0, list(notes), new_nodes=dict(counts), cost=cost,
                       assignments=[(bins[b].group, ordinal[b]) for b in assign], unplaceable=unplaceable)


def _greedy_new_nodes(pods: Sequence[PodDemand], bins: Sequence[_Bin],
                      specs: Sequence[NodeSpec]) -> tuple[list[int], set[int]] | None:
    """First-fit decreasing onto the new nodes in price order (within a group in ordinal order, which keeps the
    planner's symmetry rule): (bin per pod, bins used), or None when some pod fits none."""
    order = sorted(range(len(bins)), key=lambda b: (bins[b].cost, b))
    state = ClusterState([specs[b] for b in order])
    placer = Placer(state, FirstFitPolicy(state))
    assign = [-1] * len(pods)
    for i in sorted(range(len(pods)), key=lambda i: (-pods[i].total_gpu_milli, -pods[i].cpu_milli)):
        choice = placer.place(pods[i])
        if choice is None:
            return None
        assign[i] = order[choice.node]
    return assign, set(assign)

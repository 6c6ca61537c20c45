"""Scale-in: which GPU nodes to drain and remove. Pure functions of the snapshot.

A node is a candidate when it belongs to a configured group above its min_size, has been GPU-ready for
`delay_after_add_s`, nobody else cordoned it, it is not marked `cluster-autoscaler.kubernetes.io/scale-down-disabled`
or `karpenter.sh/do-not-disrupt`, and its GPU requests have stayed below `utilization_threshold` of its GPUs for
`unneeded_s` (GPU only, as cluster-autoscaler judges GPU nodes: a CPU pod does not keep a GPU node alive).

On a DRA node the GPUs in use are the devices of its allocated ResourceClaims, whoever allocated them (the model holds
them as a bound pod's); a pod bound there moves with what its claims ask (nodescaler.snapshot), through the same
drain. A node with a claim allocated for a pod not bound yet (no `reservedFor`: the gang controller allocated it and
released the pod) is not a candidate: that pod is on its way there.

A node in service (GPU-ready once, or with pods bound) that has been unready for `unready_drain_s` is drained too, as
cluster-autoscaler treats long-unready nodes: through the same cordon, Eviction API and re-checked delete as an idle
node, never deleted with pods bound. Until then it is left alone with its pods.

Each disruption method is a small type behind `Method`, tried in order (`METHODS`); each returns `DrainCommand`s, data
the executor re-validates before acting. A command's pods are those that must move; the method has checked that each
may be evicted and that the rest of the cluster has room for them (the extender's placement code on a copy of the
model, with the nodes already draining or chosen in this round taken out).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scoring.fit import feasible
from scoring.model import MILLI, ClusterState

from .config import NodeScalerConfig
from .scaleout import block_rows, mig_wanted, open_dra_mig, place_greedy, snapshot_rows, unavailable_rows
from .snapshot import ClusterSnapshot, NodeInfo, PdbInfo, PodInfo, in_service


@dataclass(frozen=True)
class DrainCommand:
    node: str
    group: str
    method: str
    pods: tuple[str, ...]  # pods to evict
    why: str


def lift(state: ClusterState, row: int, keys: set[str]) -> None:
    """Take the pods named `keys` off `row` of a what-if state (they are about to move)."""
    for demand, devices in list(state.pods_on[row]):
        if demand.name in keys:
            state.remove(row, demand, devices)


def must_move(pods: Sequence[PodInfo]) -> list[PodInfo]:
    """The pods that have to leave before the node may go: all that hold resources but DaemonSet and static pods."""
    return [p for p in pods if p.holds and not p.daemon]


def eviction_blocker(pod: PodInfo, pdbs: Sequence[PdbInfo], *, check_budget: bool = True) -> str | None:
    """Why this pod may not be evicted now (None if it may)."""
    if pod.do_not_disrupt:
        return f"pod {pod.key} has karpenter.sh/do-not-disrupt"
    if pod.safe_to_evict is False:
        return f"pod {pod.key} has cluster-autoscaler.kubernetes.io/safe-to-evict=false"
    if not pod.owner_kind and pod.safe_to_evict is not True:
        return f"pod {pod.key} has no controller to recreate it (set safe-to-evict=true to allow)"
    if check_budget:
        for pdb in pdbs:
            if pdb.selects(pod) and pdb.disruptions_allowed <= 0:
                return f"pod {pod.key}: PodDisruptionBudget {pdb.key} allows no disruption now"
    return None


def gpu_utilization(snap: ClusterSnapshot, node: str) -> float | None:
    """GPU share in use on the node, 0..1 (MIG instances count their compute slices); None if not modelled."""
    row = snap.state.index.get(node)
    if row is None or not snap.state.gpu_count[row]:
        return None
    total = int(snap.state.gpu_count[row]) * MILLI
    idle = int(snap.state.gpu_idle_milli()[row])
    return (total - idle) / total


def update_unneeded(previous: Mapping[str, float], snap: ClusterSnapshot, config: NodeScalerConfig) -> dict[str, float]:
    """Since when each node has been below the threshold (kept while it stays there, dropped when it rises)."""
    out = {}
    for n in snap.nodes.values():
        if config.group(n.group) is None or n.booting:
            continue
        u = gpu_utilization(snap, n.name)
        if u is not None and u < config.scale_in.utilization_threshold:
            out[n.name] = previous.get(n.name, snap.now)
    return out


def update_unready(previous: Mapping[str, float], snap: ClusterSnapshot, config: NodeScalerConfig) -> dict[str, float]:
    """Since when each node in service has been unready (NotReady or no GPUs allocatable), continuously; dropped as
    soon as it is GPU-ready again. Nodes whose MIG layout is being changed are not counted (their GPUs come back when
    the MIG manager is done), nor nodes being drained."""
    out = {}
    for n in snap.nodes.values():
        if config.group(n.group) is None or n.drain is not None or not n.booting or n.mig_pending:
            continue
        if in_service(n, snap.pods_on(n.name)):
            out[n.name] = previous.get(n.name, snap.now)
    return out


@dataclass
class Round:
    """What one scale-in round has decided so far: methods see the drains already chosen."""

    snap: ClusterSnapshot
    config: NodeScalerConfig
    unneeded: Mapping[str, float]
    group_left: dict[str, int]  # how many more nodes each group may lose before min_size
    budget: int  # how many more drains may start
    taken: set[str] = field(default_factory=set)
    commands: list[DrainCommand] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # candidate -> why not
    unready: Mapping[str, float] = field(default_factory=dict)  # nodes in service unready, since when

    def __post_init__(self) -> None:
        waiting = [p for p in self.snap.pods if not p.node and p.gpu and p.demand is not None and not p.terminating
                   and p.phase in ("Pending", "")]
        # Idle DRA GPUs opened for the MIG profiles pods wait for, as scale-out sees them (scaleout.open_dra_mig).
        self.state = open_dra_mig(self.snap, self.snap.state.copy(), mig_wanted(waiting))
        self.rows = snapshot_rows(self.snap, self.state)
        # Pods that still have to leave a node being drained, and pods waiting for a node (among them the
        # replacements of pods already evicted), need room on the rest: it is reserved before any new drain is
        # chosen, so that this round cannot take it (seen: drains started while two others still had pods to move
        # left too little room, and their last pods stayed Pending behind the PodDisruptionBudget for good).
        leaving = [p for n in self.snap.nodes.values() if n.drain is not None
                   for p in must_move(self.snap.pods_on(n.name)) if p.demand is not None and not p.terminating]
        for n in {p.node for p in leaving}:
            lift(self.state, self.state.index[n], {p.key for p in leaving if p.node == n})
        block_rows(self.state, unavailable_rows(self.snap))
        block_rows(self.state, [self.state.index[n.name] for n in self.snap.nodes.values()
                                if n.booting and n.name in self.state.index])
        placed, _ = place_greedy(self.state, leaving + waiting, self.config.scale_out.policy, self.snap.workload,
                                 self.rows)
        self.reserved: dict[str, PodInfo] = {p.key: p for p, _ in placed}  # placed in `state` to hold their room

    def vacate(self, node: NodeInfo, movers: Sequence[PodInfo]) -> tuple[ClusterState, list[PodInfo]]:
        """A what-if copy of the round's state with `node` drained: its movers, and the pods whose room was reserved
        on it, placed on the rest; and those of them that fit nowhere."""
        trial = self.state.copy()
        row = trial.index[node.name]
        guests = [self.reserved[d.name] for d, _ in trial.pods_on[row] if d.name in self.reserved]
        lift(trial, row, {p.key for p in movers} | {p.key for p in guests})
        block_rows(trial, [row])
        _, left = place_greedy(trial, list(movers) + guests, self.config.scale_out.policy, self.snap.workload,
                               self.rows)
        return trial, left

    def take(self, cmd: DrainCommand) -> None:
        self.commands.append(cmd)
        self.taken.add(cmd.node)
        self.group_left[cmd.group] -= 1
        self.budget -= 1


def candidates(r: Round) -> list[NodeInfo]:
    """Nodes that may be drained this round, emptiest first."""
    snap, cfg = r.snap, r.config.scale_in
    pending = snap.pending
    model = open_dra_mig(snap, snap.state, mig_wanted(pending))  # a MIG pod fits an idle DRA node (its GPUs opened)
    out = []
    for n in snap.nodes.values():
        if n.name in r.taken or n.drain is not None or n.name not in r.unneeded:
            continue
        group = r.config.group(n.group)
        if group is None or n.booting or n.unschedulable or n.scale_down_disabled:
            continue
        if snap.now - n.created < cfg.delay_after_add_s or snap.now - r.unneeded[n.name] < cfg.unneeded_s:
            continue
        if r.group_left.get(n.group, 0) <= 0:
            r.skipped[n.name] = f"group {n.group} is at min_size {group.min_size}"
            continue
        if n.claims_on_the_way:
            r.skipped[n.name] = f"claim {n.claims_on_the_way[0]} is allocated on it for a pod not bound yet"
            continue
        row = snap.state.index[n.name]
        waiting = next((p for p in pending if feasible(model, p.known_demand)[row]), None)
        if waiting is not None:
            r.skipped[n.name] = f"pending pod {waiting.key} fits on it"
            continue
        out.append(n)
    return sorted(out, key=lambda n: (gpu_utilization(snap, n.name) or 0.0, len(snap.pods_on(n.name)), n.name))


def within_budget(r: Round):
    """Candidates while the round's drain budget lasts, skipping groups already at their minimum size. Lazy: each
    check sees the drains the caller took for the previous candidates."""
    for n in candidates(r):
        if r.budget <= 0:
            return
        if r.group_left[n.group] > 0:
            yield n


class Method(Protocol):
    name: str

    def compute(self, r: Round) -> None:
        """Add the drains this method wants to `r` (r.take), within r.budget."""


class Unready:
    """Nodes in service that stayed unready for `unready_drain_s`: drained so that their pods run elsewhere (they do
    not run where they are). No room check: evicted pods that fit nowhere are pending, and scale-out serves them."""

    name = "Unready"

    def compute(self, r: Round) -> None:
        window = r.config.scale_in.unready_drain_s
        if window is None:
            return
        for name, since in sorted(r.unready.items(), key=lambda kv: (kv[1], kv[0])):
            n = r.snap.nodes.get(name)
            if r.budget <= 0:
                return
            if n is None or n.drain is not None or name in r.taken or r.snap.now - since < window:
                continue
            if n.scale_down_disabled:
                r.skipped[name] = "unready, but marked scale-down-disabled or do-not-disrupt"
                continue
            if n.unschedulable:
                r.skipped[name] = "unready, and cordoned by someone else"
                continue
            group = r.config.group(n.group)
            if group is None or r.group_left.get(n.group, 0) <= 0:
                r.skipped[name] = f"unready, but group {n.group} is at its min_size"
                continue
            movers = must_move(r.snap.pods_on(name))
            blockers = [b for p in movers if (b := eviction_blocker(p, r.snap.pdbs, check_budget=False))]
            if blockers:
                r.skipped[name] = f"unready, but {blockers[0]}"
                continue
            r.take(DrainCommand(name, n.group, self.name, tuple(p.key for p in movers),
                                f"unready for {r.snap.now - since:.0f}s (unready_drain_s {window:.0f}); "
                                f"{len(movers)} pods to move"))


class Emptiness:
    """Nodes with nothing that must move: removed without evicting anything (in bulk)."""

    name = "Empty"

    def compute(self, r: Round) -> None:
        for n in within_budget(r):
            if not must_move(r.snap.pods_on(n.name)):
                trial, left = r.vacate(n, ())
                if left:
                    r.skipped[n.name] = f"the room it holds for pod {left[0].key} is needed"
                    continue
                r.take(DrainCommand(n.name, n.group, self.name, (), "no pods to move"))
                r.state = trial


class Underutilized:
    """Nodes whose pods may be evicted and fit on the rest of the cluster."""

    name = "Underutilized"

    def compute(self, r: Round) -> None:
        for n in within_budget(r):
            movers = must_move(r.snap.pods_on(n.name))
            blockers = [b for p in movers if (b := eviction_blocker(p, r.snap.pdbs))]
            if blockers:
                r.skipped[n.name] = blockers[0]
                continue
            unreadable = [p.key for p in movers if p.demand is None]
            if unreadable:
                r.skipped[n.name] = f"pod {unreadable[0]} cannot be read: {r.snap.unreadable.get(unreadable[0], '')}"
                continue
            trial, left = r.vacate(n, movers)
            if left:
                r.skipped[n.name] = f"pod {left[0].key} fits nowhere else" if left[0].node == n.name else \
                    f"its pods would take the room pod {left[0].key} needs"
                continue
            util = gpu_utilization(r.snap, n.name) or 0.0
            r.take(DrainCommand(n.name, n.group, self.name, tuple(p.key for p in movers),
                                f"GPU utilization {util:.0%} below {r.config.scale_in.utilization_threshold:.0%}; "
                                f"{len(movers)} pods fit elsewhere"))
            r.state = trial  # later candidates see these pods moved


# Tried in order: capacity that does not work first, then the cheapest disruptions.
METHODS: tuple[Method, ...] = (
    Unready(),        # capacity that does not work: its pods are not running well where they are
    Emptiness(),      # nothing to evict: no disruption at all
    Underutilized(),  # pods move elsewhere, PDBs enforced by the Eviction API
)


def plan_scale_in(snap: ClusterSnapshot, config: NodeScalerConfig, unneeded: Mapping[str, float],
                  methods: Sequence[Method] = METHODS, unready: Mapping[str, float] | None = None) -> Round:
    draining = sum(1 for n in snap.nodes.values() if n.drain is not None)
    group_left = {}
    for g in config.groups:
        live = [n for n in snap.group_nodes(g.name) if n.drain is None]
        group_left[g.name] = len(live) - g.min_size
    r = Round(snap, config, unneeded, group_left, budget=config.scale_in.max_concurrent_drains - draining,
              unready=unready or {})
    if not config.scale_in.enabled or r.budget <= 0:
        return r
    for m in methods:
        m.compute(r)
    return r

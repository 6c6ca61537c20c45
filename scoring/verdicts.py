"""What a scheduler extender answers, as pure functions of the model (the HTTP extender serves them; the node
autoscaler asks the same questions of a what-if cluster): which candidate nodes fit a pod (and why the others do
not, split into misfits no amount of waiting or preemption fixes and those that free capacity would fix), and how the
configured policy ranks the ones that fit, on the extender's 0..10 scale.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import itemgetter
from typing import Any

import numpy as np

from scoring.fit import feasible, free_on, misfit_reasons, present
from scoring.model import ClusterState, PodDemand
from scoring.policies import MAX_EXTENDER_PRIORITY, Policy, normalize, select_node
from scoring.queueplan import QueuePlan

UNKNOWN_NODE = "node not (yet) in gpuaas's cache; it will be considered once the node watch delivers it"


@dataclass
class FilterVerdict:
    feasible: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # might fit once capacity frees up (or by preemption)
    unresolvable: dict[str, str] = field(default_factory=dict)  # never fits this pod as the node is built
    feasible_rows: np.ndarray | None = None  # model rows of `feasible`, for a prioritize that follows


def node_indices(state: ClusterState, names: list[str]) -> np.ndarray:
    """Model row per name, -1 for names the model does not know."""
    if len(names) > 1:
        try:  # every name known, the usual case: one C-level lookup of all names, no Python call per name
            return np.fromiter(itemgetter(*names)(state.index), dtype=np.int64, count=len(names))
        except KeyError:
            pass
    return np.fromiter(map(state.index.get, names, repeat(-1)), dtype=np.int64, count=len(names))


def filter_nodes(state: ClusterState, pod: PodDemand, names: list[str],
                 unreadable: dict[str, str] | None = None) -> FilterVerdict:
    verdict = FilterVerdict()
    rows = node_indices(state, names)
    known = rows >= 0
    if known.all():
        code, messages, resolvable = misfit_reasons(state, pod, rows)
    else:
        code = np.full(len(names), -1, dtype=np.int64)
        code[known], messages, resolvable = misfit_reasons(state, pod, rows[known])
    ok = code == 0
    verdict.feasible = list(compress(names, ok.tolist()))
    verdict.feasible_rows = rows[ok]
    # Thousands of rejected nodes share a few messages: one C-level gather of names and one dict.fromkeys per
    # message, not a Python step per name.
    for c in present(code[code > 0]):
        reasons = verdict.unresolvable if c < resolvable else verdict.failed
        reasons.update(dict.fromkeys(_names_at(names, np.flatnonzero(code == c)), messages[c]))
    for name in _names_at(names, np.flatnonzero(~known)):  # names the model does not know (few)
        if unreadable and name in unreadable:
            verdict.unresolvable[name] = f"gpuaas cannot read this node: {unreadable[name]}"
        else:
            verdict.failed[name] = UNKNOWN_NODE
    return verdict


def _names_at(names: list[str], positions: np.ndarray) -> tuple[str, ...]:
    if len(positions) == 0:
        return ()
    if len(positions) == 1:
        return (names[int(positions[0])],)
    picked: tuple[str, ...] = itemgetter(*positions.tolist())(names)  # (typeshed types a many-item getter as Any)
    return picked


@dataclass
class Priorities:
    """prioritize's answer: a 0..10 score per candidate name (aligned with `names`; `rows` their model rows, -1 for
    names the model does not know) and the node gpuaas would pick. Arrays, not pairs: it can hold thousands."""
    names: list[str]
    rows: np.ndarray
    scores: np.ndarray
    pick: str | None
    row_names: list[str]  # the model's node name per row (ClusterState.names)

    def pairs(self) -> list[tuple[str, int]]:
        return list(zip(self.names, self.scores.tolist(), strict=True))


def prioritize(state: ClusterState, policy: Policy, pod: PodDemand, names: list[str],
               rows: np.ndarray | None = None) -> Priorities:
    """0..10 per candidate (candidates that do not fit, or are unknown, get 0), and the node gpuaas would pick.

    Nodes tied at the top are ranked: the pick keeps 10 and the others get 9. kube-scheduler breaks ties at random;
    this way it lands where gpuaas expects, which keeps back-to-back decisions consistent (see ClusterView.assume).
    `rows`: the names' model rows when the caller has them already (filter just mapped the same names)."""
    if rows is None:
        rows = node_indices(state, names)
    known = rows >= 0
    mask = np.zeros(len(state), dtype=bool)
    mask[rows[known]] = True
    mask &= feasible(state, pod)
    raw = np.asarray(policy.score(state, pod, mask), dtype=float)
    scores = normalize(raw, mask, MAX_EXTENDER_PRIORITY)
    best = select_node(raw, mask, np.arange(len(state)))
    if best >= 0:
        ties = mask & (scores == MAX_EXTENDER_PRIORITY)
        ties[best] = False
        scores[ties] = MAX_EXTENDER_PRIORITY - 1
    out = np.zeros(len(names), dtype=np.int64)
    out[known] = scores[rows[known]]
    return Priorities(names, rows, out, state.names[best] if best >= 0 else None, state.names)


HELD_FOR_PLAN = ("held for the pods gpuaas planned ahead of this one (the pending GPU pods are placed jointly, "
                 "largest first; this pod goes first once it has waited queue_max_wait_seconds)")


HELD_BESIDE_PLAN = ("held for the GPU pods gpuaas planned here: the CPU and memory this pod asks would leave them "
                    "no room (while pending GPU pods are placed jointly, a pod asking for no GPU goes where it fits "
                    "beside them, and where it fits nowhere beside them it waits until they are placed, at most "
                    "queue_max_wait_seconds after its creation)")


HELD_FOR_EARLIER_GPU_PODS = ("held for the GPU pods that arrived before this one: gpuaas's gang controller places them "
                             "first (a pod asking for no GPU waits for the pods held for their DRA claims that "
                             "arrived before it, at most queue_max_wait_seconds after its creation)")


def first_release(plan: QueuePlan) -> float | None:
    """The earliest arrival (creation, epoch seconds) among the pods the plan places that the gang controller releases
    (QueuedPod.release_order), None when it places none. A pod asking for no GPU that arrived after it waits for the
    controller to place them, as one-at-a-time placement in arrival order would have placed them before it: placed
    beside the plan instead, the 50-node DRA burst's CPU-only pods still cost the GPU pods 1-2 points."""
    first = None
    for pod in plan.pods.values():
        if pod.release_order is not None and (first is None or pod.release_order[1] < first):
            first = pod.release_order[1]
    return first


def hold_for_plan(verdict: FilterVerdict, reserved: ClusterState, pod: PodDemand, *,
                  reason: str = HELD_FOR_PLAN) -> int:
    """A pod the joint plan left out may not take room promised to planned pods: of the nodes it fits now, those it
    does not fit on `reserved` (the model with every planned pod placed, a copy of the one `verdict` was made on, so
    its rows are the same; -1 for a node the model does not know, which is left alone) move to `failed` with
    `reason` (resolvable: the room frees when the plan changes). Changes `verdict`; returns how many nodes were held
    back."""
    rows = verdict.feasible_rows
    if rows is None or not verdict.feasible:
        return 0
    known = rows >= 0
    keep = np.ones(len(rows), dtype=bool)
    keep[known] = feasible(reserved, pod)[rows[known]]
    if keep.all():
        return 0
    held = list(compress(verdict.feasible, (~keep).tolist()))
    verdict.feasible = list(compress(verdict.feasible, keep.tolist()))
    verdict.feasible_rows = rows[keep]
    verdict.failed.update(dict.fromkeys(held, reason))
    return len(held)


def steer(state: ClusterState, scored: Priorities, pod: PodDemand, row: int) -> Priorities:
    """Rank the planned node (model row `row`) first when it is a candidate the pod fits now: it gets the top score
    and the others at most two below, so kube-scheduler's own scores between nodes it treats alike cannot outweigh
    it. Unchanged when it is not (the plan is stale: the next one fixes it)."""
    at = np.flatnonzero(scored.rows == row)
    if at.size == 0 or not feasible(state, pod)[row]:
        return scored
    scores = np.minimum(scored.scores, MAX_EXTENDER_PRIORITY - 2)
    scores[at] = MAX_EXTENDER_PRIORITY
    return Priorities(scored.names, scored.rows, scores, scored.row_names[row], scored.row_names)


def keep_off_plan(scored: Priorities, reserved: ClusterState, pod: PodDemand) -> Priorities:
    """Rank the nodes where the pod fits beside every planned pod (`reserved`, a copy of the model `scored` was made
    on, with the joint plan placed) above those where it would take room promised to them: the latter get 0 and the
    former at least three, so kube-scheduler's own scores cannot undo it. For a pod the plan does not place, asking
    for no GPU (the CPU-pods entry, whose filter holds it there too, or a configuration of the entry without the
    filter): a burst's CPU-only pods keep off the CPU and memory its waiting GPU pods are planned on. Unchanged when
    the pod fits beside the plan everywhere or nowhere."""
    known = scored.rows >= 0
    fits = np.zeros(len(scored.rows), dtype=bool)
    fits[known] = feasible(reserved, pod)[scored.rows[known]]
    if fits.all() or not fits.any():
        return scored
    scores = np.where(fits, np.maximum(scored.scores, 3), 0)
    pick = scored.pick if scored.pick is not None and fits[scored.names.index(scored.pick)] else \
        scored.names[int(np.argmax(scores))]
    return Priorities(scored.names, scored.rows, scores, pick, scored.row_names)


def devices_free(state: ClusterState, node: int, pod: PodDemand, devices: tuple[int, ...]) -> bool:
    """Whether `devices` on `node` can still take the pod (a choice made earlier, before other placements)."""
    if not pod.gpus:
        return True
    if len(devices) != (1 if pod.mig_profile or pod.is_share else pod.gpus):
        return False
    idx = list(devices)
    if pod.mig_profile:
        col = state.mig_pos.get(pod.mig_profile)
        return col is not None and bool((state.mig_free[node, idx, col] > 0).all())
    # A GPU listed n times gives n replicas on a time-sliced node (n is 1 elsewhere, for a choice gpuaas made).
    gpus, times = np.unique(np.asarray(idx, dtype=np.int64), return_counts=True)
    return bool((state.gpu_left[node, gpus] >= times * state.device_milli(node, pod)).all())


def explain(state: ClusterState, policy: Policy, pod: PodDemand, node: str,
            candidates: list[str] | None = None) -> dict[str, Any]:
    """Why `node` was rejected, or how it scored against the other candidates (all nodes when not given)."""
    names = candidates if candidates is not None else list(state.names)
    if node not in names:
        names = names + [node]
    verdict = filter_nodes(state, pod, names)
    out: dict[str, Any] = {"node": node, "pod": pod.name}  # a JSON object (the extender's /explain answer)
    if node in verdict.unresolvable:
        out.update(fits=False, resolvable=False, reason=verdict.unresolvable[node])
    elif node in verdict.failed:
        out.update(fits=False, resolvable=True, reason=verdict.failed[node], free=free_on(state, state.index[node]))
    else:
        scores = dict(prioritize(state, policy, pod, verdict.feasible).pairs())
        rank = sorted(scores.values(), reverse=True).index(scores[node]) + 1
        raw = policy.score(state, pod, feasible(state, pod))
        out.update(fits=True, score=scores[node], raw_score=float(raw[state.index[node]]), policy=policy.name,
                   rank=rank, candidates=len(verdict.feasible), best_score=max(scores.values()))
    return out

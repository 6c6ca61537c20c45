"""What the extender answers, as pure functions of the model: which candidate nodes fit a pod (and why the others do
not, split into misfits no amount of waiting or preemption fixes and those that free capacity would fix), and how the
configured policy ranks the ones that fit, on the extender's 0..10 scale.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scoring.model import MILLI, ClusterState, PodDemand
from scoring.policies import MAX_EXTENDER_PRIORITY, Policy, feasible, infeasible_reason, normalize, select_node

UNKNOWN_NODE = "node not (yet) in gpuaas's cache; it will be considered once the node watch delivers it"


@dataclass
class FilterVerdict:
    feasible: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # might fit once capacity frees up (or by preemption)
    unresolvable: dict[str, str] = field(default_factory=dict)  # never fits this pod as the node is built


def node_indices(state: ClusterState, names: list[str]) -> np.ndarray:
    """Model row per name, -1 for names the model does not know."""
    index = state.index
    return np.fromiter((index.get(n, -1) for n in names), dtype=np.int64, count=len(names))


def structural_misfits(state: ClusterState, pod: PodDemand, rows: np.ndarray) -> list[str | None]:
    """Per row: why the node can never hold the pod (no GPUs, a model the pod refuses, a MIG profile its GPU model
    does not have, fewer GPUs than asked), or None. These go to FailedAndUnresolvableNodes, which preemption skips."""
    out: list[str | None] = [None] * len(rows)
    if pod.gpus == 0:
        return out
    allowed = state.model_allowed(pod)
    for i, r in enumerate(rows):
        if state.gpu_count[r] == 0:
            out[i] = "node has no GPUs"
            continue
        model = state.models[state.model_idx[r]]
        if not allowed[r]:
            out[i] = f"GPU model {model.name} is not one the pod accepts ({', '.join(sorted(pod.allowed_models))})"
        elif pod.mig_profile and pod.mig_profile not in model.mig_profiles:
            known = ", ".join(p for p in model.mig_profiles if "+" not in p) or "none"
            out[i] = f"no MIG layout of {model.name} has a {pod.mig_profile} instance (its profiles: {known})"
        elif not pod.mig_profile and pod.gpu_milli == MILLI and pod.gpus > state.gpu_count[r]:
            out[i] = f"pod asks for {pod.gpus} GPUs, the node has {state.gpu_count[r]}"
    return out


def filter_nodes(state: ClusterState, pod: PodDemand, names: list[str],
                 unreadable: dict[str, str] | None = None) -> FilterVerdict:
    verdict = FilterVerdict()
    rows = node_indices(state, names)
    fits = feasible(state, pod)
    known = rows >= 0
    ok = np.zeros(len(names), dtype=bool)
    ok[known] = fits[rows[known]]
    bad_rows = np.flatnonzero(known & ~ok)
    misfits = structural_misfits(state, pod, rows[bad_rows])
    bad = dict(zip(bad_rows.tolist(), misfits))
    for i, name in enumerate(names):
        if ok[i]:
            verdict.feasible.append(name)
        elif rows[i] < 0:
            if unreadable and name in unreadable:
                verdict.unresolvable[name] = f"gpuaas cannot read this node: {unreadable[name]}"
            else:
                verdict.failed[name] = UNKNOWN_NODE
        elif bad[i] is not None:
            verdict.unresolvable[name] = bad[i]
        else:
            verdict.failed[name] = infeasible_reason(state, pod, int(rows[i])) or "does not fit"
    return verdict


def prioritize(state: ClusterState, policy: Policy, pod: PodDemand,
               names: list[str]) -> tuple[list[tuple[str, int]], str | None]:
    """0..10 per candidate (candidates that do not fit, or are unknown, get 0), and the node gpuaas would pick.

    Nodes tied at the top are ranked: the pick keeps 10 and the others get 9. kube-scheduler breaks ties at random;
    this way it lands where gpuaas expects, which keeps back-to-back decisions consistent (see ClusterView.assume)."""
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
    return list(zip(names, out.tolist())), (state.names[best] if best >= 0 else None)


def explain(state: ClusterState, policy: Policy, pod: PodDemand, node: str,
            candidates: list[str] | None = None) -> dict:
    """Why `node` was rejected, or how it scored against the other candidates (all nodes when not given)."""
    names = candidates if candidates is not None else list(state.names)
    if node not in names:
        names = names + [node]
    verdict = filter_nodes(state, pod, names)
    out: dict = {"node": node, "pod": pod.name}
    if node in verdict.unresolvable:
        out.update(fits=False, resolvable=False, reason=verdict.unresolvable[node])
    elif node in verdict.failed:
        out.update(fits=False, resolvable=True, reason=verdict.failed[node])
    else:
        scores = dict(prioritize(state, policy, pod, verdict.feasible)[0])
        rank = sorted(scores.values(), reverse=True).index(scores[node]) + 1
        raw = policy.score(state, pod, feasible(state, pod))
        out.update(fits=True, score=scores[node], raw_score=float(raw[state.index[node]]), policy=policy.name,
                   rank=rank, candidates=len(verdict.feasible), best_score=max(scores.values()))
    return out

"""The place-one-pod loop, once: Filter (`feasible`, narrowed by the caller's node constraints) -> Score (the policy)
-> select (highest score, ties to a fixed node order) -> devices (the policy's choice on that node) -> place -> observe.

The packing simulator, the planner's greedy paths, the node scaler's what-if and the benchmarks place pods through a
`Placer`; the extender's prioritize (`scoring.verdicts.prioritize`, which also needs every node's score) applies the
same `feasible`, policy score and `select_node` over the same node order, and tests/test_agreement.py checks that both
pick the same node. Pure: it changes only the state it is given.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from scoring.fit import feasible
from scoring.model import ClusterState, PodDemand
from scoring.policies import Policy, select_node


@dataclass(frozen=True)
class Choice:
    """Where a pod goes: a model row and the GPU indices on it (() for a pod without GPUs)."""

    node: int
    devices: tuple[int, ...]


def choose_node(state: ClusterState, policy: Policy, pod: PodDemand, tie_rank: np.ndarray,
                allowed: np.ndarray | None = None) -> int:
    """The row the policy picks among the rows that fit the pod (and are `allowed`), -1 if none does."""
    mask = feasible(state, pod)
    if allowed is not None:
        mask &= allowed
    if not mask.any():
        return -1
    return select_node(np.asarray(policy.score(state, pod, mask), dtype=float), mask, tie_rank)


@dataclass
class _Scored:
    """One pod shape's feasibility and scores on every row, as of the Placer's `seen`-th change."""

    mask: np.ndarray
    scores: np.ndarray
    seen: int


class Placer:
    """Places pods one at a time on `state` with `policy`, keeping the policy's caches in step. `tie_rank`: the node
    order ties go to (default: model rows in order, as the extender breaks them).

    `incremental`: with a policy whose scores are row by row (`Policy.rowwise_scores`), keep each pod shape's
    feasibility and scores and, for the next pod of that shape, judge and score again only the rows this Placer has
    changed since, the same numbers as judging every row again (a plan places thousands of pods of a few shapes on
    a thousand nodes, one row changed per pod). Any change to the state it did not make itself (its version moved)
    drops what it kept."""

    def __init__(self, state: ClusterState, policy: Policy, tie_rank: np.ndarray | None = None, *,
                 incremental: bool = False):
        self.state = state
        self.policy = policy
        self.tie_rank = tie_rank if tie_rank is not None else np.arange(len(state))
        self.incremental = incremental and policy.rowwise_scores
        self._scored: dict[PodDemand, _Scored] = {}  # by shape: the demand without its pod's name
        self._changed: list[int] = []  # rows this Placer changed, in order
        self._version = state.version  # the state's version after this Placer's last change

    def choose(self, pod: PodDemand, allowed: np.ndarray | None = None) -> Choice | None:
        """Where the pod would go now, without placing it; None if it fits nowhere."""
        if self.incremental and allowed is None:
            node = self._choose_incrementally(pod)
        else:
            node = choose_node(self.state, self.policy, pod, self.tie_rank, allowed)
        if node < 0:
            return None
        return Choice(node, self.policy.devices(self.state, pod, node) if pod.gpus else ())

    def _choose_incrementally(self, pod: PodDemand) -> int:
        state = self.state
        if state.version != self._version or len(self.tie_rank) != len(state):
            self._scored, self._changed, self._version = {}, [], state.version
        shape = replace(pod, name="") if pod.name else pod
        kept = self._scored.get(shape)
        if kept is None:
            mask = feasible(state, pod)
            scores = np.zeros(len(state))
            if mask.any():
                scores = np.asarray(self.policy.score(state, pod, mask), dtype=float)
            kept = self._scored[shape] = _Scored(mask, scores, len(self._changed))
        elif kept.seen < len(self._changed):
            rows = np.unique(np.asarray(self._changed[kept.seen:], dtype=np.int64))
            fits = feasible(state, pod, rows)
            kept.mask[rows] = fits
            kept.scores[rows] = 0.0
            if fits.any():
                only = np.zeros(len(state), dtype=bool)
                only[rows[fits]] = True
                kept.scores[rows[fits]] = np.asarray(self.policy.score(state, pod, only), dtype=float)[rows[fits]]
            kept.seen = len(self._changed)
        if not kept.mask.any():
            return -1
        return select_node(kept.scores, kept.mask, self.tie_rank)

    def commit(self, pod: PodDemand, choice: Choice) -> None:
        """Place the pod where `choose` said, and tell the policy that node changed."""
        self.state.place(choice.node, pod, choice.devices)
        self.policy.observe(choice.node)
        if self.incremental:
            if self.state.version != self._version + 1:  # changed by someone else since: what was kept is stale
                self._scored, self._changed = {}, []
            else:
                self._changed.append(choice.node)
            self._version = self.state.version

    def place(self, pod: PodDemand, allowed: np.ndarray | None = None) -> Choice | None:
        choice = self.choose(pod, allowed)
        if choice is not None:
            self.commit(pod, choice)
        return choice

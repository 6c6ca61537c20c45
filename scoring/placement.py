"""The place-one-pod loop, once: Filter (`feasible`, narrowed by the caller's node constraints) -> Score (the policy)
-> select (highest score, ties to a fixed node order) -> devices (the policy's choice on that node) -> place -> observe.

The packing simulator, the planner's greedy paths, the node scaler's what-if and the benchmarks place pods through a
`Placer`; the extender's prioritize (`scoring.verdicts.prioritize`, which also needs every node's score) applies the
same `feasible`, policy score and `select_node` over the same node order, and tests/test_agreement.py checks that both
pick the same node. Pure: it changes only the state it is given.
"""
from __future__ import annotations

from dataclasses import dataclass

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


class Placer:
    """Places pods one at a time on `state` with `policy`, keeping the policy's caches in step. `tie_rank`: the node
    order ties go to (default: model rows in order, as the extender breaks them)."""

    def __init__(self, state: ClusterState, policy: Policy, tie_rank: np.ndarray | None = None):
        self.state = state
        self.policy = policy
        self.tie_rank = tie_rank if tie_rank is not None else np.arange(len(state))

    def choose(self, pod: PodDemand, allowed: np.ndarray | None = None) -> Choice | None:
        """Where the pod would go now, without placing it; None if it fits nowhere."""
        node = choose_node(self.state, self.policy, pod, self.tie_rank, allowed)
        if node < 0:
            return None
        return Choice(node, self.policy.devices(self.state, pod, node) if pod.gpus else ())

    def commit(self, pod: PodDemand, choice: Choice) -> None:
        """Place the pod where `choose` said, and tell the policy that node changed."""
        self.state.place(choice.node, pod, choice.devices)
        self.policy.observe(choice.node)

    def place(self, pod: PodDemand, allowed: np.ndarray | None = None) -> Choice | None:
        choice = self.choose(pod, allowed)
        if choice is not None:
            self.commit(pod, choice)
        return choice

"""Draining a node, one reconcile at a time, with the state kept on the node so that any replica can carry it on.

Start: one patch, conditional on the node's resourceVersion, sets the annotation `gpuaas.io/drain` (a DrainRecord: id,
reason, start, deadline), the taint `gpuaas.io/draining:NoSchedule` and `spec.unschedulable` (cordon). Nothing else
about a drain lives in memory: a controller that restarts (or a new leader) reads the annotation and goes on.

Each reconcile, `drain_step` (pure) picks the next action from the node's pods:
- pods that must move and are not terminating yet: evict them through the Eviction API, so the apiserver enforces
  every PodDisruptionBudget (a 429 is retried on a later reconcile, `eviction_retry_s` apart), with each pod's
  terminationGracePeriodSeconds capped at `max_graceful_termination_s`;
- pods still terminating: wait;
- nothing left that must move: delete the node, after the executor has listed the node's pods from the apiserver once
  more (not from the cache) and found none that must move;
- past the deadline with pods still there, or a pod that must not be disrupted arrived (a pod bound in the instant
  before the cordon): roll back (remove the annotation and the taint, uncordon).

A drain therefore ends in exactly one of two ways: the node is deleted, or the node is schedulable again without the
annotation.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scoring.constraints import DRAIN_TAINT

from .config import ScaleInConfig
from .scalein import eviction_blocker, must_move
from .snapshot import DRAIN_ANNOTATION, DrainRecord, NodeInfo, PdbInfo, PodInfo


@dataclass(frozen=True)
class Evict:
    node: str
    pods: tuple[PodInfo, ...]


@dataclass(frozen=True)
class DeleteNode:
    node: str
    group: str


@dataclass(frozen=True)
class Rollback:
    node: str
    why: str


@dataclass(frozen=True)
class Wait:
    node: str
    why: str


DrainAction = Evict | DeleteNode | Rollback | Wait


def drain_step(node: NodeInfo, pods: Sequence[PodInfo], pdbs: Sequence[PdbInfo], now: float,
               config: ScaleInConfig) -> DrainAction:
    assert node.drain is not None
    movers = must_move(pods)
    if not movers:
        return DeleteNode(node.name, node.group)
    if now > node.drain.deadline:
        return Rollback(node.name, f"{len(movers)} pods still on the node after the drain deadline "
                                   f"({config.max_drain_s:.0f}s)" if node.drain.deadline else node.drain.reason)
    for p in movers:
        blocker = eviction_blocker(p, pdbs, check_budget=False)
        if blocker and not p.terminating:
            return Rollback(node.name, blocker)
    to_evict = tuple(p for p in movers if not p.terminating)
    if to_evict:
        return Evict(node.name, to_evict)
    return Wait(node.name, f"{len(movers)} pods terminating")


def start_patch(record: DrainRecord, taints: list[dict], resource_version: str) -> dict:
    """The cordon: annotation, taint and unschedulable in one patch that fails if the node changed meanwhile."""
    taints = [t for t in taints if t.get("key") != DRAIN_TAINT] + [{"key": DRAIN_TAINT, "value": record.id,
                                                                    "effect": "NoSchedule"}]
    return {"metadata": {"annotations": {DRAIN_ANNOTATION: record.to_json()}, "resourceVersion": resource_version},
            "spec": {"unschedulable": True, "taints": taints}}


def rollback_patch(taints: list[dict], resource_version: str) -> dict:
    return {"metadata": {"annotations": {DRAIN_ANNOTATION: None}, "resourceVersion": resource_version},
            "spec": {"unschedulable": None, "taints": [t for t in taints if t.get("key") != DRAIN_TAINT] or None}}


def eviction_body(pod: PodInfo, config: ScaleInConfig) -> dict:
    grace = min(pod.grace_s, config.max_graceful_termination_s)
    return {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
            "deleteOptions": {"gracePeriodSeconds": grace, "preconditions": {"uid": pod.uid} if pod.uid else None}}

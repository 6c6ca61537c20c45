"""Where a pod may go by the node's labels and taints: nodeSelector, required node affinity (matchExpressions) and
taints/tolerations, as kube-scheduler's NodeAffinity and TaintToleration filters judge them. The scoring model knows
GPUs, CPU and memory only; the autoscaler's what-if adds these so that it never plans a pod onto a node (or a node
group) the scheduler would refuse it. Pure.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Expr = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True)
class Placement:
    """A pod's node constraints."""

    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[tuple[Expr, ...], ...] = ()  # OR of terms, AND within a term; () = no required affinity
    tolerations: tuple[tuple[str, str, str, str], ...] = ()  # (key, operator, value, effect)

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> "Placement":
        spec = pod.get("spec") or {}
        terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
                  .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or ())
        affinity = tuple(tuple((e["key"], e["operator"], tuple(e.get("values") or ()))
                               for e in t.get("matchExpressions") or ()) for t in terms)
        tols = tuple((t.get("key", ""), t.get("operator", "Equal"), t.get("value", ""), t.get("effect", ""))
                     for t in spec.get("tolerations") or ())
        return cls(tuple(sorted((spec.get("nodeSelector") or {}).items())), affinity, tols)


Taint = tuple[str, str, str]  # (key, value, effect)

# Taints that say "not yet" or "going away", which the autoscaler judges itself (booting, cordoned, draining nodes are
# no targets anyway, and a booting node is judged by its group's template): the pod's own taint tolerance is about
# the node's lasting taints.
IGNORED_TAINTS = ("node.kubernetes.io/unschedulable", "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
                  "node.cloudprovider.kubernetes.io/uninitialized", "gpuaas.io/draining")


def _expr_ok(expr: Expr, labels: Mapping[str, str]) -> bool:
    key, op, values = expr
    have = labels.get(key)
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and have is not None and values:
        try:
            return int(have) > int(values[0]) if op == "Gt" else int(have) < int(values[0])
        except ValueError:
            return False
    return False


def _tolerated(taint: Taint, tolerations: Sequence[tuple[str, str, str, str]]) -> bool:
    key, value, effect = taint
    for t_key, op, t_value, t_effect in tolerations:
        if t_effect and t_effect != effect:
            continue
        if op == "Exists" and (not t_key or t_key == key):
            return True
        if op != "Exists" and t_key == key and t_value == value:
            return True
    return False


def allows(p: Placement, labels: Mapping[str, str], taints: Sequence[Taint]) -> bool:
    """The scheduler's NodeAffinity + TaintToleration filters (NoSchedule and NoExecute taints)."""
    if any(labels.get(k) != v for k, v in p.node_selector):
        return False
    if p.affinity and not any(all(_expr_ok(e, labels) for e in term) for term in p.affinity):
        return False
    return all(_tolerated(t, p.tolerations) for t in taints
               if t[2] in ("NoSchedule", "NoExecute") and t[0] not in IGNORED_TAINTS)


def node_taints(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    return tuple((t.get("key", ""), t.get("value", ""), t.get("effect", ""))
                 for t in (node.get("spec") or {}).get("taints") or ())

"""Where a pod may go by the node's labels and taints: nodeSelector, required node affinity (matchExpressions and
matchFields on metadata.name) and taints/tolerations, as kube-scheduler's NodeAffinity and TaintToleration filters
judge them. The scoring model knows GPUs, CPU and memory only; the node scaler's what-if adds these so that it never
plans a pod onto a node (or a node group) the scheduler would refuse it, and the extender's bind refuses what the
scheduler's filters would have refused (`bind_refusal`). Also what kube-scheduler's own score plugins would weigh
between nodes for a pod (`score_preference`, `pod_terms`, `prefers_against`): where they weigh nothing, the extender
decides at filter. Pure.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scoring.kubeobjects import _list, _map

Expr = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True)
class NodeConstraints:
    """A pod's node constraints."""

    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[tuple[Expr, ...], ...] = ()  # OR of terms, AND within a term; () = no required affinity
    tolerations: tuple[tuple[str, str, str, str], ...] = ()  # (key, operator, value, effect)

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> NodeConstraints:
        spec = pod.get("spec") or {}
        terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
                  .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or ())
        # matchFields (only metadata.name exists) become expressions on a key no label can have (labels need a name).
        affinity = tuple(_expressions(t.get("matchExpressions")) + _expressions(t.get("matchFields"), FIELD_PREFIX)
                         for t in terms)
        tols = tuple((t.get("key", ""), t.get("operator", "Equal"), t.get("value", ""), t.get("effect", ""))
                     for t in _objects(spec.get("tolerations"), "spec.tolerations"))
        return cls(tuple(sorted((spec.get("nodeSelector") or {}).items())), affinity, tols)


def _expressions(items: Sequence[Mapping[str, Any]] | None, prefix: str = "") -> tuple[Expr, ...]:
    """Selector requirements (matchExpressions, matchFields) as (key, operator, values), keys after `prefix`."""
    return tuple((prefix + e["key"], e["operator"], tuple(e.get("values") or ())) for e in items or ())


Taint = tuple[str, str, str]  # (key, value, effect)
HOSTNAME_LABEL = "kubernetes.io/hostname"  # what a nodeSelector that pins a pod to one node names
FIELD_PREFIX = "/"  # a matchFields key, among the labels: "/metadata.name"

# Taints that say "not yet" or "going away", which the autoscaler judges itself (booting, cordoned, draining nodes are
# no targets anyway, and a booting node is judged by its group's template): the pod's own taint tolerance is about
# the node's lasting taints.
DRAIN_TAINT = "gpuaas.io/draining"  # the node scaler's taint on a node it drains
IGNORED_TAINTS = ("node.kubernetes.io/unschedulable", "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
                  "node.cloudprovider.kubernetes.io/uninitialized", DRAIN_TAINT)


def matches(match_labels: Mapping[str, str], expressions: Sequence[Expr], labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions, ANDed) against labels: the one matcher, for a PDB's pod
    selector as for a node selector term."""
    return (all(labels.get(k) == v for k, v in match_labels.items())
            and all(_expr_ok(e, labels) for e in expressions))


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


def allows(p: NodeConstraints, labels: Mapping[str, str], taints: Sequence[Taint], *,
           ignored_taints: Sequence[str] = IGNORED_TAINTS, node_name: str | None = None) -> bool:
    """The scheduler's NodeAffinity + TaintToleration filters (NoSchedule and NoExecute taints). `node_name`: for
    matchFields on metadata.name (a node group's template has none: such terms then fail)."""
    return refusal(p, labels, taints, ignored_taints=ignored_taints, node_name=node_name) is None


def refusal(p: NodeConstraints, labels: Mapping[str, str], taints: Sequence[Taint], *,
            ignored_taints: Sequence[str] = IGNORED_TAINTS, node_name: str | None = None) -> str | None:
    """Why the scheduler's NodeAffinity or TaintToleration filter refuses the node, in its own words; None if not."""
    if not matches(dict(p.node_selector), (), labels):
        return "node(s) didn't match Pod's node affinity/selector"
    if p.affinity:
        fields = {**labels, FIELD_PREFIX + "metadata.name": node_name} if node_name is not None else labels
        if not any(matches({}, term, fields) for term in p.affinity):
            return "node(s) didn't match Pod's node affinity/selector"
    for t in taints:
        if t[2] in ("NoSchedule", "NoExecute") and t[0] not in ignored_taints and not _tolerated(t, p.tolerations):
            return f"node(s) had untolerated taint {{{t[0]}: {t[1]}}}"
    return None


DEFAULT_SCHEDULER = "default-scheduler"  # what the apiserver puts into a pod that names none


def bind_refusal(pod: Mapping[str, Any], node: Mapping[str, Any] | None, scheduler_names: Sequence[str]) -> str | None:
    """Why a binding of `pod` to `node` must not be made, or None: the pod belongs to another scheduler, or the
    scheduler's NodeAffinity/TaintToleration filters would refuse the node (every NoSchedule/NoExecute taint
    counts here, as in the scheduler's filter: a binding is judged on the node as it is). `node` None: only the
    scheduler is checked."""
    spec = pod.get("spec") or {}
    scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULER
    if scheduler not in scheduler_names:
        return f"the pod's schedulerName {scheduler} is not one this extender serves ({', '.join(scheduler_names)})"
    if node is None:
        return None  # the caller says the node is unknown, in its own way
    meta = node.get("metadata") or {}
    return refusal(NodeConstraints.of(pod), meta.get("labels") or {}, node_taints(node), ignored_taints=(),
                   node_name=meta.get("name"))


def node_taints(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    return tuple((t.get("key", ""), t.get("value", ""), t.get("effect", ""))
                 for t in (node.get("spec") or {}).get("taints") or ())


# ---- what kube-scheduler's own score plugins weigh ---------------------------------------------------------------
# An extender's filter that leaves one node feasible is the decision: kube-scheduler then runs no score plugin and no
# prioritize (schedule_one.go, "When only one node after predicate, just use it"). These say when its scores, as
# gpuaas's profile keeps them (NodeResourcesFit and BalancedAllocation scoring are off), could rank the candidates.

# Owners whose pods PodTopologySpread spreads by default when they state no constraint (system defaults, ScheduleAnyway)
DEFAULT_SPREAD_OWNERS = ("ReplicaSet", "StatefulSet", "ReplicationController")


@dataclass(frozen=True)
class PodTerm:
    """A pod (anti-)affinity term of a placed pod, as it selects other pods (InterPodAffinity scores an incoming pod
    against the terms of the pods already placed)."""

    namespaces: tuple[str, ...] | None  # None: any namespace (a namespaceSelector, not evaluated here)
    match_labels: tuple[tuple[str, str], ...]
    expressions: tuple[Expr, ...]

    def selects(self, pod: Mapping[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        if self.namespaces is not None and meta.get("namespace", "default") not in self.namespaces:
            return False
        return matches(dict(self.match_labels), self.expressions, _map(meta.get("labels"), "metadata.labels"))


def score_preference(pod: Mapping[str, Any]) -> str | None:
    """What in the pod's own spec kube-scheduler's score plugins would weigh between nodes, in words, or None:
    preferred node affinity, preferred pod (anti-)affinity, a ScheduleAnyway spread constraint or, stating none,
    the default spreading of a ReplicaSet's, StatefulSet's or ReplicationController's pods, and DRA claims
    (DynamicResources scores prioritized lists). A pod that only a Service selects is spread by default too: not
    seen here. Raises ObjectError naming a field that is not the object or list the API defines."""
    spec = _map(pod.get("spec"), "spec")
    affinity = _map(spec.get("affinity"), "spec.affinity")
    for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
        if _map(affinity.get(kind), f"spec.affinity.{kind}").get("preferredDuringSchedulingIgnoredDuringExecution"):
            return f"preferred {kind}"
    spread = _objects(spec.get("topologySpreadConstraints"), "spec.topologySpreadConstraints")
    if any(c.get("whenUnsatisfiable") == "ScheduleAnyway" for c in spread):
        return "a ScheduleAnyway topology spread constraint"
    if not spread:
        for owner in _objects(_map(pod.get("metadata"), "metadata").get("ownerReferences"),
                              "metadata.ownerReferences"):
            if owner.get("kind") in DEFAULT_SPREAD_OWNERS:
                return f"default topology spreading (owned by a {owner['kind']})"
    if spec.get("resourceClaims"):
        return "DRA claims"
    return None


def _objects(value: Any, what: str) -> list[Mapping[str, Any]]:
    items = _list(value, what)
    for i, item in enumerate(items):
        _map(item, f"{what}[{i}]")
    return items


def pod_terms(pod: Mapping[str, Any]) -> tuple[PodTerm, ...]:
    """The terms of a placed pod that kube-scheduler's InterPodAffinity scores other pods by: its required and
    preferred pod affinity, its preferred anti-affinity (required anti-affinity only filters)."""
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    raw: list[Mapping[str, Any]] = []
    for kind, preferred_only in (("podAffinity", False), ("podAntiAffinity", True)):
        rules = affinity.get(kind) or {}
        if not preferred_only:
            raw.extend(rules.get("requiredDuringSchedulingIgnoredDuringExecution") or ())
        raw.extend(w.get("podAffinityTerm") or {} for w in rules.get("preferredDuringSchedulingIgnoredDuringExecution")
                   or ())
    own = (pod.get("metadata") or {}).get("namespace", "default")
    terms = []
    for t in raw:
        selector = t.get("labelSelector")
        if selector is None:  # selects no pod
            continue
        namespaces = None if t.get("namespaceSelector") is not None else tuple(t.get("namespaces") or (own,))
        terms.append(PodTerm(namespaces, tuple(sorted((selector.get("matchLabels") or {}).items())),
                             _expressions(selector.get("matchExpressions"))))
    return tuple(terms)


def prefers_against(tolerations: Sequence[tuple[str, str, str, str]], taints: Sequence[Taint]) -> bool:
    """Whether a node's taints include a PreferNoSchedule one the pod does not tolerate (TaintToleration scores
    such nodes lower)."""
    return any(t[2] == "PreferNoSchedule" and not _tolerated(t, tolerations) for t in taints)

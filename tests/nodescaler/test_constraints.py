"""nodeSelector, required node affinity and taints, as kube-scheduler filters them."""
from __future__ import annotations

import pytest

from nodescaler.scaleout import plan_scale_out
from nodescaler.snapshot import build_snapshot
from scoring.constraints import NodeConstraints, allows

from .builders import A100X8, T0, config, pending

LABELS = {"gpuaas.io/pool": "a", "zone": "z1", "gpus": "8"}


def constraints(**spec) -> NodeConstraints:
    return NodeConstraints.of({"spec": spec})


def aff(*exprs):
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": k, "operator": op, "values": v} for k, op, v in exprs]}]}}}


@pytest.mark.parametrize("spec, taints, ok", [
    ({}, (), True),
    ({"nodeSelector": {"zone": "z1"}}, (), True),
    ({"nodeSelector": {"zone": "z2"}}, (), False),
    ({"affinity": aff(("zone", "In", ["z1", "z3"]))}, (), True),
    ({"affinity": aff(("zone", "NotIn", ["z1"]))}, (), False),
    ({"affinity": aff(("gpus", "Gt", ["4"]), ("team", "DoesNotExist", []))}, (), True),
    ({"affinity": aff(("gpus", "Lt", ["4"]))}, (), False),
    ({}, (("dedicated", "ml", "NoSchedule"),), False),
    ({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}]}, (("dedicated", "ml", "NoSchedule"),),
     True),
    ({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x"}]}, (("dedicated", "ml", "NoSchedule"),),
     False),
    ({"tolerations": [{"operator": "Exists"}]}, (("anything", "", "NoExecute"),), True),
    ({}, (("soft", "", "PreferNoSchedule"),), True),  # only NoSchedule and NoExecute filter
    ({}, (("gpuaas.io/draining", "d1", "NoSchedule"),), True),  # cordons are handled apart
])
def test_allows(spec, taints, ok):
    assert allows(constraints(**spec), LABELS, taints) is ok


def test_a_pod_selecting_a_group_by_label_grows_that_group_even_if_another_is_cheaper():
    cfg = config([
        {"name": "cheap", "template": A100X8, "max_size": 10, "cost_per_hour": 10},
        {"name": "team", "template": {**A100X8, "labels": {"team": "ml"}}, "max_size": 10, "cost_per_hour": 30},
    ])
    p = pending("p", gpus=8)
    p["spec"]["nodeSelector"] = {"team": "ml"}
    plan = plan_scale_out(build_snapshot([], [p, pending("q", gpus=8)], [], T0), cfg)
    assert sorted((g.group, g.count) for g in plan.grows) == [("cheap", 1), ("team", 1)]


def test_a_tainted_group_is_not_grown_for_pods_that_do_not_tolerate_it():
    cfg = config([{"name": "tainted", "template": {**A100X8, "taints": [{"key": "x", "value": "y",
                                                                        "effect": "NoSchedule"}]},
                   "max_size": 10, "cost_per_hour": 10}])
    plan = plan_scale_out(build_snapshot([], [pending("p", gpus=8)], [], T0), cfg)
    assert plan.grows == [] and "labels and taints" in plan.unplaceable["default/p"]

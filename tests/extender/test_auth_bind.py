"""Bind does only what kube-scheduler's own filters would allow: a pod of another scheduler, or a node its
nodeSelector, required node affinity or tolerations rule out, is refused, and nothing reaches the apiserver. No reply
names a pod's real uid."""
from __future__ import annotations

import asyncio
import copy

import pytest

from extender.config import ExtenderConfig
from extender.server import SERVICE, snapshot_app
from extender.service import BadRequest
from extender.wire import ExtenderBindingArgs
from scoring.constraints import bind_refusal

from .fixtures import nodes, pending
from .test_view import RecordingBinder

NODE = "a100-0000"


def node_with(labels=None, taints=None):
    node = copy.deepcopy(next(n for n in nodes() if n["metadata"]["name"] == NODE))
    node["metadata"]["labels"].update(labels or {})
    if taints:
        node["spec"]["taints"] = taints
    return node


def pod_with(**spec):
    pod = pending("p", gpus=1)
    pod["spec"].update(spec)
    return pod


def affinity(*terms):
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NAMES = ("default-scheduler", "gpuaas-scheduler")

# (pod spec, node labels, node taints, refused?) -- each case the scheduler's NodeAffinity/TaintToleration verdict.
CASES = {
    "plain pod": ({}, {}, None, None),
    "no schedulerName is default-scheduler": ({"schedulerName": ""}, {}, None, None),
    "the second scheduler's pod": ({"schedulerName": "gpuaas-scheduler"}, {}, None, None),
    "another scheduler's pod": ({"schedulerName": "volcano"}, {}, None, "schedulerName volcano is not one"),
    "nodeSelector matches": ({"nodeSelector": {"zone": "a"}}, {"zone": "a"}, None, None),
    "nodeSelector does not match": ({"nodeSelector": {"zone": "b"}}, {"zone": "a"}, None, "affinity/selector"),
    "affinity matches a term": ({"affinity": affinity({"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["x"]}]}, {"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]})}, {"zone": "a"}, None, None),
    "affinity matches no term": ({"affinity": affinity({"matchExpressions": [
        {"key": "zone", "operator": "NotIn", "values": ["a"]}]})}, {"zone": "a"}, None, "affinity/selector"),
    "matchFields names another node": ({"affinity": affinity({"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["a100-0001"]}]})}, {}, None, "affinity/selector"),
    "matchFields names this node": ({"affinity": affinity({"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [NODE]}]})}, {}, None, None),
    "untolerated taint": ({}, {}, [GPU_TAINT], "untolerated taint {nvidia.com/gpu: present}"),
    "tolerated taint": ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}, {}, [GPU_TAINT], None),
    "PreferNoSchedule does not refuse": ({}, {}, [{**GPU_TAINT, "effect": "PreferNoSchedule"}], None),
    "not-ready counts at bind": ({}, {}, [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}],
                                "untolerated taint"),
}


@pytest.mark.parametrize("spec, labels, taints, refused", CASES.values(), ids=CASES.keys())
def test_bind_refusal_judges_as_the_schedulers_filters(spec, labels, taints, refused):
    reason = bind_refusal(pod_with(**spec), node_with(labels, taints), NAMES)
    assert (reason is None) if refused is None else (refused in reason)


def bind_through_service(pod, node, names=NAMES, uid="uid-p"):
    items = [n for n in nodes() if n["metadata"]["name"] != NODE] + [node, pod]
    app = snapshot_app(ExtenderConfig(scheduler_names=list(names)), items)
    service = app[SERVICE]
    service.binder = binder = RecordingBinder()
    result = asyncio.run(service.bind(ExtenderBindingArgs(PodName="p", PodNamespace="ml", PodUID=uid, Node=NODE)))
    return result.Error, binder.calls


def test_bind_refuses_another_schedulers_pod_and_binds_nothing():
    error, calls = bind_through_service(pod_with(schedulerName="volcano"), node_with())
    assert "may not be bound to a100-0000 by gpuaas" in error and "volcano" in error
    assert calls == []
    error, calls = bind_through_service(pod_with(schedulerName="gpuaas-scheduler"), node_with(),
                                        names=("gpuaas-scheduler",))
    assert error == "" and len(calls) == 1


def test_bind_refuses_a_node_the_pods_selector_or_taints_rule_out():
    error, calls = bind_through_service(pod_with(nodeSelector={"zone": "b"}), node_with({"zone": "a"}))
    assert "didn't match Pod's node affinity/selector" in error and calls == []
    error, calls = bind_through_service(pod_with(), node_with(taints=[GPU_TAINT]))
    assert "untolerated taint" in error and calls == []


def test_a_wrong_uid_is_refused_without_disclosing_the_real_one():
    with pytest.raises(BadRequest) as err:
        bind_through_service(pod_with(), node_with(), uid="guess")
    assert err.value.status == 409 and "uid-p" not in str(err.value)

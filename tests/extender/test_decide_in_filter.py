"""Filter answers with gpuaas's pick alone where kube-scheduler's own scores would not change it (decide_in_filter),
and with every feasible node where they could."""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender.config import ExtenderConfig
from extender.server import snapshot_app

from .fixtures import bound, names, nodes, pending


def answers(pod, items=None, **config):
    """filter's reply with the setting on, then filter's and prioritize's replies with it off, on the same cluster."""
    items = nodes() if items is None else items

    async def go():
        out = []
        for decide in (True, False):
            async with TestClient(TestServer(snapshot_app(ExtenderConfig(decide_in_filter=decide, **config),
                                                          items))) as c:
                for verb in ("/filter", "/prioritize") if not decide else ("/filter",):
                    resp = await c.post(verb, data=json.dumps({"Pod": pod, "NodeNames": names()}),
                                        headers={"Content-Type": "application/json"})
                    assert resp.status == 200, await resp.text()
                    out.append(await resp.json())
        return out

    return asyncio.run(go())


def top(priorities):
    best = max(p["Score"] for p in priorities)
    (pick,) = [p["Host"] for p in priorities if p["Score"] == best]  # gpuaas gives its pick alone the top score
    return pick


def test_a_plain_gpu_pod_gets_the_node_prioritize_would_rank_first_and_nothing_else():
    items = nodes() + [bound(pending("busy", gpus=6), "a100-0000", "0,1,2,3,4,5")]
    decided, full, priorities = answers(pending("p", gpus=2), items)
    assert len(full["NodeNames"]) > 1
    assert decided["NodeNames"] == [top(priorities)]
    assert decided["FailedNodes"] == {} and decided["FailedAndUnresolvableNodes"] == {} and decided["Error"] == ""


def test_a_pod_that_fits_nowhere_keeps_every_reason():
    decided, full, _ = answers(pending("huge", gpus=16))
    assert decided == full and decided["NodeNames"] == []
    assert decided["FailedAndUnresolvableNodes"]["cpu-0000"] == "node has no GPUs"


def owned(pod, kind):
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u",
                                           "controller": True}]
    return pod


def preferring(pod, affinity):
    pod["spec"]["affinity"] = affinity
    return pod


PREFERRED_NODE = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 10, "preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100"]}]}}]}}
ANTI = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                       "labelSelector": {"matchLabels": {"app": "trainer"}}}}]}}


@pytest.mark.parametrize("pod", [
    preferring(pending("near", gpus=1), PREFERRED_NODE),
    preferring(pending("apart", gpus=1), ANTI),
    owned(pending("replica", gpus=1), "ReplicaSet"),
    owned(pending("member", gpus=1), "StatefulSet"),
    {**pending("soft", gpus=1), "spec": {**pending("soft", gpus=1)["spec"], "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": {"app": "x"}}}]}},
], ids=["preferred-node-affinity", "preferred-anti-affinity", "replicaset", "statefulset", "schedule-anyway"])
def test_a_pod_whose_placement_kube_schedulers_scores_weigh_gets_every_feasible_node(pod):
    decided, full, _ = answers(pod)
    assert len(full["NodeNames"]) > 1 and decided == full


def test_a_job_pod_and_hard_spreading_are_decided():
    pod = owned(pending("job", gpus=1), "Job")
    pod["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                 "whenUnsatisfiable": "DoNotSchedule",
                                                 "labelSelector": {"matchLabels": {"app": "x"}}}]
    decided, _, priorities = answers(pod)
    assert decided["NodeNames"] == [top(priorities)]


def tainted(items, name, *taints):
    for n in items:
        if n["metadata"]["name"] == name:
            n["spec"]["taints"] = [{"key": k, "value": "v", "effect": e} for k, e in taints]
    return items


def test_an_untolerated_prefer_no_schedule_taint_on_a_candidate_leaves_the_choice_to_kube_scheduler():
    items = tainted(nodes(), "h100-0001", ("spot", "PreferNoSchedule"))
    decided, full, _ = answers(pending("p", gpus=1), items)
    assert decided == full and "h100-0001" in full["NodeNames"]
    tolerating = pending("q", gpus=1)
    tolerating["spec"]["tolerations"] = [{"key": "spot", "operator": "Exists"}]
    decided, _, priorities = answers(tolerating, items)
    assert decided["NodeNames"] == [top(priorities)]
    # on a node the pod cannot use anyway (no GPUs), the taint weighs nothing
    decided, _, priorities = answers(pending("p", gpus=1), tainted(nodes(), "cpu-0000", ("spot", "PreferNoSchedule")))
    assert decided["NodeNames"] == [top(priorities)]


def test_a_placed_pods_affinity_term_that_selects_the_pod_leaves_the_choice_to_kube_scheduler():
    placed = preferring(pending("other", gpus=1), ANTI)
    items = nodes() + [bound(placed, "a100-0001", "0")]
    trainer = pending("t", gpus=1)
    trainer["metadata"]["labels"] = {"app": "trainer"}
    decided, full, _ = answers(trainer, items)
    assert decided == full and len(full["NodeNames"]) > 1
    elsewhere = {**trainer, "metadata": {**trainer["metadata"], "namespace": "other-team"}}  # the term's namespace
    decided, _, priorities = answers(elsewhere, items)
    assert decided["NodeNames"] == [top(priorities)]
    decided, _, priorities = answers(pending("u", gpus=1), items)  # labels the term does not select
    assert decided["NodeNames"] == [top(priorities)]


def test_a_placed_pod_with_an_unreadable_affinity_term_is_still_placed():
    odd = preferring(pending("odd", gpus=1), {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchExpressions": [{"operator": "In"}]}, "topologyKey": "x"}]}})  # no key
    decided, full, _ = answers(pending("p", gpus=8), nodes() + [bound(odd, "a100-0000", "0")])
    assert "a100-0000" not in full["NodeNames"]  # its GPU is held: an 8-GPU pod no longer fits there
    assert decided["NodeNames"] and decided["NodeNames"][0] != "a100-0000"


@pytest.mark.parametrize("field, value, message", [
    ("topologySpreadConstraints", ["z"], "spec.topologySpreadConstraints[0]: must be an object, got str"),
    ("affinity", {"podAntiAffinity": 3}, "spec.affinity.podAntiAffinity: must be an object, got int"),
    ("tolerations", "t", "spec.tolerations: must be a list, got str"),
])
def test_a_pod_whose_preferences_cannot_be_read_gets_a_400_naming_the_field(field, value, message):
    items = tainted(nodes(), "h100-0001", ("spot", "PreferNoSchedule"))  # so that the tolerations are read
    pod = pending("p", gpus=1)
    pod["spec"][field] = value

    async def go():
        async with TestClient(TestServer(snapshot_app(ExtenderConfig(), items))) as c:
            resp = await c.post("/filter", data=json.dumps({"Pod": pod, "NodeNames": names()}),
                                headers={"Content-Type": "application/json"})
            good = await c.post("/filter", data=json.dumps({"Pod": pending("q", gpus=1), "NodeNames": names()}),
                                headers={"Content-Type": "application/json"})
            return resp.status, await resp.json(), good.status

    status, body, after = asyncio.run(go())
    assert (status, after) == (400, 200) and body["error"] == f"pod ml/p: {message}"

"""The karpenter provider: the NodeClaim it renders, what it reads back from NodeClaims (requests on their way, launch
failures), what it deletes (only its own), and the controller around it: a launch failure backs the group off and the
next group grows; a restarted controller does not ask twice for NodeClaims on their way; a request that never became
a node is withdrawn. Against in-memory NodeClaims; tests/e2e/test_nodescaler_karpenter.py runs the real Karpenter."""
from __future__ import annotations

import copy
import json

import pytest
from kubernetes.client.rest import ApiException

from gpuaas.cluster.karpenter import instance_types, node_class
from nodescaler.controller import NodeScaler
from nodescaler.karpenter import KarpenterProvider, launch_problem, render_nodeclaim
from nodescaler.provider import (
    PROVIDER_LABEL,
    GroupProviders,
    LaunchFailure,
    NodeNotFound,
    ProviderError,
    ProviderStatus,
    Requested,
)
from nodescaler.snapshot import build_snapshot
from runtime.config import ConfigError

from .builders import A100X8, T0, config, iso, pending
from .test_controller import FakeCluster

KGROUPS = [
    {"name": "cheap", "template": A100X8, "max_size": 10, "cost_per_hour": 10, "max_provision_s": 300,
     "provider": "karpenter", "karpenter": {"instance_type": "gpu-a", "node_class": {"name": "missing"}}},
    {"name": "dear", "template": A100X8, "max_size": 10, "cost_per_hour": 20, "max_provision_s": 300,
     "provider": "karpenter", "karpenter": {"instance_type": "gpu-a"}},
]


# ---- config and rendering -------------------------------------------------------------------------------------------
def test_a_karpenter_group_needs_its_instance_type_and_may_not_require_another(tmp_path):
    with pytest.raises(ValueError, match="needs a karpenter section"):
        config([{"name": "g", "template": A100X8, "max_size": 1, "cost_per_hour": 1, "provider": "karpenter"}])
    with pytest.raises(ValueError, match="needs a karpenter section"):  # the top-level provider applies too
        config([{"name": "g", "template": A100X8, "max_size": 1, "cost_per_hour": 1}], provider="karpenter")
    with pytest.raises(ValueError, match=r"karpenter\.instance_type, not a requirement"):
        config([{"name": "g", "template": A100X8, "max_size": 1, "cost_per_hour": 1, "provider": "karpenter",
                 "karpenter": {"instance_type": "x", "requirements": [
                     {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["y"]}]}}])
    from nodescaler.config import load_nodescaler_config

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"provider": "gce", "groups": KGROUPS}))
    with pytest.raises(ConfigError, match="provider"):
        load_nodescaler_config(path, environ={})
    cfg = config(KGROUPS + [{"name": "k", "template": A100X8, "max_size": 1, "cost_per_hour": 1}])
    assert [cfg.provider_of(g) for g in cfg.groups] == ["karpenter", "karpenter", "kwok"]


def test_the_nodeclaim_pins_the_instance_type_never_expires_and_carries_the_group():
    cfg = config([{**KGROUPS[1], "template": {**A100X8, "taints": [{"key": "gpu", "effect": "NoSchedule"}]},
                   "karpenter": {"instance_type": "p4de.24xlarge", "termination_grace_period_s": 600,
                                 "node_class": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                                 "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In",
                                                   "values": ["on-demand"]}]}}])
    claim = render_nodeclaim(cfg.groups[0], "dear-abc", T0)
    meta, spec = claim["metadata"], claim["spec"]
    assert claim["apiVersion"] == "karpenter.sh/v1" and claim["kind"] == "NodeClaim" and meta["name"] == "dear-abc"
    assert spec["requirements"] == [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p4de.24xlarge"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]
    assert spec["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"}
    assert spec["expireAfter"] == "Never" and spec["terminationGracePeriod"] == "600s"
    assert spec["resources"] == {"requests": {"nvidia.com/gpu": "8"}}
    assert spec["taints"] == [{"key": "gpu", "value": "", "effect": "NoSchedule"}]
    labels = meta["labels"]
    assert labels["gpuaas.io/pool"] == "dear" and labels[PROVIDER_LABEL] == "gpuaas-nodescaler"
    assert labels["nvidia.com/gpu.count"] == "8" and labels["gpuaas.io/nodeclaim"] == "dear-abc"
    # No NodePool label (never a disruption candidate), nothing Karpenter or the kubelet sets from the instance.
    assert not {"karpenter.sh/nodepool", "kubernetes.io/hostname", "kubernetes.io/arch"} & set(labels)
    assert meta["annotations"]["gpuaas.io/requested-at"] == f"{T0:.3f}"
    assert "gpuaas.io/gpu-topology" in meta["annotations"]


def test_instance_types_for_the_kwok_cloud_provider_are_the_templates_with_karpenters_overhead_added_back():
    cfg = config(KGROUPS + [{"name": "mig", "template": {**A100X8, "gpu": {**A100X8["gpu"], "mig": "all-1g.10gb"}},
                             "max_size": 1, "cost_per_hour": 5, "provider": "karpenter",
                             "karpenter": {"instance_type": "gpu-mig"}}])
    types = {t["name"]: t for t in instance_types(cfg.groups)}
    assert set(types) == {"gpu-a", "gpu-mig"}  # two groups of one instance type: once
    a = types["gpu-a"]
    assert a["resources"]["nvidia.com/gpu"] == "8" and a["resources"]["cpu"] == "128100m"
    assert a["resources"]["memory"] == str(2**40 + 10 * 2**20)
    assert a["offerings"][0]["Price"] == 10 and a["offerings"][0]["Available"] is True
    assert types["gpu-mig"]["resources"]["nvidia.com/mig-1g.10gb"] == "56"
    assert node_class("slow", 2.5)["spec"] == {"nodeRegistrationDelay": "3s"}
    assert node_class("fast")["spec"] == {}
    bad = config([KGROUPS[0], {**KGROUPS[1], "template": {**A100X8, "cpu": "64"}}])
    with pytest.raises(ValueError, match="different resources"):
        instance_types(bad.groups)


@pytest.mark.parametrize("conditions, problem", [
    ([], None),
    ([{"type": "Launched", "status": "Unknown", "reason": "AwaitingReconciliation"}], None),
    ([{"type": "Launched", "status": "True", "reason": "Launched"}], None),
    ([{"type": "Launched", "status": "Unknown", "reason": "LaunchFailed", "message": "instance type not found"}],
     "Launched Unknown: LaunchFailed: instance type not found"),
    ([{"type": "Launched", "status": "False", "reason": "NodeClassNotReady"}], "Launched False: NodeClassNotReady"),
])
def test_launch_problems_are_read_from_the_launched_condition(conditions, problem):
    assert launch_problem({"status": {"conditions": conditions}}) == problem


# ---- the provider against in-memory NodeClaims -----------------------------------------------------------------------
class Resp:
    def __init__(self, obj):
        self.data = json.dumps(obj).encode()


class FakeApi:
    """The few CustomObjectsApi and CoreV1Api calls the provider makes, on dicts."""

    def __init__(self):
        self.claims: dict[str, dict] = {}
        self.nodes: dict[str, dict] = {}
        self.deleted: list[str] = []
        self.uid = 0

    def create_cluster_custom_object(self, group, version, plural, body, **_):
        assert (group, version, plural) == ("karpenter.sh", "v1", "nodeclaims")
        self.uid += 1
        body = copy.deepcopy(body)
        body["metadata"].update(uid=f"u{self.uid}", creationTimestamp=iso(T0))
        self.claims[body["metadata"]["name"]] = body
        return Resp(body)

    def list_cluster_custom_object(self, group, version, plural, label_selector="", **_):
        key, _, value = label_selector.partition("=")
        return Resp({"items": [c for c in self.claims.values() if c["metadata"]["labels"].get(key) == value]})

    def get_cluster_custom_object(self, group, version, plural, name, **_):
        if name not in self.claims:
            raise ApiException(status=404, reason="Not Found")
        return Resp(self.claims[name])

    def delete_cluster_custom_object(self, group, version, plural, name, body=None, **_):
        if name not in self.claims:
            raise ApiException(status=404, reason="Not Found")
        if body and body["preconditions"]["uid"] != self.claims[name]["metadata"]["uid"]:
            raise ApiException(status=409, reason="Conflict")
        self.deleted.append(name)
        self.claims[name]["metadata"]["deletionTimestamp"] = iso(T0)
        return Resp({})

    def read_node(self, name, **_):
        if name not in self.nodes:
            raise ApiException(status=404, reason="Not Found")
        return Resp(self.nodes[name])

    # what Karpenter does
    def register(self, claim: str, node: str) -> None:
        self.claims[claim].setdefault("status", {})["nodeName"] = node
        self.nodes[node] = {"metadata": {"name": node, "ownerReferences": [
            {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": claim, "uid": "x"}]}, "spec": {}}


def provider(api: FakeApi, clock=lambda: T0) -> KarpenterProvider:
    p = KarpenterProvider(None, clock=clock)
    p.custom, p.core = api, api  # type: ignore[assignment]
    return p


def test_grow_creates_nodeclaims_and_status_reads_back_those_without_a_node():
    api, cfg = FakeApi(), config(KGROUPS)
    p = provider(api)
    names = p.grow(cfg.group("dear"), 3)
    assert sorted(api.claims) == sorted(names) and all(n.startswith("dear-") for n in names)
    st = p.status(T0)
    assert sorted(r.name for r in st.in_flight) == sorted(names) and st.failures == []
    assert all(r.group == "dear" and r.requested_at == T0 for r in st.in_flight)
    api.register(names[0], "node-0")
    assert sorted(r.name for r in p.status(T0 + 1).in_flight) == sorted(names[1:])


def test_nodeclaims_that_karpenter_could_not_launch_are_failures_reported_once():
    api, cfg = FakeApi(), config(KGROUPS)
    p = provider(api)
    a, b, c, d = p.grow(cfg.group("cheap"), 4)
    p.status(T0)
    # a: Karpenter deleted it (insufficient capacity: gone at once); b: being deleted by Karpenter; c: Launched says
    # why not; d: withdrawn by gpuaas itself, not a failure.
    del api.claims[a]
    api.claims[b]["metadata"]["deletionTimestamp"] = iso(T0)
    api.claims[c]["status"] = {"conditions": [{"type": "Launched", "status": "Unknown", "reason": "LaunchFailed",
                                               "message": "offering not available"}]}
    p.cancel(cfg.group("cheap"), d)
    st = p.status(T0 + 1)
    failures = {f.name: f for f in st.failures}
    assert set(failures) == {a, b, c} and st.in_flight == []
    assert failures[c].present and "offering not available" in failures[c].reason
    assert not failures[a].present and failures[a].obj == {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                                                           "name": a}
    assert p.status(T0 + 2).failures == []  # once


def test_a_nodeclaim_karpenter_deletes_before_the_next_look_is_a_failure_too():
    api, cfg = FakeApi(), config(KGROUPS)
    p = provider(api)
    p.status(T0)
    (a,) = p.grow(cfg.group("cheap"), 1)
    del api.claims[a]  # insufficient capacity: Karpenter deleted it within a second
    assert [f.name for f in p.status(T0 + 1).failures] == [a]


def test_a_replica_that_did_not_look_for_a_while_does_not_take_what_is_gone_for_failures():
    api, cfg = FakeApi(), config(KGROUPS)
    p = provider(api)
    (a,) = p.grow(cfg.group("dear"), 1)
    p.status(T0)
    del api.claims[a]  # registered and removed while another replica led
    assert p.status(T0 + 600).failures == []


def test_delete_node_deletes_the_nodeclaim_of_the_node_and_only_gpuaas_own():
    api, cfg = FakeApi(), config(KGROUPS)
    p, g = provider(api), cfg.group("dear")
    (a,) = p.grow(g, 1)
    api.register(a, "node-a")
    p.delete_node(g, "node-a")
    assert api.deleted == [a]
    with pytest.raises(NodeNotFound):  # deleting already (Karpenter's finalizer at work)
        p.delete_node(g, "node-a")
    with pytest.raises(NodeNotFound):
        p.delete_node(g, "no-such-node")
    # A node of a Karpenter NodePool is never deleted here.
    api.claims["pool-x"] = {"metadata": {"name": "pool-x", "uid": "p", "labels": {"karpenter.sh/nodepool": "general"}}}
    api.register("pool-x", "node-x")
    with pytest.raises(ProviderError, match="NodePool general"):
        p.delete_node(g, "node-x")
    api.nodes["bare"] = {"metadata": {"name": "bare"}, "spec": {}}
    with pytest.raises(ProviderError, match="no NodeClaim"):
        p.delete_node(g, "bare")
    assert api.deleted == [a]


# ---- the controller with a provider that reads its requests back -----------------------------------------------------
class ClaimProvider:
    """A provider whose requests are objects of their own (as Karpenter's): grow records them, `status` returns them
    until they register (`nodes`) or fail (`failures` queued by the test); `cancel` withdraws."""

    def __init__(self):
        self.claims: dict[str, tuple[str, float]] = {}
        self.grow_calls: list[tuple[str, int]] = []
        self.cancelled: list[str] = []
        self.queued: list[LaunchFailure] = []
        self.n = 0

    def grow(self, group, count):
        self.grow_calls.append((group.name, count))
        names = [f"{group.name}-c{self.n + i}" for i in range(count)]
        self.n += count
        for n in names:
            self.claims[n] = (group.name, T0)
        return names

    def delete_node(self, group, name):
        raise NodeNotFound(name)

    def status(self, now):
        failed = {f.name for f in self.queued}
        st = ProviderStatus([Requested(n, g, t) for n, (g, t) in self.claims.items() if n not in failed],
                            self.queued)
        self.queued = []
        return st

    def cancel(self, group, name):
        self.cancelled.append(name)
        self.claims.pop(name, None)


def scaler_for(cluster: FakeCluster, p, cfg=None) -> NodeScaler:
    cfg = cfg or config(KGROUPS, scale_in={"enabled": False})
    return NodeScaler(cfg, cluster.snapshot, cluster, GroupProviders({"karpenter": p}, cfg.provider_of),
                      wall=lambda: T0)


def test_a_launch_failure_backs_the_group_off_withdraws_the_claim_and_the_next_group_grows():
    cluster = FakeCluster([], [pending("p", gpus=8)])
    p = ClaimProvider()
    scaler = scaler_for(cluster, p)
    scaler.run_once(T0)
    assert p.grow_calls == [("cheap", 1)]
    scaler.run_once(T0 + 1)
    assert p.grow_calls == [("cheap", 1)], "the NodeClaim on its way counts: no second grow"
    p.queued = [LaunchFailure("cheap-c0", "cheap", "Launched Unknown: LaunchFailed: no capacity",
                              {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": "cheap-c0"}, True)]
    scaler.run_once(T0 + 2)
    assert "cheap" in scaler.memory.backed_off(T0 + 2)
    assert p.cancelled == ["cheap-c0"]
    assert ("cheap-c0", "LaunchFailed") in {(n, r) for n, r, _ in cluster.events}
    scaler.run_once(T0 + 3)
    assert p.grow_calls == [("cheap", 1), ("dear", 1)]


def test_a_restarted_controller_reads_the_nodeclaims_on_their_way_and_does_not_grow_again():
    cluster = FakeCluster([], [pending(f"p{i}", gpus=8) for i in range(2)])
    p = ClaimProvider()
    scaler_for(cluster, p).run_once(T0)
    assert p.grow_calls == [("cheap", 2)]
    fresh = scaler_for(cluster, p)  # no memory
    fresh.run_once(T0 + 1)
    assert p.grow_calls == [("cheap", 2)]
    assert sorted(u.name for u in fresh.memory.requested) == ["cheap-c0", "cheap-c1"]


def test_a_nodeclaim_that_never_becomes_a_node_expires_is_withdrawn_and_backs_the_group_off():
    cluster = FakeCluster([], [pending("p", gpus=8)])
    p = ClaimProvider()
    scaler = scaler_for(cluster, p)
    scaler.run_once(T0)
    scaler.wall = lambda: T0 + 301
    scaler.run_once(T0 + 301)  # max_provision_s 300
    assert p.cancelled == ["cheap-c0"] and "cheap" in scaler.memory.backed_off(T0 + 301)


def test_a_node_owned_by_a_nodeclaim_registers_the_request_of_that_name():
    node = {"metadata": {"name": "kwok-x-1", "labels": {"gpuaas.io/pool": "dear"}, "ownerReferences": [
        {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": "dear-c0", "uid": "u"}]},
        "spec": {}, "status": {}}
    early = {"metadata": {"name": "kwok-y-2", "labels": {"gpuaas.io/pool": "dear", "gpuaas.io/nodeclaim": "dear-c1"}},
             "spec": {}, "status": {}}  # the NodeClaim's labels are on it before Karpenter registers it
    snap = build_snapshot([node, early], [], [], T0)
    assert snap.nodes["kwok-x-1"].claim == "dear-c0" and snap.nodes["kwok-y-2"].claim == "dear-c1"
    assert snap.registered("dear-c0") and snap.registered("kwok-x-1") and snap.registered("dear-c1")
    assert not snap.registered("dear-c2")


def test_a_node_karpenter_has_not_registered_yet_is_capacity_on_its_way_not_a_reason_to_grow_again():
    """The KWOK cloud provider creates the Node at once, Ready soon and with its GPUs, but with Karpenter's
    unregistered taint until Karpenter registers it: the pod cannot go there yet, and it must not be grown for twice."""
    from .builders import booting_node

    cfg = config(KGROUPS, scale_in={"enabled": False})
    node = booting_node(cfg, "dear", "kwok-dear-c0-x")
    node["metadata"]["labels"]["gpuaas.io/nodeclaim"] = "dear-c0"
    node["status"]["allocatable"]["nvidia.com/gpu"] = "8"  # Ready, GPUs there: only the taint holds pods back
    node["spec"]["taints"] = [{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]
    cluster = FakeCluster([node], [pending("p", gpus=8)])
    snap = cluster.snapshot(T0)
    assert snap.nodes["kwok-dear-c0-x"].booting and snap.registered("dear-c0")
    p = ClaimProvider()
    p.claims["dear-c0"] = ("dear", T0 - 5)
    scaler = scaler_for(cluster, p)
    report = scaler.run_once(T0)
    assert p.grow_calls == [] and report.grows == []
    assert scaler.memory.requested == []  # the request is the node now, counted once
    del node["spec"]["taints"]  # registered
    assert not cluster.snapshot(T0 + 1).nodes["kwok-dear-c0-x"].booting

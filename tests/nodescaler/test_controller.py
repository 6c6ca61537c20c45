"""NodeScaler.run_once against an in-memory cluster and the fake provider: what it writes, what it re-validates,
backoff, lease loss, and a restart in the middle of a drain."""
from __future__ import annotations

import copy
from typing import Any

from nodescaler.config import NodeScalerConfig
from nodescaler.controller import NodeScaler
from nodescaler.provider import FakeProvider, ProviderError
from nodescaler.snapshot import DRAIN_ANNOTATION, build_snapshot

from .builders import A100X8, T0, booting_node, config, iso, mig_nodes, nodes, pdb, pending, pod


class FakeCluster:
    """Nodes and pods in dicts; patches are JSON merge patches with a resourceVersion precondition."""

    def __init__(self, node_objs, pod_objs, pdbs=()):
        self.nodes = {n["metadata"]["name"]: n for n in node_objs}
        self.pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pod_objs}
        self.pdbs = list(pdbs)
        self.events: list[tuple[str, str, str]] = []
        self.evictions: list[str] = []
        self.block_evictions: set[str] = set()
        for n in self.nodes.values():
            n["metadata"].setdefault("resourceVersion", "1")

    def snapshot(self, now: float):
        return build_snapshot(copy.deepcopy(list(self.nodes.values())), copy.deepcopy(list(self.pods.values())),
                              self.pdbs, now)

    def get_node(self, name):
        return copy.deepcopy(self.nodes.get(name))

    def patch_node(self, name, patch):
        node = self.nodes.get(name)
        if node is None or patch["metadata"].get("resourceVersion") not in (None, node["metadata"]["resourceVersion"]):
            return False

        def merge(dst, src):
            for k, v in src.items():
                if k == "resourceVersion":
                    continue
                if v is None:
                    dst.pop(k, None)
                elif isinstance(v, dict):
                    merge(dst.setdefault(k, {}), v)
                else:
                    dst[k] = v

        merge(node, patch)
        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
        return True

    def pods_on_node(self, name):
        return [copy.deepcopy(p) for p in self.pods.values() if p["spec"].get("nodeName") == name]

    def evict(self, namespace, name, body):
        key = f"{namespace}/{name}"
        if key in self.block_evictions:
            return "blocked"
        if key not in self.pods:
            return "gone"
        self.evictions.append(key)
        self.pods[key]["metadata"]["deletionTimestamp"] = iso(T0)
        return "evicted"

    def event(self, obj, type_, reason, message):
        self.events.append((obj["name"], reason, message))

    def finish_terminations(self):
        self.pods = {k: p for k, p in self.pods.items() if not p["metadata"].get("deletionTimestamp")}


class DeletingProvider(FakeProvider):
    def __init__(self, cluster: FakeCluster):
        super().__init__()
        self.cluster = cluster

    def delete_node(self, group, name):
        super().delete_node(group, name)
        self.cluster.nodes.pop(name, None)


GROUPS = [{"name": "a100", "template": A100X8, "min_size": 0, "max_size": 10, "cost_per_hour": 20,
           "max_provision_s": 300}]


def make(cluster: FakeCluster, cfg: NodeScalerConfig | None = None, provider=None, **kw: Any) -> NodeScaler:
    clock = {"t": T0}
    scaler = NodeScaler(cfg or config(GROUPS, scale_in={"unneeded_s": 0, "delay_after_add_s": 0}),
                        cluster.snapshot, cluster, provider or DeletingProvider(cluster),
                        wall=lambda: clock["t"], **kw)
    scaler.clock = clock
    return scaler


def test_pending_pods_grow_the_group_once_and_record_events():
    cluster = FakeCluster([], [pending(f"p{i}", gpus=8) for i in range(3)])
    provider = FakeProvider()
    scaler = make(cluster, provider=provider)
    report = scaler.run_once(T0)
    assert provider.grow_calls == [("a100", 3)]
    assert [g[:2] for g in report.grows] == [("a100", 3)]
    assert sum(1 for _, reason, _ in cluster.events if reason == "TriggeredScaleUp") == 3
    # The next reconcile, before the nodes are in the API: the requested nodes are upcoming, no second grow.
    scaler.run_once(T0 + 1)
    assert provider.grow_calls == [("a100", 3)]
    assert 'gpuaas_nodescaler_nodes_added_total{group="a100"} 3.0' in \
        __import__("prometheus_client").generate_latest(scaler.metrics.registry).decode()


def test_a_grow_that_fails_is_retried_on_the_next_reconcile():
    cluster = FakeCluster([], [pending("p", gpus=8)])
    provider = FakeProvider(next_error=ProviderError("quota"))
    scaler = make(cluster, provider=provider)
    assert scaler.run_once(T0).grows == []
    assert scaler.run_once(T0 + 1).grows and provider.grow_calls == [("a100", 1)]


def test_nodes_that_never_become_gpu_ready_are_removed_and_the_group_backs_off():
    cfg = config(GROUPS + [{"name": "b", "template": A100X8, "max_size": 10, "cost_per_hour": 40}],
                 scale_in={"unneeded_s": 0, "delay_after_add_s": 0})
    stuck = booting_node(cfg, "a100", "a100-stuck", created=T0 - 400)  # max_provision_s 300
    cluster = FakeCluster([stuck], [pending("p", gpus=8)])
    provider = DeletingProvider(cluster)
    scaler = make(cluster, cfg, provider=provider)
    report = scaler.run_once(T0)
    assert report.deleted == ["a100-stuck"] and provider.delete_calls == ["a100-stuck"]
    assert "a100" in scaler.memory.backed_off(T0)
    assert any(r == "ProvisioningFailed" for _, r, _ in cluster.events)
    # The pod still needs a node: the next reconcile grows the other group, not the backed-off one.
    scaler.run_once(T0 + 1)
    assert provider.grow_calls == [("b", 1)]


def test_drain_runs_to_deletion_across_reconciles_with_evictions():
    a, b = nodes("a100", 2)
    an = a["metadata"]["name"]
    cluster = FakeCluster([a, b], [pod("x", node=an, gpus=1)])
    scaler = make(cluster, config(GROUPS, scale_in={"unneeded_s": 0, "delay_after_add_s": 0,
                                                    "max_concurrent_drains": 1}))
    r1 = scaler.run_once(T0)
    assert r1.drains_started  # one of the two (both under 50%): budget 1
    drained = r1.drains_started[0]
    assert cluster.nodes[drained]["spec"]["unschedulable"] is True
    assert DRAIN_ANNOTATION in cluster.nodes[drained]["metadata"]["annotations"]
    r2 = scaler.run_once(T0 + 1)
    if drained == an:
        assert r2.evicted == ["default/x"]
        cluster.finish_terminations()
        scaler.run_once(T0 + 2)
    assert drained not in cluster.nodes
    assert any(r == "NodeRemoved" for _, r, _ in cluster.events)


def test_a_pod_that_appears_on_a_draining_node_stops_the_delete():
    (a,) = nodes("a100", 1)
    an = a["metadata"]["name"]
    cluster = FakeCluster([a], [])
    scaler = make(cluster)
    assert scaler.run_once(T0).drains_started == [an]
    # The snapshot the next reconcile decides on is stale (no pods), but the apiserver has a pod bound there now.
    stale = cluster.snapshot(T0 + 1)
    cluster.pods["default/late"] = pod("late", node=an, gpus=1)
    report = scaler.run_once(T0 + 1, stale)
    assert report.deleted == [] and an in cluster.nodes and "appeared" in report.skipped[0]


def test_pdb_blocked_evictions_retry_after_the_interval_and_roll_back_at_the_deadline():
    a, b = nodes("a100", 2)
    an = a["metadata"]["name"]
    cluster = FakeCluster([a, b], [pod("x", node=an, gpus=1, labels={"app": "s"}),
                                   pod("y", node=b["metadata"]["name"], gpus=4, labels={"app": "t"})],
                          [pdb("s", "s", 1)])
    cluster.block_evictions.add("default/x")
    cfg = config(GROUPS, scale_in={"unneeded_s": 0, "delay_after_add_s": 0, "eviction_retry_s": 5,
                                   "max_drain_s": 30})
    scaler = make(cluster, cfg)
    assert scaler.run_once(T0).drains_started == [an]
    scaler.clock["t"] = T0 + 1
    assert scaler.run_once(T0 + 1).blocked == ["default/x"]
    assert scaler.run_once(T0 + 2).blocked == []  # within the retry interval: no attempt
    scaler.clock["t"] = T0 + 7
    assert scaler.run_once(T0 + 7).blocked == ["default/x"]
    scaler.clock["t"] = T0 + 40
    report = scaler.run_once(T0 + 40)  # past the 30 s deadline with the pod still there
    assert report.rolled_back == [an]
    node = cluster.nodes[an]
    assert DRAIN_ANNOTATION not in node["metadata"]["annotations"] and "unschedulable" not in node["spec"]
    assert any(r == "DrainRolledBack" for _, r, _ in cluster.events)


def test_a_restarted_controller_finishes_a_drain_it_did_not_start():
    a, b = nodes("a100", 2)
    an = a["metadata"]["name"]
    cluster = FakeCluster([a, b], [pod("x", node=an, gpus=1), pod("y", node=b["metadata"]["name"], gpus=2)])
    cfg = config(GROUPS, scale_in={"unneeded_s": 0, "delay_after_add_s": 0, "max_concurrent_drains": 1})
    first = make(cluster, cfg)
    assert first.run_once(T0).drains_started == [an]  # the emptier one
    assert first.run_once(T0 + 1).evicted == ["default/x"]
    cluster.finish_terminations()
    second = make(cluster, cfg)  # no memory of the drain: the node annotation carries it
    assert second.run_once(T0 + 2).deleted == [an]


def test_losing_the_lease_stops_all_writes():
    cluster = FakeCluster(nodes("a100", 2), [pending("p", gpus=8, created=T0 - 10)])
    provider = FakeProvider()
    scaler = make(cluster, provider=provider, may_act=lambda: False)
    report = scaler.run_once(T0)
    assert provider.grow_calls == [] and report.drains_started == []
    assert all("unschedulable" not in n["spec"] for n in cluster.nodes.values())


def test_mig_repartition_is_written_as_the_node_label_the_mig_manager_reads():
    ns_ = mig_nodes("mig", 1)
    cluster = FakeCluster(ns_, [pending("m", mig="3g.40gb")])
    provider = FakeProvider()
    report = make(cluster, provider=provider).run_once(T0)
    name = ns_[0]["metadata"]["name"]
    assert report.mig == [(name, "all-3g.40gb")] and provider.grow_calls == []
    labels = cluster.nodes[name]["metadata"]["labels"]
    assert labels["nvidia.com/mig.config"] == "all-3g.40gb" and labels["nvidia.com/mig.config.state"] == "pending"


def test_dry_run_decides_but_writes_nothing():
    cluster = FakeCluster([], [pending("p", gpus=8)])
    provider = FakeProvider()
    make(cluster, config(GROUPS, dry_run=True), provider=provider).run_once(T0)
    assert provider.grow_calls == [] and cluster.events == []


def test_a_drain_on_a_node_of_a_group_no_longer_configured_is_rolled_back():
    (a,) = nodes("gone", 1)
    from .builders import draining
    draining(a)
    cluster = FakeCluster([a], [])
    report = make(cluster).run_once(T0)
    assert report.rolled_back == [a["metadata"]["name"]] and report.deleted == []
    assert "unschedulable" not in cluster.nodes[a["metadata"]["name"]]["spec"]

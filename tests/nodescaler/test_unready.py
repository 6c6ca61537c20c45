"""Defect 1 of issue 13: only a node that never became GPU-ready counts as a failed provision; a node in service that
goes unready (NotReady, or no GPUs allocatable: kubelet trouble, a device-plugin restart, a MIG reconfiguration) keeps
its pods, and after `unready_drain_s` is drained through the PDB-respecting path, never deleted with pods bound.

Table-driven: each case is a node state, the pods bound to it, and what one reconcile past `max_provision_s` (300 s;
every node here was created 400 s before T0) may do to it."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from nodescaler.controller import Memory, decide
from nodescaler.provider import FakeProvider
from nodescaler.snapshot import DRAIN_ANNOTATION, GPU_READY_SEEN_ANNOTATION, SCALE_DOWN_DISABLED

from .builders import A100X8, T0, booting_node, config, iso, nodes, pending, pod
from .test_controller import DeletingProvider, FakeCluster, make

GROUPS = [{"name": "a100", "template": A100X8, "min_size": 0, "max_size": 10, "cost_per_hour": 20,
           "max_provision_s": 300}]
WINDOW = 1200  # unready_drain_s: cluster-autoscaler's 20 minutes


def cfg(**scale_in):
    return config(GROUPS, scale_in={"unneeded_s": 0, "delay_after_add_s": 0, "unready_drain_s": WINDOW, **scale_in},
                  scale_out={"enabled": False})


def node(state: str, *, seen: bool, annotations: dict | None = None) -> dict:
    """One a100 node created at T0 - 400 s: `ready`, `not-ready` (Ready False) or `no-gpus` (Ready, 0 allocatable
    GPUs, as during a device-plugin restart), or `booting` (as the provider registers it: GPUs held back);
    `seen`: carries the annotation gpuaas writes when it first sees a node GPU-ready."""
    if state == "booting":
        n = booting_node(cfg(), "a100", "a100-0000", created=T0 - 400)
    else:
        (n,) = nodes("a100", 1, created=T0 - 400)
    if state == "not-ready":
        n["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]
    elif state == "no-gpus":
        n["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    if seen:
        n["metadata"]["annotations"][GPU_READY_SEEN_ANNOTATION] = f"{T0 - 350:.3f}"
    n["metadata"]["annotations"].update(annotations or {})
    return n


def on(name: str, owner: str = "ReplicaSet", gpus: int = 2) -> dict:
    return pod(name, node="a100-0000", owner=owner, gpus=gpus)


def at(scaler, t: float):
    """A reconcile at `t`, the scaler's wall clock (drain records, eviction retries) there too."""
    scaler.clock["t"] = t
    return scaler.run_once(t)


@dataclass(frozen=True)
class Case:
    id: str
    state: str
    seen: bool
    pods: tuple = ()
    deleted: bool = False  # one reconcile deletes it (as a failed provision)
    backs_off: bool = False


CASES = [
    # The one failed provision: never GPU-ready, nothing but a DaemonSet pod on it.
    Case("never-ready-empty", "booting", seen=False, deleted=True, backs_off=True),
    Case("never-ready-daemonset-only", "not-ready", seen=False, pods=(("ds", "DaemonSet"),), deleted=True,
         backs_off=True),
    # Never marked, but pods are bound: the scheduler found it ready once (or a pod must not be lost anyway).
    Case("not-ready-with-pods-no-annotation", "not-ready", seen=False, pods=(("a", "ReplicaSet"), ("b", "Job"))),
    Case("no-gpus-with-pods-no-annotation", "no-gpus", seen=False, pods=(("a", "ReplicaSet"),)),
    Case("never-ready-with-a-bare-pod", "booting", seen=False, pods=(("bare", ""),)),
    # Marked GPU-ready once: unready now, with or without pods, it is never a failed provision.
    Case("was-ready-not-ready-with-pods", "not-ready", seen=True, pods=(("a", "ReplicaSet"), ("b", "ReplicaSet"))),
    Case("was-ready-no-gpus-with-pods", "no-gpus", seen=True, pods=(("a", "ReplicaSet"),)),
    Case("was-ready-not-ready-idle", "not-ready", seen=True),
    Case("was-ready-no-gpus-idle", "no-gpus", seen=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_only_a_node_never_gpu_ready_is_a_failed_provision(case: Case):
    cluster = FakeCluster([node(case.state, seen=case.seen)], [on(n, o) for n, o in case.pods])
    provider = DeletingProvider(cluster)
    scaler = make(cluster, cfg(), provider=provider)
    report = scaler.run_once(T0)
    assert (provider.delete_calls == ["a100-0000"]) is case.deleted, report
    assert ("a100" in scaler.memory.backed_off(T0)) is case.backs_off
    assert report.drains_started == [] and cluster.evictions == []  # within the unready window: left alone
    if not case.deleted:
        assert "a100-0000" in cluster.nodes and "unschedulable" not in cluster.nodes["a100-0000"]["spec"]
        assert all(not p["metadata"].get("deletionTimestamp") for p in cluster.pods.values()), "no pod touched"


def test_a_restarted_scaler_knows_the_node_was_ready_from_the_annotation_it_wrote():
    """Restart-proof: the first replica marks the node when it sees it GPU-ready; a second replica, with no memory,
    sees the node unready past max_provision_s, idle (its pods finished), and keeps it. (Scale-in off: an idle node
    would otherwise be drained as unneeded.)"""
    cluster = FakeCluster([node("ready", seen=False)], [])
    first = make(cluster, cfg(enabled=False), provider=DeletingProvider(cluster))
    assert first.run_once(T0 - 390).marked_ready == ["a100-0000"]
    assert GPU_READY_SEEN_ANNOTATION in cluster.nodes["a100-0000"]["metadata"]["annotations"]
    assert first.run_once(T0 - 389).marked_ready == []  # once per node
    cluster.nodes["a100-0000"]["status"]["allocatable"]["nvidia.com/gpu"] = "0"  # device plugin restarting
    second = make(cluster, cfg(enabled=False), provider=DeletingProvider(cluster))
    report = second.run_once(T0)
    assert report.deleted == [] and "a100-0000" in cluster.nodes
    assert "a100" not in second.memory.backed_off(T0)
    assert [r for _, r, _ in cluster.events if r == "NodeUnready"] == ["NodeUnready"]


def test_a_failed_provision_is_not_deleted_while_the_apiserver_shows_pods_bound():
    """The snapshot (informer cache) shows the never-ready node empty; the apiserver has a pod bound to it by now."""
    cluster = FakeCluster([node("booting", seen=False)], [])
    provider = DeletingProvider(cluster)
    scaler = make(cluster, cfg(), provider=provider)
    stale = cluster.snapshot(T0)
    cluster.pods["default/late"] = on("late")
    report = scaler.run_once(T0, stale)
    assert provider.delete_calls == [] and "a100-0000" in cluster.nodes
    assert any("appeared" in s for s in report.skipped)
    assert "a100" in scaler.memory.backed_off(T0)  # it still failed to provision: the group backs off


def test_after_the_unready_window_the_node_is_drained_through_evictions_and_deleted_only_when_empty():
    cluster = FakeCluster([node("not-ready", seen=True)], [on("a"), on("b")])
    provider = DeletingProvider(cluster)
    scaler = make(cluster, cfg(), provider=provider)
    assert scaler.run_once(T0).drains_started == []  # first seen unready at T0
    assert at(scaler, T0 + WINDOW - 1).drains_started == []
    r = at(scaler, T0 + WINDOW)
    assert r.drains_started == ["a100-0000"] and r.deleted == []
    n = cluster.nodes["a100-0000"]
    assert n["spec"]["unschedulable"] is True and DRAIN_ANNOTATION in n["metadata"]["annotations"]
    r = at(scaler, T0 + WINDOW + 1)
    assert sorted(r.evicted) == ["default/a", "default/b"] and r.deleted == []  # Eviction API: PDBs hold
    assert "a100-0000" in cluster.nodes  # pods still terminating: bound
    assert at(scaler, T0 + WINDOW + 2).deleted == []
    cluster.finish_terminations()
    assert at(scaler, T0 + WINDOW + 3).deleted == ["a100-0000"]


def test_the_unready_window_restarts_when_the_node_is_ready_again():
    cluster = FakeCluster([node("no-gpus", seen=True)], [on("a")])
    scaler = make(cluster, cfg())
    scaler.run_once(T0)
    cluster.nodes["a100-0000"]["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    scaler.run_once(T0 + 600)  # GPU-ready again: forgotten
    cluster.nodes["a100-0000"]["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    scaler.run_once(T0 + 700)
    assert scaler.run_once(T0 + WINDOW + 1).drains_started == []  # unready for 501 s only
    assert scaler.run_once(T0 + 700 + WINDOW).drains_started == ["a100-0000"]


BLOCKED = [
    ("scale-down-disabled", {SCALE_DOWN_DISABLED: "true"}, (), {}),
    ("do-not-disrupt", {"karpenter.sh/do-not-disrupt": "true"}, (), {}),
    ("pod-safe-to-evict-false", {}, ({"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},), {}),
    ("unready-drain-off", {}, (), {"unready_drain_s": None}),
    ("scale-in-off", {}, (), {"enabled": False}),
    ("group-at-min-size", {}, (), {}),
]


@pytest.mark.parametrize("why,node_ann,pod_ann,scale_in", BLOCKED, ids=[b[0] for b in BLOCKED])
def test_a_long_unready_node_is_left_alone_when_it_may_not_be_drained(why, node_ann, pod_ann, scale_in):
    groups = [{**GROUPS[0], "min_size": 1}] if why == "group-at-min-size" else GROUPS
    c = config(groups, scale_in={"unneeded_s": 0, "delay_after_add_s": 0, "unready_drain_s": WINDOW, **scale_in},
               scale_out={"enabled": False})
    p = on("a")
    for ann in pod_ann:
        p["metadata"]["annotations"].update(ann)
    cluster = FakeCluster([node("not-ready", seen=True, annotations=node_ann)], [p])
    provider = DeletingProvider(cluster)
    scaler = make(cluster, c, provider=provider)
    for t in (T0, T0 + WINDOW, T0 + 10 * WINDOW):
        r = scaler.run_once(t)
        assert r.drains_started == [] and r.deleted == [] and r.evicted == []
    assert provider.delete_calls == [] and "unschedulable" not in cluster.nodes["a100-0000"]["spec"]


def test_a_node_whose_mig_layout_is_being_changed_is_not_timed_as_unready():
    n = node("no-gpus", seen=True)
    n["metadata"]["labels"]["nvidia.com/mig.config.state"] = "pending"
    cluster = FakeCluster([n], [on("a")])
    d = decide(cluster.snapshot(T0), Memory(unready={"a100-0000": T0 - 5000}), cfg())
    assert d.unready == {} and d.failed_nodes == []
    assert d.scale_in is None or d.scale_in.commands == []


def test_an_unready_node_in_service_is_not_capacity_pending_pods_wait_for():
    """A booting node is capacity on its way (pods wait for it rather than buy another); a node in service that went
    unready is not: nothing says it comes back. Its group grows for a pod that needs a node."""
    c = config(GROUPS, scale_in={"unneeded_s": 0, "delay_after_add_s": 0, "unready_drain_s": WINDOW})
    waiting = pending("p", gpus=8)
    waiting["spec"]["nodeSelector"] = {"gpuaas.io/pool": "a100"}
    for state, grows in (("booting", []), ("not-ready", [("a100", 1)])):
        n = node(state, seen=state != "booting")
        n["metadata"]["creationTimestamp"] = iso(T0 - 10)  # within max_provision_s: not a failed provision either
        cluster = FakeCluster([n], [waiting])
        provider = FakeProvider()
        make(cluster, c, provider=provider).run_once(T0)
        assert provider.grow_calls == grows, state

"""Gangs on a real control plane: pods created by the real Job controller as a user writes them (the group label and
size; the admission webhook, called by the real kube-apiserver, adds the gpuaas.io/gang scheduling gate), planned
and pinned by `gpuaas gangs` under the ServiceAccount deploy/ ships, scheduled by the real kube-scheduler onto KWOK
nodes.

What must hold: a gang lands whole on the nodes it was pinned to, or not at all; two gangs that each need most of
the free GPUs never both half-place (one runs, the other waits whole with its reason, then runs when room frees); a
gang that cannot fit stays gated whole with its reason."""
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpuaas.cluster.components import ComponentProcess, gangs_process
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.process import free_port
from gpuaas.cluster.webhooks import gangs_webhook_registered, gangs_webhook_settings
from runtime.pools import parse_pool_spec
from scoring.constraints import HOSTNAME_LABEL
from scoring.gangs import GANG_GATE, RELEASED_ANNOTATION
from tests.deploy.manifests import DEPLOY

from .kube import wait_for

POOLS = {"pools": [{"name": "a100", "count": 4, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128",
                    "memory": "1Ti"}]}


@contextmanager
def gang_controller(cluster: LocalCluster, workdir: Path, **config: Any) -> Iterator[ComponentProcess]:
    """`gpuaas gangs` with the shipped RBAC and its webhook registered with the cluster's kube-apiserver."""
    port = free_port()
    path = workdir / "gangs.yaml"
    path.write_text(yaml.safe_dump({"interval_s": 1, "leader_election": {"enabled": False},
                                    "webhook": gangs_webhook_settings(cluster.control_plane.pki, port), **config}))
    kubeconfig = cluster.service_account_kubeconfig(DEPLOY / "bases" / "gangs", "gpuaas-gangs")
    proc = gangs_process(workdir, kubeconfig, path).start(timeout=60)
    try:
        with gangs_webhook_registered(cluster.api, cluster.control_plane.pki, port):
            yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gangs")
    cluster = LocalCluster(workdir, name="gangs")
    try:
        cluster.up(parse_pool_spec(POOLS))
        with gang_controller(cluster, workdir, bind_timeout_s=60) as proc:
            yield cluster, proc
    finally:
        cluster.down()


@pytest.fixture
def ns(env):
    cluster, _ = env
    name = f"g-{time.monotonic_ns() % 10**8}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def job(name: str, pods: int, gpus: int, gang: str | None = None) -> dict:
    """An indexed Job whose pods form one gang, as a user writes it: a group label and its size, no gate."""
    gang = gang or name
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "completionMode": "Indexed", "backoffLimit": 0,
                     "template": {
                         "metadata": {"labels": {"gpuaas.io/gang": gang},
                                      "annotations": {"gpuaas.io/gang-size": str(pods)}},
                         "spec": {"restartPolicy": "Never",
                                  "containers": [{"name": "train", "image": "trainer",
                                                  "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                                                                "requests": {"cpu": "8", "memory": "32Gi"}}}]}}}}


def members(api, ns: str, gang: str) -> list:
    return client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"gpuaas.io/gang={gang}").items


def bound(pods) -> list:
    return [p for p in pods if p.spec.node_name]


def gated(pods) -> list:
    return [p for p in pods if any(g.name == GANG_GATE for g in p.spec.scheduling_gates or ())]


def explain(proc, key: str) -> dict:
    with urllib.request.urlopen(f"{proc.url}/explain?pod={key}", timeout=5) as resp:
        return json.loads(resp.read())


def reasons(api, ns: str, reason: str) -> list[str]:
    return [e.message for e in client.CoreV1Api(api).list_namespaced_event(ns).items if e.reason == reason]


def test_a_gang_of_four_eight_gpu_pods_lands_whole_on_its_planned_nodes(env, ns):
    cluster, _ = env
    client.BatchV1Api(cluster.api).create_namespaced_job(ns, job("train", 4, 8))
    wait_for(lambda: len(bound(members(cluster.api, ns, "train"))) == 4, timeout=90, what="4 members bound")
    pods = members(cluster.api, ns, "train")
    assert not gated(pods)
    for p in pods:  # each landed exactly where gpuaas pinned it, and gpuaas says when it released it
        assert p.spec.node_name == p.spec.node_selector[HOSTNAME_LABEL]
        assert RELEASED_ANNOTATION in p.metadata.annotations
    assert len({p.spec.node_name for p in pods}) == 4
    released = sorted(float(p.metadata.annotations[RELEASED_ANNOTATION]) for p in pods)
    assert released[-1] - released[0] < 1.0  # one release for the gang
    assert any("all 4 pods fit together" in m for m in reasons(cluster.api, ns, "GangReleased"))


def test_two_gangs_needing_most_of_the_gpus_never_deadlock(env, ns):
    """Each gang asks 5 x 4 GPUs = 20 of the 32: one runs whole, the other waits whole, and runs once room frees."""
    cluster, proc = env
    batch = client.BatchV1Api(cluster.api)
    batch.create_namespaced_job(ns, job("a", 5, 4))
    batch.create_namespaced_job(ns, job("b", 5, 4))

    def one_whole_other_waiting():
        a, b = members(cluster.api, ns, "a"), members(cluster.api, ns, "b")
        return len(a) == len(b) == 5 and sorted([len(bound(a)), len(bound(b))]) == [0, 5]
    wait_for(one_whole_other_waiting, timeout=90, what="one gang bound whole, the other not at all")
    a = members(cluster.api, ns, "a")
    first, second = ("a", "b") if len(bound(a)) == 5 else ("b", "a")
    for _ in range(5):  # it stays so: the waiting gang does not half-place meanwhile
        time.sleep(1)
        waiting = members(cluster.api, ns, second)
        assert bound(waiting) == [] and len(gated(waiting)) == 5
    why = explain(proc, f"{ns}/{waiting[0].metadata.name}")
    assert why["action"] == "wait" and "do not fit together" in why["message"], why
    assert any("do not fit together" in m for m in reasons(cluster.api, ns, "GangWaiting"))
    batch.delete_namespaced_job(first, ns, propagation_policy="Background")
    wait_for(lambda: len(bound(members(cluster.api, ns, second))) == 5, timeout=90,
             what=f"gang {second} bound whole once {first} is gone")


def test_a_gang_that_cannot_fit_stays_gated_whole_with_its_reason(env, ns):
    cluster, _ = env
    client.BatchV1Api(cluster.api).create_namespaced_job(ns, job("huge", 5, 8))  # 40 GPUs on a 32-GPU cluster
    wait_for(lambda: any("do not fit together" in m for m in reasons(cluster.api, ns, "GangWaiting")), timeout=60,
             what="the gang's reason in its events")
    pods = members(cluster.api, ns, "huge")
    assert len(pods) == 5 and len(gated(pods)) == 5 and not bound(pods)


def test_a_kueue_pod_group_is_placed_only_after_kueue_admits_it(env, ns):
    """Kueue's plain-pod group labels; Kueue's own gate is removed here as Kueue removes it when it admits."""
    cluster, proc = env
    core = client.CoreV1Api(cluster.api)
    for i in range(2):
        core.create_namespaced_pod(ns, {
            "metadata": {"name": f"k{i}", "labels": {"kueue.x-k8s.io/pod-group-name": "grp"},
                         "annotations": {"kueue.x-k8s.io/pod-group-total-count": "2"}},
            # Kueue's own webhook adds its gate; gpuaas's adds its own after it.
            "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
                     "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
    wait_for(lambda: "kueue.x-k8s.io/admission" in explain(proc, f"{ns}/k0").get("message", ""), timeout=30,
             what="gpuaas waiting for Kueue's gate")
    time.sleep(2)
    pods = core.list_namespaced_pod(ns).items
    assert all([g.name for g in p.spec.scheduling_gates] == ["kueue.x-k8s.io/admission", GANG_GATE] for p in pods)
    for i in range(2):  # Kueue admits: it removes its own gate, and only that
        core.patch_namespaced_pod(f"k{i}", ns, [{"op": "test", "path": "/spec/schedulingGates/0/name",
                                                 "value": "kueue.x-k8s.io/admission"},
                                                {"op": "remove", "path": "/spec/schedulingGates/0"}])
    wait_for(lambda: len(bound(core.list_namespaced_pod(ns).items)) == 2, timeout=60, what="the group bound whole")

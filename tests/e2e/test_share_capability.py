"""A GPU share where no device plugin can give one (issue 16, item 4), on a real control plane: kube-scheduler calling
the extender over mTLS, KWOK nodes of two pools, one whose nodes advertise `gpuaas.io/gpu-share` (the pool spec's
`gpu.shares: true`, what a sharing device plugin publishes) and one with the NVIDIA device plugin's resources only.

A `gpuaas.io/gpu-share` pod held to the plain pool stays Pending, and its FailedScheduling event carries the
extender's reason (the kubelet would have started it without a GPU); the same pod without that constraint runs on the
sharing node; whole-GPU pods still run on the plain pool."""
from __future__ import annotations

import time

import pytest
from kubernetes import client
from kubernetes.utils.quantity import parse_quantity

from extender.schedconfig import extender_entries, gpuaas_profile
from gpuaas.cluster.components import extender_process, scheduler_extender_tls
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.process import free_port
from gpuaas.workloads import gpu_pod
from runtime.pools import parse_pool_spec
from scoring.fit import NO_SHARE_PLUGIN
from scoring.kubeobjects import DEVICES_ANNOTATION, POOL_LABEL
from tests.deploy.manifests import DEPLOY

from .kube import pod, pod_events, wait_for
from .test_extender import call, running_on, scheduled_false

POOLS = {"pools": [
    {"name": "plain", "count": 1, "gpu": {"model": "T4", "count": 2}, "cpu": "16", "memory": "64Gi"},
    {"name": "sharing", "count": 1, "gpu": {"model": "T4", "count": 1, "shares": True}, "cpu": "16", "memory": "64Gi"},
]}


@pytest.fixture(scope="module")
def share_cluster(tmp_path_factory):
    """The extender as deploy/ wires it (kube-scheduler's client certificate, its own ServiceAccount's permissions)."""
    workdir = tmp_path_factory.mktemp("share-capability")
    port = free_port()
    cluster = LocalCluster(workdir, name="shares", scheduler_profiles=[gpuaas_profile("default-scheduler")])
    pki = cluster.control_plane.pki
    cluster.control_plane.extenders = extender_entries(f"https://127.0.0.1:{port}", **scheduler_extender_tls(pki))
    extender = None
    try:
        cluster.up(parse_pool_spec(POOLS))
        sa_kubeconfig = cluster.service_account_kubeconfig(DEPLOY / "bases" / "extender", "gpuaas-extender")
        extender = extender_process(workdir, sa_kubeconfig, port=port, pki=pki)
        extender.start()
        yield cluster, extender
    finally:
        if extender is not None:
            extender.stop()
        cluster.down()


@pytest.fixture
def ns(share_cluster):
    cluster = share_cluster[0]
    name = f"sh-{time.monotonic_ns() % 10**8}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)
    wait_for(lambda: not core.list_namespaced_pod(name).items, timeout=60, what=f"pods of {name} deleted")


def on_pool(body: dict, pool: str) -> dict:
    body["spec"]["nodeSelector"] = {POOL_LABEL: pool}
    return body


def test_a_share_where_no_plugin_gives_one_waits_with_the_reason_and_runs_where_one_does(share_cluster, ns):
    cluster, extender = share_cluster
    core = client.CoreV1Api(cluster.api)
    assert "gpuaas.io/gpu-share" not in core.read_node("plain-0000").status.allocatable
    assert parse_quantity(core.read_node("sharing-0000").status.allocatable["gpuaas.io/gpu-share"]) == 1000

    core.create_namespaced_pod(ns, on_pool(gpu_pod("held", ns, gpu_share=250), "plain"))
    assert wait_for(lambda: scheduled_false(cluster.api, ns, "held"), what="held judged unschedulable") \
        == "Unschedulable"
    messages = wait_for(lambda: [e.message for e in pod_events(cluster.api, ns, "held")
                                 if e.reason == "FailedScheduling" and NO_SHARE_PLUGIN in e.message],
                        what="held's FailedScheduling event with the extender's reason")
    assert "no device plugin on it advertises gpuaas.io/gpu-share" in messages[-1]
    status, answer = call(extender, f"/explain?pod={ns}/held&node=plain-0000", cert="admin",
                          pki=cluster.control_plane.pki)
    assert status == 200 and answer["fits"] is False and answer["resolvable"] is False, answer
    assert answer["reason"] == NO_SHARE_PLUGIN

    core.create_namespaced_pod(ns, gpu_pod("free", ns, gpu_share=250))
    for i in range(2):
        core.create_namespaced_pod(ns, on_pool(gpu_pod(f"whole{i}", ns, gpus=1), "plain"))
    pods = wait_for(lambda: (r := running_on(cluster.api, ns)) and len(r) == 3 and r, timeout=60,
                    what="the free share and two whole GPUs Running")
    assert pods["free"].spec.node_name == "sharing-0000"
    assert pods["free"].metadata.annotations[DEVICES_ANNOTATION] == "0"
    assert {pods[f"whole{i}"].spec.node_name for i in range(2)} == {"plain-0000"}
    assert pod(cluster.api, ns, "held").spec.node_name is None

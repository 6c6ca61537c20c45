"""Time-slicing on a real control plane (issue 16): a KWOK node of one T4 time-sliced into 4 replicas (the pool spec's
`replicas: 4`: 4 `nvidia.com/gpu` devices, GFD's labels), kube-scheduler calling the extender over mTLS, and the node
scaler with the KWOK provider.

Four `nvidia.com/gpu: 1` pods are bound there by the extender (before issue 16 it refused the second one: "insufficient
whole GPUs: 0 free"); a fifth stays Pending with the reason, which kube-scheduler's own count of devices gives first
(it filters before the extender) and the extender gives too (/explain); a GPU share gets the extender's reason in its
event. The node scaler, given the fifth, adds one node of the pool, and the fifth runs there."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from extender.schedconfig import extender_entries, gpuaas_profile
from gpuaas.cluster.components import extender_process, nodescaler_process, scheduler_extender_tls
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.migmanager import FakeNodeAgent
from gpuaas.cluster.process import free_port
from gpuaas.workloads import gpu_pod
from runtime.pools import parse_pool_spec
from scoring.kubeobjects import DEVICES_ANNOTATION, POOL_LABEL
from tests.deploy.manifests import DEPLOY

from .kube import pod, pod_events, wait_for
from .test_extender import call, running_on, scheduled_false

T4X1 = {"gpu": {"model": "T4", "count": 1, "replicas": 4}, "cpu": "16", "memory": "64Gi"}
POOLS = {"pools": [{"name": "t4", "count": 1, **T4X1}]}
REPLICA_REASON = ("insufficient GPU replicas: 0 free, 1 requested (nvidia.com/gpu.replicas=4: each of the node's GPUs "
                  "is 4 replicas)")


@pytest.fixture(scope="module")
def ts_cluster(tmp_path_factory):
    """The extender as deploy/ wires it (kube-scheduler's client certificate, its own ServiceAccount's permissions),
    the fake device-plugin registration for nodes the node scaler adds, and a kubeconfig with the node scaler's."""
    workdir = tmp_path_factory.mktemp("time-slicing")
    port = free_port()
    cluster = LocalCluster(workdir, name="ts", scheduler_profiles=[gpuaas_profile("default-scheduler")])
    pki = cluster.control_plane.pki
    cluster.control_plane.extenders = extender_entries(f"https://127.0.0.1:{port}", **scheduler_extender_tls(pki))
    extender = agent = None
    try:
        cluster.up(parse_pool_spec(POOLS))
        sa_kubeconfig = cluster.service_account_kubeconfig(DEPLOY / "bases" / "extender", "gpuaas-extender")
        extender = extender_process(workdir, sa_kubeconfig, port=port, pki=pki)
        extender.start()
        scaler_kubeconfig = cluster.service_account_kubeconfig(DEPLOY / "bases" / "nodescaler", "gpuaas-nodescaler")
        agent = FakeNodeAgent(cluster.api).start()
        yield cluster, extender, workdir, scaler_kubeconfig
    finally:
        if agent is not None:
            agent.stop()
        if extender is not None:
            extender.stop()
        cluster.down()


@pytest.fixture
def ns(ts_cluster):
    cluster = ts_cluster[0]
    name = f"ts-{time.monotonic_ns() % 10**8}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)
    wait_for(lambda: not core.list_namespaced_pod(name).items, timeout=60, what=f"pods of {name} deleted")


def failed_scheduling(api, namespace: str, name: str) -> list[str]:
    return [e.message for e in pod_events(api, namespace, name) if e.reason == "FailedScheduling"]


def test_four_one_gpu_pods_run_on_one_gpu_of_four_replicas_and_a_fifth_waits_with_the_reason(ts_cluster, ns):
    cluster, extender, _, _ = ts_cluster
    core = client.CoreV1Api(cluster.api)
    node = core.read_node("t4-0000")
    assert node.status.allocatable["nvidia.com/gpu"] == "4"
    assert node.metadata.labels["nvidia.com/gpu.replicas"] == "4"
    for i in range(4):
        core.create_namespaced_pod(ns, gpu_pod(f"r{i}", ns, gpus=1))
    pods = wait_for(lambda: (r := running_on(cluster.api, ns)) and len(r) == 4 and r, timeout=60,
                    what="4 one-GPU pods Running on one time-sliced GPU")
    assert {p.spec.node_name for p in pods.values()} == {"t4-0000"}
    # Bound by the extender, which records the GPU each replica is on: all four share GPU 0.
    assert sorted(p.metadata.annotations[DEVICES_ANNOTATION] for p in pods.values()) == ["0"] * 4

    core.create_namespaced_pod(ns, gpu_pod("r4", ns, gpus=1))
    assert wait_for(lambda: scheduled_false(cluster.api, ns, "r4"), what="r4 judged unschedulable") == "Unschedulable"
    messages = wait_for(lambda: failed_scheduling(cluster.api, ns, "r4"), what="r4's FailedScheduling event")
    # kube-scheduler counts the node's 4 devices before it asks the extender; the extender's model agrees.
    assert "Insufficient nvidia.com/gpu" in messages[-1]
    status, answer = call(extender, f"/explain?pod={ns}/r4&node=t4-0000", cert="admin", pki=cluster.control_plane.pki)
    assert status == 200 and answer["fits"] is False and answer["resolvable"] is True, answer
    assert answer["reason"] == REPLICA_REASON and answer["free"]["gpu_replicas"] == 0

    # A GPU share (an extended resource kube-scheduler ignores) reaches the extender, which refuses it for good.
    core.create_namespaced_pod(ns, gpu_pod("share", ns, gpu_share=250))
    messages = wait_for(lambda: failed_scheduling(cluster.api, ns, "share"), what="the share's FailedScheduling event")
    assert "node time-slices its GPUs (nvidia.com/gpu.replicas=4): its device plugin hands out replicas of " \
           "nvidia.com/gpu only, not a gpuaas.io/gpu-share share" in messages[-1]
    assert pod(cluster.api, ns, "r4").spec.node_name is None and pod(cluster.api, ns, "share").spec.node_name is None

    # A replica frees: the waiting pod takes it.
    core.delete_namespaced_pod("r0", ns, grace_period_seconds=0)
    wait_for(lambda: running_on(cluster.api, ns).get("r4"), timeout=60, what="r4 Running once a replica freed")


def test_the_node_scaler_adds_one_node_of_the_pool_for_the_fifth_pod(ts_cluster, ns):
    cluster, _, workdir, scaler_kubeconfig = ts_cluster
    core = client.CoreV1Api(cluster.api)
    for i in range(5):
        core.create_namespaced_pod(ns, gpu_pod(f"p{i}", ns, gpus=1))
    wait_for(lambda: len(running_on(cluster.api, ns)) == 4, timeout=60, what="4 pods Running")
    waiting = wait_for(lambda: [n for n in (f"p{i}" for i in range(5)) if scheduled_false(cluster.api, ns, n)],
                       what="the fifth pod unschedulable")
    assert len(waiting) == 1
    cfg = {"interval_s": 1,
           "groups": [{"name": "t4", "template": T4X1, "min_size": 1, "max_size": 3, "provisioning_delay_s": 1,
                       "max_provision_s": 120, "cost_per_hour": 1}],
           "scale_in": {"unneeded_s": 600},
           "leader_election": {"namespace": "gpuaas-system", "name": "gpuaas-nodescaler", "lease_duration_s": 4,
                               "renew_deadline_s": 3, "retry_period_s": 0.5}}
    path = Path(workdir) / "nodescaler-ts.yaml"
    path.write_text(yaml.safe_dump(cfg))
    scaler = nodescaler_process(workdir, scaler_kubeconfig, path, name="ns-ts")
    scaler.start(timeout=60)
    try:
        placed = wait_for(lambda: running_on(cluster.api, ns).get(waiting[0]), timeout=120,
                          what="the fifth pod Running on a node the node scaler added")
        group = core.list_node(label_selector=f"{POOL_LABEL}=t4").items
        assert len(group) == 2, [n.metadata.name for n in group]  # one node more, not one per replica
        assert placed.spec.node_name != "t4-0000"
        new = next(n for n in group if n.metadata.name == placed.spec.node_name)
        assert new.status.allocatable["nvidia.com/gpu"] == "4"  # the group's template: 1 GPU x 4 replicas
        time.sleep(3)  # a few more reconciles: nothing more is grown for pods that all run
        assert len(core.list_node(label_selector=f"{POOL_LABEL}=t4").items) == 2
    finally:
        scaler.stop()

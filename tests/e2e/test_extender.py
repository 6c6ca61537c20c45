"""The extender behind the real kube-scheduler: filter, prioritize and bind on a KWOK GPU cluster."""
from __future__ import annotations

import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from extender.schedconfig import extender_entry, gpuaas_profile
from gpuaas.cluster.components import extender_process
from gpuaas.cluster.process import free_port
from gpuaas.cluster.pki import issue_serving_cert
from gpuaas.cluster.local import LocalCluster
from gpuaas.kubeclient import api_client
from gpuaas.cluster.pools import parse_pool_spec
from gpuaas.workloads import gpu_pod
from scoring.kubeobjects import DEVICES_ANNOTATION
from tests.deploy.manifests import DEPLOY

from .kube import pod, pod_events, pod_phase, wait_for

POOLS = {"pools": [
    {"name": "a100", "count": 4, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"},
    {"name": "h100", "count": 2, "gpu": {"model": "H100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"},
    {"name": "mig", "count": 2, "gpu": {"model": "A100-80GB", "count": 8, "mig": "all-balanced"}, "cpu": "128",
     "memory": "1Ti"},
]}


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("extender-cluster")
    port = free_port()
    cluster = LocalCluster(workdir, name="ext", extenders=[extender_entry(f"http://127.0.0.1:{port}")],
                           scheduler_profiles=[gpuaas_profile("default-scheduler")])
    extender = None
    try:
        cluster.up(parse_pool_spec(POOLS))
        # The extender runs with exactly the permissions deploy/bases/extender grants it.
        sa_kubeconfig = cluster.service_account_kubeconfig(DEPLOY / "bases" / "extender", "gpuaas-extender")
        extender = extender_process(workdir, sa_kubeconfig, port=port)
        extender.start()
        cluster.extender_kubeconfig = sa_kubeconfig
        yield cluster, extender
    finally:
        if extender is not None:
            extender.stop()
        cluster.down()


@pytest.fixture
def ns(gpu_cluster):
    cluster, _ = gpu_cluster
    name = f"x-{time.monotonic_ns() % 10**8}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)
    # Wait for the namespace's pods to go, so that the next test starts from free GPUs.
    wait_for(lambda: not core.list_namespaced_pod(name).items, timeout=60, what=f"pods of {name} deleted")


def devices_by_node(pods) -> dict[str, list[int]]:
    """The GPU indices gpuaas recorded, per node: a GPU listed twice on one node was double-booked."""
    per_node: dict[str, list[int]] = {}
    for p in pods:
        per_node.setdefault(p.spec.node_name, []).extend(
            int(d) for d in p.metadata.annotations[DEVICES_ANNOTATION].split(","))
    return per_node


def running_on(api, namespace):
    return {p.metadata.name: p for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items
            if p.status.phase == "Running"}


def test_gpu_pods_are_bound_by_the_extender_with_their_devices_recorded(gpu_cluster, ns):
    cluster, _ = gpu_cluster
    core = client.CoreV1Api(cluster.api)
    for i, gpus in enumerate((8, 4, 2, 1, 1)):
        core.create_namespaced_pod(ns, gpu_pod(f"p{i}", ns, gpus=gpus))
    pods = wait_for(lambda: (r := running_on(cluster.api, ns)) and len(r) == 5 and r, what="5 Running pods")
    held: dict[str, set[int]] = {}
    for p in pods.values():
        devices = [int(d) for d in p.metadata.annotations[DEVICES_ANNOTATION].split(",")]
        assert len(devices) == int(p.spec.containers[0].resources.limits["nvidia.com/gpu"])
        assert not held.setdefault(p.spec.node_name, set()) & set(devices), "a GPU was given twice"
        held[p.spec.node_name] |= set(devices)
    # Fragmentation-aware packing: the 4, 2, 1 and 1-GPU pods share one A100/H100 instead of spreading.
    assert len({p.spec.node_name for name, p in pods.items() if name != "p0"}) <= 2


def test_mig_pods_land_only_where_their_profile_fits(gpu_cluster, ns):
    cluster, _ = gpu_cluster
    core = client.CoreV1Api(cluster.api)
    # all-balanced on A100-80GB: per GPU 2 x 1g.10gb, 1 x 2g.20gb, 1 x 3g.40gb; 2 nodes x 8 GPUs.
    for i in range(6):
        core.create_namespaced_pod(ns, gpu_pod(f"m3g-{i}", ns, mig="3g.40gb"))
    core.create_namespaced_pod(ns, gpu_pod("m7g", ns, mig="7g.80gb"))  # no such instance in any layout
    wait_for(lambda: len(running_on(cluster.api, ns)) == 6, what="6 MIG pods Running")
    assert {p.spec.node_name.split("-")[0] for p in running_on(cluster.api, ns).values()} == {"mig"}
    assert pod_phase(cluster.api, ns, "m7g") == "Pending"


def test_pod_that_accepts_no_present_gpu_model_stays_pending_with_our_reason(gpu_cluster, ns):
    cluster, _ = gpu_cluster
    p = gpu_pod("wants-h200", ns, gpus=1)
    p["metadata"]["annotations"] = {"gpuaas.io/gpu-models": "H200-141GB"}
    client.CoreV1Api(cluster.api).create_namespaced_pod(ns, p)
    messages = wait_for(lambda: [e.message for e in pod_events(cluster.api, ns, "wants-h200")
                                 if e.reason == "FailedScheduling"], what="FailedScheduling event")
    assert "GPU model A100-80GB is not one the pod accepts (H200-141GB)" in messages[-1]
    assert pod_phase(cluster.api, ns, "wants-h200") == "Pending"


def test_deleting_pods_frees_their_gpus_for_the_next_ones(gpu_cluster, ns):
    cluster, _ = gpu_cluster
    core = client.CoreV1Api(cluster.api)
    # Whole-GPU capacity: 4 A100 + 2 H100 nodes x 8 GPUs = 6 eight-GPU pods; the seventh waits.
    for i in range(7):
        core.create_namespaced_pod(ns, gpu_pod(f"full-{i}", ns, gpus=8))
    wait_for(lambda: len(running_on(cluster.api, ns)) == 6, what="6 eight-GPU pods Running")
    waiting = [n for n in (f"full-{i}" for i in range(7)) if pod_phase(cluster.api, ns, n) == "Pending"]
    assert len(waiting) == 1
    victim = next(iter(running_on(cluster.api, ns)))
    core.delete_namespaced_pod(victim, ns)
    wait_for(lambda: pod_phase(cluster.api, ns, waiting[0]) == "Running", timeout=60,
             what="the waiting pod Running once GPUs were freed")


def test_restarted_extender_rebuilds_device_state_from_the_pods(gpu_cluster, ns):
    cluster, extender = gpu_cluster
    core = client.CoreV1Api(cluster.api)
    for i in range(3):
        core.create_namespaced_pod(ns, gpu_pod(f"before-{i}", ns, gpus=3))
    wait_for(lambda: len(running_on(cluster.api, ns)) == 3, what="3 pods Running")
    extender.kill()
    extender.start()
    for i in range(3):
        core.create_namespaced_pod(ns, gpu_pod(f"after-{i}", ns, gpus=3))
    pods = wait_for(lambda: (r := running_on(cluster.api, ns)) and len(r) == 6 and r, what="6 pods Running")
    for node, devices in devices_by_node(pods.values()).items():
        assert len(devices) == len(set(devices)), f"GPU double-booked on {node}: {sorted(devices)}"


def test_killing_the_extender_mid_burst_loses_no_pod_and_double_books_no_gpu(gpu_cluster, ns):
    cluster, extender = gpu_cluster
    core = client.CoreV1Api(cluster.api)
    sizes = [1, 2, 1, 4, 2, 1, 1, 2] * 3  # 24 pods, 42 of the 48 whole GPUs (the MIG pool has none)
    for i, gpus in enumerate(sizes[:12]):
        core.create_namespaced_pod(ns, gpu_pod(f"burst-{i:02d}", ns, gpus=gpus))
    wait_for(lambda: len(running_on(cluster.api, ns)) >= 3, interval=0.02, what="the burst under way")
    extender.kill()  # mid-burst: filter, prioritize and bind calls in flight are cut
    for i, gpus in enumerate(sizes[12:], start=12):  # the burst goes on while gpuaas is down
        core.create_namespaced_pod(ns, gpu_pod(f"burst-{i:02d}", ns, gpus=gpus))
    time.sleep(2)
    assert len(running_on(cluster.api, ns)) <= 12  # nothing was placed blind while the extender was down
    extender.start()
    pods = wait_for(lambda: (r := running_on(cluster.api, ns)) and len(r) == len(sizes) and r, timeout=120,
                    what=f"all {len(sizes)} pods Running after the restart")
    per_node = devices_by_node(pods.values())
    for node, devices in per_node.items():
        assert len(devices) == len(set(devices)), f"GPU double-booked on {node}: {sorted(devices)}"
        assert max(devices) < 8
    assert sum(len(v) for v in per_node.values()) == sum(sizes)


def test_https_extender_configured_from_the_environment(tmp_path):
    """enableHTTPS with the cluster CA: kube-scheduler verifies the extender's certificate and binds through it."""
    port = free_port()
    cluster = LocalCluster(tmp_path / "c", name="tls", scheduler_profiles=[gpuaas_profile("default-scheduler")])
    try:
        cluster.control_plane.start()
        cert, key = issue_serving_cert(cluster.control_plane.pki, "extender", "gpuaas-extender")
        cluster.control_plane.restart_scheduler(
            extenders=[extender_entry(f"https://127.0.0.1:{port}", ca_file=str(cluster.control_plane.pki.ca_cert))],
            profiles=[gpuaas_profile("default-scheduler")])
        cluster.add_pools(parse_pool_spec({"pools": [{"name": "gpu", "count": 2,
                                                      "gpu": {"model": "H100-80GB", "count": 8}}]}))
        ext = extender_process(tmp_path / "c", cluster.kubeconfig, port=port, env={
            "GPUAAS_EXTENDER_TLS__CERT_FILE": str(cert), "GPUAAS_EXTENDER_TLS__KEY_FILE": str(key)})
        ext.start()
        try:
            client.CoreV1Api(cluster.api).create_namespaced_pod("default", gpu_pod("tls-pod", gpus=2))
            wait_for(lambda: pod_phase(cluster.api, "default", "tls-pod") == "Running", what="pod Running")
            devices = pod(cluster.api, "default", "tls-pod").metadata.annotations[DEVICES_ANNOTATION].split(",")
            assert len(set(devices)) == 2  # bound by the extender over HTTPS
        finally:
            ext.stop()
    finally:
        cluster.down()


def test_the_extenders_service_account_cannot_delete_pods(gpu_cluster, ns):
    cluster, _ = gpu_cluster
    client.CoreV1Api(cluster.api).create_namespaced_pod(ns, gpu_pod("keep-me", ns, gpus=1))
    as_extender = client.CoreV1Api(api_client(cluster.extender_kubeconfig))
    assert as_extender.read_namespaced_pod("keep-me", ns).metadata.name == "keep-me"  # it may read pods
    with pytest.raises(ApiException) as err:
        as_extender.delete_namespaced_pod("keep-me", ns)
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        as_extender.patch_node("a100-0000", {"metadata": {"labels": {"x": "y"}}})
    assert err.value.status == 403

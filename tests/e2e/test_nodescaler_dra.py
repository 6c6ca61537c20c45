"""A DRA node group grown from zero and shrunk back on the real control plane (issue 16; docs/devices.md, "DRA mode";
docs/node-autoscaling.md): kube-apiserver, kube-controller-manager and kube-scheduler v1.36.3 (its default
configuration) with KWOK nodes, `gpuaas gangs` allocating the claims (its webhook gates the pods) and `gpuaas
nodescaler` with the KWOK provider, each under the ServiceAccount deploy/ ships.

The group `dra` (4 A100s per node, two of them offering 3g.40gb partitions) starts with no node. Three pods ask through
ResourceClaimTemplates, as a user writes them: a whole GPU, a 3g.40gb MIG partition, a 250/1000 share. The node scaler
reads what the held pods' templates ask and grows the group by one node (one node holds all three); the fake node
agent publishes the node's ResourceSlices at its ready time (standing in for the NVIDIA DRA driver's kubelet plugin,
which no KWOK node runs); the gang controller allocates the claims there and releases the pods, kube-scheduler binds
them, and they run. Deleting them frees the node: the node scaler drains and removes it, and its slices go with it."""
from __future__ import annotations

import time

import pytest
import yaml
from kubernetes import client

from gpuaas.cluster.components import nodescaler_process
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.migmanager import FakeNodeAgent
from gpuaas.cluster.webhooks import gangs_webhook_registered
from gpuaas.workloads import dra_claim_template, dra_pod_for_demand
from runtime.pools import parse_pool_spec
from scoring.dra import DRIVER
from scoring.model import MILLI, PodDemand
from tests.deploy.manifests import DEPLOY

from .kube import wait_for
from .nodegroups import group_nodes
from .test_dra_allocation import Gangs

DRA = {"dra": True, "gpu": {"model": "A100-80GB", "count": 4, "mig": "all-3g.40gb", "migGPUs": 2},
       "cpu": "64", "memory": "512Gi"}
POOLS = {"pools": [{"name": "dra", "count": 0, **DRA,
                    "autoscale": {"minSize": 0, "maxSize": 3, "costPerHour": 10, "provisioningDelaySeconds": 2}}]}
PODS = {"whole": PodDemand(1000, 1024, gpus=1, gpu_milli=MILLI),
        "mig": PodDemand(1000, 1024, gpus=1, gpu_milli=MILLI, mig_profile="3g.40gb"),
        "share": PodDemand(1000, 1024, gpus=1, gpu_milli=250)}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("nodescaler-dra")
    cluster = LocalCluster(workdir, name="ns-dra")
    gangs = agent = scaler = None
    try:
        cluster.up(parse_pool_spec(POOLS), timeout=120)
        gangs = Gangs(cluster, workdir).start()
        agent = FakeNodeAgent(cluster.api).start()
        cfg = {"interval_s": 1,
               "groups": [{"name": "dra", "template": DRA, "min_size": 0, "max_size": 3, "provisioning_delay_s": 2,
                           "max_provision_s": 120, "cost_per_hour": 10}],
               "scale_in": {"unneeded_s": 3, "delay_after_add_s": 0, "eviction_retry_s": 0.5, "max_drain_s": 60},
               "leader_election": {"namespace": "gpuaas-system", "name": "gpuaas-nodescaler", "lease_duration_s": 4,
                                   "renew_deadline_s": 3, "retry_period_s": 0.5}}
        (workdir / "nodescaler-dra.yaml").write_text(yaml.safe_dump(cfg))
        kubeconfig = cluster.service_account_kubeconfig(DEPLOY / "bases" / "nodescaler", "gpuaas-nodescaler")
        scaler = nodescaler_process(workdir, kubeconfig, workdir / "nodescaler-dra.yaml", name="ns-dra")
        scaler.start(timeout=60)
        with gangs_webhook_registered(cluster.api, cluster.control_plane.pki, gangs.port):
            yield cluster, scaler
    finally:
        for part in (scaler, agent, gangs):
            if part is not None:
                part.stop()
        refused = gangs.refused() if gangs is not None else []
        refused += [x for log in (workdir / "logs").glob("ns-dra*.log")
                    for x in log.read_text(errors="replace").splitlines() if "forbidden" in x]
        cluster.down()
        print(f"\ncontrol-plane logs kept in {cluster.control_plane.logs}")
    assert not refused, "\n".join(refused[:10])


def claim_of(api, ns: str, pod: str) -> dict:
    p = client.CoreV1Api(api).read_namespaced_pod(pod, ns)
    [status] = p.status.resource_claim_statuses
    return client.ApiClient().sanitize_for_serialization(
        client.ResourceV1Api(api).read_namespaced_resource_claim(status.resource_claim_name, ns))


def test_claim_pods_grow_a_dra_group_from_zero_run_there_and_the_node_goes_with_them(env):
    cluster, _scaler = env
    core = client.CoreV1Api(cluster.api)
    resource = client.ResourceV1Api(cluster.api)
    ns = f"nsd-{time.monotonic_ns() % 10**8}"
    core.create_namespace({"metadata": {"name": ns}})
    assert group_nodes(cluster.api, "dra") == []
    start = time.monotonic()
    for name, demand in PODS.items():
        resource.create_namespaced_resource_claim_template(ns, dra_claim_template(demand, ns))
        core.create_namespaced_pod(ns, dra_pod_for_demand(name, ns, demand))

    def running() -> dict:
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running"}
        return pods if len(pods) == len(PODS) else {}

    pods = wait_for(running, timeout=180, what="the three claim pods Running on a node the node scaler added")
    took = time.monotonic() - start
    nodes = group_nodes(cluster.api, "dra")
    assert len(nodes) == 1, [n.metadata.name for n in nodes]  # one node holds all three
    node = nodes[0].metadata.name
    assert {p.spec.node_name for p in pods.values()} == {node}
    assert not [r for r in nodes[0].status.allocatable if r.startswith("nvidia.com/")]  # its GPUs are slices only
    slices = [s for s in resource.list_resource_slice().items if s.spec.node_name == node]
    assert slices and all(s.metadata.owner_references[0].name == node for s in slices)
    # The claims are allocated there by gpuaas, each on the kind of device it asked for.
    results = {}
    for name in PODS:
        c = claim_of(cluster.api, ns, name)
        [r] = c["status"]["allocation"]["devices"]["results"]
        assert (r["driver"], r["pool"]) == (DRIVER, node), c
        assert c["status"]["reservedFor"][0]["name"] == name
        results[name] = r
    assert results["whole"]["device"].startswith("gpu-") and results["whole"]["device"].count("-") == 1
    assert "-mig-3g40gb-" in results["mig"]["device"]
    assert results["share"]["device"].endswith("-shared") and results["share"]["consumedCapacity"]["share"] == "250"
    devices = {r["device"].split("-")[1] for r in results.values()}
    assert len(devices) == 3, results  # three different GPUs: whole, partitioned, shared
    time.sleep(3)  # a few more reconciles: nothing more is grown for pods that all run
    assert len(group_nodes(cluster.api, "dra")) == 1
    print(f"\nthree claim pods Running {took:.1f} s after creation, on one new node {node}")

    start = time.monotonic()
    for name in PODS:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    wait_for(lambda: not group_nodes(cluster.api, "dra"), timeout=120, what="the idle DRA node drained and removed")
    print(f"node removed {time.monotonic() - start:.1f} s after its pods were deleted")
    wait_for(lambda: not [s for s in resource.list_resource_slice().items if s.spec.node_name == node], timeout=60,
             what="the removed node's ResourceSlices garbage-collected")

"""The node scaler's clusterapi provider against the real Cluster API core manager (sigs.k8s.io/cluster-api v1.14.2:
the MachineDeployment, MachineSet and Machine controllers; built by scripts/build-capi.sh) on a real control plane.
The infrastructure provider is the one fake (gpuaas/cluster/clusterapi.py: KWOKMachines become kwok Nodes).

gpuaas plans (which group, how many nodes) and raises a MachineDeployment's replicas through `/scale`; Cluster API
creates the Machines, the fake infra the Nodes, Cluster API links them (nodeRef); kube-scheduler binds the pods. When
the load goes, gpuaas drains the idle nodes through the Eviction API (a PodDisruptionBudget checked continuously),
marks their Machines and lowers replicas: exactly the drained Machines go. A Machine whose infrastructure reports it
cannot be launched backs its group off and the next group grows. MIG repartitioning works on these nodes as on any.
A MachineDeployment opted in by label and annotated as cluster-autoscaler reads it is a group without being typed.

The number of 8-GPU pods is GPUAAS_E2E_CAPI_PODS (default 12)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from gpuaas.cluster.clusterapi import create_cluster, machine_deployment, machine_template, start_capi
from gpuaas.cluster.components import ComponentProcess, nodescaler_process
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.migmanager import FakeNodeAgent
from gpuaas.workloads import gpu_deployment, gpu_pod
from nodescaler.clusterapi import COST_ANNOTATION, DELETE_MACHINE, MAX_SIZE, MIN_SIZE
from nodescaler.config import NodeGroupConfig
from nodescaler.snapshot import DRAIN_ANNOTATION
from scoring.kubeobjects import POOL_LABEL
from tests.deploy.manifests import DEPLOY
from tests.nodescaler.checks import NodeDeletionWatch, PdbWatch

from .kube import wait_for
from .nodegroups import group_nodes, only_groups, pdb, running

PODS = int(os.environ.get("GPUAAS_E2E_CAPI_PODS", "12"))
NS, CLUSTER = "fleet", "gpu"  # where the Cluster and the MachineDeployments live
A100X8 = {"gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"}
H100X8 = {"gpu": {"model": "H100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"}
MIG = {"gpu": {"model": "A100-80GB", "count": 8, "mig": "all-1g.10gb"}, "cpu": "128", "memory": "1Ti"}
CA = "capacity.cluster-autoscaler.kubernetes.io/"


def cgroup(name: str, template: dict, cost: float, **kw) -> dict:
    # Room for every pod in the cheapest group: the scale-in check counts that group's Machines.
    return {"name": name, "template": template, "max_size": max(40, PODS), "cost_per_hour": cost,
            "max_provision_s": 120, "provider": "clusterapi",
            "clusterapi": {"namespace": NS, "machine_deployment": f"md-{name}"}, **kw}


GROUPS = {
    "a100x8": cgroup("a100x8", A100X8, 20),
    "h100x8": cgroup("h100x8", H100X8, 32),
    "nocap": cgroup("nocap", A100X8, 5),  # its infrastructure is out of capacity
    "backup": cgroup("backup", A100X8, 25),
    "mig": cgroup("mig", MIG, 20),
}
FAILING = {"nocap": "InsufficientCapacity: no gpu-a100x8 left in zone local-a"}


def config(groups: list[str], **over) -> dict:
    base = {
        "interval_s": 1,
        "groups": [GROUPS[g] for g in groups],
        "scale_in": {"unneeded_s": 2, "delay_after_add_s": 4, "max_concurrent_drains": 40, "eviction_retry_s": 0.5,
                     "max_drain_s": 120},
        "leader_election": {"namespace": "gpuaas-system", "name": "gpuaas-nodescaler"},
    }
    base.update(over)
    return base


def nodescaler(workdir: Path, kubeconfig: Path, cfg: dict, name: str) -> ComponentProcess:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return nodescaler_process(workdir, kubeconfig, path, identity=name, name=name)


def create_md(api, name: str, group: NodeGroupConfig, *, failure: str | None = None, labels=None, annotations=None):
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object("infrastructure.gpuaas.io", "v1alpha1", NS, "kwokmachinetemplates",
                                           machine_template(name, NS, group, failure=failure))
    custom.create_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", NS, "machinedeployments",
                                           machine_deployment(name, NS, CLUSTER, name, labels=labels,
                                                              annotations=annotations))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("capi")
    cluster = LocalCluster(workdir, name="capi")
    agent = None
    try:
        cluster.up()
        if cluster.control_plane.tools.capi is None:
            pytest.fail("Cluster API's core manager is not built: run scripts/setup.sh")
        t0 = time.monotonic()
        capi = start_capi(cluster.control_plane)
        print(json.dumps({"capi_ready_s": round(time.monotonic() - t0, 1)}))
        client.CoreV1Api(cluster.api).create_namespace({"metadata": {"name": NS}})
        create_cluster(cluster.api, cluster.control_plane, CLUSTER, NS)
        for name, g in GROUPS.items():
            group = NodeGroupConfig.model_validate(g)
            create_md(cluster.api, f"md-{name}", group, failure=FAILING.get(name))
        # The node scaler runs with exactly the permissions deploy/bases/nodescaler grants.
        cluster.sa_kubeconfig = cluster.service_account_kubeconfig(DEPLOY / "bases" / "nodescaler",
                                                                   "gpuaas-nodescaler")
        agent = FakeNodeAgent(cluster.api).start()
        yield cluster, workdir, capi, agent
    finally:
        if agent:
            agent.stop()
        cluster.down()
        print(f"\nlogs kept in {cluster.control_plane.logs}")


@pytest.fixture
def ns(env):
    cluster = env[0]
    name = f"c-{time.monotonic_ns() % 10**8}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def machines(api, md: str) -> list[dict]:
    raw = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta2", NS, "machines", label_selector=f"cluster.x-k8s.io/deployment-name={md}",
        _preload_content=False)
    return json.loads(raw.data)["items"]


def replicas(api, md: str) -> int:
    return client.CustomObjectsApi(api).get_namespaced_custom_object_scale(
        "cluster.x-k8s.io", "v1beta2", NS, "machinedeployments", md)["spec"].get("replicas", 0)  # 0: omitted






def test_eight_gpu_pods_scale_the_machinedeployment_and_scale_in_removes_exactly_the_drained_machines(env, ns):
    cluster, workdir, _, _ = env
    api = cluster.api
    apps = client.AppsV1Api(api)
    deletions = NodeDeletionWatch(api).start()
    pdbs = PdbWatch(api, ns).start()
    scaler = nodescaler(workdir, cluster.sa_kubeconfig, config(["a100x8", "h100x8"]), "cs-main")
    scaler.start(timeout=60)
    try:
        big = gpu_deployment("big", ns, replicas=PODS, gpus=8)
        only_groups(big["spec"]["template"]["spec"], "a100x8", "h100x8")
        t0 = time.monotonic()
        apps.create_namespaced_deployment(ns, big)
        wait_for(lambda: running(api, ns, "app=big") == PODS, timeout=120 + 6 * PODS, interval=0.5,
                 what=f"{PODS} big pods Running")
        scale_out_s = time.monotonic() - t0

        def linked():
            # Cluster API sets each Machine's nodeRef once it finds the node by provider ID, and annotates the node
            # with its Machine in the same or a later reconcile (a clean-clone run read the node in between).
            ms = machines(api, "md-a100x8")
            if len(ms) != PODS or not all((m.get("status") or {}).get("nodeRef") for m in ms):
                return None
            machine_of = {n.metadata.name: (n.metadata.annotations or {}).get("cluster.x-k8s.io/machine")
                          for n in group_nodes(api, "a100x8")}
            return ms if all(machine_of.get(m["status"]["nodeRef"]["name"]) for m in ms) else None

        made = wait_for(linked, timeout=60, interval=1, what="every Machine linked to its node")
        assert replicas(api, "md-a100x8") == PODS, "the MachineDeployment was scaled to one node per 8-GPU pod"
        assert replicas(api, "md-h100x8") == 0 and group_nodes(api, "h100x8") == [], "only the cheapest group grows"
        nodes = {n.metadata.name: n for n in group_nodes(api, "a100x8")}
        assert len(nodes) == PODS
        node_of = {m["metadata"]["name"]: m["status"]["nodeRef"]["name"] for m in made}
        for m in made:
            node = nodes[node_of[m["metadata"]["name"]]]
            assert node.spec.provider_id == m["spec"]["providerID"]
            assert node.metadata.annotations["cluster.x-k8s.io/machine"] == m["metadata"]["name"]
        assert 'gpuaas_nodescaler_nodes_added_total{group="a100x8"}' in scaler_metrics(scaler)
        print(json.dumps({"pods": PODS, "pending_to_all_running_s": round(scale_out_s, 1), "machines": len(made)}))

        # 8 CPU pods spread over the new nodes under a PodDisruptionBudget (at most one down).
        svc = gpu_deployment("svc", ns, replicas=8, gpus=0, cpu="100m")
        svc["spec"]["template"]["spec"]["nodeSelector"] = {POOL_LABEL: "a100x8"}
        svc["spec"]["template"]["spec"]["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": "svc"}}}]
        apps.create_namespaced_deployment(ns, svc)
        client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(ns, pdb(ns, "svc", 7))
        wait_for(lambda: running(api, ns, "app=svc") == 8, timeout=60, what="8 svc pods Running")
        wait_for(lambda: "svc" in pdbs.armed, timeout=30, what="the PDB checker armed")

        # The load goes: idle nodes drained by gpuaas, their Machines marked, replicas lowered.
        t1 = time.monotonic()
        apps.patch_namespaced_deployment_scale("big", ns, {"spec": {"replicas": 0}})

        def settled():
            ms = machines(api, "md-a100x8")
            n = len(group_nodes(api, "a100x8"))
            return n <= 1 and len(ms) == n and replicas(api, "md-a100x8") == n \
                and running(api, ns, "app=svc") == 8 and not deletions.open_drains()

        wait_for(settled, timeout=120 + 6 * PODS, interval=1, what="md-a100x8 down to the node the svc pods need")
        scale_in_s = time.monotonic() - t1
    finally:
        scaler.stop()
        pdbs.stop()
        deletions.stop()
    outcomes = list(deletions.drains.values())
    left = machines(api, "md-a100x8")
    print(json.dumps({"scale_in_s": round(scale_in_s, 1), "drains": len(outcomes),
                      "deleted_after_drain": sum(1 for _, o in outcomes if o == "deleted"),
                      "machines_left": len(left), "pdb_min_healthy": pdbs.min_seen.get("svc")}))
    deletions.assert_ok()  # no node deleted with a pod bound to it
    pdbs.assert_ok()  # the budget never broken, polled every 0.1 s
    drained = {n for n, o in outcomes if o == "deleted"}
    assert set(deletions.deleted) <= drained, "every node removed went through a gpuaas drain first"
    gone_machines = {m for m, n in node_of.items() if n in drained}
    assert {m["metadata"]["name"] for m in left} == set(node_of) - gone_machines, \
        "exactly the drained machines went: no other was removed, none replaced"
    assert all(DELETE_MACHINE not in (m["metadata"].get("annotations") or {}) for m in left)
    assert len(gone_machines) == PODS - len(left)
    assert pdbs.polls_between(t1, time.monotonic()) > 10
    assert running(api, ns, "app=svc") == 8, "no pod lost"
    assert all(DRAIN_ANNOTATION not in (n.metadata.annotations or {}) for n in group_nodes(api, "a100x8"))


def scaler_metrics(proc: ComponentProcess) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{proc.url}/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_a_machine_its_infrastructure_cannot_launch_backs_the_group_off_and_the_next_group_grows(env, ns):
    """`nocap` (5/h): its KWOKMachines report Ready False, InsufficientCapacity (mirrored into the Machine's
    InfrastructureReady): gpuaas backs the group off and withdraws the Machine (replicas back to 0); `backup` (25/h)
    serves the pod."""
    cluster, workdir, _, _ = env
    api = cluster.api
    core = client.CoreV1Api(api)
    cfg = config(["nocap", "backup"], scale_in={"enabled": False}, scale_out={"backoff_initial_s": 600})
    scaler = nodescaler(workdir, cluster.sa_kubeconfig, cfg, "cs-fail")
    scaler.start(timeout=60)
    try:
        p = gpu_pod("p", ns, gpus=8)
        only_groups(p["spec"], "nocap", "backup")
        core.create_namespaced_pod(ns, p)
        wait_for(lambda: running(api, ns) == 1, timeout=180, interval=0.5, what="the pod Running on a backup node")
        node = core.read_namespaced_pod("p", ns).spec.node_name
        assert core.read_node(node).metadata.labels[POOL_LABEL] == "backup"
        assert "group nocap backs off for 600s: a launch failed" in scaler.log.read_text()
        wait_for(lambda: replicas(api, "md-nocap") == 0 and not machines(api, "md-nocap"), timeout=60,
                 what="the failed Machine withdrawn, md-nocap back to 0 replicas")
        assert group_nodes(api, "nocap") == []
        events = [e for e in core.list_namespaced_event(NS, field_selector="reason=LaunchFailed").items
                  if e.involved_object.kind == "Machine"]
        assert events and "InsufficientCapacity" in events[0].message, [e.message for e in events]
        print(json.dumps({"launch_failure": events[0].message}))
    finally:
        scaler.stop()
        core.delete_namespaced_pod("p", ns, grace_period_seconds=0)
        client.CustomObjectsApi(api).patch_namespaced_custom_object_scale(
            "cluster.x-k8s.io", "v1beta2", NS, "machinedeployments", "md-backup", {"spec": {"replicas": 0}})


def test_mig_nodes_from_cluster_api_are_repartitioned_for_mig_pods_instead_of_scaling(env, ns):
    cluster, workdir, _, agent = env
    api = cluster.api
    core = client.CoreV1Api(api)
    scaler = nodescaler(workdir, cluster.sa_kubeconfig, config(["mig"], scale_in={"enabled": False}), "cs-mig")
    scaler.start(timeout=60)
    try:
        first = gpu_pod("m1", ns, mig="1g.10gb")
        only_groups(first["spec"], "mig")
        core.create_namespaced_pod(ns, first)
        wait_for(lambda: running(api, ns) == 1, timeout=120, interval=0.5, what="m1 Running on a Cluster API node")
        (node,) = [n.metadata.name for n in group_nodes(api, "mig")]
        core.delete_namespaced_pod("m1", ns, grace_period_seconds=0)
        wait_for(lambda: not core.list_namespaced_pod(ns).items, timeout=60, what="m1 gone")
        for i in range(6):
            p = gpu_pod(f"m3-{i}", ns, mig="3g.40gb")
            only_groups(p["spec"], "mig")
            core.create_namespaced_pod(ns, p)
        wait_for(lambda: running(api, ns) == 6, timeout=120, interval=0.5, what="6 MIG 3g.40gb pods Running")
        assert [n.metadata.name for n in group_nodes(api, "mig")] == [node]
        assert replicas(api, "md-mig") == 1 and len(machines(api, "md-mig")) == 1
        assert core.read_node(node).metadata.labels["nvidia.com/mig.config"] == "all-3g.40gb"
        assert any(a[0] == node and a[1] == "all-3g.40gb" and a[2] == "success" for a in agent.applied)
    finally:
        scaler.stop()


def test_an_annotated_machinedeployment_is_discovered_and_one_without_the_opt_in_label_is_never_touched(env, ns):
    """Discovery reads cluster-autoscaler's annotations from a MachineDeployment labelled gpuaas.io/node-group; an
    identically annotated one without that label (cluster-autoscaler's, say) is cheaper and stays at 0 replicas."""
    cluster, workdir, _, _ = env
    api = cluster.api
    core = client.CoreV1Api(api)
    ann = {MIN_SIZE: "0", MAX_SIZE: "3", CA + "cpu": "128", CA + "memory": "1Ti", CA + "gpu-count": "8",
           CA + "gpu-type": "nvidia.com/gpu", CA + "labels": "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"}
    group = NodeGroupConfig.model_validate(cgroup("found", H100X8, 9))
    create_md(api, "md-found", group, labels={"gpuaas.io/node-group": "found"},
              annotations={**ann, COST_ANNOTATION: "9"})
    create_md(api, "md-ca", NodeGroupConfig.model_validate(cgroup("ca", H100X8, 1)),
              annotations={**ann, COST_ANNOTATION: "1"})
    cfg = config([], clusterapi_discovery={"enabled": True, "namespaces": [NS]}, scale_in={"enabled": False})
    scaler = nodescaler(workdir, cluster.sa_kubeconfig, cfg, "cs-discover")
    scaler.start(timeout=60)
    try:
        p = gpu_pod("d", ns, gpus=8)
        only_groups(p["spec"], "found", "ca")
        core.create_namespaced_pod(ns, p)
        wait_for(lambda: running(api, ns) == 1, timeout=120, interval=0.5, what="the pod Running")
        node = core.read_node(core.read_namespaced_pod("d", ns).spec.node_name)
        assert node.metadata.labels[POOL_LABEL] == "found"
        assert replicas(api, "md-found") == 1 and replicas(api, "md-ca") == 0 and not machines(api, "md-ca")
        assert "node groups: found" in scaler.log.read_text()
    finally:
        scaler.stop()
        core.delete_namespaced_pod("d", ns, grace_period_seconds=0)

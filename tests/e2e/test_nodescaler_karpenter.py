"""The node scaler's karpenter provider against the real Karpenter (sigs.k8s.io/karpenter v1.15.0: its core, NodeClaim
lifecycle and termination, with the KWOK cloud provider; built by scripts/build-karpenter.sh) on a real control plane.

gpuaas plans (which group, how many nodes) and creates standalone NodeClaims; Karpenter launches them (the KWOK cloud
provider creates the Node, kwok makes it Ready, Karpenter registers it); kube-scheduler binds the pods. When the load
goes, gpuaas drains the idle nodes through the Eviction API (a PodDisruptionBudget checked continuously) and deletes
their NodeClaims; Karpenter's finalizer removes the nodes. A NodeClaim Karpenter cannot launch backs its group off and
the next group grows. MIG repartitioning works on Karpenter's nodes as on any.

The number of 8-GPU pods is GPUAAS_E2E_KARPENTER_PODS (default 50)."""
from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from gpuaas.cluster.components import ComponentProcess, nodescaler_process
from gpuaas.cluster.karpenter import start_karpenter
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.migmanager import FakeNodeAgent
from gpuaas.workloads import gpu_deployment, gpu_pod
from nodescaler.config import NodeScalerConfig
from nodescaler.provider import PROVIDER_LABEL
from nodescaler.snapshot import DRAIN_ANNOTATION
from scoring.kubeobjects import POOL_LABEL
from tests.deploy.manifests import DEPLOY
from tests.nodescaler.checks import NodeDeletionWatch, PdbWatch

from .kube import wait_for
from .nodegroups import group_nodes, only_groups, pdb, running

PODS = int(os.environ.get("GPUAAS_E2E_KARPENTER_PODS", "50"))
A100X8 = {"gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"}
H100X8 = {"gpu": {"model": "H100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"}
MIG = {"gpu": {"model": "A100-80GB", "count": 8, "mig": "all-1g.10gb"}, "cpu": "128", "memory": "1Ti"}


def kgroup(name: str, template: dict, instance_type: str, cost: float, node_class: str = "boot", **kw) -> dict:
    return {"name": name, "template": template, "max_size": 60, "cost_per_hour": cost, "max_provision_s": 240,
            "provider": "karpenter", "karpenter": {"instance_type": instance_type, "node_class": {"name": node_class}},
            **kw}


# Every group the tests use; Karpenter's instance types are generated from them (all but `notype`'s, whose instance
# type Karpenter does not know).
GROUPS = {
    "a100x8": kgroup("a100x8", A100X8, "gpu-a100x8", 20),
    "h100x8": kgroup("h100x8", H100X8, "gpu-h100x8", 32),
    "notype": kgroup("notype", A100X8, "gpu-unknown", 5),
    "nocls": kgroup("nocls", A100X8, "gpu-a100x8", 10, node_class="missing"),
    "slow": kgroup("slow", A100X8, "gpu-a100x8", 15, node_class="never", max_provision_s=8),
    "backup": kgroup("backup", A100X8, "gpu-a100x8", 25),
    "mig": kgroup("mig", MIG, "gpu-a100-mig", 20),
}
REGISTRATION_DELAY_S = 2  # KWOKNodeClass `boot`: the node registers this long after the launch (an instance boots)


def config(groups: list[str], **over) -> dict:
    base = {
        "interval_s": 1,
        "groups": [GROUPS[g] for g in groups],
        "scale_in": {"unneeded_s": 2, "delay_after_add_s": 4, "max_concurrent_drains": 60, "eviction_retry_s": 0.5,
                     "max_drain_s": 120},
        # The defaults (15 / 10 / 2 s): the apiserver of this loaded machine, with Karpenter and 50 nodes starting, has
        # answered in more than the 1 s that a 4 s lease leaves each write (takeover is tested in test_nodescaler.py).
        "leader_election": {"namespace": "gpuaas-system", "name": "gpuaas-nodescaler"},
    }
    base.update(over)
    return base


def nodescaler(workdir: Path, kubeconfig: Path, cfg: dict, name: str) -> ComponentProcess:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return nodescaler_process(workdir, kubeconfig, path, identity=name, name=name)


def get(proc: ComponentProcess, path: str) -> str:
    with urllib.request.urlopen(f"{proc.url}{path}", timeout=5) as resp:
        return resp.read().decode()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("karpenter")
    cluster = LocalCluster(workdir, name="karp")
    agent = None
    try:
        cluster.up()
        if cluster.control_plane.tools.karpenter is None:
            pytest.fail("Karpenter's KWOK controller is not built: run scripts/setup.sh")
        groups = NodeScalerConfig.model_validate(config([g for g in GROUPS if g != "notype"])).groups
        t0 = time.monotonic()
        karpenter = start_karpenter(cluster.control_plane, groups, api=cluster.api,
                                    node_classes={"boot": REGISTRATION_DELAY_S, "never": 3600})
        print(json.dumps({"karpenter_ready_s": round(time.monotonic() - t0, 1)}))
        # The node scaler runs with exactly the permissions deploy/bases/nodescaler grants.
        cluster.sa_kubeconfig = cluster.service_account_kubeconfig(DEPLOY / "bases" / "nodescaler",
                                                                   "gpuaas-nodescaler")
        agent = FakeNodeAgent(cluster.api).start()
        yield cluster, workdir, karpenter, agent
    finally:
        if agent:
            agent.stop()
        cluster.down()
        print(f"\nlogs kept in {cluster.control_plane.logs}")


@pytest.fixture
def ns(env):
    cluster = env[0]
    name = f"k-{time.monotonic_ns() % 10**8}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def claims(api, group: str | None = None) -> list[dict]:
    sel = f"{PROVIDER_LABEL}=gpuaas-nodescaler" + (f",{POOL_LABEL}={group}" if group else "")
    raw = client.CustomObjectsApi(api).list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims",
                                                                  label_selector=sel, _preload_content=False)
    return json.loads(raw.data)["items"]






def test_eight_gpu_pods_become_nodeclaims_karpenter_launches_and_idle_nodes_go_through_gpuaas_drains(env, ns):
    cluster, workdir, _, _ = env
    api = cluster.api
    apps = client.AppsV1Api(api)
    deletions = NodeDeletionWatch(api).start()
    pdbs = PdbWatch(api, ns).start()
    scaler = nodescaler(workdir, cluster.sa_kubeconfig, config(["a100x8", "h100x8"]), "ks-main")
    scaler.start(timeout=60)
    try:
        # PODS pending 8-GPU pods. Groups: a100x8 (20/h) and h100x8 (32/h), both Karpenter instance types.
        big = gpu_deployment("big", ns, replicas=PODS, gpus=8)
        only_groups(big["spec"]["template"]["spec"], "a100x8", "h100x8")
        t0 = time.monotonic()
        apps.create_namespaced_deployment(ns, big)
        wait_for(lambda: running(api, ns, "app=big") == PODS, timeout=120 + 6 * PODS, interval=0.5,
                 what=f"{PODS} big pods Running")
        scale_out_s = time.monotonic() - t0

        def initialized():  # Karpenter marks a NodeClaim Initialized a moment after its node is Ready
            cs = claims(api)
            return cs if all(any(x["type"] == "Initialized" and x["status"] == "True"
                                 for x in c.get("status", {}).get("conditions", ())) for c in cs) else None

        made = wait_for(initialized, timeout=60, interval=1, what="every NodeClaim Initialized")
        nodes = group_nodes(api, "a100x8")
        assert group_nodes(api, "h100x8") == [] and claims(api, "h100x8") == [], "only the cheapest group grows"
        assert len(made) == PODS and len(nodes) == PODS, "one NodeClaim and one node per 8-GPU pod"
        for c in made:
            spec, labels = c["spec"], c["metadata"]["labels"]
            assert {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["gpu-a100x8"]} \
                in spec["requirements"]
            assert spec["expireAfter"] == "Never" and spec["nodeClassRef"]["kind"] == "KWOKNodeClass"
            assert "karpenter.sh/nodepool" not in labels and labels[POOL_LABEL] == "a100x8"
            conds = {x["type"]: x["status"] for x in c["status"]["conditions"]}
            assert conds["Launched"] == conds["Registered"] == conds["Initialized"] == "True"
        by_claim = {c["metadata"]["name"]: c["status"]["nodeName"] for c in made}
        for n in nodes:  # Karpenter registered each node: it owns it through its NodeClaim
            owners = [o.name for o in n.metadata.owner_references or () if o.kind == "NodeClaim"]
            assert owners and by_claim[owners[0]] == n.metadata.name
            assert n.metadata.labels["node.kubernetes.io/instance-type"] == "gpu-a100x8"
            assert n.metadata.labels["karpenter.sh/registered"] == "true"
        assert 'gpuaas_nodescaler_nodes_added_total{group="a100x8"}' in get(scaler, "/metrics")
        print(json.dumps({"pods": PODS, "pending_to_all_running_s": round(scale_out_s, 1),
                          "nodeclaims": len(made)}))

        # A service of 8 CPU pods spread over the new nodes under a PodDisruptionBudget (at most one down): the nodes
        # it holds are idle for GPUs once the 8-GPU pods go, so its pods move through evictions while they drain.
        svc = gpu_deployment("svc", ns, replicas=8, gpus=0, cpu="100m")
        svc["spec"]["template"]["spec"]["nodeSelector"] = {POOL_LABEL: "a100x8"}
        svc["spec"]["template"]["spec"]["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": "svc"}}}]
        apps.create_namespaced_deployment(ns, svc)
        client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(ns, pdb(ns, "svc", 7))
        wait_for(lambda: running(api, ns, "app=svc") == 8, timeout=60, what="8 svc pods Running")
        wait_for(lambda: "svc" in pdbs.armed, timeout=30, what="the PDB checker armed")
        svc_nodes = {p.spec.node_name for p in client.CoreV1Api(api).list_namespaced_pod(ns, label_selector="app=svc")
                     .items}

        # The load goes. Idle nodes are drained by gpuaas and their NodeClaims deleted; Karpenter removes the nodes.
        t1 = time.monotonic()
        apps.patch_namespaced_deployment_scale("big", ns, {"spec": {"replicas": 0}})

        def settled():
            n, c = len(group_nodes(api, "a100x8")), len(claims(api, "a100x8"))
            return n <= 1 and c == n and running(api, ns, "app=svc") == 8 and not deletions.open_drains()

        wait_for(settled, timeout=120 + 4 * PODS, interval=1, what="a100x8 down to the one node the svc pods need")
        scale_in_s = time.monotonic() - t1
    finally:
        scaler.stop()
        pdbs.stop()
        deletions.stop()
    outcomes = list(deletions.drains.values())
    print(json.dumps({"scale_in_s": round(scale_in_s, 1), "drains": len(outcomes),
                      "deleted_after_drain": sum(1 for _, o in outcomes if o == "deleted"),
                      "svc_nodes": len(svc_nodes), "pdb_min_healthy": pdbs.min_seen.get("svc")}))
    deletions.assert_ok()  # no node deleted with a pod bound to it
    pdbs.assert_ok()  # the budget never broken, polled every 0.1 s
    drained = {n for n, o in outcomes if o == "deleted"}
    gone = set(deletions.deleted)
    assert len(gone) == PODS - 1 and gone <= drained, "every node removed went through a gpuaas drain first"
    assert pdbs.polls_between(t1, time.monotonic()) > 10
    if len(svc_nodes) > 1:  # (kube-scheduler spread them: their pods moved through evictions)
        evictions = client.CoreV1Api(api).list_namespaced_event(ns, field_selector="reason=ScaleDown").items
        assert evictions, "svc pods were evicted (Eviction API, under the PDB) from the nodes being drained"
    assert running(api, ns, "app=svc") == 8, "no pod lost"
    left = group_nodes(api, "a100x8")
    assert all(DRAIN_ANNOTATION not in (n.metadata.annotations or {}) for n in left)


def test_nodeclaims_karpenter_cannot_launch_back_their_group_off_and_the_next_group_grows(env, ns):
    """`notype` (5/h): its instance type is not one Karpenter knows, so the NodeClaim's Launched condition says so
    (Unknown, LaunchFailed) while Karpenter retries: gpuaas withdraws it. `nocls` (10/h): its node class does not
    exist, which the KWOK cloud provider reports as insufficient capacity: Karpenter deletes the NodeClaim. `slow`
    (15/h): launched, but its node class registers nodes after an hour: no node within max_provision_s (8 s), so the
    request expires and gpuaas withdraws the NodeClaim (the rule every provider's requests follow). Each backs its
    group off; `backup` (25/h) serves the pod."""
    cluster, workdir, _, _ = env
    api = cluster.api
    core = client.CoreV1Api(api)
    cfg = config(["notype", "nocls", "slow", "backup"], scale_in={"enabled": False},
                 scale_out={"backoff_initial_s": 600})
    scaler = nodescaler(workdir, cluster.sa_kubeconfig, cfg, "ks-fail")
    scaler.start(timeout=60)
    try:
        p = gpu_pod("p", ns, gpus=8)
        only_groups(p["spec"], "notype", "nocls", "slow", "backup")
        core.create_namespaced_pod(ns, p)
        wait_for(lambda: running(api, ns) == 1, timeout=240, interval=0.5, what="the pod Running on a backup node")
        node = core.read_namespaced_pod("p", ns).spec.node_name
        assert core.read_node(node).metadata.labels[POOL_LABEL] == "backup"
        metrics = get(scaler, "/metrics")
        for g in ("notype", "nocls", "slow"):
            assert f'gpuaas_nodescaler_group_backed_off{{group="{g}"}} 1.0' in metrics, g
        wait_for(lambda: not any(group_nodes(api, g) or claims(api, g) for g in ("notype", "nocls", "slow")),
                 timeout=60, what="no node and no NodeClaim left in the failed groups")
        assert "group slow backs off" in scaler.log.read_text(), "the slow group's request expired"
        events = [e for e in core.list_event_for_all_namespaces(field_selector="reason=LaunchFailed").items
                  if e.involved_object.kind == "NodeClaim"]
        failed = {e.involved_object.name.rsplit("-", 1)[0]: e.message for e in events}
        assert set(failed) == {"notype", "nocls"}, failed
        assert "LaunchFailed" in failed["notype"], failed["notype"]
        print(json.dumps({"launch_failures": failed}))
    finally:
        scaler.stop()
        core.delete_namespaced_pod("p", ns)


def test_mig_nodes_from_karpenter_are_repartitioned_for_mig_pods_instead_of_buying_nodes(env, ns):
    cluster, workdir, _, agent = env
    api = cluster.api
    core = client.CoreV1Api(api)
    cfg = config(["mig"], scale_in={"enabled": False})
    scaler = nodescaler(workdir, cluster.sa_kubeconfig, cfg, "ks-mig")
    scaler.start(timeout=60)
    try:
        # One 1g.10gb pod: a new MIG node (all-1g.10gb) from Karpenter.
        first = gpu_pod("m1", ns, mig="1g.10gb")
        only_groups(first["spec"], "mig")
        core.create_namespaced_pod(ns, first)
        wait_for(lambda: running(api, ns) == 1, timeout=120, interval=0.5, what="m1 Running on a Karpenter node")
        (node,) = [n.metadata.name for n in group_nodes(api, "mig")]
        core.delete_namespaced_pod("m1", ns, grace_period_seconds=0)
        wait_for(lambda: not core.list_namespaced_pod(ns).items, timeout=60, what="m1 gone")
        # Six 3g.40gb pods: no such instance anywhere; the idle node is repartitioned, no NodeClaim added.
        for i in range(6):
            p = gpu_pod(f"m3-{i}", ns, mig="3g.40gb")
            only_groups(p["spec"], "mig")
            core.create_namespaced_pod(ns, p)
        wait_for(lambda: running(api, ns) == 6, timeout=120, interval=0.5, what="6 MIG 3g.40gb pods Running")
        assert [n.metadata.name for n in group_nodes(api, "mig")] == [node] and len(claims(api, "mig")) == 1
        assert core.read_node(node).metadata.labels["nvidia.com/mig.config"] == "all-3g.40gb"
        assert any(a[0] == node and a[1] == "all-3g.40gb" and a[2] == "success" for a in agent.applied)
    finally:
        scaler.stop()


def test_with_a_nodepool_karpenter_consolidates_its_own_empty_node_and_never_gpuaas_nodeclaims(env, ns):
    """Coexistence: a NodePool that consolidates at once (WhenEmptyOrUnderutilized, consolidateAfter 0s) and may use
    the same instance type. Karpenter serves a pod of its own (a label only the NodePool's nodes carry; not a GPU pod,
    so gpuaas leaves it alone) and gpuaas a GPU pod; both pods go. Karpenter removes its empty node; gpuaas's empty
    node stays with its NodeClaim (no karpenter.sh/nodepool label: never a disruption candidate), scale-in being
    gpuaas's (disabled here)."""
    cluster, workdir, _, _ = env
    api = cluster.api
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    scaler = nodescaler(workdir, cluster.sa_kubeconfig, config(["a100x8"], scale_in={"enabled": False}), "ks-pool")
    scaler.start(timeout=60)
    pool = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": f"general-{ns}"}, "spec": {
        "template": {"metadata": {"labels": {"owner": "karpenter"}}, "spec": {
            "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "boot"},
            "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["gpu-a100x8"]}],
            "expireAfter": "Never"}},
        "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"}}}
    ours = None
    try:
        g = gpu_pod("g", ns, gpus=8)
        only_groups(g["spec"], "a100x8")
        core.create_namespaced_pod(ns, g)
        wait_for(lambda: running(api, ns) == 1, timeout=120, interval=0.5, what="the GPU pod Running")
        ours = core.read_namespaced_pod("g", ns).spec.node_name
        custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", pool)
        k = gpu_pod("k", ns, cpu="100m")
        k["spec"]["nodeSelector"] = {"owner": "karpenter"}
        core.create_namespaced_pod(ns, k)
        wait_for(lambda: running(api, ns) == 2, timeout=180, interval=0.5, what="Karpenter's pod Running")
        theirs = core.read_namespaced_pod("k", ns).spec.node_name
        their_claim = next(o.name for o in core.read_node(theirs).metadata.owner_references if o.kind == "NodeClaim")
        assert POOL_LABEL not in (core.read_node(theirs).metadata.labels or {})
        for name in ("g", "k"):
            core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        wait_for(lambda: not core.list_namespaced_pod(ns).items, timeout=60, what="both pods gone")
        t0 = time.monotonic()

        def their_node_gone():
            return not core.list_node(field_selector=f"metadata.name={theirs}").items

        wait_for(their_node_gone, timeout=180, interval=1, what="Karpenter consolidating its own empty node")
        print(json.dumps({"nodepool_node_consolidated_after_s": round(time.monotonic() - t0, 1)}))
        time.sleep(15)  # more disruption passes (Karpenter's loop runs every 10 s)
        node = core.read_node(ours)  # 404 if it went
        assert not node.spec.unschedulable and not node.metadata.deletion_timestamp
        assert [c["metadata"]["name"] for c in claims(api, "a100x8")] == \
            [o.name for o in node.metadata.owner_references if o.kind == "NodeClaim"]
        assert their_claim not in {c["metadata"]["name"] for c in claims(api)}
    finally:
        scaler.stop()
        custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", pool["metadata"]["name"])
        for c in claims(api, "a100x8"):  # leave no node behind for other tests
            custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", c["metadata"]["name"])

"""gpuaas allocating DRA claims on the real control plane (issue 16; docs/devices.md, "DRA mode"): `gpuaas gangs`
under the ServiceAccount and RBAC deploy/bases/gangs ships, its webhook registered as deploy/ registers it,
kube-scheduler v1.36.3 with its default configuration.

Pods are created as users write them (a ResourceClaimTemplate, no gate): the webhook gates them, the controller plans
them on the model of the DRA nodes, writes each claim's finalizer and allocation, and removes the gate; kube-scheduler
only reserves the claims and binds. Asserted: every claim is allocated on exactly the devices gpuaas wrote (its
/claims), with gpuaas's annotation, and the pod runs on that node; a 2-GPU claim constrained to one PCIe root gets
two GPUs of one root, a MIG claim a 3g.40gb partition, a share 250 thousandths with a shareID; no device is ever given
twice; deleting pods frees their devices for the next; a gang's members are all allocated before any runs; a new
controller process rebuilds its state from the claims (a claim a previous run allocated for a still gated pod is kept,
its pod released onto it)."""
from __future__ import annotations

import contextlib
import json
import time
import urllib.request
import uuid
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuaas.cluster.components import extender_process, gangs_process
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.process import free_port
from gpuaas.cluster.webhooks import gangs_webhook_registered, gangs_webhook_settings
from runtime.pools import parse_pool_spec
from scoring.dra import FINALIZER, GPU_CLASS, MIG_CLASS, PCIE_ROOT_ATTRIBUTE, SHARE_CLASS, devices_in_use
from scoring.draclaims import ALLOCATED_FOR_ANNOTATION
from scoring.dramodel import dra_cluster, dra_model
from scoring.gangs import GANG_GATE
from scoring.kubeobjects import node_spec
from scoring.model import ClusterState
from tests.deploy.manifests import DEPLOY, NAMESPACE

from .kube import wait_for

GANGS = DEPLOY / "bases" / "gangs"
POOLS = {"pools": [
    {"name": "dra", "count": 2, "dra": True, "cpu": "64", "memory": "512Gi",
     "gpu": {"model": "A100-80GB", "count": 4, "topology": {"nvlinkDomain": 2, "numaNode": 2}}},
    {"name": "dra-mig", "count": 1, "dra": True, "cpu": "64", "memory": "512Gi",
     "gpu": {"model": "A100-80GB", "count": 2, "mig": "all-balanced"}},
]}
PROFILE = "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
ROOT = [{"matchAttribute": PCIE_ROOT_ATTRIBUTE}]
HOLD = "test.gpuaas.io/hold"  # a gate of another component: gpuaas waits for it


class Gangs:
    """`gpuaas gangs` with the shipped config and RBAC and its webhook on a free port; restartable."""

    def __init__(self, cluster: LocalCluster, workdir):
        self.cluster = cluster
        self.workdir = workdir
        self.kubeconfig = cluster.service_account_kubeconfig(GANGS, "gpuaas-gangs")
        self.port = free_port()
        config = {**yaml.safe_load((GANGS / "gangs-config.yaml").read_text()),
                  "webhook": gangs_webhook_settings(cluster.control_plane.pki, self.port), "interval_s": 1}
        (workdir / "gangs.yaml").write_text(yaml.safe_dump(config))
        self.proc = None
        self.runs = 0

    def start(self):
        self.runs += 1
        self.proc = gangs_process(self.workdir, self.kubeconfig, self.workdir / "gangs.yaml",
                                  name=f"gpuaas-gangs-{self.runs}").start(timeout=60)
        return self

    def stop(self):
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        with contextlib.suppress(ApiException):  # the next process leads at once
            client.CoordinationV1Api(self.cluster.api).delete_namespaced_lease("gpuaas-gangs", NAMESPACE)

    def written(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.proc.url}/claims", timeout=5) as resp:
            return json.loads(resp.read())

    def refused(self) -> list[str]:
        lines = []
        for log in (self.workdir / "logs").glob("gpuaas-gangs-*.log"):
            lines += [x for x in log.read_text(errors="replace").splitlines() if "is forbidden: User" in x]
        return lines


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("dra-allocation")
    cluster = LocalCluster(workdir, name="dra-alloc")
    gangs = None
    try:
        cluster.up(parse_pool_spec(POOLS), timeout=120)
        gangs = Gangs(cluster, workdir).start()
        with gangs_webhook_registered(cluster.api, cluster.control_plane.pki, gangs.port):
            yield cluster, gangs
    finally:
        if gangs is not None:
            gangs.stop()
            refused = gangs.refused()
        cluster.down()
        print(f"\ncontrol-plane logs kept in {cluster.control_plane.logs}")
    assert not refused, "\n".join(refused[:10])


@pytest.fixture
def ns(env):
    cluster, _ = env
    name = f"a-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    for p in core.list_namespaced_pod(name).items:
        core.delete_namespaced_pod(p.metadata.name, name, grace_period_seconds=0)
    resource = client.ResourceV1Api(cluster.api)
    wait_for(lambda: not [c for c in resource.list_namespaced_resource_claim(name).items
                          if c.status and c.status.allocation], timeout=60, what=f"claims of {name} deallocated")
    core.delete_namespace(name)


# -- helpers -----------------------------------------------------------------------------------------------------------

def _data(response: Any) -> Any:
    return json.loads(response.data)


def request(device_class: str, *, count: int = 1, selector: str = "", share: str = "") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if count != 1:
        exactly["count"] = count
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if share:
        exactly["capacity"] = {"requests": {"share": share}}
    return {"name": "gpu", "exactly": exactly}


def template(api, namespace: str, name: str, req: dict[str, Any], constraints=None) -> None:
    devices: dict[str, Any] = {"requests": [req]}
    if constraints:
        devices["constraints"] = constraints
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}}}, _preload_content=False)


def create_pod(api, namespace: str, name: str, *, template_name: str = "", claim: str = "", pool: str = "",
               labels: dict | None = None, annotations: dict | None = None, gates: tuple[str, ...] = ()) -> None:
    source = {"resourceClaimTemplateName": template_name} if template_name else {"resourceClaimName": claim}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox",
                                            "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}],
                            "resourceClaims": [{"name": "gpu", **source}], "tolerations": [{"operator": "Exists"}]}
    if pool:
        spec["nodeSelector"] = {"gpuaas.io/pool": pool}
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    client.CoreV1Api(api).create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "spec": spec,
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}}, _preload_content=False)


def read_pod(api, namespace: str, name: str) -> dict[str, Any]:
    return _data(client.CoreV1Api(api).read_namespaced_pod(name, namespace, _preload_content=False))


def running(api, namespace: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
    return wait_for(lambda: (p := read_pod(api, namespace, name))["status"].get("phase") == "Running" and p,
                    timeout=timeout, what=f"pod {namespace}/{name} running")


def claim_of(api, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    [status] = pod["status"]["resourceClaimStatuses"]
    return _data(client.ResourceV1Api(api).read_namespaced_resource_claim(status["resourceClaimName"], namespace,
                                                                         _preload_content=False))


def all_claims(api) -> list[dict[str, Any]]:
    return _data(client.ResourceV1Api(api).list_resource_claim_for_all_namespaces(_preload_content=False))["items"]


def slices(api) -> list[dict[str, Any]]:
    return _data(client.ResourceV1Api(api).list_resource_slice(_preload_content=False))["items"]


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return claim["status"]["allocation"]["devices"]["results"]


def attribute(api, node: str, device: str, name: str) -> str:
    for s in slices(api):
        if s["spec"]["pool"]["name"] == node:
            for d in s["spec"].get("devices") or ():
                if d["name"] == device:
                    return d["attributes"][name]["string"]
    raise AssertionError(f"{node} publishes no {device}")


def allocated_by_gpuaas(api, gangs: Gangs, namespace: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The running pod and its claim, checked: gpuaas's finalizer and annotation, the devices /claims says gpuaas
    wrote, kube-scheduler's reservation, and the pod on the allocation's node."""
    pod = running(api, namespace, name)
    claim = claim_of(api, namespace, pod)
    key = f"{namespace}/{claim['metadata']['name']}"
    wrote = gangs.written()[key]
    assert FINALIZER in claim["metadata"]["finalizers"]
    assert claim["metadata"]["annotations"][ALLOCATED_FOR_ANNOTATION] == pod["metadata"]["uid"]
    assert results(claim) == wrote["results"]
    assert claim["status"]["allocation"]["allocationTimestamp"] == wrote["allocationTimestamp"]
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [name]
    assert pod["spec"]["nodeName"] == wrote["node"] == results(claim)[0]["pool"]
    return pod, claim


def no_device_given_twice(api) -> None:
    """Over every claim of the cluster: a whole GPU or MIG device in at most one claim, shares within 1000, and the
    model built from them all (gpuaas's own reading) finds nothing held twice."""
    claims = all_claims(api)
    for pool, devices in devices_in_use(claims).items():
        for device, held in devices.items():
            if device.endswith("-shared"):
                assert sum(a.consumed.get("share", 0) for a in held) <= 1000, (pool, device, held)
            else:
                assert len(held) == 1, (pool, device, [a.claim for a in held])
    nodes = {n["metadata"]["name"]: n for n in _data(client.CoreV1Api(api).list_node(_preload_content=False))["items"]}
    base = ClusterState(sorted((node_spec(n) for n in nodes.values()), key=lambda s: s.name))
    published = slices(api)
    assert dra_model(base, nodes, dra_cluster(published, claims), published).errors == []


def delete_pod(api, namespace: str, name: str) -> None:
    core = client.CoreV1Api(api)
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, namespace)
        except ApiException as err:
            return err.status == 404
        return False
    wait_for(gone, timeout=30, what=f"pod {namespace}/{name} deleted")


# -- the tests ---------------------------------------------------------------------------------------------------------

def test_whole_rooted_mig_and_share_claims_land_on_the_devices_gpuaas_allocated(env, ns):
    cluster, gangs = env
    api = cluster.api
    template(api, ns, "one", request(GPU_CLASS))
    template(api, ns, "two-rooted", request(GPU_CLASS, count=2), constraints=ROOT)
    template(api, ns, "mig", request(MIG_CLASS, selector=PROFILE))
    template(api, ns, "share", request(SHARE_CLASS, share="250"))
    started = time.monotonic()
    for name in ("one", "two-rooted", "mig", "share"):
        create_pod(api, ns, name, template_name=name)
    # The webhook gated them at creation (the gate, or its removal by gpuaas, is all kube-scheduler saw).
    _, one = allocated_by_gpuaas(api, gangs, ns, "one")
    [r] = results(one)
    assert r["device"].startswith("gpu-") and r["device"].count("-") == 1
    _, two = allocated_by_gpuaas(api, gangs, ns, "two-rooted")
    node = results(two)[0]["pool"]
    roots = {attribute(api, node, r["device"], PCIE_ROOT_ATTRIBUTE) for r in results(two)}
    assert len(results(two)) == 2 and len({r["device"] for r in results(two)}) == 2 and len(roots) == 1
    _, mig = allocated_by_gpuaas(api, gangs, ns, "mig")
    [r] = results(mig)
    assert r["pool"] == "dra-mig-0000" and "-mig-3g40gb-" in r["device"]
    _, share = allocated_by_gpuaas(api, gangs, ns, "share")
    [r] = results(share)
    assert r["device"].endswith("-shared") and r["shareID"] and r["consumedCapacity"] == {"share": "250",
                                                                                          "memory": "0"}
    print(f"\nfour DRA pods allocated by gpuaas and running in {time.monotonic() - started:.1f} s")
    no_device_given_twice(api)


def test_deleting_pods_frees_their_devices_for_the_next(env, ns):
    """Eight one-GPU pods fill the two 4-GPU nodes; a ninth waits gated, with its reason; deleting one lets it run
    on the device that pod held."""
    cluster, gangs = env
    api = cluster.api
    template(api, ns, "one", request(GPU_CLASS))
    for i in range(8):
        create_pod(api, ns, f"p{i}", template_name="one", pool="dra")
    held = {}
    for i in range(8):
        _, claim = allocated_by_gpuaas(api, gangs, ns, f"p{i}")
        [r] = results(claim)
        held[f"p{i}"] = (r["pool"], r["device"])
    assert len(set(held.values())) == 8
    create_pod(api, ns, "ninth", template_name="one", pool="dra")
    time.sleep(4)
    waiting = read_pod(api, ns, "ninth")
    assert GANG_GATE in [g["name"] for g in waiting["spec"].get("schedulingGates") or ()]
    assert not (claim_of(api, ns, waiting).get("status") or {}).get("allocation")
    delete_pod(api, ns, "p3")
    _, claim = allocated_by_gpuaas(api, gangs, ns, "ninth")
    [r] = results(claim)
    assert (r["pool"], r["device"]) == held["p3"]
    no_device_given_twice(api)


def test_a_gang_s_claims_are_all_allocated_before_any_member_runs(env, ns):
    cluster, gangs = env
    api = cluster.api
    template(api, ns, "four", request(GPU_CLASS, count=4))
    group = {"gpuaas.io/gang": "train"}
    for i in range(2):
        create_pod(api, ns, f"m{i}", template_name="four", labels=group, annotations={"gpuaas.io/gang-size": "2"})
    nodes = set()
    for i in range(2):
        pod, claim = allocated_by_gpuaas(api, gangs, ns, f"m{i}")
        nodes.add(pod["spec"]["nodeName"])
        scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        # Every member's allocation was written before any member was scheduled.
        for j in range(2):
            other = claim_of(api, ns, read_pod(api, ns, f"m{j}"))
            assert other["status"]["allocation"]["allocationTimestamp"] <= scheduled["lastTransitionTime"]
        assert len(results(claim)) == 4
    assert len(nodes) == 2
    no_device_given_twice(api)


def test_a_restarted_controller_rebuilds_its_state_from_the_claims(env, ns):
    """Pods placed by one process stay where they are; a claim allocated for a pod that is still gated (as if the
    process had stopped between the allocation and the release) is kept and its pod released onto it; the pods the
    new process places get other devices."""
    cluster, gangs = env
    api = cluster.api
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    template(api, ns, "one", request(GPU_CLASS))
    for i in range(3):
        create_pod(api, ns, f"before{i}", template_name="one", pool="dra")
    before = {}
    for i in range(3):
        _, claim = allocated_by_gpuaas(api, gangs, ns, f"before{i}")
        before[f"before{i}"] = results(claim)
    taken = {(r["pool"], r["device"]) for rs in before.values() for r in rs}
    # A pod whose claim a stopped run allocated: created while the webhook answers, held meanwhile by a gate of the
    # test's own (gpuaas waits for other components' gates).
    resource.create_namespaced_resource_claim(ns, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "left"},
        "spec": {"devices": {"requests": [request(GPU_CLASS)]}}}, _preload_content=False)
    create_pod(api, ns, "left", claim="left", pool="dra", gates=(HOLD,))
    pod = read_pod(api, ns, "left")
    assert [g["name"] for g in pod["spec"]["schedulingGates"]] == [HOLD, GANG_GATE]
    gangs.stop()
    try:
        free = next((n, f"gpu-{g}") for n in ("dra-0001", "dra-0000") for g in range(3, -1, -1)
                    if (n, f"gpu-{g}") not in taken and not _held(api, n, f"gpu-{g}"))
        claim = _data(resource.read_namespaced_resource_claim("left", ns, _preload_content=False))
        claim["metadata"]["finalizers"] = [FINALIZER]
        claim["metadata"]["annotations"] = {ALLOCATED_FOR_ANNOTATION: pod["metadata"]["uid"]}
        claim = _data(resource.replace_namespaced_resource_claim("left", ns, claim, _preload_content=False))
        claim["status"] = {"allocation": {
            "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": free[0],
                                     "device": free[1]}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [free[0]]}]}]},
            "allocationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
        resource.replace_namespaced_resource_claim_status("left", ns, claim, _preload_content=False)
        core.patch_namespaced_pod("left", ns, [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": HOLD},
                                               {"op": "remove", "path": "/spec/schedulingGates/0"}],
                                  _content_type="application/json-patch+json")
    finally:
        gangs.start()
    for i in range(3):  # (the webhook answers again)
        create_pod(api, ns, f"after{i}", template_name="one", pool="dra")
    left = running(api, ns, "left")
    assert left["spec"]["nodeName"] == free[0]
    assert [(r["pool"], r["device"]) for r in results(
        _data(resource.read_namespaced_resource_claim("left", ns, _preload_content=False)))] == [free]
    after = set()
    for i in range(3):
        _, claim = allocated_by_gpuaas(api, gangs, ns, f"after{i}")
        after.update((r["pool"], r["device"]) for r in results(claim))
    assert f"{ns}/left" not in gangs.written()  # kept, not allocated again
    assert len(after) == 3 and not after & (taken | {free})
    for name, rs in before.items():
        assert results(claim_of(api, ns, read_pod(api, ns, name))) == rs
    no_device_given_twice(api)


def _held(api, node: str, device: str) -> bool:
    return bool(devices_in_use(all_claims(api)).get(node, {}).get(device))


def test_what_gpuaas_cannot_allocate_waits_with_its_reason(env, ns):
    cluster, gangs = env
    api = cluster.api
    template(api, ns, "any-mig", request(MIG_CLASS))  # no profile selector
    create_pod(api, ns, "vague", template_name="any-mig")

    def explained() -> str:
        with urllib.request.urlopen(f"{gangs.proc.url}/explain?pod={ns}/vague", timeout=5) as resp:
            error = json.loads(resp.read()).get("error", "")
        return error if "selector" in error else ""  # (first: its claim not generated yet)
    assert "a mig.nvidia.com request needs a selector naming the profile" in wait_for(explained, timeout=20,
                                                                                      what="the reason")
    time.sleep(2)
    assert GANG_GATE in [g["name"] for g in read_pod(api, ns, "vague")["spec"]["schedulingGates"]]


def test_the_extender_sees_dra_usage_under_its_shipped_rbac(env, ns, tmp_path):
    """The extender (scoring/draview.py) under the ServiceAccount and RBAC deploy/bases/extender ships: ready only
    once its ResourceSlice and ResourceClaim watches have synced (list and watch allowed, nothing forbidden in its
    log); its model has the DRA nodes' GPUs from their slices and holds a claim gpuaas allocated while it is
    allocated (its /metrics: gpuaas_extender_cache_objects by kind; what a held claim does to the model's GPUs is
    tests/scoring/test_draview.py's)."""
    cluster, gangs = env
    api = cluster.api
    account = cluster.service_account_kubeconfig(DEPLOY / "bases" / "extender", "gpuaas-extender")
    ext = extender_process(tmp_path, account).start(timeout=90)  # its /readyz counts the DRA watches

    def cache(kind: str) -> float:
        with urllib.request.urlopen(f"{ext.url}/metrics", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(f'gpuaas_extender_cache_objects{{kind="{kind}"}}'):
                    return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no gpuaas_extender_cache_objects for {kind}")

    try:
        assert cache("gpu_nodes") == 3  # the three DRA nodes: GPUs from their slices only (no nvidia.com/gpu)
        held = cache("dra_claims_held")
        template(api, ns, "one", request(GPU_CLASS))
        create_pod(api, ns, "x", template_name="one", pool="dra")
        allocated_by_gpuaas(api, gangs, ns, "x")
        wait_for(lambda: cache("dra_claims_held") == held + 1, timeout=30, what="the claim held in the model")
        delete_pod(api, ns, "x")
        wait_for(lambda: cache("dra_claims_held") == held, timeout=120, what="the claim let go in the model")
    finally:
        ext.stop()
        refused = [x for x in (tmp_path / "logs" / "gpuaas-extender.log").read_text(errors="replace").splitlines()
                   if "forbidden" in x]
        assert not refused, refused[:5]

"""DRA mode on the real control plane (issue 16; docs/devices.md "DRA mode"): the ResourceSlices and DeviceClasses a
pool declared `dra: true` publishes, claims kube-scheduler v1.36.3 allocates on them by itself (whole GPUs, MIG
partitions, GPU shares) and kube-controller-manager deallocates, and claims allocated before scheduling by another
client, as gpuaas would: what kube-scheduler honours and what it does not check.

The cluster is this module's own, with kube-scheduler's default configuration (no extender): these pods meet only
its DynamicResources plugin. Its DRA pools are small so that its first-fit choices are known."""
from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuaas.cluster.local import LocalCluster
from runtime.pools import parse_pool_spec
from scoring.dra import (
    DRA_LABEL,
    DRIVER,
    FINALIZER,
    GPU_CLASS,
    MIG_CLASS,
    SHARE_CLASS,
    devices_in_use,
    dra_node,
    dra_node_spec,
    gpu_usage,
)

from .kube import wait_for

POOLS = {"pools": [
    {"name": "dra", "count": 2, "dra": True, "gpu": {"model": "A100-80GB", "count": 4}, "cpu": "64", "memory": "512Gi"},
    {"name": "dra-mig", "count": 1, "dra": True, "gpu": {"model": "A100-80GB", "count": 2, "mig": "all-balanced"},
     "cpu": "64", "memory": "512Gi"},
    {"name": "plugin", "count": 1, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "64", "memory": "512Gi"},
]}


@pytest.fixture(scope="module")
def dra_cluster(tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("dra-cluster"), name="dra")
    try:
        cluster.up(parse_pool_spec(POOLS), timeout=120)
        yield cluster
    finally:
        cluster.down()
        print(f"\ncontrol-plane logs kept in {cluster.control_plane.logs}")


@pytest.fixture
def ns(dra_cluster):
    name = f"d-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(dra_cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    for p in core.list_namespaced_pod(name).items:
        core.delete_namespaced_pod(p.metadata.name, name, grace_period_seconds=0)
    core.delete_namespace(name)
    # The next test starts from free devices: every claim of the namespace gone, allocations with them.
    resource = client.ResourceV1Api(dra_cluster.api)
    wait_for(lambda: not resource.list_namespaced_resource_claim(name).items, timeout=60,
             what=f"claims of {name} deleted")


# -- helpers -----------------------------------------------------------------------------------------------------------

def _data(response: Any) -> Any:
    return json.loads(response.data)


def slices(api) -> list[dict[str, Any]]:
    return _data(client.ResourceV1Api(api).list_resource_slice(_preload_content=False))["items"]


def claims(api, namespace: str | None = None) -> list[dict[str, Any]]:
    resource = client.ResourceV1Api(api)
    if namespace is None:
        return _data(resource.list_resource_claim_for_all_namespaces(_preload_content=False))["items"]
    return _data(resource.list_namespaced_resource_claim(namespace, _preload_content=False))["items"]


def read_claim(api, namespace: str, name: str) -> dict[str, Any]:
    return _data(client.ResourceV1Api(api).read_namespaced_resource_claim(name, namespace, _preload_content=False))


def request(name: str, device_class: str, *, count: int = 1, selector: str = "",
            capacity: dict[str, str] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if count != 1:
        exactly["count"] = count
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exactly}


def create_template(api, namespace: str, name: str, *requests: dict[str, Any]) -> None:
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": list(requests)}}}}, _preload_content=False)


def create_claim(api, namespace: str, name: str, *requests: dict[str, Any], finalizer: bool = False) -> None:
    meta: dict[str, Any] = {"name": name}
    if finalizer:
        meta["finalizers"] = [FINALIZER]
    client.ResourceV1Api(api).create_namespaced_resource_claim(namespace, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
        "spec": {"devices": {"requests": list(requests)}}}, _preload_content=False)


def create_pod(api, namespace: str, name: str, *, template: str = "", claim: str = "", gated: bool = False,
               node_pool: str = "") -> None:
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}],
                            "resourceClaims": [{"name": "gpu", **source}],
                            "tolerations": [{"operator": "Exists"}]}
    if gated:
        spec["schedulingGates"] = [{"name": "gpuaas.io/dra"}]
    if node_pool:
        spec["nodeSelector"] = {"gpuaas.io/pool": node_pool}
    client.CoreV1Api(api).create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod",
                                                            "metadata": {"name": name}, "spec": spec},
                                                _preload_content=False)


def running_node(api, namespace: str, name: str, timeout: float = 30.0) -> str:
    core = client.CoreV1Api(api)

    def probe() -> str:
        p = core.read_namespaced_pod(name, namespace)
        return p.spec.node_name if p.status.phase == "Running" else ""
    return wait_for(probe, timeout=timeout, what=f"pod {namespace}/{name} running")


def pod_claim(api, namespace: str, name: str) -> dict[str, Any]:
    """The claim a pod's `gpu` entry resolved to (a template's generated claim, or the named one)."""
    core = client.CoreV1Api(api)

    def probe() -> str:
        p = core.read_namespaced_pod(name, namespace)
        for entry in p.spec.resource_claims or ():
            if entry.resource_claim_name:
                return entry.resource_claim_name
        for status in p.status.resource_claim_statuses or ():
            if status.resource_claim_name:
                return status.resource_claim_name
        return ""
    return read_claim(api, namespace, wait_for(probe, timeout=30, what=f"claim of pod {namespace}/{name}"))


def results(claim: dict[str, Any]) -> list[tuple[str, str]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [(r["pool"], r["device"]) for r in allocation.get("devices", {}).get("results", [])]


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


def allocate(api, namespace: str, name: str, node: str, device: str, request_name: str = "gpu", *,
             timestamp: bool = True, finalizer: bool = True) -> None:
    """Write a claim's allocation as an allocator other than kube-scheduler would (gpuaas in DRA mode): the
    finalizer first (a metadata update), then status.allocation with the node's selector."""
    resource = client.ResourceV1Api(api)
    claim = read_claim(api, namespace, name)
    if finalizer and FINALIZER not in claim["metadata"].get("finalizers", []):
        claim["metadata"].setdefault("finalizers", []).append(FINALIZER)
        claim = _data(resource.replace_namespaced_resource_claim(name, namespace, claim, _preload_content=False))
    allocation: dict[str, Any] = {
        "devices": {"results": [{"request": request_name, "driver": DRIVER, "pool": node, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
    }
    if timestamp:
        allocation["allocationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    claim["status"] = {"allocation": allocation}
    resource.replace_namespaced_resource_claim_status(name, namespace, claim, _preload_content=False)


def scheduling_messages(api, namespace: str, name: str) -> list[str]:
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}").items
    return [e.message or "" for e in events if e.reason == "FailedScheduling"]


# -- what the cluster publishes ----------------------------------------------------------------------------------------

def test_dra_pools_publish_slices_and_classes(dra_cluster):
    api = dra_cluster.api
    classes = {c["metadata"]["name"]: c for c in
               _data(client.ResourceV1Api(api).list_device_class(_preload_content=False))["items"]}
    assert set(classes) >= {GPU_CLASS, MIG_CLASS, SHARE_CLASS}
    assert classes[MIG_CLASS]["spec"]["selectors"][0]["cel"]["expression"] == \
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    published = slices(api)
    assert {s["spec"]["pool"]["name"] for s in published} == {"dra-0000", "dra-0001", "dra-mig-0000"}
    assert all(s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == s["spec"]["pool"]["name"] and
               s["metadata"]["ownerReferences"][0]["kind"] == "Node" for s in published)
    nodes = {n["metadata"]["name"]: n for n in
             _data(client.CoreV1Api(api).list_node(_preload_content=False))["items"]}
    # Device-plugin and DRA nodes side by side: only the plugin's node advertises nvidia.com/gpu.
    assert nodes["plugin-0000"]["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert "nvidia.com/gpu" not in nodes["dra-0000"]["status"]["allocatable"]
    assert nodes["dra-0000"]["metadata"]["labels"][DRA_LABEL] == "true"
    # Read back by scoring/dra.py as the model of the node: 4 (2) A100s, the MIG node offering partitions.
    dra = dra_node("dra-0000", published)
    assert not dra.incomplete and [g.device for g in dra.gpus] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    spec = dra_node_spec(nodes["dra-0000"], published)
    assert (spec.gpus, spec.gpu_model, spec.mig_layouts) == (4, "A100-80GB", None)
    mig = dra_node("dra-mig-0000", published)
    assert {m.profile for m in mig.gpus[0].migs} == {"1g.10gb", "2g.20gb", "3g.40gb"}
    assert all(m.partition for g in mig.gpus for m in g.migs)


# -- kube-scheduler allocating by itself -------------------------------------------------------------------------------

def test_scheduler_allocates_whole_gpus_mig_and_shares(dra_cluster, ns):
    api = dra_cluster.api
    create_template(api, ns, "one", request("gpu", GPU_CLASS))
    create_template(api, ns, "two", request("gpu", GPU_CLASS, count=2))
    create_template(api, ns, "mig", request("gpu", MIG_CLASS,
                                            selector="device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"))
    create_template(api, ns, "share", request("gpu", SHARE_CLASS, capacity={"share": "600"}))
    create_pod(api, ns, "one", template="one", node_pool="dra")
    node = running_node(api, ns, "one")
    assert results(pod_claim(api, ns, "one")) == [(node, "gpu-0")]  # first fit
    create_pod(api, ns, "two", template="two", node_pool="dra")
    two_node = running_node(api, ns, "two")
    two = results(pod_claim(api, ns, "two"))
    assert len(two) == 2 and {pool for pool, _ in two} == {two_node} and len(set(two)) == 2
    create_pod(api, ns, "mig", template="mig")
    assert running_node(api, ns, "mig") == "dra-mig-0000"
    mig_claim = pod_claim(api, ns, "mig")
    assert results(mig_claim) == [("dra-mig-0000", "gpu-0-mig-3g40gb-9-0")]
    # Two shares of 600 pinned to the MIG node: not both on one GPU (1000 thousandths), and not on gpu-0 (its
    # counters are partly taken by the MIG partition, so its whole device and its shared device are both out).
    create_pod(api, ns, "share-a", template="share", node_pool="dra-mig")
    assert running_node(api, ns, "share-a") == "dra-mig-0000"
    share = pod_claim(api, ns, "share-a")
    [result] = share["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-1-shared" and result["shareID"] and result["consumedCapacity"]["share"] == "600"
    create_pod(api, ns, "share-b", template="share", node_pool="dra-mig")
    time.sleep(3)
    assert client.CoreV1Api(api).read_namespaced_pod("share-b", ns).status.phase == "Pending"
    assert any("cannot allocate all claims" in m for m in scheduling_messages(api, ns, "share-b"))
    # What gpuaas reads of all that: every allocation, by node and GPU.
    in_use = devices_in_use(claims(api, ns))
    usage = gpu_usage(dra_node("dra-mig-0000", slices(api)), in_use)
    assert usage["gpu-1-shared"].share_milli == 600
    assert usage["gpu-0-mig-3g40gb-9-0"].migs[0].profile == "3g.40gb"
    mig_node = _data(client.CoreV1Api(api).read_node("dra-mig-0000", _preload_content=False))
    mig_spec = dra_node_spec(mig_node, slices(api), usage=usage)
    assert mig_spec.mig_layouts == ({"3g.40gb": 1}, None)


def test_deleting_the_pod_deallocates_its_claim(dra_cluster, ns):
    """kube-controller-manager's resourceclaim controller: when the last pod in reservedFor is gone it clears the
    allocation of a claim carrying the delete-protection finalizer, then drops the finalizer; a claim generated from
    a template is deleted with its pod."""
    api = dra_cluster.api
    create_claim(api, ns, "standalone", request("gpu", GPU_CLASS))
    create_pod(api, ns, "user", claim="standalone", node_pool="dra")
    running_node(api, ns, "user")
    claim = read_claim(api, ns, "standalone")
    assert results(claim) and FINALIZER in claim["metadata"]["finalizers"]  # put there by kube-scheduler
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["user"]
    delete_pod(api, ns, "user")
    # kube-controller-manager clears the allocation, then drops the finalizer in a second write: wait for both.
    wait_for(lambda: (c := read_claim(api, ns, "standalone")) and not c.get("status", {}).get("allocation")
             and FINALIZER not in c["metadata"].get("finalizers", []), timeout=90,
             what="the claim deallocated and its finalizer dropped")


# -- claims allocated before scheduling (what gpuaas would do) ---------------------------------------------------------

def test_preallocated_claim_is_honoured(dra_cluster, ns):
    """A claim whose status.allocation another client wrote (finalizer, allocationTimestamp, the node's selector):
    kube-scheduler puts the pod on that node with exactly those devices, adding only reservedFor. The device is
    not first fit (gpu-0 of dra-0000 would be)."""
    api = dra_cluster.api
    create_claim(api, ns, "pinned", request("gpu", GPU_CLASS))
    allocate(api, ns, "pinned", "dra-0001", "gpu-3")
    create_pod(api, ns, "pinned", claim="pinned")
    assert running_node(api, ns, "pinned") == "dra-0001"
    claim = read_claim(api, ns, "pinned")
    assert results(claim) == [("dra-0001", "gpu-3")]
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["pinned"]
    # Its device counts as taken for kube-scheduler's own allocations: a claim for all four GPUs of a node fits
    # dra-0000 only.
    create_template(api, ns, "four", request("gpu", GPU_CLASS, count=4))
    create_pod(api, ns, "four", template="four", node_pool="dra")
    assert running_node(api, ns, "four") == "dra-0000"
    # And it is released as a scheduler-made allocation is, the finalizer being there.
    delete_pod(api, ns, "pinned")
    wait_for(lambda: not read_claim(api, ns, "pinned").get("status", {}).get("allocation"), timeout=30,
             what="the pinned claim deallocated")


def test_gated_pod_claim_allocated_then_ungated(dra_cluster, ns):
    """The flow gpuaas would use for pods written against a ResourceClaimTemplate: the pod is created with a
    scheduling gate, kube-controller-manager generates its claim anyway (pod.status.resourceClaimStatuses names it),
    the allocator writes the allocation, removes the gate, and kube-scheduler binds the pod there."""
    api = dra_cluster.api
    create_template(api, ns, "one", request("gpu", GPU_CLASS))
    create_pod(api, ns, "gated", template="one", gated=True)
    claim = pod_claim(api, ns, "gated")
    assert not results(claim)
    allocate(api, ns, claim["metadata"]["name"], "dra-0001", "gpu-2")
    client.CoreV1Api(api).patch_namespaced_pod("gated", ns, [{"op": "remove", "path": "/spec/schedulingGates"}])
    assert running_node(api, ns, "gated") == "dra-0001"
    assert results(read_claim(api, ns, claim["metadata"]["name"])) == [("dra-0001", "gpu-2")]
    delete_pod(api, ns, "gated")

    def gone() -> bool:
        return not any(c["metadata"]["name"] == claim["metadata"]["name"] for c in claims(api, ns))
    wait_for(gone, timeout=30, what="the generated claim deleted with its pod")


def test_preallocated_claim_without_timestamp_is_not_honoured(dra_cluster, ns):
    """In 1.36 (DRADeviceBindingConditions and DRAResourceClaimDeviceStatus on by default) kube-scheduler's PreBind
    sets status.allocation.allocationTimestamp when it is missing, in the same update that adds reservedFor; the
    allocation being immutable, the apiserver refuses and the pod never binds. An allocator must set the timestamp."""
    api = dra_cluster.api
    create_claim(api, ns, "no-ts", request("gpu", GPU_CLASS))
    allocate(api, ns, "no-ts", "dra-0001", "gpu-1", timestamp=False)
    create_pod(api, ns, "no-ts", claim="no-ts")
    messages = wait_for(lambda: [m for m in scheduling_messages(api, ns, "no-ts") if "immutable" in m], timeout=30,
                        what="kube-scheduler's PreBind refused")
    assert "status.allocation" in messages[0]
    assert client.CoreV1Api(api).read_namespaced_pod("no-ts", ns).spec.node_name is None


def test_preallocated_claim_facts_an_allocator_must_handle(dra_cluster, ns):
    """Two things kube-scheduler does not do for an allocation it did not make: check that its devices are free (a
    device already held by another claim is given again), and, without the finalizer, release it when the pod goes
    (reservedFor is emptied, the allocation stays and its device stays taken)."""
    api = dra_cluster.api
    create_claim(api, ns, "first", request("gpu", GPU_CLASS))
    allocate(api, ns, "first", "dra-0001", "gpu-0")
    create_claim(api, ns, "again", request("gpu", GPU_CLASS))
    allocate(api, ns, "again", "dra-0001", "gpu-0", finalizer=False)
    create_pod(api, ns, "first", claim="first")
    create_pod(api, ns, "again", claim="again")
    assert running_node(api, ns, "first") == running_node(api, ns, "again") == "dra-0001"
    held = devices_in_use(claims(api, ns))["dra-0001"]["gpu-0"]
    assert sorted(a.claim for a in held) == [f"{ns}/again", f"{ns}/first"]
    delete_pod(api, ns, "again")
    wait_for(lambda: not read_claim(api, ns, "again")["status"].get("reservedFor"), timeout=30,
             what="reservedFor emptied")
    time.sleep(2)
    assert results(read_claim(api, ns, "again")) == [("dra-0001", "gpu-0")]
    # (The namespace's teardown deletes the claim: the controller clears nothing on a claim without the finalizer,
    # and the apiserver deletes it at once.)

"""Reading a pod's ResourceClaims (and templates) into the model's demand, and the allocations gpuaas writes."""
from __future__ import annotations

import pytest

from scoring.dra import FINALIZER, GPU_CLASS, MIG_CLASS, SHARE_CLASS
from scoring.draclaims import (
    ALLOCATED_FOR_ANNOTATION,
    DeviceResult,
    UnsupportedClaim,
    allocation,
    claim_demand,
    consumed_capacity,
    pod_dra,
    same_root_count,
)
from scoring.kubeobjects import ObjectError
from scoring.model import PodDemand

PROFILE = 'device.attributes["gpu.nvidia.com"].profile == "3g.40gb"'


def req(name="gpu", cls=GPU_CLASS, *, count=None, selectors=(), share=None, **extra):
    exactly = {"deviceClassName": cls, **extra}
    if count is not None:
        exactly["count"] = count
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if share is not None:
        exactly["capacity"] = {"requests": {"share": share}}
    return {"name": name, "exactly": exactly}


def spec(*requests, constraints=None, config=None):
    devices = {"requests": list(requests)}
    if constraints is not None:
        devices["constraints"] = constraints
    if config is not None:
        devices["config"] = config
    return {"devices": devices}


def claim(name, *requests, ns="ml", allocation_=None, reserved=(), annotations=None, constraints=None):
    meta = {"name": name, "namespace": ns, "uid": f"c-{name}"}
    if annotations:
        meta["annotations"] = annotations
    status = {}
    if allocation_ is not None:
        status["allocation"] = allocation_
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": r, "uid": r} for r in reserved]
    return {"metadata": meta, "spec": spec(*requests, constraints=constraints), "status": status}


def pod(*entries, cpu="4", statuses=None, extra_gpu=False):
    resources = {"requests": {"cpu": cpu, "memory": "8Gi"}}
    if extra_gpu:
        resources["limits"] = {"nvidia.com/gpu": "1"}
    p = {"metadata": {"name": "p", "namespace": "ml", "uid": "u-p"},
         "spec": {"containers": [{"name": "c", "resources": resources}],
                  "resourceClaims": [dict(e) for e in entries]},
         "status": {}}
    if statuses:
        p["status"]["resourceClaimStatuses"] = [{"name": k, "resourceClaimName": v} for k, v in statuses.items()]
    return p


def by_key(*claims):
    return {f"{c['metadata']['namespace']}/{c['metadata']['name']}": c for c in claims}


# -- one claim ---------------------------------------------------------------------------------------------------------

def test_whole_gpus_with_a_pcie_root_constraint():
    d = claim_demand(spec(req(count=2), constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]), "c")
    assert [(r.kind, r.count) for r in d.requests] == [("gpu", 2)] and d.same_root == {"gpu"}


def test_a_mig_profile_and_a_product_selector():
    d = claim_demand(spec(req(cls=MIG_CLASS, selectors=[
        PROFILE, "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'"])), "c")
    [r] = d.requests
    assert (r.kind, r.profile, r.models) == ("mig", "3g.40gb", {"A100-80GB"})


def test_a_share_by_consumable_capacity_and_its_default():
    assert claim_demand(spec(req(cls=SHARE_CLASS, share="250")), "c").requests[0].share == 250
    assert claim_demand(spec(req(cls=SHARE_CLASS)), "c").requests[0].share == 1000


def test_claims_of_other_drivers_are_not_gpuaas_s():
    assert claim_demand(spec(req(cls="nic.example.com")), "c") is None


@pytest.mark.parametrize(("request_", "words"), [
    ({"name": "g", "firstAvailable": [{"name": "a", "deviceClassName": GPU_CLASS}]}, "firstAvailable"),
    (req(allocationMode="All"), "allocationMode 'All'"),
    (req(adminAccess=True), "adminAccess"),
    (req(cls=MIG_CLASS), "needs a selector naming the profile"),
    (req(cls=MIG_CLASS, selectors=[PROFILE], count=2), "one MIG device per pod"),
    (req(selectors=["device.attributes['gpu.nvidia.com'].architecture == 'Ampere'"]), "selector"),
    (req(selectors=[PROFILE]), "productName"),  # a profile on the whole-GPU class
    (req(cls=SHARE_CLASS, share="1500"), "1..1000"),
    (req(cls=SHARE_CLASS, share="0.5"), "whole number"),
    ({"name": "s", "exactly": {"deviceClassName": SHARE_CLASS, "capacity": {"requests": {"memory": "1Gi"}}}},
     "capacity request 'memory'"),
    (req(selectors=["device.attributes['gpu.nvidia.com'].productName == 'Voodoo 5'"]), "Voodoo"),
])
def test_what_gpuaas_does_not_allocate_is_refused_by_name(request_, words):
    with pytest.raises(UnsupportedClaim, match=words.replace("(", r"\(").replace(".", r"\.")):
        claim_demand(spec(request_), "ResourceClaim ml/c")


def test_unsupported_constraints_and_mixed_claims():
    with pytest.raises(UnsupportedClaim, match="distinctAttribute"):
        claim_demand(spec(req(count=2), constraints=[{"distinctAttribute": "x/y"}]), "c")
    with pytest.raises(UnsupportedClaim, match=r"gpu\.nvidia\.com/uuid"):
        claim_demand(spec(req(count=2), constraints=[{"matchAttribute": "gpu.nvidia.com/uuid"}]), "c")
    with pytest.raises(UnsupportedClaim, match=r"mixes gpuaas.s device classes with nic\.example\.com"):
        claim_demand(spec(req(), req("nic", "nic.example.com")), "c")


def test_a_claims_opaque_config_goes_into_its_allocation():
    config = [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": "x"}}}]
    d = claim_demand(spec(req(), config=config), "c")
    a = allocation("n1", [DeviceResult("gpu", "gpu-0")], "2026-01-01T00:00:00Z", d.config)
    assert a["devices"]["config"] == [{"source": "FromClaim", "requests": ["gpu"], "opaque": config[0]["opaque"]}]


# -- a pod's claims ----------------------------------------------------------------------------------------------------

def test_a_pod_s_named_claim_and_template_claim():
    claims = by_key(claim("one", req(count=2)), claim("gen-x", req(count=1)))
    p = pod({"name": "a", "resourceClaimName": "one"}, {"name": "b", "resourceClaimTemplateName": "t"},
            statuses={"b": "gen-x"})
    dra = pod_dra(p, claims)
    assert [c.claim for c in dra.claims] == ["ml/one", "ml/gen-x"] and not dra.missing
    assert dra.demand == PodDemand(4000, 8192, gpus=3, gpu_milli=1000, name="ml/p", claims=True)
    assert dra.ours and dra.node == ""


def test_a_template_read_before_its_claim_is_generated():
    templates = {"ml/t": {"metadata": {"name": "t", "namespace": "ml"},
                          "spec": {"spec": spec(req(cls=SHARE_CLASS, share="250"))}}}
    dra = pod_dra(pod({"name": "gpu", "resourceClaimTemplateName": "t"}), {}, templates)
    assert dra.missing == ("gpu: the claim of template t is not generated yet",)
    assert (dra.demand.gpus, dra.demand.gpu_milli, dra.demand.is_share) == (1, 250, True)


def test_a_pod_without_claims_and_one_with_only_other_drivers():
    assert pod_dra({"metadata": {"name": "x"}, "spec": {"containers": []}}, {}) is None
    dra = pod_dra(pod({"name": "nic", "resourceClaimName": "n"}), by_key(claim("n", req(cls="nic.example.com"))))
    assert not dra.ours and dra.other == ("nic",) and dra.demand.gpus == 0


def test_a_pod_mixing_kinds_or_extended_resources_is_refused():
    claims = by_key(claim("w", req()), claim("s", req(cls=SHARE_CLASS, share="300")))
    with pytest.raises(UnsupportedClaim, match=r"more than one kind .*\(gpu, share\)"):
        pod_dra(pod({"name": "a", "resourceClaimName": "w"}, {"name": "b", "resourceClaimName": "s"}), claims)
    with pytest.raises(UnsupportedClaim, match="both as extended resources and through ResourceClaims"):
        pod_dra(pod({"name": "a", "resourceClaimName": "w"}, extra_gpu=True), claims)
    two_shares = by_key(claim("s1", req(cls=SHARE_CLASS)), claim("s2", req(cls=SHARE_CLASS)))
    with pytest.raises(UnsupportedClaim, match="2 GPU shares"):
        pod_dra(pod({"name": "a", "resourceClaimName": "s1"}, {"name": "b", "resourceClaimName": "s2"}), two_shares)


def test_allocated_claims_pin_the_pod_and_leave_only_the_rest_to_place():
    done = claim("done", req(count=2), allocation_=allocation("n7", [DeviceResult("gpu", "gpu-0"),
                                                                     DeviceResult("gpu", "gpu-1")], "t"),
                 annotations={ALLOCATED_FOR_ANNOTATION: "u-p"})
    rest = claim("rest", req(count=1))
    dra = pod_dra(pod({"name": "a", "resourceClaimName": "done"}, {"name": "b", "resourceClaimName": "rest"}),
                  by_key(done, rest))
    assert dra.node == "n7" and dra.demand.gpus == 1 and [c.claim for c in dra.unallocated] == ["ml/rest"]
    assert dra.claims[0].by_gpuaas == "u-p" and dra.claims[0].allocated_at == "t"
    assert [a.device for a in dra.claims[0].allocated] == ["gpu-0", "gpu-1"]


def test_claims_allocated_on_two_nodes_cannot_be_one_pod_s():
    a = claim("a", req(), allocation_=allocation("n1", [DeviceResult("gpu", "gpu-0")], "t"))
    b = claim("b", req(), allocation_=allocation("n2", [DeviceResult("gpu", "gpu-0")], "t"))
    with pytest.raises(ObjectError, match="different nodes"):
        pod_dra(pod({"name": "a", "resourceClaimName": "a"}, {"name": "b", "resourceClaimName": "b"}), by_key(a, b))


def test_a_root_constraint_counts_the_gpus_it_binds():
    c = claim("c", req(count=2), constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}])
    dra = pod_dra(pod({"name": "a", "resourceClaimName": "c"}), by_key(c))
    assert same_root_count(dra) == 2


# -- allocations -------------------------------------------------------------------------------------------------------

SHARED = {"name": "gpu-1-shared", "capacity": {
    "share": {"value": "1000", "requestPolicy": {"default": "1000", "validRange": {"min": "1", "max": "1000",
                                                                                   "step": "1"}}},
    "memory": {"value": "85899345920", "requestPolicy": {"default": "0", "validRange": {"min": "0"}}}}}


def test_consumed_capacity_rounds_as_the_allocator_does():
    assert consumed_capacity(SHARED, {"share": 250}) == {"share": 250, "memory": 0}
    stepped = {"name": "d", "capacity": {"share": {"value": "1000", "requestPolicy": {
        "default": "100", "validRange": {"min": "100", "step": "100"}}}}}
    assert consumed_capacity(stepped, {"share": 250}) == {"share": 300}
    assert consumed_capacity(stepped, {}) == {"share": 100}
    listed = {"name": "d", "capacity": {"share": {"value": "1000", "requestPolicy": {
        "default": "500", "validValues": ["250", "500", "1000"]}}}}
    assert consumed_capacity(listed, {"share": 300}) == {"share": 500}
    assert consumed_capacity({"name": "d", "capacity": {"share": {"value": "1000"}}}, {}) == {"share": 1000}


def test_an_allocation_names_node_devices_shares_and_its_time():
    a = allocation("dra-0001", [DeviceResult("gpu", "gpu-1-shared", "7c1f", {"share": 250, "memory": 0})],
                   "2026-11-24T10:00:00Z")
    assert a == {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "dra-0001",
                                          "device": "gpu-1-shared", "shareID": "7c1f",
                                          "consumedCapacity": {"share": "250", "memory": "0"}}]},
                 "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                     {"key": "metadata.name", "operator": "In", "values": ["dra-0001"]}]}]},
                 "allocationTimestamp": "2026-11-24T10:00:00Z"}
    assert FINALIZER == "resource.kubernetes.io/delete-protection"

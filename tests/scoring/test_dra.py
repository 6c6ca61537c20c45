"""Reading ResourceSlices (the NVIDIA DRA driver's shape) and ResourceClaim allocations into the model."""
from __future__ import annotations

import pytest

from runtime.draslices import resource_slices
from runtime.pools import node_objects, parse_pool_spec
from scoring.dra import (
    DRIVER,
    GpuUsage,
    allocated_devices,
    devices_in_use,
    dra_node,
    dra_node_spec,
    gpu_usage,
    gpus_in_use,
    pool_slices,
)
from scoring.gpus import MigPlacement
from scoring.kubeobjects import ObjectError


def dra_pool(**gpu):
    spec = parse_pool_spec({"pools": [{"name": "d", "count": 1, "dra": True, "cpu": "96", "memory": "1Ti",
                                        "gpu": {"model": "A100-80GB", "count": 8, **gpu}}]})
    pool = spec.pools[0]
    return node_objects(pool)[0], resource_slices(pool, "d-0000")


def attr(value):
    return {"string": value}


def static_mig_slice(node="n1", generation=1, count=1):
    """A slice as the driver's default (static MIG) mode publishes it: gpu-0 whole, gpu-1 in MIG mode with two
    3g.40gb instances (the parent GPU itself not published)."""
    common = {"productName": attr("NVIDIA A100-SXM4-80GB"), "architecture": attr("Ampere"), "brand": attr("Nvidia")}
    return {"metadata": {"name": f"{node}-x"}, "spec": {
        "driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": generation,
                                                      "resourceSliceCount": count},
        "devices": [
            {"name": "gpu-0", "attributes": {"type": attr("gpu"), "uuid": attr("GPU-a"), **common},
             "capacity": {"memory": {"value": "80Gi"}}},
            {"name": "gpu-1-mig-3g40gb-9-0", "attributes": {"type": attr("mig"), "uuid": attr("MIG-1"),
                                                            "parentUUID": attr("GPU-b"),
                                                            "profile": attr("3g.40gb"), **common},
             "capacity": {"memory": {"value": "40Gi"}}},
            {"name": "gpu-1-mig-3g40gb-9-4", "attributes": {"type": attr("mig"), "uuid": attr("MIG-2"),
                                                            "parentUUID": attr("GPU-b"),
                                                            "profile": attr("3g.40gb"), **common},
             "capacity": {"memory": {"value": "40Gi"}}},
        ]}}


def claim(name, *results, namespace="ns", reserved=("p",)):
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {},
            "status": {"allocation": {"devices": {"results": list(results)}},
                       "reservedFor": [{"resource": "pods", "name": r, "uid": "u"} for r in reserved]}}


def result(device, pool="d-0000", driver=DRIVER, request="gpu", **extra):
    return {"request": request, "driver": driver, "pool": pool, "device": device, **extra}


def test_rendered_slices_read_back_as_the_pool_says():
    node, slices = dra_pool(topology={"nvlinkDomain": 4, "numaNode": 4})
    dra = dra_node("d-0000", slices)
    assert not dra.incomplete and dra.model is not None and dra.model.name == "A100-80GB"
    assert [g.index for g in dra.gpus] == list(range(8))
    assert all(g.device == f"gpu-{g.index}" and g.shared_device == f"gpu-{g.index}-shared" and
               g.share_capacity == 1000 and g.memory_bytes == 81920 * 2**20 for g in dra.gpus)
    assert len({g.uuid for g in dra.gpus}) == 8
    spec = dra_node_spec(node, slices)
    assert (spec.name, spec.gpus, spec.gpu_model, spec.node_group, spec.mig_layouts) == \
        ("d-0000", 8, "A100-80GB", "d", None)
    assert spec.gpu_blocks == (0, 0, 0, 0, 1, 1, 1, 1)  # from the topology annotation


def test_pcie_roots_give_blocks_without_the_annotation():
    node, slices = dra_pool(topology={"numaNode": 2})
    del node["metadata"]["annotations"]["gpuaas.io/gpu-topology"]
    assert dra_node_spec(node, slices).gpu_blocks == (0, 0, 1, 1, 2, 2, 3, 3)


def test_partitionable_mig_offers_every_placement_of_the_layouts_profiles():
    node, slices = dra_pool(mig="all-balanced", migGPUs=2)
    dra = dra_node("d-0000", slices)
    assert [bool(g.migs) for g in dra.gpus] == [False] * 6 + [True] * 2  # the last migGPUs GPUs
    offered = {(m.profile, m.start, m.size) for m in dra.gpus[7].migs}
    assert offered == {("1g.10gb", s, 1) for s in range(7)} | {("2g.20gb", s, 2) for s in (0, 2, 4)} | \
        {("3g.40gb", s, 4) for s in (0, 4)}
    assert all(m.partition for m in dra.gpus[7].migs) and not dra.gpus[7].static_mig
    # Nothing allocated: the GPUs are whole; a partition allocated shows as the GPU's layout.
    assert dra_node_spec(node, slices).mig_layouts is None
    usage = {"gpu-7-mig-3g40gb-9-4": GpuUsage(migs=(MigPlacement("3g.40gb", 4, 4),))}
    assert dra_node_spec(node, slices, usage=usage).mig_layouts == (None,) * 7 + ({"3g.40gb": 1},)


def test_static_mig_slice_of_the_driver():
    node = {"metadata": {"name": "n1", "labels": {}}, "status": {"allocatable": {"cpu": "8", "memory": "64Gi"}}}
    dra = dra_node("n1", [static_mig_slice()])
    assert [(g.index, g.device, g.uuid) for g in dra.gpus] == [(0, "gpu-0", "GPU-a"), (1, "", "GPU-b")]
    assert dra.gpus[1].static_mig
    assert [m.placement for m in dra.gpus[1].migs] == [MigPlacement("3g.40gb", 0, 4), MigPlacement("3g.40gb", 4, 4)]
    spec = dra_node_spec(node, [static_mig_slice()])
    assert (spec.gpus, spec.mig_layouts) == (2, (None, {"3g.40gb": 2}))


def test_incomplete_and_stale_generations():
    # A pool says two slices, one is there: incomplete, read as no GPUs (kube-scheduler allocates nothing from it).
    node = {"metadata": {"name": "n1", "labels": {}}, "status": {"allocatable": {"cpu": "8", "memory": "64Gi"}}}
    assert dra_node("n1", [static_mig_slice(count=2)]).incomplete
    assert dra_node_spec(node, [static_mig_slice(count=2)]).gpus == 0
    # An older generation beside a newer one is ignored.
    old = static_mig_slice(generation=1)
    new = static_mig_slice(generation=2)
    new["spec"]["devices"] = new["spec"]["devices"][:1]
    assert pool_slices([old, new])["n1"] == ([new], False)
    assert len(dra_node("n1", [old, new]).gpus) == 1
    # Other drivers' slices and other pools are not this node's.
    other = static_mig_slice()
    other["spec"]["driver"] = "other.example.com"
    assert dra_node("n1", [other]).gpus == ()
    assert dra_node("n2", [static_mig_slice()]).gpus == ()


def test_unreadable_slices():
    twice = static_mig_slice()
    twice["spec"]["devices"].append(twice["spec"]["devices"][0])
    with pytest.raises(ObjectError, match="published twice"):
        dra_node("n1", [twice])
    orphan = static_mig_slice()
    orphan["spec"]["devices"][1]["name"] = "mig-x"
    orphan["spec"]["devices"][1]["attributes"]["parentUUID"] = attr("GPU-zzz")
    with pytest.raises(ObjectError, match="names no GPU"):
        dra_node("n1", [orphan])
    unknown = static_mig_slice()
    for d in unknown["spec"]["devices"]:
        d["attributes"]["productName"] = attr("NVIDIA Imaginary 9000")
    with pytest.raises(ObjectError, match="not in gpuaas's catalog"):
        dra_node("n1", [unknown])
    bad_generation = static_mig_slice()
    bad_generation["spec"]["pool"]["generation"] = "1"
    with pytest.raises(ObjectError, match="generation"):
        dra_node("n1", [bad_generation])


def test_allocations_whoever_made_them():
    claims = [
        claim("whole", result("gpu-0"), result("gpu-1")),
        claim("mig", result("gpu-7-mig-3g40gb-9-4")),
        claim("s1", result("gpu-2-shared", shareID="a", consumedCapacity={"share": "300", "memory": "0"})),
        claim("s2", result("gpu-2-shared", shareID="b", consumedCapacity={"share": "1k", "memory": "0"}),
              reserved=()),
        claim("admin", result("gpu-3", adminAccess=True)),  # not counted, as kube-scheduler does not
        claim("elsewhere", result("gpu-3", pool="d-0001")),
        claim("other-driver", result("gpu-3", driver="other.example.com")),
        {"metadata": {"name": "pending", "namespace": "ns"}, "spec": {}, "status": {}},
    ]
    in_use = devices_in_use(claims)
    assert set(in_use) == {"d-0000", "d-0001"}
    assert sorted(in_use["d-0000"]) == ["gpu-0", "gpu-1", "gpu-2-shared", "gpu-7-mig-3g40gb-9-4"]
    [s1, s2] = in_use["d-0000"]["gpu-2-shared"]
    assert (s1.claim, s1.share_id, s1.consumed, s1.reserved_for) == ("ns/s1", "a", {"share": 300, "memory": 0},
                                                                      ("p",))
    assert s2.consumed["share"] == 1000 and s2.reserved_for == ()
    _, slices = dra_pool(mig="all-balanced", migGPUs=1)
    dra = dra_node("d-0000", slices)
    usage = gpu_usage(dra, in_use)
    assert usage["gpu-2-shared"].share_milli == 1300  # over-committed by someone: reported, not hidden
    per_gpu = gpus_in_use(dra, usage)
    assert [u.whole for u in per_gpu] == [True, True] + [False] * 6
    assert per_gpu[7].migs == (MigPlacement("3g.40gb", 4, 4),) and per_gpu[7].claims == ("ns/mig",)
    assert per_gpu[2].share_milli == 1300 and per_gpu[2].claims == ("ns/s1", "ns/s2")
    # A device the node no longer publishes (a stale allocation) is left out.
    assert "gpu-9" not in gpu_usage(dra, devices_in_use([claim("stale", result("gpu-9"))]))


def test_unreadable_allocation():
    with pytest.raises(ObjectError, match="consumedCapacity"):
        allocated_devices(claim("x", result("gpu-0-shared", consumedCapacity={"share": "lots"})))
    with pytest.raises(ObjectError, match="results"):
        allocated_devices({"metadata": {"name": "x", "namespace": "n"},
                           "status": {"allocation": {"devices": {"results": {"device": "gpu-0"}}}}})

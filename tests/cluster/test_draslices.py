"""The ResourceSlices and Node objects of a pool declared `dra: true` (the apiserver's own acceptance of them, and
kube-scheduler's allocations on them, are tests/e2e/test_dra.py's)."""
from __future__ import annotations

import pytest

from gpuaas.cluster.dra import dra_slices
from runtime.draslices import MAX_COUNTER_SETS, device_classes, gpu_uuid, resource_slices
from runtime.pools import PoolSpecError, node_objects, parse_pool_spec
from scoring.dra import DRA_LABEL, GPU_CLASS, MIG_CLASS, SHARE_CLASS


def pool(**fields):
    gpu = fields.pop("gpu", {"model": "A100-80GB", "count": 8})
    return parse_pool_spec({"pools": [{"name": "d", "count": 2, "dra": True, "gpu": gpu, **fields}]})


def test_dra_nodes_advertise_no_gpu_resources():
    node = node_objects(pool(gpu={"model": "A100-80GB", "count": 8, "mig": "all-1g.10gb"}).pools[0])[0]
    assert not [r for r in node["status"]["allocatable"] if r.startswith("nvidia.com/")]
    labels = node["metadata"]["labels"]
    assert labels[DRA_LABEL] == "true" and labels["nvidia.com/gpu.count"] == "8"
    assert "nvidia.com/mig.config" not in labels  # no MIG manager: the node's migmanager simulation leaves it alone


def test_dra_pool_spec_checks():
    with pytest.raises(PoolSpecError, match="without GPUs"):
        parse_pool_spec({"pools": [{"name": "c", "count": 1, "dra": True}]})
    # A DRA node group (the node scaler's, issue 16): its template keeps `dra`.
    group = parse_pool_spec({"pools": [{"name": "c", "count": 0, "dra": True, "gpu": {"model": "T4", "count": 1},
                                        "autoscale": {"minSize": 0, "maxSize": 2, "costPerHour": 1}}]}).pools[0]
    assert group.template()["dra"] is True
    assert not parse_pool_spec({"pools": [{"name": "c", "count": 1}]}).pools[0].dra
    assert "dra" not in parse_pool_spec({"pools": [{"name": "c", "count": 1}]}).pools[0].template()


def test_slices_split_counters_from_devices():
    slices = resource_slices(pool().pools[0], "d-0001")
    counters = [s for s in slices if "sharedCounters" in s["spec"]]
    devices = [s for s in slices if "devices" in s["spec"]]
    assert len(counters) == 1 and len(devices) == 8 and len(slices) == 9
    assert all(set(s["spec"]) & {"sharedCounters", "devices"} != {"sharedCounters", "devices"} for s in slices)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {9}
    assert {(s["spec"]["nodeName"], s["spec"]["pool"]["name"]) for s in slices} == {("d-0001", "d-0001")}
    assert len({s["metadata"]["name"] for s in slices}) == 9
    # 16 GPUs: two counter slices (at most 8 counter sets in one).
    big = resource_slices(pool(gpu={"model": "A100-80GB", "count": 16}).pools[0], "d-0000")
    assert [len(s["spec"]["sharedCounters"]) for s in big if "sharedCounters" in s["spec"]] == [MAX_COUNTER_SETS] * 2


def test_device_shapes():
    slices = resource_slices(pool(gpu={"model": "H100-80GB", "count": 2, "mig": "all-3g.40gb"}).pools[0], "d-0000")
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", ())}
    assert sorted(devices) == ["gpu-0", "gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4", "gpu-0-shared",
                               "gpu-1", "gpu-1-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-4", "gpu-1-shared"]
    whole = devices["gpu-1"]
    assert whole["attributes"]["uuid"] == {"string": gpu_uuid("d-0000", 1)}
    assert whole["attributes"]["productName"] == {"string": "NVIDIA H100-80GB-HBM3"}
    assert whole["attributes"]["architecture"] == {"string": "Hopper"}
    assert whole["capacity"]["memory"] == {"value": str(81559 * 2**20)}
    [counter_slice] = [s for s in slices if "sharedCounters" in s["spec"]]
    set1 = next(c for c in counter_slice["spec"]["sharedCounters"] if c["name"] == "gpu-1-counter-set")
    # The whole GPU and the shared GPU take the whole counter set; a partition its compute and memory slices.
    assert whole["consumesCounters"] == [{"counterSet": "gpu-1-counter-set", "counters": set1["counters"]}]
    assert devices["gpu-1-shared"]["consumesCounters"] == whole["consumesCounters"]
    part = devices["gpu-1-mig-3g40gb-9-4"]
    assert part["attributes"]["parentUUID"] == whole["attributes"]["uuid"] and "uuid" not in part["attributes"]
    assert part["attributes"]["profile"] == {"string": "3g.40gb"}
    assert part["consumesCounters"][0]["counters"] == {"compute-slices": {"value": "3"},
                                                        **{f"memory-slice-{i}": {"value": "1"} for i in range(4, 8)}}
    shared = devices["gpu-0-shared"]
    assert shared["allowMultipleAllocations"] is True
    assert shared["capacity"]["share"] == {"value": "1000", "requestPolicy": {
        "default": "1000", "validRange": {"min": "1", "max": "1000", "step": "1"}}}
    assert shared["attributes"]["type"] == {"string": "shared"}


def test_non_dra_pools_have_no_slices_and_classes_select_by_type():
    plain = parse_pool_spec({"pools": [{"name": "p", "count": 1, "gpu": {"model": "T4", "count": 1}}]})
    assert resource_slices(plain.pools[0], "p-0000") == []
    classes = {c["metadata"]["name"]: c["spec"]["selectors"][0]["cel"]["expression"] for c in device_classes()}
    assert classes == {
        GPU_CLASS: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        MIG_CLASS: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
        SHARE_CLASS: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'shared'",
    }


def test_owner_references_only_for_existing_nodes():
    spec = pool()
    slices = dra_slices(spec, {"d-0000": "uid-0"})
    assert {s["spec"]["nodeName"] for s in slices} == {"d-0000"}
    assert all(s["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "d-0000",
                                                     "uid": "uid-0", "controller": True}] for s in slices)

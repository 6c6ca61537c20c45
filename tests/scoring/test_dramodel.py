"""DRA nodes in the live model (usage from every allocated claim, MIG partitions and their completion, idle GPUs opened
for waiting MIG pods) and the devices a placement becomes."""
from __future__ import annotations

import itertools

import pytest

from runtime.draslices import resource_slices
from runtime.pools import node_objects, parse_pool_spec
from scoring.draclaims import DeviceResult, UnsupportedClaim, allocation, pod_dra
from scoring.dramodel import DeviceAssigner, dra_cluster, dra_model, same_root_nodes
from scoring.fit import feasible
from scoring.fragmentation import Workload
from scoring.kubeobjects import node_spec
from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.placement import Placer
from scoring.policies import make_policy

from .test_draclaims import by_key, claim, pod, req

PROFILE = 'device.attributes["gpu.nvidia.com"].profile == "{}"'


def cluster_objects(*pools):
    spec = parse_pool_spec({"pools": list(pools)})
    nodes, slices = {}, []
    for pool in spec.pools:
        for n in node_objects(pool):
            nodes[n["metadata"]["name"]] = n
            slices += resource_slices(pool, n["metadata"]["name"])
    return nodes, slices


WHOLE = {"name": "dra", "count": 2, "dra": True, "cpu": "64", "memory": "512Gi",
         "gpu": {"model": "A100-80GB", "count": 4, "topology": {"numaNode": 2}}}
MIG = {"name": "mig", "count": 1, "dra": True, "cpu": "64", "memory": "512Gi",
       "gpu": {"model": "A100-80GB", "count": 2, "mig": "all-balanced"}}
PLUGIN = {"name": "plugin", "count": 1, "cpu": "64", "memory": "512Gi", "gpu": {"model": "A100-80GB", "count": 8}}


def base_of(nodes):
    return ClusterState(sorted((node_spec(n) for n in nodes.values()), key=lambda s: s.name))


def allocated(name, node, *devices, request="gpu"):
    results = [DeviceResult(request, d) if isinstance(d, str) else d for d in devices]
    return claim(name, req(), allocation_=allocation(node, results, "t"), reserved=("x",))


def model_of(claims=(), wanted=None, pools=(WHOLE, MIG, PLUGIN)):
    nodes, slices = cluster_objects(*pools)
    base = base_of(nodes)
    return dra_model(base, nodes, dra_cluster(slices, claims), slices, wanted), base


def row(model, name):
    return model.state.index[name]


def test_dra_nodes_get_their_gpus_and_device_plugin_nodes_stay_as_they_are():
    m, base = model_of()
    s = m.state
    assert base.gpu_count[base.index["dra-0000"]] == 0  # what Nodes alone say
    assert [int(s.gpu_count[row(m, n)]) for n in ("dra-0000", "dra-0001", "mig-0000", "plugin-0000")] == [4, 4, 2, 8]
    assert s.gpu_left[row(m, "dra-0000"), :4].tolist() == [1000] * 4
    assert s.block[row(m, "dra-0000"), :4].tolist() == [0, 0, 1, 1]
    assert not s.mig_enabled[row(m, "mig-0000")].any()  # idle partitionable GPUs are whole GPUs
    assert s.cpu_left.tolist() == base.cpu_left.tolist() and not m.errors


def test_usage_comes_from_every_allocated_claim():
    share = DeviceResult("gpu", "gpu-1-shared", "s1", {"share": 600, "memory": 0})
    m, _ = model_of([allocated("a", "dra-0000", "gpu-0"), allocated("b", "dra-0000", share),
                     allocated("c", "mig-0000", "gpu-0-mig-3g40gb-9-0")])
    s = m.state
    assert s.gpu_left[row(m, "dra-0000"), :4].tolist() == [0, 400, 1000, 1000]
    r = row(m, "mig-0000")
    assert s.mig_enabled[r].tolist()[:2] == [True, False]
    # The partition in use plus the largest profile that fits beside it (3g.40gb at slices 4-7), free.
    assert [(i.profile, i.allocated) for i in s.mig_instances[r][0]] == [("3g.40gb", True), ("3g.40gb", False)]


def test_the_completion_prefers_the_profiles_pods_wait_for():
    m, _ = model_of([allocated("c", "mig-0000", "gpu-0-mig-3g40gb-9-0")], wanted={"1g.10gb": 2})
    r = row(m, "mig-0000")
    assert sorted(i.profile for i in m.state.mig_instances[r][0] if not i.allocated) == ["1g.10gb"] * 3
    assert [d.device for d in m.completions[("mig-0000", 0)]] == \
        ["gpu-0-mig-1g10gb-19-4", "gpu-0-mig-1g10gb-19-5", "gpu-0-mig-1g10gb-19-6"]


def test_idle_gpus_are_opened_for_waiting_mig_pods_as_few_as_needed():
    m, _ = model_of(wanted={"3g.40gb": 3})
    r = row(m, "mig-0000")
    assert m.state.mig_enabled[r, :2].tolist() == [True, True]
    assert int(m.state.mig_free[r, :, m.state.mig_pos["3g.40gb"]].sum()) == 4
    one, _ = model_of(wanted={"3g.40gb": 1})
    assert one.state.mig_enabled[r, :2].tolist() == [True, False]
    # A partitioned GPU with room is used before an idle one is opened.
    m, _ = model_of([allocated("c", "mig-0000", "gpu-1-mig-3g40gb-9-0")], wanted={"3g.40gb": 1})
    assert m.state.mig_enabled[r, :2].tolist() == [False, True]


def test_a_gpu_held_twice_is_reported_not_raised():
    m, _ = model_of([allocated("a", "dra-0000", "gpu-0"), allocated("b", "dra-0000", "gpu-0")])
    assert m.state.gpu_left[row(m, "dra-0000"), 0] == 0
    assert m.errors == ["dra-0000 gpu-0 is held by 2 claims: ml/a, ml/b"]


def test_same_root_nodes():
    m, _ = model_of([allocated("a", "dra-0000", "gpu-0"), allocated("b", "dra-0000", "gpu-2")])
    assert same_root_nodes(m, 2) == {"dra-0001", "mig-0000"}
    assert "dra-0000" in same_root_nodes(m, 1)


# -- devices -----------------------------------------------------------------------------------------------------------

def ids():
    counter = itertools.count()
    return lambda: f"share-{next(counter)}"


def claims_of(*claims_):
    return pod_dra(pod(*({"name": f"e{i}", "resourceClaimName": c["metadata"]["name"]}
                         for i, c in enumerate(claims_))), by_key(*claims_)).claims


def test_whole_gpus_become_their_devices_and_a_root_constraint_is_checked():
    m, _ = model_of()
    a = DeviceAssigner(m, ids())
    rooted = claims_of(claim("r", req(count=2), constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]))
    assert [r.device for r in a.assign("dra-0000", rooted, (2, 3))["ml/r"]] == ["gpu-2", "gpu-3"]
    with pytest.raises(ValueError, match="not free as a whole GPU"):
        a.assign("dra-0000", rooted, (2, 3))  # given already in this plan
    with pytest.raises(UnsupportedClaim, match="2 PCIe roots"):
        DeviceAssigner(m, ids()).assign("dra-0000", rooted, (1, 2))


def test_shares_get_an_id_and_their_consumed_capacity_and_never_overfill():
    m, _ = model_of()
    a = DeviceAssigner(m, ids())
    share = claims_of(claim("s", req(cls="gpu-share.gpuaas.io", share="600")))
    [r] = a.assign("dra-0001", share, (1,))["ml/s"]
    assert (r.device, r.share_id, dict(r.consumed)) == ("gpu-1-shared", "share-0", {"share": 600, "memory": 0})
    with pytest.raises(ValueError, match="400 of 1000 left, 600 asked"):
        a.assign("dra-0001", share, (1,))
    with pytest.raises(ValueError, match="not free as a whole GPU"):
        a.assign("dra-0001", claims_of(claim("w", req())), (1,))


def test_mig_partitions_in_the_planned_completion_first():
    m, _ = model_of([allocated("c", "mig-0000", "gpu-0-mig-3g40gb-9-0")], wanted={"1g.10gb": 1})
    a = DeviceAssigner(m, ids())
    mig = claims_of(claim("m", req(cls="mig.nvidia.com", selectors=[PROFILE.format("1g.10gb")])))
    assert a.assign("mig-0000", mig, (0,))["ml/m"][0].device == "gpu-0-mig-1g10gb-19-4"
    big = claims_of(claim("b", req(cls="mig.nvidia.com", selectors=[PROFILE.format("3g.40gb")])))
    with pytest.raises(ValueError, match=r"no free 3g\.40gb placement"):
        a.assign("mig-0000", big, (0,))


def test_the_policy_places_dra_pods_on_the_model_and_the_devices_follow():
    """The gpuaas policy's choice through a Placer, then its devices: a MIG pod beside the partition in use (not on
    the idle GPU), a 2-GPU pod inside one PCIe root of the node already in use."""
    held = [allocated("c", "mig-0000", "gpu-0-mig-3g40gb-9-0"), allocated("a", "dra-0001", "gpu-0")]
    m, _ = model_of(held, wanted={"3g.40gb": 1})
    state = m.state
    mig_pod = PodDemand(4000, 8192, gpus=1, gpu_milli=1000, mig_profile="3g.40gb", claims=True)
    two = PodDemand(4000, 8192, gpus=2, gpu_milli=1000, claims=True)
    gpaas = make_policy("gpuaas", state, Workload.typical([two, mig_pod]))
    placer = Placer(state, gpaas)
    choice = placer.place(mig_pod)
    assert (state.names[choice.node], choice.devices) == ("mig-0000", (0,))
    a = DeviceAssigner(m, ids())
    mig = claims_of(claim("m", req(cls="mig.nvidia.com", selectors=[PROFILE.format("3g.40gb")])))
    assert a.assign("mig-0000", mig, choice.devices)["ml/m"][0].device == "gpu-0-mig-3g40gb-9-4"
    assert feasible(state, two)[row(m, "dra-0001")]
    devices = gpaas.devices(state, two, row(m, "dra-0001"))
    assert devices == (2, 3)  # one block (= one PCIe root here), the other kept with its free GPU


def test_a_cluster_without_dra_nodes_is_the_base_model():
    m, base = model_of(pools=(PLUGIN,))
    assert m.state.gpu_left.tolist() == base.gpu_left.tolist() and m.state is not base
    assert NodeSpec  # (imported for readers: the model's node type)

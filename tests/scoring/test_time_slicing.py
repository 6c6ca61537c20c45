"""Time-slicing (issue 16): on a node whose device plugin time-slices its GPUs (`nvidia.com/gpu.replicas: R`), a pod
asking `nvidia.com/gpu: N` takes N replicas of 1000 // R thousandths each (scoring/model.py, "Time-slicing"), in the
filter, prioritize, the simulator, the planners and the device choice; a GPU share gpuaas accounts is refused there
with a reason that names the labels."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scoring.clusterview import ClusterView
from scoring.fit import feasible, free_on, misfit_reason
from scoring.fragmentation import FragmentationIndex, Workload
from scoring.kubeobjects import ObjectError, node_spec, pod_demand
from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.placement import Placer
from scoring.planner import NodeGroup, cheapest_nodes, place_gang
from scoring.policies import POLICIES, make_policy, replica_devices, spread_replicas
from scoring.simulation import simulate
from scoring.verdicts import devices_free, filter_nodes, prioritize

ONE = PodDemand(1000, 1024, gpus=1, gpu_milli=1000, name="ns/one")  # nvidia.com/gpu: 1
SHARE = PodDemand(1000, 1024, gpus=1, gpu_milli=250, name="ns/share")  # gpuaas.io/gpu-share: 250
WORKLOAD = Workload.typical([ONE])


def sliced(name: str = "ts-0", gpus: int = 1, replicas: int = 4, model: str = "T4") -> NodeSpec:
    return NodeSpec(name, 16_000, 65_536, gpus=gpus, gpu_model=model, gpu_replicas=replicas)


def gfd_node(name: str = "t4-0", *, count: int = 1, replicas: int = 4, allocatable: dict[str, str] | None = None,
             product: str = "Tesla-T4-SHARED", **labels: str) -> dict[str, Any]:
    """A Node as GPU feature discovery and the NVIDIA device plugin show a time-sliced one."""
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count),
                                                  "nvidia.com/gpu.replicas": str(replicas),
                                                  "nvidia.com/gpu.sharing-strategy": "time-slicing", **labels}},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi",
                                       **(allocatable or {"nvidia.com/gpu": str(count * replicas)})}}}


def k8s_pod(name: str, **requests: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", **requests}}}]}}


# -- reading the node -------------------------------------------------------------------------------------------------

def test_a_time_sliced_node_is_read_as_its_physical_gpus_and_their_replicas():
    spec = node_spec(gfd_node())  # 4 nvidia.com/gpu devices, 1 GPU, product label with GFD's -SHARED
    assert (spec.gpus, spec.gpu_model, spec.gpu_replicas) == (1, "T4", 4)
    state = ClusterState([spec])
    assert state.replica_milli.tolist() == [250] and state.free_replicas().tolist() == [4]


def test_without_the_count_label_the_gpus_are_the_devices_over_the_replicas():
    node = gfd_node(count=2, replicas=4)
    del node["metadata"]["labels"]["nvidia.com/gpu.count"]
    assert (node_spec(node).gpus, node_spec(node).gpu_replicas) == (2, 4)


@pytest.mark.parametrize("value", ["0", "1"])
def test_replicas_0_or_1_is_exclusive(value):  # GFD writes 0 when sharing is off, 1 when on without replicas
    node = gfd_node(replicas=1, product="Tesla-T4", allocatable={"nvidia.com/gpu": "1"})
    node["metadata"]["labels"]["nvidia.com/gpu.replicas"] = value
    assert node_spec(node).gpu_replicas == 1


def test_more_replicas_than_thousandths_is_refused_naming_the_label():
    with pytest.raises(ObjectError, match=r"node t4-0: label nvidia.com/gpu.replicas=1001"):
        node_spec(gfd_node(replicas=1001))


def test_time_sliced_gpus_beside_mig_gpus_mixed_strategy():
    """4 GPUs in all-1g.10gb, 4 whole GPUs time-sliced into 2: the replicas label counts nvidia.com/gpu only."""
    node = gfd_node("a100-0", count=8, replicas=2, product="NVIDIA-A100-SXM4-80GB-SHARED",
                    allocatable={"nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "28"})
    spec = node_spec(node)
    assert (spec.gpus, spec.gpu_replicas) == (8, 2)
    assert spec.mig_layouts == (None,) * 4 + ({"1g.10gb": 7},) * 4
    state = ClusterState([spec])
    assert state.free_replicas().tolist() == [8]  # the MIG GPUs give no nvidia.com/gpu device
    mig = PodDemand(gpus=1, gpu_milli=1000, mig_profile="1g.10gb")
    assert feasible(state, mig).all() and feasible(state, PodDemand(gpus=8, gpu_milli=1000)).all()
    assert not feasible(state, PodDemand(gpus=9, gpu_milli=1000)).any()


def test_time_sliced_mig_instances_are_refused_naming_the_node_and_the_label():
    node = gfd_node("a100-0", count=8, replicas=2, product="NVIDIA-A100-SXM4-80GB-SHARED",
                    allocatable={"nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "56"},
                    **{"nvidia.com/mig-1g.10gb.replicas": "2"})
    with pytest.raises(ObjectError, match=r"node a100-0: label nvidia.com/mig-1g.10gb.replicas='2': its MIG "
                                          r"instances are time-sliced"):
        node_spec(node)


def test_only_mig_gpus_leave_nothing_time_sliced():
    node = gfd_node("a100-0", count=1, replicas=4, product="NVIDIA-A100-SXM4-80GB-SHARED",
                    allocatable={"nvidia.com/mig-3g.40gb": "2"})
    assert node_spec(node).gpu_replicas == 1


def test_a_gpu_share_request_is_marked_apart_from_nvidia_gpu():
    assert pod_demand(k8s_pod("a", **{"nvidia.com/gpu": "1"})).takes_replicas
    whole_share = pod_demand(k8s_pod("b", **{"gpuaas.io/gpu-share": "1000"}))
    assert whole_share.whole_share and not whole_share.takes_replicas
    assert not pod_demand(k8s_pod("c", **{"gpuaas.io/gpu-share": "250"})).takes_replicas


# -- the filter's rules and words -------------------------------------------------------------------------------------

def test_four_one_gpu_pods_fit_a_one_gpu_node_of_four_replicas_and_the_fifth_is_told_why():
    state = ClusterState([sliced()])
    policy = make_policy("gpuaas", state, WORKLOAD)
    for i in range(4):
        verdict = filter_nodes(state, ONE, ["ts-0"])
        assert verdict.feasible == ["ts-0"], (i, verdict)
        state.place(0, ONE, policy.devices(state, ONE, 0))
        policy.observe(0)
    assert state.gpu_left[0, 0] == 0
    verdict = filter_nodes(state, ONE, ["ts-0"])
    assert verdict.failed == {"ts-0": "insufficient GPU replicas: 0 free, 1 requested (nvidia.com/gpu.replicas=4: "
                                      "each of the node's GPUs is 4 replicas)"}  # resolvable: a replica may free
    assert free_on(state, 0)["gpu_replicas"] == 0


def test_a_gpu_share_does_not_fit_a_time_sliced_node_and_the_reason_names_the_labels():
    state = ClusterState([sliced(), NodeSpec("ex-0", 16_000, 65_536, gpus=1, gpu_model="T4")])
    for pod in (SHARE, PodDemand(1000, 1024, gpus=1, gpu_milli=1000, whole_share=True)):
        verdict = filter_nodes(state, pod, ["ts-0", "ex-0"])
        assert verdict.feasible == ["ex-0"]
        assert verdict.unresolvable["ts-0"] == (
            "node time-slices its GPUs (nvidia.com/gpu.replicas=4): its device plugin hands out replicas of "
            "nvidia.com/gpu only, not a gpuaas.io/gpu-share share; ask for nvidia.com/gpu: 1 for one replica (1/4 of "
            "a GPU)")


def test_more_replicas_than_the_node_has_is_structural():
    state = ClusterState([sliced(gpus=1, replicas=4), sliced("ts-1", gpus=2, replicas=2)])
    assert misfit_reason(state, PodDemand(gpus=5, gpu_milli=1000), 0) == \
        "pod asks for 5 nvidia.com/gpu, the node has 4: 1 GPU time-sliced into 4 replicas each " \
        "(nvidia.com/gpu.replicas=4)"
    verdict = filter_nodes(state, PodDemand(gpus=4, gpu_milli=1000), ["ts-0", "ts-1"])
    assert verdict.feasible == ["ts-0", "ts-1"]  # 4 replicas of 1 GPU; 2 GPUs x 2 replicas: not "the node has 1"


def test_several_replicas_come_from_the_least_used_gpus_as_the_device_plugin_spreads_them():
    state = ClusterState([sliced(gpus=2, replicas=4)])
    two = PodDemand(gpus=2, gpu_milli=1000)
    assert replica_devices(state, 0, 3) == (0, 1, 0)  # distributed: the GPU with the most replicas free, in turn
    state.place(0, two, replica_devices(state, 0, 2))
    assert state.gpu_left[0, :2].tolist() == [750, 750]
    state.place(0, ONE, replica_devices(state, 0, 1))
    assert replica_devices(state, 0, 2) == (1, 0)  # GPU 1 has more free now
    state.place(0, PodDemand(gpus=3, gpu_milli=1000), replica_devices(state, 0, 3))
    assert state.gpu_left[0, :2].tolist() == [250, 250]
    assert replica_devices(state, 0, 2) == (0, 1) and spread_replicas([250, 0], 250, 1) == (0,)
    with pytest.raises(ValueError):
        replica_devices(state, 0, 3)
    assert devices_free(state, 0, two, (0, 1)) and not devices_free(state, 0, two, (0, 0))
    state.remove(0, two, (0, 1))
    assert state.gpu_left[0, :2].tolist() == [500, 500]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_places_four_replicas_and_fails_the_fifth(policy):
    state = ClusterState([sliced(), NodeSpec("cpu-0", 16_000, 65_536)])
    placer = Placer(state, make_policy(policy, state, WORKLOAD))
    choices = [placer.place(ONE) for _ in range(5)]
    assert [c.node if c else None for c in choices] == [0, 0, 0, 0, None]
    assert all(c.devices == (0,) for c in choices if c)


def test_prioritize_packs_replicas_onto_the_node_already_in_use():
    state = ClusterState([sliced("ts-0"), sliced("ts-1")])
    policy = make_policy("gpuaas", state, WORKLOAD)
    state.place(1, ONE, (0,))
    policy.observe(1)
    scored = prioritize(state, policy, ONE, ["ts-0", "ts-1"])
    assert scored.pick == "ts-1" and dict(scored.pairs()) == {"ts-0": 0, "ts-1": 10}


def test_fragmentation_counts_free_replicas_as_room_for_one_gpu_pods():
    """A time-sliced GPU with 3 replicas free is room for three `nvidia.com/gpu: 1` pods, not a fragment of 750."""
    state = ClusterState([sliced()])
    state.place(0, ONE, (0,))
    index = FragmentationIndex(state, WORKLOAD)
    assert index.idle.tolist() == [750] and index.frag.tolist() == [0.0]
    share_workload = Workload.typical([SHARE])  # a share can never run there: all of it is stranded
    assert FragmentationIndex(state, share_workload).frag.tolist() == [750.0]
    assert index.frag_after_whole(np.array([0]), ONE).tolist() == [0.0]


def test_a_replica_with_r_not_dividing_1000_keeps_the_rest_idle():
    state = ClusterState([sliced(replicas=3)])
    for _ in range(3):
        state.place(0, ONE, replica_devices(state, 0, 1))
    assert state.gpu_left[0, 0] == 1 and not feasible(state, ONE).any()


# -- the simulator, the planners, the live view ------------------------------------------------------------------------

def test_the_simulator_places_four_replicas_and_fails_the_fifth():
    result = simulate([sliced()], [ONE] * 5, "gpuaas", seed=1, tune=0)
    assert (result.pods, result.failed) == (5, 1)
    assert result.node_of.tolist().count(0) == 4
    assert result.used_milli[-1] == 1000  # four replicas of 250: the GPU, not four GPUs
    assert result.final_state is not None and result.final_state.gpu_left[0, 0] == 0


def test_cheapest_nodes_sizes_a_time_sliced_group_by_its_replicas():
    template = sliced("t4x1")
    plan = cheapest_nodes([ONE] * 5, [NodeGroup("t4", template, 1.0)])
    assert plan.ok and plan.new_nodes == {"t4": 2}
    plan = cheapest_nodes([ONE] * 4, [NodeGroup("t4", template, 1.0)])
    assert plan.new_nodes == {"t4": 1}
    plan = cheapest_nodes([SHARE], [NodeGroup("t4", template, 1.0)])
    assert plan.new_nodes == {} and plan.unplaceable == [0]  # no share fits a time-sliced template


def test_a_gang_on_a_time_sliced_node_gets_replicas_as_the_device_plugin_spreads_them():
    state = ClusterState([sliced(gpus=2, replicas=2)])
    plan = place_gang(state, [PodDemand(gpus=2, gpu_milli=1000), ONE], workload=WORKLOAD)
    assert plan.ok and plan.placements == [(0, (0, 1)), (0, (0,))]
    assert not place_gang(state, [PodDemand(gpus=3, gpu_milli=1000), PodDemand(gpus=2, gpu_milli=1000)],
                          workload=WORKLOAD).ok


def test_the_live_view_accounts_bound_replicas_from_their_devices():
    view = ClusterView(workload=WORKLOAD)
    view.on_change("Node", None, gfd_node("t4-0", count=2, replicas=2))
    for i, devices in enumerate(("0,0", "1")):
        pod = k8s_pod(f"p{i}", **{"nvidia.com/gpu": "2" if i == 0 else "1"})
        pod["metadata"]["annotations"] = {"gpuaas.io/devices": devices}
        pod["spec"]["nodeName"] = "t4-0"
        pod["status"] = {"phase": "Running"}
        view.on_change("Pod", None, pod)
    state, _ = view.snapshot()
    assert state.gpu_left[0, :2].tolist() == [0, 500]
    assert filter_nodes(state, PodDemand(gpus=2, gpu_milli=1000), ["t4-0"]).failed["t4-0"].startswith(
        "insufficient GPU replicas: 1 free, 2 requested")

"""Device-plugin mode is honest (issue 16, item 4). A GPU share (`gpuaas.io/gpu-share`) fits only a node whose device
plugins advertise that resource (NodeSpec.gpu_shares; the kubelet starts a pod asking for an extended resource its
node lacks without it, so without one the pod would get no GPU); elsewhere the filter refuses it with a reason no
waiting fixes. The fit rules read device-plugin nodes by counts: which GPU indices the bound pods hold (the device
plugin's choice, not gpuaas's) changes no verdict."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest

from runtime.pools import PoolSpecError, node_objects, parse_pool_spec, pools_from_node_specs
from scoring.fit import DRA_NODE, NO_SHARE_PLUGIN, PLUGIN_NODE, feasible, misfit_reasons
from scoring.fragmentation import FragmentationIndex, Workload
from scoring.kubeobjects import node_spec
from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.planner import NodeGroup, cheapest_nodes, place_gang
from scoring.verdicts import filter_nodes

SHARE = PodDemand(1000, 1024, gpus=1, gpu_milli=250, name="ns/share")  # gpuaas.io/gpu-share: 250
WHOLE_SHARE = PodDemand(1000, 1024, gpus=1, gpu_milli=1000, whole_share=True, name="ns/whole-share")  # ...: 1000
ONE = PodDemand(1000, 1024, gpus=1, gpu_milli=1000, name="ns/one")  # nvidia.com/gpu: 1
TWO = PodDemand(1000, 1024, gpus=2, gpu_milli=1000, name="ns/two")
MIG = PodDemand(1000, 1024, gpus=1, gpu_milli=1000, mig_profile="3g.40gb", name="ns/mig")


def node(name: str, *, shares: bool, count: int = 2, mig: str | None = None) -> dict[str, Any]:
    """A Node of a pool spec (what GFD and the device plugin publish; with `shares`, a sharing plugin too)."""
    gpu: dict[str, Any] = {"model": "A100-80GB", "count": count, "shares": shares}
    if mig:
        gpu.update(mig=mig, migGPUs=1)
    spec = parse_pool_spec({"pools": [{"name": name, "count": 1, "gpu": gpu, "cpu": "16", "memory": "64Gi"}]})
    return node_objects(spec.pools[0])[0]


# -- how a node says it can give a share ------------------------------------------------------------------------------

def test_a_pool_with_shares_advertises_a_thousand_per_gpu_without_mig_and_is_read_as_share_capable():
    plain, sharing = node("plain", shares=False), node("sharing", shares=True, count=2, mig="all-3g.40gb")
    assert "gpuaas.io/gpu-share" not in plain["status"]["allocatable"]
    assert sharing["status"]["allocatable"]["gpuaas.io/gpu-share"] == "1000"  # 2 GPUs, 1 with MIG: 1 x 1000
    assert node_spec(plain).gpu_shares is False and node_spec(sharing).gpu_shares is True


def test_nodes_built_by_hand_or_from_a_trace_give_shares_as_before():
    assert NodeSpec("n", 1000, 1000, gpus=1, gpu_model="A100-80GB").gpu_shares is True
    spec = pools_from_node_specs([NodeSpec("n", 8000, 65_536, gpus=8, gpu_model="A100-80GB")])
    assert spec.pools[0].gpu is not None and spec.pools[0].gpu.shares is True  # so the replay's nodes take shares


@pytest.mark.parametrize(("gpu", "pool", "words"), [
    ({"replicas": 4, "shares": True}, {}, "shares and replicas 4: a time-slicing device plugin hands out replicas"),
    ({"mig": "all-1g.10gb", "shares": True}, {}, "every GPU has MIG enabled"),
    ({"shares": True}, {"dra": True}, "a dra pool shares GPUs through claims"),
])
def test_shares_that_cannot_be_given_are_refused_in_the_pool_spec(gpu, pool, words):
    with pytest.raises(PoolSpecError, match=words):
        parse_pool_spec({"pools": [{"name": "p", "count": 1, "gpu": {"model": "A100-80GB", "count": 2, **gpu},
                                    **pool}]})


# -- the filter -----------------------------------------------------------------------------------------------------

def test_a_share_fits_only_nodes_with_a_sharing_plugin_and_others_say_why_for_good():
    state = ClusterState([node_spec(node("plain", shares=False)), node_spec(node("sharing", shares=True))])
    for pod in (SHARE, WHOLE_SHARE):
        assert feasible(state, pod).tolist() == [False, True]
        verdict = filter_nodes(state, pod, ["plain-0000", "sharing-0000"])
        assert verdict.feasible == ["sharing-0000"]
        # Unresolvable: no free capacity would change it, so preemption skips the node (FailedAndUnresolvableNodes).
        assert verdict.unresolvable == {"plain-0000": NO_SHARE_PLUGIN} and not verdict.failed
    assert "no device plugin on it advertises gpuaas.io/gpu-share" in NO_SHARE_PLUGIN
    assert "ResourceClaim of class gpu-share.gpuaas.io" in NO_SHARE_PLUGIN
    for pod in (ONE, TWO):  # nvidia.com/gpu pods do not care
        assert feasible(state, pod).tolist() == [True, True]


def test_a_time_sliced_node_keeps_its_own_reason():
    ts = NodeSpec("ts", 16_000, 65_536, gpus=1, gpu_model="T4", gpu_replicas=4, gpu_shares=False)
    state = ClusterState([ts, NodeSpec("plain", 16_000, 65_536, gpus=1, gpu_model="T4", gpu_shares=False)])
    code, messages, resolvable = misfit_reasons(state, SHARE, np.array([0, 1]))
    assert messages[code[0]].startswith("node time-slices its GPUs (nvidia.com/gpu.replicas=4)")
    assert messages[code[1]] == NO_SHARE_PLUGIN and code.max() < resolvable


def test_a_full_share_capable_node_says_it_is_full_not_that_it_cannot_share():
    state = ClusterState([NodeSpec("s", 16_000, 65_536, gpus=1, gpu_model="T4")])
    state.place(0, PodDemand(0, 0, gpus=1, gpu_milli=900), (0,))
    code, messages, resolvable = misfit_reasons(state, SHARE, np.array([0]))
    assert messages[code[0]] == "no GPU with 250/1000 free" and code[0] >= resolvable


# -- counts, not indices, on device-plugin nodes ------------------------------------------------------------------

def test_which_gpus_the_device_plugin_gave_changes_no_verdict():
    """Two bound one-GPU pods and a MIG instance on an 8-GPU node whose plugin picks the devices: whichever GPU indices
    the model books them on, every pod gets the same filter verdict and the same reason."""
    spec = node_spec(node("dp", shares=False, count=8, mig="all-3g.40gb"))  # GPU 7 in MIG mode (2 x 3g.40gb)
    pods = [ONE, TWO, PodDemand(0, 0, gpus=4, gpu_milli=1000), PodDemand(0, 0, gpus=6, gpu_milli=1000), MIG,
            SHARE]
    answers = set()
    for a, b in itertools.permutations(range(7), 2):
        state = ClusterState([spec])
        state.place(0, ONE, (a,))
        state.place(0, ONE, (b,))
        state.place(0, MIG, (7,))
        answers.add(tuple((bool(feasible(state, p)[0]), reason(state, p)) for p in pods))
    assert len(answers) == 1
    (answer,) = answers
    # 5 whole GPUs free (7 without MIG, 2 taken), one 3g.40gb instance left, no share: the counts decide.
    assert [fits for fits, _ in answer] == [True, True, True, False, True, False]
    assert answer[3][1] == "insufficient whole GPUs: 5 free, 6 requested" and answer[5][1] == NO_SHARE_PLUGIN


def reason(state: ClusterState, pod: PodDemand) -> str:
    code, messages, _ = misfit_reasons(state, pod, np.array([0]))
    return messages[int(code[0])]


# -- scores and plans --------------------------------------------------------------------------------------------------

def test_fragmentation_counts_no_room_for_share_shapes_where_no_share_fits():
    workload = Workload.typical([SHARE, ONE])
    plain, sharing = (NodeSpec(n, 16_000, 65_536, gpus=1, gpu_model="T4", gpu_shares=s)
                      for n, s in (("plain", False), ("sharing", True)))
    state = ClusterState([plain, sharing])
    state.place(0, PodDemand(0, 0, gpus=1, gpu_milli=500), (0,))  # half a GPU idle on each: usable by 250 shares
    state.place(1, PodDemand(0, 0, gpus=1, gpu_milli=500), (0,))
    index = FragmentationIndex(state, workload)
    share_col = int(np.flatnonzero(index.milli == 250)[0])
    assert index.count[:, share_col].tolist() == [0, 1] and index.usable[:, share_col].tolist() == [0, 500]
    assert index.frag[0] > index.frag[1]  # the idle half is stranded where no share can use it


def test_the_node_scaler_grows_a_sharing_group_for_shares_and_either_for_whole_gpus():
    plain = NodeGroup("plain", NodeSpec("t", 16_000, 65_536, gpus=1, gpu_model="T4", gpu_shares=False), 1.0, 4)
    sharing = NodeGroup("sharing", NodeSpec("t", 16_000, 65_536, gpus=1, gpu_model="T4"), 2.0, 4)
    plan = cheapest_nodes([SHARE, SHARE], [plain, sharing])
    assert plan.ok and plan.new_nodes == {"sharing": 1}, plan
    plan = cheapest_nodes([ONE], [plain, sharing])
    assert plan.ok and plan.new_nodes == {"plain": 1}, plan
    plan = cheapest_nodes([SHARE], [plain])
    assert not plan.new_nodes and plan.unplaceable, plan


def test_the_gang_planner_places_no_share_on_a_node_without_a_sharing_plugin():
    state = ClusterState([NodeSpec("plain", 16_000, 65_536, gpus=2, gpu_model="T4", gpu_shares=False),
                          NodeSpec("sharing", 16_000, 65_536, gpus=1, gpu_model="T4")])
    plan = place_gang(state, [SHARE, SHARE, SHARE], workload=Workload.typical([SHARE]))
    assert plan.ok and {state.names[n] for n, _ in plan.placements} == {"sharing"}, plan
    assert not place_gang(state, [SHARE] * 5, workload=Workload.typical([SHARE])).ok  # 4 x 250 fill the one sharing GPU


# -- channels: DRA nodes give GPUs to claims only ------------------------------------------------------------------

def test_a_dra_node_gives_no_extended_resource_share_and_a_device_plugin_node_nothing_to_claims():
    """An extended-resource share (which kube-scheduler ignores, so only the extender can keep it off a DRA node) is
    refused on the DRA node with a reason; a pod asking through claims fits the DRA node only."""
    dra = NodeSpec("dra", 16_000, 65_536, gpus=1, gpu_model="A100-80GB", dra=True)
    state = ClusterState([dra, NodeSpec("sharing", 16_000, 65_536, gpus=1, gpu_model="A100-80GB")])
    verdict = filter_nodes(state, SHARE, ["dra", "sharing"])
    assert verdict.feasible == ["sharing"] and verdict.unresolvable == {"dra": DRA_NODE}
    claimed = dataclasses.replace(SHARE, claims=True)
    verdict = filter_nodes(state, claimed, ["dra", "sharing"])
    assert verdict.feasible == ["dra"] and verdict.unresolvable == {"sharing": PLUGIN_NODE}
    assert feasible(state, dataclasses.replace(ONE, claims=True)).tolist() == [True, False]
    plan = place_gang(state, [claimed, claimed], workload=Workload.typical([SHARE]))
    assert plan.ok and {state.names[n] for n, _ in plan.placements} == {"dra"}, plan


def test_a_claims_demand_and_a_dra_node_spec_say_so():
    from runtime.draslices import resource_slices
    from scoring.dra import dra_node_spec
    from scoring.draclaims import claim_demand, combined_demand

    pool = parse_pool_spec({"pools": [{"name": "d", "count": 1, "dra": True,
                                       "gpu": {"model": "A100-80GB", "count": 2}}]}).pools[0]
    spec = dra_node_spec(node_objects(pool)[0], resource_slices(pool, "d-0000"))
    assert spec.dra and spec.gpus == 2
    asked = claim_demand({"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu-share.gpuaas.io", "capacity": {"requests": {"share": "250"}}}}]}}, "claim")
    assert asked is not None
    demand = combined_demand(PodDemand(1000, 1024), [asked], "pod")
    assert demand.claims and demand.is_share and demand.gpu_milli == 250

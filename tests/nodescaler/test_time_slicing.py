"""The node scaler sizes time-sliced groups by their replicas (issue 16): a group whose template declares `replicas: R`
renders nodes with R `nvidia.com/gpu` devices per GPU, and its what-if agrees with the extender's filter and the
simulator: four one-GPU pods on one 1-GPU node of 4 replicas, a fifth is a new node."""
from __future__ import annotations

from nodescaler.scaleout import plan_scale_out
from nodescaler.snapshot import build_snapshot
from scoring.model import PodDemand
from scoring.simulation import simulate
from scoring.verdicts import filter_nodes

from .builders import T0, booting_node, config, nodes, pending, pod

T4X1 = {"gpu": {"model": "T4", "count": 1, "replicas": 4}, "cpu": "16", "memory": "64Gi"}
GROUPS = [{"name": "t4", "template": T4X1, "max_size": 10, "cost_per_hour": 1}]


def test_a_time_sliced_group_renders_its_replicas_and_its_model_reads_them_back():
    group = config(GROUPS).group("t4")
    node = group.template_node()
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    spec = group.node_spec("t4-x")
    assert (spec.gpus, spec.gpu_model, spec.gpu_replicas) == (1, "T4", 4)


def test_five_one_gpu_pods_need_two_nodes_of_four_replicas():
    plan = plan_scale_out(build_snapshot([], [pending(f"p{i}", gpus=1) for i in range(5)], [], T0), config(GROUPS))
    assert [(g.group, g.count) for g in plan.grows] == [("t4", 2)] and plan.unplaceable == {}
    assert plan.planner_status.startswith("optimal")  # first-fit meets ceil(5 / (1 GPU x 4 replicas))


def test_four_pods_on_the_node_and_a_fifth_pending_grow_one_more_node_as_the_filter_and_simulator_agree():
    (node,) = nodes("t4", 1, T4X1)
    running = [pod(f"r{i}", node="t4-0000", gpus=1) for i in range(4)]
    fifth = pending("p4", gpus=1)
    snap = build_snapshot([node], running + [fifth], [], T0)
    # The model the node scaler decides on is the extender's: the node is full, and says why.
    verdict = filter_nodes(snap.state, snap.pending[0].known_demand, ["t4-0000"])
    assert verdict.failed["t4-0000"].startswith("insufficient GPU replicas: 0 free, 1 requested")
    plan = plan_scale_out(snap, config(GROUPS))
    assert plan.fit_now == [] and [(g.group, g.count, g.pods) for g in plan.grows] == [("t4", 1, ("default/p4",))]
    # The simulator, on the same node, places four of the five and fails the fifth.
    result = simulate([config(GROUPS).group("t4").node_spec("t4-0000")], [PodDemand(1000, 1024, gpus=1,
                                                                                    gpu_milli=1000)] * 5,
                      "gpuaas", seed=1, tune=0)
    assert (result.pods, result.failed) == (5, 1)


def test_three_of_four_replicas_taken_leave_room_for_one_more_pod_not_a_node():
    (node,) = nodes("t4", 1, T4X1)
    running = [pod(f"r{i}", node="t4-0000", gpus=1) for i in range(3)]
    plan = plan_scale_out(build_snapshot([node], running + [pending("p3", gpus=1)], [], T0), config(GROUPS))
    assert plan.fit_now == ["default/p3"] and plan.grows == []


def test_pods_wait_for_the_replicas_of_a_booting_time_sliced_node():
    cfg = config(GROUPS)
    node = booting_node(cfg, "t4", "t4-abc")  # registered, its 4 replicas not yet allocatable
    plan = plan_scale_out(build_snapshot([node], [pending(f"p{i}", gpus=1) for i in range(5)], [], T0), cfg)
    assert len(plan.wait_upcoming) == 4 and [(g.group, g.count) for g in plan.grows] == [("t4", 1)]


def test_a_gpu_share_is_never_grown_for_on_a_time_sliced_group():
    plan = plan_scale_out(build_snapshot([], [pending("s", gpu_share=250)], [], T0), config(GROUPS))
    assert plan.grows == [] and plan.unplaceable == {"default/s": "fits no node group's template"}

"""Scale-out decisions on hand-built snapshots: which group, how many nodes, and when not to grow."""
from __future__ import annotations

from nodescaler.scaleout import Upcoming, plan_scale_out
from nodescaler.snapshot import build_snapshot

from .builders import A100X8, T0, booting_node, config, mig_nodes, nodes, pending, pod


def snap(node_objs, pod_objs, pdbs=(), now=T0):
    return build_snapshot(node_objs, pod_objs, pdbs, now)


def test_eight_gpu_pods_grow_the_cheapest_group_that_fits_them():
    # a100x4 (11/h) cannot host 8 GPUs; a100x8 (20/h) is cheaper than h100x8 (32/h): 5 pods -> 5 a100x8 nodes.
    plan = plan_scale_out(snap([], [pending(f"p{i}", gpus=8) for i in range(5)]), config())
    assert [(g.group, g.count) for g in plan.grows] == [("a100x8", 5)]
    assert len(plan.grows[0].pods) == 5 and plan.unplaceable == {}


def test_first_fit_at_the_lower_bound_skips_the_solver_and_otherwise_the_planner_decides():
    # 50 x 8 GPUs on 8-GPU nodes: first-fit's 50 nodes = ceil(400 / 8), provably optimal.
    plan = plan_scale_out(snap([], [pending(f"p{i}", gpus=8) for i in range(50)]), config())
    assert [(g.group, g.count) for g in plan.grows] == [("a100x8", 50)]
    assert plan.planner_status.startswith("optimal (first-fit")
    # 3 x 5 GPUs: the bound says ceil(15 / 8) = 2 nodes, first-fit needs 3: the planner decides (3, all a100x8).
    plan = plan_scale_out(snap([], [pending(f"q{i}", gpus=5) for i in range(3)]), config())
    assert [(g.group, g.count) for g in plan.grows] == [("a100x8", 3)]
    assert not plan.planner_status.startswith("optimal (first-fit")


def test_small_pods_pack_onto_the_cheapest_capacity():
    # 6 one-GPU pods: one a100x4 (11/h) holds 4, so 2 x a100x4 = 22/h beats 1 x a100x8 = 20/h? No: 20 < 22, so one
    # a100x8 node hosts all six.
    plan = plan_scale_out(snap([], [pending(f"p{i}", gpus=1) for i in range(6)]), config())
    assert [(g.group, g.count) for g in plan.grows] == [("a100x8", 1)]


def test_pods_that_fit_on_an_existing_node_do_not_grow_anything():
    plan = plan_scale_out(snap(nodes("a100", 1), [pending("p", gpus=8)]), config())
    assert plan.grows == [] and plan.fit_now == ["default/p"]


def test_cordoned_nodes_are_not_capacity():
    (n,) = nodes("a100", 1)
    n["spec"]["unschedulable"] = True
    plan = plan_scale_out(snap([n], [pending("p", gpus=8)]), config())
    assert [(g.group, g.count) for g in plan.grows] == [("a100x8", 1)]


def test_pods_waiting_on_a_booting_node_do_not_scale_twice():
    cfg = config()
    # The booting node registered without allocatable GPUs: not capacity now, but on its way.
    node = booting_node(cfg, "a100x8", "a100x8-abc")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "0"
    plan = plan_scale_out(snap([node], [pending("p1", gpus=8), pending("p2", gpus=8)]), cfg)
    assert plan.wait_upcoming == ["default/p1"] or plan.wait_upcoming == ["default/p2"]
    assert [(g.group, g.count) for g in plan.grows] == [("a100x8", 1)]  # only the second pod needs a node


def test_a_registering_node_with_the_not_ready_taint_still_counts_as_upcoming():
    cfg = config()
    node = booting_node(cfg, "a100x8", "a100x8-new")
    node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    node["spec"]["taints"] = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    plan = plan_scale_out(snap([node], [pending("p", gpus=8)]), cfg)
    assert plan.grows == [] and plan.wait_upcoming == ["default/p"]


def test_nodes_asked_for_but_not_yet_registered_count_as_upcoming():
    s = snap([], [pending("p1", gpus=8)])
    plan = plan_scale_out(s, config(), requested=[Upcoming("a100x8-new", "a100x8", T0 + 60)])
    assert plan.grows == [] and plan.wait_upcoming == ["default/p1"]


def test_backed_off_group_is_skipped_for_the_next_cheapest():
    plan = plan_scale_out(snap([], [pending("p", gpus=8)]), config(), backed_off={"a100x8"})
    assert [(g.group, g.count) for g in plan.grows] == [("h100x8", 1)]


def test_max_size_caps_growth_and_the_rest_is_reported():
    cfg = config([{"name": "a100x8", "template": A100X8, "max_size": 3, "cost_per_hour": 20}])
    plan = plan_scale_out(snap([], [pending(f"p{i}", gpus=8) for i in range(5)]), cfg)
    assert [(g.group, g.count) for g in plan.grows] == [("a100x8", 2)] or \
        [(g.group, g.count) for g in plan.grows] == [("a100x8", 3)]
    assert sum(g.count for g in plan.grows) + len(plan.unplaceable) >= 5
    assert all("max sizes" in why for why in plan.unplaceable.values())


def test_a_pod_no_template_can_host_is_unplaceable_with_the_reason():
    p = pending("h200", gpus=1, annotations={"gpuaas.io/gpu-models": "H200-141GB"})
    plan = plan_scale_out(snap([], [p]), config())
    assert plan.grows == []
    assert plan.unplaceable == {"default/h200": "fits no node group's template"}


def test_mig_requests_repartition_an_idle_node_instead_of_growing():
    # Two idle all-1g.10gb nodes; 4 x 3g.40gb fit on two GPUs of one node once it is all-3g.40gb (2 per GPU).
    s = snap(mig_nodes("mig", 2), [pending(f"m{i}", mig="3g.40gb") for i in range(4)])
    plan = plan_scale_out(s, config())
    assert plan.grows == []
    assert [(m.config, len(m.pods)) for m in plan.mig] == [("all-3g.40gb", 4)]


def test_a_node_with_a_mig_pod_running_is_not_repartitioned():
    busy, idle = mig_nodes("mig", 2)
    s = snap([busy, idle], [pod("r", node=busy["metadata"]["name"], mig="1g.10gb"),
                            pending("m", mig="3g.40gb")])
    plan = plan_scale_out(s, config())
    assert [m.node for m in plan.mig] == [idle["metadata"]["name"]]


def test_repartition_disabled_means_the_mig_pod_is_unplaceable_here():
    s = snap(mig_nodes("mig", 1), [pending("m", mig="3g.40gb")])
    plan = plan_scale_out(s, config(scale_out={"mig_repartition": False}))
    assert plan.mig == [] and "default/m" in plan.unplaceable


def test_pods_younger_than_the_batching_delay_wait():
    s = snap([], [pending("p", gpus=8, created=T0)])
    assert plan_scale_out(s, config(scale_out={"new_pod_delay_s": 1})).grows == []
    assert plan_scale_out(s, config()).grows != []


def test_a_dominated_group_is_used_once_the_cheaper_one_runs_out_of_room():
    # a100x8 (20/h) dominates h100x8 (32/h) for pods without a model restriction, but it has room for 2 nodes only.
    cfg = config([{"name": "a100x8", "template": A100X8, "max_size": 2, "cost_per_hour": 20},
                  {"name": "h100x8", "template": {**A100X8, "gpu": {"model": "H100-80GB", "count": 8}},
                   "max_size": 10, "cost_per_hour": 32}])
    plan = plan_scale_out(snap([], [pending(f"p{i}", gpus=8) for i in range(3)]), cfg)
    assert sorted((g.group, g.count) for g in plan.grows) == [("a100x8", 2), ("h100x8", 1)]


def test_a_pod_restricted_to_h100_is_not_served_by_the_dominating_cheaper_group():
    p = pending("h", gpus=8, annotations={"gpuaas.io/gpu-models": "H100-80GB"})
    plan = plan_scale_out(snap([], [p, pending("a", gpus=8)]), config())
    assert sorted((g.group, g.count) for g in plan.grows) == [("a100x8", 1), ("h100x8", 1)]

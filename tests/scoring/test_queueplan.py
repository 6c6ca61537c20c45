"""Joint planning of the pending queue (scoring/queueplan.py) and how the extender's verdicts use a plan."""
from __future__ import annotations

import numpy as np

from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.placement import Placer
from scoring.policies import make_policy
from scoring.queueplan import QueuedPod, plan_order, plan_queue
from scoring.verdicts import HELD_FOR_PLAN, Priorities, filter_nodes, hold_for_plan, steer

NODES = [NodeSpec("a", 32_000, 128_000, 4, "A100-80GB"), NodeSpec("b", 32_000, 128_000, 4, "A100-80GB")]


def gpus(name: str, n: int) -> PodDemand:
    return PodDemand(cpu_milli=1000, memory_mib=1024, gpus=n, gpu_milli=1000, name=name)


def queue(*sizes: int) -> list[QueuedPod]:
    return [QueuedPod(f"ns/p{i}", gpus(f"p{i}", n), float(i)) for i, n in enumerate(sizes)]


def test_largest_first_places_what_arrival_order_cannot():
    """Two 4-GPU nodes; 1, 1, 3 and 3 GPUs arrive in that order. First-fit one at a time puts both 1-GPU pods on
    `a` and has no room left for the second 3-GPU pod; planned together, largest first, all four fit."""
    state = ClusterState(NODES)
    one_by_one = Placer(state, make_policy("first-fit", state))
    assert [one_by_one.place(p.demand) is not None for p in queue(1, 1, 3, 3)] == [True, True, True, False]

    state = ClusterState(NODES)
    plan = plan_queue(state, "first-fit", None, queue(1, 1, 3, 3), now=10.0, max_wait_s=60.0)
    assert plan.left_out == [] and {k: c.node for k, c in plan.planned.items()} == {
        "ns/p2": 0, "ns/p3": 1, "ns/p0": 0, "ns/p1": 1}
    assert state.gpu_left.sum() == 8000  # the live model is not touched; the plan's copy holds the pods
    assert plan.reserved is not None and plan.reserved.gpu_left.sum() == 0


def test_a_pod_waiting_past_max_wait_goes_first():
    q = queue(1, 4, 2)
    assert [p.key for p in plan_order(q, now=10.0, max_wait_s=60.0)] == ["ns/p1", "ns/p2", "ns/p0"]
    # p0 has waited 70 s: it goes first, and the 4-GPU pod that would have filled `a` waits for `b`.
    assert [p.key for p in plan_order(q, now=70.0, max_wait_s=60.0)] == ["ns/p0", "ns/p1", "ns/p2"]


def test_a_pod_left_out_may_not_take_room_promised_to_planned_pods():
    state = ClusterState(NODES)
    plan = plan_queue(state, "first-fit", None, queue(4, 4), now=0.0, max_wait_s=60.0)
    assert plan.reserved is not None
    late = gpus("late", 1)  # arrived after the plan: fits anywhere now, nowhere the plan keeps free
    verdict = filter_nodes(state, late, ["a", "b"])
    assert verdict.feasible == ["a", "b"]
    assert hold_for_plan(verdict, plan.reserved, late) == 2
    assert verdict.feasible == [] and verdict.failed == {"a": HELD_FOR_PLAN, "b": HELD_FOR_PLAN}
    assert verdict.feasible_rows is not None and verdict.feasible_rows.size == 0


def test_steer_ranks_the_planned_node_first_only_where_the_pod_fits():
    state = ClusterState(NODES)
    scored = Priorities(["a", "b"], np.array([0, 1]), np.array([10, 4]), "a", state.names)
    steered = steer(state, scored, gpus("p", 2), 1)
    assert steered.pick == "b" and steered.scores.tolist() == [8, 10]
    state.place(1, gpus("x", 4), (0, 1, 2, 3))  # `b` is full now: the plan is stale, the ranking stays
    assert steer(state, scored, gpus("p", 2), 1) is scored


def test_windows_keep_arrival_order_between_them_and_size_order_inside():
    """Six arrivals, windows of three: the first three go largest first, then the next three; a small early pod is
    never passed over by a big late one, which one window (the whole queue) would do."""
    q = queue(1, 4, 2, 4, 1, 2)  # p0..p5, arriving in that order
    assert [p.key for p in plan_order(q, now=10.0, max_wait_s=60.0, window=3)] == [
        "ns/p1", "ns/p2", "ns/p0", "ns/p3", "ns/p5", "ns/p4"]
    assert [p.key for p in plan_order(q, now=10.0, max_wait_s=60.0)][:3] == ["ns/p1", "ns/p3", "ns/p2"]


def test_a_pinned_pod_is_planned_on_its_node_first_and_only_there():
    s = ClusterState([NodeSpec(f"n{i}", 96_000, 512_000, 8, "A100-80GB") for i in range(2)])
    q = [QueuedPod("a", gpus("a", 8), 0.0), QueuedPod("b", gpus("b", 8), 1.0, pinned="host-0")]
    plan = plan_queue(s, "bestfit", None, q, now=2.0, max_wait_s=100.0, rows_by_hostname={"host-0": 0, "host-1": 1})
    assert plan.node_of("b") == 0 and plan.node_of("a") == 1  # b goes first on its pin; a takes the other node
    lost = plan_queue(s, "bestfit", None, [QueuedPod("c", gpus("c", 8), 0.0, pinned="gone")], now=2.0,
                      max_wait_s=100.0, rows_by_hostname={"host-0": 0})
    assert lost.left_out == ["c"]  # pinned to a node the model does not have: planned nowhere else

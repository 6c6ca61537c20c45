"""Joint planning of the pending queue (scoring/queueplan.py) and how the extender's verdicts use a plan."""
from __future__ import annotations

import random

import numpy as np
import pytest

from scoring.fit import feasible, misfit_reason
from scoring.fragmentation import Workload
from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.placement import Placer
from scoring.policies import make_policy
from scoring.queueplan import QueuedPod, QueuePlan, plan_order, plan_queue, replan_reason, update_plan
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


# ---- a plan kept and updated (update_plan) against a plan made in full --------------------------------------------
FLEET = [NodeSpec(f"n{i:02d}", 64_000, 512_000, 8 if i % 3 else 4, "A100-80GB") for i in range(12)]
SHAPES = [gpus("", 1), gpus("", 1), gpus("", 2), gpus("", 4),
          PodDemand(cpu_milli=2000, memory_mib=4096, gpus=1, gpu_milli=500, name="")]
WORKLOAD = Workload.typical(SHAPES)


class Live:
    """What the extender's view does to the live model, kept small: pods bound (where planned, or elsewhere), given
    back (a failed binding: the pod waits again; a finished pod: gone), arrivals, deletions; the rows it changed."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.state = ClusterState(FLEET)
        self.queue: dict[str, QueuedPod] = {}
        self.bound: dict[str, tuple[QueuedPod, int, tuple[int, ...]]] = {}
        self.changed: set[int] = set()
        self.t = 0.0
        self.n = 0

    def arrive(self) -> None:
        shape = self.rng.choice(SHAPES)
        key = f"ns/p{self.n}"
        self.queue[key] = QueuedPod(key, PodDemand(**{**shape.__dict__, "name": key}), self.t)
        self.n += 1

    def bind(self, key: str, row: int, devices: tuple[int, ...]) -> bool:
        pod = self.queue[key]
        if misfit_reason(self.state, pod.demand, row) is not None:
            return False
        try:
            self.state.place_or_refuse(row, pod.demand, devices)
        except ValueError:  # the devices are taken
            return False
        del self.queue[key]
        self.bound[key] = (pod, row, devices)
        self.changed.add(row)
        return True

    def bind_anywhere(self, key: str) -> bool:
        demand = self.queue[key].demand
        rows = np.flatnonzero(feasible(self.state, demand))
        if rows.size == 0:
            return False
        row = int(self.rng.choice(rows.tolist()))
        return self.bind(key, row, make_policy("first-fit", self.state).devices(self.state, demand, row))

    def give_back(self, key: str, *, requeue: bool) -> None:
        pod, row, devices = self.bound.pop(key)
        self.state.remove(row, pod.demand, devices)
        self.changed.add(row)
        if requeue:
            self.queue[key] = pod

    def take_changes(self) -> list[int]:
        rows, self.changed = sorted(self.changed), set()
        return rows


def planned_model(live: ClusterState, plan: QueuePlan) -> ClusterState:
    """The live model with every planned pod placed where the plan put it: what `reserved` must be."""
    out = live.copy()
    for key, choice in plan.planned.items():
        out.place(choice.node, plan.pods[key].demand, choice.devices)
    return out


def assert_consistent(plan: QueuePlan, live: Live) -> None:
    """What an updated plan shares with any plan made in full on the same model and queue."""
    assert plan.reserved is not None and plan.placer is not None
    assert set(plan.planned) | set(plan.left_out) == set(live.queue)  # every waiting pod, once
    assert not set(plan.planned) & set(plan.left_out) and len(plan.left_out) == len(set(plan.left_out))
    expected = planned_model(live.state, plan)
    for name in ClusterState.ROW_ARRAYS:
        assert np.array_equal(getattr(plan.reserved, name), getattr(expected, name)), name
    assert [sorted(map(repr, pods)) for pods in plan.reserved.pods_on] == \
        [sorted(map(repr, pods)) for pods in expected.pods_on]
    assert (plan.reserved.cpu_left >= 0).all() and (plan.reserved.gpu_left >= 0).all()  # nothing promised twice
    for key in plan.left_out:  # a pod left out fits nowhere beside the planned ones
        assert not feasible(plan.reserved, live.queue[key].demand).any(), key
    # The policy's tables followed every row taken back: they score as tables made anew on the same model.
    fresh = make_policy("gpuaas", plan.reserved, WORKLOAD)
    mask = feasible(plan.reserved, SHAPES[0])
    assert np.array_equal(plan.placer.policy.score(plan.reserved, SHAPES[0], mask),
                          fresh.score(plan.reserved, SHAPES[0], mask))


@pytest.mark.parametrize("seed", range(8))
def test_an_updated_plan_is_the_live_model_with_every_planned_pod_placed(seed):
    """Random sequences of arrivals, pods bound where planned, bound elsewhere (kube-scheduler overruled the plan, or
    a left-out pod bound on room that freed), failed bindings (the pod waits again) and finished pods, the plan
    updated every few events: it always holds every waiting pod once, its reserved model is exactly the live model
    with the planned pods placed (so the room it promises is real and promised once), the pods it left out fit
    nowhere beside them, and a pod whose planned node still has its room keeps it. Which node a pod is planned on may
    differ from a plan made in full now (the arrivals are placed after the pods planned before them, not among
    them), and so may which pods are left out when they compete; how many GPUs the plans promise stays close."""
    rng = random.Random(seed)
    live = Live(rng)
    for _ in range(40):
        live.arrive()
    plan = plan_queue(live.state, "gpuaas", WORKLOAD, list(live.queue.values()), now=0.0, max_wait_s=1e9, window=8)
    live.take_changes()
    assert_consistent(plan, live)
    promised, promised_full = 0, 0
    for step in range(30):
        live.t = float(step + 1)
        for _ in range(rng.randint(1, 6)):
            event = rng.random()
            if event < 0.45 and plan.planned:
                key = rng.choice(sorted(plan.planned))
                if key in live.queue:
                    live.bind(key, plan.planned[key].node, plan.planned[key].devices)
            elif event < 0.6 and live.queue:
                live.bind_anywhere(rng.choice(sorted(live.queue)))
            elif event < 0.7 and live.bound:
                live.give_back(rng.choice(sorted(live.bound)), requeue=rng.random() < 0.5)
            elif event < 0.75 and live.queue:
                del live.queue[rng.choice(sorted(live.queue))]
            else:
                live.arrive()
        kept = {k: c for k, c in plan.planned.items() if k in live.queue}
        changed = live.take_changes()
        untouched = set(range(len(FLEET))) - set(changed) - {c.node for k, c in plan.planned.items() if k not in kept}
        update_plan(plan, live.state, list(live.queue.values()), changed, now=live.t, max_wait_s=1e9, window=8)
        assert_consistent(plan, live)
        for key, choice in kept.items():  # on a row nothing changed: the same node and devices
            if choice.node in untouched:
                assert plan.planned[key] == choice
        full = plan_queue(live.state, "gpuaas", WORKLOAD, list(live.queue.values()), now=live.t, max_wait_s=1e9,
                          window=8)
        promised += sum(plan.pods[k].demand.total_gpu_milli for k in plan.planned)
        promised_full += sum(live.queue[k].demand.total_gpu_milli for k in full.planned)
    assert promised >= 0.95 * promised_full


def test_pods_bound_where_planned_leave_the_rest_of_the_plan_as_a_full_plan_makes_it():
    """With one window, pods bound where the plan put them, in plan order, leave the remaining pods planned exactly
    as a plan made in full on the new model: an update then places nothing (the work a plan made in full every
    refresh did again for every waiting pod)."""
    rng = random.Random(3)
    live = Live(rng)
    for _ in range(60):
        live.arrive()
    plan = plan_queue(live.state, "gpuaas", WORKLOAD, list(live.queue.values()), now=0.0, max_wait_s=1e9)
    order = list(plan.planned)  # plan order
    for key in order[:25]:
        choice = plan.planned[key]
        live.bind(key, choice.node, choice.devices)
    placed = update_plan(plan, live.state, list(live.queue.values()), live.take_changes(), now=1.0,
                         max_wait_s=1e9)
    assert placed == len(plan.left_out)  # only the pods left out before are tried again
    assert_consistent(plan, live)
    full = plan_queue(live.state, "gpuaas", WORKLOAD, list(live.queue.values()), now=1.0, max_wait_s=1e9)
    assert plan.planned == full.planned and plan.left_out == full.left_out


def test_an_update_places_the_arrivals_and_the_pods_whose_room_went_and_nothing_else():
    rng = random.Random(5)
    live = Live(rng)
    for _ in range(30):
        live.arrive()
    plan = plan_queue(live.state, "gpuaas", WORKLOAD, list(live.queue.values()), now=0.0, max_wait_s=1e9)
    assert plan.left_out == []
    row = next(iter(plan.planned.values())).node
    victims = list(plan.on_row[row])
    # A pod bound past the plan takes all the CPU of a node pods were planned on: their planned room is gone.
    live.queue["ns/hog"] = QueuedPod("ns/hog", PodDemand(cpu_milli=64_000, memory_mib=1024, name="hog"), 0.0)
    assert live.bind("ns/hog", row, ())
    live.arrive()
    live.arrive()
    placed = update_plan(plan, live.state, list(live.queue.values()), live.take_changes(), now=1.0, max_wait_s=1e9)
    assert placed == len(victims) + 2 and plan.placed_since == placed
    assert row not in plan.on_row and all(plan.planned.get(k) is None or plan.planned[k].node != row for k in victims)
    assert_consistent(plan, live)


def test_when_a_plan_is_made_in_full_again():
    live = Live(random.Random(1))
    for _ in range(10):
        live.arrive()
    plan = plan_queue(live.state, "gpuaas", WORKLOAD, list(live.queue.values()), now=0.0, max_wait_s=60.0)
    queue = list(live.queue.values())
    assert replan_reason(plan, queue, now=10.0, max_wait_s=60.0, max_age_s=30.0, share=0.5) is None
    assert replan_reason(plan, queue, now=30.0, max_wait_s=60.0, max_age_s=30.0, share=0.5) == "age"
    late = [QueuedPod(f"ns/late{i}", gpus(f"late{i}", 1), 5.0) for i in range(6)]
    assert replan_reason(plan, queue + late[:5], now=10.0, max_wait_s=60.0, max_age_s=30.0, share=0.5) is None
    assert replan_reason(plan, queue + late, now=10.0, max_wait_s=60.0, max_age_s=30.0, share=0.5) == "drift"
    # A pod the plan does not place that turned overdue after the plan was made: it goes first only in a full plan.
    old = QueuedPod("ns/old", gpus("old", 1), -55.0)
    assert replan_reason(plan, queue + [old], now=4.0, max_wait_s=60.0, max_age_s=30.0, share=0.5) is None
    assert replan_reason(plan, queue + [old], now=6.0, max_wait_s=60.0, max_age_s=30.0, share=0.5) == "overdue"
    # One already overdue when the plan was made went first in it; updates try it again, first.
    older = QueuedPod("ns/older", gpus("older", 1), -70.0)
    assert replan_reason(plan, queue + [older], now=6.0, max_wait_s=60.0, max_age_s=30.0, share=0.5) is None


def test_a_pod_queued_again_as_another_pod_is_placed_anew():
    """A planned pod deleted and created again under the same name, asking for more, between two updates: the plan
    holds what the new one asks, not what the old one did."""
    live = Live(random.Random(2))
    for _ in range(5):
        live.arrive()
    plan = plan_queue(live.state, "gpuaas", WORKLOAD, list(live.queue.values()), now=0.0, max_wait_s=1e9)
    key = next(iter(plan.planned))
    live.queue[key] = QueuedPod(key, gpus(key, 8), 1.0)
    assert update_plan(plan, live.state, list(live.queue.values()), [], now=1.0, max_wait_s=1e9) == 1
    assert plan.pods[key].demand.gpus == 8 and len(plan.planned[key].devices) == 8
    assert_consistent(plan, live)

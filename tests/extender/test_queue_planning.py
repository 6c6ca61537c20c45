"""Joint planning of the pending GPU pods in the extender: kube-scheduler takes the pods in its own order, the
extender steers each to the node a largest-first plan of the whole queue gave it, and keeps the room promised to
planned pods from pods the plan left out."""
from __future__ import annotations

import asyncio
import functools
import random
from typing import Any

from extender.metrics import Metrics
from extender.service import ExtenderService, QueuePlanning
from extender.wire import ExtenderArgs, ExtenderBindingArgs
from runtime.pools import parse_pool_spec, spec_node_objects
from scoring.clusterview import ClusterView
from scoring.verdicts import HELD_FOR_PLAN
from tests.conftest import Clock

from .fixtures import bound, pending
from .test_view import RecordingBinder

TWO_NODES = {"pools": [{"name": "a", "count": 2, "gpu": {"model": "A100-80GB", "count": 4}, "cpu": "32",
                        "memory": "128Gi"}]}
NAMES = ["a-0000", "a-0001"]


def cluster(planning: QueuePlanning, pods: dict[str, dict[str, Any]], clock: Clock, *,
            decide_in_filter: bool = False) -> ExtenderService:
    view = ClusterView("first-fit", clock=clock)  # a policy blind to what comes next: the order decides
    for n in spec_node_objects(parse_pool_spec(TWO_NODES)):
        view.on_change("Node", None, n)
    for p in pods.values():
        view.on_change("Pod", None, p)

    async def lookup(namespace: str, name: str) -> dict[str, Any] | None:
        return pods.get(f"{namespace}/{name}")

    return ExtenderService(view, RecordingBinder(), Metrics(), lookup, queue_planning=planning,
                           decide_in_filter=decide_in_filter)


def schedule(svc: ExtenderService, pods: dict[str, dict[str, Any]], order: list[str]) -> dict[str, str | None]:
    """What kube-scheduler does per pod, in `order`: filter, prioritize (unless one node is left), bind to the
    top-ranked node; then the watch shows the pod bound. Returns the node per pod (None: no node fit)."""
    out: dict[str, str | None] = {}
    for name in order:
        pod = pods[f"ml/{name}"]
        fits = svc.filter(ExtenderArgs(Pod=pod, NodeNames=NAMES)).NodeNames
        if not fits:
            out[name] = None
            continue
        node = fits[0] if len(fits) == 1 else svc.prioritize(ExtenderArgs(Pod=pod, NodeNames=fits)).pick
        assert node is not None
        assert svc.view.waiting_count() == len(svc.view.waiting())  # the pod held: no longer waiting
        result = asyncio.run(svc.bind(ExtenderBindingArgs(PodName=name, PodNamespace="ml", PodUID=f"uid-{name}",
                                                          Node=node)))
        assert result.Error == ""
        devices = binder_calls(svc)[-1][2]["gpuaas.io/devices"]
        svc.view.on_change("Pod", pod, bound(pod, node, devices))
        assert svc.view.waiting_count() == len(svc.view.waiting())
        out[name] = node
    return out


def binder_calls(svc: ExtenderService) -> list[tuple[str, str, dict[str, str]]]:
    assert isinstance(svc.binder, RecordingBinder)
    return svc.binder.calls


def burst() -> dict[str, dict[str, Any]]:
    return {f"ml/{n}": pending(n, gpus=g) for n, g in (("one-a", 1), ("one-b", 1), ("three-a", 3), ("three-b", 3))}


def test_a_burst_planned_jointly_places_every_pod_where_one_at_a_time_strands_gpus():
    order = ["one-a", "one-b", "three-a", "three-b"]  # the scheduler's order: small ones first
    pods = burst()
    alone = schedule(cluster(QueuePlanning(min_pods=0), pods, Clock()), pods, order)
    assert alone == {"one-a": "a-0000", "one-b": "a-0000", "three-a": "a-0001", "three-b": None}

    pods = burst()
    svc = cluster(QueuePlanning(min_pods=2, refresh_s=1000.0), pods, Clock())
    jointly = schedule(svc, pods, order)
    assert jointly == {"one-a": "a-0000", "one-b": "a-0001", "three-a": "a-0000", "three-b": "a-0001"}
    decisions = {s.labels["outcome"]: s.value for s in svc.metrics.decisions.collect()[0].samples
                 if s.labels.get("verb") == "prioritize" and s.name.endswith("_total")}
    # The last pod waits alone, below min_pods: no plan, ranked on its own (to the same node).
    assert decisions.get("steered") == 3

    # Decided at filter: the planned node alone, no prioritize, the same placements.
    pods = burst()
    svc = cluster(QueuePlanning(min_pods=2, refresh_s=1000.0), pods, Clock(), decide_in_filter=True)
    assert schedule(svc, pods, order) == jointly
    decisions = {(s.labels["verb"], s.labels["outcome"]): s.value for s in svc.metrics.decisions.collect()[0].samples
                 if s.name.endswith("_total")}
    # (the last pod fits one node only: filter's answer is that node either way, nothing to decide)
    assert decisions.get(("filter", "steered")) == 3 and decisions.get(("filter", "decided")) == 3
    assert not decisions.get(("prioritize", "scored"))


def test_a_pod_the_plan_left_out_is_held_back_until_it_has_waited_max_wait():
    clock = Clock()
    pods: dict[str, dict[str, Any]] = {}
    svc = cluster(QueuePlanning(min_pods=2, refresh_s=10.0, max_wait_s=60.0), pods, clock)

    def arrive(name: str, n: int, t: float) -> dict[str, Any]:
        clock.t = t
        pods[f"ml/{name}"] = pending(name, gpus=n)
        svc.view.on_change("Pod", None, pods[f"ml/{name}"])
        return pods[f"ml/{name}"]

    arrive("big-a", 4, 0.0)
    late = arrive("late", 1, 11.0)
    arrive("big-b", 4, 50.0)
    # Largest first: one 4-GPU pod per node, and no room for the late 1-GPU pod, which may not take theirs.
    verdict = svc.filter(ExtenderArgs(Pod=late, NodeNames=NAMES))
    assert verdict.NodeNames == [] and verdict.FailedNodes == dict.fromkeys(NAMES, HELD_FOR_PLAN)
    clock.t = 72.0  # the late pod has waited 61 s: it goes first with big-a, the older one; big-b, newer, waits
    assert svc.filter(ExtenderArgs(Pod=late, NodeNames=NAMES)).NodeNames == NAMES
    assert svc.plan is not None and svc.plan.left_out == ["ml/big-b"]
    assert svc.prioritize(ExtenderArgs(Pod=late, NodeNames=NAMES)).pick == NAMES[svc.plan.planned["ml/late"].node]


def test_below_min_pods_no_plan_is_made():
    pods = {"ml/solo": pending("solo", gpus=1)}
    svc = cluster(QueuePlanning(min_pods=2), pods, Clock())
    svc.filter(ExtenderArgs(Pod=pods["ml/solo"], NodeNames=NAMES))
    assert svc.plan is None


def test_binding_a_left_out_pod_where_the_plan_has_no_room_drops_the_plan_and_binds():
    """Between filter and bind the plan can change: a pod it left out may be bound on a node its reserved model has
    no room on. The binding goes on (the live model has room) and the plan is made again at the next filter."""
    pods = {f"ml/{n}": pending(n, gpus=4) for n in ("big-a", "big-b")}
    svc = cluster(QueuePlanning(min_pods=2, refresh_s=1000.0), pods, Clock())
    svc.filter(ExtenderArgs(Pod=pods["ml/big-a"], NodeNames=NAMES))
    assert svc.plan is not None and len(svc.plan.planned) == 2  # both nodes promised
    late = pending("late", gpus=1)
    pods["ml/late"] = late
    svc.view.on_change("Pod", None, late)
    result = asyncio.run(svc.bind(ExtenderBindingArgs(PodName="late", PodNamespace="ml", PodUID="uid-late",
                                                      Node="a-0000")))
    assert result.Error == "" and svc.plan is None


def test_a_slow_plan_is_not_made_again_at_every_filter(monkeypatch):
    """On a starved CPU a plan can take longer than refresh_s; the next one waits min_gap_per_plan_second times
    as long as the last took, counted from its end, so filter calls keep answering between plans."""
    import extender.service as service

    class SlowClock:  # perf_counter as the service sees it: every plan takes 3 s
        t = 0.0

        def perf_counter(self) -> float:
            self.t += 1.5  # read twice per plan
            return self.t

    monkeypatch.setattr(service, "time", SlowClock())
    clock = Clock()
    pods = burst()
    svc = cluster(QueuePlanning(min_pods=2, refresh_s=2.0), pods, clock)
    args = ExtenderArgs(Pod=pods["ml/one-a"], NodeNames=NAMES)

    def plans() -> float | None:  # made in full or updated
        return svc.metrics.registry.get_sample_value("gpuaas_extender_queue_plan_seconds_count")

    svc.filter(args)
    assert plans() == 1
    clock.t = 5.0  # past refresh_s, but the plan took 3 s: the next is due 12 s after it
    svc.filter(args)
    assert plans() == 1
    clock.t = 12.5
    svc.filter(args)
    assert plans() == 2


def test_pods_asking_for_no_gpu_keep_off_the_room_planned_for_waiting_gpu_pods():
    """A burst: a GPU pod waits (4 GPUs and 24 of a node's 32 cores), and a pod asking for no GPU (16 cores) is ranked
    meanwhile. The plan puts the GPU pod on a-0000 (first fit), so the CPU-only pod is ranked onto a-0001, where it
    leaves the plan its room: through the CPU-pods entry (no filter: a-0000 ranked lowest) and, with all_pods, the
    filter (a-0000 held back), until it has waited max_wait since its creation, as the CPU-pods entry holds it.
    Without the plan (min_pods above the queue) first fit ranks a-0000 first."""
    pods = {"ml/train": pending("train", gpus=4, cpu="24"), "ml/etl": pending("etl", cpu="16")}
    etl = pods["ml/etl"]
    etl["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"
    created = 1_800_000_000.0
    alone = cluster(QueuePlanning(min_pods=5), pods, Clock())
    assert alone.prioritize_cpu_pods(ExtenderArgs(Pod=etl, NodeNames=NAMES)).pick == "a-0000"
    svc = cluster(QueuePlanning(min_pods=1, refresh_s=1000.0), pods, Clock())
    ranked = svc.prioritize_cpu_pods(ExtenderArgs(Pod=etl, NodeNames=NAMES))
    assert ranked.pick == "a-0001" and dict(ranked.pairs())["a-0000"] == 0 and dict(ranked.pairs())["a-0001"] >= 3
    wall = Clock(created + 1)
    svc.wall_clock = wall
    verdict = svc.filter(ExtenderArgs(Pod=etl, NodeNames=NAMES))
    assert verdict.NodeNames == ["a-0001"] and verdict.FailedNodes == {"a-0000": HELD_FOR_PLAN}
    wall.t = created + svc.queue_planning.max_wait_s
    assert svc.filter(ExtenderArgs(Pod=etl, NodeNames=NAMES)).NodeNames == NAMES


async def lookup(pods: dict[str, dict[str, Any]], namespace: str, name: str) -> dict[str, Any] | None:
    return pods.get(f"{namespace}/{name}")


def test_a_planned_pod_is_steered_at_filter_without_judging_every_node_to_the_same_node_and_gpus():
    # filter answers a planned pod with its planned node after checking that node alone (ExtenderService._steer);
    # judging every candidate first, as filter does for other pods, must give the same nodes and GPUs.
    rng = random.Random(7)
    spec = parse_pool_spec({"pools": [
        {"name": "a", "count": 6, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "64", "memory": "512Gi"},
        {"name": "h", "count": 6, "gpu": {"model": "H100-80GB", "count": 8}, "cpu": "64", "memory": "512Gi"}]})
    names = [n["metadata"]["name"] for n in spec_node_objects(spec)]
    shapes = [rng.choice((1, 1, 2, 4)) for _ in range(40)]  # ~80 GPUs asked of 96
    order = rng.sample(range(40), 40)  # kube-scheduler's order, not the plan's
    outcomes = []
    for steer in (True, False):
        view = ClusterView("gpuaas", clock=Clock())
        for n in spec_node_objects(spec):
            view.on_change("Node", None, n)
        pods = {f"ml/p{i:02d}": pending(f"p{i:02d}", gpus=g, cpu="1", memory="1Gi") for i, g in enumerate(shapes)}
        for p in pods.values():
            view.on_change("Pod", None, p)

        svc = ExtenderService(view, RecordingBinder(), Metrics(), functools.partial(lookup, pods),
                              decide_in_filter=True,
                              queue_planning=QueuePlanning(min_pods=16, refresh_s=1000.0))
        if not steer:
            svc._steer = lambda *args: None  # type: ignore[method-assign]
        placed = []
        for step, i in enumerate(order):
            pod = pods[f"ml/p{i:02d}"]
            if step == 10 and svc.plan is not None:
                # Another scheduler's pod lands on the node planned for a pod still to come, taking its free GPUs.
                later = next(k for k in (f"ml/p{j:02d}" for j in order[step:]) if svc.plan.node_of(k) is not None)
                row = svc.plan.node_of(later)
                state, _ = view.snapshot()
                free = [str(g) for g in range(8) if state.gpu_left[row, g] == 1000]
                other = bound(pending("other", gpus=len(free), cpu="1", memory="1Gi"), state.names[row], ",".join(free))
                view.on_change("Pod", None, other)
            # kube-scheduler's own filters leave out a node now and then (its NodeResourcesFit, a taint)
            sent = [n for n in names if n != names[step % len(names)]] if step % 3 == 0 else names
            fits = svc.filter(ExtenderArgs(Pod=pod, NodeNames=sent)).NodeNames
            if not fits:
                placed.append((i, None, None))
                continue
            node = fits[0] if len(fits) == 1 else svc.prioritize(ExtenderArgs(Pod=pod, NodeNames=fits)).pick
            assert node is not None
            assert asyncio.run(svc.bind(ExtenderBindingArgs(PodName=f"p{i:02d}", PodNamespace="ml",
                                                            PodUID=f"uid-p{i:02d}", Node=node))).Error == ""
            devices = binder_calls(svc)[-1][2]["gpuaas.io/devices"]
            view.on_change("Pod", pod, bound(pod, node, devices))
            placed.append((i, node, devices))
        steered = sum(s.value for s in svc.metrics.decisions.collect()[0].samples
                      if s.name.endswith("_total") and s.labels == {"verb": "filter", "outcome": "steered"})
        outcomes.append((placed, steered))
    (fast, steered_fast), (judged, steered_judged) = outcomes
    assert fast == judged
    assert sum(node is not None for _, node, _ in fast) >= 30
    assert steered_fast == steered_judged and steered_fast >= 16  # the same pods steered, by either path

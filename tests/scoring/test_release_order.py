"""The gang controller's order and placements shared with the extender's joint plan (scoring.gangs.release_order,
QueuedPod.release_order): what the extender keeps room for while a burst's DRA pods wait is what the controller's
next round gives them."""
from __future__ import annotations

import datetime as dt

import numpy as np

from scoring.constraints import HOSTNAME_LABEL, NodeConstraints
from scoring.fragmentation import Workload
from scoring.gangs import GANG_GATE, Gang, GangSettings, Member, NodeFacts, decide, pod_release_order, solo_group
from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.queueplan import QueuedPod, plan_order, plan_queue

NODES = [NodeSpec("a", 32_000, 128_000, 4, "A100-80GB"), NodeSpec("b", 32_000, 128_000, 4, "A100-80GB")]


def gpus(name: str, n: int, cpu: int = 1000) -> PodDemand:
    return PodDemand(cpu_milli=cpu, memory_mib=1024, gpus=n, gpu_milli=1000, name=name)


def gated(name: str, created: str, priority: int = 0) -> dict:
    return {"metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
            "spec": {"priority": priority, "schedulingGates": [{"name": GANG_GATE}]}}


def test_a_gated_pod_is_taken_where_decide_takes_its_gang():
    """Priority first, then creation, then the gang's key (`<ns>/pod:<name>` for a pod in no group); a labelled
    member goes by its group's key."""
    early, late = gated("b", "2026-11-24T10:00:00Z"), gated("a", "2026-11-24T10:00:01Z")
    urgent = gated("c", "2026-11-24T10:00:02Z", priority=100)
    member = gated("m", "2026-11-24T10:00:00Z")
    member["metadata"]["labels"] = {"gpuaas.io/gang": "train"}
    member["metadata"]["annotations"] = {"gpuaas.io/gang-size": "2"}
    assert sorted([early, late, urgent], key=pod_release_order) == [urgent, early, late]
    assert pod_release_order(early) == (0, dt.datetime(2026, 11, 24, 10, tzinfo=dt.UTC).timestamp(),
                                        "ml/pod:b")
    assert pod_release_order(member)[2] == "ml/train"


def test_pods_held_for_the_controller_are_planned_first_in_its_order():
    """One 4-GPU node: a 1-GPU pod created first, then a 4-GPU pod, both gated for their claims. Largest first (the
    plan's order for pods kube-scheduler takes) would plan the 4-GPU pod and leave the first out; the controller
    releases the 1-GPU pod and the 4-GPU pod waits, so the plan keeps room for the 1-GPU pod. A pod kube-scheduler
    takes (no release order) comes after them, whatever its size."""
    state = ClusterState(NODES[:1])
    queue = [QueuedPod("ml/small", gpus("small", 1), 5.0, release_order=(0, 100.0, "ml/pod:small")),
             QueuedPod("ml/big", gpus("big", 4), 1.0, release_order=(0, 101.0, "ml/pod:big")),
             QueuedPod("ml/plain", gpus("plain", 3), 0.0)]
    assert [p.key for p in plan_order(queue, now=10.0, max_wait_s=60.0)] == ["ml/small", "ml/big", "ml/plain"]
    plan = plan_queue(state, "first-fit", None, queue, now=10.0, max_wait_s=60.0)
    assert set(plan.planned) == {"ml/small", "ml/plain"} and plan.left_out == ["ml/big"]


def burst(seed: int) -> tuple[ClusterState, list[PodDemand], Workload]:
    """Twelve nodes of mixed GPU models, counts, CPU and memory, and 120 pods of the Alibaba trace's kinds: GPU
    shares, 1, 2 and 8 GPUs, a few asking for no GPU (left out: the controller places no such pod)."""
    rng = np.random.default_rng(seed)
    models = ["A100-80GB", "V100M32", "T4", "A10"]
    nodes = [NodeSpec(f"n{i:02d}", int(rng.choice([32, 64, 96, 128])) * 1000,
                      int(rng.choice([256, 512, 768])) * 1024, int(rng.choice([2, 4, 8])),
                      models[int(rng.integers(len(models)))]) for i in range(12)]
    kinds = [(1, 250), (1, 500), (1, 300), (1, 1000), (2, 1000), (8, 1000), (0, 0)]
    pods = []
    for i in range(120):
        n, milli = kinds[int(rng.choice(len(kinds), p=[0.2, 0.2, 0.1, 0.3, 0.1, 0.05, 0.05]))]
        pods.append(PodDemand(cpu_milli=int(rng.integers(1, 24)) * 1000, memory_mib=int(rng.integers(2, 64)) * 1024,
                              gpus=n, gpu_milli=milli, name=f"p{i:03d}"))
    workload = Workload.typical(pods)
    return ClusterState(nodes), [p for p in pods if p.gpus], workload


def test_the_controllers_round_and_the_extenders_plan_place_a_burst_alike():
    """The same gangs of one, planned by decide (the controller's round) and by plan_queue with the controller's
    order (the extender's plan): every pod on the same node and GPUs. decide used to make its policy anew per pod,
    whose fragmentation sums, made in another order, differ in the last bit; a node scored on a band's edge then fell
    one band, and the two placed pods apart (seed 33: 12 pods on another node)."""
    for seed in (0, 33):
        state, pods, workload = burst(seed)
        facts = [NodeFacts(name, {HOSTNAME_LABEL: name}, (), False) for name in state.names]
        gangs = []
        for i, pod in enumerate(pods):
            ref = solo_group({"metadata": {"name": pod.name, "namespace": "ml"}})
            gangs.append(Gang(ref, [Member(f"ml/{pod.name}", f"u{i}", 1000.0 + i, pod, NodeConstraints(), (GANG_GATE,),
                                           None, None, None, 0, True)]))
        decisions = decide(state, facts, gangs, 1200.0, GangSettings(), workload)  # none waited reserve_after_s
        released = {key: (state.index[node], devices) for d in decisions if d.action == "release"
                    for key, node, devices in d.devices}
        queue = [QueuedPod(f"ml/{p.name}", p, 0.0, release_order=(0, 1000.0 + i, f"ml/pod:{p.name}"))
                 for i, p in enumerate(pods)]
        plan = plan_queue(state, "gpuaas", workload, queue, now=0.0, max_wait_s=120.0)
        planned = {key: (c.node, tuple(c.devices)) for key, c in plan.planned.items()}
        assert len(released) > 40
        assert planned == released, f"seed {seed}"


def test_a_gated_dra_pod_is_queued_in_the_controllers_order_then_pinned_once_released():
    """ClusterView: a pod only gpuaas's gate holds is queued with the GPUs its claim asks and its release order; once
    released onto a node (gate removed, hostname pin) and until it binds, with its CPU and memory pinned there."""
    from tests.scoring.test_dramodel import WHOLE, cluster_objects
    from tests.scoring.test_draview import gated_pod_with_two_gpu_claim, view_of

    nodes, slices = cluster_objects(WHOLE)
    view = view_of(nodes, slices, [], ("Node", "ResourceSlice"))
    pod, claim = gated_pod_with_two_gpu_claim()
    pod["metadata"]["creationTimestamp"] = "2026-11-24T10:00:00Z"
    view.on_change("Pod", None, pod)
    view.on_change("ResourceClaim", None, claim)
    queued = view.queue["ml/p"]
    assert queued.release_order == pod_release_order(pod) and queued.demand.gpus == 2 and queued.pinned is None
    host = nodes["dra-0000"]["metadata"]["labels"][HOSTNAME_LABEL]
    released = {**pod, "spec": {**pod["spec"], "schedulingGates": [], "nodeSelector": {HOSTNAME_LABEL: host}}}
    view.on_change("Pod", pod, released)
    queued = view.queue["ml/p"]
    assert (queued.pinned, queued.release_order, queued.demand.gpus, queued.demand.cpu_milli) == (host, None, 0, 4000)
    view.on_change("Pod", released, {**released, "spec": {**released["spec"], "nodeName": "dra-0000"},
                                     "status": {"phase": "Running"}})
    assert "ml/p" not in view.queue

"""The Placer that scores again only the rows it changed (incremental) chooses exactly as one that judges every row."""
from __future__ import annotations

import random

import numpy as np
import pytest

from runtime.pools import parse_pool_spec, spec_node_objects
from scoring.clusterview import ClusterView
from scoring.model import PodDemand
from scoring.placement import Placer
from scoring.policies import make_policy

POOLS = {"pools": [
    {"name": "a100", "count": 6, "gpu": {"model": "A100-80GB", "count": 8, "shares": True}, "cpu": "64",
     "memory": "512Gi"},
    {"name": "h100", "count": 5, "gpu": {"model": "H100-80GB", "count": 4}, "cpu": "48", "memory": "256Gi"},
    {"name": "mig", "count": 3, "gpu": {"model": "A100-80GB", "count": 8, "mig": "all-3g.40gb"}, "cpu": "64",
     "memory": "512Gi"},
    {"name": "sliced", "count": 2, "gpu": {"model": "H100-80GB", "count": 8, "replicas": 4}, "cpu": "64",
     "memory": "512Gi"},
    {"name": "cpu", "count": 2, "cpu": "32", "memory": "128Gi"},
]}

SHAPES = [
    PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=1000),
    PodDemand(cpu_milli=4000, memory_mib=8192, gpus=2, gpu_milli=1000),
    PodDemand(cpu_milli=8000, memory_mib=16384, gpus=4, gpu_milli=1000),
    PodDemand(cpu_milli=2000, memory_mib=4096, gpus=1, gpu_milli=500),  # a GPU share
    PodDemand(cpu_milli=2000, memory_mib=4096, gpus=1, gpu_milli=1000, mig_profile="3g.40gb"),
    PodDemand(cpu_milli=2000, memory_mib=4096, gpus=2, gpu_milli=1000, allowed_models=frozenset({"H100-80GB"})),
    PodDemand(cpu_milli=6000, memory_mib=4096),  # no GPU
]


@pytest.mark.parametrize("seed", range(6))
def test_an_incremental_placer_chooses_as_one_that_judges_every_row(seed):
    # Pods of every kind placed one after another, and now and then a pod removed or placed past the Placer (a
    # plan's update, a departure): both placers choose the same node and devices every time, or none.
    rng = random.Random(seed)
    view = ClusterView("gpuaas")
    for node in spec_node_objects(parse_pool_spec(POOLS)):
        view.on_change("Node", None, node)
    state, _ = view.snapshot()
    placers = []
    for incremental in (True, False):
        copy = state.copy()
        placers.append(Placer(copy, make_policy("gpuaas", copy, view.workload()), incremental=incremental))
    fast, judged = placers
    assert fast.incremental and not judged.incremental
    placed: list[tuple[int, PodDemand, tuple[int, ...]]] = []
    for step in range(150):
        pod = PodDemand(**{**rng.choice(SHAPES).__dict__, "name": f"p{step}"})
        choices = [p.place(pod) for p in placers]
        assert choices[0] == choices[1], (step, pod)
        if choices[0] is not None:
            placed.append((choices[0].node, pod, choices[0].devices))
        if placed and rng.random() < 0.15:  # a change the placers did not make
            node, gone, devices = placed.pop(rng.randrange(len(placed)))
            for p in placers:
                p.state.remove(node, gone, devices)
                p.policy.observe(node)
    assert len(placed) > 40
    assert np.array_equal(fast.state.gpu_left, judged.state.gpu_left)


def test_only_a_policy_that_scores_row_by_row_is_placed_incrementally():
    view = ClusterView("gpuaas")
    for node in spec_node_objects(parse_pool_spec(POOLS)):
        view.on_change("Node", None, node)
    state, _ = view.snapshot()
    assert not Placer(state, make_policy("random", state), incremental=True).incremental  # a draw per call
    assert Placer(state, make_policy("fgd", state, view.workload()), incremental=True).incremental

"""The FGD protocol's workload inflation, metric discretisation and a small end-to-end run."""
import numpy as np
import pytest

from scoring.model import NodeSpec, PodDemand
from scoring.simulation import SimulationResult, inflate, simulate

ONE = PodDemand(cpu_milli=1000, gpus=1, gpu_milli=1000)
EIGHT = PodDemand(cpu_milli=1000, gpus=8, gpu_milli=1000)


def test_inflate_to_target():
    # Capacity 10 GPUs, trace 5 one-GPU pods = 5000; target 1.3 * 10000 = 13000.
    # Resampled pods are added while total + 1000 <= 13000: 8 more, total 13000, 13 pods.
    pods = inflate([ONE] * 5, 10_000, 1.3, np.random.default_rng(0))
    assert len(pods) == 13
    assert sum(p.total_gpu_milli for p in pods) == 13_000


def test_inflate_compares_per_gpu_share_like_the_simulator():
    # One 8-GPU pod in the trace, capacity 8000, target 1.3 * 8000 = 10400. The check uses the per-GPU share:
    # 8000 + 1000 <= 10400 -> a second 8-GPU pod is added (total 16000); then 16000 + 1000 > 10400 stops.
    pods = inflate([EIGHT], 8_000, 1.3, np.random.default_rng(0))
    assert len(pods) == 2


def test_inflate_shuffles_trace_first():
    trace = [PodDemand(cpu_milli=i) for i in range(50)]
    pods = inflate(trace, 1, 0, np.random.default_rng(1))
    assert sorted(p.cpu_milli for p in pods) == list(range(50))
    assert [p.cpu_milli for p in pods] != list(range(50))


def test_curve_discretisation():
    # Capacity 100 thousandths. Records at arrived 0, 1, 1, 3 (%): point 1 averages the two records at 1%;
    # point 2 has no record at exactly 2% so it averages records within 1..3%.
    r = SimulationResult("x", 0, 1.3, 4, 0, 100, np.array([0, 1, 1, 3]), np.zeros(4), np.zeros(4), np.ones(4),
                         np.zeros(4))
    curve = r.curve(np.array([0.0, 10.0, 20.0, 40.0]))
    assert curve["0"] == 0.0
    assert curve["1"] == 15.0
    assert curve["2"] == pytest.approx(round((10 + 20 + 40) / 3, 2))
    assert curve["3"] == 40.0
    assert "5" not in curve


@pytest.mark.parametrize("policy", ["random", "bestfit", "fgd", "least-allocated", "gpuaas"])
def test_small_cluster_end_to_end(policy):
    nodes = [NodeSpec(f"n{i}", 32_000, 128_000, 4, "T4") for i in range(4)]
    trace = ([PodDemand(cpu_milli=2000, gpus=1, gpu_milli=m) for m in (300, 500, 700)] * 4
             + [PodDemand(cpu_milli=4000, gpus=2, gpu_milli=1000)] * 2 + [PodDemand(cpu_milli=1000)] * 3)
    r = simulate(nodes, trace, policy, seed=7)
    alloc = r.allocation_ratio()
    # Capacity 16 GPUs; the arrived request reaches ~130% and allocation can never exceed 100% or arrived.
    assert 0 < alloc["100"] <= 100
    assert r.used_milli[-1] <= r.total_gpu_milli
    assert (r.used_milli <= r.arrived_milli).all()
    assert r.failed > 0  # 130% of capacity cannot all fit
    again = simulate(nodes, trace, policy, seed=7)
    assert again.allocation_ratio() == alloc  # same seed, same run
    # What arrived, where it went, and the cluster at the end agree with the counts.
    assert len(r.arrivals) == r.pods == r.node_of.size
    assert int((r.node_of < 0).sum()) == r.failed
    placed = sum(len(on) for on in r.final_state.pods_on)
    assert placed == r.pods - r.failed
    assert r.final_state.used_gpu_milli == r.used_milli[-1]

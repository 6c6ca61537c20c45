"""FGD fragmentation and typical pods, with the arithmetic worked by hand."""
import math

import numpy as np
import pytest

from scoring.fragmentation import FragmentationIndex, Shape, Workload
from scoring.model import ClusterState, NodeSpec, PodDemand

A = Shape(1000, 500, 1, frozenset())     # half a GPU, light CPU
B = Shape(2000, 0, 0, frozenset())       # CPU-only
C = Shape(20000, 1000, 1, frozenset())   # one GPU, heavy CPU
WORKLOAD = Workload(shapes=(A, B, C), popularity=np.array([0.5, 0.25, 0.25]))


def one_node(gpu_left, cpu_left=10_000, gpus=2):
    state = ClusterState([NodeSpec("n0", 10_000, 64_000, gpus, "T4")])
    state.gpu_left[0, :gpus] = gpu_left
    state.cpu_left[0] = cpu_left
    return state


def test_node_fragmentation():
    # GPUs free: [1000, 300], CPU free 10000.
    # A fits (GPU0 has >= 500): only GPU1's 300 is fragment          -> 0.5  * 300  = 150
    # B is CPU-only: every idle thousandth counts                     -> 0.25 * 1300 = 325
    # C needs 20000m CPU, node has 10000: all idle counts             -> 0.25 * 1300 = 325
    index = FragmentationIndex(one_node([1000, 300]), WORKLOAD)
    assert index.frag[0] == pytest.approx(800.0)
    assert index.idle[0] == 1300
    assert index.cluster_fragmentation() == pytest.approx((800.0, 1300.0))


def test_share_what_if_matches_refresh():
    state = one_node([1000, 300])
    index = FragmentationIndex(state, WORKLOAD)
    pod = PodDemand(cpu_milli=1000, gpus=1, gpu_milli=200)
    rows, gpus = index.share_candidates(np.array([0]), pod)
    after = index.frag_after_share(rows, gpus, pod)
    # GPU0 -> [800, 300]: A frag 300, B/C 1100 each -> 150 + 275 + 275 = 700
    # GPU1 -> [1000, 100]: A frag 100, B/C 1100     ->  50 + 275 + 275 = 600
    assert list(gpus) == [0, 1]
    assert after.tolist() == pytest.approx([700.0, 600.0])
    state.place(0, pod, (1,))
    index.refresh([0])
    assert index.frag[0] == pytest.approx(600.0)


def test_share_candidates_skip_duplicate_free_amounts():
    state = ClusterState([NodeSpec("n0", 96_000, 1, 8, "G2")])
    state.gpu_left[0] = [1000, 1000, 500, 1000, 500, 100, 1000, 1000]
    index = FragmentationIndex(state, WORKLOAD)
    _, gpus = index.share_candidates(np.array([0]), PodDemand(gpus=1, gpu_milli=300))
    # Distinct free amounts that fit 300: 1000 (first at 0) and 500 (first at 2); 100 does not fit.
    assert gpus.tolist() == [0, 2]


def test_whole_gpu_what_if():
    state = one_node([1000, 1000], cpu_left=30_000)
    index = FragmentationIndex(state, WORKLOAD)
    # Before: A fits, no GPU < 500 -> 0; B -> 2000 * 0.25 = 500; C fits (30000 >= 20000) -> 0. F = 500.
    assert index.frag[0] == pytest.approx(500.0)
    # After one whole GPU and 15000m CPU: GPUs [0, 1000], CPU 15000.
    # A fits: GPU0 has 0 (< 500) -> 0 fragment; B -> 1000 * 0.25 = 250; C lacks CPU -> 1000 * 0.25 = 250. F = 500.
    after = index.frag_after_whole(np.array([0]), PodDemand(cpu_milli=15_000, gpus=1, gpu_milli=1000))
    assert after[0] == pytest.approx(500.0)


@pytest.mark.parametrize("threshold, kept, popularity", [
    # 6 x A, 3 x B, 1 x C. 95%: 60% < 95 -> add B (90%) < 95 -> add C (100%).
    (0.95, [A, B, C], [0.6, 0.3, 0.1]),
    # 85%: A (60%) then B (90% >= 85%) stop; renormalised over 9 pods.
    (0.85, [A, B], [6 / 9, 3 / 9]),
    (0.50, [A], [1.0]),
])
def test_typical_pods(threshold, kept, popularity):
    def pod(shape):
        return PodDemand(cpu_milli=shape.cpu_milli, gpus=shape.gpus, gpu_milli=shape.gpu_milli)
    pods = [pod(A)] * 6 + [pod(B)] * 3 + [pod(C)]
    w = Workload.typical(pods, threshold)
    assert list(w.shapes) == kept
    assert w.popularity.tolist() == pytest.approx(popularity)
    assert math.isclose(w.popularity.sum(), 1.0)


def test_typical_pods_zero_cpu_counts_as_100m():
    w = Workload.typical([PodDemand(cpu_milli=0, gpus=1, gpu_milli=1000)])
    assert w.shapes[0].cpu_milli == 100


def test_model_constrained_shape_sees_other_models_as_fragment():
    state = ClusterState([NodeSpec("t4", 10_000, 1, 1, "T4"), NodeSpec("v100", 10_000, 1, 1, "V100-16GB")])
    only_v100 = Shape(1000, 1000, 1, frozenset({"V100-16GB"}))
    index = FragmentationIndex(state, Workload((only_v100,), np.array([1.0])))
    # The T4 cannot serve the only shape: its whole GPU is fragment. The V100 serves it: nothing is.
    assert index.frag.tolist() == [1000.0, 0.0]


def test_cpu_aware_index_limits_usable_share_by_cpu():
    # Shape A (1000m CPU, 500 share). Node: GPUs [1000, 1000], CPU 1500 -> CPU feeds one A pod only.
    # FGD: A fits, no GPU below 500 -> A's fragment 0. cpu_aware: usable = min(2000, 1 * 500) = 500 -> fragment 1500.
    # B (CPU-only) counts all idle either way: 0.25 * 2000 = 500; C lacks CPU: 0.25 * 2000 = 500.
    plain = FragmentationIndex(one_node([1000, 1000], cpu_left=1500), WORKLOAD)
    aware = FragmentationIndex(one_node([1000, 1000], cpu_left=1500), WORKLOAD, cpu_aware=True)
    assert plain.frag[0] == pytest.approx(1000.0)
    assert aware.frag[0] == pytest.approx(0.5 * 1500 + 1000.0)

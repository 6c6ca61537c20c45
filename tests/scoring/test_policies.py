"""Filter / score / normalise / select, table-driven, each expected number worked out by hand."""
import numpy as np
import pytest

from scoring.fit import feasible, misfit_reason
from scoring.fragmentation import Shape, Workload
from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.policies import (
    BestFitPolicy,
    FgdPolicy,
    LeastAllocatedPolicy,
    RandomPolicy,
    make_policy,
    normalize,
    select_node,
)

NODES = [
    NodeSpec("a", 32_000, 128_000, 2, "T4"),
    NodeSpec("b", 64_000, 256_000, 4, "V100-32GB"),
    NodeSpec("c", 8_000, 32_000, 0),
]


def state():
    s = ClusterState(NODES)
    s.gpu_left[0, :2] = [1000, 400]
    return s


@pytest.mark.parametrize("pod, expected, reason_a", [
    (PodDemand(cpu_milli=1000), [True, True, True], None),
    (PodDemand(cpu_milli=40_000), [False, True, False], "insufficient cpu (40000m requested)"),
    (PodDemand(memory_mib=200_000), [False, True, False], "insufficient memory"),
    (PodDemand(gpus=2, gpu_milli=1000), [False, True, False], "insufficient whole GPUs: 1 free, 2 requested"),
    (PodDemand(gpus=1, gpu_milli=500), [True, True, False], None),
    (PodDemand(gpus=1, gpu_milli=500, allowed_models=frozenset({"V100-32GB"})), [False, True, False],
     "GPU model T4 is not one the pod accepts (V100-32GB)"),
])
def test_feasible_and_reason(pod, expected, reason_a):
    s = state()
    assert feasible(s, pod).tolist() == expected
    reason = misfit_reason(s, pod, 0)
    assert (reason is None) == (reason_a is None)
    if reason_a:
        assert reason_a in reason
    assert misfit_reason(s, PodDemand(gpus=1, gpu_milli=1000), 2) == "node has no GPUs"


def test_bestfit_score():
    s = state()
    pod = PodDemand(cpu_milli=16_000, gpus=1, gpu_milli=1000)
    mask = feasible(s, pod)
    # raw(a) = trunc(100 * (1 - 0.5*(32000-16000)/128000 - 0.5*(1400-1000)/8000)) = trunc(100*(1-0.0625-0.025)) = 91
    # raw(b) = trunc(100 * (1 - 0.5*48000/128000 - 0.5*3000/8000)) = trunc(100*(1-0.1875-0.1875)) = 62
    # min-max over feasible {91, 62}: a -> (91-62)*100//29 = 100, b -> 0
    assert BestFitPolicy(s).score(s, pod, mask).tolist() == [100, 0, 0]


def test_least_allocated_score():
    s = state()
    pod = PodDemand(cpu_milli=16_000, memory_mib=64_000)
    # a: cpu (32000-16000)*100//32000 = 50, mem (128000-64000)*100//128000 = 50 -> 50
    # b: cpu 48000*100//64000 = 75, mem 192000*100//256000 = 75 -> 75
    # c: cpu would go negative -> 0, mem also -> 0
    assert LeastAllocatedPolicy(s).score(s, pod, feasible(s, pod)).tolist() == [50, 75, 0]


def test_fgd_share_picks_the_gpu_that_lowers_fragmentation_most():
    s = ClusterState([NodeSpec("n", 10_000, 1, 2, "T4")])
    s.gpu_left[0, :2] = [1000, 300]
    shapes = (Shape(1000, 500, 1, frozenset()), Shape(2000, 0, 0, frozenset()), Shape(20000, 1000, 1, frozenset()))
    policy = FgdPolicy(s, Workload(shapes, np.array([0.5, 0.25, 0.25])))
    pod = PodDemand(cpu_milli=1000, gpus=1, gpu_milli=200)
    # F before 800 (see test_fragmentation). GPU0: F 700, delta 100 -> int(100*sigmoid(0.1)) = int(52.50) = 52.
    # GPU1: F 600, delta 200 -> int(100*sigmoid(0.2)) = int(54.98) = 54. Node score = best GPU = 54, device GPU1.
    assert policy.score(s, pod, feasible(s, pod)).tolist() == [54.0]
    assert policy.devices(s, pod, 0) == (1,)


def test_whole_gpus_go_to_the_first_free_ones():
    s = state()
    pod = PodDemand(gpus=2, gpu_milli=1000)
    s.gpu_left[1, :4] = [1000, 0, 1000, 1000]
    assert BestFitPolicy(s).devices(s, pod, 1) == (0, 2)


def test_bestfit_share_gpu_is_tightest():
    s = state()
    s.gpu_left[1, :4] = [1000, 600, 450, 1000]
    assert BestFitPolicy(s).devices(s, PodDemand(gpus=1, gpu_milli=400), 1) == (2,)


def test_random_policy_scores_one_feasible_node():
    s = state()
    pod = PodDemand(cpu_milli=1000)
    scores = RandomPolicy(s, rng=np.random.default_rng(3)).score(s, pod, feasible(s, pod))
    assert sorted(scores.tolist()) == [0.0, 0.0, 100.0]


@pytest.mark.parametrize("scores, mask, rank, expected", [
    ([5, 9, 9, 1], [1, 1, 1, 1], [3, 2, 1, 0], 2),   # tie 9 at nodes 1 and 2: node 2 has the lower rank
    ([5, 9, 9, 1], [1, 0, 1, 1], [3, 2, 1, 0], 2),   # node 1 filtered out
    ([5, 9, 9, 1], [0, 0, 0, 0], [0, 1, 2, 3], -1),  # nothing feasible
    ([7, 7, 7, 7], [1, 1, 1, 1], [2, 0, 3, 1], 1),
])
def test_select_node(scores, mask, rank, expected):
    assert select_node(np.array(scores, float), np.array(mask, bool), np.array(rank)) == expected


@pytest.mark.parametrize("scores, mask, expected", [
    # lo 20, hi 60: (20-20)*10/40 = 0, (40-20)*10/40 = 5, (60-20)*10/40 = 10; masked-out entry 0
    ([20, 40, 60, 99], [1, 1, 1, 0], [0, 5, 10, 0]),
    ([3, 3], [1, 1], [10, 10]),  # all equal: every feasible node gets the top priority
    # (hi - lo) * 10 / (hi - lo) is 9.999999999999998 here: the best node must still get 10, not 9 like the others
    ([1.4381200827081053, 2.3403287710569733, 2.2], [1, 1, 1], [0, 10, 8]),
])
def test_normalize_to_extender_priority(scores, mask, expected):
    assert normalize(np.array(scores, float), np.array(mask, bool)).tolist() == expected


def test_make_policy_unknown_name_lists_known():
    with pytest.raises(KeyError, match="known: random"):
        make_policy("nope", state())


# -- ours --------------------------------------------------------------------------------------------------------------

from scoring.policies import GpuaasPolicy, fits_in_one_block, topology_gpus  # noqa: E402


def eight_gpu_state():
    # One HGX-style board: GPUs 0-3 are block 0, 4-7 block 1.
    return ClusterState([NodeSpec("h", 96_000, 1_048_576, 8, "H100-80GB")])


@pytest.mark.parametrize("busy, k, expected", [
    # GPU 0 busy. A 2-GPU pod: block 0 has {1,2,3}, block 1 is whole. Taking 1,2 keeps block 1 entirely free.
    ((0,), 2, (1, 2)),
    # GPUs 0 and 5 busy. 4-GPU pod: no block has 4 free -> must span 2 blocks; any such set leaves nothing whole.
    # Lowest-indices tie-break among sets that leave the largest remaining group: {1,2,3,4} leaves {6,7}.
    ((0, 5), 4, (1, 2, 3, 4)),
    # Nothing busy, 4 GPUs: one whole block, the other stays whole.
    ((), 4, (0, 1, 2, 3)),
    # GPUs 1 and 2 busy: a 2-GPU pod fits in block 0 as {0,3} (1 block) -> keeps block 1 whole.
    ((1, 2), 2, (0, 3)),
    # Seven busy, 2 GPUs asked: none to give (a pod bound past the model), not a TypeError.
    ((0, 1, 2, 3, 4, 5, 6), 2, None),
])
def test_topology_gpus(busy, k, expected):
    s = eight_gpu_state()
    for g in busy:
        s.place(0, PodDemand(gpus=1, gpu_milli=1000), (g,))
    assert topology_gpus(s, 0, k) == expected


def test_fits_in_one_block():
    s = ClusterState([NodeSpec("h", 96_000, 1, 8, "H100-80GB"), NodeSpec("h2", 96_000, 1, 8, "H100-80GB")])
    s.place(0, PodDemand(gpus=1, gpu_milli=1000), (0,))
    s.place(0, PodDemand(gpus=1, gpu_milli=1000), (4,))
    # Node 0 has 3 free per block: a 4-GPU pod cannot stay in one block there; node 1 can.
    assert fits_in_one_block(s, 4).tolist() == [0.0, 1.0]
    assert fits_in_one_block(s, 3).tolist() == [1.0, 1.0]
    assert fits_in_one_block(s, 4, np.array([1, 0])).tolist() == [1.0, 0.0]  # only the rows asked, in that order
    # Block ids need not be small or contiguous (they come from node labels).
    odd = ClusterState([NodeSpec("x", 96_000, 1, 4, "H100-80GB", gpu_blocks=(7, 7, 42, 42))])
    assert fits_in_one_block(odd, 2).tolist() == [1.0] and fits_in_one_block(odd, 3).tolist() == [0.0]
    neg = ClusterState([NodeSpec("y", 96_000, 1, 4, "H100-80GB", gpu_blocks=(-1, -1, -1, 5))])
    assert fits_in_one_block(neg, 3).tolist() == [1.0] and fits_in_one_block(neg, 4).tolist() == [0.0]


def test_gpuaas_multi_gpu_pod_prefers_node_where_it_stays_in_one_block():
    s = ClusterState([NodeSpec("h", 96_000, 1, 8, "H100-80GB"), NodeSpec("h2", 96_000, 1, 8, "H100-80GB")])
    for g in (0, 4):
        s.place(0, PodDemand(gpus=1, gpu_milli=1000), (g,))
    s.place(1, PodDemand(gpus=1, gpu_milli=1000), (0,))
    wl = Workload((Shape(1000, 1000, 1, frozenset()),), np.array([1.0]))
    policy = GpuaasPolicy(s, wl)
    pod = PodDemand(gpus=4, gpu_milli=1000)
    scores = policy.score(s, pod, feasible(s, pod))
    # Both nodes: same FGD band (every free GPU serves the 1-GPU shape either way). Node 1 can hold 4 in block 1
    # (+0.5); node 0 cannot; consolidation (< 0.45) cannot outweigh that.
    assert scores[1] > scores[0]
    assert policy.devices(s, pod, 1) == (4, 5, 6, 7)


def test_gpuaas_mig_uses_partly_used_gpu_first():
    spec = NodeSpec("m", 64_000, 512_000, 2, "A100-80GB", mig_layouts=({"1g.10gb": 7}, {"1g.10gb": 7}))
    s = ClusterState([spec, spec.__class__("m2", 64_000, 512_000, 2, "A100-80GB",
                                           mig_layouts=({"1g.10gb": 7}, {"1g.10gb": 7}))])
    s.place(1, PodDemand(gpus=1, mig_profile="1g.10gb"), (1,))
    wl = Workload((Shape(1000, 1000, 1, frozenset()),), np.array([1.0]))
    policy = GpuaasPolicy(s, wl)
    pod = PodDemand(cpu_milli=1000, gpus=1, mig_profile="1g.10gb")
    scores = policy.score(s, pod, feasible(s, pod))
    # Node 1's GPU 1 already serves an instance: use it and keep node 0's GPUs idle for repartitioning.
    assert scores[1] > scores[0]
    assert policy.devices(s, pod, 1) == (1,)


def test_filter_and_prioritize_for_the_extender():
    from scoring.verdicts import filter_nodes, prioritize

    s = state()
    a, b, c = s.names
    pod = PodDemand(cpu_milli=4000, gpus=1, gpu_milli=1000)
    verdict = filter_nodes(s, pod, s.names)
    assert verdict.feasible == [a, b] and verdict.unresolvable == {c: "node has no GPUs"} and not verdict.failed
    # BestFit raw: a = trunc(100*(1 - 0.5*28000/128000 - 0.5*400/8000)) = trunc(86.56) = 86,
    # b = trunc(100*(1 - 0.5*60000/128000 - 0.5*3000/8000)) = trunc(57.81) = 57 -> normalised a 100, b 0
    # -> onto 0..10: a 10, b 0; c infeasible 0. With candidates [b, c] only b is feasible -> the top, 10.
    ranked = prioritize(s, BestFitPolicy(s), pod, s.names)
    assert (ranked.pairs(), ranked.pick) == ([(a, 10), (b, 0), (c, 0)], a)
    ranked = prioritize(s, BestFitPolicy(s), pod, [b, c])
    assert (ranked.pairs(), ranked.pick) == ([(b, 10), (c, 0)], b)


@pytest.mark.parametrize("pod_cpu, relief", [
    # Workload: one shape, 1 GPU with 10000m CPU -> 10 CPU-milli per GPU-milli.
    # Node: 2 idle GPUs (2000), 15000m CPU free: feeding 2000 needs 20000 -> 5000 short -> 500 stranded.
    # A 1-GPU pod with 10000m: after, 1000 idle needs 10000, 5000 left -> 500 stranded -> relief 0.
    (10_000, 0.0),
    # With 2000m: after, 1000 idle needs 10000, 13000 left -> 0 stranded -> relief 500.
    (2_000, 500.0),
    # With 14000m: after, 1000 idle needs 10000, 1000 left -> 900 stranded -> relief -400.
    (14_000, -400.0),
])
def test_gpuaas_cpu_look_ahead(pod_cpu, relief):
    s = ClusterState([NodeSpec("n", 15_000, 64_000, 2, "T4")])
    wl = Workload((Shape(10_000, 1000, 1, frozenset()),), np.array([1.0]))
    policy = GpuaasPolicy(s, wl)
    assert policy.cpu_per_gpu_milli == pytest.approx(10.0)
    pod = PodDemand(cpu_milli=pod_cpu, gpus=1, gpu_milli=1000)
    assert policy._adjust(s, pod, np.array([0]))[0] == pytest.approx(relief)


def test_scarcity_weighting():
    from scoring.policies import scarcity_weighted

    # 6 GPUs in all: 2 T4 + 4 V100. Shape X runs anywhere (supply 6), shape Y only on T4 (supply 2).
    s = ClusterState([NodeSpec("t", 8000, 1, 2, "T4"), NodeSpec("v", 8000, 1, 4, "V100-16GB")])
    x = Shape(1000, 1000, 1, frozenset())
    y = Shape(1000, 1000, 1, frozenset({"T4"}))
    w = scarcity_weighted(s, Workload((x, y), np.array([0.5, 0.5])), 0.5)
    # weights 0.5 * (6/6)^0.5 = 0.5 and 0.5 * (6/2)^0.5 = 0.866 -> normalised 0.366, 0.634
    assert w.popularity.tolist() == pytest.approx([0.5 / 1.366025, 0.866025 / 1.366025], rel=1e-5)
    unrestricted = Workload((x,), np.array([1.0]))
    assert scarcity_weighted(s, unrestricted, 0.5) is unrestricted


def test_gpuaas_share_goes_where_the_rest_of_the_workload_fills_the_remainder():
    # Workload shares 470 : 650 : 320 : 230 = 2 : 1 : 1 : 1 (cutting-stock values 500, 667, 333, 250).
    # Node a's GPU holds a 650 (350 free), node b's GPU is empty. A 230 next to the 650 leaves 120 that no share
    # fills (regret 83.3 -> band int(100 * sigmoid(-30 * 83.3 / 1000)) = 7); on b it starts a 4 x 230 GPU (regret 0,
    # band 50). FGD prefers a: before, 320 and 230 fit the 350 (fragment 350 * 0.6 = 210), after, nothing fits the
    # 120 (fragment 120): a decrease of 90 -> band 52 against 50 for b.
    shapes = tuple(Shape(1000, m, 1, frozenset()) for m in (470, 650, 320, 230))
    wl = Workload(shapes, np.array([0.4, 0.2, 0.2, 0.2]))
    s = ClusterState([NodeSpec("a", 32_000, 64_000, 1, "T4"), NodeSpec("b", 32_000, 64_000, 1, "T4")])
    s.place(0, PodDemand(cpu_milli=1000, gpus=1, gpu_milli=650), (0,))
    pod = PodDemand(cpu_milli=1000, gpus=1, gpu_milli=230)
    mask = feasible(s, pod)
    assert GpuaasPolicy(s, wl).score(s, pod, mask).tolist() == [7.0, 50.0]
    assert FgdPolicy(s, wl).score(s, pod, mask).tolist() == [52.0, 50.0]


def test_gpuaas_memory_look_ahead():
    # Workload: 1-GPU pods, 10000m CPU and 20 GiB each -> 10 CPU-milli and 20.48 MiB per GPU-milli.
    # Node: 2 idle GPUs, plenty of CPU, 30720 MiB free: feeding 2000 needs 40960 -> 10240 MiB short -> 500 stranded.
    # A CPU-only pod taking 10240 MiB: 20480 left -> 1000 stranded -> the score's relief is -500.
    s = ClusterState([NodeSpec("n", 64_000, 30_720, 2, "T4")])
    wl = Workload.typical([PodDemand(cpu_milli=10_000, memory_mib=20_480, gpus=1, gpu_milli=1000)])
    assert wl.memory_per_gpu_milli == pytest.approx(20.48)
    policy = GpuaasPolicy(s, wl)
    pod = PodDemand(cpu_milli=1000, memory_mib=10_240)
    assert policy._adjust(s, pod, np.array([0]))[0] == pytest.approx(-500.0)


def test_explain_gives_the_filters_words_and_the_nodes_free_numbers():
    from scoring.verdicts import explain

    s = state()  # a: 32 cores, 2 T4 (1 free whole, 1 with 400 left); b: 64 cores, 4 V100; c: no GPUs
    pod = PodDemand(cpu_milli=4000, gpus=2, gpu_milli=1000)
    got = explain(s, BestFitPolicy(s), pod, "a")
    assert got["reason"] == misfit_reason(s, pod, 0) == "insufficient whole GPUs: 1 free, 2 requested"
    assert got["resolvable"] and got["free"] == {"cpu_milli": 32_000, "memory_mib": 128_000, "whole_gpus": 1,
                                                 "largest_gpu_share_milli": 1000}
    got = explain(s, BestFitPolicy(s), pod, "c")
    assert got == {"node": "c", "pod": "", "fits": False, "resolvable": False, "reason": "node has no GPUs"}

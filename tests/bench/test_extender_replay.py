"""The pure helpers of bench/extender_replay.py: bind-order accounting, partly used GPUs, the loss breakdown."""
from __future__ import annotations

from bench.extender_replay import (
    by_kind,
    cluster_names,
    first_fit_order,
    first_gpu_failure,
    free_gpu_breakdown,
    gpu_use,
    kind,
    out_of_order,
    partly_used,
    partly_used_in_state,
    place_in_order,
)
from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.simulation import simulate

CPU = PodDemand(cpu_milli=1000, memory_mib=1024)
SHARE = PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=400)
ONE = PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=1000)
TWO = PodDemand(cpu_milli=1000, memory_mib=1024, gpus=2, gpu_milli=1000)


def test_out_of_order_counts_adjacent_and_all_pairs():
    assert out_of_order([0, 1, 2, 3]) == {"binds": 4, "adjacent": 0, "adjacent_total": 3, "pairs": 0,
                                          "pairs_total": 6, "kendall_tau": 1.0}
    reversed_ = out_of_order([3, 2, 1, 0])
    assert (reversed_["adjacent"], reversed_["pairs"], reversed_["kendall_tau"]) == (3, 6, -1.0)
    ranks = [2, 0, 3, 1, 5, 4]
    brute = sum(1 for i in range(len(ranks)) for j in range(i + 1, len(ranks)) if ranks[i] > ranks[j])
    got = out_of_order(ranks)
    assert got["pairs"] == brute == 4
    assert got["adjacent"] == 3  # 2>0, 3>1, 5>4
    # Gaps in the ranks (pods never bound) do not matter, only the relative order.
    assert out_of_order([10, 40, 20])["pairs"] == 1
    assert out_of_order([]) == {"binds": 0, "adjacent": 0, "adjacent_total": 0, "pairs": 0, "pairs_total": 0,
                                "kendall_tau": 1.0}


def test_partly_used_gpus_from_placements():
    placements = [
        ("a", (0,), SHARE), ("a", (0,), SHARE),  # 800 of GPU a/0: partly used
        ("a", (1,), SHARE), ("a", (1,), SHARE),
        ("b", (0, 1), TWO),  # whole GPUs: full, not partly used
        ("b", (), CPU),  # CPU-only: nothing
        ("c", (2,), PodDemand(gpus=1, gpu_milli=500)), ("c", (2,), PodDemand(gpus=1, gpu_milli=500)),  # full
    ]
    use = gpu_use(placements)
    assert use == {("a", 0): 800, ("a", 1): 800, ("b", 0): 1000, ("b", 1): 1000, ("c", 2): 1000}
    assert partly_used(use) == 2
    assert partly_used({}) == 0


def test_partly_used_in_state_matches_the_placement_count():
    state = ClusterState([NodeSpec("a", 10_000, 64_000, 2, "T4"), NodeSpec("b", 10_000, 64_000, 2, "T4")])
    placements = [("a", (0,), SHARE), ("a", (1,), ONE), ("b", (1,), SHARE), ("b", (1,), SHARE)]
    for node, devices, pod in placements:
        state.place(0 if node == "a" else 1, pod, devices)
    assert partly_used_in_state(state) == partly_used(gpu_use(placements)) == 2


def test_kinds_and_first_gpu_failure():
    pods = [CPU, SHARE, ONE, TWO, CPU, ONE]
    assert [kind(p) for p in pods] == ["cpu-only", "gpu-share", "1-gpu", "2-gpu", "cpu-only", "1-gpu"]
    placed = [False, True, True, False, True, False]
    assert first_gpu_failure(pods, placed) == 3  # a CPU-only failure does not count
    assert first_gpu_failure(pods, [True] * 6) is None
    table = by_kind(pods, placed)
    assert list(table) == ["cpu-only", "gpu-share", "1-gpu", "2-gpu"]
    assert table["cpu-only"] == {"arrived": 2, "placed": 1, "failed": 1}
    assert table["1-gpu"] == {"arrived": 2, "placed": 1, "failed": 1}


def test_free_gpu_breakdown_separates_cpu_stranding_from_fragments():
    # n0: 2 free GPUs but its CPU is taken by a CPU-only pod -> stranded by CPU.
    # n1: one GPU with 600 free -> a fragment the 1-GPU pod cannot use.
    # n2: 1 free GPU and CPU to spare -> an unplaced 1-GPU pod fits now.
    state = ClusterState([NodeSpec(f"n{i}", 8_000, 64_000, 2, "T4") for i in range(3)])
    state.place(0, PodDemand(cpu_milli=7_500, memory_mib=1024), ())
    state.place(1, ONE, (0,))
    state.place(1, SHARE, (1,))
    state.place(2, ONE, (0,))
    got = free_gpu_breakdown(state, [ONE, ONE, CPU])
    assert got["free_gpu_milli"] == 2000 + 600 + 1000
    assert got["on_nodes_short_of_cpu_or_memory"] == 2000
    assert got["nodes_short_of_cpu_or_memory"] == 1
    assert got["cpu_only_pods_on_those_nodes"] == 1 and got["cpu_milli_of_those_cpu_only_pods"] == 7_500
    assert got["on_nodes_where_an_unplaced_gpu_pod_fits_now"] == 1000
    assert got["elsewhere_fragments_or_model"] == 600
    assert got["unplaced_gpu_pods_that_fit_now"] == 2


def test_cluster_names_follow_the_pool_spec_and_first_fit_its_creation_order():
    from runtime.pools import pools_from_node_specs, spec_node_objects

    nodes = [NodeSpec(f"t{i}", 8_000, 64_000, 2, "T4") if i % 3 else NodeSpec(f"g{i}", 96_000, 393_216, 8, "G2")
             for i in range(12)]
    spec = pools_from_node_specs(nodes)
    names = cluster_names(nodes, [p.name for p in spec.pools])
    created = [o["metadata"]["name"] for o in spec_node_objects(spec)]
    assert sorted(names) == sorted(created)
    assert [names[i] for i in first_fit_order(names)] == created
    # each name is a node of the same shape
    by_name = {o["metadata"]["name"]: o for o in spec_node_objects(spec)}
    for node, name in zip(nodes, names, strict=True):
        assert by_name[name]["status"]["allocatable"]["nvidia.com/gpu"] == str(node.gpus)


def test_place_in_order_without_changes_is_the_simulator():
    nodes = [NodeSpec(f"n{i}", 32_000, 128_000, 4, "T4") for i in range(6)]
    trace = [SHARE, ONE, TWO, CPU, PodDemand(cpu_milli=20_000, memory_mib=1024)]
    sim = simulate(nodes, trace, "gpuaas", 7, tune=1.4)
    order = list(range(sim.pods))
    state, placed = place_in_order(nodes, trace, sim.arrivals, order, "gpuaas", 7, 1.4)
    assert placed == [bool(x >= 0) for x in sim.node_of]
    assert (state.gpu_left == sim.final_state.gpu_left).all()
    # CPU-only pods first-fit in the given node order land on the first node that has room
    state, placed = place_in_order(nodes, trace, sim.arrivals, order, "gpuaas", 7, 1.4,
                                   cpu_first_fit=[5, 4, 3, 2, 1, 0])
    first_cpu = next(i for i, p in enumerate(sim.arrivals) if not p.gpus)
    assert placed[first_cpu] and sim.arrivals[first_cpu] in [p for p, _ in state.pods_on[5]]


def test_dra_outcome_reads_what_the_claims_hold_and_checks_it_against_the_bound_pods():
    from bench.extender_replay import dra_outcome
    from scoring.draclaims import DeviceResult, allocation
    from scoring.kubeobjects import node_spec
    from tests.scoring.test_dramodel import WHOLE, cluster_objects

    nodes, slices = cluster_objects(WHOLE)  # two nodes of 4 A100s: 8 GPUs, 8000 milli

    def claim(name, pod, node, *results):
        return {"metadata": {"name": f"{pod}-gpu", "namespace": "replay",
                             "ownerReferences": [{"kind": "Pod", "name": pod}]},
                "status": {"allocation": allocation(node, list(results), "t")} if node else {}}

    def bound(name, node):
        return {"metadata": {"name": name, "namespace": "replay"}, "spec": {"nodeName": node}}

    share = DeviceResult("gpu", "gpu-1-shared", share_id="s", consumed={"share": "400", "memory": "0"})
    claims = [claim("a", "a", "dra-0000", DeviceResult("gpu", "gpu-0"), DeviceResult("gpu", "gpu-2")),
              claim("b", "b", "dra-0000", share),
              claim("c", "c", "dra-0001", DeviceResult("gpu", "gpu-0")),  # pod c bound elsewhere
              claim("d", "d", "")]  # pod d bound, its claim never allocated
    pods = {n: bound(n, node) for n, node in (("a", "dra-0000"), ("b", "dra-0000"), ("c", "dra-0000"),
                                               ("d", "dra-0001"))}
    demand_of = {"a": TWO, "b": SHARE, "c": ONE, "d": ONE}
    base = ClusterState(sorted((node_spec(n) for n in nodes.values()), key=lambda s: s.name))
    out, state = dra_outcome(base, list(nodes.values()), slices, claims, pods, demand_of, 8000)
    # 2 whole + 400 + 1 whole = 3400 of 8000 milli
    assert out["allocation_ratio_of_claims"] == 42.5
    assert out["issues"] == {"bound_pods_with_claim_not_allocated": 1, "allocated_claims_of_unbound_pods": 0,
                             "claims_not_as_asked_or_off_node": 1}
    assert out["claims_allocated_by"] == {"kube-scheduler": 3}
    assert out["devices_given_twice_or_overcommitted"] == 0
    assert int(state.gpu_left[state.index["dra-0000"], :4].sum()) == 1600  # GPUs 1 (600 left) and 3

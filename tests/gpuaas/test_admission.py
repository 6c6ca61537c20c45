"""Gang admission: all of a gang's pods fit at once, or none is created; an admitted gang's pods are held where the plan
put them until they are bound, so the next gang cannot be admitted onto the same GPUs."""
from __future__ import annotations

from gpuaas.admission import Gang, decide, hold
from gpuaas.workloads import gpu_pod
from scoring.fragmentation import Workload
from scoring.model import ClusterState, NodeSpec, PodDemand

WORKLOAD = Workload.typical([PodDemand(cpu_milli=8000, memory_mib=65536, gpus=g, gpu_milli=1000) for g in (1, 2, 4, 8)])


def cluster(nodes: int = 3) -> ClusterState:
    return ClusterState([NodeSpec(f"n{i}", 128_000, 1_048_576, 8, "A100-80GB") for i in range(nodes)])


def gang(name: str, pods: int, gpus: int) -> Gang:
    return Gang("training", name, tuple(gpu_pod(f"{name}-{i}", "training", gpus=gpus, cpu=str(8 * gpus),
                                                memory=f"{64 * gpus}Gi") for i in range(pods)))


def test_a_gang_that_fits_is_admitted_with_a_place_for_every_pod():
    state = cluster(3)
    state.place(0, PodDemand(cpu_milli=8000, memory_mib=1024, gpus=2, gpu_milli=1000), (0, 1))
    d = decide(state, gang("g", 3, 4), workload=WORKLOAD)
    assert d.admit, d.message
    assert len(d.placements) == 3
    used = [(node, gpu) for node, gpus in d.placements for gpu in gpus]
    assert len(used) == 12 and len(set(used)) == 12  # no GPU given twice
    assert ("n0", 0) not in used and ("n0", 1) not in used  # nor one that is taken


def test_a_gang_that_only_partly_fits_is_not_admitted():
    state = cluster(2)
    state.place(0, PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=1000), (0,))
    d = decide(state, gang("big", 2, 8), workload=WORKLOAD)  # one node is whole, the other has 7 free
    assert not d.admit and d.placements == ()
    assert "2 pods do not fit together" in d.message


def test_held_placements_keep_the_next_gang_out():
    state = cluster(3)
    first = gang("a", 2, 8)
    d = decide(state, first, workload=WORKLOAD)
    assert d.admit
    assert decide(state, gang("b", 2, 8), workload=WORKLOAD).admit  # on the snapshot alone it would fit too
    assert hold(state, first.demands(), d.placements) == 2
    assert not decide(state, gang("b", 2, 8), workload=WORKLOAD).admit
    assert decide(state, gang("c", 1, 8), workload=WORKLOAD).admit  # one node is still whole


def test_hold_skips_a_place_taken_meanwhile_and_nodes_gone():
    state = cluster(1)
    g = gang("a", 1, 8)
    d = decide(state, g, workload=WORKLOAD)
    state.place(0, PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=1000), (3,))
    assert hold(state, g.demands(), d.placements) == 0
    assert hold(state, g.demands(), [("gone", (0,))]) == 0

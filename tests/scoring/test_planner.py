"""CP-SAT planner: gangs, MIG repartitioning, cheapest new nodes; each with a case worked out by hand."""
import pytest

from scoring.gpus import GPU_MODELS
from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.planner import (
    NodeGroup,
    _layout_options,
    apply_mig_plan,
    cheapest_nodes,
    place_gang,
    repartition_mig,
)


def gpu_pod(n, cpu=1000, name=""):
    return PodDemand(cpu_milli=cpu, memory_mib=1024, gpus=n, gpu_milli=1000, name=name)


def test_gang_all_or_nothing_prefers_one_node():
    # Two 8-GPU nodes, each with 4 GPUs busy. A gang of 2 x 2-GPU pods fits on one node (4 free) -> one node used.
    s = ClusterState([NodeSpec(f"n{i}", 96_000, 512_000, 8, "A100-80GB") for i in range(2)])
    for i in range(2):
        s.place(i, gpu_pod(4), (0, 1, 2, 3))
    plan = place_gang(s, [gpu_pod(2, name="a"), gpu_pod(2, name="b")], policy="bestfit", time_limit=5)
    assert plan.status == "optimal" and plan.gap == pytest.approx(0.0)
    assert len({n for n, _ in plan.placements}) == 1
    gpus = sorted(g for _, gs in plan.placements for g in gs)
    assert gpus == [4, 5, 6, 7]
    # Each 2-GPU pod stays inside one NVLink block (4-7 is block 1 on an 8-GPU board) -- trivially here.


def test_gang_that_cannot_fit_places_nothing():
    s = ClusterState([NodeSpec("n0", 96_000, 512_000, 8, "A100-80GB")])
    # 3 x 4-GPU pods need 12 GPUs, the node has 8: all-or-nothing -> infeasible, and the state is untouched.
    plan = place_gang(s, [gpu_pod(4)] * 3, policy="bestfit", time_limit=2)
    assert plan.status == "infeasible" and plan.placements == []
    assert int((s.gpu_left == 1000).sum()) == 8


def test_gang_keeps_multi_gpu_pod_in_one_block():
    # One 8-GPU node; GPUs 0 and 5 busy. A 2-GPU pod: free in block 0 = {1,2,3}, block 1 = {4,6,7}. Any pair inside
    # one block costs 1 block; straddling costs 2. The solver must not straddle.
    s = ClusterState([NodeSpec("n0", 96_000, 512_000, 8, "H100-80GB")])
    s.place(0, gpu_pod(1), (0,))
    s.place(0, gpu_pod(1), (5,))
    plan = place_gang(s, [gpu_pod(2)], policy="bestfit", time_limit=5)
    (_, gpus), = plan.placements
    assert len({g // 4 for g in gpus}) == 1


def test_mig_layout_options_cover_balanced():
    opts = _layout_options(GPU_MODELS["A100-80GB"])
    assert {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1} in opts
    assert {"7g.80gb": 1} in opts
    assert {"1g.10gb": 7} in opts


def test_repartition_serves_pending_mig_requests():
    # One A100-80GB node, 2 GPUs in all-1g.10gb (7 x 1g each), nothing allocated. Pending: 2 x 3g.40gb, 1 x 1g.10gb.
    # Free 1g instances already serve the 1g request. Repartitioning one GPU to 2 x 3g.40gb serves both 3g requests;
    # touching one GPU is the minimum.
    spec = NodeSpec("m0", 64_000, 512_000, 2, "A100-80GB", mig_layouts=({"1g.10gb": 7}, {"1g.10gb": 7}))
    s = ClusterState([spec])
    pending = [PodDemand(gpus=1, mig_profile="3g.40gb")] * 2 + [PodDemand(gpus=1, mig_profile="1g.10gb")]
    plan = repartition_mig(s, pending, time_limit=5)
    assert plan.status == "optimal"
    assert plan.served == {"3g.40gb": 2, "1g.10gb": 1}
    assert len(plan.layouts) == 1
    (layout,) = plan.layouts.values()
    assert layout.get("3g.40gb", 0) == 2
    apply_mig_plan(s, plan)
    assert int(s.mig_free[0, :, s.mig_pos["3g.40gb"]].sum()) == 2


def test_repartition_prefers_gpus_already_in_mig_mode():
    # Idle whole-GPU nodes listed first and idle all-1g.10gb nodes: either could serve 6 x 3g.40gb by changing three
    # GPUs, but turning a whole GPU into MIG takes it from whole-GPU jobs: only MIG GPUs are re-laid out.
    whole = [NodeSpec(f"w{i}", 128_000, 1_000_000, 8, "A100-80GB") for i in range(4)]
    mig = [NodeSpec(f"m{i}", 128_000, 1_000_000, 8, "A100-80GB", mig_layouts=({"1g.10gb": 7},) * 8)
           for i in range(2)]
    s = ClusterState(whole + mig)
    pending = [PodDemand(gpus=1, mig_profile="3g.40gb")] * 6
    plan = repartition_mig(s, pending, time_limit=5)
    assert plan.served == {"3g.40gb": 6}
    assert len(plan.layouts) == 3 and {n for n, _ in plan.layouts} <= {4, 5}


def test_repartition_skips_busy_gpus():
    spec = NodeSpec("m0", 64_000, 512_000, 1, "H100-80GB", mig_layouts=({"1g.10gb": 7},))
    s = ClusterState([spec])
    s.place(0, PodDemand(gpus=1, mig_profile="1g.10gb"), (0,))
    plan = repartition_mig(s, [PodDemand(gpus=1, mig_profile="7g.80gb")], time_limit=2)
    assert plan.layouts == {} and plan.served == {"7g.80gb": 0}


def test_cheapest_nodes_mixes_groups():
    # Pending: 4 x 1-GPU pods (8 cores each) and 8 CPU pods of 4 cores.
    # Groups: "gpu8" 8 GPUs/96 cores at 30/h; "gpu2" 2 GPUs/32 cores at 9/h; "cpu" 0 GPUs/32 cores at 1/h.
    # GPU pods: 2 x gpu2 = 18 (holds 4 GPU pods, 64 cores - 32 used = 32 cores left -> all 8 CPU pods fit too)
    # vs 1 x gpu8 = 30. Cheapest: 2 x gpu2 = 18, no cpu node needed.
    groups = [NodeGroup("gpu8", NodeSpec("t8", 96_000, 768_000, 8, "A100-80GB"), 30.0),
              NodeGroup("gpu2", NodeSpec("t2", 32_000, 128_000, 2, "L4"), 9.0),
              NodeGroup("cpu", NodeSpec("tc", 32_000, 128_000), 1.0)]
    pending = [gpu_pod(1, cpu=8000)] * 4 + [PodDemand(cpu_milli=4000, memory_mib=1024)] * 8
    plan = cheapest_nodes(pending, groups, time_limit=10)
    assert plan.status == "optimal" and plan.gap == pytest.approx(0.0)
    assert plan.new_nodes == {"gpu2": 2}
    assert plan.cost == pytest.approx(18.0)
    assert len(plan.assignments) == 12


def test_cheapest_nodes_reports_unplaceable_and_respects_models():
    groups = [NodeGroup("l4", NodeSpec("t", 32_000, 128_000, 2, "L4"), 5.0)]
    pending = [PodDemand(gpus=1, gpu_milli=1000, allowed_models=frozenset({"H100-80GB"})), gpu_pod(1)]
    plan = cheapest_nodes(pending, groups, time_limit=5)
    assert plan.unplaceable == [0]
    assert plan.new_nodes == {"l4": 1}


class _NoTime:
    """A solver that runs out of time before finding anything (CP-SAT's UNKNOWN)."""

    def solve(self, model):
        from ortools.sat.python import cp_model
        return cp_model.UNKNOWN


def test_gang_falls_back_to_greedy_when_the_solver_times_out(monkeypatch):
    import scoring.planner as planner

    monkeypatch.setattr(planner, "_solver", lambda *a, **k: _NoTime())
    s = ClusterState([NodeSpec(f"n{i}", 96_000, 512_000, 8, "A100-80GB") for i in range(2)])
    plan = place_gang(s, [gpu_pod(4), gpu_pod(4)], policy="bestfit")
    assert plan.status == "greedy" and plan.gap is None
    assert sorted(len(g) for _, g in plan.placements) == [4, 4]


def test_cheapest_nodes_falls_back_to_greedy(monkeypatch):
    import scoring.planner as planner

    monkeypatch.setattr(planner, "_solver", lambda *a, **k: _NoTime())
    groups = [NodeGroup("l4", NodeSpec("t", 32_000, 128_000, 2, "L4"), 5.0)]
    plan = cheapest_nodes([gpu_pod(1)] * 3, groups)
    # First-fit decreasing: 2 pods on the first new node, 1 on a second -> 2 nodes, cost 10.
    assert plan.status == "greedy" and plan.new_nodes == {"l4": 2} and plan.cost == 10.0


def test_repartition_falls_back_to_greedy(monkeypatch):
    import scoring.planner as planner

    monkeypatch.setattr(planner, "_solver", lambda *a, **k: _NoTime())
    s = ClusterState([NodeSpec("m0", 64_000, 512_000, 1, "A100-80GB", mig_layouts=({"1g.10gb": 7},))])
    plan = repartition_mig(s, [PodDemand(gpus=1, mig_profile="7g.80gb")])
    assert plan.status == "greedy" and plan.layouts == {(0, 0): {"7g.80gb": 1}}
    assert plan.served == {"7g.80gb": 1}



def test_after_a_solve_ctrl_c_is_still_a_keyboard_interrupt():
    # CP-SAT's own SIGINT handler, left behind after a solve, made Ctrl-C kill the process without any cleanup. In a
    # child process: without the fix the signal kills it.
    import subprocess
    import sys

    # The child starts with Python's own handler even when this run inherited SIGINT ignored (a background job).
    code = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
from scoring.model import ClusterState, NodeSpec, PodDemand
from scoring.planner import place_gang
s = ClusterState([NodeSpec("n0", 96_000, 512_000, 8, "A100-80GB")])
assert place_gang(s, [PodDemand(1000, 1024, 2, 1000)] * 2, policy="bestfit", time_limit=2).ok
try:
    signal.raise_signal(signal.SIGINT)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "KeyboardInterrupt"), out

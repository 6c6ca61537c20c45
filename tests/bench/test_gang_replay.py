"""The pure helpers of bench/gang_replay.py: drawing gangs, the member pods, and the run's accounting."""
from __future__ import annotations

import numpy as np
import pytest

from bench.gang_replay import (
    GangSpec,
    account,
    draw_gangs,
    gang_outcomes,
    histogram_summary,
    member_pod,
    parse_metrics,
    pending_reason,
    shape_summary,
    size_bucket,
    spread,
)
from scoring.constraints import HOSTNAME_LABEL
from scoring.gangs import GANG_GATE, RELEASED_ANNOTATION, group_of
from scoring.kubeobjects import pod_demand
from scoring.model import PodDemand

SHARE = PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=400, name="s")
ONE = PodDemand(cpu_milli=2000, memory_mib=2048, gpus=1, gpu_milli=1000, name="o")
EIGHT = PodDemand(cpu_milli=8000, memory_mib=8192, gpus=8, gpu_milli=1000, name="e")


def test_draw_gangs_reaches_the_demand_with_sizes_and_shapes_from_the_choices():
    gangs = draw_gangs([SHARE, ONE, EIGHT], 100_000, np.random.default_rng(1), demand=1.2)
    total = sum(g.gpu_milli for g in gangs)
    assert total >= 120_000 and total - gangs[-1].gpu_milli < 120_000  # stops with the gang that crosses it
    assert all(2 <= g.size <= 16 for g in gangs)
    assert {g.shape for g in gangs} <= {PodDemand(s.cpu_milli, s.memory_mib, s.gpus, s.gpu_milli)
                                        for s in (SHARE, ONE, EIGHT)}  # the trace's names are dropped
    assert [g.name for g in gangs[:2]] == ["g0000", "g0001"]
    # the same seed draws the same gangs; exactly N with `gangs`
    assert draw_gangs([SHARE, ONE, EIGHT], 100_000, np.random.default_rng(1), demand=1.2) == gangs
    pow2 = draw_gangs([ONE], 100_000, np.random.default_rng(2), gangs=40, sizes="pow2")
    assert len(pow2) == 40 and {g.size for g in pow2} <= {2, 4, 8, 16}
    with pytest.raises(ValueError):
        draw_gangs([PodDemand(cpu_milli=1)], 1000, np.random.default_rng(0))


def test_member_pod_is_a_gated_gang_member_or_the_same_plain_pod():
    g = GangSpec("g0003", 4, SHARE)
    assert g.member_names() == ["g0003-00", "g0003-01", "g0003-02", "g0003-03"]
    gated = member_pod("g0003-01", "replay", g, as_gang=True)
    plain = member_pod("g0003-01", "replay", g, as_gang=False)
    ref = group_of(gated)
    assert ref is not None and (ref.name, ref.size, ref.namespace) == ("g0003", 4, "replay")
    assert gated["spec"]["schedulingGates"] == [{"name": GANG_GATE}]
    assert group_of(plain) is None and "schedulingGates" not in plain["spec"]
    assert pod_demand(gated) == pod_demand(plain)
    assert pod_demand(plain).gpu_milli == 400


def test_outcomes_spread_and_buckets():
    assert gang_outcomes({"a": 2, "b": 3, "c": 4}, {"a": 2, "b": 1}) == {"whole": 1, "waiting": 1, "half_placed": 1}
    assert spread([]) == {"n": 0, "p50": None, "p90": None, "max": None}
    assert spread([float(i) for i in range(1, 11)]) == {"n": 10, "p50": 5.0, "p90": 9.0, "max": 10.0}
    assert [size_bucket(s) for s in (2, 4, 5, 8, 9, 13, 16)] == ["2-4", "2-4", "5-8", "5-8", "9-12", "13-16", "13-16"]


def test_histogram_summary_from_the_exposition():
    text = """# HELP gpuaas_gangs_reconcile_seconds x
# TYPE gpuaas_gangs_reconcile_seconds histogram
gpuaas_gangs_reconcile_seconds_bucket{le="0.01"} 5.0
gpuaas_gangs_reconcile_seconds_bucket{le="0.1"} 9.0
gpuaas_gangs_reconcile_seconds_bucket{le="1.0"} 10.0
gpuaas_gangs_reconcile_seconds_bucket{le="+Inf"} 10.0
gpuaas_gangs_reconcile_seconds_count 10.0
gpuaas_gangs_reconcile_seconds_sum 1.5
gpuaas_gangs_released_total 3.0
"""
    m = parse_metrics(text)
    assert m["gpuaas_gangs_released_total"] == 3.0
    h = histogram_summary(m, "gpuaas_gangs_reconcile_seconds")
    assert (h["count"], h["mean_s"], h["p50"], h["p90"], h["p99"]) == (10, 0.15, "<= 0.01", "<= 0.1", "<= 1")
    assert histogram_summary({}, "gpuaas_gangs_reconcile_seconds")["p50"] is None


def test_account_counts_whole_waiting_half_placed_and_times_whole_gangs_only():
    gangs = [GangSpec("g0000", 2, ONE), GangSpec("g0001", 2, EIGHT), GangSpec("g0002", 3, SHARE)]

    def pod(name, node=None, pin=None, released=None, why=None):
        return {"metadata": {"name": name, "annotations": {RELEASED_ANNOTATION: str(released)} if released else {}},
                "spec": {"nodeName": node, "nodeSelector": {HOSTNAME_LABEL: pin} if pin else {}},
                "status": {"conditions": [{"type": "PodScheduled", "status": "False", "message": why}] if why else []}}
    pods = {p["metadata"]["name"]: p for p in [
        pod("g0000-00", "n1", "n1", 100.5), pod("g0000-01", "n2", "n1", 100.5),  # whole; one member off its pin
        pod("g0001-00"), pod("g0001-01"),  # waiting
        pod("g0002-00", "n3"), pod("g0002-02", "n3"),  # half placed
        pod("g0002-01", why="0/200 nodes are available: 1 no GPU with 590/1000 free, 199 node(s) didn't match"),
    ]}
    created = {"g0000-00": 1.0, "g0000-01": 1.5, "g0002-00": 2.0, "g0002-02": 2.2}
    bound = {"g0000-00": 2.0, "g0000-01": 3.5, "g0002-00": 2.5, "g0002-02": 2.6}
    ungated = {"g0000-00": 1.7, "g0000-01": 1.9}
    got = account(gangs, pods, created, bound, 10_000, epoch_offset=99.0, ungated=ungated)  # release at 1.5
    assert got["gangs"] == {"whole": 1, "waiting": 1, "half_placed": 1}
    assert got["allocation_ratio"] == 100 * (2000 + 800) / 10_000
    assert got["allocation_ratio_whole_gangs_only"] == 20.0
    assert got["half_placed_gpu_milli"] == 800
    assert got["last_member_created_to_all_bound_s"] == {"n": 1, "p50": 2.0, "p90": 2.0, "max": 2.0}
    assert got["last_member_created_to_released_s"]["max"] == 0.0  # released at 100.5 = last created (99 + 1.5)
    assert got["released_to_last_gate_removed_s"]["max"] == 0.4
    assert got["last_gate_removed_to_all_bound_s"]["max"] == 1.6
    assert got["members_bound_off_their_pin"] == 1
    assert got["gangs_by_size"] == {"2-4": {"whole": 1, "waiting": 1, "half_placed": 1}}
    assert "last_member_created_to_released_s" not in account(gangs, pods, created, bound, 10_000)
    why = "0/200 nodes are available: 1 no GPU with 590/1000 free"
    assert got["half_placed_detail"] == [{"gang": "g0002", "size": 3, "bound": 2, "shape": "gpu-share",
                                          "pending_reasons": {why: 1}}]
    assert pending_reason({"spec": {"schedulingGates": [{"name": "x"}]}}) == "gated"
    assert pending_reason({"spec": {}}) == "not tried yet"
    held = "0/200 nodes are available: 1 held for the pods gpuaas planned ahead of this one (the pending GPU pods ..."
    assert pending_reason(pod("x", why=held)) == ("0/200 nodes are available: 1 held for the pods gpuaas planned ahead "
                                                  "of this one")
    assert shape_summary(gangs)["by_shape_kind"] == {"gpu-share": 1, "1-gpu": 1, "8-gpu": 1}

"""gpuaas/demo/agreement.py: the demo's per-service SLO count, the warm start it shares with the simulator, and the
measurements that say why the two differ."""
from __future__ import annotations

import math

import pytest

from gpuaas.demo.agreement import (
    OnDemoGpus,
    demo_slo,
    demo_windows,
    explain,
    initial_replicas,
    on_demo_gpus,
    replayed,
    simulated,
    start_delay_s,
    trace_window,
)
from gpuaas.demo.timeline import InferenceService, service_arrivals
from gpuaas.loadgen.trace import Arrival
from gpuaas.report.model import ReplicaRecord
from gpuaas.simulate.autoscaling import RateWindows

NAN = math.nan


def test_demo_slo_counts_started_requests_and_the_ones_already_late():
    # arrivals at 0, 1, 2, 3; starts 0.1 (met), 1.3 (waited 0.3 > 0.2: missed), never (waited 0.5 by now: missed),
    # never (waited 0.1 by now: not counted, it may still make it)
    assert demo_slo([0.0, 1.0, 2.5, 2.9], [0.1, 1.3, NAN, NAN], now=3.0, slo_s=0.2) == (1, 3)


def test_the_window_is_the_one_the_demo_replays_and_the_warm_start_its_first_minutes_need():
    trace = [Arrival(float(t), 5000, 20) for t in range(0, 600, 2)]  # one 2 s request every 2 s: one replica busy
    svc = InferenceService("s", rate_scale=8, offset_s=100.0, min_replicas=1, max_replicas=16)
    demo = service_arrivals(trace, svc, speed=10, duration_s=20)
    sim = trace_window(trace, svc, speed=10, duration_s=20)
    # the same arrivals (the demo's also one exactly at the window's end, which the simulator's window leaves out)
    assert [round(a.t * 10, 6) for a in demo if a.t < 20] == [round(a.t, 6) for a in sim]
    # 8 requests of 2 s every 2 s, 8 at a time per replica: one replica, within [min, max]
    assert initial_replicas(trace, svc, speed=10, duration_s=20) == 1
    assert initial_replicas(trace, InferenceService("s", 8, 100.0, min_replicas=3), speed=10, duration_s=20) == 3
    result = simulated(trace, svc, speed=10, duration_s=20, trace_path="t.csv")
    assert result.requests == len(sim) and result.slo_attainment == 1.0
    assert result.command.endswith("--rate-scale 8 --offset 100 --duration 200 --preroll 0 --fresh-memory "
                                   "--min-replicas 1 --max-replicas 16 --rate-windows 60,37.5,120 --json -")
    assert result.low <= result.slo_attainment <= result.high


def test_the_simulator_runs_with_the_demos_rate_windows():
    # speed 10: scrapes every 1.5 s, windows at least 2.5 scrapes (3.75 s): 6 s, 3.75 s, 12 s of wall time
    assert demo_windows(10) == RateWindows(rate=60.0, short_rate=37.5, service=120.0)


TEN_S = (50000, 0)  # 10 s of service
BURST = InferenceService("s", rate_scale=1, offset_s=0.0, min_replicas=1, max_replicas=4)


def _burst_trace():
    return [Arrival(0.0, *TEN_S)] * 24 + [Arrival(29.0, 5000, 0)]


@pytest.mark.parametrize("second_serves_at, met", [
    # 24 requests of 10 s at 0: the warm replica runs 8 and queues 8 (they wait 10 s: missed); 8 wait at the
    # gateway for the second replica: serving at 0.1 s wall (1 s of trace time at speed 10) they wait 1 s (met),
    # at 0.5 s wall 5 s (missed). The request at 29 s starts at once on either.
    (0.1, 8 + 8 + 1),
    (0.5, 8 + 1),
])
def test_replayed_drives_the_serving_model_with_the_demos_replicas(second_serves_at, met):
    replicas = [ReplicaRecord(pod="a", listed_s=0.0, bound_s=0.0, serving_s=0.0),
                ReplicaRecord(pod="b", listed_s=0.05, bound_s=0.05, serving_s=second_serves_at),
                ReplicaRecord(pod="never", listed_s=0.05, gone_s=0.2)]  # Pending, then deleted: serves nothing
    got = replayed(_burst_trace(), BURST, replicas, speed=10, duration_s=3.0, slo_s=2.0)
    assert got == pytest.approx(met / 25)


def test_start_delay_is_the_median_time_from_bound_to_serving_beyond_the_cold_start():
    # speed 10: the cold start is 6 s of wall time; after binding the replicas served 6.0, 6.5 and 7.0 s later:
    # median 0.5 s of wall time, 5 s of trace time. The warm one (listed at 0) and one never served do not count.
    replicas = [ReplicaRecord(pod="warm", listed_s=0.0, bound_s=0.0, serving_s=0.0),
                ReplicaRecord(pod="a", listed_s=1.0, bound_s=1.0, serving_s=7.0),
                ReplicaRecord(pod="b", listed_s=1.0, bound_s=9.0, serving_s=15.5),  # waited 8 s for a GPU first
                ReplicaRecord(pod="c", listed_s=2.0, bound_s=2.0, serving_s=9.0),
                ReplicaRecord(pod="d", listed_s=2.0)]
    assert start_delay_s(replicas, speed=10) == pytest.approx(5.0)
    assert start_delay_s(replicas[:1], speed=10) == 0.0


def test_on_demo_gpus_limits_new_replicas_to_what_the_cluster_left():
    # one request of 10 s every 0.25 s of trace time for 600 s: 40 busy slots, 5-6 replicas of 8; warm start 6
    trace = [Arrival(t / 4, *TEN_S) for t in range(2400)]
    svc = InferenceService("s", rate_scale=1, offset_s=0.0, min_replicas=1, max_replicas=12)
    free = on_demo_gpus(trace, svc, [(0.0, 100)], [], speed=10, duration_s=60)
    sim = simulated(trace, svc, speed=10, duration_s=60)
    assert (free.slo_attainment, free.low, free.high) == (sim.slo_attainment, sim.low, sim.high)  # nobody reaches it
    # the same load doubled at 300 s: ours asks for more; with no GPU beyond the warm start's it misses more
    burst = trace + [Arrival(300 + t / 4, *TEN_S) for t in range(1200)]
    burst.sort(key=lambda a: a.t)
    warm = initial_replicas(burst, svc, speed=10, duration_s=60)
    roomy = on_demo_gpus(burst, svc, [(0.0, 100)], [], speed=10, duration_s=60)
    tight = on_demo_gpus(burst, svc, [(0.0, warm)], [], speed=10, duration_s=60)
    assert tight.slo_attainment < roomy.slo_attainment - 0.05 and tight.low <= tight.slo_attainment <= tight.high
    with pytest.raises(ValueError, match="no GPU samples"):
        on_demo_gpus(trace, svc, [], [], speed=10, duration_s=60)


def test_explain_says_nothing_within_three_points_and_names_the_measurements_beyond():
    assert explain(0.80, 0.82, 0.78, 0.83, 0.80, OnDemoGpus(0.82, 0.8, 0.83)) == ""
    why = explain(0.76, 0.7954, 0.769, 0.7954, 0.76, OnDemoGpus(0.7952, 0.77, 0.80))
    assert why.startswith("-3.54 points: ")
    assert "on the demo's own replicas gives 76.00% (the same serving and counting" in why
    assert "GPUs the demo's cluster left it, 79.52% (-0.02 points for waiting for GPUs), 77.00-80.00%" in why
    assert "76.90-79.54%" in why and "holds the demo's number" not in why  # 76.00 is below both ranges
    both = explain(0.76, 0.7954, 0.769, 0.7954, 0.76, OnDemoGpus(0.7909, 0.755, 0.80))
    assert both.endswith("over the phases, which holds the demo's number: the phases and the GPUs")
    inside = explain(0.935, 0.9914, 0.934, 0.9914, 0.936, None)
    assert "holds the demo's number" in inside and "(-0.10 points from the demo" not in inside
    off = explain(0.90, 0.95, 0.94, 0.96, 0.93, None)
    assert "(-3.00 points from the demo: its serving or counting differ)" in off

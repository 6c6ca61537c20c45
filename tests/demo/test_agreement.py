"""gpuaas/demo/agreement.py: the demo's per-service SLO count, and the warm start it shares with the simulator."""
from __future__ import annotations

import math

from gpuaas.demo.agreement import demo_slo, initial_replicas, simulated, trace_window
from gpuaas.demo.timeline import InferenceService, service_arrivals
from gpuaas.loadgen.trace import Arrival

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
                                   "--min-replicas 1 --max-replicas 16 --json -")

"""The simulator's warm start, pre-roll window, oracle and search, on small hand-checkable traces."""
from __future__ import annotations

import json

import pytest

from autoscaler.policy import StaticPolicy
from gpuaas.cli import main
from gpuaas.loadgen.serving import ServiceModel, ServingSystem
from gpuaas.loadgen.trace import Arrival, TraceError, window
from gpuaas.simulate.autoscaling import simulate
from gpuaas.simulate.autoscaling_oracle import interval_needs, oracle_policy, schedule, warm_start_replicas
from gpuaas.simulate.autoscaling_search import Search

ONE_S = (5000, 0)  # 1 s of service


def arrivals(times):
    return [Arrival(t, *ONE_S) for t in times]


def test_inflight_integral_is_the_average_concurrency():
    s = ServingSystem(ServiceModel(concurrency=1, max_waiting=8), arrivals([0.0, 0.0]))
    s.add_replica("r", 0, cold_start_s=0)
    s.advance(0.5)
    assert s.inflight() == 2 and s.inflight_seconds() == pytest.approx(1.0)  # 2 in flight for 0.5 s
    s.advance(3.0)  # one done at 1 s, the other at 2 s: 2 x 1 + 1 x 1
    assert s.inflight() == 0 and s.inflight_seconds() == pytest.approx(3.0)


def test_routing_picks_the_least_loaded_then_the_oldest():
    s = ServingSystem(ServiceModel(concurrency=2, max_waiting=0), arrivals([0.0, 0.0, 0.0, 0.0, 0.0]))
    for name in ("a", "b"):
        s.add_replica(name, 0, cold_start_s=0)
    s.advance(0.0)
    assert (s.replicas["a"].running, s.replicas["b"].running, s.gateway_waiting()) == (2, 2, 1)
    s.advance(1.0)  # a's requests end first (it started them first): the gateway's goes to a
    assert s.replicas["a"].received_total == 3


def test_a_fork_is_an_independent_what_if():
    s = ServingSystem(ServiceModel(concurrency=1, max_waiting=0), arrivals([0.0, 0.0, 0.0, 3.0]))
    s.add_replica("a", 0, cold_start_s=0)
    s.advance(0.5)
    f = s.fork()
    f.add_replica("b", 0.5, cold_start_s=0)
    f.arrival_limit = 3  # the arrival at 3 s held back
    f.advance(10)
    assert sorted(f.queue_waits()) == [0, 0.5, 1.0] and f.arrived_total() == 3
    s.advance(10)
    assert sorted(s.queue_waits()) == [0, 0, 1, 2]  # the original kept one replica and took the 4th arrival


def test_window_wraps_and_prerolls():
    trace = arrivals([0, 1, 2, 5])  # span 6
    assert [a.t for a in window(trace, 0, None, 2)] == [1, 2, 3, 4, 7]  # 5 -> pre-roll at 1; the trace from 2
    assert [a.t for a in window(trace, 2, 3)] == [0]
    assert window(trace) == trace
    with pytest.raises(TraceError):
        window(trace, -1)


def test_warm_start_is_what_the_first_minute_needs():
    # 32 one-second requests at once: 8 slots per replica serve 8 + 16 within 2 s, so 2 replicas (16 slots: all
    # start within 1 s); 1 replica leaves 8 waiting 3 s
    assert warm_start_replicas(arrivals([10.0] * 32)) == 2
    assert warm_start_replicas(arrivals([100.0])) == 1  # nothing in the first minute: still one


def test_interval_needs_and_the_schedule_bridges_short_gaps():
    model = ServiceModel()
    start, needs = interval_needs(arrivals([20.0] * 20 + [100.0] * 40), model, interval_s=15.0,
                                  first_boundary_s=7.5)
    assert start == -7.5
    assert needs == [0, 1, 0, 0, 0, 0, 0, 2]  # [7.5, 22.5): 20 at once -> 1 (8 + 8 + 8 within 2 s); 40 -> 2
    points = schedule(start, needs, interval_s=15.0, cold_start_s=60.0, initial=1)
    # level 1: warm from 0, needed in [7.5, 22.5) and [97.5, 112.5): the 75 s gap is more than a cold start, so it is
    # released at 22.5 and asked again at 37.5; level 2 asked at 37.5 for [97.5, 112.5)
    assert points == [(0.0, 1), (22.5, 0), (37.5, 2), (112.5, 0)]


def test_oracle_meets_the_slo_where_a_small_static_fleet_does_not():
    trace = arrivals([i * 0.5 for i in range(240)] + [300 + i / 40 for i in range(1200)])
    model = ServiceModel()
    warm = warm_start_replicas(trace, model)
    oracle = oracle_policy(trace, model)
    r = simulate(trace, oracle, model, initial_replicas=warm, warm=True)
    assert r.slo_attainment > 0.99
    assert r.gpu_replica_hours == pytest.approx(oracle.gpu_hours_between(0, trace[-1].t), rel=0.1)
    small = simulate(trace, StaticPolicy(warm), model, initial_replicas=warm, warm=True)
    assert small.slo_attainment < 0.9


def test_search_finds_the_cheapest_setting_per_baseline(tmp_path):
    trace = arrivals([i * 0.5 for i in range(600)])  # a steady 2 req/s of 1 s: one replica serves it
    result = Search(trace, max_replicas=8).search()
    rows = {r["policy"]: r for r in result["rows"]}
    assert set(rows) == {"ours", "hpa-inflight", "hpa-queue", "keda-inflight", "keda-queue", "kpa", "static", "oracle"}
    assert rows["static"]["setting"] == "1 replicas" and rows["static"]["reaches_bar"]
    assert result["cheapest_baseline"]["gpu_hours"] == pytest.approx(rows["static"]["gpu_hours"])
    assert rows["oracle"]["over_oracle"] == 1.0 and "bound_gpu_hours" in rows["oracle"]


TRACE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         + "".join(f"2023-11-16 18:{17 + i // 60:02d}:{i % 60:02d}.0000000,5000,0\n" for i in range(300)))


def test_cli_search_prints_one_table(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    out = tmp_path / "s.json"
    assert main(["simulate", "autoscaling", "--trace", str(trace), "--search", "--max-replicas", "6",
                 "--preroll", "60", "--json", str(out)]) == 0
    body = json.loads(out.read_text())
    assert body["preroll_s"] == 60 and body["rows"][0]["policy"] == "ours"
    table = capsys.readouterr().out
    for words in ("policy", "setting", "SLO attain", "p99 wait s", "GPU-h", "x oracle", "kpa", "oracle"):
        assert words in table


def test_cli_kpa_and_oracle_and_both_metrics(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    out = tmp_path / "r.json"
    assert main(["simulate", "autoscaling", "--trace", str(trace), "--policy", "hpa,kpa,oracle", "--metric",
                 "inflight,queue", "--target", "4", "--preroll", "0", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["policy"], r["setting"]) for r in runs] == [
        ("hpa", "inflight 4/pod, min 1"), ("hpa", "queue 4/pod, min 1"), ("kpa", "target 4 x 0.7, min 0"),
        ("oracle", "hindsight")]

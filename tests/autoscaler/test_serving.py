"""The service model and the simulated-time loop: hand-checkable small traces."""
from __future__ import annotations

import json

import numpy as np
import pytest

from autoscaler.policy import QueueDepthConfig, QueueDepthPolicy, StaticPolicy
from gpuaas.cli import main
from gpuaas.loadgen.replayer import render_metrics
from gpuaas.loadgen.serving import ServiceModel, ServingSystem
from gpuaas.loadgen.trace import Arrival, TraceError, load_trace, scale_rate
from gpuaas.simulate.autoscaling import ScrapeLog, peak_replicas, simulate

ONE_S = (5000, 0)  # 5000 context tokens / 5000 per s = 1 s of service


def arrivals(times, tokens=ONE_S):
    return [Arrival(t, *tokens) for t in times]


def test_service_time_formula():
    assert ServiceModel().service_time(4808, 10) == pytest.approx(4808 / 5000 + 10 / 20)


def test_concurrency_and_queue_wait():
    m = ServiceModel(concurrency=2, max_waiting=8)
    s = ServingSystem(m, arrivals([0, 0, 0, 0, 0]))  # five 1 s requests at once on one replica of 2 slots
    s.add_replica("r", 0, cold_start_s=0)
    s.advance(10)
    # two start at 0, two at 1, one at 2
    assert sorted(s.queue_waits()) == [0, 0, 1, 1, 2]
    assert s.replicas["r"].finished_total == 5 and s.replicas["r"].service_seconds_total == pytest.approx(5)


def test_cold_start_and_gateway():
    s = ServingSystem(ServiceModel(cold_start_s=60), arrivals([1, 2]))
    s.add_replica("r", 0)
    s.advance(30)
    assert s.gateway_waiting() == 2 and s.replica_metrics() == {}  # starting replicas export nothing
    s.advance(61)
    assert sorted(s.queue_waits()) == [58, 59]  # served at 60
    assert s.gpu_seconds(61) == 61


def test_replica_holds_at_most_max_waiting_the_rest_waits_at_the_gateway():
    s = ServingSystem(ServiceModel(concurrency=1, max_waiting=2), arrivals([0] * 5))
    s.add_replica("a", 0, cold_start_s=0)
    s.advance(0.5)
    assert (s.replicas["a"].running, len(s.replicas["a"].queue), s.gateway_waiting()) == (1, 2, 2)
    s.add_replica("b", 0.5, cold_start_s=0)
    s.advance(0.5)
    assert s.replicas["b"].running == 1  # the new replica takes from the gateway at once


def test_removed_replica_hands_back_its_queue_and_finishes_running_ones():
    s = ServingSystem(ServiceModel(concurrency=1, max_waiting=4), arrivals([0, 0, 0]))
    s.add_replica("a", 0, cold_start_s=0)
    s.add_replica("b", 0, cold_start_s=100)
    s.advance(0.1)
    s.remove_replica("b", 0.1)  # not serving yet: gone at once
    assert s.replicas["b"].gone_at == 0.1
    s.add_replica("c", 0.1, cold_start_s=0)
    s.advance(0.1)
    s.remove_replica("a", 0.2)
    s.advance(5)
    assert s.replicas["a"].gone_at == pytest.approx(1.0)  # its running request finished at 1 s
    assert s.done and all(w <= 2.0 for w in s.queue_waits())


def test_scrape_log_rate_and_staleness():
    log = ScrapeLog()
    s = ServingSystem(ServiceModel(), arrivals([i * 0.5 for i in range(200)]))  # 2 req/s
    s.add_replica("r", 0, cold_start_s=0)
    for t in range(0, 91, 15):
        s.advance(t)
        log.scrape(t, s.replica_metrics(), s.gateway_waiting(), s.arrived_total())
    sig = log.signals(90)
    assert sig.arrival_rate == pytest.approx(2.0, abs=0.05)
    assert sig.service_time == pytest.approx(1.0)
    assert set(sig.queue_per_pod) == {"r"}
    assert log.signals(-1) is None


def test_static_fleet_on_a_steady_trace_meets_the_slo():
    # 4 req/s of 1 s requests = 4 busy slots: one replica of 8 serves it all without waiting
    trace = arrivals([i * 0.25 for i in range(1200)])
    r = simulate(trace, StaticPolicy(1))
    assert r.slo_attainment == 1.0 and r.max_replicas == 1
    assert r.gpu_replica_hours == pytest.approx(trace[-1].t / 3600)
    assert peak_replicas(trace) == 1


def test_ours_follows_a_step_up_and_back_down():
    # 2 req/s for 5 min, 40 req/s (1 s each: 40 slots -> 6 replicas) for 5 min, then 2 req/s for 40 min
    times = [i / 2 for i in range(600)] + [300 + i / 40 for i in range(12000)] + [600 + i / 2 for i in range(4800)]
    r = simulate(arrivals(times), QueueDepthPolicy(QueueDepthConfig()))
    # 40 slots + sqrt(40) = 46.3 -> 6 replicas in steady state; the first syncs add the backlog and the trend
    assert 6 <= r.max_replicas <= 16
    # the load falls at 600 s; the default scale-down memory is 30 cold starts (1800 s), plus the 1 min rate window
    fading = [live for t, live, _, _ in r.timeline if 600 + 120 < t < 600 + 1800]
    assert fading == sorted(fading, reverse=True) and fading[0] > fading[-1]  # coming down step by step
    after = [live for t, live, _, _ in r.timeline if t > 600 + 1800 + 60]
    assert after and max(after) == 1
    # the first ~75 s of the step (scrape, sync, 60 s cold start) wait whatever the policy: about 3000 of 17400
    # requests; the backlog they leave takes the new replicas a while to drain, so somewhat more
    assert 0.7 < r.slo_attainment < 0.85


def test_rate_scale_spreads_copies_within_the_second():
    out = scale_rate([Arrival(3.25, 1, 1)], 4)
    assert [a.t for a in out] == [3.0, 3.25, 3.5, 3.75]
    with pytest.raises(TraceError):
        scale_rate([], 0)


@pytest.mark.parametrize("text, words", [
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,1\n", "missing column(s) GeneratedTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", ":2: field 'TIMESTAMP' is not a time"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,x,2\n", ":2: field 'ContextTokens' must be"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,1,-2\n", "must not be negative"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04,1,2\n2023-11-16 18:17:03,1,2\n", "back in time"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no arrivals"),
])
def test_trace_errors_name_line_and_field(tmp_path, text, words):
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(TraceError, match=None) as err:
        load_trace(p)
    assert words in str(err.value)


def test_render_metrics_text_format():
    s = ServingSystem(ServiceModel(), arrivals([0, 0]))
    s.add_replica("llm-1", 0, cold_start_s=0)
    s.advance(0.5)
    text = render_metrics(s, "inf", "llm")
    assert 'vllm:num_requests_running{namespace="inf",pod="llm-1"} 2' in text
    assert 'gpuaas_gateway_requests_total{namespace="inf",deployment="llm"} 2' in text
    assert "# TYPE vllm:num_requests_waiting gauge" in text


TRACE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         + "".join(f"2023-11-16 18:{17 + i // 60:02d}:{i % 60:02d}.0000000,5000,0\n" for i in range(600)))


def test_cli_writes_the_documented_json(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    out = tmp_path / "r.json"
    assert main(["simulate", "autoscaling", "--trace", str(trace), "--policy", "ours,hpa,keda,static",
                 "--target", "1,2", "--rate-scale", "2", "--json", str(out)]) == 0
    body = json.loads(out.read_text())
    assert [r["policy"] for r in body["runs"]] == ["ours", "hpa", "hpa", "keda", "keda", "static"]
    for r in body["runs"]:
        assert {"slo_attainment", "p99_queue_wait_s", "gpu_replica_hours", "max_replicas"} <= set(r)
    assert body["rate_scale"] == 2 and body["service_model"]["concurrency"] == 8
    table = capsys.readouterr().out
    assert "SLO attain" in table and "keda" in table


@pytest.mark.parametrize("argv, words", [
    (["--policy", "hpa"], "policy hpa needs --target"),
    (["--policy", "vpa"], "unknown policy 'vpa'"),
    (["--policy", "ours", "--rate-scale", "0"], "rate scale must be a whole number >= 1"),
])
def test_cli_refuses_bad_input(tmp_path, capsys, argv, words):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    assert main(["simulate", "autoscaling", "--trace", str(trace), "--json", "-", *argv]) == 2
    assert words in capsys.readouterr().err


def test_help_states_the_service_model(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "autoscaling", "--help"])
    text = capsys.readouterr().out
    for words in ("8 requests at once", "ContextTokens/5000 + GeneratedTokens/20", "60 s after it is asked",
                  "every 15 s", "at most 2 s", "spread within its second"):
        assert words in " ".join(text.split()), words


def test_synthetic_trace_has_the_shape_of_the_code_trace_and_round_trips_through_the_reader(tmp_path):
    from gpuaas.loadgen.trace import synthetic_trace, write_trace

    arrivals = synthetic_trace(1800, seed=1)
    times = [a.t for a in arrivals]
    assert times == sorted(times) and times[0] == 0.0 and times[-1] < 1800
    assert 1.5 < len(arrivals) / 1800 < 4.0  # the Azure code trace: 2.6 requests/s
    per_second = np.bincount(np.array(times, dtype=int))
    assert per_second.max() > 3 * np.median(per_second)  # it has bursts
    assert 1000 < np.median([a.context_tokens for a in arrivals]) < 2200
    assert synthetic_trace(1800, seed=1) == arrivals != synthetic_trace(1800, seed=2)
    path = tmp_path / "trace.csv"
    write_trace(path, arrivals[:50])
    back = load_trace(path)
    assert ([(round(a.t, 3), a.context_tokens) for a in back]
            == [(round(a.t, 3), a.context_tokens) for a in arrivals[:50]])


def test_table_shows_a_min_replicas_column_only_when_a_row_has_a_floor():
    from gpuaas.simulate.autoscaling_cli import format_table

    row = {"policy": "hpa", "target": 2.0, "slo_attainment": 0.99, "p99_queue_wait_s": 1.0, "gpu_replica_hours": 3.0,
           "max_replicas": 7}
    assert " min " not in format_table([row]).splitlines()[0]
    lines = format_table([{**row, "min_replicas": 40}, {**row, "policy": "static"}]).splitlines()
    assert lines[0].split()[:3] == ["policy", "target", "min"]
    assert lines[2].split()[:3] == ["hpa", "2", "40"] and lines[3].split()[:2] == ["static", "2"]

"""The controller loop with a fake Prometheus and a fake Kubernetes: what each kind of metrics failure does, events,
conditions, dry run, and queries refused at start."""
from __future__ import annotations

import json
import math

import pytest

from autoscaler.config import AutoscalerConfig, ConfigError, load_autoscaler_config, parse
from autoscaler.controller import Controller, Observed, gather_signals
from autoscaler.prom import BadQuery, NoData, PrometheusUnavailable, Sample
from tests.conftest import Clock


class FakeProm:
    """Answers by query kind; `mode` injects the failure to test. Records the queries it saw."""

    def __init__(self):
        self.mode = "ok"
        self.rate = 20.0
        self.queue = {"llm-0": 3.0, "llm-1": 5.0}
        self.queries: list[str] = []

    def query(self, promql: str) -> list[Sample]:
        self.queries.append(promql)
        if self.mode == "down":
            raise PrometheusUnavailable("cannot reach Prometheus at http://prom:9090: connection refused")
        if self.mode == "slow":
            raise PrometheusUnavailable("Prometheus at http://prom:9090 did not answer within 5s")
        if self.mode == "badquery":
            raise BadQuery(f"Prometheus rejected the query {promql!r}: bad_data: parse error")
        if "num_requests_waiting" in promql:
            return [Sample({"pod": p}, v) for p, v in self.queue.items()]
        if "gateway_requests_total" in promql:
            if self.mode == "empty":
                return []
            return [Sample({}, math.nan if self.mode == "nan" else self.rate)]
        if "inference_time" in promql:
            return [Sample({}, 2.0)]
        return []

    def scalar(self, promql: str) -> float:
        samples = self.query(promql)
        if not samples:
            raise NoData(f"{promql!r} returned an empty vector")
        if math.isnan(samples[0].value):
            raise NoData(f"{promql!r} returned nan")
        return samples[0].value


class FakeTargets:
    def __init__(self, replicas: int):
        self.replicas = replicas
        self.events: list[tuple[str, str, str]] = []
        self.conditions: list[dict] = []
        self.scaled: list[int] = []
        self.fail_scale = False
        self.condition_writes = 0
        self.annotations = {}

    def observe(self, target):
        pods = frozenset(f"llm-{i}" for i in range(self.replicas))
        return Observed(self.replicas, pods, frozenset(), uid="u1", annotations=self.annotations)

    def scale(self, target, replicas):
        if self.fail_scale:
            raise RuntimeError("conflict")
        self.scaled.append(replicas)
        self.replicas = replicas

    def event(self, target, observed, type_, reason, message):
        self.events.append((type_, reason, message))

    def set_conditions(self, target, conditions):
        self.conditions = conditions
        self.condition_writes += 1

    def condition(self, type_):
        return next(c for c in self.conditions if c["type"] == type_)


def make(replicas=2, dry_run=False, **target):
    config = parse(AutoscalerConfig, {"interval_s": 15, "dry_run": dry_run, "targets": [
        # the policy's arithmetic as these tests spell it out (beta 1.5, a linear hold down to half)
        {"deployment": "llm", "namespace": "inf", "max_replicas": 20, "scale_down_window_s": 60, "beta": 1.5,
         "hold_floor": 0.5, **target}]})
    prom, kube, clock = FakeProm(), FakeTargets(replicas), Clock(1_000_000.0)
    return Controller(config, prom, kube, clock=clock), prom, kube, clock


def test_scales_up_and_records_event_and_conditions():
    c, prom, kube, _clock = make()
    d = c.sync_once()["inf/llm"]
    # 20 req/s x 2 s = 40 slots + 1.5 sqrt(40) = 49.5; queue 8 x 2 / 60 = 0.27 -> 49.8 / 8 -> 7
    assert d.desired == 7 and kube.scaled == [7]
    assert kube.events[-1][:2] == ("Normal", "ScaleUp") and "scaled from 2 to 7" in kube.events[-1][2]
    assert kube.condition("ScalingActive")["status"] == "True"
    assert kube.condition("AbleToScale")["reason"] == "SucceededRescale"
    # the pod names went into the queries
    assert any('pod=~"llm-0|llm-1"' in q for q in prom.queries)


@pytest.mark.parametrize("mode, words", [
    ("down", "connection refused"),
    ("slow", "did not answer within 5s"),
    ("nan", "returned nan"),
    ("empty", "returned an empty vector"),
])
def test_metrics_failure_blocks_scale_down_says_why_and_recovers(mode, words):
    c, prom, kube, clock = make(replicas=7)
    prom.rate = 0.5  # the load is gone: with data, the controller would scale down after the window
    prom.queue = {f"llm-{i}": 0.0 for i in range(7)}
    prom.mode = mode
    for _ in range(10):  # 150 s: well past the 60 s scale-down window
        clock.t += 15
        c.sync_once()
    assert kube.replicas == 7 and kube.scaled == []
    warnings = [e for e in kube.events if e[1] == "MetricsUnavailable"]
    assert len(warnings) == 1 and words in warnings[0][2] and "no scale-down" in warnings[0][2]
    cond = kube.condition("ScalingActive")
    assert (cond["status"], cond["reason"]) == ("False", "MetricsUnavailable") and words in cond["message"]
    since = cond["lastTransitionTime"]
    prom.mode = "ok"
    clock.t += 15
    c.sync_once()
    assert kube.replicas == 1  # back: 0.5 x 2 = 1 slot + 1.5 -> 1 replica; nothing higher in the window
    assert [e[1] for e in kube.events][-2:] == ["MetricsRecovered", "ScaleDown"]
    cond = kube.condition("ScalingActive")
    assert cond["status"] == "True" and cond["lastTransitionTime"] != since


def test_dry_run_decides_and_says_so_without_scaling():
    c, _prom, kube, _clock = make(dry_run=True)
    c.sync_once()
    assert kube.scaled == [] and kube.replicas == 2
    assert kube.events[-1][1] == "DryRunScaleUp" and "would scale from 2 to 7" in kube.events[-1][2]


def test_failed_scale_is_reported():
    c, _prom, kube, _clock = make()
    kube.fail_scale = True
    c.sync_once()
    assert kube.events[-1][:2] == ("Warning", "FailedRescale")
    assert kube.condition("AbleToScale")["status"] == "False"


def test_bad_query_or_unreachable_prometheus_refused_at_start():
    c, prom, _kube, _clock = make()
    prom.mode = "badquery"
    with pytest.raises(ConfigError, match="target inf/llm: query queue_per_pod: Prometheus rejected"):
        c.validate()
    prom.mode = "down"
    with pytest.raises(ConfigError, match="cannot validate the queries of target inf/llm: cannot reach"):
        c.validate()


def test_nan_for_one_pod_makes_it_missing_and_is_noted():
    c, prom, _kube, _clock = make()
    prom.queue = {"llm-0": math.nan, "llm-1": 2.0}
    sig, note = gather_signals(prom, c.config.targets[0], ["llm-0", "llm-1"])
    assert sig.queue_per_pod == {"llm-1": 2.0} and "queue depth of pod llm-0 is nan" in note


@pytest.mark.parametrize("raw, message", [
    ({"targets": []}, "targets: List should have at least 1 item"),
    ({"targets": [{"deployment": "a", "min_replicas": 5, "max_replicas": 2}]},
     "min_replicas (5) is above max_replicas"),
    ({"targets": [{"deployment": "a", "queries": {"arrival_rate": "rate(x[{win}])"}}]}, "unknown placeholder {win}"),
    ({"targets": [{"deployment": "a", "queries": {"arrivals": "x"}}]}, "unknown query arrivals"),
    ({"targets": [{"deployment": "a", "queries": {"arrival_rate": ""}}]}, "query arrival_rate is required"),
    ({"targets": [{"deployment": "a", "windows": {"rate_window": "1 minute"}}]}, "must be a PromQL duration"),
    ({"prometheus": {"url": "prom:9090"}, "targets": [{"deployment": "a"}]}, "prometheus.url: must be an http(s) URL"),
    ({"targets": [{"deployment": "a"}], "intervall_s": 3}, "intervall_s: unknown field"),
    ({"targets": [{"deployment": "a"}, {"deployment": "a"}]}, "target default/a listed more than once"),
    ({"targets": [{"deployment": "a", "namespace": 'x",namespace!="'}]},
     "namespace: 'x\",namespace!=\"' is not a DNS-1123 label"),
    ({"targets": [{"deployment": 'a"} or up{x="'}]}, "deployment: 'a\"} or up{x=\"' is not a DNS-1123 subdomain"),
    ({"targets": [{"deployment": "a", "namespace": "a.b"}]}, "namespace: 'a.b' is not a DNS-1123 label"),
])
def test_config_errors_name_the_field(raw, message):
    with pytest.raises(ConfigError) as err:
        parse(AutoscalerConfig, raw, "as.yaml")
    assert message in str(err.value) and str(err.value).startswith("invalid configuration (as.yaml): ")


def test_queries_carry_the_target_and_its_pods_as_exact_promql_strings():
    # A Deployment name is a DNS-1123 subdomain: dots are allowed, and in the pod regex a dot matches only a dot.
    target = parse(AutoscalerConfig, {"targets": [{"deployment": "llm.v2", "namespace": "inf"}]}).targets[0]
    assert target.query("queue_per_pod", ["llm.v2-0", "llm.v2-1"]) == \
        'sum by (pod) (vllm:num_requests_waiting{namespace="inf",pod=~"llm\\\\.v2-0|llm\\\\.v2-1"})'
    assert target.query("gateway_waiting", []) == \
        'sum(gpuaas_gateway_requests_waiting{namespace="inf",deployment="llm.v2"})'


def test_config_file_then_environment(tmp_path):
    path = tmp_path / "as.yaml"
    path.write_text("interval_s: 5\ntargets: [{deployment: a}]\n")
    config = load_autoscaler_config(path, environ={"GPUAAS_AUTOSCALER_DRY_RUN": "true",
                                                   "GPUAAS_AUTOSCALER_PROMETHEUS__TIMEOUT_S": "2"})
    assert (config.interval_s, config.dry_run, config.prometheus.timeout_s) == (5, True, 2)
    with pytest.raises(ConfigError, match=r"as.yaml \+ GPUAAS_AUTOSCALER_\* environment\): interval_s"):
        load_autoscaler_config(path, environ={"GPUAAS_AUTOSCALER_INTERVAL_S": "-1"})


def test_conditions_json_shape():
    c, _prom, kube, _clock = make()
    c.sync_once()
    assert {d["type"] for d in kube.conditions} == {"AbleToScale", "ScalingActive", "ScalingLimited"}
    assert all(set(d) == {"type", "status", "reason", "message", "lastTransitionTime"} for d in kube.conditions)
    json.dumps(kube.conditions)


def test_conditions_written_only_when_they_change_and_kept_across_restarts():
    c, prom, kube, clock = make()
    c.sync_once()  # scales 2 -> 7: AbleToScale SucceededRescale
    clock.t += 15
    c.sync_once()  # steady at 7: AbleToScale ReadyForNewScale
    writes = kube.condition_writes
    for _ in range(3):
        clock.t += 15
        c.sync_once()
    assert kube.condition_writes == writes  # nothing changed, nothing written
    since = kube.condition("ScalingActive")["lastTransitionTime"]
    # a new controller process reads the annotation back: the transition time survives
    kube.annotations = {"autoscaling.gpuaas.io/conditions": json.dumps(kube.conditions)}
    c2 = Controller(c.config, prom, kube, clock=clock)
    clock.t += 15
    c2.sync_once()
    assert kube.condition("ScalingActive")["lastTransitionTime"] == since


# ---- two replicas behind one Lease -----------------------------------------------------------------------------------
class Lease:
    """Who holds the lease, as `may_act` of each replica sees it."""

    def __init__(self, holder: str):
        self.holder = holder

    def may_act(self, who: str):
        return lambda: self.holder == who


def pair(replicas=2):
    """Two controllers on the same Prometheus and Deployment, as two replicas of the autoscaler."""
    config = parse(AutoscalerConfig, {"interval_s": 15, "targets": [
        {"deployment": "llm", "namespace": "inf", "max_replicas": 20, "scale_down_window_s": 60, "beta": 1.5,
         "hold_floor": 0.5}]})
    prom, kube, clock, lease = FakeProm(), FakeTargets(replicas), Clock(1_000_000.0), Lease("a")
    a = Controller(config, prom, kube, clock=clock, may_act=lease.may_act("a"))
    b = Controller(config, prom, kube, clock=clock, may_act=lease.may_act("b"))
    return a, b, prom, kube, clock, lease


def test_only_the_leader_writes_the_standby_decides_the_same_and_writes_nothing():
    a, b, _prom, kube, _clock, _lease = pair()
    db = b.sync_once()["inf/llm"]
    assert kube.scaled == [] and kube.events == [] and kube.condition_writes == 0
    da = a.sync_once()["inf/llm"]
    assert da.desired == db.desired == 7 and kube.scaled == [7] and len(kube.events) == 1
    assert (a.syncs_acting, b.syncs_acting) == (1, 0) and b.syncs == 1


def test_a_new_leader_keeps_the_burst_memory_the_standby_built_up():
    a, b, prom, kube, clock, lease = pair()
    for c in (a, b):
        c.sync_once()  # the burst: a scales to 7; b decides 7 too
    prom.rate, prom.queue = 0.5, {f"llm-{i}": 0.0 for i in range(7)}
    clock.t += 15
    lease.holder = "b"  # a dies; b takes over 15 s after the burst
    d = b.sync_once()["inf/llm"]
    # the recommendation of 7 fades over the 60 s window: b keeps most of the fleet instead of dropping to 1
    assert d.desired >= 6 and kube.replicas == d.desired
    cold = Controller(b.config, prom, FakeTargets(7), clock=clock)
    assert cold.sync_once()["inf/llm"].desired == 1  # what a replica without that memory would have done


def test_a_standby_does_not_announce_again_what_the_leader_announced():
    a, b, prom, kube, clock, lease = pair(replicas=7)
    prom.mode = "down"
    for c in (a, b):
        c.sync_once()
    assert [e[1] for e in kube.events] == ["MetricsUnavailable"]
    lease.holder = "b"
    clock.t += 15
    b.sync_once()
    assert [e[1] for e in kube.events] == ["MetricsUnavailable"]  # b knew it had been said
    prom.mode = "ok"
    clock.t += 15
    b.sync_once()
    assert "MetricsRecovered" in [e[1] for e in kube.events]


def test_losing_the_lease_in_the_middle_of_a_sync_stops_the_writes():
    config = parse(AutoscalerConfig, {"targets": [{"deployment": "llm", "namespace": "inf", "max_replicas": 20}]})
    # may_act is asked when the sync starts, when the target's sync starts, then before each write
    for answers, scaled, events, condition_writes in (
            ([True, True, False], [], [], 0),  # gone before the scale: nothing written
            ([True, True, True, False], [6], ["ScaleUp"], 0)):  # gone after it: the scale and its event, no more
        it = iter(answers)
        kube = FakeTargets(2)
        Controller(config, FakeProm(), kube, clock=Clock(1_000_000.0),
                   may_act=lambda it=it: next(it, False)).sync_once()
        assert (kube.scaled, [e[1] for e in kube.events], kube.condition_writes) == (scaled, events, condition_writes)

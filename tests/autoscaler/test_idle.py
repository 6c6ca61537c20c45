"""autoscaler/idle.py: the gauges and the events of the idle-GPU look. Prometheus and Kubernetes are stood in for by
fakes as small as what the watcher calls (`query`, `read`, `event`); tests/e2e/test_idle_gpus.py runs the real ones."""
from __future__ import annotations

import pytest

from autoscaler.config import IdleGpusConfig, parse
from autoscaler.idle import BUSY_REASON, IDLE_REASON, IdleWatcher, read_utilization
from autoscaler.metrics import Metrics
from autoscaler.prom import MetricsError, Sample
from tests.scoring.test_idle import NOW, controlled_by, pod


class FakeProm:
    def __init__(self):
        self.util: dict[tuple[str, str], float] = {}
        self.fail: str | None = None
        self.queries: list[str] = []

    def query(self, promql: str) -> list[Sample]:
        self.queries.append(promql)
        if self.fail:
            raise MetricsError(self.fail)
        if "DCGM_FI_DEV_GPU_UTIL" in promql:
            return [Sample({"namespace": ns, "pod": p}, 100 * v) for (ns, p), v in self.util.items()]
        return []  # no profiling metrics: DCGM_FI_PROF_GR_ENGINE_ACTIVE absent


class FakeWorkloads:
    def __init__(self, pods, owners):
        self.pods, self.owners = pods, owners

    def read(self):
        return self.pods, self.owners


class Recorder:
    def __init__(self):
        self.events: list[tuple[str, str, str, str]] = []

    def event(self, obj, type_, reason, message):
        self.events.append((obj["kind"], obj["name"], reason, message))


def watcher(prom, workloads, leading=lambda: True):
    config = IdleGpusConfig(window_s=3600, threshold=0.05, min_age_s=600)
    metrics = Metrics()
    rec = Recorder()
    return IdleWatcher(config, prom, workloads, metrics.idle, rec, may_act=leading, clock=lambda: NOW), metrics, rec


def gauge(metrics: Metrics, metric: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(metric, labels)


def test_gauges_and_one_event_per_change():
    prom = FakeProm()
    pods = [pod("web-1", owner=("ReplicaSet", "web-5d8")), pod("train-x", owner=("Job", "train"), gpus=4)]
    owners = {("ReplicaSet", "ml", "web-5d8"): controlled_by("Deployment", "web"), ("Job", "ml", "train"): {}}
    prom.util = {("ml", "web-1"): 0.8, ("ml", "train-x"): 0.01}
    w, metrics, rec = watcher(prom, FakeWorkloads(pods, owners))
    w.check()
    train = {"namespace": "ml", "kind": "Job", "name": "train"}
    assert gauge(metrics, "gpuaas_autoscaler_idle_gpus", **train) == 4
    assert gauge(metrics, "gpuaas_autoscaler_idle_gpu_hours", **train) == 4.0  # 4 GPUs x the 1 h window
    assert gauge(metrics, "gpuaas_autoscaler_idle_gpus", namespace="ml", kind="Deployment", name="web") is None
    assert [(k, n, r) for k, n, r, _ in rec.events] == [("Job", "train", IDLE_REASON)]
    assert "holds 4 GPU(s) and used 1.0% of them over the last 1h (threshold 5%): 4.00 GPU-hours" in rec.events[0][3]
    w.check()  # unchanged: no second event
    assert len(rec.events) == 1
    prom.util[("ml", "train-x")] = 0.6
    w.check()
    assert rec.events[-1][:3] == ("Job", "train", BUSY_REASON)
    assert gauge(metrics, "gpuaas_autoscaler_idle_gpus", **train) is None
    assert gauge(metrics, "gpuaas_autoscaler_idle_checks_total", result="ok") == 3


def test_a_failed_look_keeps_the_gauges_and_a_standby_exports_nothing():
    prom = FakeProm()
    prom.util = {("ml", "nb"): 0.0}
    leading = [True]
    w, metrics, rec = watcher(prom, FakeWorkloads([pod("nb", gpus=2)], {}), leading=lambda: leading[0])
    w.check()
    labels = {"namespace": "ml", "kind": "Pod", "name": "nb"}
    assert gauge(metrics, "gpuaas_autoscaler_idle_gpus", **labels) == 2
    assert [e[2] for e in rec.events] == [IDLE_REASON]  # a bare pod: the event goes to the pod
    prom.fail = "Prometheus at http://p did not answer within 5s"
    assert w.check() is None and w.error == prom.fail
    assert gauge(metrics, "gpuaas_autoscaler_idle_gpus", **labels) == 2
    assert gauge(metrics, "gpuaas_autoscaler_idle_checks_total", result="error") == 1
    leading[0] = False
    w.check()
    assert gauge(metrics, "gpuaas_autoscaler_idle_gpus", **labels) is None and w.idle == {}


def test_queries_use_the_window_and_refuse_series_without_pod_labels():
    prom = FakeProm()
    config = IdleGpusConfig(window_s=1800)
    read_utilization(prom, config)
    assert prom.queries == [
        'avg by (namespace, pod) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{pod!=""}[1800s]))',
        'avg by (namespace, pod) (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod!=""}[1800s]))']

    class Unlabelled(FakeProm):
        def query(self, promql):
            return [Sample({}, 3.0)]

    with pytest.raises(MetricsError, match="without namespace and pod labels"):
        read_utilization(Unlabelled(), config)


def test_config_refuses_unknown_queries_and_both_switched_off():
    from runtime.config import ConfigError

    with pytest.raises(ConfigError, match="unknown query sm_active"):
        parse(IdleGpusConfig, {"queries": {"sm_active": "x"}})
    with pytest.raises(ConfigError, match="leaves nothing to measure"):
        parse(IdleGpusConfig, {"queries": {"gpu_util": "", "engine_active": ""}})
    with pytest.raises(ConfigError, match="unknown placeholder pods"):
        parse(IdleGpusConfig, {"queries": {"gpu_util": "x{pods}"}})
    with pytest.raises(ConfigError, match="threshold"):
        parse(IdleGpusConfig, {"threshold": 5})

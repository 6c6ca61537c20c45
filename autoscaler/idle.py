"""Idle GPUs, the shell around `scoring.idle.find_idle`: dcgm-exporter's utilization from Prometheus, the pods holding
GPUs and their owners from Kubernetes; the report as gauges and as events on the workloads.

- `read_utilization(prom, config)`: per (namespace, pod), the use over the window (autoscaler/prom.py's errors);
- `KubeWorkloads.read()`: every pod, and the ReplicaSets and Jobs that own them (to name their Deployment or CronJob);
- `IdleWatcher.check(now)`: one look, then the gauges set and an event on each workload that became idle or stopped
  being idle (only on a change, only while leading: runtime/events.py). `gpuaas report idle` calls `measure` only.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from runtime.events import EventRecorder
from scoring.idle import IdleReport, Workload, find_idle, owner_lookups, pod_gpus, pod_utilization

from .config import IdleGpusConfig
from .prom import MetricsError

log = logging.getLogger("gpuaas.autoscaler.idle")

IDLE_REASON = "IdleGPUs"
BUSY_REASON = "GPUsInUse"


def read_utilization(prom: Any, config: IdleGpusConfig) -> dict[tuple[str, str], float]:
    """Per (namespace, pod) the larger of the two queries' values (scoring.idle.pod_utilization). A query Prometheus
    answers with nothing is no data; a failing one raises MetricsError."""
    found: dict[str, dict[tuple[str, str], float]] = {}
    for name in ("gpu_util", "engine_active"):
        q = config.query(name)
        values: dict[tuple[str, str], float] = {}
        if q is not None:
            for s in prom.query(q):
                ns, pod = s.labels.get("namespace"), s.labels.get("pod")
                if not ns or not pod:
                    raise MetricsError(f"{q!r} returned a series without namespace and pod labels (aggregate it "
                                       "by namespace, pod)")
                values[(ns, pod)] = s.value
        found[name] = values
    return pod_utilization(found["gpu_util"], found["engine_active"])


class KubeWorkloads:
    """Reads pods (all namespaces, or one) and the ReplicaSets and Jobs that own pods holding GPUs."""

    def __init__(self, api: Any, *, namespace: str | None = None, request_timeout: float | None = None):
        from kubernetes import client

        self.core, self.apps, self.batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
        self.namespace = namespace
        self.timeout = request_timeout

    def read(self) -> tuple[list[dict], dict[tuple[str, str, str], Mapping[str, Any] | None]]:
        from kubernetes.client.rest import ApiException

        kw = {"_request_timeout": self.timeout, "field_selector": "status.phase=Running"}
        listed = (self.core.list_namespaced_pod(self.namespace, **kw) if self.namespace
                  else self.core.list_pod_for_all_namespaces(**kw))
        pods = [self.core.api_client.sanitize_for_serialization(p) for p in listed.items]
        owners: dict[tuple[str, str, str], Mapping[str, Any] | None] = {}
        for kind, ns, name in owner_lookups(p for p in pods if pod_gpus(p) > 0):
            read = self.apps.read_namespaced_replica_set if kind == "ReplicaSet" else self.batch.read_namespaced_job
            try:
                obj = read(name, ns, _request_timeout=self.timeout)
                owners[(kind, ns, name)] = self.core.api_client.sanitize_for_serialization(obj.metadata)
            except ApiException as exc:
                if exc.status not in (403, 404):
                    raise
                owners[(kind, ns, name)] = None  # gone, or not ours to read: the ReplicaSet or Job is the workload
        return pods, owners


def measure(prom: Any, workloads: KubeWorkloads, config: IdleGpusConfig, now: float) -> IdleReport:
    """One look: Prometheus, then Kubernetes, then the pure decision."""
    utilization = read_utilization(prom, config)
    pods, owners = workloads.read()
    return find_idle(pods, owners, utilization, now=now, threshold=config.threshold, window_s=config.window_s,
                     min_age_s=config.min_age_s)


class IdleMetrics:
    def __init__(self, registry: CollectorRegistry):
        labels = ["namespace", "kind", "name"]
        self.gpus = Gauge("gpuaas_autoscaler_idle_gpus", "GPUs held by a workload that used less than the threshold "
                          "of them over the window", labels, registry=registry)
        self.gpu_hours = Gauge("gpuaas_autoscaler_idle_gpu_hours", "GPU-hours an idle workload held over the window",
                               labels, registry=registry)
        self.utilization = Gauge("gpuaas_autoscaler_idle_utilization", "Use of its GPUs over the window (0..1) of a "
                                 "workload found idle", labels, registry=registry)
        self.checks = Counter("gpuaas_autoscaler_idle_checks", "Looks for idle GPUs, by result (ok, error)",
                              ["result"], registry=registry)


def describe(w: Any, config: IdleGpusConfig) -> str:
    pods = ", ".join(u.pod for u in w.pods)
    return (f"holds {w.gpus:g} GPU(s) and used {100 * w.utilization:.1f}% of them over the last "
            f"{_duration(config.window_s)} (threshold {100 * config.threshold:g}%): {w.gpu_hours:.2f} GPU-hours held "
            f"idle; pods {pods}")


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


class IdleWatcher:
    """Looks every `config.interval_s` (the caller's loop); while leading it exports the idle workloads and records an
    event when a workload becomes idle and when it is idle no more; a standby exports nothing and remembers nothing
    (a new leader announces what it finds)."""

    def __init__(self, config: IdleGpusConfig, prom: Any, workloads: KubeWorkloads, metrics: IdleMetrics,
                 recorder: EventRecorder | None, *, may_act: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.time):
        self.config, self.prom, self.workloads, self.metrics = config, prom, workloads, metrics
        self.recorder = recorder
        self.may_act = may_act
        self.clock = clock
        self.idle: dict[Workload, str] = {}  # announced idle workloads and the message
        self.last: IdleReport | None = None
        self.error: str | None = None

    def check(self) -> IdleReport | None:
        if not self.may_act():
            self._export(None)
            self.idle = {}
            return None
        try:
            report = measure(self.prom, self.workloads, self.config, self.clock())
        except Exception as exc:  # Prometheus or the API failed: keep what was exported, say why once
            self.metrics.checks.labels("error").inc()
            text = str(exc) or type(exc).__name__
            if text != self.error:
                log.warning("idle GPUs: %s", text)
            self.error = text
            return None
        self.error = None
        self.metrics.checks.labels("ok").inc()
        self.last = report
        self._export(report)
        now_idle = {w.workload: describe(w, self.config) for w in report.idle}
        if self.recorder is not None:
            for workload, message in now_idle.items():
                if workload not in self.idle:
                    self.recorder.event(workload.ref(), "Warning", IDLE_REASON, message)
            busy = {w.workload: w for w in report.workloads if not w.idle}
            for workload in self.idle.keys() - now_idle.keys():
                if workload in busy:  # gone workloads need no event
                    w = busy[workload]
                    self.recorder.event(workload.ref(), "Normal", BUSY_REASON,
                                        f"uses {100 * w.utilization:.1f}% of its {w.gpus:g} GPU(s) over the last "
                                        f"{_duration(self.config.window_s)} (threshold "
                                        f"{100 * self.config.threshold:g}%)")
        self.idle = now_idle
        return report

    def _export(self, report: IdleReport | None) -> None:
        for gauge in (self.metrics.gpus, self.metrics.gpu_hours, self.metrics.utilization):
            gauge.clear()
        for w in report.idle if report else ():
            labels = (w.workload.namespace, w.workload.kind, w.workload.name)
            self.metrics.gpus.labels(*labels).set(w.gpus)
            self.metrics.gpu_hours.labels(*labels).set(w.gpu_hours)
            self.metrics.utilization.labels(*labels).set(w.utilization if math.isfinite(w.utilization) else 0.0)

    def run(self, stop: Any) -> None:
        while not stop.is_set():
            started = time.monotonic()
            self.check()
            stop.wait(max(0.0, self.config.interval_s - (time.monotonic() - started)))

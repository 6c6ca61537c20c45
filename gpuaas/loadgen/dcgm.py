"""A stand-in for dcgm-exporter on the local cluster, whose KWOK nodes have no GPUs to measure: the utilization series
of every pod holding GPUs, for a real Prometheus to scrape (with honor_labels, as dcgm-exporter is scraped).

What it exports is what dcgm-exporter exports (NVIDIA/dcgm-exporter, etc/default-counters.csv and
internal/pkg/transformation/kubernetes.go): one series per GPU, labelled `gpu`, `UUID`, `device`, `modelName`,
`Hostname` and the `container`, `namespace` and `pod` the GPU is assigned to:

    DCGM_FI_DEV_GPU_UTIL            gauge, percent
    DCGM_FI_PROF_GR_ENGINE_ACTIVE   gauge, ratio 0..1

What it measures is made up, and said so: a replica the load replayer plays uses its GPU as much as it is loaded
(requests running / concurrency; 0 while it starts); any other pod reports the share in its annotation
`gpuaas.io/simulated-gpu-utilization` (0..1, the demo and the tests set it on their jobs); a pod with neither
exports nothing (no dcgm-exporter on its node), which `gpuaas report idle` lists as unmeasured.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

from scoring.idle import pod_gpus
from scoring.kubeobjects import ObjectError, assigned_devices, holds_resources

from .endpoint import MetricsEndpoint
from .replayer import Replayer

log = logging.getLogger("gpuaas.loadgen.dcgm")

UTILIZATION_ANNOTATION = "gpuaas.io/simulated-gpu-utilization"
Utilization = Callable[[Mapping[str, Any]], float | None]


def annotated_utilization(pod: Mapping[str, Any]) -> float | None:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(UTILIZATION_ANNOTATION)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        log.warning("pod %s: %s=%r is not a number", (pod.get("metadata") or {}).get("name"), UTILIZATION_ANNOTATION,
                    raw)
        return None
    return min(1.0, max(0.0, value)) if math.isfinite(value) else None


def replayer_utilization(replayers: Mapping[str, Replayer]) -> Utilization:
    """A replica's load (requests running / concurrency) where a replayer plays the pod, else the annotation."""

    def utilization(pod: Mapping[str, Any]) -> float | None:
        meta = pod.get("metadata") or {}
        for r in replayers.values():
            if r.namespace != meta.get("namespace"):
                continue
            with r.lock:
                replica = r.system.replicas.get(meta.get("name", ""))
                if replica is not None and replica.gone_at is None:
                    return replica.running / r.system.model.concurrency if replica.serving else 0.0
        return annotated_utilization(pod)

    return utilization


def render_dcgm(pods: list[Mapping[str, Any]], utilization: Utilization) -> str:
    """The exposition of the pods holding GPUs that have a utilization."""
    util_lines, engine_lines = [], []
    for pod in pods:
        if not holds_resources(pod) or pod_gpus(pod) <= 0:
            continue
        use = utilization(pod)
        if use is None:
            continue
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        node = spec.get("nodeName", "")
        try:
            devices = assigned_devices(pod)
        except ObjectError:
            devices = None
        gpus = devices or tuple(range(max(1, math.ceil(pod_gpus(pod)))))
        container = ((spec.get("containers") or [{}])[0]).get("name", "")
        for gpu in gpus:
            uuid = hashlib.sha1(f"{node}/{gpu}".encode()).hexdigest()
            labels = (f'gpu="{gpu}",UUID="GPU-{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:32]}",'
                      f'device="nvidia{gpu}",modelName="simulated",Hostname="{node}",container="{container}",'
                      f'namespace="{meta.get("namespace", "")}",pod="{meta.get("name", "")}"')
            util_lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {round(100 * use)}")
            engine_lines.append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} {use:.6f}")
    return "\n".join(["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
                      *util_lines,
                      "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.",
                      "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge", *engine_lines]) + "\n"


class DcgmExporter:
    """Lists the running pods every `poll_s` (as the admin: it plays the node's agent) and serves their series on
    127.0.0.1:`port`/metrics, each value read at the scrape."""

    def __init__(self, api: Any, *, utilization: Utilization = annotated_utilization, port: int = 0,
                 poll_s: float = 1.0):
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.utilization = utilization
        self.poll_s = poll_s
        self.pods: list[Mapping[str, Any]] = []
        self.stop_event = threading.Event()
        self.endpoint = MetricsEndpoint(lambda: render_dcgm(self.pods, self.utilization), name="dcgm", port=port)

    @property
    def port(self) -> int:
        return self.endpoint.port

    def refresh(self) -> None:
        # The JSON as it comes: deserializing every pod into the client's models and back costs the demo's process,
        # which also plays the replicas, more than the rest of its sampling.
        resp = self.core.list_pod_for_all_namespaces(field_selector="status.phase=Running", _request_timeout=10,
                                                     _preload_content=False)
        self.pods = json.loads(resp.data)["items"]

    def _poll(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.refresh()
            except Exception as exc:  # the API may blip; keep the last list
                log.warning("dcgm: %s", exc)
            self.stop_event.wait(self.poll_s)

    def start(self) -> DcgmExporter:
        self.refresh()
        self.endpoint.start(self._poll)
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.endpoint.stop()

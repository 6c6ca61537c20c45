"""One demo cluster with the platform on it, for one scheduler:

- the local control plane with the pool spec's nodes (gpuaas/cluster/local.py); for scheduler "gpuaas" kube-scheduler
  calls the extender, for "default" it runs its own scoring only;
- the extender, the replica autoscaler and the nodescaler as processes, each with a token of the ServiceAccount its
  deploy/ manifest grants (never cluster admin);
- Prometheus scraping the load replayers, one per inference service, which play the inference servers on the pods of
  its Deployment and replay the trace (in this process, so the sampler reads each request's wait);
- the fake node agent (the device plugin and the MIG manager KWOK nodes lack; in this process, as the admin);
- a stand-in for dcgm-exporter (gpuaas/loadgen/dcgm.py, in this process): the GPU use of every pod holding GPUs, which
  the autoscaler's idle-GPU look reads from Prometheus; the run ends with that look's report (`idle`);
- for scheduler "gpuaas", the gang controller with its admission webhook (`gpuaas gangs`, registered with the
  apiserver): gangs are submitted as a user writes them and placed whole; a default-scoring cluster places the same
  pods one by one;
- the driver: submits the timeline's objects when they are due.

`up()` starts everything but the clock (the components' processes are spawned, `wait_ready()` waits for them; call
both from the thread that outlives them), `start(t0)` starts the trace and the timeline, `sample()` reads one sample,
`finish()` stops what acts on the cluster, waits for it to settle and reads the final state, `down()` stops the rest.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from autoscaler.config import AutoscalerConfig, IdleGpusConfig, Target
from autoscaler.controller import gather_signals
from autoscaler.idle import KubeWorkloads, measure
from autoscaler.prom import Prometheus
from extender.schedconfig import extender_entries, gpuaas_profile
from nodescaler.config import NodeGroupConfig
from runtime.pools import PoolSpec
from scoring.fragmentation import Workload
from scoring.kubeobjects import holds_resources

from ..cluster.components import (
    REPO,
    ComponentProcess,
    autoscaler_process,
    extender_process,
    gangs_process,
    nodescaler_process,
    scheduler_extender_tls,
)
from ..cluster.local import LocalCluster
from ..cluster.migmanager import FakeNodeAgent
from ..cluster.process import free_port
from ..cluster.prometheus import PrometheusServer
from ..cluster.webhooks import gangs_webhook_settings, register_gangs_webhook, unregister_gangs_webhook
from ..loadgen.dcgm import DcgmExporter, replayer_utilization
from ..loadgen.replayer import Replayer, ReplicaTimes
from ..loadgen.trace import Arrival
from ..report.idle import section as idle_section
from . import agreement, sampling
from .timeline import (
    INFERENCE,
    INFERENCE_NS,
    NAMESPACES,
    SLO_QUEUE_WAIT_S,
    InferenceService,
    Submission,
    autoscaler_timing,
    scrape_interval_s,
    service_arrivals,
    service_model,
)

log = logging.getLogger("gpuaas.demo")
DEPLOY = REPO / "deploy"
SYSTEM_NS = "gpuaas-system"


@dataclass
class RunSettings:
    duration_s: float
    speed: float
    trace: list[Arrival]
    timeline: list[Submission]
    workload: Workload  # what fragmentation is measured against
    services: tuple[InferenceService, ...] = INFERENCE
    sample_s: float = 2.0


def nodescaler_config(pools: PoolSpec, duration_s: float) -> dict[str, Any] | None:
    """The nodescaler's config for the demo: the pool spec's node groups, scale-in after a tenth of the run idle
    (at least 10 s; the shipped default is 10 minutes). None when the spec has no node group."""
    groups = [NodeGroupConfig.from_pool(p).model_dump() for p in pools.pools if p.autoscale is not None]
    if not groups:
        return None
    idle = max(10.0, round(duration_s / 10))
    return {"interval_s": 2, "groups": groups,
            "scale_out": {"planner_time_limit_s": 0.5},
            "scale_in": {"unneeded_s": idle, "delay_after_add_s": idle, "max_drain_s": 60, "eviction_retry_s": 1},
            "leader_election": {"namespace": SYSTEM_NS, "name": "gpuaas-nodescaler"}}


def idle_gpus_config(duration_s: float, speed: float) -> dict[str, Any]:
    """The idle-GPU look in the demo: over the last fifth of the run (at least 10 s; the shipped window is an hour),
    pods judged after half of that, every minute of trace time (at least every second)."""
    window = max(10.0, round(duration_s / 5))
    return {"interval_s": max(1.0, 60.0 / speed), "window_s": window, "min_age_s": window / 2}


def autoscaler_config(prometheus_url: str, speed: float, services=INFERENCE, *,
                      duration_s: float = 300.0) -> dict[str, Any]:
    timing = autoscaler_timing(speed)
    return {"prometheus": {"url": prometheus_url, "timeout_s": 2}, "interval_s": timing["interval_s"],
            "idle_gpus": idle_gpus_config(duration_s, speed),
            "targets": [{"deployment": s.name, "namespace": INFERENCE_NS, "min_replicas": s.min_replicas,
                         "max_replicas": s.max_replicas, "cold_start_s": timing["cold_start_s"],
                         "default_service_time_s": 1.0 / speed, "windows": timing["windows"]} for s in services]}


@dataclass
class _ServingCursor:
    """Where the previous sample of one service left off, on the replayer's clock."""
    t: float = 0.0
    arrived: int = 0


@dataclass
class Stack:
    scheduler: str  # "gpuaas" | "default"
    name: str
    workdir: Path
    pools: PoolSpec
    settings: RunSettings
    owned: bool = True
    events: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        gpuaas = self.scheduler == "gpuaas"
        self.extender_port = free_port()
        self.cluster = LocalCluster(
            self.workdir, name=self.name, owned=self.owned,
            scheduler_profiles=[gpuaas_profile("default-scheduler")] if gpuaas else None)
        if gpuaas:  # over mTLS, as deployed: kube-scheduler presents its client certificate from the cluster's PKI
            tls = scheduler_extender_tls(self.cluster.control_plane.pki)
            self.cluster.control_plane.extenders = extender_entries(
                f"https://127.0.0.1:{self.extender_port}", ca_file=tls["ca_file"], cert_file=tls["cert_file"],
                key_file=tls["key_file"])
        self.components: list[ComponentProcess] = []
        self.extender: ComponentProcess | None = None
        self.prometheus: PrometheusServer | None = None
        self.replayers: dict[str, Replayer] = {}
        self.agent: FakeNodeAgent | None = None
        self.dcgm: DcgmExporter | None = None
        self.idle: dict[str, Any] | None = None  # the idle-GPU report at the end of the run (run record `idle`)
        self.initial_replicas: dict[str, int] = {}
        self.served: dict[str, tuple[int, int]] = {}  # per service: (requests within the SLO, requests counted)
        # per service, at each sample: (t, GPUs its pods hold, whole GPUs free in the cluster)
        self.gpus_seen: dict[str, list[tuple[float, int, int]]] = {}
        self.replica_times: dict[str, list[ReplicaTimes]] = {}  # per service, what its replayer saw of each pod
        self.gangs: ComponentProcess | None = None
        self.webhook_port = free_port()
        self.reader: sampling.ClusterReader | None = None
        self.targets: dict[str, Target] = {}
        self.prom: Prometheus | None = None
        self.t0: float | None = None
        self.started_epoch: float | None = None
        self._cursors: dict[str, _ServingCursor] = {}
        self._seen_events: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._driver: threading.Thread | None = None
        self.submit_errors: list[str] = []

    # -- bring-up ------------------------------------------------------------------------------------------------------
    def up(self) -> dict[str, float]:
        timings = self.cluster.up(self.pools)
        api = self.cluster.api
        core = client.CoreV1Api(api)
        for ns in NAMESPACES:
            core.create_namespace({"metadata": {"name": ns}})
        self.reader = sampling.ClusterReader(api)
        s = self.settings
        # Already serving when the run starts, with what the first minute of their window needs (the simulator's warm
        # start, gpuaas/demo/agreement.py).
        self.initial_replicas = {svc.name: agreement.initial_replicas(s.trace, svc, speed=s.speed,
                                                                      duration_s=s.duration_s) for svc in s.services}
        for svc in s.services:
            client.AppsV1Api(api).create_namespaced_deployment(
                INFERENCE_NS, svc.deployment(self.initial_replicas[svc.name]), _preload_content=False)
        model = service_model(s.speed)
        for svc in s.services:
            self.replayers[svc.name] = Replayer(api, INFERENCE_NS, svc.name,
                                                service_arrivals(s.trace, svc, speed=s.speed, duration_s=s.duration_s),
                                                model=model)
        self.dcgm = DcgmExporter(api, utilization=replayer_utilization(self.replayers), poll_s=2.0)
        autoscaler_port = free_port()  # its /metrics: the idle-GPU gauges
        self.prometheus = PrometheusServer(self.workdir, targets=[f"127.0.0.1:{r.port}" for r in
                                                                  self.replayers.values()]
                                           + [f"127.0.0.1:{self.dcgm.port}", f"127.0.0.1:{autoscaler_port}"],
                                           scrape_interval=f"{round(1000 * scrape_interval_s(s.speed))}ms")
        self.prometheus.start()
        self.prom = Prometheus(self.prometheus.url, timeout_s=2)
        config = AutoscalerConfig.model_validate(autoscaler_config(self.prometheus.url, s.speed, s.services,
                                                                   duration_s=s.duration_s))
        self.idle_config: IdleGpusConfig = config.idle_gpus
        self.targets = {t.deployment: t for t in config.targets}
        accounts = {"extender": ("bases/extender", "gpuaas-extender"),
                    "nodescaler": ("bases/nodescaler", "gpuaas-nodescaler"),
                    "autoscaler": ("bases/autoscaler", "gpuaas-autoscaler"),
                    "gangs": ("bases/gangs", "gpuaas-gangs")}
        kubeconfigs = {k: self.cluster.service_account_kubeconfig(DEPLOY / path, account)
                       for k, (path, account) in accounts.items()}
        if self.scheduler == "gpuaas":
            self.extender = extender_process(self.workdir, kubeconfigs["extender"], port=self.extender_port,
                                             pki=self.cluster.control_plane.pki)
            self.components.append(self.extender)
            path = self.workdir / "gangs.yaml"
            path.write_text(yaml.safe_dump({
                "interval_s": 1, "leader_election": {"enabled": False},
                "webhook": gangs_webhook_settings(self.cluster.control_plane.pki, self.webhook_port)}))
            self.gangs = gangs_process(self.workdir, kubeconfigs["gangs"], path)
            self.components.append(self.gangs)
        ns_config = nodescaler_config(self.pools, s.duration_s)
        if ns_config is not None:
            path = self.workdir / "nodescaler.yaml"
            path.write_text(yaml.safe_dump(ns_config, sort_keys=False))
            self.components.append(nodescaler_process(self.workdir, kubeconfigs["nodescaler"], path))
        path = self.workdir / "autoscaler.yaml"
        path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        self.components.append(autoscaler_process(self.workdir, kubeconfigs["autoscaler"], path,
                                                  port=autoscaler_port))
        for c in self.components:  # from this thread, which lives as long as they should (see ComponentProcess.spawn)
            c.spawn()
        self.agent = FakeNodeAgent(api, interval=1.0).start()
        return timings

    def wait_ready(self, timeout: float = 60.0) -> None:
        """The components answer, and every inference Deployment has its pods running."""
        for c in self.components:
            c.wait_ready(timeout)
        if self.gangs is not None:  # from now on the apiserver gates every group member
            register_gangs_webhook(self.cluster.api, self.cluster.control_plane.pki, self.webhook_port)
        deadline = time.monotonic() + timeout
        while True:
            pods = self._reader().pods()
            short = [svc.name for svc in self.settings.services
                     if sum(1 for p in pods if _in_deployment(p, svc.name) and p["status"].get("phase") == "Running")
                     < self.initial_replicas[svc.name]]
            if not short:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: Deployments {', '.join(short)} not running after {timeout:.0f}s")
            time.sleep(0.2)

    # -- the run -------------------------------------------------------------------------------------------------------
    def start(self, t0: float, epoch: float) -> None:
        """Start the trace and the timeline; `t0` (monotonic) and `epoch` (wall clock) are the run's start."""
        self.t0, self.started_epoch = t0, epoch
        for r in self.replayers.values():
            r.start(warm=True)
        if self.dcgm is not None:
            self.dcgm.start()
        self._driver = threading.Thread(target=self._drive, name=f"driver-{self.scheduler}", daemon=True)
        self._driver.start()

    def elapsed(self) -> float:
        assert self.t0 is not None
        return time.monotonic() - self.t0

    # What up() and start() set, for the phases after them.
    def _reader(self) -> sampling.ClusterReader:
        assert self.reader is not None, "up() first"
        return self.reader

    def _prom(self) -> Prometheus:
        assert self.prom is not None, "up() first"
        return self.prom

    def _epoch(self) -> float:
        assert self.started_epoch is not None, "start() first"
        return self.started_epoch

    def _drive(self) -> None:
        pending = list(self.settings.timeline)
        while not self._stop.is_set():
            now = self.elapsed()
            while pending and pending[0].at_s <= now:
                sub = pending.pop(0)
                try:
                    self._submit(sub)
                except Exception as err:  # one bad object must not stop the timeline; the run reports it
                    log.exception("submitting %s", sub.name)
                    self.submit_errors.append(f"{sub.name}: {err}")
            wait = min(1.0, pending[0].at_s - self.elapsed()) if pending else 1.0
            self._stop.wait(max(0.05, wait))

    def _submit(self, sub: Submission) -> None:
        """Create the submission's pods, a gang's one after another as a Job controller would."""
        for obj in sub.objects:
            try:
                client.CoreV1Api(self.cluster.api).create_namespaced_pod(sub.namespace, obj, _preload_content=False)
            except ApiException as err:
                if err.status != 409:
                    raise

    def sample(self) -> dict[str, Any]:
        """One sample of this cluster now; also collects the autoscalers' new events."""
        t = self.elapsed()
        reader = self._reader()
        nodes, pods, deployments = reader.nodes(), reader.pods(), reader.deployments()
        serving = {}
        for name, replayer in self.replayers.items():
            serving[name] = self._serving(name, replayer, [p for p in pods if _in_deployment(p, name)])
        free = sampling.whole_gpus_free(nodes, pods)
        for name in self.replayers:
            held = sum(1 for p in pods if _in_deployment(p, name) and holds_resources(p))
            self.gpus_seen.setdefault(name, []).append((t, held, free))
        new = sampling.component_events(reader.events(), self._seen_events, self._epoch())
        with self._lock:
            self.events.extend(new)
        return sampling.compute_sample(t, nodes, pods, deployments, workload=self.settings.workload, serving=serving)

    def _serving(self, name: str, replayer: Replayer, pods: list[dict]) -> sampling.Serving:
        signals, _ = gather_signals(self._prom(), self.targets[name], sorted(p["metadata"]["name"] for p in pods))
        depth = sum(signals.queue_per_pod.values()) + signals.gateway_waiting if signals else None
        cursor = self._cursors.setdefault(name, _ServingCursor())
        with replayer.lock:
            now = replayer.now()
            system = replayer.system
            arrived = system.arrived_total()
            reading = sampling.serving_interval(system.arrival_t[:arrived], system.start_t[:arrived], cursor.t, now,
                                                arrived_before=cursor.arrived, arrived_now=arrived,
                                                speed=self.settings.speed, slo_s=SLO_QUEUE_WAIT_S, queue_depth=depth)
        cursor.t, cursor.arrived = now, arrived
        return reading

    def slo_so_far(self) -> tuple[int, int]:
        """(requests that waited at most the SLO, requests that started) over the run so far, every service."""
        met = total = 0
        for r in self.replayers.values():
            with r.lock:
                m, n = sampling.slo_counts(r.system.arrival_t, r.system.start_t, SLO_QUEUE_WAIT_S / self.settings.speed)
            met, total = met + m, total + n
        return met, total

    def dead_components(self) -> list[str]:
        return [c.name for c in self.components if c.popen is not None and not c.running()]

    # -- the end -------------------------------------------------------------------------------------------------------
    def finish(self, quiet_s: float = 20.0, timeout: float = 90.0) -> dict[str, Any]:
        """Stop the timeline, the autoscalers, the node agent and the load; wait until nothing moves for `quiet_s`
        (no pod starting or terminating, every Deployment at its count, no job due to finish); read the scheduler's
        reasons for pending pods; stop the extender; read the final state, as `kubectl` will show it afterwards."""
        self._stop.set()
        if self._driver:
            self._driver.join(10)
        self.idle = self.idle_report()
        self._unregister_webhook()
        for c in self.components:
            if c is not self.extender:
                c.stop()
        if self.agent:
            self.agent.stop()
        for name, r in self.replayers.items():
            with r.lock:
                self.served[name] = agreement.demo_slo(r.system.arrival_t, r.system.start_t, r.now(),
                                                       SLO_QUEUE_WAIT_S / self.settings.speed)
            self.replica_times[name] = r.replica_times()
            r.stop()
        if self.dcgm is not None:
            self.dcgm.stop()
        reader = self._reader()
        deadline = time.monotonic() + timeout
        while True:
            pods, deployments = reader.pods(), reader.deployments()
            moving = sampling.settled(pods, deployments, time.time(), quiet_s)
            if moving is None:
                break
            if time.monotonic() > deadline:
                log.warning("%s: not settled after %.0fs: %s", self.name, timeout, moving)
                break
            time.sleep(0.5)
        reasons = reader.scheduling_reasons(pods)
        if self.extender:
            self.extender.stop()
        nodes, pods, deployments = reader.nodes(), reader.pods(), reader.deployments()
        new = sampling.component_events(reader.events(), self._seen_events, self._epoch())
        with self._lock:
            self.events.extend(new)
            self.events.sort(key=lambda e: e["t"])
        gangs = {sub.name: len(sub.objects) for sub in self.settings.timeline if sub.kind == "gang"}
        return sampling.final_state(nodes, pods, deployments, reasons, gangs, end=time.time())

    def idle_report(self) -> dict[str, Any]:
        """The idle-GPU look the autoscaler takes, once more at the end of the run (before the load stops), as the
        run record keeps it; a failure is recorded, not raised."""
        config = self.idle_config
        try:
            report = measure(self._prom(), KubeWorkloads(self.cluster.api, request_timeout=10), config, time.time())
            return idle_section(report).model_dump(mode="json")
        except Exception as err:  # the report says why it has no answer
            log.warning("%s: idle GPUs: %s", self.name, err)
            return {"threshold": config.threshold, "window_s": config.window_s, "error": str(err) or repr(err)}

    def _unregister_webhook(self) -> None:
        """Before the gang controller stops: a registration left behind (failurePolicy Fail) would refuse every group
        member created in a cluster kept with --keep."""
        if self.gangs is not None:
            try:
                unregister_gangs_webhook(self.cluster.api)
            except Exception:  # the cluster may be gone already
                log.warning("%s: could not unregister the gangs webhook", self.name, exc_info=True)

    def down(self, keep: bool = False) -> None:
        self._stop.set()
        self._unregister_webhook()
        for c in self.components:
            c.stop()
        if self.agent:
            self.agent.stop()
        for r in self.replayers.values():
            if not r.stop_event.is_set():
                r.stop()
        if self.dcgm is not None and not self.dcgm.stop_event.is_set():
            self.dcgm.stop()
        if self.prom:
            self.prom.close()
        if self.prometheus:
            self.prometheus.stop()
        if not keep:
            self.cluster.down()


def _in_deployment(pod: dict, deployment: str) -> bool:
    return (pod["metadata"].get("labels") or {}).get("app") == deployment and \
        pod["metadata"]["namespace"] == INFERENCE_NS and not pod["metadata"].get("deletionTimestamp")

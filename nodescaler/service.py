"""`gpuaas nodescaler` as a process: informers on Nodes, Pods and PodDisruptionBudgets (and, where the cluster serves
resource.k8s.io/v1, ResourceSlices, ResourceClaims and ResourceClaimTemplates: runtime/drainformers.py) feed a live
model; a loop runs
`NodeScaler.run_once` every `interval_s`, and at once (after a 0.2 s batching pause) when a pod turns unschedulable;
a Lease elector thread decides whether this replica may act; /metrics, /healthz, /readyz on a small aiohttp app.

Everything that touches the informers' stores and the live model runs on the event loop's thread; the snapshot is
copied there and the reconcile (planning and API writes) runs in a worker thread on the copy.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from runtime.drainformers import TEMPLATE_KIND, dra_informers
from runtime.informer import Informer
from runtime.kubeclient import ApiEndpoint, api_client
from runtime.leader import component_elector
from runtime.lifecycle import serve_with_elector
from scoring.clusterview import ClusterView
from scoring.draview import CLAIM_KIND, SLICE_KIND

from .config import NodeScalerConfig
from .controller import KubeCluster, NodeScaler
from .metrics import Metrics
from .provider import GroupProviders, KwokProvider, Provider
from .snapshot import build_snapshot, pod_info

log = logging.getLogger("gpuaas.nodescaler")
BATCH_S = 0.2


class Service:
    def __init__(self, config: NodeScalerConfig, kubeconfig: str | Path | None = None, *, identity: str | None = None):
        self.config = config
        self.base_config = config  # without the groups discovered from MachineDeployments
        self._discovered_at = float("-inf")
        self._discovery_problems: set[str] = set()
        self.kubeconfig = kubeconfig
        self.api = api_client(kubeconfig)
        self.metrics = Metrics()
        self.elector, self.write_timeout = component_elector(self.api, config.leader_election, identity=identity,
                                                             kubeconfig=kubeconfig, on_change=self._leadership_changed)
        self.cluster = KubeCluster(self.api, request_timeout=self.write_timeout, may_act=self.may_write)
        self.scaler = NodeScaler(config, self._no_snapshot, self.cluster, self._providers(),
                                 metrics=self.metrics, may_act=self.may_write)
        self.view = ClusterView(config.scale_out.policy)
        self.trigger = asyncio.Event()
        self.informers: list[Informer] = []
        self.dra: dict[str, Informer] = {}  # kind -> informer of the DRA objects (none where not served)
        self.reconciles = 0
        self.first_reconcile_at: float | None = None  # wall time of the first reconcile since this replica led
        self._new_leader = False  # the trigger was set by winning the lease: reconcile without the batching pause
        self._event_loop: asyncio.AbstractEventLoop | None = None

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def may_write(self) -> bool:
        return self.elector is None or self.elector.may_write(self.write_timeout)

    def _leadership_changed(self, leader: bool) -> None:
        """From the elector's thread. A new leader reconciles at once rather than at the next interval."""
        self.metrics.leader.set(1 if leader else 0)
        self.first_reconcile_at = None
        if leader and self._event_loop is not None:
            self._new_leader = True
            self._event_loop.call_soon_threadsafe(self.trigger.set)

    def _providers(self) -> GroupProviders:
        """The providers the groups name (each group its own, else the top-level `provider`)."""
        used = {self.config.provider_of(g) for g in self.config.groups}
        providers: dict[str, Provider] = {}
        if "kwok" in used:
            providers["kwok"] = KwokProvider(self.api, request_timeout=self.write_timeout, may_act=self.may_write)
        if "karpenter" in used:
            from .karpenter import KarpenterProvider

            providers["karpenter"] = KarpenterProvider(self.api, request_timeout=self.write_timeout,
                                                       may_act=self.may_write)
        if "clusterapi" in used or self.config.clusterapi_discovery.enabled:
            from .clusterapi import ClusterAPIProvider

            providers["clusterapi"] = ClusterAPIProvider(self.api, lambda: self.config.groups,
                                                         request_timeout=self.write_timeout, may_act=self.may_write)
        return GroupProviders(providers, lambda g: self.config.provider_of(g))

    def _discover(self, now: float) -> None:
        """Node groups from opted-in MachineDeployments (clusterapi_discovery), read again every interval_s: the
        configured groups plus the discovered ones become the config of the next reconciles."""
        d = self.base_config.clusterapi_discovery
        if not d.enabled or now - self._discovered_at < d.interval_s:
            return
        from .clusterapi import discover

        groups, problems = discover(self.api, d.label, d.namespaces, request_timeout=self.write_timeout)
        self._discovered_at = now
        for p in sorted(set(problems) - self._discovery_problems):
            log.warning("not a node group: %s", p)
        self._discovery_problems = set(problems)
        config = self.base_config.with_groups(groups)
        if [g.name for g in config.groups] != [g.name for g in self.config.groups]:
            log.info("node groups: %s", ", ".join(g.name for g in config.groups))
        self.config = self.scaler.config = config

    @staticmethod
    def _no_snapshot(now: float):
        raise RuntimeError("the service passes a snapshot to run_once")

    # -- informers ---------------------------------------------------------------------------------------------------
    def _on_change(self, kind: str, old, new) -> None:
        try:
            self._apply_change(kind, old, new)
        except Exception:  # one unreadable object must not make the informer relist everything
            log.exception("ignoring a %s change that could not be applied", kind)
            # Seen: a pod bound to a node whose GPU-ready update has not arrived yet makes the extender's view fail
            # to place it (scoring.policies.topology_gpus returns None). Rebuilding the model at the next snapshot
            # re-places every pod on the nodes as they are then.
            self.view._dirty = True

    def _apply_change(self, kind: str, old, new) -> None:
        self.view.on_change(kind, old, new)
        if kind == "Pod" and new is not None and not (new.get("spec") or {}).get("nodeName"):
            claims, templates = self._store(CLAIM_KIND), self._store(TEMPLATE_KIND)
            info = pod_info(new, claims, templates)
            if info.unschedulable and info.gpu and not (old and pod_info(old, claims, templates).unschedulable):
                self.trigger.set()

    def _store(self, kind: str) -> dict:
        inf = self.dra.get(kind)
        return inf.store if inf is not None else {}

    async def _loop(self, stop: asyncio.Event) -> None:
        nodes, pods, pdbs = self.informers[:3]
        for inf in self.informers:
            await inf.synced.wait()
        log.info("informers synced: %d nodes, %d pods, %d PDBs", len(nodes.store), len(pods.store), len(pdbs.store))
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.trigger.wait(), timeout=self.config.interval_s)
                if not self._new_leader:
                    await asyncio.sleep(BATCH_S)  # let the rest of a burst arrive
            except TimeoutError:
                pass
            self._new_leader = False
            self.trigger.clear()
            if not self.is_leader():
                continue
            ready = Informer.readiness(self.informers, self.config.max_watch_stale_s)
            if not ready:  # a stale model would grow groups for pods already placed, or miss new ones: wait
                self.metrics.errors.labels("stale_model").inc()
                log.warning("not reconciling: %s", ready.text)
                continue
            now = time.time()
            try:
                await asyncio.to_thread(self._discover, now)
            except Exception as err:  # keep the groups read before; the next reconcile reads again
                self.metrics.errors.labels("discovery").inc()
                log.warning("discovering node groups: %s", err)
            try:
                snap = build_snapshot(nodes.store.values(), pods.store.values(), pdbs.store.values(), now,
                                      view=self.view, slices=self._store(SLICE_KIND).values(),
                                      claims=self._store(CLAIM_KIND).values(),
                                      templates=self._store(TEMPLATE_KIND).values())
                report = await asyncio.to_thread(self.scaler.run_once, now, snap)
            except Exception:
                log.exception("reconcile failed")
                continue
            self.reconciles += 1
            if self.first_reconcile_at is None:
                self.first_reconcile_at = now
            if report.grows or report.mig or report.drains_started or report.deleted or report.rolled_back \
                    or report.evicted:
                log.info("reconcile", extra={k: v for k, v in vars(report).items() if v})

    # -- http --------------------------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        async def metrics(_):
            return web.Response(body=generate_latest(self.metrics.registry),
                                headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(_):
            return web.Response(text="ok")

        async def readyz(_):
            ready = Informer.readiness(self.informers, self.config.max_watch_stale_s)
            return web.Response(text=ready.text, status=200 if ready else 503)

        async def leader(_):
            return web.json_response({"identity": self.elector.identity if self.elector else None,
                                      "leader": self.is_leader(), "reconciles": self.reconciles,
                                      "acquired_at": self.elector.acquired_at if self.elector else None,
                                      "first_reconcile_at": self.first_reconcile_at})

        app = web.Application()
        app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz), web.get("/readyz", readyz),
                        web.get("/leader", leader)])
        return app

    async def run(self, host: str, port: int, stop: asyncio.Event) -> None:
        endpoint = ApiEndpoint.from_kubeconfig(self.kubeconfig)
        self._event_loop = asyncio.get_running_loop()
        stop_thread = threading.Event()
        runner = await serve_with_elector(self.app(), host, port, self.elector, stop_thread)
        async with endpoint.session() as session:
            self.informers = [
                Informer(endpoint, "/api/v1/nodes", kind="Node", on_change=self._on_change),
                Informer(endpoint, "/api/v1/pods", kind="Pod", on_change=self._on_change),
                Informer(endpoint, "/apis/policy/v1/poddisruptionbudgets", kind="PodDisruptionBudget"),
            ]
            self.dra = await dra_informers(session, endpoint, self._on_change, templates=True)
            self.informers += list(self.dra.values())
            tasks = [asyncio.create_task(i.run(session)) for i in self.informers]
            loop_task = asyncio.create_task(self._loop(stop))
            await stop.wait()
            # No write may start or be in flight once the lease is released: stop the reconcile and wait for it
            # (cancelling the task would not stop its worker thread), and for the events already submitted.
            await asyncio.to_thread(self.scaler.shutdown)
            await asyncio.to_thread(self.cluster.close)
            loop_task.cancel()
            for t in tasks:
                t.cancel()
            await asyncio.gather(loop_task, *tasks, return_exceptions=True)
        stop_thread.set()
        if self.elector is not None:
            await asyncio.to_thread(self.elector.release)
        await runner.cleanup()

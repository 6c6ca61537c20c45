"""`gpuaas gangs` as a process: informers on Nodes and Pods feed the live model (scoring.clusterview, as in the
extender), and, where the cluster serves resource.k8s.io/v1, informers on ResourceSlices and ResourceClaims feed the
DRA nodes and the claims gpuaas allocates (gangs.dra); a loop plans the waiting gangs every `interval_s`, and at once
(after a 0.2 s batching pause) when a group member or a pod with claims arrives or loses a gate, or a claim changes; a
Lease elector decides whether this replica may write; /metrics, /healthz, /readyz, /explain, /gangs and /claims (the
DRA allocations this replica wrote) on a small aiohttp app; the admission webhook on its own HTTPS site when configured.

The informers' stores and the model belong to the event loop's thread; the reconcile runs in a worker thread on
copies of them.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from runtime.drainformers import dra_informers
from runtime.informer import Informer
from runtime.kubeclient import ApiEndpoint, api_client
from runtime.leader import component_elector
from runtime.lifecycle import serve_with_elector
from scoring.clusterview import ClusterView
from scoring.fragmentation import Workload
from scoring.gangs import GROUP_LABELS, NodeFacts, gates

from .config import GangsConfig
from .controller import GangController, KubePods, finished
from .dra import DraInputs, KubeClaims, wanted_pod
from .metrics import Metrics

log = logging.getLogger("gpuaas.gangs")
BATCH_S = 0.2


def _group_member(pod: dict[str, Any] | None) -> bool:
    labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
    return any(k in labels for k in GROUP_LABELS)


def _allocation_moved(old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """A claim arrived or went, or its allocation changed: worth planning again at once."""
    if old is None or new is None:
        return True
    return (old.get("status") or {}).get("allocation") != (new.get("status") or {}).get("allocation")


def _worth_planning(kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    if kind == "Pod":
        return (_group_member(new) or _group_member(old) or wanted_pod(new) or wanted_pod(old)) and _moved(old, new)
    if kind == "ResourceClaim":
        return _allocation_moved(old, new)
    return kind == "ResourceSlice" and (old is None or new is None)


def _moved(old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """A member arrived or went, or its gates or its binding changed: worth planning again at once."""
    if old is None or new is None:
        return True
    bound = [(o.get("spec") or {}).get("nodeName") for o in (old, new)]
    return gates(old) != gates(new) or bound[0] != bound[1]


class Service:
    def __init__(self, config: GangsConfig, kubeconfig: str | Path | None = None, *, identity: str | None = None):
        self.config = config
        self.kubeconfig = kubeconfig
        self.api = api_client(kubeconfig)
        self.metrics = Metrics()
        self.elector, self.write_timeout = component_elector(self.api, config.leader_election, identity=identity,
                                                             kubeconfig=kubeconfig, on_change=self._leadership_changed)
        self.pods = KubePods(self.api, request_timeout=self.write_timeout, may_act=self.may_write)
        self.claims = KubeClaims(self.api, request_timeout=self.write_timeout, may_act=self.may_write)
        self.controller = GangController(config.settings(), self.pods, self.metrics, claims=self.claims)
        self.view = ClusterView(config.policy)
        self.trigger = asyncio.Event()
        self.informers: list[Informer] = []
        self.dra_informers: dict[str, Informer] = {}  # kind -> informer, where the cluster serves resource.k8s.io/v1
        self.reconciles = 0
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._reload: asyncio.Task[None] | None = None

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def may_write(self) -> bool:
        return self.elector is None or self.elector.may_write(self.write_timeout)

    def _leadership_changed(self, leader: bool) -> None:
        """From the elector's thread: a new leader plans at once."""
        self.metrics.leader.set(1 if leader else 0)
        if leader and self._event_loop is not None:
            self._event_loop.call_soon_threadsafe(self.trigger.set)

    def _on_change(self, kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        try:
            self.view.on_change(kind, old, new)
        except Exception:  # one unreadable object must not make the informer relist everything
            log.exception("ignoring a %s change that could not be applied", kind)
            self.view._dirty = True
        if _worth_planning(kind, old, new):
            self.trigger.set()

    def _inputs(self) -> tuple[Any, list[NodeFacts], list[dict[str, Any]], Any, DraInputs | None]:
        """Copies of what a reconcile decides on, taken on the event loop's thread."""
        state, _ = self.view.snapshot()
        facts = [NodeFacts.of(self.view.nodes[name]) for name in state.names]
        pods = [p for p in self.informers[1].store.values() if _group_member(p) or wanted_pod(p)]
        workload = self.view.workload()
        dra = None
        if self.dra_informers:
            dra = DraInputs(list(self.dra_informers["ResourceSlice"].store.values()),
                            list(self.dra_informers["ResourceClaim"].store.values()), dict(self.view.nodes),
                            frozenset(p["metadata"].get("uid", "") for p in self.informers[1].store.values()
                                      if not finished(p)), self.view.dra.parsed())
            workload = self._with_dra_shapes(workload)
        return state.copy(), facts, pods, workload, dra

    def _with_dra_shapes(self, workload: Workload) -> Workload:
        """The learned workload with the GPUs DRA pods ask through their claims (the view reads pods alone, and sees
        them as CPU-only pods)."""
        shapes = self.controller.dra_shapes
        if not shapes or self.view.fixed_workload is not None:
            return workload
        return Workload.typical([shapes.get(k, d) for k, d in self.view.recent.items()])

    async def _loop(self, stop: asyncio.Event) -> None:
        for inf in self.informers:
            await inf.synced.wait()
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.trigger.wait(), timeout=self.config.interval_s)
                await asyncio.sleep(BATCH_S)  # let the rest of a gang arrive
            except TimeoutError:
                pass
            self.trigger.clear()
            if not self.is_leader():
                continue
            ready = Informer.readiness(self.informers, self.config.max_watch_stale_s)
            if not ready:  # a stale model could release a gang onto GPUs already taken
                log.warning("not planning: %s", ready.text)
                continue
            started = time.perf_counter()
            try:
                state, facts, pods, workload, dra = self._inputs()
                report = await asyncio.to_thread(self.controller.reconcile, state, facts, pods, time.time(), workload,
                                                 dra)
            except Exception:
                log.exception("reconcile failed")
                continue
            self.metrics.reconcile.observe(time.perf_counter() - started)
            self.reconciles += 1
            if report.released or report.reset or report.deallocated:
                log.info("gangs", extra={"released": report.released, "reset": report.reset,
                                         "waiting": len(report.waiting), "claims_allocated": report.allocated,
                                         "claims_deallocated": report.deallocated})

    def app(self) -> web.Application:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.metrics.registry),
                                headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            ready = Informer.readiness(self.informers, self.config.max_watch_stale_s)
            return web.Response(text=ready.text, status=200 if ready else 503)

        async def webhook_ready(_: web.Request) -> web.Response:
            # What the webhook Service's endpoints follow: the webhook needs no watch, and with failurePolicy Fail a
            # replica taken out for a stale watch would refuse the creation of every group member; a stale
            # controller stops releasing gangs by itself (the loop checks the watches).
            return web.Response(text="ok")

        async def explain(request: web.Request) -> web.Response:
            key = request.query.get("pod", "")
            if key.count("/") != 1 or not all(key.split("/")):
                return web.json_response({"error": "give the pod as ?pod=namespace/name"}, status=400)
            return web.json_response(self.controller.explain(key))

        async def gangs(_: web.Request) -> web.Response:
            return web.json_response({g: {"action": d.action, "message": d.message, "pins": dict(d.pins)}
                                      for g, d in self.controller.last.items()})

        async def claims(_: web.Request) -> web.Response:
            return web.json_response(dict(self.controller.written))  # a copy: the reconcile thread adds to it

        app = web.Application()
        app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz), web.get("/readyz", readyz),
                        web.get("/webhook-ready", webhook_ready), web.get("/explain", explain),
                        web.get("/gangs", gangs), web.get("/claims", claims)])
        return app

    async def run(self, host: str, port: int, stop: asyncio.Event) -> None:
        endpoint = ApiEndpoint.from_kubeconfig(self.kubeconfig)
        self._event_loop = asyncio.get_running_loop()
        stop_thread = threading.Event()
        runner = await serve_with_elector(self.app(), host, port, self.elector, stop_thread)
        webhook_runner = await self._start_webhook(host)
        async with endpoint.session() as session:
            self.informers = [
                Informer(endpoint, "/api/v1/nodes", kind="Node", on_change=self._on_change),
                Informer(endpoint, "/api/v1/pods", kind="Pod", on_change=self._on_change),
            ]
            self.dra_informers = await dra_informers(session, endpoint, self._on_change)
            self.informers += list(self.dra_informers.values())
            tasks = [asyncio.create_task(i.run(session)) for i in self.informers]
            loop_task = asyncio.create_task(self._loop(stop))
            await stop.wait()
            loop_task.cancel()
            for t in tasks:
                t.cancel()
            await asyncio.gather(loop_task, *tasks, return_exceptions=True)
        await asyncio.to_thread(self.pods.close)
        stop_thread.set()
        if self.elector is not None:
            await asyncio.to_thread(self.elector.release)
        if webhook_runner is not None:
            if self._reload is not None:
                self._reload.cancel()
            await webhook_runner.cleanup()
        await runner.cleanup()

    async def _start_webhook(self, host: str) -> web.AppRunner | None:
        if self.config.webhook is None:
            return None
        from .webhook import reload_certificate, ssl_context, webhook_app

        runner = web.AppRunner(webhook_app(self.metrics.registry))
        await runner.setup()
        ctx = ssl_context(self.config.webhook)
        await web.TCPSite(runner, host, self.config.webhook.port, ssl_context=ctx).start()
        # A renewed certificate (cert-manager, a rotated Secret) is served without a restart.
        self._reload = asyncio.create_task(reload_certificate(ctx, self.config.webhook))
        return runner

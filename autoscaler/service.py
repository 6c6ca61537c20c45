"""`gpuaas autoscaler` as a process: a Lease elector thread (runtime/leader.py) decides which replica writes; every
replica runs the sync loop (a standby decides and writes nothing, so that a new leader starts with the memory of the
recent load); a new leader syncs at once. The leader also looks for idle GPUs (autoscaler/idle.py) in a thread of its
own. /metrics, /healthz, /readyz and /leader on a small HTTP server.
"""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kubernetes import client
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from runtime.events import EventRecorder
from runtime.leader import LeaderElector, write_timeout

from .config import AutoscalerConfig
from .controller import COMPONENT, Controller, build, kube_api
from .idle import IdleWatcher, KubeWorkloads
from .metrics import Metrics
from .prom import Prometheus

log = logging.getLogger("gpuaas.autoscaler")


class AutoscalerService:
    def __init__(self, config: AutoscalerConfig, kubeconfig: str | None = None, *, identity: str | None = None):
        api = kube_api(kubeconfig)
        self.elector = LeaderElector.from_config(api, config.leader_election, identity=identity, kubeconfig=kubeconfig,
                                                 on_change=self._leadership_changed) \
            if config.leader_election.enabled else None
        instance = self.elector.identity if self.elector else (identity or COMPONENT)
        # Every write is bounded by a request timeout and starts only while the lease is ours for at least that long,
        # as the node scaler's: a write of a replica that stopped leading cannot land under its successor.
        le = config.leader_election
        self.write_timeout = self.elector.write_timeout if self.elector else write_timeout(le.renew_deadline_s,
                                                                                             le.retry_period_s)
        self.controller: Controller = build(config, api=api, instance=instance, may_act=self.may_write,
                                            request_timeout=self.write_timeout)
        self.wake = threading.Event()
        self.metrics = Metrics()
        self.idle: IdleWatcher | None = None
        if config.idle_gpus.enabled:
            recorder = EventRecorder(client.CoreV1Api(api), COMPONENT, request_timeout=self.write_timeout,
                                     may_act=self.may_write, repeat_s=config.idle_gpus.interval_s)
            self.idle = IdleWatcher(config.idle_gpus,
                                    Prometheus(config.prometheus.url, timeout_s=config.prometheus.timeout_s),
                                    KubeWorkloads(api, request_timeout=self.write_timeout),
                                    self.metrics.idle, recorder, may_act=self.is_leader)

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def may_write(self) -> bool:
        return self.elector is None or self.elector.may_write(self.write_timeout)

    def _leadership_changed(self, leader: bool) -> None:
        """From the elector's thread: a new leader syncs at once rather than at the next interval."""
        self.controller.first_acting_sync_at = None
        if leader:
            self.wake.set()

    def status(self) -> dict:
        return {"identity": self.elector.identity if self.elector else None, "leader": self.is_leader(),
                "syncs": self.controller.syncs, "syncs_as_leader": self.controller.syncs_acting,
                "acquired_at": self.elector.acquired_at if self.elector else None,
                "first_sync_at": self.controller.first_acting_sync_at}

    def http_server(self, host: str, port: int) -> ThreadingHTTPServer:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # http.server's name for the GET handler
                path = self.path.split("?")[0]
                if path == "/leader":
                    code, body, ctype = 200, json.dumps(service.status()), "application/json"
                elif path in ("/healthz", "/livez"):
                    code, body, ctype = 200, "ok", "text/plain"
                elif path == "/metrics":
                    service.metrics.leader.set(1 if service.is_leader() else 0)
                    code, body, ctype = 200, generate_latest(service.metrics.registry).decode(), CONTENT_TYPE_LATEST
                elif path == "/readyz":
                    ok = service.controller.syncs > 0
                    code, body, ctype = (200, "ok", "text/plain") if ok else (503, "no sync yet", "text/plain")
                else:
                    code, body = 404, f"{path} is not served (/metrics, /healthz, /readyz, /leader)"
                    ctype = "text/plain"
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        return server

    def run(self, stop: threading.Event, *, host: str = "0.0.0.0", port: int = 8091) -> None:
        server = self.http_server(host, port)
        threading.Thread(target=server.serve_forever, name="autoscaler-http", daemon=True).start()
        election_stop = threading.Event()
        election = None
        if self.elector is not None:
            election = threading.Thread(target=self.elector.run, args=(election_stop,), name="leader-election",
                                        daemon=True)
            election.start()
        def wake_on_stop() -> None:
            stop.wait()
            self.wake.set()

        threading.Thread(target=wake_on_stop, daemon=True).start()
        idle = None
        if self.idle is not None:
            idle = threading.Thread(target=self.idle.run, args=(stop,), name="idle-gpus", daemon=True)
            idle.start()
        try:
            self.controller.run(stop, self.wake)
        finally:
            if idle is not None:
                idle.join(timeout=10)
            if self.idle is not None and self.idle.recorder is not None:
                self.idle.recorder.close()
            election_stop.set()
            if election is not None:
                election.join(timeout=10)  # releases the lease: the other replica takes over at once
            server.shutdown()

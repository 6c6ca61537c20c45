"""gpuaas's extender as `gpuaas extender` builds it (extender/server.py live_app: the informers, the model, the
service, the warm-up once the caches have synced), its verbs served by bench/bare_http.py's bare server instead of
aiohttp's: what gpuaas would gain from a leaner server, all else the same (bench/scheduler_throughput.py's
`extender_bare`, against `extender`). Each verb parses and validates the body, calls the service and encodes the
reply as extender/server.py does, and its time goes to the same latency metric (GET /metrics). Measurement only: no
limits, no TLS, no authentication, and a bad request is a 500 here, not the 4xx extender/server.py answers.
Usage: python bench/bare_extender.py --kubeconfig FILE --host 127.0.0.1 --port PORT [--policy P] (the arguments of
`gpuaas extender`; settings from GPUAAS_EXTENDER_* as well; serves until killed)"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import orjson
import uvloop
from aiohttp import web
from prometheus_client import generate_latest

from bench.bare_http import Routes, Unavailable, serve_app
from extender.config import ENV_PREFIX, ExtenderConfig
from extender.server import (
    METRICS,
    PRIORITY_ENCODER,
    READY,
    SERVICE,
    live_app,
    priorities_body,
    warm_up_once_synced,
)
from extender.wire import ExtenderArgs, ExtenderBindingArgs
from runtime.config import load_config
from runtime.logs import setup_logging


def bare_routes(app: web.Application) -> Routes:
    service, metrics, encoder = app[SERVICE], app[METRICS], app[PRIORITY_ENCODER]

    def filter_(body: bytes) -> bytes:
        started = time.perf_counter()
        reply = orjson.dumps(dict(service.filter(ExtenderArgs.model_validate(orjson.loads(body)))))
        metrics.latency.labels("filter").observe(time.perf_counter() - started)
        return reply

    def prioritize(body: bytes) -> bytes:
        started = time.perf_counter()
        scored = service.prioritize(ExtenderArgs.model_validate(orjson.loads(body)))
        reply = priorities_body(encoder, scored)
        metrics.latency.labels("prioritize").observe(time.perf_counter() - started)
        return reply

    async def bind(body: bytes) -> bytes:
        started = time.perf_counter()
        result = await service.bind(ExtenderBindingArgs.model_validate(orjson.loads(body)))
        metrics.latency.labels("bind").observe(time.perf_counter() - started)
        return orjson.dumps(dict(result))

    def ready(body: bytes) -> bytes:
        if not app[READY]():
            raise Unavailable("caches not synced")
        return b"ok"

    return {(b"POST", b"/filter"): filter_, (b"POST", b"/prioritize"): prioritize, (b"POST", b"/bind"): bind,
            (b"GET", b"/readyz"): ready, (b"GET", b"/metrics"): lambda body: generate_latest(metrics.registry)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--policy")
    args = parser.parse_args()
    config = load_config(ExtenderConfig, None, env_prefix=ENV_PREFIX, overrides={
        "host": args.host, "port": args.port, "policy": args.policy, "kubeconfig": args.kubeconfig})
    setup_logging(config.log_level, config.log_format)
    app = live_app(config)
    warm_up_once_synced(app)
    uvloop.run(serve_app(app, bare_routes, config.host, config.port))


if __name__ == "__main__":
    main()

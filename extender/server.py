"""The HTTP shell around ExtenderService: parse, call, serialise; every failure becomes a 4xx/5xx with a message in
one place (`errors`), and the server keeps serving.

    POST /filter /prioritize /bind     kube-scheduler's extender verbs
    GET  /healthz                      the process is alive
    GET  /readyz                       200 once the node and pod caches have synced
    GET  /metrics                      Prometheus text format
    GET  /explain?pod=NS/NAME&node=N   why node N was rejected for the pod, or how it scored

Who may call which (extender/auth.py): the verbs need kube-scheduler's client certificate; /explain and /metrics
that, or a user the apiserver allows (TokenReview + SubjectAccessReview); /healthz and /readyz anyone.
"""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from runtime.authz import ApiReviewer, AsyncReviewer
from runtime.config import describe_errors
from runtime.drainformers import dra_informers
from runtime.informer import Informer, Readiness
from runtime.kubeclient import ApiEndpoint
from scoring.clusterview import ClusterView
from scoring.kubeobjects import ObjectError
from scoring.verdicts import Priorities

from . import auth
from .binder import ApiBinder, NoBinder, pod_path
from .config import ExtenderConfig
from .metrics import Metrics
from .schedconfig import CPU_PODS_PREFIX
from .service import BadRequest, ExtenderService, QueuePlanning
from .wire import ExtenderArgs, ExtenderBindingArgs, HostPriorityEncoder

log = logging.getLogger("gpuaas.extender")

SERVICE = web.AppKey("service", ExtenderService)
CONFIG = web.AppKey("config", ExtenderConfig)
METRICS = web.AppKey("metrics", Metrics)
# Whether to answer /readyz with 200: a bool (a snapshot is always ready), or the informers' Readiness (false with
# the reasons why).
READY: web.AppKey[Callable[[], Readiness | bool]] = web.AppKey("ready")
PRIORITY_ENCODER = web.AppKey("priority_encoder", HostPriorityEncoder)


VERBS = ("filter", "prioritize", "bind", "cpu/filter", "cpu/prioritize", "healthz", "readyz", "metrics", "explain",
         "root")


class UnreadableBody(BadRequest):
    """A body that cannot be decoded: answered with 400, and the connection is closed after it."""


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def errors(request: web.Request,
                 handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    verb = request.path.strip("/") or "root"
    if verb not in VERBS:
        verb = "other"  # a metrics label: one per route, never one per path a client makes up
    metrics = request.app[METRICS]
    started = time.perf_counter()
    try:
        return await handler(request)
    except BadRequest as err:
        response = _error(err.status, str(err))
        if isinstance(err, UnreadableBody):
            response.force_close()  # ... and the connection closes after the answer: its byte stream is lost
    except ValidationError as err:
        response = _error(400, f"invalid {verb} request: {describe_errors(err)}")
    except ObjectError as err:  # a Pod or Node in the request that cannot be read; the message names the field
        response = _error(400, f"invalid {verb} request: {err}")
    except json.JSONDecodeError as err:
        response = _error(400, f"request body is not JSON: {err}")
    except TimeoutError:
        response = _error(408, "request body not received in time")
    except web.HTTPException as err:  # 404, 405, 413 from aiohttp itself
        response = _error(err.status, err.reason if err.status != 413 else
                          f"request body larger than {request.app[CONFIG].max_body_bytes} bytes")
    except Exception as err:  # a bug: answer, log it, keep serving
        log.exception("unexpected error in %s", verb)
        response = _error(500, f"internal error: {type(err).__name__}: {err}")
    finally:
        if verb in ("filter", "prioritize", "bind", "cpu/filter", "cpu/prioritize"):
            metrics.latency.labels(verb).observe(time.perf_counter() - started)
    metrics.errors.labels(verb, str(response.status)).inc()
    return response


async def _read_json(request: web.Request) -> Any:
    try:
        async with asyncio.timeout(request.app[CONFIG].read_timeout_seconds):  # (wait_for would start a task per call)
            body = await request.read()
    except web.RequestPayloadError as err:  # e.g. Content-Encoding: gzip and a body that is not gzip
        request.content.feed_eof()  # what is left of it is not read (aiohttp would log the error once more) ...
        reason = getattr(err.__cause__, "message", None) or str(err)
        raise UnreadableBody(f"request body cannot be read: {reason}") from None
    if not body:
        raise BadRequest("request body is empty")
    return orjson.loads(body)  # orjson.JSONDecodeError is a json.JSONDecodeError: same 400


def _json(model: BaseModel) -> web.Response:
    # The replies are flat (plain dicts, lists, strings): their fields go to orjson as they are, without the copy
    # model_dump makes of a FailedNodes map with thousands of entries.
    return web.Response(body=orjson.dumps(dict(model)), content_type="application/json")


async def filter_verb(request: web.Request) -> web.Response:
    args = ExtenderArgs.model_validate(await _read_json(request))
    return _json(request.app[SERVICE].filter(args))


def priorities_body(encoder: HostPriorityEncoder, scored: Priorities) -> bytes:
    """prioritize's reply body. An empty answer (a GPU pod at the CPU-pod entry) skips the encoder: its records are
    kept per node set, and an empty node set would throw them away for the next prioritize."""
    return encoder.encode(scored.names, scored.rows, scored.scores, scored.row_names) if scored.names else b"[]"


def _priorities(request: web.Request, scored: Priorities) -> web.Response:
    return web.Response(body=priorities_body(request.app[PRIORITY_ENCODER], scored), content_type="application/json")


async def prioritize_verb(request: web.Request) -> web.Response:
    args = ExtenderArgs.model_validate(await _read_json(request))
    return _priorities(request, request.app[SERVICE].prioritize(args))


async def filter_cpu_pods_verb(request: web.Request) -> web.Response:
    args = ExtenderArgs.model_validate(await _read_json(request))
    return _json(request.app[SERVICE].filter_cpu_pods(args))


async def prioritize_cpu_pods_verb(request: web.Request) -> web.Response:
    args = ExtenderArgs.model_validate(await _read_json(request))
    return _priorities(request, request.app[SERVICE].prioritize_cpu_pods(args))


async def bind_verb(request: web.Request) -> web.Response:
    args = ExtenderBindingArgs.model_validate(await _read_json(request))
    return _json(await request.app[SERVICE].bind(args))


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    ready = request.app[READY]()  # a bool, or the informers' Readiness: false with the reasons why
    if ready:
        return web.Response(text="ok")
    return web.Response(text=ready.text if isinstance(ready, Readiness) else "caches not synced", status=503)


async def metrics_endpoint(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    for kind, count in request.app[SERVICE].view.stats().items():
        metrics.cache.labels(kind).set(count)
    metrics.rebuilds.set(request.app[SERVICE].view.rebuilds)
    return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def explain_endpoint(request: web.Request) -> web.Response:
    pod, node = request.query.get("pod"), request.query.get("node")
    if not pod or not node:
        raise BadRequest("explain needs ?pod=NAMESPACE/NAME&node=NODE")
    return web.json_response(await request.app[SERVICE].explain(pod, node))


def queue_planning(config: ExtenderConfig) -> QueuePlanning:
    return QueuePlanning(config.queue_planning_min_pods, config.queue_plan_refresh_seconds,
                         config.queue_max_wait_seconds, config.queue_plan_window)


def make_app(config: ExtenderConfig, service: ExtenderService, metrics: Metrics,
             ready: Callable[[], Readiness | bool], reviewer: AsyncReviewer | None = None) -> web.Application:
    """With `config.tls`, every request but the probes is authenticated (auth.py): kube-scheduler by its client
    certificate, other users through `reviewer` (TokenReview, SubjectAccessReview; None: certificates only)."""
    middlewares: list[Middleware] = [errors]
    if config.tls is not None:
        middlewares.append(auth.middleware(auth.Callers.of(config.tls.client_names, reviewer,
                                                           config.token_review_ttl_seconds)))
    app = web.Application(middlewares=middlewares, client_max_size=config.max_body_bytes)
    app[SERVICE], app[CONFIG], app[METRICS], app[READY] = service, config, metrics, ready
    app[PRIORITY_ENCODER] = HostPriorityEncoder()
    app.router.add_post("/filter", filter_verb)
    app.router.add_post("/prioritize", prioritize_verb)
    app.router.add_post("/bind", bind_verb)
    app.router.add_post(f"{CPU_PODS_PREFIX}/filter", filter_cpu_pods_verb)
    app.router.add_post(f"{CPU_PODS_PREFIX}/prioritize", prioritize_cpu_pods_verb)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/explain", explain_endpoint)
    return app


# ---- wiring: a live cluster, or a static snapshot ------------------------------------------------------------------

def load_snapshot(path: Path) -> list[dict[str, Any]]:
    """Nodes and Pods from what `kubectl get nodes,pods -A -o yaml` (or -o json) prints: a List, or several."""
    try:
        text = path.read_bytes()
        try:  # `-o json` of a big cluster is megabytes: orjson reads 5 MB at once, PyYAML takes ~15 s
            docs = [orjson.loads(text)]
        except orjson.JSONDecodeError:
            docs = [d for d in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: cannot read snapshot: {err}") from None
    items: list[dict[str, Any]] = []
    for n, doc in enumerate(docs, 1):
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: document {n} is a {type(doc).__name__}, not a Kubernetes object or List")
        items.extend(doc.get("items") or [] if str(doc.get("kind", "")).endswith("List") else [doc])
    bad = [i for i in items if not isinstance(i, dict) or i.get("kind") not in ("Node", "Pod")]
    if bad:
        raise ValueError(f"{path}: snapshot holds {len(bad)} objects that are not Nodes or Pods")
    return items


def snapshot_app(config: ExtenderConfig, items: list[dict[str, Any]],
                 reviewer: AsyncReviewer | None = None) -> web.Application:
    """`reviewer`: who answers TokenReviews and SubjectAccessReviews for /explain and /metrics (tests); None: only
    client certificates authenticate."""
    view = ClusterView(config.policy, assume_ttl=config.assume_ttl_seconds)
    pods: dict[str, dict[str, Any]] = {}
    for kind in ("Node", "Pod"):  # nodes first, so pods land on known nodes
        for item in (i for i in items if i["kind"] == kind):
            view.on_change(kind, None, item)
            if kind == "Pod":
                pods[f"{item['metadata'].get('namespace', 'default')}/{item['metadata']['name']}"] = item

    async def lookup(namespace: str, name: str) -> dict[str, Any] | None:
        return pods.get(f"{namespace}/{name}")

    metrics = Metrics()
    service = ExtenderService(view, NoBinder(), metrics, lookup, scheduler_names=tuple(config.scheduler_names),
                              queue_planning=queue_planning(config),
                              decide_in_filter=config.decide_in_filter)
    return make_app(config, service, metrics, lambda: True, reviewer)


def live_app(config: ExtenderConfig) -> web.Application:
    view = ClusterView(config.policy, assume_ttl=config.assume_ttl_seconds)
    endpoint = ApiEndpoint.from_kubeconfig(config.kubeconfig)
    nodes = Informer(endpoint, "/api/v1/nodes", kind="Node", on_change=view.on_change,
                     resync_seconds=config.resync_seconds)
    pods = Informer(endpoint, "/api/v1/pods", kind="Pod", on_change=view.on_change,
                    resync_seconds=config.resync_seconds)
    watched = [nodes, pods]  # + ResourceSlices and ResourceClaims where the cluster serves resource.k8s.io/v1
    holder: dict[str, aiohttp.ClientSession] = {}

    async def lookup(namespace: str, name: str) -> dict[str, Any] | None:
        pod = pods.store.get(f"{namespace}/{name}")
        if pod is not None:
            return pod
        async with holder["session"].get(pod_path(namespace, name)) as resp:
            if resp.status == 404:
                return None
            resp.raise_for_status()
            found: dict[str, Any] = await resp.json()
            return found

    class LazyBinder:  # the session exists only once the app runs
        async def bind(self, *args: Any) -> None:
            await ApiBinder(holder["session"]).bind(*args)

    metrics = Metrics()
    reviewer = ApiReviewer(lambda: holder["session"])
    service = ExtenderService(view, LazyBinder(), metrics, lookup, scheduler_names=tuple(config.scheduler_names),
                              queue_planning=queue_planning(config),
                              decide_in_filter=config.decide_in_filter)
    app = make_app(config, service, metrics,
                   lambda: Informer.readiness(watched, config.max_watch_stale_seconds), reviewer)

    async def informers(app: web.Application) -> AsyncIterator[None]:
        async with endpoint.session() as session:
            holder["session"] = session
            watched.extend((await dra_informers(session, endpoint, view.on_change, config.resync_seconds)).values())
            tasks = [asyncio.create_task(inf.run(session)) for inf in watched]
            yield
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    app.cleanup_ctx.append(informers)
    return app


def warm_up_once_synced(app: web.Application) -> None:
    """Once the caches have synced: build the model (else the first pod after a start or restart waits for it:
    0.3 s at 5,000 nodes), then put everything alive, thousands of Node and Pod objects, out of the cyclic
    collector's reach (gc.freeze): a full collection then walks what changed since, not the whole cache (~60 ms, a
    stall in kube-scheduler's cycle). For a process that serves, not for tests that build many apps."""

    async def warm_up(app: web.Application) -> AsyncIterator[None]:
        async def when_synced() -> None:
            while not app[READY]():
                await asyncio.sleep(0.5)
            try:
                app[SERVICE].view.snapshot()
            except Exception:  # the first request builds it again and answers with the error
                log.exception("building the model after cache sync failed")
            gc.collect()
            gc.freeze()
            log.info("model built and heap frozen after cache sync", extra={"objects": gc.get_freeze_count()})

        task = asyncio.create_task(when_synced())
        yield
        task.cancel()

    app.cleanup_ctx.append(warm_up)


def ssl_context(config: ExtenderConfig) -> ssl.SSLContext | None:
    """The serving certificate, and client certificates asked for and verified against `tls.client_ca_file`:
    optional at this layer, so that kubelet's probes connect; auth.py decides per request (a certificate that does
    not verify fails the handshake)."""
    if config.tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(config.tls.cert_file, config.tls.key_file)
    ctx.load_verify_locations(cafile=config.tls.client_ca_file)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def handler_options(config: ExtenderConfig) -> dict[str, Any]:
    """Options of aiohttp's connection handler (web.run_app, AppRunner). aiohttp closes a connection whose request
    header is incomplete when its keep-alive timer fires (75 s in run_app by default): that timer bounds a client
    that sends its header slowly as well as an idle connection. kube-scheduler's connections reconnect when closed
    idle (Go's transport keeps them 90 s)."""
    return {"keepalive_timeout": config.idle_timeout_seconds}

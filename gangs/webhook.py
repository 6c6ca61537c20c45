"""The mutating admission webhook of `gpuaas gangs`: every Pod created as a member of a group (a label of
`scoring.gangs.GROUP_LABELS`) gets the scheduling gate `gpuaas.io/gang`, so that kube-scheduler leaves it alone until
the gang controller has planned its whole group, pinned each member to its node and removed the gate.

    POST /mutate-pods   an AdmissionReview (admission.k8s.io/v1) in, an AdmissionReview with the same uid out
    GET  /healthz       the webhook's event loop answers

What it answers, for a Pod CREATE:

    a member without the gate and not bound (no spec.nodeName)  allowed, with a JSONPatch that adds the gate
    a pod in no group with spec.resourceClaims, not bound        the same: gpuaas allocates the DRA claims of its
                                                                 device classes and releases it as a gang of one;
                                                                 it lets other drivers' claims go (gangs.dra)
    a member already gated, or created bound                     allowed as is (a pod with spec.nodeName cannot carry
                                                                 a gate: it bypasses the scheduler, and the gang)
    a pod in no group and without claims                         allowed as is (the shipped configuration's selectors
                                                                 keep them from reaching the webhook at all)
    a pod whose group cannot be read (GroupError)                refused with code 400 and the error's message, which
                                                                 `kubectl apply` shows: the label or annotation to fix
    anything else (another kind, another operation)              allowed as is

A body that is not an AdmissionReview is answered with HTTP 400 and a message (the apiserver then applies the
failurePolicy); one larger than `MAX_BODY_BYTES` with 413. The work per review is a JSON parse, a few dict reads and
a JSON dump, no API call: tens of microseconds, far inside the apiserver's timeout even when a Job controller creates
hundreds of pods at once. `WebhookServer` runs it on an event loop of its own, in a thread, so that nothing else a
process does on its loop (planning gangs) delays the apiserver's calls.

`mutating_webhook_configuration` is the registration (one webhook per group label, each selecting only pods that
carry that label); deploy/bases/gangs/webhook.yaml ships it for a Service and the local cluster registers it for a
URL (gpuaas/cluster/webhooks.py). docs/gangs.md, "The admission webhook", is the user's side.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.config import describe_errors
from scoring.draclaims import has_claims
from scoring.gangs import GANG_GATE, GROUP_LABELS, GroupError, group_of

from .config import WebhookConfig

log = logging.getLogger("gpuaas.gangs.webhook")

PATH = "/mutate-pods"
ADMISSION_V1 = "admission.k8s.io/v1"
# kube-apiserver refuses request bodies over 3 MiB, so no Pod it admits is larger; the review wraps one Pod (oldObject
# is null on CREATE) and the requester's name and groups.
MAX_BODY_BYTES = 4 * 1024 * 1024
READ_TIMEOUT_S = 5.0  # the apiserver's own timeout for the call (timeoutSeconds) is 5 s
# A review is tens of microseconds of work; the tail that matters is the event loop's or the GIL's wait.
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
Outcome = Literal["gated", "already-gated", "bound-at-creation", "not-a-member", "refused", "not-a-pod-create",
                  "bad-request", "error"]
OUTCOMES: tuple[Outcome, ...] = ("gated", "already-gated", "bound-at-creation", "not-a-member", "refused",
                                 "not-a-pod-create", "bad-request", "error")


# ---- the wire: the parts of an AdmissionReview and of its Pod that are read ------------------------------------------
class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class GroupVersionKind(_Read):
    group: str = ""
    version: str = ""
    kind: str


class AdmissionRequest(_Read):
    uid: str = Field(min_length=1, max_length=256)
    kind: GroupVersionKind
    subResource: str | None = None
    namespace: str | None = None
    operation: str
    object: dict[str, Any] | None = None


class AdmissionReview(_Read):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class ObjectMeta(_Read):
    name: str | None = None
    generateName: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class SchedulingGate(_Read):
    name: str


class PodSpec(_Read):
    nodeName: str | None = None
    schedulingGates: list[SchedulingGate] | None = None


class Pod(_Read):
    metadata: ObjectMeta = ObjectMeta()
    spec: PodSpec = PodSpec()


class BadReview(ValueError):
    """A body that is not an AdmissionReview this webhook can answer: HTTP 400 with the message."""


# ---- the decision: pure ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    outcome: Outcome
    allowed: bool = True
    patch: tuple[dict[str, Any], ...] = ()  # JSONPatch operations
    message: str = ""  # why it was refused (code 400)
    warnings: tuple[str, ...] = ()  # shown by kubectl

    def response(self, uid: str) -> dict[str, Any]:
        """The AdmissionReview that answers the request `uid`."""
        out: dict[str, Any] = {"uid": uid, "allowed": self.allowed}
        if self.patch:
            out["patchType"] = "JSONPatch"
            out["patch"] = base64.b64encode(orjson.dumps(list(self.patch))).decode()
        if not self.allowed:
            out["status"] = {"status": "Failure", "code": 400, "reason": "BadRequest", "message": self.message}
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return {"apiVersion": ADMISSION_V1, "kind": "AdmissionReview", "response": out}


def gate_patch(pod: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """JSONPatch that appends the gang gate to `pod`'s schedulingGates, creating the list (or spec) if absent."""
    gate = {"name": GANG_GATE}
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return ({"op": "add", "path": "/spec", "value": {"schedulingGates": [gate]}},)
    if isinstance(spec.get("schedulingGates"), list):
        return ({"op": "add", "path": "/spec/schedulingGates/-", "value": gate},)
    return ({"op": "add", "path": "/spec/schedulingGates", "value": [gate]},)  # absent, or null: replaced


def _pod_name(pod: Pod, namespace: str | None) -> str:
    name = pod.metadata.name or f"{pod.metadata.generateName or ''}*"
    return f"{pod.metadata.namespace or namespace or 'default'}/{name}"


def review(request: AdmissionRequest) -> Answer:
    """The answer to one admission request. Raises BadReview on a Pod CREATE whose object cannot be read."""
    kind = request.kind
    if (kind.group, kind.kind) != ("", "Pod") or request.operation != "CREATE" or request.subResource:
        return Answer("not-a-pod-create")
    if request.object is None:
        raise BadReview("request.object: a Pod CREATE without the Pod")
    try:
        pod = Pod.model_validate(request.object)
    except ValidationError as err:
        raise BadReview(f"request.object is not a Pod: {describe_errors(err)}") from None
    try:
        group = group_of(request.object)
    except GroupError as err:
        log.info("refused a group member", extra={"pod": _pod_name(pod, request.namespace), "error": str(err)})
        return Answer("refused", allowed=False, message=f"gpuaas gangs: {err}")
    if group is None and not has_claims(request.object):
        return Answer("not-a-member")
    if any(g.name == GANG_GATE for g in pod.spec.schedulingGates or ()):
        return Answer("already-gated")
    if pod.spec.nodeName:
        what = f"this member of group {group.name} skips the scheduler and is not placed with its gang" if group \
            else "this pod's ResourceClaims are not allocated by gpuaas"
        return Answer("bound-at-creation", warnings=(
            f"spec.nodeName is set: {what} (gpuaas gates only pods the scheduler places)",))
    log.debug("gated", extra={"pod": _pod_name(pod, request.namespace), "group": group.key if group else None})
    return Answer("gated", patch=gate_patch(request.object))


def parse_review(body: bytes) -> AdmissionReview:
    if not body:
        raise BadReview("request body is empty: POST an AdmissionReview (admission.k8s.io/v1)")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise BadReview(f"request body is not JSON: {err}") from None
    try:
        return AdmissionReview.model_validate(data)
    except ValidationError as err:
        raise BadReview(f"not an AdmissionReview (admission.k8s.io/v1): {describe_errors(err)}") from None


# ---- HTTP ------------------------------------------------------------------------------------------------------------
class WebhookMetrics:
    """Reviews by outcome and the time to answer one, on `registry` (the process's, for its /metrics)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.reviews = Counter("gpuaas_gangs_webhook_reviews_total", "Admission reviews answered by the gangs "
                               "webhook, by outcome", ["outcome"], registry=self.registry)
        self.latency = Histogram("gpuaas_gangs_webhook_duration_seconds", "Time to answer one admission review, "
                                 "from the request's arrival to the answer", buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        for outcome in OUTCOMES:
            self.reviews.labels(outcome)


METRICS = web.AppKey("gangs_webhook_metrics", WebhookMetrics)
MAX_BODY = web.AppKey("gangs_webhook_max_body_bytes", int)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def mutate_pods(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    started = time.perf_counter()
    outcome: Outcome = "error"
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            body = await request.read()
        parsed = parse_review(body)
        answer = review(parsed.request)
        outcome = answer.outcome
        return web.Response(body=orjson.dumps(answer.response(parsed.request.uid)), content_type="application/json")
    except BadReview as err:
        outcome = "bad-request"
        return _error(400, str(err))
    except web.HTTPRequestEntityTooLarge:
        outcome = "bad-request"
        response = _error(413, f"request body larger than {request.app[MAX_BODY]} bytes")
        response.force_close()  # the rest of the body is not read
        return response
    except web.RequestPayloadError as err:  # e.g. a body cut short, or not in its Content-Encoding
        outcome = "bad-request"
        request.content.feed_eof()
        response = _error(400, f"request body cannot be read: {err}")
        response.force_close()
        return response
    except TimeoutError:
        outcome = "bad-request"
        response = _error(408, f"request body not received within {READ_TIMEOUT_S:.0f} s")
        response.force_close()
        return response
    except Exception as err:  # a bug: answer, log it, keep serving
        log.exception("unexpected error in the gangs webhook")
        return _error(500, f"internal error: {type(err).__name__}: {err}")
    finally:
        metrics.reviews.labels(outcome).inc()
        metrics.latency.observe(time.perf_counter() - started)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def webhook_app(registry: CollectorRegistry | None = None, *,
                max_body_bytes: int = MAX_BODY_BYTES) -> web.Application:
    """The webhook's routes, its metrics on `registry` (None: a registry of its own, exported nowhere)."""
    app = web.Application(client_max_size=max_body_bytes)
    app[METRICS] = WebhookMetrics(registry)
    app[MAX_BODY] = max_body_bytes
    app.router.add_post(PATH, mutate_pods)
    app.router.add_get("/healthz", healthz)
    return app


def ssl_context(config: WebhookConfig) -> ssl.SSLContext:
    """The serving certificate; no client certificate is asked for (kube-apiserver presents none unless its admission
    configuration gives it one)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(config.cert_file, config.key_file)
    return ctx


def _mtimes(config: WebhookConfig) -> tuple[float, float]:
    return config.cert_file.stat().st_mtime, config.key_file.stat().st_mtime


async def reload_certificate(ctx: ssl.SSLContext, config: WebhookConfig, interval_s: float = 30.0) -> None:
    """Load the certificate into `ctx` again whenever its files change (cert-manager renews the Secret, the kubelet
    swaps the mounted files): new connections get the new one. Runs until cancelled."""
    seen = _mtimes(config)
    while True:
        await asyncio.sleep(interval_s)
        try:
            now = _mtimes(config)
            if now != seen:
                ctx.load_cert_chain(config.cert_file, config.key_file)
                seen = now
                log.info("webhook serving certificate reloaded", extra={"cert_file": str(config.cert_file)})
        except (OSError, ssl.SSLError) as err:  # half-written files: the old certificate serves, try again later
            log.warning("webhook serving certificate not reloaded", extra={"error": str(err)})


# ---- serving on a loop of its own -----------------------------------------------------------------------------------
class WebhookServer:
    """The webhook over HTTPS on an event loop of its own, in a daemon thread: `start()`, then `port`, `stop()`."""

    def __init__(self, config: WebhookConfig, registry: CollectorRegistry | None = None, *, host: str = "0.0.0.0",
                 reload_interval_s: float = 30.0):
        self.config = config
        self.host = host
        self.app = webhook_app(registry)
        self.reload_interval_s = reload_interval_s
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def metrics(self) -> WebhookMetrics:
        return self.app[METRICS]

    def start(self, timeout: float = 10.0) -> WebhookServer:
        self._thread = threading.Thread(target=self._run, name="gangs-webhook", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"the gangs webhook did not start within {timeout:.0f} s")
        if self._error is not None:
            raise RuntimeError(f"the gangs webhook did not start: {self._error}") from self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> WebhookServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as err:  # reported by start() when it happens before the site listens
            self._error = err
            self._started.set()
            if self.port is not None:
                log.exception("the gangs webhook stopped")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        ctx = ssl_context(self.config)
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.config.port, ssl_context=ctx, backlog=1024)
            await site.start()
            self.port = _bound_port(runner, self.config.port)
            log.info("gangs webhook serving", extra={"host": self.host, "port": self.port, "path": PATH})
            self._started.set()
            reloader = asyncio.create_task(reload_certificate(ctx, self.config, self.reload_interval_s))
            try:
                await self._stop.wait()
            finally:
                reloader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reloader
        finally:
            await runner.cleanup()


def _bound_port(runner: web.AppRunner, asked: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return asked


# ---- registration ---------------------------------------------------------------------------------------------------
CONFIGURATION_NAME = "gpuaas-gangs"
WEBHOOK_SUFFIX = "gangs.gpuaas.io"
TIMEOUT_SECONDS = 5
CLAIMS_WEBHOOK = f"claims.{WEBHOOK_SUFFIX}"  # pods with DRA claims (in no group: gangs of one)
# The apiserver sends only pods that name claims (matchConditions, CEL on the Pod): no other pod depends on gpuaas.
HAS_CLAIMS = "has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0"


def webhook_name(label: str) -> str:
    """The webhook entry of a group label: `<source>.gangs.gpuaas.io` (gpuaas, kueue, coscheduling)."""
    return f"{GROUP_LABELS[label]}.{WEBHOOK_SUFFIX}"


def mutating_webhook_configuration(client_config: dict[str, Any], *,
                                   excluded_namespaces: tuple[str, ...] = ("kube-system", "gpuaas-system"),
                                   name: str = CONFIGURATION_NAME) -> dict[str, Any]:
    """The MutatingWebhookConfiguration: one webhook per group label, each reached only by pods that carry the label
    (objectSelector), and one (`CLAIMS_WEBHOOK`) reached only by pods with spec.resourceClaims (matchConditions), on
    Pod CREATE, outside `excluded_namespaces`. `client_config`: {service: ...} or {url: ...}, with caBundle.
    failurePolicy Fail: a member created without the gate would be scheduled on its own and break its gang's
    all-or-nothing placement, a pod with claims would have them allocated by kube-scheduler past gpuaas's accounting
    (it does not check one allocator's devices against another's); refused instead, it is created again by its owner
    (a Job's controller retries)."""
    entries = []
    for label in (*GROUP_LABELS, None):
        entries.append({
            "name": webhook_name(label) if label else CLAIMS_WEBHOOK,
            "clientConfig": client_config,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                       "scope": "Namespaced"}],
            **({"objectSelector": {"matchExpressions": [{"key": label, "operator": "Exists"}]}} if label else
               {"matchConditions": [{"name": "has-resource-claims", "expression": HAS_CLAIMS}]}),
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                        "values": list(excluded_namespaces)}]},
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "timeoutSeconds": TIMEOUT_SECONDS,
            "admissionReviewVersions": ["v1"],
            "reinvocationPolicy": "IfNeeded",
        })
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name}, "webhooks": entries}


__all__ = ["MAX_BODY_BYTES", "PATH", "AdmissionReview", "Answer", "BadReview", "WebhookMetrics", "WebhookServer",
           "gate_patch", "mutating_webhook_configuration", "parse_review", "reload_certificate", "review",
           "ssl_context", "webhook_app"]

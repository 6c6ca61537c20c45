"""A `custom.metrics.k8s.io` API server (v1beta1 and v1beta2) serving queue depth from Prometheus, for a stock HPA.

    GET /apis/custom.metrics.k8s.io/{v}                                          APIResourceList (discovery)
    GET /apis/custom.metrics.k8s.io/{v}/namespaces/{ns}/pods/{name|*}/{metric}   per pod (?labelSelector=...)
    GET /apis/custom.metrics.k8s.io/{v}/namespaces/{ns}/deployments.apps/{name}/{metric}   sum over its pods

It does not serve `external.metrics.k8s.io` (KEDA owns that group in many clusters). It runs over HTTPS and only answers
API paths to a client certificate signed by the front-proxy CA whose common name is allowed (the aggregator's), the
way an aggregated API server authenticates kube-apiserver; /healthz, /livez and /readyz are open. Then, with an
`Authorizer` (runtime/authz.py), it asks kube-apiserver whether the user the aggregator names in X-Remote-User may
make the request (a SubjectAccessReview, cached briefly): 403 naming the user and the permission if not.

A metric path is read once, decoded (aiohttp's match_info: `%2F` is '/'), into a `MetricRequest` whose namespace and
name are checked as Kubernetes checks them (400 naming the field otherwise); that one value is what the
SubjectAccessReview asks about and what the queries use, so the two cannot read a path differently. Every value that
goes into PromQL is escaped as a PromQL string (autoscaler/prom.py) besides.

The handlers are thin: parse the path, call the pure builders (`resource_list`, `metric_value_list`) over the answers of
a `Backend` (Prometheus + the pod list), and map errors to a Kubernetes `Status` in one place (`_serve`). A bad request
gets a 4xx naming what is wrong; Prometheus down gets a 503; the server keeps serving.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import ssl
import threading
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from runtime.authz import (
    USER_HEADER,
    Attributes,
    Authorizer,
    Reviewer,
    ReviewFailed,
    forbidden_message,
    request_attributes,
    user_from_certificate,
    user_from_headers,
)
from scoring.names import InvalidName, dns1123_label, dns1123_subdomain

from .config import MetricRule, MetricsApiConfig
from .prom import BadQuery, MetricsError, Prometheus, PrometheusUnavailable, escape_label_value

log = logging.getLogger("gpuaas.metrics_api")

GROUP = "custom.metrics.k8s.io"
VERSIONS = ("v1beta1", "v1beta2")
OBJECT_RESOURCES = {"deployments.apps": ("Deployment", "apps/v1"), "deployments": ("Deployment", "apps/v1")}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def quantity(value: float) -> str:
    """A Kubernetes quantity in milli-units when not whole: 2 -> "2", 1.5 -> "1500m"."""
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def resource_list(version: str, rules: list[MetricRule]) -> dict:
    resources = []
    for r in rules:
        for res in ("pods", "deployments.apps"):
            resources.append({"name": f"{res}/{r.name}", "singularName": "", "namespaced": True,
                              "kind": "MetricValueList", "verbs": ["get"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{version}",
            "resources": resources}


@dataclass(frozen=True)
class Described:
    kind: str
    namespace: str
    name: str
    api_version: str


def metric_value_list(version: str, metric: str, values: list[tuple[Described, float]], *, timestamp: str,
                      window_s: int = 60) -> dict:
    items = []
    for obj, value in values:
        described = {"kind": obj.kind, "namespace": obj.namespace, "name": obj.name, "apiVersion": obj.api_version}
        if version == "v1beta1":
            item = {"describedObject": described, "metricName": metric, "timestamp": timestamp,
                    "windowSeconds": window_s, "value": quantity(value), "selector": None}
        else:
            item = {"describedObject": described, "metric": {"name": metric}, "timestamp": timestamp,
                    "windowSeconds": window_s, "value": quantity(value)}
        items.append(item)
    return {"kind": "MetricValueList", "apiVersion": f"{GROUP}/{version}", "metadata": {}, "items": items}


class Pods(Protocol):
    def pod_names(self, namespace: str, selector: str | None) -> list[str]: ...

    def deployment_selector(self, namespace: str, name: str) -> str: ...


class KubePods:
    def __init__(self, api):
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)

    def pod_names(self, namespace: str, selector: str | None) -> list[str]:
        from kubernetes.client.exceptions import ApiException

        try:
            pods = self.core.list_namespaced_pod(namespace, label_selector=selector or "").items
        except ApiException as exc:
            if exc.status == 400:
                raise ApiError(400, "BadRequest", f"labelSelector {selector!r}: {exc.reason}") from None
            raise
        return [p.metadata.name for p in pods if p.metadata.deletion_timestamp is None]

    def deployment_selector(self, namespace: str, name: str) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            scale = self.apps.read_namespaced_deployment_scale(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise ApiError(404, "NotFound", f"deployments.apps {name!r} not found in {namespace}") from None
            raise
        return scale.status.selector or ""


class Backend:
    """Prometheus and the pod list, behind the shapes the handlers need (blocking; run in an executor)."""

    def __init__(self, config: MetricsApiConfig, prom: Prometheus, pods: Pods):
        self.rules = {r.name: r for r in config.metrics}
        self.prom = prom
        self.pods = pods

    def validate(self) -> None:
        """Run each rule's queries once; a query Prometheus rejects is a ConfigError. An unreachable Prometheus is not
        (the server starts and answers 503 until it is back)."""
        from .config import ConfigError

        for rule in self.rules.values():
            queries = [f'sum by (pod) ({rule.series}{{namespace="validate"}})']
            if rule.extra_object_query:
                queries.append(rule.extra_object_query.format(namespace="validate", deployment="validate"))
            for q in queries:
                try:
                    self.prom.query(q)
                except BadQuery as exc:
                    raise ConfigError(f"metric {rule.name}: {exc}") from None
                except PrometheusUnavailable as exc:
                    log.warning("could not validate metric %s: %s", rule.name, exc)

    def rule(self, metric: str) -> MetricRule:
        if metric not in self.rules:
            raise ApiError(404, "NotFound", f"metric {metric!r} is not served; served: {', '.join(self.rules)}")
        return self.rules[metric]

    def per_pod(self, namespace: str, metric: str) -> dict[str, float]:
        rule = self.rule(metric)
        try:
            samples = self.prom.query(f'sum by (pod) ({rule.series}{{namespace="{escape_label_value(namespace)}"}})')
        except PrometheusUnavailable as exc:
            raise ApiError(503, "ServiceUnavailable", str(exc)) from None
        except BadQuery as exc:
            raise ApiError(500, "InternalError", str(exc)) from None
        return {s.labels["pod"]: s.value for s in samples
                if "pod" in s.labels and not math.isnan(s.value) and not math.isinf(s.value)}

    def pods_metric(self, namespace: str, name: str, metric: str, selector: str | None) -> list[tuple[str, float]]:
        values = self.per_pod(namespace, metric)
        if name != "*":
            if name not in values:
                raise ApiError(404, "NotFound", f"the server could not find the metric {metric} for pods {name}")
            return [(name, values[name])]
        wanted = self.pods.pod_names(namespace, selector)
        return [(p, values[p]) for p in sorted(wanted) if p in values]

    def deployment_metric(self, namespace: str, name: str, metric: str) -> float:
        rule = self.rule(metric)
        selector = self.pods.deployment_selector(namespace, name)
        pods = self.pods.pod_names(namespace, selector)
        values = self.per_pod(namespace, metric)
        present = [values[p] for p in pods if p in values]
        total = sum(present)
        if rule.extra_object_query:
            try:
                samples = self.prom.query(rule.extra_object_query.format(namespace=escape_label_value(namespace),
                                                                         deployment=escape_label_value(name)))
            except MetricsError as exc:
                raise ApiError(503, "ServiceUnavailable", str(exc)) from None
            extra = [s.value for s in samples if not math.isnan(s.value)]
            total += sum(extra)
            present += extra
        if not present:
            raise ApiError(404, "NotFound",
                           f"the server could not find the metric {metric} for deployments.apps {name}")
        return total


@dataclass(frozen=True)
class MetricRequest:
    """What a metric path asks for, decoded and checked: the one reading of it that authorization and the queries
    share."""
    version: str
    namespace: str
    resource: str
    name: str
    metric: str

    def attributes(self, path: str) -> Attributes:
        """The SubjectAccessReview's attributes (RequestInfoFactory's reading of this path): get `resource/metric`
        named `name` in `namespace`."""
        return Attributes(verb="get", path=path, resource_request=True, group=GROUP, version=self.version,
                          namespace=self.namespace, resource=self.resource, subresource=self.metric, name=self.name)


def metric_request(params: dict[str, str] | web.UrlMappingMatchInfo) -> MetricRequest:
    """The decoded path parameters of a metric path, checked: 404 for a version or resource not served, 400 naming the
    field for a namespace that is not a DNS-1123 label or a name that is not a DNS-1123 subdomain (`*` for pods)."""
    version, namespace, resource, name, metric = (params[k] for k in ("version", "namespace", "resource", "name",
                                                                      "metric"))
    if version not in VERSIONS:
        raise ApiError(404, "NotFound", f"version {version!r} of {GROUP} is not served; served: {', '.join(VERSIONS)}")
    if resource != "pods" and resource not in OBJECT_RESOURCES:
        raise ApiError(404, "NotFound", f"resource {resource!r} is not served; served: pods, deployments.apps")
    if name == "*" and resource != "pods":
        raise ApiError(400, "BadRequest", f"{resource}: name a single object (wildcards are served for pods only)")
    try:
        dns1123_label(namespace, "namespace")
        if name != "*":
            dns1123_subdomain(name, "name")
    except InvalidName as exc:
        raise ApiError(400, "BadRequest", str(exc)) from None
    return MetricRequest(version, namespace, resource, name, metric)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


BACKEND = web.AppKey("backend", Backend)
ALLOWED = web.AppKey("allowed", frozenset)
# An Authorizer, or None: no per-user authorization.
AUTHORIZER: web.AppKey[Authorizer[Reviewer] | None] = web.AppKey("authorizer")
METRIC_ROUTE = "metric"
METRIC_REQUEST = web.RequestKey("metric_request", MetricRequest)  # set by the middleware on METRIC_ROUTE


def _peer_name(request: web.Request) -> str | None:
    """The common name of the verified client certificate, as kube-apiserver's x509 authenticator reads it."""
    user = user_from_certificate(request.transport.get_extra_info("peercert") if request.transport else None)
    return user.name if user is not None else None


async def _authorize(request: web.Request, authorizer: Authorizer[Reviewer]) -> None:
    """The user the aggregator vouches for may make this request, or ApiError. Only called once the client
    certificate proved the caller is the aggregator: before that, X-Remote-* headers mean nothing."""
    user = user_from_headers(request.headers)
    if user is None:
        raise ApiError(401, "Unauthorized", f"no {USER_HEADER} header: the aggregator names the user it authenticated "
                                            "there")
    parsed = request.get(METRIC_REQUEST)
    attrs = parsed.attributes(request.path) if parsed is not None else \
        request_attributes(request.method, request.path, request.query_string)
    try:
        decision = await _blocking(authorizer.authorize, user, attrs)
    except ReviewFailed as exc:
        log.warning("cannot authorize %s %s for %s: %s", request.method, request.path, user.name, exc.message)
        raise ApiError(exc.code, "ServiceUnavailable" if exc.code == 503 else "InternalError",
                       f"cannot authorize user {user.name!r}: {exc.message}") from None
    if not decision.allowed:
        raise ApiError(403, "Forbidden", forbidden_message(user, attrs, decision.reason),
                       {"name": attrs.name, "group": attrs.group, "kind": attrs.resource} if attrs.resource_request
                       else None)


@web.middleware
async def _serve(request: web.Request, handler) -> web.StreamResponse:
    """Authentication, authorization, and the one place where errors become Kubernetes Status answers."""
    try:
        if request.path.startswith("/apis"):
            name = _peer_name(request)
            if name is None:
                raise ApiError(401, "Unauthorized", "a client certificate signed by the front-proxy CA is required")
            if name not in request.app[ALLOWED]:
                raise ApiError(403, "Forbidden", f"client certificate {name!r} is not an allowed requestheader client")
            if request.match_info.route.name == METRIC_ROUTE:
                request[METRIC_REQUEST] = metric_request(request.match_info)
            authorizer = request.app[AUTHORIZER]
            if authorizer is not None:
                await _authorize(request, authorizer)
        return await handler(request)
    except ApiError as exc:
        return web.json_response(status(exc.code, exc.reason, exc.message, exc.details), status=exc.code)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return web.json_response(status(exc.status, exc.reason, f"{request.method} {request.path}: {exc.reason}"),
                                     status=exc.status)
        raise
    except Exception as exc:  # a bug or an API outage: answer, log, keep serving
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response(status(500, "InternalError", f"{type(exc).__name__}: {exc}"), status=500)


def _version(request: web.Request) -> str:
    v = request.match_info["version"]
    if v not in VERSIONS:
        raise ApiError(404, "NotFound", f"version {v!r} of {GROUP} is not served; served: {', '.join(VERSIONS)}")
    return v


async def _blocking(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def discovery(request: web.Request) -> web.Response:
    v = _version(request)
    return web.json_response(resource_list(v, list(request.app[BACKEND].rules.values())))


async def object_metric(request: web.Request) -> web.Response:
    r: MetricRequest = request[METRIC_REQUEST]  # parsed once by the middleware, authorized as such
    v, ns, resource, name, metric = r.version, r.namespace, r.resource, r.name, r.metric
    backend = request.app[BACKEND]
    selector = request.query.get("labelSelector")
    if resource == "pods":
        values = await _blocking(backend.pods_metric, ns, name, metric, selector)
        body = metric_value_list(v, metric, [(Described("Pod", ns, p, "/v1"), x) for p, x in values],
                                 timestamp=_now())
        return web.json_response(body)
    kind, api_version = OBJECT_RESOURCES[resource]
    value = await _blocking(backend.deployment_metric, ns, name, metric)
    return web.json_response(metric_value_list(v, metric, [(Described(kind, ns, name, api_version), value)],
                                               timestamp=_now()))


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def init_app(backend: Backend, allowed_client_names: list[str],
             authorizer: Authorizer[Reviewer] | None = None) -> web.Application:
    """The app; without `authorizer` any user the aggregator lets through may read every metric (the CLI always
    passes one unless `authorization.enabled: false`)."""
    app = web.Application(middlewares=[_serve])
    app[BACKEND] = backend
    app[ALLOWED] = frozenset(allowed_client_names)
    app[AUTHORIZER] = authorizer
    base = f"/apis/{GROUP}/{{version}}"
    app.router.add_get(base, discovery)
    app.router.add_get(base + "/namespaces/{namespace}/{resource}/{name}/{metric}", object_metric, name=METRIC_ROUTE)
    for path in ("/healthz", "/livez", "/readyz"):
        app.router.add_get(path, healthz)
    return app


def server_ssl_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(client_ca)
    ctx.verify_mode = ssl.CERT_OPTIONAL  # health probes come without a certificate; /apis checks it (middleware)
    return ctx


class MetricsApiServer:
    """Runs the app on its own event loop in a thread (tests, the local cluster) or in the foreground (`run`)."""

    def __init__(self, app: web.Application, *, host: str = "127.0.0.1", port: int = 6443,
                 ssl_context: ssl.SSLContext):
        self.app, self.host, self.port, self.ssl_context = app, host, port, ssl_context
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def _start(self) -> web.AppRunner:
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=self.ssl_context)
        await site.start()
        if self.port == 0:
            self.port = runner.addresses[0][1]
        return runner

    def start(self) -> MetricsApiServer:
        started = threading.Event()
        errors: list[BaseException] = []

        def main() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            try:
                runner = self._loop.run_until_complete(self._start())
            except BaseException as exc:
                errors.append(exc)
                started.set()
                return
            started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=main, daemon=True, name="metrics-api")
        self._thread.start()
        started.wait(30)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop and self._thread:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def run(self) -> None:
        web.run_app(self.app, host=self.host, port=self.port, ssl_context=self.ssl_context, access_log=None)

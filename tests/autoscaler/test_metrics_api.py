"""The custom.metrics.k8s.io server over real TLS: who may ask, the shapes of v1beta1 and v1beta2, and errors that
leave it serving."""
from __future__ import annotations

import json
import math
import re
import ssl
import urllib.error
import urllib.request

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from autoscaler.config import MetricsApiConfig
from autoscaler.metrics_api import ApiError, Backend, MetricsApiServer, init_app, quantity, server_ssl_context
from autoscaler.prom import PrometheusUnavailable, Sample
from gpuaas.cluster import pki as pkimod
from runtime.authz import Authorizer, ReviewFailed
from tests.gpuaas.test_authz import FakeReviewer


class FakeProm:
    def __init__(self):
        self.down = False
        self.values = {"llm-a": 3.0, "llm-b": 0.5, "other": 7.0, "broken": math.nan}

    def query(self, promql):
        if self.down:
            raise PrometheusUnavailable("cannot reach Prometheus at http://prom:9090: connection refused")
        assert 'namespace="inf"' in promql, promql
        return [Sample({"pod": p}, v) for p, v in self.values.items()]


class FakePods:
    def pod_names(self, namespace, selector):
        if selector == "app in (":
            raise ApiError(400, "BadRequest", "labelSelector 'app in (': unable to parse requirement")
        return ["llm-a", "llm-b", "llm-c"] if selector in (None, "app=llm") else []

    def deployment_selector(self, namespace, name):
        if name != "llm":
            raise ApiError(404, "NotFound", f"deployments.apps {name!r} not found in {namespace}")
        return "app=llm"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    p = pkimod.create_pki(d)
    pkimod.issue_serving_cert(p, "metrics", "metrics", names=("localhost",), ips=("127.0.0.1",))
    # a client cert from the right CA with a name the server does not allow
    ca_key = serialization.load_pem_private_key(p.path("front-proxy-ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(p.path("front-proxy-ca.crt").read_bytes())
    key, cert = pkimod._leaf(ca_key, ca_cert, "somebody-else")
    pkimod._write_key(p.path("other.key"), key)
    pkimod._write_cert(p.path("other.crt"), cert)
    return p


@pytest.fixture(scope="module")
def server(pki):
    prom = FakeProm()
    backend = Backend(MetricsApiConfig(), prom, FakePods())
    srv = MetricsApiServer(init_app(backend, ["front-proxy-client"]), port=0, ssl_context=server_ssl_context(
        str(pki.path("metrics.crt")), str(pki.path("metrics.key")), str(pki.front_proxy_ca_cert)))
    srv.start()
    srv.prom = prom
    yield srv
    srv.stop()


def get(server, pki, path, client="front-proxy-client", headers=None):
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    if client:
        ctx.load_cert_chain(str(pki.path(f"{client}.crt")), str(pki.path(f"{client}.key")))
    request = urllib.request.Request(f"https://localhost:{server.port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


BASE = "/apis/custom.metrics.k8s.io"


def test_only_the_aggregator_may_ask(server, pki):
    code, body = get(server, pki, f"{BASE}/v1beta1", client=None)
    assert code == 401 and body["kind"] == "Status" and "client certificate" in body["message"]
    code, body = get(server, pki, f"{BASE}/v1beta1", client="other")
    assert code == 403 and "somebody-else" in body["message"]
    # a certificate from another CA (the cluster CA's admin) fails the TLS handshake
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(server, pki, f"{BASE}/v1beta1", client="admin")
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    with urllib.request.urlopen(f"https://localhost:{server.port}/healthz", context=ctx, timeout=5) as r:
        assert r.status == 200


def test_discovery_lists_pods_and_deployments(server, pki):
    code, body = get(server, pki, f"{BASE}/v1beta2")
    assert code == 200 and body["kind"] == "APIResourceList" and body["groupVersion"] == "custom.metrics.k8s.io/v1beta2"
    assert {r["name"] for r in body["resources"]} == {"pods/queue_depth", "deployments.apps/queue_depth"}


def test_pods_wildcard_v1beta1(server, pki):
    code, body = get(server, pki, f"{BASE}/v1beta1/namespaces/inf/pods/*/queue_depth?labelSelector=app%3Dllm")
    assert code == 200 and body["kind"] == "MetricValueList"
    # llm-c has no series, "other" is not selected, "broken" is NaN: two items
    items = {i["describedObject"]["name"]: i for i in body["items"]}
    assert set(items) == {"llm-a", "llm-b"}
    assert items["llm-a"]["value"] == "3" and items["llm-b"]["value"] == "500m"
    assert items["llm-a"]["metricName"] == "queue_depth" and items["llm-a"]["describedObject"]["kind"] == "Pod"


def test_deployment_object_v1beta2(server, pki):
    code, body = get(server, pki, f"{BASE}/v1beta2/namespaces/inf/deployments.apps/llm/queue_depth")
    assert code == 200
    item = body["items"][0]
    assert item["metric"] == {"name": "queue_depth"} and item["value"] == "3500m"
    assert item["describedObject"] == {"kind": "Deployment", "namespace": "inf", "name": "llm", "apiVersion": "apps/v1"}


@pytest.mark.parametrize("path, code, words", [
    (f"{BASE}/v1/namespaces/inf/pods/*/queue_depth", 404, "version 'v1'"),
    (f"{BASE}/v1beta1/namespaces/inf/pods/*/cpu", 404, "metric 'cpu' is not served"),
    (f"{BASE}/v1beta1/namespaces/inf/pods/llm-c/queue_depth", 404, "could not find the metric queue_depth for pods"),
    (f"{BASE}/v1beta1/namespaces/inf/services/x/queue_depth", 404, "resource 'services' is not served"),
    (f"{BASE}/v1beta1/namespaces/inf/deployments.apps/nope/queue_depth", 404, "'nope' not found"),
    (f"{BASE}/v1beta1/namespaces/inf/deployments.apps/*/queue_depth", 400, "wildcards are served for pods only"),
    (f"{BASE}/v1beta1/namespaces/inf/pods/*/queue_depth?labelSelector=app%20in%20(", 400, "unable to parse"),
    ("/apis/external.metrics.k8s.io/v1beta1/namespaces/inf/queue_depth", 404, "Not Found"),
])
def test_bad_requests_get_a_status_and_the_server_keeps_serving(server, pki, path, code, words):
    got, body = get(server, pki, path)
    assert got == code and body["kind"] == "Status" and words in body["message"], body
    assert get(server, pki, f"{BASE}/v1beta1")[0] == 200


def test_prometheus_down_is_503_then_recovers(server, pki):
    server.prom.down = True
    try:
        code, body = get(server, pki, f"{BASE}/v1beta1/namespaces/inf/pods/*/queue_depth")
        assert code == 503 and "connection refused" in body["message"]
    finally:
        server.prom.down = False
    assert get(server, pki, f"{BASE}/v1beta1/namespaces/inf/pods/*/queue_depth")[0] == 200


@pytest.mark.parametrize("value, text", [(2, "2"), (1.5, "1500m"), (0, "0"), (0.0004, "0"), (12.25, "12250m")])
def test_quantity(value, text):
    assert quantity(value) == text


def test_bad_rule_refused():
    from autoscaler.config import ConfigError, parse
    from autoscaler.prom import BadQuery

    with pytest.raises(ConfigError, match=re.escape("unknown placeholder {pod}")):
        parse(MetricsApiConfig, {"metrics": [{"name": "q", "extra_object_query": "x{{a=\"{pod}\"}}"}]})
    with pytest.raises(ConfigError, match=re.escape("metrics.0.series: must be a Prometheus metric name")):
        parse(MetricsApiConfig, {"metrics": [{"name": "q", "series": "rate(x[1m])"}]})

    class Rejecting:
        def query(self, q):
            raise BadQuery(f"Prometheus rejected the query {q!r}: bad_data: parse error")

    config = parse(MetricsApiConfig, {"metrics": [{"name": "q", "extra_object_query": "sum(x"}]})
    with pytest.raises(ConfigError, match="metric q: Prometheus rejected"):
        Backend(config, Rejecting(), FakePods()).validate()


# ---- delegated authorization: the user behind the aggregator ---------------------------------------------------------
def alice_reads_pod_queue_depth_in_inf(spec) -> bool:
    """The RBAC of these tests: alice may read pods/queue_depth in inf; discovery is open to authenticated users."""
    attrs = spec.get("resourceAttributes")
    if attrs is None:
        return "system:authenticated" in spec["groups"]
    return spec["user"] == "alice" and attrs.get("namespace") == "inf" \
        and (attrs["resource"], attrs.get("subresource")) == ("pods", "queue_depth")


@pytest.fixture
def authz_server(pki):
    reviewer = FakeReviewer(allows=alice_reads_pod_queue_depth_in_inf)
    backend = Backend(MetricsApiConfig(), FakeProm(), FakePods())
    srv = MetricsApiServer(init_app(backend, ["front-proxy-client"], Authorizer(reviewer, deny_ttl_s=0)), port=0,
                           ssl_context=server_ssl_context(str(pki.path("metrics.crt")), str(pki.path("metrics.key")),
                                                          str(pki.front_proxy_ca_cert)))
    srv.start()
    srv.reviewer = reviewer
    yield srv
    srv.stop()


def as_user(name, group=None):
    return {"X-Remote-User": name, **({"X-Remote-Group": group} if group else {})}


PODS = f"{BASE}/v1beta1/namespaces/inf/pods/*/queue_depth"


def test_a_user_allowed_by_the_apiserver_gets_the_metrics_and_others_get_403(authz_server, pki):
    code, body = get(authz_server, pki, PODS, headers=as_user("alice"))
    assert code == 200 and body["kind"] == "MetricValueList"
    code, body = get(authz_server, pki, PODS, headers=as_user("mallory"))
    assert code == 403 and body["reason"] == "Forbidden"
    assert body["message"] == ('pods.custom.metrics.k8s.io "*" is forbidden: User "mallory" cannot get resource '
                               '"pods/queue_depth" in API group "custom.metrics.k8s.io" in the namespace "inf"')
    assert body["details"] == {"name": "*", "group": "custom.metrics.k8s.io", "kind": "pods"}
    # alice's permission is for pods in inf only
    code, body = get(authz_server, pki, f"{BASE}/v1beta1/namespaces/inf/deployments.apps/llm/queue_depth",
                     headers=as_user("alice"))
    assert code == 403 and '"deployments.apps/queue_depth"' in body["message"]
    review = authz_server.reviewer.bodies[0]["spec"]
    assert review["resourceAttributes"] == {"namespace": "inf", "verb": "get", "group": "custom.metrics.k8s.io",
                                            "version": "v1beta1", "resource": "pods", "subresource": "queue_depth",
                                            "name": "*"}


def test_discovery_is_authorized_as_a_non_resource_path(authz_server, pki):
    assert get(authz_server, pki, f"{BASE}/v1beta1", headers=as_user("bob"))[0] == 200  # system:authenticated
    code, body = get(authz_server, pki, f"{BASE}/v1beta1", headers=as_user("system:anonymous",
                                                                            "system:unauthenticated"))
    assert code == 403 and body["message"] == ('forbidden: User "system:anonymous" cannot get path '
                                               f'"{BASE}/v1beta1"')


def test_the_user_headers_count_only_after_the_client_certificate(authz_server, pki):
    code, body = get(authz_server, pki, PODS, client=None, headers=as_user("alice"))
    assert code == 401 and "client certificate" in body["message"]
    code, body = get(authz_server, pki, PODS, client="other", headers=as_user("alice"))
    assert code == 403 and "somebody-else" in body["message"]
    code, body = get(authz_server, pki, PODS)  # the aggregator's certificate, but no user named
    assert code == 401 and "X-Remote-User" in body["message"]
    assert authz_server.reviewer.bodies == []


def test_a_failed_access_review_is_503_and_the_next_request_is_served(authz_server, pki):
    authz_server.reviewer.fail = ReviewFailed(503, "SubjectAccessReview failed: ConnectionRefusedError: refused")
    code, body = get(authz_server, pki, PODS, headers=as_user("alice"))
    assert code == 503 and body["reason"] == "ServiceUnavailable"
    assert "cannot authorize user 'alice'" in body["message"] and "refused" in body["message"]
    authz_server.reviewer.fail = None
    assert get(authz_server, pki, PODS, headers=as_user("alice"))[0] == 200


# ---- one decoded reading of the path for the review and the queries; names checked; values escaped ----------------
class RecordingProm:
    """Prometheus that records every query and answers the pods of namespace inf (and, were a selector widened to
    other namespaces, theirs too, which no test may see)."""

    def __init__(self):
        self.queries: list[str] = []

    def query(self, promql):
        self.queries.append(promql)
        return [Sample({"pod": "llm-a"}, 3.0), Sample({"pod": "victim"}, 9.0)]


@pytest.fixture
def recording_server(pki):
    reviewer = FakeReviewer(allows=alice_reads_pod_queue_depth_in_inf)
    prom = RecordingProm()
    srv = MetricsApiServer(init_app(Backend(MetricsApiConfig(), prom, FakePods()), ["front-proxy-client"],
                                    Authorizer(reviewer, deny_ttl_s=0)), port=0,
                           ssl_context=server_ssl_context(str(pki.path("metrics.crt")), str(pki.path("metrics.key")),
                                                          str(pki.front_proxy_ca_cert)))
    srv.start()
    srv.reviewer, srv.prom = reviewer, prom
    yield srv
    srv.stop()


# On today's main the review read the decoded path split at every '/', and the query took aiohttp's decoded segment
# whole: for the first path the review asked whether alice may get pods "x\",namespace!=\"" in namespace inf (she
# may), while the query ran on namespace `inf/pods/x",namespace!="/queue_depth`, its quotes unescaped, a second
# matcher; the answer was 200 with the pod "victim". (aiohttp's routes refuse a decoded '{' or '}' in a segment,
# which kept `"} or ...{` out of this path.)
INJECTIONS = {
    "the review and the query read %2F differently":
        ("/namespaces/inf%2Fpods%2Fx%22,namespace!=%22%2Fqueue_depth/pods/victim/queue_depth",
         "namespace: 'inf/pods/x\",namespace!=\"/queue_depth' is not a DNS-1123 label"),
    "a quote in the namespace": ('/namespaces/x%22,namespace!=%22/pods/*/queue_depth',
                                 "namespace: 'x\",namespace!=\"' is not a DNS-1123 label"),
    "a %2F in a pod name": ("/namespaces/inf/pods/llm-a%2Fqueue_depth/queue_depth",
                           "name: 'llm-a/queue_depth' is not a DNS-1123 subdomain"),
    "a %2F in a deployment name": ("/namespaces/inf/deployments.apps/llm%2F..%2Fx/queue_depth",
                                  "name: 'llm/../x' is not a DNS-1123 subdomain"),
    "an upper-case namespace": ("/namespaces/Inf/pods/*/queue_depth", "namespace: 'Inf' is not a DNS-1123 label"),
}


@pytest.mark.parametrize("case", sorted(INJECTIONS))
def test_a_path_that_is_not_a_kubernetes_name_is_400_naming_the_field_before_any_review_or_query(
        recording_server, pki, case):
    path, words = INJECTIONS[case]
    code, body = get(recording_server, pki, f"{BASE}/v1beta1{path}", headers=as_user("alice"))
    assert (code, body.get("reason")) == (400, "BadRequest") and words in body["message"], \
        (body, recording_server.prom.queries)
    assert recording_server.reviewer.bodies == [] and recording_server.prom.queries == []
    assert get(recording_server, pki, PODS, headers=as_user("alice"))[0] == 200  # and it keeps serving


def test_the_review_and_the_query_read_the_same_decoded_names(recording_server, pki):
    # %69 is 'i', %61 is 'a': decoded once, the review asks about pod llm-a in inf, and the query is about inf.
    code, body = get(recording_server, pki, f"{BASE}/v1beta1/namespaces/%69nf/pods/llm-%61/queue_depth",
                     headers=as_user("alice"))
    assert code == 200 and [i["describedObject"]["name"] for i in body["items"]] == ["llm-a"]
    review = recording_server.reviewer.bodies[0]["spec"]["resourceAttributes"]
    assert (review["namespace"], review["name"], review["resource"], review["subresource"]) == \
        ("inf", "llm-a", "pods", "queue_depth")
    assert recording_server.prom.queries == ['sum by (pod) (vllm:num_requests_waiting{namespace="inf"})']


def test_the_backend_escapes_what_it_puts_in_a_query_whatever_its_caller_checked():
    prom = RecordingProm()
    extra = 'sum(w{{namespace="{namespace}",deployment="{deployment}"}})'
    config = MetricsApiConfig(metrics=[{"name": "queue_depth", "extra_object_query": extra}])

    class AnyPods(FakePods):
        def deployment_selector(self, namespace, name):
            return "app=llm"

    Backend(config, prom, AnyPods()).deployment_metric('x",a!="', 'd"}', "queue_depth")
    assert prom.queries == ['sum by (pod) (vllm:num_requests_waiting{namespace="x\\",a!=\\""})',
                            'sum(w{namespace="x\\",a!=\\"",deployment="d\\"}"})']

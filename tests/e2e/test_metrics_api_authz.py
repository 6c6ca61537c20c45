"""custom.metrics.k8s.io with delegated authorization, end to end: our server behind the real aggregator, running with a
ServiceAccount granted exactly METRICS_API_RULES plus ClusterRole system:auth-delegator, asks kube-apiserver a
SubjectAccessReview for the user behind every request.

- a user whose Role allows `get` on custom.metrics.k8s.io pods/queue_depth reads a MetricValueList through
  `kubectl get --raw --as`, and our server asked about exactly that user and those attributes;
- a user without it gets 403 (through the aggregator kube-apiserver already refuses him with the same RBAC; sent to
  our server directly with the aggregator's certificate, our server refuses him after the real SubjectAccessReview);
- the HPA controller (kube-controller-manager, as its ServiceAccount) still reads the metric;
- without permission to create SubjectAccessReviews the server answers 500 saying so, and serves again once bound.
"""
from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes import client

from autoscaler.config import MetricsApiConfig, parse
from autoscaler.metrics_api import Backend, KubePods, MetricsApiServer, init_app, server_ssl_context
from autoscaler.prom import Prometheus
from gpuaas.cluster.pki import issue_serving_cert
from gpuaas.cluster.process import free_port
from gpuaas.cluster.prometheus import PrometheusServer
from gpuaas.loadgen.replayer import Replayer
from gpuaas.loadgen.serving import ServiceModel
from gpuaas.loadgen.trace import Arrival
from gpuaas.workloads import gpu_deployment
from runtime.authz import Authorizer, KubeAccessReviewer
from runtime.kubeclient import api_client

from .kube import registered_custom_metrics_api, wait_for

REPO = Path(__file__).resolve().parents[2]
GROUP = "custom.metrics.k8s.io"
HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
# The server runs with the RBAC deploy/ grants it; SubjectAccessReviews come from its system:auth-delegator binding.
METRICS_API = REPO / "deploy" / "bases" / "custom-metrics-api"
AUTH_DELEGATOR_BINDING = "gpuaas-custom-metrics-auth-delegator"


class RecordingReviewer:
    """The real SubjectAccessReviews, each recorded with kube-apiserver's answer."""

    def __init__(self, reviewer: KubeAccessReviewer):
        self.reviewer = reviewer
        self.seen: list[tuple[dict, dict]] = []

    def review(self, body: dict) -> dict:
        status = self.reviewer.review(body)
        self.seen.append((body["spec"], status))
        return status

    def answers_for(self, user: str) -> list[tuple[dict, dict]]:
        return [(spec, status) for spec, status in self.seen if spec["user"] == user]


@pytest.fixture
def served(cluster, namespace, tmp_path):
    """Queue depth of Deployment llm's pod in Prometheus, and our server registered for it with authorization on."""
    api = api_client(cluster.service_account_kubeconfig(METRICS_API, "gpuaas-custom-metrics"))
    client.AppsV1Api(cluster.api).create_namespaced_deployment(namespace, gpu_deployment("llm", namespace, gpus=1))
    port = free_port()
    replayer = Replayer(cluster.api, namespace, "llm", [Arrival(float(t), 5000, 20) for t in range(900)],
                        model=ServiceModel(cold_start_s=1.0, scrape_interval_s=1.0), port=port, poll_s=0.25).start()
    prometheus = PrometheusServer(tmp_path / "prometheus", targets=[f"127.0.0.1:{port}"], scrape_interval="1s").start()
    pki = cluster.control_plane.pki
    cert, key = issue_serving_cert(pki, "custom-metrics-authz", "gpuaas-custom-metrics",
                                   names=(f"gpuaas-custom-metrics.{namespace}.svc", "localhost"), ips=("127.0.0.1",))
    config = parse(MetricsApiConfig, {"prometheus": {"url": prometheus.url, "timeout_s": 2}})
    reviewer = RecordingReviewer(KubeAccessReviewer(api))
    server = MetricsApiServer(
        init_app(Backend(config, Prometheus(prometheus.url, timeout_s=2), KubePods(api)), config.allowed_client_names,
                 Authorizer(reviewer)),
        host="127.0.0.1", port=0,
        ssl_context=server_ssl_context(str(cert), str(key), str(pki.front_proxy_ca_cert))).start()
    try:
        with registered_custom_metrics_api(cluster, namespace, server.port, METRICS_API / "apiservices.yaml"):
            yield SimpleNamespace(server=server, reviewer=reviewer, pki=pki)
    finally:
        server.stop()
        replayer.stop()
        prometheus.stop()


def kubectl_raw(cluster, path: str, user: str):
    return cluster.control_plane.kubectl("get", "--raw", path, "--as", user, check=False)


def as_the_aggregator(served, path: str, user: str, groups=("system:authenticated",)) -> tuple[int, dict]:
    """A request straight to our server with the aggregator's own front-proxy client certificate."""
    pki = served.pki
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    ctx.load_cert_chain(str(pki.path("front-proxy-client.crt")), str(pki.path("front-proxy-client.key")))
    request = urllib.request.Request(f"https://localhost:{served.server.port}{path}")
    request.add_header("X-Remote-User", user)
    for g in groups:
        request.add_header("X-Remote-Group", g)
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_only_users_allowed_by_rbac_read_the_metrics_and_the_hpa_still_does(cluster, namespace, served):
    api = cluster.api
    path = f"/apis/{GROUP}/v1beta1/namespaces/{namespace}/pods/*/queue_depth"
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "queue-depth-reader"}, "rules": [
        {"apiGroups": [GROUP], "resources": ["pods/queue_depth"], "verbs": ["get"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "alice-reads-queue-depth"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "queue-depth-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]})

    def alice_reads():
        out = kubectl_raw(cluster, path, "alice")
        return out.returncode == 0 and (body := json.loads(out.stdout))["items"] and body
    body = wait_for(alice_reads, timeout=60, what="alice reading a MetricValueList with the pod of llm")
    assert body["kind"] == "MetricValueList" and body["items"][0]["describedObject"]["kind"] == "Pod"
    spec, answer = served.reviewer.answers_for("alice")[0]
    assert answer["allowed"] and "system:authenticated" in spec["groups"]
    assert spec["resourceAttributes"] == {"namespace": namespace, "verb": "get", "group": GROUP,
                                          "version": "v1beta1", "resource": "pods", "subresource": "queue_depth",
                                          "name": "*"}

    out = kubectl_raw(cluster, path, "mallory")
    assert out.returncode != 0 and "Forbidden" in out.stderr and 'User "mallory"' in out.stderr, out.stderr
    code, status = as_the_aggregator(served, path, "mallory")
    assert code == 403 and status["reason"] == "Forbidden"
    assert status["message"].startswith(f'pods.{GROUP} "*" is forbidden: User "mallory" cannot get resource '
                                        f'"pods/queue_depth" in API group "{GROUP}" in the namespace "{namespace}"')
    assert [a["allowed"] for _, a in served.reviewer.answers_for("mallory")] == [False]

    # The HPA controller reads it as its ServiceAccount, allowed by its bootstrap ClusterRole.
    autoscaling = client.AutoscalingV2Api(api)
    autoscaling.create_namespaced_horizontal_pod_autoscaler(namespace, {
        "metadata": {"name": "llm"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
                 "minReplicas": 1, "maxReplicas": 3,
                 "metrics": [{"type": "Pods", "pods": {"metric": {"name": "queue_depth"},
                                                       "target": {"type": "AverageValue", "averageValue": "2"}}}]}})

    def hpa_reads():
        hpa = autoscaling.read_namespaced_horizontal_pod_autoscaler("llm", namespace)
        active = {c.type: c for c in hpa.status.conditions or []}.get("ScalingActive")
        return hpa.status.current_metrics and active and active.status == "True" and hpa
    hpa = wait_for(hpa_reads, timeout=90, interval=1, what="the HPA reading queue_depth")
    assert hpa.status.current_metrics[0].pods.metric.name == "queue_depth"
    assert any(a["allowed"] for _, a in served.reviewer.answers_for(HPA_USER))

    # No permission to ask kube-apiserver: 500 naming the fix; bound again, the next request is served.
    saved = rbac.read_cluster_role_binding(AUTH_DELEGATOR_BINDING)
    rbac.delete_cluster_role_binding(AUTH_DELEGATOR_BINDING)
    try:
        code, status = wait_for(lambda: (r := as_the_aggregator(served, path, f"carol-{time.monotonic_ns()}"))[0]
                                == 500 and r, timeout=30,
                                what="a 500 once the server may not create SubjectAccessReviews")
        assert "system:auth-delegator" in status["message"] and "cannot authorize user" in status["message"]
    finally:
        rbac.create_cluster_role_binding({"metadata": {"name": AUTH_DELEGATOR_BINDING},
                                          "roleRef": saved.role_ref.to_dict(),
                                          "subjects": [s.to_dict() for s in saved.subjects]})
    wait_for(lambda: as_the_aggregator(served, path, f"carol-{time.monotonic_ns()}")[0] == 403, timeout=30,
             what="SubjectAccessReviews answered again (carol has no permission: 403)")
    assert kubectl_raw(cluster, path, "alice").returncode == 0


def test_label_values_reach_the_real_prometheus_exactly_as_written(tmp_path):
    """Escaped label values and pod regexes, as autoscaler/prom.py writes them, read back by a real Prometheus: a value
    full of quotes stays one string, a dot in a pod regex matches only a dot, no pods matches nothing (not even the
    empty value of a series without the label, which `^$` matches)."""
    from autoscaler.prom import escape_label_value, regex_alternation

    with PrometheusServer(tmp_path / "prometheus", targets=[]) as server:
        prom = Prometheus(server.url, timeout_s=10)

        def labels(promql: str) -> list[dict[str, str]]:
            return [s.labels for s in prom.query(promql)]

        for value in ('x",namespace!="', 'a\\', 'a\nb\tc\r', "naïve", '"} or up{job=~".+'):
            assert labels(f'label_replace(vector(1), "v", "{escape_label_value(value)}", "", "")') == [{"v": value}]

        def hit(pod: str, regex: str) -> bool:
            promql = (f'label_replace(label_replace(vector(1), "pod", "{escape_label_value(pod)}", "", ""), '
                      f'"hit", "yes", "pod", "{escape_label_value(regex)}")')
            return labels(promql)[0].get("hit") == "yes"

        pods = regex_alternation(["llm.v2-0", "llm.v2-1"])
        assert hit("llm.v2-0", pods) and hit("llm.v2-1", pods) and not hit("llmXv2-0", pods)
        assert not hit("", regex_alternation([])) and hit("", "^$")


def test_a_name_with_an_encoded_slash_gets_400_naming_the_field_and_is_not_reviewed(cluster, namespace, served):
    """A path whose namespace segment holds `%2F` and quotes: sent as the aggregator sends, our server reads the
    decoded names once, finds the namespace is not one, and answers 400 naming it without a SubjectAccessReview (on
    main the review read namespace {namespace}, pods, while the query ran on the whole decoded segment). Through
    kubectl and kube-apiserver the `%2F` arrives decoded, as more path segments, which no route serves: 404."""
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "queue-depth-reader"}, "rules": [
        {"apiGroups": [GROUP], "resources": ["pods/queue_depth"], "verbs": ["get"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "alice-reads-queue-depth"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "queue-depth-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]})
    good = f"/apis/{GROUP}/v1beta1/namespaces/{namespace}/pods/*/queue_depth"
    wait_for(lambda: kubectl_raw(cluster, good, "alice").returncode == 0, timeout=60, what="alice reading queue_depth")

    injected = "%2Fpods%2Fx%22,namespace!=%22%2Fqueue_depth"
    bad = f"/apis/{GROUP}/v1beta1/namespaces/{namespace}{injected}/pods/victim/queue_depth"
    reviews = len(served.reviewer.seen)
    code, status = as_the_aggregator(served, bad, "alice")
    assert code == 400 and status["reason"] == "BadRequest", status
    assert status["message"].startswith(f"namespace: '{namespace}/pods/x\",namespace!=\"/queue_depth' is not a "
                                        "DNS-1123 label"), status
    assert len(served.reviewer.seen) == reviews
    out = kubectl_raw(cluster, bad, "alice")
    assert out.returncode != 0 and "(Not Found)" in out.stderr and "MetricValueList" not in out.stdout, out
    assert kubectl_raw(cluster, good, "alice").returncode == 0

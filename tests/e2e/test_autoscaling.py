"""Queue-depth autoscaling end to end: a real Prometheus scrapes the load replayer, which plays inference servers on the
pods of a Deployment in the session's KWOK cluster.

(a) our controller scales the Deployment up under a burst and back down after it, holds through a hung Prometheus with
    a condition and an event that say why, and recovers;
(b) a stock autoscaling/v2 HPA reads our custom.metrics.k8s.io API (registered by APIServices, reached through an
    ExternalName Service on loopback) and scales up and down; `kubectl get --raw` returns a MetricValueList.

The controller and the metrics API run with tokens of the ServiceAccounts deploy/bases/autoscaler and
deploy/bases/custom-metrics-api grant (the test itself creates its fixtures as admin).

Time is compressed so the suite stays fast: 1 s scrapes, 3 s cold start, second-scale rate windows; the HPA keeps the
controller-manager's default 15 s sync, with a 0 s scale-down stabilization window set on the HPA object.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from autoscaler.config import AutoscalerConfig, ConfigError, MetricsApiConfig, parse
from autoscaler.controller import CONDITIONS_ANNOTATION, Controller, KubeTargets
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
from tests.deploy.manifests import DEPLOY

from .kube import registered_custom_metrics_api, wait_for

REPO = Path(__file__).resolve().parents[2]
AUTOSCALER = DEPLOY / "bases" / "autoscaler"
METRICS_API = DEPLOY / "bases" / "custom-metrics-api"
MODEL = ServiceModel(cold_start_s=3.0, scrape_interval_s=1.0)


def burst(quiet_s: float, burst_s: float, tail_s: float, rate: float, quiet_rate: float = 0.5) -> list[Arrival]:
    """quiet_rate req/s, then `rate` req/s for burst_s, then quiet again; each request runs 2 s (5000 + 20 tokens)."""
    out, t = [], 0.0
    for until, r in ((quiet_s, quiet_rate), (quiet_s + burst_s, rate), (quiet_s + burst_s + tail_s, quiet_rate)):
        while t < until:
            out.append(Arrival(t, 5000, 20))
            t += 1.0 / r
    return out


def end_burst(replayer: Replayer, api, namespace: str) -> Replayer:
    """End the burst when the test has seen what it waits for, not at a time fixed in the trace: the replayer is
    replaced on the same port (the same scrape target) by one playing the quiet rate to the same pods, which serve
    at once. What was queued goes with the old one; Prometheus's rate() takes the counters' reset."""
    port = replayer.port
    replayer.stop()
    quiet = burst(quiet_s=600, burst_s=0, tail_s=0, rate=1)
    return Replayer(api, namespace, "llm", quiet, model=MODEL, port=port, poll_s=0.25).start(warm=True)


@pytest.fixture(scope="module")
def autoscaler_kubeconfig(cluster):
    return cluster.service_account_kubeconfig(AUTOSCALER, "gpuaas-autoscaler")


@pytest.fixture(scope="module")
def autoscaler_api(autoscaler_kubeconfig):
    api = api_client(autoscaler_kubeconfig)
    yield api
    api.close()


@pytest.fixture(scope="module")
def metrics_api_api(cluster):
    api = api_client(cluster.service_account_kubeconfig(METRICS_API, "gpuaas-custom-metrics"))
    yield api
    api.close()


@pytest.fixture(scope="module")
def prom_ports():
    return [free_port(), free_port()]


@pytest.fixture(scope="module")
def prometheus(cluster, prom_ports, tmp_path_factory):
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"),
                              targets=[f"127.0.0.1:{p}" for p in prom_ports], scrape_interval="1s")
    server.start()
    yield server
    server.stop()


def replicas(api, ns, name) -> int:
    return client.AppsV1Api(api).read_namespaced_deployment_scale(name, ns).spec.replicas


def events(api, ns, name, component=None) -> list:
    items = client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector=f"involvedObject.kind=Deployment,involvedObject.name={name}").items
    return [e for e in items if component is None or (e.source and e.source.component == component)]


def controller_config(ns: str, url: str, **target) -> AutoscalerConfig:
    return parse(AutoscalerConfig, {
        "prometheus": {"url": url, "timeout_s": 1},
        "interval_s": 1,
        "targets": [{"deployment": "llm", "namespace": ns, "min_replicas": 1, "max_replicas": 8,
                     "cold_start_s": MODEL.cold_start_s, "scale_down_window_s": 8,
                     "windows": {"rate_window": "6s", "short_rate_window": "3s", "service_window": "10s"},
                     **target}]})


def test_bad_query_refused_at_start(autoscaler_api, prometheus, namespace):
    config = controller_config(namespace, prometheus.url, queries={"arrival_rate": "sum(rate(x[1m])"})
    controller = Controller(config, Prometheus(prometheus.url), KubeTargets(autoscaler_api))
    with pytest.raises(ConfigError, match=r"query arrival_rate: Prometheus rejected the query .*parse error"):
        controller.validate()
    down = Controller(controller_config(namespace, f"http://127.0.0.1:{free_port()}"),
                      Prometheus(f"http://127.0.0.1:{free_port()}"), KubeTargets(autoscaler_api))
    with pytest.raises(ConfigError, match="cannot reach Prometheus"):
        down.validate()


def test_autoscaler_command_once_dry_run(cluster, autoscaler_kubeconfig, prometheus, namespace, tmp_path):
    """`gpuaas autoscaler --once --dry-run` against the cluster: decides, records a DryRun event, changes nothing."""
    import subprocess
    import sys

    client.AppsV1Api(cluster.api).create_namespaced_deployment(namespace, gpu_deployment("llm", namespace, gpus=1,
                                                                                         replicas=3))
    config = tmp_path / "autoscaler.yaml"
    config.write_text(yaml.safe_dump({"prometheus": {"url": prometheus.url, "timeout_s": 2}, "targets": [
        {"deployment": "llm", "namespace": namespace, "min_replicas": 1, "max_replicas": 4}]}))
    out = subprocess.run([sys.executable, "-m", "gpuaas.cli", "autoscaler", "--config", str(config), "--kubeconfig",
                          str(autoscaler_kubeconfig), "--once", "--dry-run"], capture_output=True, text=True,
                         cwd=REPO, env={**__import__("os").environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert out.returncode == 0, out.stderr
    # No load at all: the arrival rate is 0, one replica would do, but nothing scrapes this Deployment's pods, so
    # the rate series is absent: metrics are unavailable and nothing is scaled down.
    assert f"{namespace}/llm: 3 (MetricsUnavailable)" in out.stdout, out.stdout
    assert replicas(cluster.api, namespace, "llm") == 3
    reasons = {e.reason for e in events(cluster.api, namespace, "llm", "gpuaas-autoscaler")}
    assert "MetricsUnavailable" in reasons


def test_controller_scales_up_and_down_and_holds_without_metrics(cluster, autoscaler_api, prometheus, prom_ports,
                                                                  namespace):
    api = cluster.api
    client.AppsV1Api(api).create_namespaced_deployment(namespace, gpu_deployment("llm", namespace, gpus=1))
    # 30 req/s x 2 s = 60 busy slots: 8 replicas' worth (8 slots each); before and after, 0.5 req/s needs one. The
    # burst lasts until the test ends it (end_burst), so a slow machine cannot see it end before the scale-up.
    trace = burst(quiet_s=8, burst_s=600, tail_s=0, rate=30)
    replayer = Replayer(api, namespace, "llm", trace, model=MODEL, port=prom_ports[0], poll_s=0.25).start()
    config = controller_config(namespace, prometheus.url)
    window_s = config.targets[0].scale_down_window_s
    controller = Controller(config, Prometheus(prometheus.url, timeout_s=1), KubeTargets(autoscaler_api))
    controller.validate()
    stop = threading.Event()
    loop = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    loop.start()
    try:
        wait_for(lambda: replicas(api, namespace, "llm") >= 5, timeout=180, what="scale-up under the burst")
        peak = replicas(api, namespace, "llm")
        ups = [e for e in events(api, namespace, "llm", "gpuaas-autoscaler") if e.reason == "ScaleUp"]
        assert ups and "arrival" in ups[0].message, ups
        # Hang Prometheus (SIGSTOP: connections open, no answers), then end the burst: the controller cannot see
        # the load fall, and must hold, say why in an event and a condition, and not scale down.
        prometheus.pause()
        try:
            replayer = end_burst(replayer, api, namespace)
            held = wait_for(lambda: [e for e in events(api, namespace, "llm", "gpuaas-autoscaler")
                                     if e.reason == "MetricsUnavailable"], timeout=60, what="MetricsUnavailable event")
            assert "no scale-down" in held[0].message
            before = replicas(api, namespace, "llm")
            assert before >= 2
            # Several syncs, over longer than the scale-down window: replicas seen at each poll meanwhile.
            seen, syncs, since = [], controller.syncs, time.monotonic()
            wait_for(lambda: seen.append(replicas(api, namespace, "llm")) or (
                controller.syncs >= syncs + 3 and time.monotonic() - since > window_s + 2),
                timeout=120, what=f"3 syncs and {window_s + 2:g} s without metrics")
            assert set(seen) == {before}, seen
            dep = client.AppsV1Api(api).read_namespaced_deployment("llm", namespace)
            conditions = {c["type"]: c for c in json.loads(dep.metadata.annotations[CONDITIONS_ANNOTATION])}
            assert conditions["ScalingActive"]["status"] == "False"
            assert conditions["ScalingActive"]["reason"] == "MetricsUnavailable"
            assert "did not answer within 1s" in conditions["ScalingActive"]["message"]
        finally:
            prometheus.resume()
        wait_for(lambda: replicas(api, namespace, "llm") == 1, timeout=120, what="scale-down after the burst")
        # The event follows the scale in the controller's thread: wait for it rather than race it.
        wanted = {"ScaleUp", "ScaleDown", "MetricsUnavailable", "MetricsRecovered"}
        wait_for(lambda: wanted <= {e.reason for e in events(api, namespace, "llm", "gpuaas-autoscaler")},
                 timeout=30, what=f"events {sorted(wanted)}")
        dep = client.AppsV1Api(api).read_namespaced_deployment("llm", namespace)
        conditions = {c["type"]: c for c in json.loads(dep.metadata.annotations[CONDITIONS_ANNOTATION])}
        assert conditions["ScalingActive"]["status"] == "True"
        print(f"controller: peak {peak} replicas")
    finally:
        stop.set()
        loop.join(timeout=10)
        replayer.stop()


@pytest.fixture
def metrics_api(cluster, metrics_api_api, prometheus, namespace):
    """Our custom.metrics.k8s.io server on loopback, with authorization on as `gpuaas metrics-api` runs it, registered
    for v1beta1 and v1beta2 by the APIServices deploy/ ships."""
    pki = cluster.control_plane.pki
    cert, key = issue_serving_cert(pki, "custom-metrics", "gpuaas-custom-metrics",
                                   names=(f"gpuaas-custom-metrics.{namespace}.svc", "localhost"), ips=("127.0.0.1",))
    config = parse(MetricsApiConfig, {"prometheus": {"url": prometheus.url, "timeout_s": 2}})
    backend = Backend(config, Prometheus(prometheus.url, timeout_s=2), KubePods(metrics_api_api))
    server = MetricsApiServer(init_app(backend, config.allowed_client_names,
                                       Authorizer(KubeAccessReviewer(metrics_api_api))),
                              host="127.0.0.1", port=0,
                              ssl_context=server_ssl_context(str(cert), str(key), str(pki.front_proxy_ca_cert)))
    server.start()
    try:
        with registered_custom_metrics_api(cluster, namespace, server.port, METRICS_API / "apiservices.yaml") as names:
            assert sorted(names) == ["v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io"]
            yield server
    finally:
        server.stop()


def test_stock_hpa_scales_on_our_custom_metrics(cluster, prometheus, prom_ports, namespace, metrics_api):
    api = cluster.api
    client.AppsV1Api(api).create_namespaced_deployment(namespace, gpu_deployment("llm", namespace, gpus=1))
    trace = burst(quiet_s=5, burst_s=600, tail_s=0, rate=30)  # until end_burst
    replayer = Replayer(api, namespace, "llm", trace, model=MODEL, port=prom_ports[1], poll_s=0.25).start()
    try:
        raw = wait_for(lambda: _raw(cluster, f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/*/"
                                             "queue_depth"), timeout=30, what="a pod in the MetricValueList")
        assert raw["kind"] == "MetricValueList" and raw["apiVersion"] == "custom.metrics.k8s.io/v1beta1"
        assert raw["items"][0]["describedObject"]["kind"] == "Pod" and "metricName" in raw["items"][0]
        v2 = _raw(cluster, f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/deployments.apps/llm/"
                           "queue_depth", need_items=False)
        assert v2["items"][0]["metric"]["name"] == "queue_depth"
        client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(namespace, {
            "metadata": {"name": "llm"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
                     "minReplicas": 1, "maxReplicas": 6,
                     "metrics": [{"type": "Pods", "pods": {"metric": {"name": "queue_depth"},
                                                           "target": {"type": "AverageValue", "averageValue": "2"}}}],
                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}})
        wait_for(lambda: replicas(api, namespace, "llm") >= 2, timeout=180, what="the HPA scaling up")
        hpa = client.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler("llm", namespace)
        assert hpa.status.current_metrics and hpa.status.current_metrics[0].pods.metric.name == "queue_depth"
        replayer = end_burst(replayer, api, namespace)
        wait_for(lambda: replicas(api, namespace, "llm") == 1, timeout=180, what="the HPA scaling back down")
    finally:
        replayer.stop()


def _raw(cluster, path: str, need_items: bool = True):
    out = cluster.control_plane.kubectl("get", "--raw", path, check=False)
    if out.returncode != 0:
        return None
    body = json.loads(out.stdout)
    return body if body.get("items") or not need_items else None

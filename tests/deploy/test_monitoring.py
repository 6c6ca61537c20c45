"""The Prometheus scrape jobs and the Grafana dashboard deploy/ ships.

Scrape jobs: a real Prometheus runs their relabelling over the pods of the shipped Deployments and over inference pods.
Debian's Prometheus is built without Kubernetes service discovery, so the test plays that part: it hands Prometheus,
through file_sd, the targets and `__meta_kubernetes_pod_*` labels that `kubernetes_sd_configs` with `role: pod`
produces (one target per container port, as the Prometheus documentation describes them); everything after discovery
is Prometheus's own doing. Pod IPs are loopback addresses, so the scrapes that follow stay on this machine.

Dashboard: every series a panel reads is one our components export (or, for vLLM's, one the autoscaler reads), every
metric the extender, the nodescaler, the gang controller and the autoscaler export is on a panel, and every expression
parses (promtool).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request

import certifi
import pytest
import yaml

from autoscaler.config import DEFAULT_QUERIES, MetricsApiConfig
from autoscaler.metrics import Metrics as AutoscalerMetrics
from extender.metrics import Metrics as ExtenderMetrics
from gangs.metrics import Metrics as GangsMetrics
from gangs.webhook import webhook_app
from gpuaas.cluster.prometheus import PrometheusServer
from gpuaas.loadgen.replayer import render_metrics
from gpuaas.loadgen.serving import ServiceModel, ServingSystem
from gpuaas.loadgen.trace import Arrival
from nodescaler.metrics import Metrics as NodescalerMetrics

from .manifests import DEPLOY, NAMESPACE, named, objects, render

PROMETHEUS = DEPLOY / "bases" / "prometheus"
GRAFANA = DEPLOY / "bases" / "grafana"


def shipped_scrape_configs() -> list[dict]:
    [configmap] = objects(PROMETHEUS, "ConfigMap")
    return yaml.safe_load(configmap["data"]["gpuaas-scrape-configs.yaml"])["scrape_configs"]


def sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_sd_targets(pod: dict) -> list[dict]:
    """What Kubernetes SD (role: pod) reports for `pod`: a target per declared container port, and one holding the
    bare pod IP for a container without ports."""
    meta, ip = pod["metadata"], pod["status"]["podIP"]
    common = {"__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_pod_name": meta["name"],
              "__meta_kubernetes_pod_ip": ip, "__meta_kubernetes_pod_phase": pod["status"]["phase"]}
    for kind in ("label", "annotation"):
        for key, value in (meta.get(f"{kind}s") or {}).items():
            common[f"__meta_kubernetes_pod_{kind}_{sanitize(key)}"] = value
            common[f"__meta_kubernetes_pod_{kind}present_{sanitize(key)}"] = "true"
    groups = []
    for c in pod["spec"]["containers"]:
        labels = {**common, "__meta_kubernetes_pod_container_name": c["name"]}
        for port in c.get("ports") or []:
            groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": {
                **labels, "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP")}})
        if not c.get("ports"):
            groups.append({"targets": [ip], "labels": labels})
    return groups


def pod_of(deployment: dict, name: str, ip: str, phase: str = "Running") -> dict:
    template = deployment["spec"]["template"]
    return {"metadata": {**template["metadata"], "name": name, "namespace": deployment["metadata"]["namespace"]},
            "spec": template["spec"], "status": {"podIP": ip, "phase": phase}}


def inference_pod(name: str, namespace: str, ip: str, annotations: dict, phase: str = "Running") -> dict:
    return {"metadata": {"name": name, "namespace": namespace, "labels": {"app": "llm"}, "annotations": annotations},
            "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8000},
                                                               {"name": "grpc", "containerPort": 9000}]},
                                    {"name": "sidecar"}]},
            "status": {"podIP": ip, "phase": phase}}


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """Prometheus's active targets per job, after the shipped relabelling of these pods."""
    everything = DEPLOY / "overlays" / "all"
    extender = named(everything, "Deployment", "gpuaas-extender")
    nodescaler = named(everything, "Deployment", "gpuaas-nodescaler")
    gangs = named(everything, "Deployment", "gpuaas-gangs")
    autoscaler = named(everything, "Deployment", "gpuaas-autoscaler")
    scrape = {"gpuaas.io/scrape": "true"}
    pods = [
        pod_of(extender, "gpuaas-extender-a", "127.0.0.2"),
        pod_of(nodescaler, "gpuaas-nodescaler-a", "127.0.0.3"),
        pod_of(nodescaler, "gpuaas-nodescaler-b", "127.0.0.4"),
        pod_of(nodescaler, "gpuaas-nodescaler-c", "127.0.0.5", phase="Pending"),
        pod_of(gangs, "gpuaas-gangs-a", "127.0.0.12"),
        pod_of(gangs, "gpuaas-gangs-b", "127.0.0.13"),
        pod_of(autoscaler, "gpuaas-autoscaler-a", "127.0.0.14"),
        pod_of(autoscaler, "gpuaas-autoscaler-b", "127.0.0.15", phase="Pending"),
        inference_pod("llm-a", "inference", "127.0.0.6", {**scrape, "gpuaas.io/metrics-port": "8000"}),
        inference_pod("llm-b", "team-b", "127.0.0.7", {**scrape, "gpuaas.io/metrics-port": "8001",
                                                       "gpuaas.io/metrics-path": "/stats"}),
        inference_pod("llm-no-port", "inference", "127.0.0.8", scrape),
        inference_pod("llm-not-opted-in", "inference", "127.0.0.9", {"gpuaas.io/metrics-port": "8000"}),
        inference_pod("llm-pending", "inference", "127.0.0.10", {**scrape, "gpuaas.io/metrics-port": "8000"},
                      phase="Pending"),
        inference_pod("gpuaas-extender-b", "team-b", "127.0.0.11", {}),  # looks like ours by name only
    ]
    workdir = tmp_path_factory.mktemp("prometheus-sd")
    jobs = []
    for job in shipped_scrape_configs():
        [sd] = job.pop("kubernetes_sd_configs")
        assert sd["role"] == "pod"
        namespaces = (sd.get("namespaces") or {}).get("names")
        groups = [g for p in pods if not namespaces or p["metadata"]["namespace"] in namespaces
                  for g in pod_sd_targets(p)]
        sd_file = workdir / f"{job['job_name']}.json"
        sd_file.write_text(json.dumps(groups))
        job["file_sd_configs"] = [{"files": [str(sd_file)]}]
        if "tls_config" in job:
            job["tls_config"]["ca_file"] = certifi.where()  # a CA file that exists here
        job["scrape_interval"] = "1h"  # discovery is what is tested, not the scrapes
        jobs.append(job)
    server = PrometheusServer(workdir, targets=[], scrape_configs=jobs).start()
    try:
        def active():
            with urllib.request.urlopen(f"{server.url}/api/v1/targets?state=active", timeout=5) as resp:
                return json.load(resp)["data"]["activeTargets"]
        deadline = time.monotonic() + 30
        found = active()
        while len(found) < 8 and time.monotonic() < deadline:
            time.sleep(0.2)
            found = active()
        by_job: dict[str, list] = {}
        for t in found:
            by_job.setdefault(t["labels"]["job"], []).append(t)
        yield by_job
    finally:
        server.stop()


def summary(targets: list[dict]) -> list[tuple[str, str, str]]:
    return sorted((t["labels"]["namespace"], t["labels"]["pod"], t["scrapeUrl"]) for t in targets)


def test_extender_job_scrapes_each_running_extender_pod_over_https(targets):
    assert summary(targets["gpuaas-extender"]) == [(NAMESPACE, "gpuaas-extender-a", "https://127.0.0.2:8888/metrics")]


def test_nodescaler_job_scrapes_every_running_replica_on_its_metrics_port(targets):
    assert summary(targets["gpuaas-nodescaler"]) == [
        (NAMESPACE, "gpuaas-nodescaler-a", "http://127.0.0.3:8090/metrics"),
        (NAMESPACE, "gpuaas-nodescaler-b", "http://127.0.0.4:8090/metrics")]


def test_gangs_job_scrapes_every_gang_controller_replica_on_its_metrics_port(targets):
    assert summary(targets["gpuaas-gangs"]) == [
        (NAMESPACE, "gpuaas-gangs-a", "http://127.0.0.12:8091/metrics"),
        (NAMESPACE, "gpuaas-gangs-b", "http://127.0.0.13:8091/metrics")]


def test_autoscaler_job_scrapes_every_running_replica_on_its_metrics_port(targets):
    assert summary(targets["gpuaas-autoscaler"]) == [
        (NAMESPACE, "gpuaas-autoscaler-a", "http://127.0.0.14:8091/metrics")]


def test_inference_job_scrapes_opted_in_running_pods_at_their_port_and_path(targets):
    assert summary(targets["gpuaas-inference"]) == [
        ("inference", "llm-a", "http://127.0.0.6:8000/metrics"),
        ("team-b", "llm-b", "http://127.0.0.7:8001/stats")]
    assert set(targets) == {"gpuaas-extender", "gpuaas-nodescaler", "gpuaas-gangs", "gpuaas-autoscaler",
                            "gpuaas-inference"}


# ---- the dashboard ----------------------------------------------------------------------------------------------
SERIES = re.compile(r"\b(gpuaas_[a-z_]+|vllm:[a-z_:]+)")


def dashboard() -> dict:
    [configmap] = objects(GRAFANA, "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    [(name, text)] = configmap["data"].items()
    assert name.endswith(".json")
    return json.loads(text)


def expressions() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] if p["type"] != "row" for t in p["targets"]]


def exported(registry) -> set[str]:
    """The sample names a prometheus_client registry exposes (histograms: _bucket, _count, _sum; counters: _total)."""
    out = set()
    for family in registry.collect():
        out |= {"histogram": {f"{family.name}_bucket", f"{family.name}_count", f"{family.name}_sum"},
                "counter": {f"{family.name}_total"}}.get(family.type, {family.name})
    return out


def gateway_and_vllm_series() -> set[str]:
    """What the load replayer exports per pod and for the gateway, as vLLM and the gpuaas gateway would."""
    system = ServingSystem(ServiceModel(cold_start_s=0), [Arrival(0.0, 10, 1)])
    system.add_replica("p", now=0.0)
    system.advance(1.0)
    text = render_metrics(system, "ns", "llm")
    return {line.split("{")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_every_dashboard_series_is_one_gpuaas_exports_or_reads():
    gangs = GangsMetrics()
    webhook_app(gangs.registry)  # the webhook's metrics go on the controller's registry, as gangs/service.py does
    ours = exported(ExtenderMetrics().registry) | exported(NodescalerMetrics().registry) | \
        exported(gangs.registry) | exported(AutoscalerMetrics().registry)
    read_by_autoscaling = set(SERIES.findall(" ".join(DEFAULT_QUERIES.values()))) | {
        m.series for m in MetricsApiConfig().metrics}
    known = ours | (gateway_and_vllm_series() & (read_by_autoscaling | {"vllm:num_requests_running"}))
    used = {s for e in expressions() for s in SERIES.findall(e)}
    assert used - known == set()
    # ... and the extender's, the nodescaler's, the gang controller's and the autoscaler's own metrics are all on it.
    families = {re.sub(r"_(bucket|count|sum|total)$", "", s) for s in ours}
    assert families - {re.sub(r"_(bucket|count|sum|total)$", "", s) for s in used} == set()


def test_every_dashboard_expression_parses(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup.sh installs it with Debian's prometheus"
    # Grafana substitutes $__rate_interval; promtool parses the rest as recording rules.
    rules = {"groups": [{"name": "gpuaas-dashboard", "rules": [
        {"record": f"gpuaas:panel_{i}", "expr": e.replace("$__rate_interval", "5m")}
        for i, e in enumerate(expressions())]}]}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_panels_have_unique_ids_and_a_prometheus_datasource():
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and board["uid"] == "gpuaas"
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
    assert all(t["datasource"]["uid"] == "${datasource}" for p in board["panels"] if p["type"] != "row"
               for t in p["targets"])
    assert render(DEPLOY / "overlays" / "monitoring")

"""Idle GPUs end to end: a real Prometheus scrapes the local cluster's dcgm-exporter stand-in (gpuaas/loadgen/dcgm.py)
and the autoscaler's /metrics; `gpuaas report idle` and the autoscaler read the same series.

The seeded scenario, in the test's namespace: a Deployment of two replicas using 70 % of one GPU each, a Job using
90 % of one GPU, a Job holding two GPUs at 1 % (the idle one), and a bare pod holding a GPU with no series (no
dcgm-exporter on its node). Kubernetes' own controllers make the ReplicaSet and Job pods, so the owner chain is
real. The report names the idle Job and neither busy workload; the autoscaler, run as `gpuaas autoscaler` runs it
(AutoscalerService, the shipped ServiceAccount), exports it as gpuaas_autoscaler_idle_gpus, which Prometheus scrapes,
and records IdleGPUs on the Job once.
"""
from __future__ import annotations

import contextlib
import io
import json
import threading
import time

import pytest
from kubernetes import client

from autoscaler.config import AutoscalerConfig, parse
from autoscaler.service import AutoscalerService
from gpuaas.cli import main
from gpuaas.cluster.process import free_port
from gpuaas.cluster.prometheus import PrometheusServer
from gpuaas.loadgen.dcgm import UTILIZATION_ANNOTATION, DcgmExporter
from gpuaas.workloads import gpu_deployment, gpu_pod, pod_template
from tests.deploy.manifests import DEPLOY

from .kube import wait_for

WINDOW = "8s"


def job(name: str, namespace: str, *, gpus: int, use: float) -> dict:
    template = pod_template(labels={"app": name}, annotations={UTILIZATION_ANNOTATION: str(use)}, gpus=gpus)
    template["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
            "spec": {"backoffLimit": 0, "template": template}}


def report_idle(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["report", "idle", *args])
    return code, out.getvalue()


def prom_query(url: str, promql: str) -> list[dict]:
    import urllib.parse
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5) as r:
        return json.load(r)["data"]["result"]


@pytest.fixture
def scenario(cluster, namespace):
    api = cluster.api
    web = gpu_deployment("web", namespace, replicas=2, gpus=1)
    web["spec"]["template"]["metadata"]["annotations"] = {UTILIZATION_ANNOTATION: "0.7"}
    client.AppsV1Api(api).create_namespaced_deployment(namespace, web)
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job(namespace, job("train-busy", namespace, gpus=1, use=0.9))
    batch.create_namespaced_job(namespace, job("train-idle", namespace, gpus=2, use=0.01))
    client.CoreV1Api(api).create_namespaced_pod(namespace, gpu_pod("dark", namespace, gpus=1))

    def running():
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace).items
        return len([p for p in pods if p.status.phase == "Running"]) == 5
    wait_for(running, timeout=90, what="5 GPU pods running")
    return namespace


def test_report_names_the_idle_job_and_the_autoscaler_exports_it(cluster, scenario, tmp_path):
    namespace = scenario
    kubeconfig = cluster.service_account_kubeconfig(DEPLOY / "bases" / "autoscaler", "gpuaas-autoscaler")
    dcgm = DcgmExporter(cluster.api, poll_s=0.5).start()
    autoscaler_port = free_port()
    prometheus = PrometheusServer(tmp_path / "prometheus", scrape_interval="1s",
                                  targets=[f"127.0.0.1:{dcgm.port}", f"127.0.0.1:{autoscaler_port}"]).start()
    stop = threading.Event()
    service_thread = None
    try:
        # Series for the window: a few scrapes of every pod.
        wait_for(lambda: len(prom_query(prometheus.url, f'DCGM_FI_DEV_GPU_UTIL{{namespace="{namespace}"}}')) == 5,
                 timeout=30, what="the dcgm series of the 4 measured pods (5 GPUs)")
        time.sleep(4)

        code, out = report_idle("--prometheus", prometheus.url, "--kubeconfig", str(kubeconfig), "--namespace",
                                namespace, "--window", WINDOW, "--min-age", "0", "--json")
        assert code == 0, out
        report = json.loads(out)
        assert [(w["kind"], w["name"], w["gpus"]) for w in report["workloads"]] == [("Job", "train-idle", 2)]
        assert report["workloads"][0]["utilization"] == pytest.approx(0.01, abs=0.005)
        assert sorted(report["busy"]) == [f"{namespace}/deployment/web", f"{namespace}/job/train-busy"]
        assert report["unmeasured"] == [f"{namespace}/dark"]

        code, text = report_idle("--prometheus", prometheus.url, "--kubeconfig", str(kubeconfig), "--namespace",
                                 namespace, "--window", WINDOW, "--min-age", "0")
        assert code == 0 and f"{namespace}/job/train-idle" in text and "web" not in text.split("busy:")[0], text

        # The autoscaler, as `gpuaas autoscaler` runs it, with the shipped ServiceAccount.
        config = parse(AutoscalerConfig, {
            "prometheus": {"url": prometheus.url, "timeout_s": 2}, "interval_s": 1, "dry_run": True,
            "leader_election": {"enabled": False},
            "idle_gpus": {"interval_s": 1, "window_s": 8, "min_age_s": 0},
            "targets": [{"deployment": "web", "namespace": namespace}]})
        service = AutoscalerService(config, str(kubeconfig))
        service_thread = threading.Thread(target=service.run, args=(stop,),
                                          kwargs={"host": "127.0.0.1", "port": autoscaler_port}, daemon=True)
        service_thread.start()
        series = wait_for(lambda: prom_query(prometheus.url, f'gpuaas_autoscaler_idle_gpus{{namespace="{namespace}"}}'),
                          timeout=30, what="gpuaas_autoscaler_idle_gpus scraped")
        assert [(s["metric"]["kind"], s["metric"]["name"], s["value"][1]) for s in series] == [
            ("Job", "train-idle", "2")]
        assert prom_query(prometheus.url, "gpuaas_autoscaler_leader")[0]["value"][1] == "1"

        def idle_events():
            items = client.CoreV1Api(cluster.api).list_namespaced_event(
                namespace, field_selector="involvedObject.kind=Job,involvedObject.name=train-idle").items
            return [e for e in items if e.reason == "IdleGPUs" and e.source.component == "gpuaas-autoscaler"]
        [event] = wait_for(idle_events, timeout=20, what="IdleGPUs event on Job train-idle")
        assert "holds 2 GPU(s)" in event.message and event.type == "Warning"
        def looks() -> float:
            return service.metrics.registry.get_sample_value("gpuaas_autoscaler_idle_checks_total",
                                                             {"result": "ok"}) or 0.0
        seen = looks()
        wait_for(lambda: looks() >= seen + 3, timeout=30, what="three more looks")
        assert len(idle_events()) == 1  # only when it changes
        others = client.CoreV1Api(cluster.api).list_namespaced_event(
            namespace, field_selector="reason=IdleGPUs").items
        assert {e.involved_object.name for e in others} == {"train-idle"}
    finally:
        stop.set()
        if service_thread is not None:
            service_thread.join(timeout=15)
        prometheus.stop()
        dcgm.stop()

"""The manifests in deploy/ start our commands with arguments the CLI accepts and configs that validate."""
from pathlib import Path

import pytest
import yaml

from autoscaler.config import AutoscalerConfig, MetricsApiConfig, parse
from gpuaas.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def docs(name):
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


@pytest.mark.parametrize("name, model", [("autoscaler.yaml", AutoscalerConfig),
                                         ("custom-metrics-api.yaml", MetricsApiConfig)])
def test_manifest_args_and_config(name, model):
    objs = docs(name)
    deployment = next(d for d in objs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed = build_parser().parse_args(args)
    assert parsed.func
    config = next(d for d in objs if d["kind"] == "ConfigMap")["data"]["config.yaml"]
    parse(model, yaml.safe_load(config), name)


def test_apiservices_claim_only_custom_metrics():
    services = [d for d in docs("custom-metrics-api.yaml") if d["kind"] == "APIService"]
    assert {(s["spec"]["group"], s["spec"]["version"]) for s in services} == {
        ("custom.metrics.k8s.io", "v1beta1"), ("custom.metrics.k8s.io", "v1beta2")}
    svc = next(d for d in docs("custom-metrics-api.yaml") if d["kind"] == "Service")
    assert all(s["spec"]["service"]["name"] == svc["metadata"]["name"] for s in services)

"""The Helm chart is the kustomize deploy/ tree with values: it is what its generator writes, it lints, and for every
overlay some values make it render the same objects; each value lands where it says. What the apiserver thinks of it
is in tests/e2e/test_helm.py."""
from __future__ import annotations

import json
import tomllib

import pytest
import yaml

from gpuaas.helmchart import (
    CHART,
    COMPONENTS,
    Component,
    component_template,
    generate,
    generated_configmap_names,
    stale,
    strip_hash_suffixes,
)

from .chart import helm, template, template_text
from .manifests import DEPLOY, NAMESPACE, REPO, kustomize_dirs, render
from .test_manifests import LOADERS, gpuaas_containers

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
BY_BASE = {c.base: c for c in COMPONENTS}
GENERATED_CONFIGMAPS = [n for c in COMPONENTS
                        for n in generated_configmap_names(
                            yaml.safe_load((DEPLOY / "bases" / c.base / "kustomization.yaml").read_text()))]


def switches(bases: set[str]) -> dict:
    """Values that render exactly these bases."""
    return {c.values: {c.switch: c.base in bases} for c in COMPONENTS}


def overlay_bases(overlay) -> set[str]:
    resources = yaml.safe_load((overlay / "kustomization.yaml").read_text())["resources"]
    return {(overlay / r).resolve().name for r in resources}


def identity(obj) -> tuple:
    return obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]


def normalized_kustomize(objs) -> dict[tuple, dict]:
    """kustomize's output without the content hashes in generated ConfigMap names (the chart rolls pods with a
    checksum annotation instead), with config files parsed (the chart writes them from values)."""
    return {identity(o): _parsed_data(o) for o in strip_hash_suffixes(objs, GENERATED_CONFIGMAPS)}


def normalized_chart(objs) -> dict[tuple, dict]:
    out = {}
    for obj in objs:
        if obj["kind"] == "Deployment":
            meta = obj["spec"]["template"]["metadata"]
            annotations = {k: v for k, v in meta.pop("annotations", {}).items() if not k.startswith("checksum/")}
            if annotations:
                meta["annotations"] = annotations
        out[identity(obj)] = _parsed_data(obj)
    return out


def _parsed_data(obj):
    if obj["kind"] == "ConfigMap":
        obj["data"] = {k: yaml.safe_load(v) if k.endswith((".yaml", ".json")) else v for k, v in obj["data"].items()}
    return obj


def assert_same_objects(chart: dict, kustomize: dict) -> None:
    assert sorted(chart, key=str) == sorted(kustomize, key=str)
    for key in kustomize:
        assert chart[key] == kustomize[key], f"{key} differs"


def test_the_chart_is_what_the_generator_writes():
    outdated = stale(generate())
    assert not outdated, "stale, regenerate with `python -m gpuaas.helmchart`: " + ", ".join(
        str(p.relative_to(REPO)) for p in outdated)


def test_every_base_is_a_component_and_the_version_follows_the_project():
    assert {p.name for p in kustomize_dirs("bases")} == set(BY_BASE)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION


def without(base: str) -> dict:
    """Values that switch one component off, and what cannot run without it."""
    values = BY_BASE[base].values
    return {c.values: {c.switch: False} for c in COMPONENTS
            if c.base == base or (c.requires and c.requires[0] == values)}


# Each component toggled from its default (the Namespace is off by default, the rest on).
TOGGLES = {"namespace-created": {"namespace": {"create": True}}} | {
    f"without-{b}": without(b) for b in BY_BASE if b != "namespace"}


@pytest.mark.parametrize("values", [{}, *TOGGLES.values()], ids=["defaults", *TOGGLES])
def test_lints(values):
    result = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--values", "-", input=json.dumps(values))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("overlay", kustomize_dirs("overlays"), ids=lambda p: p.name)
def test_each_overlay_is_the_chart_with_its_components_switched_on(overlay):
    bases = overlay_bases(overlay)
    assert bases <= set(BY_BASE), f"{overlay.name} uses a base the chart has no switch for"
    assert_same_objects(normalized_chart(template(switches(bases))), normalized_kustomize(render(overlay)))


def test_default_values_render_the_all_overlay_without_the_namespace():
    expected = normalized_kustomize(render(DEPLOY / "overlays" / "all"))
    del expected[("Namespace", None, NAMESPACE)]  # namespace.create is off by default: helm needs it beforehand
    assert_same_objects(normalized_chart(template()), expected)


@pytest.mark.parametrize("toggle", TOGGLES)
def test_toggling_a_component_adds_or_removes_its_objects_and_nothing_else(toggle):
    values = TOGGLES[toggle]
    toggled = {c.base for c in COMPONENTS if c.values in values}
    own = {key for b in toggled for key in normalized_kustomize(render(DEPLOY / "bases" / b))}
    default, changed = set(normalized_chart(template())), set(normalized_chart(template(values)))
    assert own and default ^ changed == own


def test_a_second_scheduler_without_the_extender_is_refused_with_the_reason():
    result = helm("template", "gpuaas", str(CHART), "--set", "extender.enabled=false", check=False)
    assert result.returncode != 0
    assert "secondScheduler.enabled needs extender.enabled" in result.stderr


def test_the_image_values_reach_every_gpuaas_container():
    objs = template({"image": {"repository": "registry.example.com/gpuaas", "tag": "1.2.3", "pullPolicy": "Always"},
                     "secondScheduler": {"image": "registry.example.com/kube-scheduler:v1.36.3"}})
    containers = [c for d in objs if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]]
    gpuaas = [c for c in containers if c["name"] != "kube-scheduler"]
    assert len(gpuaas) == 5
    assert {(c["image"], c["imagePullPolicy"]) for c in gpuaas} == {("registry.example.com/gpuaas:1.2.3", "Always")}
    assert [c["image"] for c in containers if c["name"] == "kube-scheduler"] == [
        "registry.example.com/kube-scheduler:v1.36.3"]
    assert {c["image"] for _, c in gpuaas_containers(template())} == {f"gpuaas:{VERSION}"}


def test_another_release_namespace_replaces_gpuaas_system_everywhere():
    objs = template({"namespace": {"create": True}}, namespace="gpu-platform")
    text = template_text({"namespace": {"create": True}}, namespace="gpu-platform")
    assert NAMESPACE not in text
    assert ("Namespace", None, "gpu-platform") in {identity(o) for o in objs}
    configmaps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    nodescaler = yaml.safe_load(configmaps["gpuaas-nodescaler-config"]["data"]["nodescaler.yaml"])
    assert nodescaler["leader_election"] == {"namespace": "gpu-platform", "name": "gpuaas-nodescaler"}
    scheduler = yaml.safe_load(configmaps["gpuaas-scheduler-config"]["data"]["scheduler-config.yaml"])
    assert scheduler["extenders"][0]["urlPrefix"] == "https://gpuaas-extender.gpu-platform.svc:443"
    assert scheduler["leaderElection"]["resourceNamespace"] == "gpu-platform"
    assert {o["metadata"]["namespace"] for o in configmaps.values()} == {"gpu-platform", "monitoring"}


def deployment(objs, name):
    return next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name)


def test_a_config_value_is_merged_into_the_shipped_config_loads_and_rolls_the_pods(tmp_path):
    default, changed = template(), template({"extender": {"config": {"log_level": "DEBUG"}}})
    configs = {o["metadata"]["name"]: o["data"] for o in changed if o["kind"] == "ConfigMap"}
    extender = yaml.safe_load(configs["gpuaas-extender-config"]["extender.yaml"])
    shipped = yaml.safe_load((DEPLOY / "bases" / "extender" / "extender-config.yaml").read_text())
    assert extender == {**shipped, "log_level": "DEBUG"}
    path = tmp_path / "extender.yaml"
    path.write_text(configs["gpuaas-extender-config"]["extender.yaml"])
    assert LOADERS["extender"](path).log_level == "DEBUG"

    def checksums(objs, name):
        return deployment(objs, name)["spec"]["template"]["metadata"]["annotations"]
    assert checksums(changed, "gpuaas-extender") != checksums(default, "gpuaas-extender")
    assert checksums(changed, "gpuaas-autoscaler") == checksums(default, "gpuaas-autoscaler")


def test_every_rendered_config_loads_with_its_command_loader(tmp_path):
    objs = template()
    configmaps = {o["metadata"]["name"]: o["data"] for o in objs if o["kind"] == "ConfigMap"}
    loaded = set()
    for d, container in gpuaas_containers(objs):
        args = container["args"]
        config = args[args.index("--config") + 1]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == config)
        volume = next(v for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        path = tmp_path / f"{args[0]}.yaml"
        path.write_text(configmaps[volume["configMap"]["name"]][mount["subPath"]])
        LOADERS[args[0]](path)
        loaded.add(args[0])
    assert loaded == set(LOADERS)


def test_scheduling_values_reach_the_pods():
    toleration = {"key": "gpuaas.io/system", "operator": "Exists", "effect": "NoSchedule"}
    objs = template({"nodescaler": {"replicas": 3, "resources": {"requests": {"cpu": "2"}},
                                    "nodeSelector": {"pool": "system"}, "tolerations": [toleration]},
                     "secondScheduler": {"replicas": 1}})
    nodescaler = deployment(objs, "gpuaas-nodescaler")
    pod = nodescaler["spec"]["template"]["spec"]
    assert nodescaler["spec"]["replicas"] == 3
    # helm merges a map value into the default: the memory request and limit stay
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    assert pod["nodeSelector"] == {"pool": "system"} and pod["tolerations"] == [toleration]
    assert deployment(objs, "gpuaas-scheduler")["spec"]["replicas"] == 1
    assert "nodeSelector" not in deployment(objs, "gpuaas-extender")["spec"]["template"]["spec"]


def test_metrics_api_certificates_and_apiservice_annotations():
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    inject = {"cert-manager.io/inject-ca-from": "gpuaas-system/gpuaas-custom-metrics"}
    objs = template({"metricsApi": {"frontProxyCA": pem, "apiService": {"caBundle": "Q0E=", "annotations": inject}}})
    configmap = next(o for o in objs if o["metadata"]["name"] == "gpuaas-custom-metrics-config")
    assert configmap["data"]["front-proxy-ca.crt"] == pem
    services = [o for o in objs if o["kind"] == "APIService"]
    assert len(services) == 2
    assert all(s["spec"]["caBundle"] == "Q0E=" and s["metadata"]["annotations"] == inject for s in services)


def value_paths(values: dict, prefix: str = "") -> list[str]:
    """The values a user sets, down to the maps that are passed through whole (configs, resources, ...)."""
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        passed_through = key in ("config", "resources", "nodeSelector", "tolerations", "annotations")
        out += value_paths(value, path + ".") if isinstance(value, dict) and not passed_through else [path]
    return out


def test_the_readme_documents_every_value():
    readme = (CHART / "README.md").read_text()
    paths = value_paths(yaml.safe_load((CHART / "values.yaml").read_text()))
    assert len(paths) > 30
    assert [p for p in paths if f"`{p}`" not in readme] == []


def test_literal_braces_in_a_base_survive_the_template(tmp_path):
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "s", "namespace": NAMESPACE, "annotations": {"note": "{{ not an action }}"}},
               "spec": {"ports": [{"port": 80}]}}
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: t\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("t: {enabled: true}\n")
    (chart / "templates" / "t.yaml").write_text(component_template(Component("t", "t"), [service]).template)
    out = helm("template", "t", str(chart), "--namespace", "elsewhere").stdout
    [rendered] = [d for d in yaml.safe_load_all(out) if d]
    assert rendered["metadata"] == {"name": "s", "namespace": "elsewhere",
                                    "annotations": {"note": "{{ not an action }}"}}


def test_gangs_webhook_ca_bundle_and_annotations_reach_every_webhook():
    inject = {"cert-manager.io/inject-ca-from": "gpuaas-system/gpuaas-gangs-webhook"}
    objs = template({"gangs": {"webhook": {"caBundle": "Q0E=", "annotations": inject}}})
    [config] = [o for o in objs if o["kind"] == "MutatingWebhookConfiguration"]
    assert config["metadata"]["annotations"] == inject
    assert len(config["webhooks"]) == 4  # one per group label, one for pods with DRA claims
    assert all(w["clientConfig"]["caBundle"] == "Q0E=" for w in config["webhooks"])


def test_gangs_in_another_release_namespace_keep_their_lease_and_leave_their_own_namespace_alone():
    objs = template(namespace="gpu-platform")
    configmaps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    gangs = yaml.safe_load(configmaps["gpuaas-gangs-config"]["data"]["gangs.yaml"])
    assert gangs["leader_election"] == {"namespace": "gpu-platform", "name": "gpuaas-gangs"}
    [config] = [o for o in objs if o["kind"] == "MutatingWebhookConfiguration"]
    for w in config["webhooks"]:
        assert w["clientConfig"]["service"]["namespace"] == "gpu-platform"
        assert w["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "gpu-platform"]

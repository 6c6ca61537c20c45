"""deploy/ renders, starts our commands with arguments the CLI accepts and configs their loaders accept, uses one image,
and ships what its generators produce. What the apiserver thinks of it is in tests/e2e/test_deploy.py."""
from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from autoscaler.config import load_autoscaler_config, load_metrics_api_config
from extender.config import ENV_PREFIX, ExtenderConfig
from extender.schedconfig import shipped_file
from gangs.config import load_gangs_config
from gangs.webhook import PATH, mutating_webhook_configuration
from gpuaas.cli import build_parser
from nodescaler.config import load_nodescaler_config
from runtime.config import load_config

from .manifests import DEPLOY, NAMESPACE, REPO, kustomize_dirs, named, objects, render

BASES = kustomize_dirs("bases")
OVERLAYS = kustomize_dirs("overlays")
ALL = DEPLOY / "overlays" / "all"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
KUBE_VERSION = re.search(r"^KUBE_VERSION=(\S+)", (REPO / "scripts" / "versions.env").read_text(), re.M).group(1)

# The loader each command uses for its --config file.
LOADERS = {
    "extender": lambda p: load_config(ExtenderConfig, p, env_prefix=ENV_PREFIX, environ={}),
    "autoscaler": load_autoscaler_config,
    "metrics-api": load_metrics_api_config,
    "nodescaler": lambda p: load_nodescaler_config(p, environ={}),
    "gangs": lambda p: load_gangs_config(p, environ={}),
}


def gpuaas_containers(objs):
    for d in objs:
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c["image"].split("/")[-1].startswith("gpuaas:"):
                    yield d, c


def test_the_layout_has_the_overlays_the_docs_name():
    assert {p.name for p in OVERLAYS} >= {"second-scheduler", "default-scheduler", "autoscaling", "nodescaler",
                                          "gangs", "monitoring", "all"}
    assert {p.name for p in BASES} >= {"namespace", "extender", "second-scheduler", "autoscaler",
                                       "custom-metrics-api", "nodescaler", "gangs", "prometheus", "grafana"}


@pytest.mark.parametrize("path", BASES + OVERLAYS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_renders(path):
    assert render(path)


def test_all_holds_every_base_once():
    listed = yaml.safe_load((ALL / "kustomization.yaml").read_text())["resources"]
    assert sorted((ALL / r).resolve() for r in listed) == [b.resolve() for b in BASES]
    ids = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in render(ALL)]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("path", OVERLAYS, ids=lambda p: p.name)
def test_one_image_for_every_gpuaas_container(path):
    images = {c["image"] for _, c in gpuaas_containers(render(path))}
    others = {c["image"] for d in objects(path, "Deployment") for c in d["spec"]["template"]["spec"]["containers"]}
    assert images <= {f"gpuaas:{VERSION}"}
    assert others - images <= {f"registry.k8s.io/kube-scheduler:v{KUBE_VERSION}"}
    assert f"docker build -t gpuaas:{VERSION} ." in (DEPLOY / "README.md").read_text()


def test_every_gpuaas_container_runs_a_command_the_cli_accepts_with_a_config_its_loader_accepts(tmp_path):
    rendered = render(ALL)
    configmaps = {d["metadata"]["name"]: d["data"] for d in rendered if d["kind"] == "ConfigMap"}
    commands = set()
    for deployment, container in gpuaas_containers(rendered):
        args = container["args"]
        parsed = build_parser().parse_args(args)
        assert parsed.func
        commands.add(args[0])
        # Every file an argument names is mounted; the --config file comes from a ConfigMap and loads.
        spec = deployment["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = container["volumeMounts"]
        files = [a for a in args if a.startswith("/")]
        for f in files:
            mount = next((m for m in mounts if f == m["mountPath"] or f.startswith(m["mountPath"].rstrip("/") + "/")),
                         None)
            assert mount, f"{deployment['metadata']['name']}: {f} is not mounted"
        config = args[args.index("--config") + 1]
        mount = next(m for m in mounts if m["mountPath"] == config)
        data = configmaps[volumes[mount["name"]]["configMap"]["name"]][mount["subPath"]]
        path = tmp_path / f"{args[0]}.yaml"
        path.write_text(data)
        LOADERS[args[0]](path)
    assert commands == set(LOADERS)


def test_every_deployment_runs_under_its_own_bound_service_account():
    rendered = render(ALL)
    accounts = {d["metadata"]["name"] for d in rendered if d["kind"] == "ServiceAccount"}
    bound = {s["name"] for d in rendered if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
             for s in d["subjects"] if s["kind"] == "ServiceAccount" and s["namespace"] == NAMESPACE}
    used = [d["spec"]["template"]["spec"]["serviceAccountName"] for d in rendered if d["kind"] == "Deployment"]
    assert len(used) == len(set(used)), "two Deployments share a ServiceAccount"
    assert set(used) == accounts == bound


# Roles the apiserver creates itself, which a RoleBinding of ours may name.
BUILT_IN_ROLES = {("kube-system", "extension-apiserver-authentication-reader")}


@pytest.mark.parametrize("path", OVERLAYS, ids=lambda p: p.name)
def test_every_role_binding_names_a_role_in_its_own_namespace(path):
    """A RoleBinding only grants a Role of its own namespace; kustomize's `namespace:` silently moves bindings."""
    rendered = render(path)
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in rendered if d["kind"] == "Role"}
    for binding in (d for d in rendered if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "Role"):
        ref = (binding["metadata"]["namespace"], binding["roleRef"]["name"])
        assert ref in roles | BUILT_IN_ROLES, f"RoleBinding {binding['metadata']['name']} names no Role {ref}"


def lease_rules(role):
    rules = [r for r in role["rules"] if r["resources"] == ["leases"]]
    return ({v for r in rules if not r.get("resourceNames") for v in r["verbs"]},
            {n: set(r["verbs"]) for r in rules for n in r.get("resourceNames", [])})


def nodescaler_lease(path):
    config = load_nodescaler_config(path / "nodescaler-config.yaml", environ={})
    assert config.leader_election.namespace == NAMESPACE
    return config.leader_election.name


def gangs_lease(path):
    config = load_gangs_config(path / "gangs-config.yaml", environ={})
    assert config.leader_election.namespace == NAMESPACE
    return config.leader_election.name


def second_scheduler_lease(path):
    election = yaml.safe_load((path / "scheduler-config.yaml").read_text())["leaderElection"]
    assert election["resourceNamespace"] == NAMESPACE
    return election["resourceName"]


# Checked on the rendered output: kustomize rewrites a Role's resourceNames that match a generated ConfigMap's name
# to the ConfigMap's hashed name, which would leave the component without its Lease.
@pytest.mark.parametrize("base, role, lease", [
    ("nodescaler", "gpuaas-nodescaler-leader", nodescaler_lease),
    ("second-scheduler", "gpuaas-scheduler-leases", second_scheduler_lease),
    ("autoscaler", "gpuaas-autoscaler-leader", lambda _: "gpuaas-autoscaler"),
    ("gangs", "gpuaas-gangs-leader", gangs_lease),
])
def test_leader_election_may_touch_its_own_lease_only(base, role, lease):
    path = DEPLOY / "bases" / base
    lease = lease(path)
    unnamed, by_name = lease_rules(named(path, "Role", role))
    assert unnamed == {"create"}  # create cannot be restricted by name
    # list/watch by name: gpuaas' own electors watch their Lease to take over at the instant it expires
    want = {"get", "update"} if base == "second-scheduler" else {"get", "update", "list", "watch"}
    assert by_name == {lease: want}


@pytest.mark.parametrize("path, second", [("overlays/default-scheduler/scheduler-config.yaml", False),
                                          ("bases/second-scheduler/scheduler-config.yaml", True)])
def test_scheduler_configurations_are_what_the_generator_prints(path, second):
    assert (DEPLOY / path).read_text() == shipped_file(second_scheduler=second), \
        f"regenerate: python -m extender.schedconfig{' --second-scheduler' if second else ''} > deploy/{path}"


def test_apiservices_claim_v1beta1_and_v1beta2_of_custom_metrics_only_for_our_service():
    path = DEPLOY / "bases" / "custom-metrics-api"
    services = objects(path, "APIService")
    assert {(s["spec"]["group"], s["spec"]["version"]) for s in services} == {
        ("custom.metrics.k8s.io", "v1beta1"), ("custom.metrics.k8s.io", "v1beta2")}
    svc = named(path, "Service", "gpuaas-custom-metrics")
    assert all(s["spec"]["service"] == {"name": svc["metadata"]["name"], "namespace": NAMESPACE, "port": 443}
               for s in services)


def _mounts(deployment) -> dict[str, str]:
    """mount path -> secret name, for the secret volumes of a Deployment's first container."""
    spec = deployment["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    return {m["mountPath"]: secrets[m["name"]] for m in spec["containers"][0]["volumeMounts"] if m["name"] in secrets}


def test_the_extender_and_the_second_scheduler_are_wired_for_mtls():
    """The extender trusts the CA of gpuaas-extender-tls for client certificates; the second scheduler presents the
    client certificate of gpuaas-scheduler-extender-client at the paths its tlsConfig names, and verifies the
    extender with that secret's CA."""
    path = DEPLOY / "overlays" / "second-scheduler"
    extender = named(path, "Deployment", "gpuaas-extender")
    config_map = next(o for o in objects(path, "ConfigMap")
                      if o["metadata"]["name"].startswith("gpuaas-extender-config"))
    config = ExtenderConfig.model_validate(yaml.safe_load(config_map["data"]["extender.yaml"]))
    assert config.tls is not None and config.tls.client_names == ["system:kube-scheduler"]
    mounts = _mounts(extender)
    for file in (config.tls.cert_file, config.tls.key_file, config.tls.client_ca_file):
        assert mounts[str(file.parent)] == "gpuaas-extender-tls"
    scheduler = named(path, "Deployment", "gpuaas-scheduler")
    sched_map = next(o for o in objects(path, "ConfigMap")
                     if o["metadata"]["name"].startswith("gpuaas-scheduler-config"))
    tls = yaml.safe_load(sched_map["data"]["scheduler-config.yaml"])["extenders"][0]["tlsConfig"]
    assert set(tls) == {"caFile", "certFile", "keyFile"}
    for file in tls.values():
        assert _mounts(scheduler)[file.rsplit("/", 1)[0]] == "gpuaas-scheduler-extender-client"
    assert config.scheduler_names[-1] == yaml.safe_load(sched_map["data"]["scheduler-config.yaml"])["profiles"][0][
        "schedulerName"]
    # The RBAC that lets it review tokens for /explain and /metrics.
    delegator = named(path, "ClusterRoleBinding", "gpuaas-extender-auth-delegator")
    assert delegator["roleRef"]["name"] == "system:auth-delegator"


def test_only_kube_scheduler_and_prometheus_reach_the_extender():
    policy = named(DEPLOY / "bases" / "extender", "NetworkPolicy", "gpuaas-extender")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "gpuaas-extender"}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": "https"}]
    peers = [(p.get("namespaceSelector"), p["podSelector"]["matchLabels"]) for p in rule["from"]]
    assert peers == [(None, {"app.kubernetes.io/name": "gpuaas-scheduler"}),
                     ({"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                      {"app.kubernetes.io/name": "prometheus"})]


GANGS = DEPLOY / "bases" / "gangs"


def test_the_gangs_webhook_is_what_the_component_registers_pointed_at_its_service():
    """One webhook per group label with the selectors, rules and failurePolicy gangs.webhook makes (the local cluster
    registers the same for a URL), reaching the Service's port 443 at the webhook's path."""
    [shipped] = objects(GANGS, "MutatingWebhookConfiguration")
    service = named(GANGS, "Service", "gpuaas-gangs-webhook")
    client_config = {"service": {"name": service["metadata"]["name"], "namespace": NAMESPACE, "path": PATH,
                                 "port": 443}, "caBundle": ""}
    assert shipped == mutating_webhook_configuration(client_config)
    assert [p["port"] for p in service["spec"]["ports"]] == [443]


def test_the_gangs_webhook_service_reaches_the_port_the_config_serves_with_the_mounted_certificate():
    deployment = named(GANGS, "Deployment", "gpuaas-gangs")
    service = named(GANGS, "Service", "gpuaas-gangs-webhook")
    config_map = next(o for o in objects(GANGS, "ConfigMap") if o["metadata"]["name"].startswith("gpuaas-gangs-config"))
    config = load_gangs_config(None, environ={}, overrides=yaml.safe_load(config_map["data"]["gangs.yaml"]))
    assert config.webhook is not None
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    [port] = service["spec"]["ports"]
    assert ports[port["targetPort"]] == config.webhook.port
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    mounts = _mounts(deployment)
    for file in (config.webhook.cert_file, config.webhook.key_file):
        assert mounts[str(file.parent)] == "gpuaas-gangs-webhook-tls"
    # More than one replica answers: failurePolicy Fail refuses group members while none does.
    assert deployment["spec"]["replicas"] >= 2
    assert named(GANGS, "PodDisruptionBudget", "gpuaas-gangs")["spec"]["maxUnavailable"] == 1


def test_the_gangs_rbac_is_what_the_controller_does_and_no_more():
    role = named(GANGS, "ClusterRole", "gpuaas-gangs")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {(("",), ("pods",)): {"get", "list", "watch", "patch", "delete"},
                     (("",), ("nodes",)): {"list", "watch"},
                     (("",), ("events",)): {"create"},
                     # DRA mode: the claims it allocates (finalizer, then status.allocation) and the slices it reads
                     (("resource.k8s.io",), ("resourceclaims",)): {"get", "list", "watch", "update", "patch"},
                     (("resource.k8s.io",), ("resourceclaims/status", "resourceclaims/binding")): {"update", "patch"},
                     (("resource.k8s.io",), ("resourceslices",)): {"list", "watch"}}

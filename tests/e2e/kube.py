"""Small helpers the end-to-end tests share: waiting on the API and reading scheduling outcomes."""
from __future__ import annotations

import base64
import time
from collections.abc import Callable
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout: float = 30.0, interval: float = 0.25, what: str = "condition") -> T:
    """Poll `probe` until it returns something truthy; return that, or fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")


def pod(api: client.ApiClient, namespace: str, name: str) -> client.V1Pod:
    return client.CoreV1Api(api).read_namespaced_pod(name, namespace)


def pod_events(api: client.ApiClient, namespace: str, name: str) -> list[client.CoreV1Event]:
    return client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}").items


def pod_phase(api: client.ApiClient, namespace: str, name: str) -> str:
    return pod(api, namespace, name).status.phase


def rbac_manifest(account: str, namespace: str, *, cluster_rules: list[dict] = (),
                  namespace_rules: list[dict] = (), cluster_roles: list[str] = ()) -> str:
    """ServiceAccount `account` in `namespace` bound to exactly these rules: `cluster_rules` through a ClusterRole,
    `namespace_rules` through a Role in `namespace`, and the existing ClusterRoles `cluster_roles` (for
    LocalCluster.service_account_kubeconfig)."""
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    docs: list[dict] = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}}]
    for role in cluster_roles:
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                     "metadata": {"name": f"{namespace}-{account}-{role.replace(':', '-')}"}, "subjects": subject,
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}})
    for kind, rules in (("ClusterRole", cluster_rules), ("Role", namespace_rules)):
        if not rules:
            continue
        name = f"{namespace}-{account}"
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": {"name": name},
                     "rules": list(rules)})
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": f"{kind}Binding",
                     "metadata": {"name": name}, "subjects": subject,
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}})
    return yaml.safe_dump_all(docs)


def lease_rules(name: str, *, watch: bool = True) -> list[dict]:
    """What runtime.leader needs on its Lease: create it, get and update it by name, and (for a standby that sees each
    renewal as it happens) list and watch it by name."""
    verbs = ["get", "update"] + (["list", "watch"] if watch else [])
    return [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [name], "verbs": verbs}]


@contextmanager
def registered_custom_metrics_api(cluster, namespace: str, port: int, manifest: Path):
    """The APIServices of `manifest` (deploy/bases/custom-metrics-api/apiservices.yaml) pointed at a server on
    127.0.0.1:`port`, until the block ends. No kube-proxy here: the Service is an ExternalName `localhost`, which the
    aggregator resolves (without --enable-aggregator-routing) to localhost at the APIService's port, so every packet
    stays on loopback."""
    service = "gpuaas-custom-metrics"
    client.CoreV1Api(cluster.api).create_namespaced_service(namespace, {"metadata": {"name": service}, "spec": {
        "type": "ExternalName", "externalName": "localhost",
        "ports": [{"port": port, "name": "https", "protocol": "TCP"}]}})
    reg = client.ApiregistrationV1Api(cluster.api)
    ca = base64.b64encode(Path(cluster.control_plane.pki.ca_cert).read_bytes()).decode()
    names = []
    try:
        for doc in yaml.safe_load_all(manifest.read_text()):
            if doc and doc["kind"] == "APIService":
                doc["spec"]["service"].update({"name": service, "namespace": namespace, "port": port})
                doc["spec"]["caBundle"] = ca
                reg.create_api_service(doc)
                names.append(doc["metadata"]["name"])

        def available():
            return all(any(c.type == "Available" and c.status == "True"
                           for c in (reg.read_api_service(n).status.conditions or [])) for n in names)
        wait_for(available, timeout=60, what=f"APIServices {names} Available")
        yield names
    finally:
        for n in names:
            with suppress(client.ApiException):
                reg.delete_api_service(n)

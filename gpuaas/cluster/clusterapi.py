"""Cluster API beside a local control plane: the real core manager (sigs.k8s.io/cluster-api's `core`: the Cluster,
MachineDeployment, MachineSet and Machine controllers), built by scripts/build-capi.sh as `capi-manager`, and a
FAKE infrastructure provider for it.

The fake. No cloud-free Cluster API infrastructure provider puts nodes into the management cluster, so this module
has the one fake of the Cluster API end to end: `KWOKMachine` / `KWOKMachineTemplate` (group
`infrastructure.gpuaas.io`, test-only) and `KwokMachineController`, a thread that follows the infra-machine contract of
Cluster API v1beta2 as far as the core controllers read it (internal/contract/infrastructure_machine.go,
core/reconcilers/machine/machine_controller_phases.go at v1.14.2): the CRDs carry the contract label
`cluster.x-k8s.io/v1beta2: v1alpha1` (how the core finds the version of a referenced kind); a KWOKMachine is
provisioned by creating a Node that kwok plays (the node its `spec.node` describes: the group template's labels, taints
and GPU capacity) with the provider ID `kwok://<name>`, then setting `spec.providerID`, `status.addresses`,
`status.initialization.provisioned: true` and the `Ready` condition (which the core mirrors into the Machine's
`InfrastructureReady`). `spec.failure: "<Reason>: <message>"` makes it fail instead, as a cloud out of capacity:
Ready False with that reason, no node. Deleting a KWOKMachine deletes its Node (the instance goes; the core also
deletes the Node once the infra machine is gone). No bootstrap provider: Machines name a data secret directly
(`bootstrap.dataSecretName`), which the core accepts without one.

The manager runs with its webhook server started on a self-signed certificate from the cluster CA (it always starts
one) but no webhook registered with the apiserver (no cert-manager here): objects are created complete, as the
defaulting webhooks would leave them. The Cluster has no infrastructureRef and no controlPlaneRef (the core then
marks its infrastructure provisioned), and its `<cluster>-kubeconfig` secret points back at this apiserver: the
management cluster is its own workload cluster, so the core finds the Nodes (by provider ID) where the fake puts them.
"""
from __future__ import annotations

import base64
import logging
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from nodescaler.config import NodeGroupConfig
from nodescaler.provider import kwok_node

from .controlplane import ControlPlane, ControlPlaneError
from .pki import issue_serving_cert
from .process import answers_ok, free_port
from .tools import ToolsMissing

log = logging.getLogger("gpuaas.cluster.clusterapi")

NAME = "capi-manager"
INFRA_NAME = "kwok-infra"  # the fake infra's controller process
CAPI_GROUP, CAPI_VERSION = "cluster.x-k8s.io", "v1beta2"
INFRA_GROUP, INFRA_VERSION = "infrastructure.gpuaas.io", "v1alpha1"
CONTRACT_LABEL = f"{CAPI_GROUP}/{CAPI_VERSION}"  # CRD label: which versions of the kind follow contract v1beta2
DATA_SECRET = "gpuaas-kwok-bootstrap"  # the (empty) bootstrap data the Machines name


def _crd(kind: str, plural: str, *, template: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    version: dict[str, Any] = {"name": INFRA_VERSION, "served": True, "storage": True, "schema": {"openAPIV3Schema": {
        "type": "object", "properties": {"spec": spec, "status": {
            "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}
    if not template:
        version["subresources"] = {"status": {}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{INFRA_GROUP}", "labels": {CONTRACT_LABEL: INFRA_VERSION}},
            "spec": {"group": INFRA_GROUP, "scope": "Namespaced", "versions": [version],
                     "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()}}}


INFRA_CRDS = (_crd("KWOKMachine", "kwokmachines", template=False),
              _crd("KWOKMachineTemplate", "kwokmachinetemplates", template=True))


def machine_template(name: str, namespace: str, group: NodeGroupConfig, *, failure: str | None = None
                     ) -> dict[str, Any]:
    """A KWOKMachineTemplate whose machines become the nodes `group`'s template renders (runtime/pools; GPUs
    allocatable at once: the harness's Node is the instance after boot). `failure`: `<Reason>: <message>`, every
    machine fails so (a cloud out of capacity)."""
    node = group.template_node()
    node["metadata"].pop("name", None)
    node["metadata"]["labels"].pop("kubernetes.io/hostname", None)
    spec: dict[str, Any] = {"node": node}
    if failure:
        spec["failure"] = failure
    return {"apiVersion": f"{INFRA_GROUP}/{INFRA_VERSION}", "kind": "KWOKMachineTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"template": {"spec": spec}}}


def machine_deployment(name: str, namespace: str, cluster: str, template: str, *, replicas: int = 0,
                       annotations: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None
                       ) -> dict[str, Any]:
    """A MachineDeployment of KWOKMachines, complete as CAPI's defaulting webhook would leave it (none runs here)."""
    selector = {"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/deployment-name": name}
    return {"apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}", "kind": "MachineDeployment",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {}),
                         "labels": {"cluster.x-k8s.io/cluster-name": cluster, **(labels or {})}},
            "spec": {"clusterName": cluster, "replicas": replicas, "selector": {"matchLabels": selector},
                     # The webhook's defaults (core/webhooks/admission/machinedeployment.go, machine.go).
                     "rollout": {"strategy": {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
                     "template": {"metadata": {"labels": selector}, "spec": {
                         "clusterName": cluster, "bootstrap": {"dataSecretName": DATA_SECRET},
                         "deletion": {"nodeDeletionTimeoutSeconds": 10},
                         "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "KWOKMachineTemplate",
                                               "name": template}}}}}


def _condition(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


class KwokMachineController:
    """FAKE infrastructure provider (see the module docstring): provisions KWOKMachines as kwok Nodes. A thread that
    lists KWOKMachines every `interval` seconds (a handful of objects: no watch needed)."""

    def __init__(self, api: client.ApiClient, interval: float = 0.3):
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.provisioned: list[str] = []  # KWOKMachines made nodes, in order
        self.failed: list[str] = []

    def start(self) -> KwokMachineController:
        self._thread = threading.Thread(target=self._run, name="kwok-machines", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception:  # the apiserver may be slow or restarting; the next pass tries again
                log.exception("KWOKMachine pass failed")
            self._stop.wait(self.interval)

    def reconcile(self) -> None:
        items = self.custom.list_cluster_custom_object(INFRA_GROUP, INFRA_VERSION, "kwokmachines")["items"]
        for m in items:
            meta = m["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            status = m.get("status") or {}
            if (status.get("initialization") or {}).get("provisioned") or status.get("conditions"):
                continue
            failure = (m.get("spec") or {}).get("failure")
            if failure:
                reason, _, message = str(failure).partition(":")
                self._status(m, {"conditions": [_condition("Ready", "False", reason.strip(), message.strip())]})
                log.info("KWOKMachine %s/%s fails: %s", meta["namespace"], meta["name"], failure)
                self.failed.append(meta["name"])
                continue
            self._provision(m)
        # The instance of a deleted KWOKMachine goes with it: its Node (if the core has not deleted it already).
        names = {m["metadata"]["name"] for m in items if not m["metadata"].get("deletionTimestamp")}
        for node in self.core.list_node(label_selector=f"{INFRA_GROUP}/machine").items:
            if node.metadata.labels[f"{INFRA_GROUP}/machine"] not in names and not node.metadata.deletion_timestamp:
                try:
                    self.core.delete_node(node.metadata.name)
                except ApiException as err:
                    if err.status != 404:
                        raise

    def _provision(self, m: dict[str, Any]) -> None:
        log.info("provisioning KWOKMachine %s/%s", m["metadata"]["namespace"], m["metadata"]["name"])
        meta = m["metadata"]
        name = meta["name"]
        node = dict((m.get("spec") or {}).get("node", {}))
        node["metadata"] = {**node.get("metadata", {}), "name": name}
        node["metadata"]["labels"] = {**node["metadata"].get("labels", {}), "kubernetes.io/hostname": name,
                                      f"{INFRA_GROUP}/machine": name}
        node = kwok_node(node)
        provider_id = node["spec"]["providerID"]  # kwok://<name>
        try:
            self.core.create_node(node)  # with its status: capacity and allocatable (GPUs), which kwok keeps
        except ApiException as err:
            if err.status != 409:
                raise
        self.custom.patch_namespaced_custom_object(INFRA_GROUP, INFRA_VERSION, meta["namespace"], "kwokmachines",
                                                   name, {"spec": {"providerID": provider_id}})
        self._status(m, {"initialization": {"provisioned": True}, "ready": True,
                         "addresses": [{"type": "Hostname", "address": name},
                                       {"type": "InternalDNS", "address": name}],
                         "conditions": [_condition("Ready", "True", "Provisioned")]})
        self.provisioned.append(name)

    def _status(self, m: dict[str, Any], status: dict[str, Any]) -> None:
        meta = m["metadata"]
        self.custom.patch_namespaced_custom_object_status(INFRA_GROUP, INFRA_VERSION, meta["namespace"],
                                                          "kwokmachines", meta["name"], {"status": status})


class ClusterAPI:
    """The Cluster API core manager of one local cluster and the fake infra's controller, two processes of its
    control plane (stopped with it; `gpuaas cluster down` stops them too)."""

    def __init__(self, control_plane: ControlPlane, health_port: int):
        self.control_plane = control_plane
        self.health_port = health_port

    @property
    def log(self) -> Path:
        return self.control_plane.logs / f"{NAME}.log"

    def ready(self) -> bool:
        return answers_ok(f"http://127.0.0.1:{self.health_port}/readyz")

    def stop(self) -> None:
        cp = self.control_plane
        for name in (INFRA_NAME, NAME):
            if cp.state is not None and name in cp.state.components:
                cp._terminate(name, cp.state.components.pop(name))
                cp.state.save(cp.state_file)


def apply_crds(control_plane: ControlPlane, crd_dir: Path, timeout: float = 60.0) -> None:
    """Apply Cluster API's CRDs (core/config/crd/bases, copied beside the binary) and the fake infra's, and wait until
    they are served."""
    files = sorted(crd_dir.glob("*.yaml"))
    if not any(f.name == "cluster.x-k8s.io_machinedeployments.yaml" for f in files):
        raise ToolsMissing(f"Cluster API CRDs not in {crd_dir}: run scripts/setup.sh")
    infra = control_plane.workdir / "kwok-infra-crds.yaml"
    infra.write_text(yaml.safe_dump_all(INFRA_CRDS))
    args = [a for f in [*files, infra] for a in ("-f", str(f))]
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", *args)
    names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in files] + \
        [c["metadata"]["name"] for c in INFRA_CRDS]
    control_plane.kubectl("wait", "--for=condition=Established", f"--timeout={int(timeout)}s",
                          *[f"crd/{n}" for n in names])


def _embedded_kubeconfig(control_plane: ControlPlane) -> str:
    """The control plane's admin kubeconfig with the certificates inlined (CAPI reads it from a Secret)."""
    cfg = yaml.safe_load(control_plane.kubeconfig.read_text())
    for c in cfg["clusters"]:
        c["cluster"]["certificate-authority-data"] = base64.b64encode(
            Path(c["cluster"].pop("certificate-authority")).read_bytes()).decode()
    for u in cfg["users"]:
        for key in ("client-certificate", "client-key"):
            if key in u["user"]:
                u["user"][f"{key}-data"] = base64.b64encode(Path(u["user"].pop(key)).read_bytes()).decode()
    return yaml.safe_dump(cfg)


def create_cluster(api: client.ApiClient, control_plane: ControlPlane, name: str, namespace: str = "default") -> None:
    """A Cluster `name` in `namespace` whose workload cluster is this control plane itself, with the kubeconfig
    Secret the core reads (`<name>-kubeconfig`, key `value`) and the bootstrap data Secret the Machines name."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    label = {"cluster.x-k8s.io/cluster-name": name}
    secrets = [
        {"metadata": {"name": f"{name}-kubeconfig", "namespace": namespace, "labels": label},
         "type": "cluster.x-k8s.io/secret", "stringData": {"value": _embedded_kubeconfig(control_plane)}},
        {"metadata": {"name": DATA_SECRET, "namespace": namespace, "labels": label},
         "type": "cluster.x-k8s.io/secret", "stringData": {"value": "", "format": "cloud-config"}},
    ]
    for s in secrets:
        try:
            core.create_namespaced_secret(namespace, s)
        except ApiException as err:
            if err.status != 409:
                raise
    body = {"apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}", "kind": "Cluster",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"paused": False}}  # (minProperties 1)
    try:
        custom.create_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, namespace, "clusters", body)
    except ApiException as err:
        if err.status != 409:
            raise


def start_capi(control_plane: ControlPlane, *, timeout: float = 120.0, verbosity: int = 1) -> ClusterAPI:
    """Start Cluster API's core manager beside `control_plane` and the fake infra provider's controller. Returns once
    the manager's /readyz answers."""
    binary = control_plane.tools.capi
    if binary is None or not binary.exists():
        raise ToolsMissing("Cluster API's core manager is not built (GPUAAS_CAPI_BIN): run scripts/setup.sh")
    apply_crds(control_plane, binary.parent / "crds", timeout=timeout)
    cert_dir = control_plane.workdir / "capi-webhook"
    cert_dir.mkdir(exist_ok=True)
    cert, key = issue_serving_cert(control_plane.pki, "capi-webhook", "capi-webhook")
    (cert_dir / "tls.crt").write_bytes(cert.read_bytes())
    (cert_dir / "tls.key").write_bytes(key.read_bytes())
    health = free_port()
    argv = [str(binary), f"--health-addr=127.0.0.1:{health}", f"--diagnostics-address=127.0.0.1:{free_port()}",
            "--insecure-diagnostics", f"--webhook-port={free_port()}", f"--webhook-cert-dir={cert_dir}",
            "--leader-elect=false", f"--v={verbosity}"]
    env = {"KUBECONFIG": str(control_plane.kubeconfig), "PATH": "/usr/bin:/bin"}
    control_plane.add_process(NAME, argv, health, env=env)
    capi = ClusterAPI(control_plane, health)
    deadline = time.monotonic() + timeout
    popen = control_plane._popen[NAME]
    while not capi.ready():
        if popen.poll() is not None:
            raise ControlPlaneError(f"{NAME} exited with {popen.returncode}; log {capi.log}:\n"
                                    + control_plane.tail_log(NAME))
        if time.monotonic() > deadline:
            capi.stop()
            raise ControlPlaneError(f"{NAME} not ready after {timeout:.0f}s; log {capi.log}")
        time.sleep(0.3)
    # The fake infra's controller, as a process: the cluster outlives `gpuaas cluster up`.
    repo = Path(__file__).resolve().parents[2]
    control_plane.add_process(INFRA_NAME, [sys.executable, "-m", "gpuaas.cluster.clusterapi",
                                           str(control_plane.kubeconfig)],
                              env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"})
    return capi


def start_capi_with_groups(control_plane: ControlPlane, api: client.ApiClient, groups: list[NodeGroupConfig], *,
                           cluster: str = "gpuaas", timeout: float = 120.0) -> ClusterAPI:
    """`start_capi`, a Cluster `cluster` in each namespace the groups name, and per group a KWOKMachineTemplate and a
    MachineDeployment of 0 replicas (named as its `clusterapi.machine_deployment`)."""
    capi = start_capi(control_plane, timeout=timeout)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    for ns in sorted({g.clusterapi.namespace for g in groups if g.clusterapi}):
        try:
            core.create_namespace({"metadata": {"name": ns}})
        except ApiException as err:
            if err.status != 409:
                raise
        create_cluster(api, control_plane, cluster, ns)
    for g in groups:
        if g.clusterapi is None:
            continue
        c = g.clusterapi
        custom.create_namespaced_custom_object(INFRA_GROUP, INFRA_VERSION, c.namespace, "kwokmachinetemplates",
                                               machine_template(c.machine_deployment, c.namespace, g))
        custom.create_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, c.namespace, "machinedeployments",
                                               machine_deployment(c.machine_deployment, c.namespace, cluster,
                                                                  c.machine_deployment))
    return capi


def main(argv: list[str] | None = None) -> int:
    """`python -m gpuaas.cluster.clusterapi KUBECONFIG`: the fake infra's controller until SIGTERM."""
    import signal

    from runtime.kubeclient import api_client

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpuaas.cluster.clusterapi KUBECONFIG", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    controller = KwokMachineController(api_client(args[0])).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    controller.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

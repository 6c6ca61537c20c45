"""Karpenter beside a local control plane: its real core (sigs.k8s.io/karpenter, NodeClaim lifecycle, termination,
disruption) with the `kwok` cloud provider, built by scripts/build-karpenter.sh as `karpenter-kwok`.

`start_karpenter` applies the CRDs that ship in the module (pkg/apis/crds: NodeClaim, NodePool, NodeOverlay;
kwok/apis/crds: KWOKNodeClass), creates the KWOKNodeClasses, writes the instance types (`instance_types`: one per
instance type the node groups of provider `karpenter` name, its resources the group template's) to the file the KWOK
cloud provider reads (INSTANCE_TYPES_FILE_PATH) and starts the controller as a process of the control plane (stopped
with it; `gpuaas cluster down` stops it too).

The KWOK cloud provider creates a Node for each NodeClaim it launches (after the node class's nodeRegistrationDelay),
with the NodeClaim's labels and annotations and the instance type's resources as allocatable, and the annotation
`kwok.x-k8s.io/node: fake` the harness's kwok plays nodes by: kwok makes it Ready, Karpenter registers it. With no
NodePool, Karpenter's own provisioner stays idle (provisioning.ErrNodePoolsNotFound): it only launches the NodeClaims
gpuaas creates.
"""
from __future__ import annotations

import json
import math
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from nodescaler.config import NodeGroupConfig

from .controlplane import ControlPlane, ControlPlaneError
from .process import answers_ok, free_port
from .tools import ToolsMissing

NAME = "karpenter"
CRDS = ("karpenter.sh_nodeclaims.yaml", "karpenter.sh_nodepools.yaml", "karpenter.sh_nodeoverlays.yaml",
        "karpenter.kwok.sh_kwoknodeclasses.yaml")
# What the KWOK cloud provider subtracts from an instance type's resources for allocatable (kwok/cloudprovider/
# helpers.go: KubeReserved): added to the template's so that the node's allocatable is the template's.
OVERHEAD = {"cpu": 0.1, "memory": 10 * 2**20}
ZONE, CAPACITY_TYPE = "topology.kubernetes.io/zone", "karpenter.sh/capacity-type"


def _plus(value: Any, extra: float) -> str:
    from scoring.kubeobjects import parse_quantity

    total = float(parse_quantity(value)) + extra
    return str(round(total * 1000)) + "m" if extra < 1 else str(int(total))


def _values(requirements: Iterable[Mapping[str, Any]], key: str, default: str) -> list[str]:
    for r in requirements:
        if r.get("key") == key and r.get("operator") == "In" and r.get("values"):
            return [str(v) for v in r["values"]]
    return [default]


def instance_types(groups: Iterable[NodeGroupConfig]) -> list[dict[str, Any]]:
    """The KWOK cloud provider's instance types (its INSTANCE_TYPES_FILE_PATH JSON: kwok/cloudprovider/helpers.go
    InstanceTypeOptions) for the node groups that have a `karpenter` section: one per instance type, its resources
    the template's allocatable (any ResourceList: nvidia.com/gpu, MIG instances), one offering per zone and capacity
    type the group's requirements ask for (else `local-a`, `on-demand`), priced at the group's cost_per_hour. Groups
    that name the same instance type must describe the same resources."""
    out: dict[str, dict[str, Any]] = {}
    for g in groups:
        if g.karpenter is None:
            continue
        alloc = dict(g.template_node()["status"]["allocatable"])
        resources = {k: str(v) for k, v in alloc.items()}
        for k, extra in OVERHEAD.items():
            if k in resources:
                resources[k] = _plus(resources[k], extra)
        reqs = g.karpenter.requirements
        offerings = [{"Price": g.cost_per_hour, "Available": True, "Requirements": [
            {"key": CAPACITY_TYPE, "operator": "In", "values": [ct]}, {"key": ZONE, "operator": "In", "values": [z]}]}
            for z in _values(reqs, ZONE, "local-a") for ct in _values(reqs, CAPACITY_TYPE, "on-demand")]
        name = g.karpenter.instance_type
        it = {"name": name, "offerings": offerings, "architecture": "amd64", "operatingSystems": ["linux"],
              "resources": resources}
        if name in out:
            if out[name]["resources"] != resources:
                raise ValueError(f"instance type {name}: groups describe it with different resources")
            continue
        out[name] = it
    return list(out.values())


def node_class(name: str, registration_delay_s: float = 0.0) -> dict[str, Any]:
    """A KWOKNodeClass: the node registers `registration_delay_s` (whole seconds, rounded up: the CRD's pattern) after
    Karpenter launched it, as an instance boots."""
    spec = {"nodeRegistrationDelay": f"{math.ceil(registration_delay_s)}s"} if registration_delay_s > 0 else {}
    return {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": name},
            "spec": spec}


class Karpenter:
    """The Karpenter KWOK controller of one local cluster (a process of its control plane)."""

    def __init__(self, control_plane: ControlPlane, metrics_port: int, health_port: int, instance_types_file: Path):
        self.control_plane = control_plane
        self.metrics_port = metrics_port
        self.health_port = health_port
        self.instance_types_file = instance_types_file

    @property
    def log(self) -> Path:
        return self.control_plane.logs / f"{NAME}.log"

    def ready(self) -> bool:
        return answers_ok(f"http://127.0.0.1:{self.health_port}/readyz")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def stop(self) -> None:
        cp = self.control_plane
        if cp.state is not None and NAME in cp.state.components:
            cp._terminate(NAME, cp.state.components.pop(NAME))
            cp.state.save(cp.state_file)


def apply_crds(control_plane: ControlPlane, crd_dir: Path, timeout: float = 60.0) -> None:
    """Apply Karpenter's CRDs (server-side: the NodePool CRD is large) and wait until they are served."""
    missing = [f for f in CRDS if not (crd_dir / f).exists()]
    if missing:
        raise ToolsMissing(f"Karpenter CRDs {missing} not in {crd_dir}: run scripts/setup.sh")
    args = [a for f in CRDS for a in ("-f", str(crd_dir / f))]
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", *args)
    names = [yaml.safe_load((crd_dir / f).read_text())["metadata"]["name"] for f in CRDS]
    control_plane.kubectl("wait", "--for=condition=Established", f"--timeout={int(timeout)}s",
                          *[f"crd/{n}" for n in names])


def apply_node_classes(api: client.ApiClient, classes: Mapping[str, float]) -> None:
    """Create (or update) KWOKNodeClasses: name -> registration delay (seconds)."""
    custom = client.CustomObjectsApi(api)
    for name, delay in classes.items():
        body = node_class(name, delay)
        try:
            custom.create_cluster_custom_object("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses", body)
        except ApiException as err:
            if err.status != 409:
                raise
            current = custom.get_cluster_custom_object("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses", name)
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            custom.replace_cluster_custom_object("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses", name, body)


def start_karpenter(control_plane: ControlPlane, groups: Iterable[NodeGroupConfig], *,
                    node_classes: Mapping[str, float] | None = None, api: client.ApiClient | None = None,
                    timeout: float = 120.0, log_level: str = "info") -> Karpenter:
    """Start Karpenter's KWOK controller beside `control_plane` for the node groups `groups` (those with a
    `karpenter` section give the instance types). `node_classes`: KWOKNodeClasses to create, name -> node
    registration delay in seconds (default: `default`, no delay). Returns once its /readyz answers."""
    binary = control_plane.tools.karpenter
    if binary is None or not binary.exists():
        raise ToolsMissing("Karpenter's KWOK controller is not built (GPUAAS_KARPENTER_BIN): run scripts/setup.sh")
    groups = list(groups)
    apply_crds(control_plane, binary.parent / "crds", timeout=timeout)
    from runtime.kubeclient import api_client

    own_api = api is None
    api = api or api_client(control_plane.kubeconfig)
    try:
        apply_node_classes(api, {"default": 0.0} if node_classes is None else node_classes)
    finally:
        if own_api:
            api.close()
    types_file = control_plane.workdir / "karpenter-instance-types.json"
    types_file.write_text(json.dumps(instance_types(groups), indent=1))
    k = Karpenter(control_plane, free_port(), free_port(), types_file)
    env = {"KUBECONFIG": str(control_plane.kubeconfig), "INSTANCE_TYPES_FILE_PATH": str(types_file),
           "DISABLE_LEADER_ELECTION": "true", "METRICS_PORT": str(k.metrics_port),
           "HEALTH_PROBE_PORT": str(k.health_port), "LOG_LEVEL": log_level, "CPU_REQUESTS": "1000",
           "PATH": "/usr/bin:/bin"}
    control_plane.add_process(NAME, [str(binary)], k.health_port, env=env)
    deadline = time.monotonic() + timeout
    popen = control_plane._popen[NAME]
    while not k.ready():
        if popen.poll() is not None:
            raise ControlPlaneError(f"karpenter exited with {popen.returncode}; log {k.log}:\n"
                                    + control_plane.tail_log(NAME))
        if time.monotonic() > deadline:
            k.stop()
            raise ControlPlaneError(f"karpenter not ready after {timeout:.0f}s; log {k.log}")
        time.sleep(0.3)
    return k

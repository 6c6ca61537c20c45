"""A local cluster: the control plane plus GPU node pools. What pytest fixtures, `gpuaas cluster` and the demo use."""
from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from nodescaler.provider import kwok_node
from runtime.kubeclient import api_client
from runtime.pools import PoolSpec, PoolSpecError, load_pool_spec, spec_node_objects

from .controlplane import ControlPlane
from .dra import publish_dra
from .nodes import create_nodes, wait_nodes_ready

RBAC_KINDS = {"ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}


def builtin_pool_specs() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("gpuaas.pools").iterdir()
                  if p.name.endswith(".yaml"))


def resolve_pool_spec(name_or_path: str) -> PoolSpec:
    """A pool spec from a file path, or by the name of one shipped with gpuaas (`demo`, `large-200`)."""
    path = Path(name_or_path)
    if path.exists():
        return load_pool_spec(path)
    if name_or_path in builtin_pool_specs():
        with resources.as_file(resources.files("gpuaas.pools") / f"{name_or_path}.yaml") as p:
            return load_pool_spec(p)
    raise PoolSpecError(f"{name_or_path}: no such file, and not a built-in pool spec "
                        f"({', '.join(builtin_pool_specs())})")


def pool_nodes(pools: PoolSpec) -> list[dict[str, Any]]:
    """The Node objects of the pools as kwok plays them: runtime/pools.py renders them provider-neutral, the KWOK
    provider's `kwok_node` adds what kwok needs (as it does to the nodes the node scaler creates)."""
    return [kwok_node(node) for node in spec_node_objects(pools)]


class LocalCluster:
    def __init__(self, workdir: Path, *, name: str = "gpuaas", owned: bool = True,
                 extenders: list[dict[str, Any]] | None = None, **control_plane_args: Any):
        self.control_plane = ControlPlane(workdir, name=name, owned=owned, extenders=extenders, **control_plane_args)
        self._api: client.ApiClient | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def api(self) -> client.ApiClient:
        if self._api is None:
            self._api = api_client(self.kubeconfig)
        return self._api

    def up(self, pools: PoolSpec | None = None, timeout: float = 120.0) -> dict[str, float]:
        """Start the control plane and create the pools' nodes; return how long each phase took (seconds)."""
        t0 = time.monotonic()
        self.control_plane.start(timeout=timeout)
        timings = {"control_plane_s": time.monotonic() - t0}
        if pools is not None:
            timings.update(self.add_pools(pools, timeout=max(10.0, timeout - timings["control_plane_s"])))
        timings["total_s"] = time.monotonic() - t0
        return timings

    def add_pools(self, pools: PoolSpec, timeout: float = 120.0) -> dict[str, float]:
        nodes = pool_nodes(pools)
        t0 = time.monotonic()
        create_nodes(self.api, nodes)
        created = time.monotonic() - t0
        timings = {"nodes": float(len(nodes)), "nodes_created_s": created}
        if any(p.dra for p in pools.pools):  # what the DRA driver publishes, once the nodes exist (owner references)
            timings["resource_slices"] = float(publish_dra(self.api, pools))
        wait_nodes_ready(self.api, [n["metadata"]["name"] for n in nodes], timeout=timeout)
        timings["nodes_ready_s"] = time.monotonic() - t0
        return timings

    def service_account_kubeconfig(self, rbac: Path, account: str, namespace: str = "gpuaas-system") -> Path:
        """Apply the ServiceAccounts and RBAC of `rbac` (a kustomize base of deploy/, rendered as `kubectl apply -k`
        would, or a plain manifest file) and write a kubeconfig that holds a token of ServiceAccount `account` in
        `namespace`: a component started with it has exactly the permissions gpuaas ships."""
        core = client.CoreV1Api(self.api)
        try:
            core.create_namespace({"metadata": {"name": namespace}})
        except ApiException as err:
            if err.status != 409:
                raise
        text = self.control_plane.kubectl("kustomize", str(rbac)).stdout if rbac.is_dir() else rbac.read_text()
        objects = [d for d in yaml.safe_load_all(text) if d and d.get("kind") in RBAC_KINDS]
        if not any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account for d in objects):
            raise ValueError(f"{rbac}: no ServiceAccount {account}")
        for d in objects:  # a RoleBinding may name another namespace (kube-system); the rest go to `namespace`
            if not d["kind"].startswith("Cluster"):
                d["metadata"].setdefault("namespace", namespace)
        self.control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
        token = core.create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 24 * 3600}}).status.token
        config = yaml.safe_load(self.kubeconfig.read_text())
        config["users"] = [{"name": u["name"], "user": {"token": token}} for u in config["users"]]
        # What a pod of this ServiceAccount sees as its own namespace (leader election puts its Lease there).
        for ctx in config.get("contexts", []):
            ctx["context"]["namespace"] = namespace
        path = self.kubeconfig.parent / f"{account}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def down(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None
        self.control_plane.stop()

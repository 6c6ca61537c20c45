"""What the NVIDIA GPU operator does on a real node and kwok does not: a fake MIG manager and device-plugin
registration for KWOK GPU nodes, as a thread beside the local cluster.

MIG manager. The GPU operator's mig-manager watches the node label `nvidia.com/mig.config`; when it changes it sets
`nvidia.com/mig.config.state=pending`, repartitions the GPUs and the device plugin re-advertises the instances, then
the state becomes `success` (or `failed`). Here: a node labelled `nvidia.com/mig.config.state=pending` gets the
allocatable resources and `nvidia.com/mig-*.count` labels that `runtime/pools.node_objects` renders for that
config (the same code that renders every GPU node of the pools and node groups), then `success`. A node with GPU pods
on it is refused with `failed`, as the real manager will not repartition GPUs in use.

Device-plugin registration. Nodes the KWOK node provider creates (nodescaler/provider.py) register without GPU
resources and carry the resources to advertise and the time to do it in annotations; at that time the resources are
published, as the device plugin does once the driver is up. A node of a DRA group carries its template instead: at
that time its ResourceSlices are created (gpuaas/cluster/dra.py, runtime/draslices.py), owned by the Node, as the
NVIDIA DRA driver's kubelet plugin publishes them once the driver is up. This stands in for the driver, which no KWOK
node runs.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from nodescaler.provider import (
    DRA_TEMPLATE_ANNOTATION,
    GPU_READY_AT_ANNOTATION,
    GPU_RESOURCES_ANNOTATION,
    REGISTERING_LABEL,
)
from runtime.pools import Pool, node_objects
from scoring.gpus import MIG_RESOURCE_PREFIX, model_by_product
from scoring.kubeobjects import (
    COUNT_LABEL,
    GPU_RESOURCE,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    POOL_LABEL,
    PRODUCT_LABEL,
    gpu_replicas,
    holds_resources,
    requests_gpu,
)

from .dra import publish_node_slices

log = logging.getLogger("gpuaas.cluster.migmanager")


def mig_resources(node: dict[str, Any], config: str) -> tuple[dict[str, str], dict[str, str]]:
    """(GPU resources, MIG labels) a node has under MIG config `config`, as pools.node_objects renders them.
    Raises ValueError (pydantic's, naming the field) for a config that does not apply to the node's GPU."""
    labels = node["metadata"].get("labels") or {}
    model = model_by_product(labels.get(PRODUCT_LABEL, ""))
    if model is None:
        raise ValueError(f"node {node['metadata']['name']}: unknown GPU product {labels.get(PRODUCT_LABEL)!r}")
    count = int(labels.get(COUNT_LABEL, "0"))
    mig = None if config == "all-disabled" else config
    replicas = gpu_replicas(labels, f"node {node['metadata']['name']}")  # time-slicing stays as the node had it
    pool = Pool.model_validate({"name": "x", "count": 1, "gpu": {"model": model.name, "count": count, "mig": mig,
                                                                 "replicas": replicas}})
    rendered = node_objects(pool)[0]
    res = {k: v for k, v in rendered["status"]["allocatable"].items()
           if k == GPU_RESOURCE or k.startswith(MIG_RESOURCE_PREFIX)}
    mig_labels = {k: v for k, v in rendered["metadata"]["labels"].items() if k.startswith(MIG_RESOURCE_PREFIX)}
    return res, mig_labels


class FakeNodeAgent:
    def __init__(self, api: client.ApiClient, *, interval: float = 0.2):
        self.core = client.CoreV1Api(api)
        self.api = api
        self.interval = interval
        self.applied: list[tuple[str, str, str]] = []  # (node, config, outcome)
        self.registered: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> FakeNodeAgent:
        self._thread = threading.Thread(target=self._run, name="fake-node-agent", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception as err:  # the apiserver going away at the end of a test, mostly
                log.warning("fake node agent: %s", err)
            self._stop.wait(self.interval)

    def _list(self, selector: str) -> list[dict[str, Any]]:
        resp = self.core.list_node(label_selector=selector, _preload_content=False)
        return json.loads(resp.data)["items"]

    def _patch(self, name: str, body: dict[str, Any], status: bool = False) -> None:
        patch = self.core.patch_node_status if status else self.core.patch_node
        patch(name, body, _content_type="application/merge-patch+json", _preload_content=False)

    def sync_once(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        for node in self._list(REGISTERING_LABEL):
            ann = node["metadata"].get("annotations") or {}
            if float(ann.get(GPU_READY_AT_ANNOTATION, "0")) <= now:
                self._publish(node, json.loads(ann.get(GPU_RESOURCES_ANNOTATION, "{}")))
        for node in self._list(f"{MIG_STATE_LABEL}=pending"):
            self._apply_mig(node)

    def _publish(self, node: dict[str, Any], resources: dict[str, str]) -> None:
        name = node["metadata"]["name"]
        template = (node["metadata"].get("annotations") or {}).get(DRA_TEMPLATE_ANNOTATION)
        try:
            if template is not None:
                group = (node["metadata"].get("labels") or {}).get(POOL_LABEL) or "dra"
                pool = Pool.model_validate({**json.loads(template), "name": group, "count": 1})
                publish_node_slices(self.api, pool, name, node["metadata"]["uid"])
            if resources:
                self._patch(name, {"status": {"capacity": resources, "allocatable": resources}}, status=True)
            self._patch(name, {"metadata": {"labels": {REGISTERING_LABEL: None}}})
            self.registered.append(name)
        except ApiException as err:
            if err.status != 404:
                raise

    def _apply_mig(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        config = labels.get(MIG_CONFIG_LABEL, "all-disabled")
        pods = json.loads(self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}",
                                                                _preload_content=False).data)["items"]
        if any(holds_resources(p) and requests_gpu(p) for p in pods):
            self._patch(name, {"metadata": {"labels": {MIG_STATE_LABEL: "failed"}}})
            self.applied.append((name, config, "failed: GPUs in use"))
            return
        try:
            res, mig_labels = mig_resources(node, config)
        except ValueError as err:
            log.warning("MIG config %s on %s: %s", config, name, err)
            self._patch(name, {"metadata": {"labels": {MIG_STATE_LABEL: "failed"}}})
            self.applied.append((name, config, f"failed: {err}"))
            return
        old = node["status"].get("allocatable") or {}
        stale = {k: None for k in old if k.startswith(MIG_RESOURCE_PREFIX) and k not in res}
        self._patch(name, {"status": {"capacity": {**stale, **res}, "allocatable": {**stale, **res}}}, status=True)
        stale_labels = {k: None for k in labels if k.startswith(MIG_RESOURCE_PREFIX) and k not in mig_labels}
        self._patch(name, {"metadata": {"labels": {**stale_labels, **mig_labels, MIG_STATE_LABEL: "success"}}})
        self.applied.append((name, config, "success"))

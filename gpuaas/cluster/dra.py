"""What the NVIDIA DRA driver's kubelet plugin and Helm chart do on a real cluster and kwok does not: the DeviceClasses,
and for each node of a pool declared `dra: true` its ResourceSlices (runtime/draslices.py), owned by the Node so they
go when it goes (the plugin's ResourceSlice controller sets the same owner reference)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from runtime.draslices import device_classes, resource_slices
from runtime.pools import POOL_LABEL, Pool, PoolSpec


def _create(fn: Any, body: dict[str, Any]) -> None:
    try:
        fn(body, _preload_content=False)
    except ApiException as err:
        if err.status != 409:
            raise


def create_device_classes(api: client.ApiClient) -> None:
    resource = client.ResourceV1Api(api)
    for cls in device_classes():
        _create(resource.create_device_class, cls)


def owned_slices(pool: Pool, name: str, uid: str) -> list[dict[str, Any]]:
    """The ResourceSlices of node `name` (uid `uid`) of DRA pool `pool`, owned by the Node."""
    slices = resource_slices(pool, name)
    for s in slices:
        s["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid,
                                             "controller": True}]
    return slices


def dra_slices(pools: PoolSpec, node_uids: dict[str, str]) -> list[dict[str, Any]]:
    """The ResourceSlices of every node of the DRA pools among `node_uids` (name -> uid of the Node objects)."""
    slices = []
    for pool in pools.pools:
        if not pool.dra:
            continue
        for i in range(pool.count):
            name = f"{pool.name}-{i:04d}"
            if name in node_uids:
                slices += owned_slices(pool, name, node_uids[name])
    return slices


def publish_node_slices(api: client.ApiClient, pool: Pool, name: str, uid: str) -> int:
    """Create the ResourceSlices of one node of a DRA pool (existing ones are left alone): what the driver's kubelet
    plugin does when the driver is up on a new node. Returns how many."""
    resource = client.ResourceV1Api(api)
    slices = owned_slices(pool, name, uid)
    for s in slices:
        _create(resource.create_resource_slice, s)
    return len(slices)


def publish_dra(api: client.ApiClient, pools: PoolSpec, workers: int = 16) -> int:
    """Create the DeviceClasses (where any pool is a DRA pool, also one of no nodes yet: a node group's, whose nodes'
    slices the node agent publishes as they come) and the ResourceSlices of the pools' DRA nodes (which must exist);
    existing objects are left alone. Returns how many slices were asked for."""
    if any(p.dra for p in pools.pools):
        create_device_classes(api)
    dra_pools = [p for p in pools.pools if p.dra and p.count]
    if not dra_pools:
        return 0
    core = client.CoreV1Api(api)
    uids: dict[str, str] = {}
    for pool in dra_pools:
        for node in core.list_node(label_selector=f"{POOL_LABEL}={pool.name}").items:
            uids[node.metadata.name] = node.metadata.uid
    slices = dra_slices(pools, uids)
    resource = client.ResourceV1Api(api)
    with ThreadPoolExecutor(max_workers=workers) as executor:
        list(executor.map(lambda s: _create(resource.create_resource_slice, s), slices))
    return len(slices)

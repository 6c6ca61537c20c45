"""Put pool nodes into a running cluster and wait until kwok reports them Ready."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from runtime.pools import POOL_LABEL


class NodesNotReady(TimeoutError):
    pass


def create_nodes(api: client.ApiClient, nodes: list[dict[str, Any]], workers: int = 16) -> None:
    """Create Node objects (status included: the apiserver keeps a new Node's status). Existing ones are left alone."""
    core = client.CoreV1Api(api)

    def create(node: dict[str, Any]) -> None:
        try:
            core.create_node(node, _preload_content=False)
        except ApiException as err:
            if err.status != 409:
                raise

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(create, nodes))


def ready_node_names(api: client.ApiClient, label_selector: str = POOL_LABEL) -> set[str]:
    ready = set()
    for node in client.CoreV1Api(api).list_node(label_selector=label_selector).items:
        for cond in node.status.conditions or ():
            if cond.type == "Ready" and cond.status == "True":
                ready.add(node.metadata.name)
    return ready


def wait_nodes_ready(api: client.ApiClient, names: set[str] | list[str], timeout: float = 120.0) -> float:
    """Block until every named node is Ready; return the seconds it took."""
    start = time.monotonic()
    want = set(names)
    while True:
        missing = want - ready_node_names(api)
        if not missing:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            sample = ", ".join(sorted(missing)[:5])
            raise NodesNotReady(f"{len(missing)} of {len(want)} nodes not Ready after {timeout:.0f}s (e.g. {sample})")
        time.sleep(0.5)

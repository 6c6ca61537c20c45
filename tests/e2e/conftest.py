"""One real control plane with KWOK GPU nodes for the whole session; each test works in its own namespace."""
from __future__ import annotations

import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuaas.cluster.local import LocalCluster
from runtime.pools import parse_pool_spec
from tests.deploy.manifests import DEPLOY

# Small, but with every kind of node the tests need: whole-GPU A100 and H100 nodes, and a MIG pool.
E2E_POOLS = {
    "pools": [
        {"name": "a100", "count": 3, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"},
        {"name": "h100", "count": 2, "gpu": {"model": "H100-80GB", "count": 4}, "cpu": "96", "memory": "1Ti"},
        {"name": "a100-mig", "count": 2, "gpu": {"model": "A100-80GB", "count": 8, "mig": "all-3g.40gb"},
         "cpu": "128", "memory": "1Ti"},
    ]
}


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cluster")
    local = LocalCluster(workdir, name="e2e")
    try:
        local.up(parse_pool_spec(E2E_POOLS), timeout=120)
    except BaseException:
        local.down()
        raise
    yield local
    local.down()
    print(f"\ncontrol-plane logs kept in {local.control_plane.logs}")


@pytest.fixture
def namespace(cluster):
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@pytest.fixture
def gpuaas_namespace(cluster):
    """The namespaces deploy/'s overlays install into, for server-side dry runs (a dry run creates nothing, so the
    objects inside a namespace the overlay creates would not find it). gpuaas-system is applied from deploy/ for
    real, with its Pod Security label; monitoring stands for the namespace of the user's Prometheus and Grafana."""
    cluster.control_plane.kubectl("apply", "-k", str(DEPLOY / "bases" / "namespace"))
    try:
        client.CoreV1Api(cluster.api).create_namespace({"metadata": {"name": "monitoring"}})
    except ApiException as err:
        if err.status != 409:
            raise


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # A failed end-to-end test says where the component logs are and whether a component died.
    if report.failed and "cluster" in getattr(item, "funcargs", {}):
        cp = item.funcargs["cluster"].control_plane
        dead = [n for n, s in cp.status().items() if not s["running"]] if cp.state else []
        report.sections.append(("control plane", f"logs: {cp.logs}\ndead components: {dead or 'none'}"))

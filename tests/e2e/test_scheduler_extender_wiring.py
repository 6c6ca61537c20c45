"""The harness' KubeSchedulerConfiguration names an HTTP extender, and the real kube-scheduler calls it.

A throwaway extender (a few lines of aiohttp in a thread) accepts only one node; a GPU pod must land there, and a pod
without GPU requests must never be sent to it (`managedResources`)."""
from __future__ import annotations

import asyncio
import threading

import pytest
from aiohttp import web
from kubernetes import client

from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.process import free_port
from gpuaas.workloads import gpu_pod
from runtime.pools import parse_pool_spec

from .kube import pod, pod_phase, wait_for

CHOSEN = "gpu-0002"


class OneNodeExtender:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def filter(self, request: web.Request) -> web.Response:
        args = await request.json()
        self.calls.append(("filter", args["Pod"]["metadata"]["name"]))
        names = args["NodeNames"]
        return web.json_response({
            "NodeNames": [n for n in names if n == CHOSEN],
            "FailedNodes": {n: "not the chosen one" for n in names if n != CHOSEN},
            "FailedAndUnresolvableNodes": None, "Error": "",
        })

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/scheduler/filter", self.filter)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> OneNodeExtender:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def extender():
    with OneNodeExtender() as ext:
        yield ext


def test_real_scheduler_calls_the_configured_extender(tmp_path, extender):
    cluster = LocalCluster(tmp_path / "cluster", name="ext", extenders=[{
        "urlPrefix": f"http://127.0.0.1:{extender.port}/scheduler",
        "filterVerb": "filter",
        "nodeCacheCapable": True,
        "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}],
        "ignorable": False,
    }])
    try:
        cluster.up(parse_pool_spec({"pools": [{"name": "gpu", "count": 4, "gpu": {"model": "A100-80GB", "count": 8}}]}))
        core = client.CoreV1Api(cluster.api)
        for i in range(3):
            core.create_namespaced_pod("default", gpu_pod(f"gpu-pod-{i}", gpus=1))
        core.create_namespaced_pod("default", gpu_pod("cpu-pod", cpu="1"))
        for i in range(3):
            wait_for(lambda i=i: pod_phase(cluster.api, "default", f"gpu-pod-{i}") == "Running", what="GPU pod Running")
            assert pod(cluster.api, "default", f"gpu-pod-{i}").spec.node_name == CHOSEN
        wait_for(lambda: pod_phase(cluster.api, "default", "cpu-pod") == "Running", what="CPU pod Running")
        assert {name for verb, name in extender.calls} == {"gpu-pod-0", "gpu-pod-1", "gpu-pod-2"}
    finally:
        cluster.down()

"""The informer against the real kube-apiserver: objects far over aiohttp's 512 KiB line limit stream through the watch.

A pod's annotations may hold at most 256 KiB (the apiserver's TotalAnnotationSizeLimitB), so the pod here is made big
the way a real one is: 1 MiB of environment values in its spec. Its creation and a later label change each arrive as
one watch event of more than 1 MiB (as does kube-scheduler's status update between them); the informer must see them
without listing again."""
from __future__ import annotations

import asyncio

from kubernetes import client

from runtime.informer import Informer
from runtime.kubeclient import ApiEndpoint

MiB = 1024 * 1024


def big_pod(name: str) -> dict:
    env = [{"name": f"BLOB_{i}", "value": "x" * (64 * 1024)} for i in range(16)]  # 16 x 64 KiB = 1 MiB
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"step": "created"}},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "env": env}],
                     "nodeSelector": {"gpuaas.io/nowhere": "true"}}}  # never scheduled: nothing else changes it


def test_a_pod_update_of_more_than_1_mib_reaches_the_informer_without_a_relist(cluster, namespace):
    core = client.CoreV1Api(cluster.api)
    seen: list[tuple[str | None, str | None]] = []

    async def go() -> Informer:
        endpoint = ApiEndpoint.from_kubeconfig(cluster.kubeconfig)
        updated = asyncio.Event()

        def on_change(kind, old, new):
            if (new or old)["metadata"]["name"] != "big":
                return
            seen.append((old and old["metadata"]["labels"]["step"], new and new["metadata"]["labels"]["step"]))
            if new and new["metadata"]["labels"]["step"] == "labelled":
                updated.set()

        inf = Informer(endpoint, f"/api/v1/namespaces/{namespace}/pods", kind="Pod", on_change=on_change)
        async with endpoint.session() as session:
            task = asyncio.create_task(inf.run(session))
            await inf.synced.wait()
            await asyncio.to_thread(core.create_namespaced_pod, namespace, big_pod("big"))
            while not seen:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(core.patch_namespaced_pod, "big", namespace,
                                    {"metadata": {"labels": {"step": "labelled"}}})
            await asyncio.wait_for(updated.wait(), timeout=60)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return inf

    inf = asyncio.run(go())
    # Created, then (the scheduler marking it unschedulable: a status update, also over 1 MiB), then labelled.
    assert seen[0] == (None, "created") and seen[-1] == ("created", "labelled"), seen
    assert (inf.relists, inf.errors) == (1, 0)
    env = inf.store[f"{namespace}/big"]["spec"]["containers"][0]["env"]
    assert sum(len(e["value"]) for e in env) == MiB

"""The extender's HTTP surface on a static snapshot: verbs, wire format, operability, and bad input."""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender.config import ExtenderConfig
from extender.server import load_snapshot, snapshot_app
from extender.wire import HostPriority

from .fixtures import bound, names, nodes, pending


def run(coro):
    return asyncio.run(coro)


def client(items=None, **config):
    items = nodes() if items is None else items
    return TestClient(TestServer(snapshot_app(ExtenderConfig(**config), items)))


async def post(c, path, body):
    resp = await c.post(path, data=body if isinstance(body, (bytes, str)) else json.dumps(body),
                        headers={"Content-Type": "application/json"})
    return resp.status, await resp.json()


def test_filter_splits_feasible_failed_and_unresolvable():
    # a100-0000 already runs a 6-GPU pod on GPUs 0-5, so a 4-GPU pod no longer fits there (2 free).
    items = nodes() + [bound(pending("busy", gpus=6), "a100-0000", "0,1,2,3,4,5")]

    async def go():
        async with client(items) as c:
            return await post(c, "/filter", {"Pod": pending("p", gpus=4), "NodeNames": names(), "Nodes": None})

    status, body = run(go())
    assert status == 200
    assert body["NodeNames"] == ["a100-0001", "a100-0002", "h100-0000", "h100-0001"]
    assert body["FailedNodes"]["a100-0000"] == "insufficient whole GPUs: 2 free, 4 requested"
    assert body["FailedAndUnresolvableNodes"] == {"cpu-0000": "node has no GPUs"}
    assert "mig-0000" in body["FailedNodes"]  # MIG GPUs could be turned back into whole ones: resolvable
    assert body["Error"] == "" and body["Nodes"] is None


def test_structural_misfits_are_unresolvable_with_a_reason_a_user_understands():
    wants_h100 = pending("h100-only", gpus=1)
    wants_h100["metadata"]["annotations"] = {"gpuaas.io/gpu-models": "H100-80GB"}

    async def go():
        async with client() as c:
            a = await post(c, "/filter", {"Pod": wants_h100, "NodeNames": names()})
            b = await post(c, "/filter", {"Pod": pending("huge", gpus=16), "NodeNames": names()})
            d = await post(c, "/filter", {"Pod": pending("mig-a30", mig="1g.6gb"), "NodeNames": names()})
            return a, b, d

    (sa, a), (sb, b), (sd, d) = run(go())
    assert a["NodeNames"] == ["h100-0000", "h100-0001"]
    assert a["FailedAndUnresolvableNodes"]["a100-0001"] == \
        "GPU model A100-80GB is not one the pod accepts (H100-80GB)"
    assert b["NodeNames"] == [] and b["FailedAndUnresolvableNodes"]["a100-0000"] == \
        "pod asks for 16 GPUs, the node has 8"
    assert d["FailedAndUnresolvableNodes"]["mig-0000"].startswith("no MIG layout of A100-80GB has a 1g.6gb instance")


def test_mig_pod_fits_only_where_an_instance_is_free():
    async def go():
        async with client() as c:
            return await post(c, "/filter", {"Pod": pending("m", mig="3g.40gb"), "NodeNames": names()})

    _, body = run(go())
    assert body["NodeNames"] == ["mig-0000"]


def test_without_node_cache_the_node_list_comes_back_filtered():
    node_list = {"kind": "NodeList", "apiVersion": "v1", "items": nodes()}

    async def go():
        async with client() as c:
            return await post(c, "/filter", {"Pod": pending("m", mig="3g.40gb"), "Nodes": node_list,
                                             "NodeNames": None})

    _, body = run(go())
    assert body["NodeNames"] is None
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["mig-0000"]


def test_prioritize_scores_every_candidate_in_0_to_10():
    # The only pod shape in the cluster is a 6-GPU pod, on a100-0000 (2 GPUs left). Those 2 GPUs are fragments for
    # that shape already; a 2-GPU pod there removes them, while on an idle A100 it leaves 6 free, still enough for the
    # next 6-GPU pod. A fragmentation-aware policy ranks a100-0000 first.
    items = nodes() + [bound(pending("busy", gpus=6), "a100-0000", "0,1,2,3,4,5")]

    async def go():
        async with client(items) as c:
            return await post(c, "/prioritize", {"Pod": pending("p", gpus=2), "NodeNames": names()})

    status, body = run(go())
    assert status == 200
    assert [HostPriority.model_validate(h).Host for h in body] == names()  # the wire shape, scores within 0..10
    scores = {h["Host"]: h["Score"] for h in body}
    assert scores["cpu-0000"] == 0 and scores["mig-0000"] == 0  # infeasible candidates score 0
    assert scores["a100-0000"] == 10 and scores["a100-0000"] > scores["a100-0001"]


def test_operability_endpoints():
    async def go():
        async with client() as c:
            await post(c, "/filter", {"Pod": pending("p", gpus=1), "NodeNames": names()})
            health = (await c.get("/healthz")).status
            ready = (await c.get("/readyz")).status
            metrics = await (await c.get("/metrics")).text()
            explain = await (await c.get("/explain", params={"pod": "ml/x", "node": "a100-0000"})).json()
            return health, ready, metrics, explain

    health, ready, metrics, explain = run(go())
    assert (health, ready) == (200, 200)
    assert 'gpuaas_extender_request_duration_seconds_count{verb="filter"} 1.0' in metrics
    assert 'gpuaas_extender_cache_objects{kind="gpu_nodes"} 6.0' in metrics
    assert explain == {"error": "pod ml/x not found"}


def test_explain_says_why_a_node_was_rejected_and_how_one_scored():
    items = nodes() + [pending("wants-mig", mig="3g.40gb")]

    async def go():
        async with client(items) as c:
            rejected = await (await c.get("/explain", params={"pod": "ml/wants-mig", "node": "cpu-0000"})).json()
            scored = await (await c.get("/explain", params={"pod": "ml/wants-mig", "node": "mig-0000"})).json()
            return rejected, scored

    rejected, scored = run(go())
    assert rejected == {"node": "cpu-0000", "pod": "ml/wants-mig", "fits": False, "resolvable": False,
                        "reason": "node has no GPUs"}
    assert scored["fits"] is True and scored["rank"] == 1 and scored["candidates"] == 1 and scored["score"] == 10


def test_bind_in_snapshot_mode_reports_an_error_and_releases_the_gpus():
    items = nodes() + [pending("p", gpus=8)]

    async def go():
        async with client(items) as c:
            first = await post(c, "/bind", {"PodName": "p", "PodNamespace": "ml", "PodUID": "uid-p",
                                            "Node": "a100-0000"})
            after = await post(c, "/filter", {"Pod": pending("q", gpus=8), "NodeNames": ["a100-0000"]})
            return first, after

    (s1, first), (_, after) = run(go())
    assert s1 == 200 and "cannot bind" in first["Error"]
    assert after["NodeNames"] == ["a100-0000"]  # the failed bind did not keep the GPUs


BAD_REQUESTS = {
    "malformed-json": (b'{"Pod": {', 400, "not JSON"),
    "empty-body": (b"", 400, "empty"),
    "missing-pod": ({"NodeNames": ["a100-0000"]}, 400, "Pod: Field required"),
    "pod-without-name": ({"Pod": {"spec": {}}, "NodeNames": []}, 400, "Pod.metadata.name is required"),
    "wrong-type": ({"Pod": pending("p", gpus=1), "NodeNames": "a100-0000"}, 400, "NodeNames: Input should be"),
    "bad-quantity": ({"Pod": pending("p", gpus=1) | {"spec": {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "lots"}}}]}}, "NodeNames": []}, 400,
        "'lots' is not a Kubernetes quantity"),
    "unknown-nodes": ({"Pod": pending("p", gpus=1), "NodeNames": ["ghost-1", "ghost-2"]}, 422,
                      "none of the 2 node names is known to gpuaas"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_input_gets_a_4xx_with_a_message_and_the_next_request_is_served(case):
    body, status, message = BAD_REQUESTS[case]

    async def go():
        async with client() as c:
            bad = await post(c, "/filter", body)
            good = await post(c, "/filter", {"Pod": pending("p", gpus=1), "NodeNames": names()})
            return bad, good

    (bad_status, bad_body), (good_status, good_body) = run(go())
    assert bad_status == status and message in bad_body["error"], bad_body
    assert good_status == 200 and good_body["NodeNames"]


def test_a_few_unknown_nodes_fail_alone():
    async def go():
        async with client() as c:
            return await post(c, "/filter", {"Pod": pending("p", gpus=1), "NodeNames": ["a100-0000", "new-node"]})

    status, body = run(go())
    assert status == 200 and body["NodeNames"] == ["a100-0000"]
    assert "not (yet) in gpuaas's cache" in body["FailedNodes"]["new-node"]


def test_ten_megabyte_body_is_refused_with_413():
    big = json.dumps({"Pod": pending("p", gpus=1), "NodeNames": ["x" * 100] * 110_000}).encode()
    assert len(big) > 10 * 2**20

    async def go():
        async with client() as c:
            bad = await post(c, "/filter", big)
            good = await post(c, "/filter", {"Pod": pending("p", gpus=1), "NodeNames": names()})
            return bad, good

    (bad_status, bad_body), (good_status, _) = run(go())
    assert bad_status == 413 and "larger than" in bad_body["error"]
    assert good_status == 200


def test_slow_client_gets_408_and_others_are_served_meanwhile():
    async def go():
        async with client(read_timeout_seconds=0.5) as c:
            host, port = c.server.host, c.server.port
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"Pod\":")  # ... and then nothing more
            await writer.drain()
            good = await post(c, "/filter", {"Pod": pending("p", gpus=1), "NodeNames": names()})
            reply = await asyncio.wait_for(reader.read(4096), timeout=5)
            writer.close()
            return good, reply

    (good_status, _), reply = run(go())
    assert good_status == 200
    assert reply.startswith(b"HTTP/1.1 408")


def test_snapshot_file_as_kubectl_prints_it(tmp_path):
    import yaml

    path = tmp_path / "snap.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes()}))
    assert len(load_snapshot(path)) == 7
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [{"kind": "Service"}]}))
    with pytest.raises(ValueError, match="not Nodes or Pods"):
        load_snapshot(path)
    # -o json (read with orjson), and several YAML documents
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes()}))
    assert [i["metadata"]["name"] for i in load_snapshot(path)] == [n["metadata"]["name"] for n in nodes()]
    path.write_text(yaml.safe_dump_all(nodes()[:2]))
    assert len(load_snapshot(path)) == 2
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="document 1 is a list"):
        load_snapshot(path)
    path.write_text("kind: [unclosed")
    with pytest.raises(ValueError, match="cannot read snapshot"):
        load_snapshot(path)


def test_a_valid_pod_gpuaas_cannot_place_gets_an_error_the_scheduler_shows():
    pod = pending("both", gpus=1)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "1"

    async def go():
        async with client() as c:
            return await post(c, "/filter", {"Pod": pod, "NodeNames": names()})

    status, body = run(go())
    assert status == 200 and "asks for more than one kind of GPU" in body["Error"]


def test_a_serving_process_builds_the_model_and_freezes_the_heap_once_synced():
    import gc

    from extender.server import SERVICE, warm_up_once_synced

    app = snapshot_app(ExtenderConfig(), nodes())
    warm_up_once_synced(app)
    view = app[SERVICE].view
    assert view.state is None  # built lazily, by the first request, without the warm-up

    async def go():
        async with TestClient(TestServer(app)):
            for _ in range(100):
                if view.state is not None:
                    return gc.get_freeze_count()
                await asyncio.sleep(0.02)
            return None

    try:
        frozen = run(go())
    finally:
        gc.unfreeze()  # a test process builds many apps: give their objects back to the collector
    assert view.state is not None and len(view.state) == len(nodes())
    assert frozen and frozen > 0

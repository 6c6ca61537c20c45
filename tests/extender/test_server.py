"""The extender's HTTP surface on a static snapshot: verbs, wire format, operability, and bad input."""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender.config import ExtenderConfig
from extender.server import SERVICE, load_snapshot, snapshot_app
from extender.wire import HostPriority
from runtime.pools import parse_pool_spec, spec_node_objects

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
        async with client(items, decide_in_filter=False) as c:  # every feasible node back, not gpuaas's pick
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
        async with client(decide_in_filter=False) as c:
            a = await post(c, "/filter", {"Pod": wants_h100, "NodeNames": names()})
            b = await post(c, "/filter", {"Pod": pending("huge", gpus=16), "NodeNames": names()})
            d = await post(c, "/filter", {"Pod": pending("mig-a30", mig="1g.6gb"), "NodeNames": names()})
            return a, b, d

    (_sa, a), (_sb, b), (_sd, d) = run(go())
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
    listed = [HostPriority.model_validate(h).Host for h in body]  # the wire shape, scores within 0..10
    assert listed == [n for n in names() if n in listed]  # in the candidates' order
    scores = {h["Host"]: h["Score"] for h in body}
    # Infeasible candidates score 0, which is left out: kube-scheduler adds nothing for a host not listed either.
    assert "cpu-0000" not in scores and "mig-0000" not in scores and all(scores.values())
    assert scores["a100-0000"] == 10 and scores["a100-0000"] > scores.get("a100-0001", 0)


def test_the_cpu_pod_entry_ranks_pods_without_gpus_and_answers_gpu_pods_empty():
    """/cpu/prioritize (extender.schedconfig.cpu_pods_entry): a pod that asks for no GPU is ranked as /prioritize ranks
    it; a GPU pod, which that entry cannot leave out, gets [] (its ranking is the GPU entry's)."""
    items = nodes() + [bound(pending("busy", gpus=6), "a100-0000", "0,1,2,3,4,5")]
    cpu_pod = pending("web", cpu="24")

    async def go():
        async with client(items) as c:
            return (await post(c, "/cpu/prioritize", {"Pod": cpu_pod, "NodeNames": names()}),
                    await post(c, "/prioritize", {"Pod": cpu_pod, "NodeNames": names()}),
                    await post(c, "/cpu/prioritize", {"Pod": pending("g", gpus=1), "NodeNames": names()}))

    (status, ranked), (_, again), (gpu_status, gpu_answer) = run(go())
    assert status == 200 and [h["Host"] for h in ranked] == [n for n in names() if n in {h["Host"] for h in ranked}]
    for answer in (ranked, again):  # (the first call holds its pick, as prioritize does; the order stays)
        score = {h["Host"]: h["Score"] for h in answer}
        # 24 cores strand no GPU on the CPU node, and strand the idle GPUs of an idle GPU node most (0: not listed).
        assert score["cpu-0000"] == 10 and "a100-0001" not in score and "h100-0000" not in score
        assert score["cpu-0000"] > score["mig-0000"] > score["a100-0000"] > 0
    assert (gpu_status, gpu_answer) == (200, [])


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


def with_spec(**spec):
    return pending("p", gpus=1) | {"spec": spec}


def with_requests(requests):
    return with_spec(containers=[{"name": "c", "resources": {"requests": requests}}])


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
    # Defect 6: each of these was a 500 with a traceback.
    "containers-not-a-list": ({"Pod": with_spec(containers="x"), "NodeNames": []}, 400,
                              "spec.containers: must be a list, got str"),
    "container-not-an-object": ({"Pod": with_spec(containers=[1]), "NodeNames": []}, 400,
                                "spec.containers[0]: must be an object"),
    "requests-not-an-object": ({"Pod": with_requests([]), "NodeNames": []}, 400,
                               "resources.requests: must be an object"),
    "node-item-without-name": ({"Pod": pending("p", gpus=1), "Nodes": {"items": [{"metadata": {}}]}}, 400,
                               "Nodes.items[0].metadata.name is required"),
    "node-item-not-an-object": ({"Pod": pending("p", gpus=1), "Nodes": {"items": ["a100-0000"]}}, 400,
                                "Nodes.items[0].metadata.name is required"),
    "quantity-infinity": ({"Pod": with_requests({"cpu": "Infinity"}), "NodeNames": []}, 400,
                          "cpu: 'Infinity' is not a Kubernetes quantity"),
    "quantity-nan": ({"Pod": with_requests({"nvidia.com/gpu": "NaN"}), "NodeNames": []}, 400,
                     "nvidia.com/gpu: 'NaN' is not a Kubernetes quantity"),
    "quantity-huge-exponent": ({"Pod": with_requests({"memory": "1e999999999"}), "NodeNames": []}, 400,
                               "larger than 9223372036854775807"),
    "quantity-5000-digits": ({"Pod": with_requests({"cpu": "9" * 5000}), "NodeNames": []}, 400,
                             "(5002 characters) is not a Kubernetes quantity: larger than"),
    "quantity-underscore": ({"Pod": with_requests({"cpu": "1_000"}), "NodeNames": []}, 400,
                            "'1_000' is not a Kubernetes quantity"),
    "quantity-not-a-string": ({"Pod": with_requests({"cpu": [1]}), "NodeNames": []}, 400,
                              "must be a quantity string or a number, got list"),
    # Defect 12: a negative request was read as 0.
    "quantity-negative": ({"Pod": with_requests({"nvidia.com/gpu": "-2"}), "NodeNames": names()}, 400,
                          "nvidia.com/gpu: '-2' must be non-negative"),
    "annotations-not-an-object": ({"Pod": pending("p", gpus=1) | {"metadata": {"name": "p", "annotations": "x"}},
                                   "NodeNames": []}, 400, "metadata.annotations: must be an object"),
    "affinity-values-not-strings": ({"Pod": with_spec(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": [{"x": 1}]}]}]}}}), "NodeNames": []}, 400,
        "matchExpressions[0].values: must be a string"),
    "too-many-containers": ({"Pod": with_spec(containers=[{"name": f"c{i}"} for i in range(10_001)]),
                             "NodeNames": []}, 400, "10001 containers and init containers, more than the 10000"),
    # Defect 4: names that are not Kubernetes names never reach the model or a URL.
    "pod-name-with-a-path": ({"Pod": pending("p", gpus=1) | {"metadata": {"name": "x/../../nodes/n"}},
                              "NodeNames": []}, 400, "Pod.metadata.name: 'x/../../nodes/n' is not a DNS-1123"),
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


def test_the_same_node_list_again_is_judged_on_the_nodes_known_now():
    # filter keeps the last list's model rows for the next pod (kube-scheduler sends the same list pod after pod): a
    # node the watch delivers in between must count, and a node it removes must not.
    extra = spec_node_objects(parse_pool_spec({"pools": [
        {"name": "new", "count": 1, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"}]}))[0]
    listed = ["a100-0000", extra["metadata"]["name"]]

    async def go():
        async with client(decide_in_filter=False) as c:
            view = c.server.app[SERVICE].view
            first = await post(c, "/filter", {"Pod": pending("p", gpus=1), "NodeNames": listed})
            view.on_change("Node", None, extra)
            second = await post(c, "/filter", {"Pod": pending("q", gpus=1), "NodeNames": listed})
            view.on_change("Node", view.nodes["a100-0000"], None)
            third = await post(c, "/filter", {"Pod": pending("r", gpus=1), "NodeNames": listed})
            return first, second, third

    (s1, first), (s2, second), (s3, third) = run(go())
    assert (s1, s2, s3) == (200, 200, 200)
    assert first["NodeNames"] == ["a100-0000"] and "not (yet)" in first["FailedNodes"][listed[1]]
    assert second["NodeNames"] == listed and second["FailedNodes"] == {}
    assert third["NodeNames"] == [listed[1]] and "not (yet)" in third["FailedNodes"]["a100-0000"]


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


@pytest.mark.parametrize("field,value,message", [
    ("PodName", "x/../../nodes/a100-0000", "PodName: 'x/../../nodes/a100-0000' is not a DNS-1123 subdomain"),
    ("PodNamespace", "ml?resourceVersion=0", "PodNamespace: 'ml?resourceVersion=0' is not a DNS-1123 label"),
    ("PodNamespace", "a" * 64, "PodNamespace: must be at most 63 characters"),
    ("Node", "a100-0000/../x", "Node: 'a100-0000/../x' is not a DNS-1123 subdomain"),
    ("PodUID", "uid/../x", "PodUID: String should match pattern"),
])
def test_bind_refuses_names_kubernetes_would_not_accept_before_any_lookup(field, value, message):
    """Defect 4: names from the body went unescaped into the apiserver's URLs (a path up to a node, a query)."""
    looked_up = []
    items = nodes() + [pending("p", gpus=1)]
    app = snapshot_app(ExtenderConfig(), items)
    from extender.server import SERVICE
    lookup = app[SERVICE].pod_lookup

    async def recording_lookup(namespace, name):
        looked_up.append((namespace, name))
        return await lookup(namespace, name)

    app[SERVICE].pod_lookup = recording_lookup
    args = {"PodName": "p", "PodNamespace": "ml", "PodUID": "uid-p", "Node": "a100-0000"} | {field: value}

    async def go():
        async with TestClient(TestServer(app)) as c:
            return await post(c, "/bind", args)

    status, body = run(go())
    assert status == 400 and message in body["error"], body
    assert looked_up == []


def test_explain_refuses_names_kubernetes_would_not_accept():
    async def go():
        async with client(nodes() + [pending("p", gpus=1)]) as c:
            out = []
            for pod, node in [("ml/../x", "a100-0000"), ("a/b/c", "a100-0000"), ("ml/p", "A100?x=1"), ("ml/p", "")]:
                resp = await c.get("/explain", params={"pod": pod, "node": node})
                out.append((resp.status, (await resp.json())["error"]))
            good = await c.get("/explain", params={"pod": "ml/p", "node": "a100-0000"})
            return out, good.status

    out, good = run(go())
    assert [s for s, _ in out] == [400, 400, 400, 400]
    assert "pod namespace: 'ml/..' is not a DNS-1123 label" in out[0][1]
    assert "pod namespace: 'a/b' is not a DNS-1123 label" in out[1][1]
    assert "node: 'A100?x=1' is not a DNS-1123 subdomain" in out[2][1]
    assert good == 200


def test_a_body_that_is_not_the_gzip_it_claims_gets_400_and_the_next_request_is_served():
    async def go():
        async with client() as c:
            bad = await c.post("/filter", data=b"\x1f\x8b not gzip at all",
                               headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
            bad_body = await bad.json()
            good = await post(c, "/filter", {"Pod": pending("p", gpus=1), "NodeNames": names()})
            return bad.status, bad_body, good

    status, body, (good_status, good_body) = run(go())
    assert status == 400 and "request body cannot be read" in body["error"]
    assert good_status == 200 and good_body["NodeNames"]


def test_duplicate_node_names_are_answered_once():
    node_list = {"kind": "NodeList", "items": [n for n in nodes() if n["metadata"]["name"] == "a100-0001"] * 2}

    async def go():
        async with client() as c:
            by_name = await post(c, "/filter", {"Pod": pending("p", gpus=1),
                                                "NodeNames": ["a100-0000", "a100-0000", "cpu-0000", "cpu-0000"]})
            by_object = await post(c, "/filter", {"Pod": pending("p", gpus=1), "Nodes": node_list})
            scored = await post(c, "/prioritize", {"Pod": pending("p", gpus=1),
                                                   "NodeNames": ["a100-0000", "h100-0000", "a100-0000"]})
            return by_name[1], by_object[1], scored[1]

    by_name, by_object, scored = run(go())
    assert by_name["NodeNames"] == ["a100-0000"] and list(by_name["FailedAndUnresolvableNodes"]) == ["cpu-0000"]
    assert [n["metadata"]["name"] for n in by_object["Nodes"]["items"]] == ["a100-0001"]
    assert [h["Host"] for h in scored] == ["a100-0000", "h100-0000"]


def test_a_node_with_an_unreadable_label_is_unresolvable_and_the_rest_are_served():
    """Defect 6: nvidia.com/gpu.replicas "Infinity" ended in an OverflowError (a 500, or no app at all)."""
    odd = nodes()
    odd[0]["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "Infinity"
    odd[1]["metadata"]["labels"]["nvidia.com/gpu.count"] = "1e999999999"
    odd[2]["status"]["allocatable"]["memory"] = "-1Gi"

    async def go():
        async with client(odd, decide_in_filter=False) as c:
            return await post(c, "/filter", {"Pod": pending("p", gpus=1), "NodeNames": names()})

    status, body = run(go())
    failed = body["FailedAndUnresolvableNodes"]
    assert status == 200 and body["NodeNames"] == ["h100-0000", "h100-0001"]
    assert "label nvidia.com/gpu.replicas: 'Infinity' is not a whole number" in failed["a100-0000"]
    assert "label nvidia.com/gpu.count: '1e999999999' is not a whole number" in failed["a100-0001"]
    assert "allocatable memory: '-1Gi' must be non-negative" in failed["a100-0002"]

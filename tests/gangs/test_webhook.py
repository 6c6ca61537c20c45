"""The gangs admission webhook (gangs/webhook.py): the answer to every kind of Pod CREATE, bad bodies, metrics, TLS
and its registration. On the real apiserver: tests/e2e/test_gang_webhook.py."""
from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
import time
import urllib.request
import uuid

import pytest
from aiohttp.test_utils import TestClient, TestServer
from cryptography import x509
from prometheus_client import CollectorRegistry

from gangs.config import WebhookConfig
from gangs.webhook import (
    MAX_BODY_BYTES,
    PATH,
    WebhookServer,
    gate_patch,
    mutating_webhook_configuration,
    webhook_app,
)
from gpuaas.cluster.pki import create_pki, issue_serving_cert
from scoring.gangs import GANG_GATE, GROUP_LABELS, KUEUE_GATE

GANG = {"gpuaas.io/gang": "train-a"}
SIZE = {"gpuaas.io/gang-size": "4"}


def pod(labels=None, annotations=None, *, gates=None, node=None, name="p-0", spec=True) -> dict:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", "labels": labels or {},
                         "annotations": annotations or {}}}
    if spec:
        body["spec"] = {"containers": [{"name": "c", "image": "busybox",
                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        if gates is not None:
            body["spec"]["schedulingGates"] = [{"name": g} for g in gates]
        if node:
            body["spec"]["nodeName"] = node
    return body


def review_of(obj, *, operation="CREATE", kind="Pod", group="", uid=None, sub_resource=None) -> dict:
    request = {"uid": uid or str(uuid.uuid4()), "kind": {"group": group, "version": "v1", "kind": kind},
               "resource": {"group": group, "version": "v1", "resource": kind.lower() + "s"},
               "requestKind": {"group": group, "version": "v1", "kind": kind},
               "namespace": "team-a", "operation": operation, "userInfo": {"username": "system:serviceaccount:x:y"},
               "object": obj, "oldObject": None, "dryRun": False, "options": {"kind": "CreateOptions"}}
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def apply_patch(obj: dict, ops: list[dict]) -> dict:
    """RFC 6902 `add`, the only operation the webhook sends."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add"
        *parents, last = op["path"].lstrip("/").split("/")
        node = out
        for p in parents:
            node = node[p]
        if last == "-":
            node.append(op["value"])
        else:
            node[last] = op["value"]
    return out


async def _post(body, *, registry=None, then=None, **app_args):
    async with TestClient(TestServer(webhook_app(registry, **app_args))) as c:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        resp = await c.post(PATH, data=data, headers={"Content-Type": "application/json"})
        out = resp.status, await resp.json()
        if then is not None:  # a second, valid review on the same server: it keeps serving
            resp = await c.post(PATH, data=json.dumps(then), headers={"Content-Type": "application/json"})
            return out, (resp.status, await resp.json())
        return out


def post(body, **kw):
    return asyncio.run(_post(body, **kw))


def answer(obj, **kw) -> dict:
    review = review_of(obj, **kw)
    status, body = post(review)
    assert status == 200, body
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == review["request"]["uid"]
    return body["response"]


def patched(obj, response) -> dict:
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    return apply_patch(obj, json.loads(base64.b64decode(response["patch"])))


# ---- members are gated -----------------------------------------------------------------------------------------------
def test_a_member_without_gates_gets_the_gate_in_a_new_list():
    member = pod(GANG, SIZE)
    response = answer(member)
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GANG_GATE}]}]
    assert patched(member, response)["spec"]["schedulingGates"] == [{"name": GANG_GATE}]
    assert "status" not in response and "warnings" not in response


def test_a_member_with_another_gate_gets_ours_appended():
    member = pod(GANG, SIZE, gates=[KUEUE_GATE])
    response = answer(member)
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GANG_GATE}}]
    assert patched(member, response)["spec"]["schedulingGates"] == [{"name": KUEUE_GATE}, {"name": GANG_GATE}]


def test_an_empty_or_null_gate_list_and_a_missing_spec_are_patched_too():
    empty = pod(GANG, SIZE, gates=[])
    assert patched(empty, answer(empty))["spec"]["schedulingGates"] == [{"name": GANG_GATE}]
    null = pod(GANG, SIZE)
    null["spec"]["schedulingGates"] = None
    assert patched(null, answer(null))["spec"]["schedulingGates"] == [{"name": GANG_GATE}]
    bare = pod(GANG, SIZE, spec=False)
    assert patched(bare, answer(bare))["spec"] == {"schedulingGates": [{"name": GANG_GATE}]}
    assert gate_patch({"spec": None}) == ({"op": "add", "path": "/spec", "value": {"schedulingGates": [
        {"name": GANG_GATE}]}},)


def test_a_pod_in_no_group_with_claims_is_gated_for_gpuaas_to_allocate_them():
    with_claims = pod()
    with_claims["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    assert patched(with_claims, answer(with_claims))["spec"]["schedulingGates"] == [{"name": GANG_GATE}]
    bound = copy.deepcopy(with_claims)
    bound["spec"]["nodeName"] = "n1"
    response = answer(bound)
    assert "patch" not in response and "not allocated by gpuaas" in response["warnings"][0]
    no_claims = pod()
    no_claims["spec"]["resourceClaims"] = []
    assert "patch" not in answer(no_claims)


@pytest.mark.parametrize("labels, annotations", [
    ({"kueue.x-k8s.io/pod-group-name": "g"}, {"kueue.x-k8s.io/pod-group-total-count": "3"}),
    ({"scheduling.x-k8s.io/pod-group": "g"}, {"gpuaas.io/gang-size": "2"}),
    ({"gpuaas.io/gang": "g", "kueue.x-k8s.io/pod-group-name": "g"}, {"gpuaas.io/gang-size": "2"}),
], ids=["kueue", "coscheduling", "two-labels"])
def test_every_group_label_gates(labels, annotations):
    member = pod(labels, annotations)
    assert patched(member, answer(member))["spec"]["schedulingGates"] == [{"name": GANG_GATE}]


def test_a_generate_name_member_without_a_namespace_is_gated():
    member = pod(GANG, SIZE)
    del member["metadata"]["name"], member["metadata"]["namespace"]
    member["metadata"]["generateName"] = "worker-"
    assert patched(member, answer(member))["spec"]["schedulingGates"] == [{"name": GANG_GATE}]


# ---- left alone ---------------------------------------------------------------------------------------------------
def test_a_member_already_gated_is_left_as_is():
    response = answer(pod(GANG, SIZE, gates=[KUEUE_GATE, GANG_GATE]))
    assert response["allowed"] is True and "patch" not in response and "patchType" not in response


def test_a_member_created_bound_is_allowed_ungated_with_a_warning():
    # The apiserver refuses schedulingGates together with spec.nodeName; such a pod bypasses the scheduler anyway.
    response = answer(pod(GANG, SIZE, node="a100-0000"))
    assert response["allowed"] is True and "patch" not in response
    [warning] = response["warnings"]
    assert "spec.nodeName" in warning and "train-a" in warning


def test_a_pod_in_no_group_is_allowed_without_a_patch():
    response = answer(pod({"app": "llm"}, {"gpuaas.io/gang-size": "4"}))  # a size alone makes no group
    assert response == {"uid": response["uid"], "allowed": True}


@pytest.mark.parametrize("change", [
    {"operation": "UPDATE"}, {"operation": "DELETE"}, {"kind": "Deployment", "group": "apps"},
    {"sub_resource": "ephemeralcontainers"},
])
def test_anything_but_a_pod_create_is_allowed_as_is(change):
    response = answer(pod(GANG, {}), **change)  # a malformed group, even: not ours to judge here
    assert response == {"uid": response["uid"], "allowed": True}


# ---- malformed groups are refused with the reason ---------------------------------------------------------------
@pytest.mark.parametrize("labels, annotations, message", [
    (GANG, {}, "needs annotation gpuaas.io/gang-size"),
    (GANG, {"gpuaas.io/gang-size": "four"}, "annotation gpuaas.io/gang-size must be a whole number, not 'four'"),
    (GANG, {"gpuaas.io/gang-size": "0"}, "annotation gpuaas.io/gang-size must be between 1 and"),
    ({"gpuaas.io/gang": ""}, SIZE, "label gpuaas.io/gang is empty"),
    (GANG, {**SIZE, "gpuaas.io/gang-min-count": "5"}, "gpuaas.io/gang-min-count (5) is more than"),
    ({"kueue.x-k8s.io/pod-group-name": "g"}, SIZE, "needs annotation kueue.x-k8s.io/pod-group-total-count"),
], ids=["no-size", "size-not-a-number", "size-zero", "empty-name", "min-over-size", "kueue-no-count"])
def test_a_malformed_group_is_refused_with_code_400_and_the_label_to_fix(labels, annotations, message):
    response = answer(pod(labels, annotations))
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 400
    assert message in response["status"]["message"]
    assert response["status"]["message"].startswith("gpuaas gangs: ")


# ---- bad bodies: 4xx with a message, and the server keeps serving ------------------------------------------------
GOOD = review_of(pod(GANG, SIZE))


@pytest.mark.parametrize("body, message", [
    (b"", "request body is empty"),
    (b"{not json", "request body is not JSON"),
    (b"[]", "not an AdmissionReview"),
    ({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": GOOD["request"]},
     "apiVersion"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request: Field required"),
    ({**GOOD, "request": {**GOOD["request"], "uid": ""}}, "request.uid"),
    ({**GOOD, "request": {**GOOD["request"], "object": None}}, "a Pod CREATE without the Pod"),
    (review_of({**pod(GANG, SIZE), "metadata": {"labels": ["gpuaas.io/gang"]}}), "request.object is not a Pod: "
     "metadata.labels"),
    (review_of(pod({"gpuaas.io/gang": 7}, SIZE)), "metadata.labels.gpuaas.io/gang"),
    (review_of({**pod(GANG, SIZE), "spec": {"schedulingGates": [{"nom": "x"}]}}), "spec.schedulingGates.0.name"),
], ids=["empty", "not-json", "array", "v1beta1", "no-request", "no-uid", "no-object", "labels-a-list",
        "label-not-a-string", "gate-without-name"])
def test_a_bad_body_is_answered_400_with_a_message_and_the_server_keeps_serving(body, message):
    (status, answer_), (status2, answer2) = post(body, then=GOOD)
    assert status == 400, answer_
    assert message in answer_["error"]
    assert status2 == 200 and answer2["response"]["uid"] == GOOD["request"]["uid"]
    assert answer2["response"]["patchType"] == "JSONPatch"


def test_a_body_over_the_bound_is_refused_with_413():
    big = review_of(pod(GANG, {**SIZE, "padding": "x" * 4096}))
    status, body = post(big, max_body_bytes=2048)
    assert status == 413 and "larger than 2048 bytes" in body["error"]
    assert MAX_BODY_BYTES >= 3 * 1024 * 1024  # every Pod the apiserver accepts fits


def test_metrics_count_reviews_by_outcome_and_time_them():
    registry = CollectorRegistry()

    async def go():
        async with TestClient(TestServer(webhook_app(registry))) as c:
            for body in (review_of(pod(GANG, SIZE)), review_of(pod(GANG, SIZE)), review_of(pod({"app": "x"})),
                         review_of(pod(GANG, {})), b"nope"):
                resp = await c.post(PATH, data=body if isinstance(body, bytes) else json.dumps(body))
                await resp.read()
    asyncio.run(go())

    def count(outcome):
        return registry.get_sample_value("gpuaas_gangs_webhook_reviews_total", {"outcome": outcome})
    assert (count("gated"), count("not-a-member"), count("refused"), count("bad-request")) == (2, 1, 1, 1)
    assert count("already-gated") == 0  # every outcome is exported from the start
    assert registry.get_sample_value("gpuaas_gangs_webhook_duration_seconds_count") == 5


def test_hundreds_of_concurrent_reviews_are_answered_quickly():
    reviews = [review_of(pod(GANG if i % 2 else {"app": "x"}, SIZE, name=f"p-{i}")) for i in range(500)]

    async def go():
        async with TestClient(TestServer(webhook_app())) as c:
            async def one(r):
                resp = await c.post(PATH, data=json.dumps(r))
                return resp.status, (await resp.json())["response"]
            started = time.perf_counter()
            out = await asyncio.gather(*(one(r) for r in reviews))
            return out, time.perf_counter() - started
    out, took = asyncio.run(go())
    assert [s for s, _ in out] == [200] * 500
    assert sum("patch" in r for _, r in out) == 250
    assert [r["uid"] for _, r in out] == [r["request"]["uid"] for r in reviews]
    print(f"500 concurrent reviews in {took:.3f} s ({took / 500 * 1000:.2f} ms each, one test client)")
    assert took < 10


# ---- HTTPS, and a renewed certificate ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return create_pki(tmp_path_factory.mktemp("pki"))


def https_post(port: int, ca, body: dict) -> dict:
    """POST over HTTPS, verifying the server with `ca` (the name on the certificate is 127.0.0.1)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(f"https://127.0.0.1:{port}{PATH}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5, context=ctx) as resp:
        return json.load(resp)


def served_serial(port: int) -> int:
    return x509.load_pem_x509_certificate(ssl.get_server_certificate(("127.0.0.1", port)).encode()).serial_number


def test_the_server_answers_over_https_on_its_own_thread_and_picks_up_a_renewed_certificate(pki):
    cert, key = issue_serving_cert(pki, "gangs-test", "gpuaas-gangs-webhook")
    registry = CollectorRegistry()
    server = WebhookServer(WebhookConfig(port=0, cert_file=cert, key_file=key), registry, host="127.0.0.1",
                           reload_interval_s=0.1).start()
    try:
        assert server.port
        assert https_post(server.port, pki.ca_cert, GOOD)["response"]["patchType"] == "JSONPatch"
        first = served_serial(server.port)
        time.sleep(0.05)  # a later mtime than the first files'
        issue_serving_cert(pki, "gangs-test", "gpuaas-gangs-webhook")  # renewed in place, as cert-manager does
        deadline = time.monotonic() + 5
        while served_serial(server.port) == first and time.monotonic() < deadline:
            time.sleep(0.1)
        assert served_serial(server.port) != first
        assert https_post(server.port, pki.ca_cert, GOOD)["response"]["patchType"] == "JSONPatch"
        assert registry.get_sample_value("gpuaas_gangs_webhook_reviews_total", {"outcome": "gated"}) >= 2
    finally:
        server.stop()
    assert not server._thread.is_alive()


def test_a_server_that_cannot_start_says_why(pki, tmp_path):
    with pytest.raises(RuntimeError, match="did not start"):
        WebhookServer(WebhookConfig(port=0, cert_file=tmp_path / "none.crt", key_file=tmp_path / "none.key")).start()


# ---- the registration ----------------------------------------------------------------------------------------------
def test_one_webhook_per_group_label_each_selecting_its_label_on_pod_create_and_failing_closed():
    config = mutating_webhook_configuration({"url": "https://127.0.0.1:1/mutate-pods", "caBundle": "Q0E="})
    hooks = config["webhooks"]
    assert [h.get("objectSelector") for h in hooks] == [
        {"matchExpressions": [{"key": label, "operator": "Exists"}]} for label in GROUP_LABELS] + [None]
    assert len({h["name"] for h in hooks}) == len(GROUP_LABELS) + 1
    # The last one: pods with DRA claims, selected by the apiserver's CEL on the pod.
    assert hooks[-1]["name"] == "claims.gangs.gpuaas.io"
    assert hooks[-1]["matchConditions"] == [
        {"name": "has-resource-claims",
         "expression": "has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0"}]
    for h in hooks:
        assert h["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                               "resources": ["pods"], "scope": "Namespaced"}]
        assert (h["failurePolicy"], h["sideEffects"], h["timeoutSeconds"], h["admissionReviewVersions"]) == (
            "Fail", "None", 5, ["v1"])
        assert h["namespaceSelector"]["matchExpressions"] == [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "gpuaas-system"]}]
        assert h["clientConfig"]["url"].endswith(PATH)

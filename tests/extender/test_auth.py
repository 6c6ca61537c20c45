"""Who may call the extender over TLS (extender/auth.py): kube-scheduler's client certificate for the verbs, a
reviewed token or certificate user for /explain and /metrics, anyone for the probes. A real TLS server and client:
the certificates come from the local cluster's PKI."""
from __future__ import annotations

import asyncio
import json
import re
import ssl
from pathlib import Path
from typing import ClassVar

import aiohttp
import pytest
from aiohttp import web

from extender.config import ExtenderConfig
from extender.server import snapshot_app, ssl_context
from gpuaas.cluster.pki import create_pki, issue_serving_cert

from .fixtures import names, nodes, pending

CLUSTER = nodes() + [pending("p", gpus=1)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    base = tmp_path_factory.mktemp("pki")
    p = create_pki(base / "cluster")
    issue_serving_cert(p, "extender", "gpuaas-extender")
    # A CA the extender does not trust, with a certificate named as the scheduler.
    foreign = create_pki(base / "foreign")
    return p, foreign


class FakeReviewer:
    """kube-apiserver's answers: tokens of alice and bob; alice may get pods in ml, bob may get /metrics."""

    TOKENS: ClassVar[dict[str, str]] = {"alice-token": "alice", "bob-token": "bob"}

    def __init__(self):
        self.token_reviews, self.access_reviews = [], []

    async def token_review_async(self, body):
        self.token_reviews.append(body)
        user = self.TOKENS.get(body["spec"]["token"])
        return {"authenticated": True, "user": {"username": user, "groups": ["system:authenticated"]}} if user else {
            "authenticated": False, "error": "invalid bearer token"}

    async def review_async(self, body):
        self.access_reviews.append(body)
        spec = body["spec"]
        res, nonres = spec.get("resourceAttributes") or {}, spec.get("nonResourceAttributes") or {}
        allowed = ((spec["user"] == "alice" and res.get("resource") == "pods" and res.get("namespace") == "ml"
                    and res.get("verb") == "get")
                   or (spec["user"] == "bob" and nonres == {"path": "/metrics", "verb": "get"}))
        return {"allowed": allowed}


def tls_config(p) -> ExtenderConfig:
    return ExtenderConfig(host="0.0.0.0", tls={"cert_file": p.path("extender.crt"), "key_file": p.path("extender.key"),
                                               "client_ca_file": p.ca_cert})


def client_ctx(p, cert: str | None = None, ca: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca or p.ca_cert))
    if cert:
        ctx.load_cert_chain(p.path(f"{cert}.crt"), p.path(f"{cert}.key"))
    return ctx


async def serve(config: ExtenderConfig, reviewer=None):
    runner = web.AppRunner(snapshot_app(config, CLUSTER, reviewer))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context(config))
    await site.start()
    return runner, runner.addresses[0][1]


FILTER = {"Pod": pending("p", gpus=1), "NodeNames": names()}
BIND = {"PodName": "p", "PodNamespace": "ml", "PodUID": "uid-p", "Node": names()[0]}
REQUESTS = {  # every route: method, path, body
    "filter": ("POST", "/filter", FILTER),
    "prioritize": ("POST", "/prioritize", FILTER),
    "cpu/prioritize": ("POST", "/cpu/prioritize", FILTER),
    "bind": ("POST", "/bind", BIND),
    "explain": ("GET", "/explain?pod=ml/p&node=" + names()[0], None),
    "explain-other-namespace": ("GET", "/explain?pod=kube-system/secret-pod&node=" + names()[0], None),
    "metrics": ("GET", "/metrics", None),
    "healthz": ("GET", "/healthz", None),
    "readyz": ("GET", "/readyz", None),
    "unknown": ("GET", "/nothing-here", None),
}


def statuses(p, *, cert: str | None = None, token: str | None = None, reviewer=None) -> dict[str, tuple[int, str]]:
    """Status and body of every route for one caller."""
    async def go():
        runner, port = await serve(tls_config(p), reviewer)
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            out = {}
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx(p, cert))) as session:
                for name, (method, path, body) in REQUESTS.items():
                    async with session.request(method, f"https://localhost:{port}{path}", headers=headers,
                                               data=json.dumps(body) if body else None) as resp:
                        out[name] = (resp.status, await resp.text())
            return out
        finally:
            await runner.cleanup()

    return asyncio.run(go())


OPEN = ("healthz", "readyz")


def test_without_a_credential_only_the_probes_answer(pki):
    got = statuses(pki[0])
    assert {k: s for k, (s, _) in got.items()} == {**dict.fromkeys(REQUESTS, 401), "healthz": 200, "readyz": 200}
    assert "kube-scheduler's client certificate" in got["bind"][1]


def test_the_schedulers_certificate_may_call_everything(pki):
    got = statuses(pki[0], cert="scheduler")  # CN system:kube-scheduler, signed by the configured CA
    assert got["filter"][0] == 200 and got["prioritize"][0] == 200 and got["metrics"][0] == 200
    assert got["cpu/prioritize"] == (200, "[]")  # a GPU pod: the CPU-pod entry leaves it to the GPU entry
    assert got["explain"][0] == 200 and got["bind"][0] == 200  # bind's reply: the snapshot binds nothing
    assert got["unknown"][0] == 404


def test_another_certificate_of_the_ca_may_not_call_the_verbs(pki):
    reviewer = FakeReviewer()
    got = statuses(pki[0], cert="kwok", reviewer=reviewer)  # CN kwok-controller, O system:masters
    for verb in ("filter", "prioritize", "cpu/prioritize", "bind", "unknown"):
        assert got[verb][0] == 403, (verb, got[verb])
        assert "kube-scheduler only" in got[verb][1]
    # system:masters may read /explain and /metrics without a review, as kube-apiserver lets them do anything.
    assert got["explain"][0] == 200 and got["metrics"][0] == 200
    assert not reviewer.access_reviews


def test_a_certificate_from_another_ca_fails_the_handshake(pki):
    p, foreign = pki

    async def go():
        runner, port = await serve(tls_config(p))
        ctx = client_ctx(p)
        ctx.load_cert_chain(foreign.path("scheduler.crt"), foreign.path("scheduler.key"))  # CN system:kube-scheduler
        try:
            async with (aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session,
                        session.post(f"https://localhost:{port}/bind", data=json.dumps(BIND)) as resp):
                return resp.status
        finally:
            await runner.cleanup()

    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        asyncio.run(go())


def test_tokens_are_reviewed_and_explain_needs_read_access_to_the_pod(pki):
    reviewer = FakeReviewer()
    alice = statuses(pki[0], token="alice-token", reviewer=reviewer)
    assert alice["explain"][0] == 200
    status, body = alice["explain-other-namespace"]
    assert status == 403 and 'User "alice" cannot get resource "pods"' in json.loads(body)["error"]
    assert alice["metrics"][0] == 403
    for verb in ("filter", "prioritize", "bind"):
        assert alice[verb][0] == 401  # a token is not kube-scheduler's certificate
    assert len(reviewer.token_reviews) == 1  # cached: one review for all of alice's requests
    # The review asked what the apiserver would ask: get on that pod, in that namespace.
    attrs = [r["spec"]["resourceAttributes"] for r in reviewer.access_reviews if "resourceAttributes" in r["spec"]]
    assert {"namespace": "ml", "verb": "get", "version": "v1", "resource": "pods", "name": "p"} in attrs

    bob = statuses(pki[0], token="bob-token", reviewer=FakeReviewer())
    assert bob["metrics"][0] == 200 and bob["explain"][0] == 403
    stranger = statuses(pki[0], token="made-up", reviewer=FakeReviewer())
    assert stranger["metrics"][0] == 401 and stranger["explain"][0] == 401
    assert stranger["healthz"][0] == 200


def test_without_a_cluster_tokens_cannot_be_reviewed(pki):
    got = statuses(pki[0], token="alice-token")  # a snapshot extender: no apiserver to ask
    assert got["metrics"][0] == 401 and "cannot be reviewed" in got["metrics"][1]


def test_plain_http_is_refused_beyond_loopback(pki):
    with pytest.raises(ValueError, match=re.escape("host: 0.0.0.0 is reachable from other machines")):
        ExtenderConfig(host="0.0.0.0")
    assert ExtenderConfig().host == "127.0.0.1"
    tls_config(pki[0])  # with tls, any address

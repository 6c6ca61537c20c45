"""The informer against a fake apiserver served in-process (aiohttp), and its line splitter and health on their own.

The fake serves one list and one watch of pods; the watch sends what a test gives it, cut into small writes so that a
line crosses many chunks, and then stays open until the test ends (as a quiet watch does)."""
from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.informer import EventTooLarge, Health, Informer, split_lines
from runtime.kubeclient import ApiEndpoint
from tests.conftest import Clock

MiB = 1024 * 1024


def run(coro):
    return asyncio.run(coro)


def pod(name: str, rv: str, annotations: dict[str, str] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "resourceVersion": rv, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c"}]}}


class FakeApiserver:
    """GET /api/v1/{pods,nodes}: a list (`relisted` is set by a second list of a kind), or with ?watch=1 a stream of
    `events` written `write_bytes` at a time, then held open until `close` or `broken` is set. Once `broken` is set,
    lists answer 500 (an apiserver that lost etcd)."""

    def __init__(self, items: list[dict], events: list[dict], *, write_bytes: int = 64 * 1024):
        self.items, self.events, self.write_bytes = items, events, write_bytes
        self.lists: Counter[str] = Counter()
        self.relisted = asyncio.Event()
        self.close = asyncio.Event()
        self.broken = asyncio.Event()

    async def serve(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        items = self.items if kind == "pods" else []
        if request.query.get("watch") != "1":
            if self.broken.is_set():
                return web.json_response({"kind": "Status", "code": 500, "message": "etcd gone"}, status=500)
            self.lists[kind] += 1
            if self.lists[kind] > 1:
                self.relisted.set()
            return web.json_response({"kind": "List", "metadata": {"resourceVersion": "1"}, "items": items})
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        body = b"".join(orjson.dumps(e) + b"\n" for e in (self.events if kind == "pods" else []))
        for at in range(0, len(body), self.write_bytes):
            await resp.write(body[at:at + self.write_bytes])
        waits = [asyncio.create_task(e.wait()) for e in (self.close, self.broken)]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        return resp

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/{kind:pods|nodes}", self.serve)
        return app


async def informed(fake: FakeApiserver, done, **kwargs) -> Informer:
    """Run an informer against `fake` until `done(informer)` (a coroutine) returns or the fake relists; the informer."""
    async with TestServer(fake.app()) as server:
        endpoint = ApiEndpoint(server=str(server.make_url("")).rstrip("/"), ssl_context=False, headers={})
        inf = Informer(endpoint, "/api/v1/pods", kind="Pod", **kwargs)
        async with endpoint.session() as session:
            task = asyncio.create_task(inf.run(session))
            relisted = asyncio.create_task(fake.relisted.wait())
            finished = asyncio.create_task(done(inf))
            await asyncio.wait([finished, relisted], return_when=asyncio.FIRST_COMPLETED)
            fake.close.set()
            for t in (task, relisted, finished):
                t.cancel()
            await asyncio.gather(task, relisted, finished, return_exceptions=True)
        return inf


def watch_until(fake: FakeApiserver, last: Callable[[dict], bool]) -> tuple[Informer, list, bool]:
    """Run an informer against `fake` until it hands on an object for which `last` holds: the informer, every
    (old, new) it handed on, and whether that object arrived."""
    seen: list[tuple[dict | None, dict | None]] = []
    arrived = asyncio.Event()

    def on_change(kind, old, new):
        seen.append((old, new))
        if new and last(new):
            arrived.set()

    async def go():
        async def done(_inf):
            await arrived.wait()
        return await informed(fake, done, on_change=on_change)

    inf = run(go())
    return inf, seen, arrived.is_set()


def test_a_pod_update_with_a_1_mib_annotation_reaches_the_model_without_a_relist():
    # aiohttp's line reader stopped at 512 KiB ("Line is too long"): the watch broke and the informer relisted, and
    # the update never arrived. 1 MiB of annotation, sent in 64 KiB writes, must arrive as one MODIFIED event.
    big = "x" * MiB
    fake = FakeApiserver([pod("p", "1")], [{"type": "MODIFIED", "object": pod("p", "2", {"big": big})}])
    inf, seen, arrived = watch_until(fake, lambda new: new["metadata"]["resourceVersion"] == "2")
    assert arrived, f"the update never arrived: {inf.relists} lists, {inf.errors} errors"
    assert (inf.relists, inf.errors, fake.lists["pods"]) == (1, 0, 1)
    assert inf.store["ml/p"]["metadata"]["annotations"]["big"] == big
    assert [(o and o["metadata"]["resourceVersion"], n["metadata"]["resourceVersion"]) for o, n in seen] == \
        [(None, "1"), ("1", "2")]  # the list's add, then the watch's update with the old object


def test_listed_and_watched_objects_are_stored_and_handed_on_without_managed_fields():
    # Server-side apply's bookkeeping is a third or more of a pod's JSON and nothing reads it: the store (memory, and
    # the garbage collector's passes over it) and the handlers get the objects without it, as kube-scheduler's do.
    fields = [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
               "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}}]

    def managed(obj: dict) -> dict:
        obj["metadata"]["managedFields"] = fields
        return obj

    fake = FakeApiserver([managed(pod("p", "1")), pod("q", "1")],
                         [{"type": "MODIFIED", "object": managed(pod("p", "2"))},
                          {"type": "ADDED", "object": managed(pod("r", "3"))}])
    inf, changes, arrived = watch_until(fake, lambda new: new["metadata"]["name"] == "r")
    assert arrived, f"the events never arrived: {inf.relists} lists, {inf.errors} errors"
    seen = [o for change in changes for o in change if o is not None]
    assert sorted(inf.store) == ["ml/p", "ml/q", "ml/r"]
    assert inf.store["ml/p"]["metadata"]["resourceVersion"] == "2"
    assert len(seen) == 5  # p and q listed, p's update (old and new), r added
    assert [o for o in [*inf.store.values(), *seen] if "managedFields" in o["metadata"]] == []


def test_an_event_over_the_bound_ends_the_watch_with_an_error_that_names_it_and_relists():
    fake = FakeApiserver([pod("p", "1")], [{"type": "MODIFIED", "object": pod("p", "2", {"big": "x" * 4096})}],
                         write_bytes=1000)

    async def go():
        async def done(_inf):
            await asyncio.Event().wait()  # only the relist ends it
        return await informed(fake, done, max_event_bytes=2048)

    inf = run(go())
    assert fake.relisted.is_set() and inf.errors == 1
    assert inf.last_error == "EventTooLarge: a watch event of more than 2048 bytes"


# ---- split_lines ----------------------------------------------------------------------------------------------------

async def _chunks(parts):
    for p in parts:
        yield p


async def _split(parts, limit=1 << 20):
    return [line async for line in split_lines(_chunks(parts), limit)]


@pytest.mark.parametrize("parts, lines", [
    pytest.param([b"a\nb\n"], [b"a", b"b"], id="whole lines in one chunk"),
    pytest.param([b"ab", b"c\nd", b"e\n"], [b"abc", b"de"], id="lines across chunks"),
    pytest.param([b"a\n", b"", b"\nb"], [b"a", b"", b"b"], id="empty chunk, empty line, last line without newline"),
    pytest.param([b"\n", b"\n"], [b"", b""], id="newlines only"),
    pytest.param([], [], id="nothing"),
])
def test_split_lines(parts, lines):
    assert run(_split(parts)) == lines


@pytest.mark.parametrize("parts", [
    pytest.param([b"12345\n"], id="a complete line over the bound"),
    pytest.param([b"123", b"45"], id="an unfinished line over the bound"),
    pytest.param([b"ok\n123", b"456", b"\n"], id="over the bound across chunks"),
])
def test_split_lines_refuses_a_line_over_the_bound(parts):
    with pytest.raises(EventTooLarge):
        run(_split(parts, limit=4))


def test_split_lines_accepts_a_line_exactly_at_the_bound():
    assert run(_split([b"12", b"34\n", b"1234"], limit=4)) == [b"1234", b"1234"]


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=8),
       cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_split_lines_does_not_depend_on_how_the_stream_is_cut(lines, cuts):
    body = b"".join(line + b"\n" for line in lines)
    points = sorted({min(c, len(body)) for c in cuts})
    parts = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    assert run(_split(parts)) == lines


# ---- health and readiness, on an injected clock -------------------------------------------------------------------

def _informer(clock: Clock) -> Informer:
    return Informer(ApiEndpoint("http://unused", False, {}), "/api/v1/nodes", kind="Node", clock=clock)


def test_health_is_withdrawn_after_max_stale_without_a_working_watch_and_says_why():
    clock = Clock(1000.0)
    inf = _informer(clock)
    assert not inf.health(clock(), 60) and "not synced yet" in inf.health(clock(), 60).why
    inf.synced.set()
    inf._contact()                      # t=1000: a list succeeded
    inf.watching = True                 # then a watch opened...
    clock.t += 3600                     # ...and stays open for an hour with nothing to say: healthy
    assert inf.health(clock(), 60)
    inf.watching = False                # t=4600: the watch broke
    inf._contact()
    inf.last_error, inf.last_error_at = "ClientConnectorError: connection refused", clock.t
    clock.t += 60                       # 60 s without a watch: at the bound, still healthy
    assert inf.health(clock(), 60)
    clock.t += 1                        # 61 s: stale
    health = inf.health(clock(), 60)
    assert not health
    assert health.why == ("informer Node (/api/v1/nodes): no working watch for 61s (more than 60s); "
                          "last error 61s ago: ClientConnectorError: connection refused")
    inf._contact()                      # a list succeeded again: healthy at once
    assert inf.health(clock(), 60)


def test_readiness_needs_every_informer_healthy_and_names_those_that_are_not():
    clock = Clock(1000.0)
    nodes, pods = _informer(clock), _informer(clock)
    pods.kind, pods.path = "Pod", "/api/v1/pods"
    assert not Informer.readiness([], 60)
    for inf in (nodes, pods):
        inf.synced.set()
        inf._contact()
    assert Informer.readiness([nodes, pods], 60).text == "ok"
    nodes.watching = True
    clock.t += 120
    ready = Informer.readiness([nodes, pods], 60)
    assert not ready and ready.text == "not ready: informer Pod (/api/v1/pods): no working watch for 120s " \
                                       "(more than 60s)"


def test_the_informer_is_healthy_while_a_real_watch_is_open_and_counts_events_as_contact():
    clock = Clock(1000.0)
    fake = FakeApiserver([pod("p", "1")], [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "5"}}}])

    healths = []

    async def go():
        async def done(inf):
            while inf.resource_version != "5":  # the bookmark arrived
                await asyncio.sleep(0.01)
            healths.append(inf.health(clock(), 60))
            clock.t += 1e6  # long after it, the watch still open
            healths.append(inf.health(clock(), 60))
        return await informed(fake, done, clock=clock)

    inf = run(go())
    assert healths == [Health(True), Health(True)]
    assert inf.relists == 1 and not inf.watching and inf.last_contact == clock.t  # contact at the watch's end


# ---- readiness as the extender and the node scaler serve it ---------------------------------------------------------

def kubeconfig(tmp_path, server: str):
    path = tmp_path / "kubeconfig"
    path.write_text(orjson.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}).decode())
    return path


async def _wait_for_status(client, path: str, code: int) -> str:
    while True:  # the test's timeout bounds this; what is asserted is the answer, not how soon it came
        resp = await client.get(path)
        text = await resp.text()
        if resp.status == code:
            return text
        await asyncio.sleep(0.05)


def test_the_extender_withdraws_readiness_when_its_watches_break_and_says_why(tmp_path):
    # After the first sync /readyz stayed 200 whatever happened to the watches. Here the apiserver breaks (watches
    # end, lists answer 500): past max_watch_stale_seconds /readyz is 503 and names the informers and the error.
    from aiohttp.test_utils import TestClient

    from extender.config import ExtenderConfig
    from extender.server import live_app

    fake = FakeApiserver([pod("p", "1")], [])

    async def go():
        async with TestServer(fake.app()) as api:
            config = ExtenderConfig(kubeconfig=kubeconfig(tmp_path, str(api.make_url("")).rstrip("/")),
                                    max_watch_stale_seconds=0.2)
            async with TestClient(TestServer(live_app(config))) as client:
                before = await _wait_for_status(client, "/readyz", 200)
                fake.broken.set()
                after = await asyncio.wait_for(_wait_for_status(client, "/readyz", 503), timeout=60)
            fake.close.set()
            return before, after

    before, after = run(go())
    assert before == "ok"
    assert after.startswith("not ready: informer Node (/api/v1/nodes): no working watch for ")
    assert "informer Pod (/api/v1/pods): no working watch for " in after
    assert "(more than 0.2s); last error " in after and "500" in after


def test_the_node_scaler_withdraws_readiness_past_max_watch_stale_s(tmp_path):
    from aiohttp.test_utils import TestClient

    from nodescaler.config import NodeScalerConfig
    from nodescaler.service import Service

    clock = Clock(1000.0)
    config = NodeScalerConfig.model_validate({
        "groups": [{"name": "a100", "max_size": 2, "cost_per_hour": 1.0,
                    "template": {"gpu": {"model": "A100-80GB", "count": 8}}}],
        "leader_election": {"enabled": False}, "max_watch_stale_s": 30})
    service = Service(config, kubeconfig(tmp_path, "http://127.0.0.1:1"))
    inf = _informer(clock)
    inf.synced.set()
    inf._contact()

    async def go():
        answers = []
        async with TestClient(TestServer(service.app())) as client:
            for informers, advance in (([], 0), ([inf], 0), ([inf], 31)):
                service.informers = informers
                clock.t += advance
                resp = await client.get("/readyz")
                answers.append((resp.status, await resp.text()))
        return answers

    assert run(go()) == [
        (503, "not ready: no informers started yet"),
        (200, "ok"),
        (503, "not ready: informer Node (/api/v1/nodes): no working watch for 31s (more than 30s)"),
    ]

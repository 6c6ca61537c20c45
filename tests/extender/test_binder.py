"""ApiBinder against a stand-in apiserver: one Binding per call, carried on one reused connection."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from extender.binder import ApiBinder, BindError

STATUS = b'{"kind":"Status","apiVersion":"v1","status":"Success","code":201}'


def test_bindings_reuse_one_connection_and_carry_the_devices():
    seen: list[dict] = []
    peers: set = set()

    async def binding(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername"))
        body = await request.json()
        seen.append(body)
        if body["target"]["name"] == "gone":
            return web.json_response({"kind": "Status", "message": 'nodes "gone" not found'}, status=404)
        # Headers first, the body a moment later (a reply split across reads): the binder must still read it to
        # the end, or aiohttp closes the connection rather than reuse it.
        reply = web.StreamResponse(status=201, headers={"Content-Type": "application/json"})
        reply.content_length = len(STATUS)
        await reply.prepare(request)
        await asyncio.sleep(0.01)
        await reply.write(STATUS)
        await reply.write_eof()
        return reply

    async def go():
        app = web.Application()
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", binding)
        async with (TestServer(app) as server,
                    aiohttp.ClientSession(base_url=str(server.make_url("/"))) as session):
            binder = ApiBinder(session)
            for i in range(3):
                await binder.bind("team-a", f"p{i}", f"uid-{i}", "node-1", {"gpuaas.io/devices": str(i)})
            with pytest.raises(BindError, match='HTTP 404: nodes "gone" not found'):
                await binder.bind("team-a", "p3", "uid-3", "gone", {})

    asyncio.run(go())
    assert [b["metadata"]["annotations"] for b in seen[:3]] == [{"gpuaas.io/devices": str(i)} for i in range(3)]
    assert all(b["kind"] == "Binding" and b["target"]["kind"] == "Node" for b in seen)
    # A reply left unread makes aiohttp close the connection: each Binding would then pay a new TCP/TLS handshake.
    assert len(peers) == 1


def test_pod_paths_are_built_from_quoted_segments():
    from extender.binder import pod_path

    # The wire refuses such names (scoring.names); were one to get through, it stays one path segment.
    assert pod_path("ml", "p", "binding") == "/api/v1/namespaces/ml/pods/p/binding"
    assert pod_path("a/../..", "x?resourceVersion=0") == \
        "/api/v1/namespaces/a%2F..%2F../pods/x%3FresourceVersion%3D0"

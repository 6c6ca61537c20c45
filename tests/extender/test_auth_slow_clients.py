"""A client that sends its request header slowly, or half of it, cannot hold a connection: the server closes it once
`idle_timeout_seconds` pass without a complete header (aiohttp's own default kept it 75-90 s), and keeps serving."""
from __future__ import annotations

import asyncio

from aiohttp import web

from extender.config import ExtenderConfig
from extender.server import handler_options, snapshot_app

from .fixtures import nodes


def test_a_half_sent_header_line_is_disconnected_and_others_are_served():
    config = ExtenderConfig(idle_timeout_seconds=1.0)

    async def go():
        # As cli.run serves: the same handler options.
        runner = web.AppRunner(snapshot_app(config, nodes()), **handler_options(config))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: local")  # half a header line, and nothing more
            await writer.drain()
            other_r, other_w = await asyncio.open_connection("127.0.0.1", port)
            other_w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            served = await asyncio.wait_for(other_r.read(), timeout=30)
            # Generous: the bound is 1 s of idleness; 30 s is far below aiohttp's default of 75 s.
            closed = await asyncio.wait_for(reader.read(), timeout=30)
            writer.close()
            other_w.close()
            return served, closed
        finally:
            await runner.cleanup()

    served, closed = asyncio.run(go())
    assert served.startswith(b"HTTP/1.1 200")
    assert closed == b""  # end of stream: the server hung up without answering the half request


def test_the_default_bound_is_well_below_the_keep_alive_default():
    assert handler_options(ExtenderConfig())["keepalive_timeout"] <= 15

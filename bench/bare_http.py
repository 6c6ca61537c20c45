"""A bare HTTP/1.1 server, for measuring what aiohttp's server costs an extender in kube-scheduler's pipeline
(bench/scheduler_throughput.py's `floor_bare` and `extender_bare`): an asyncio.Protocol that reads one request at a
time per connection (a request line, headers, a Content-Length body), calls the handler of its method and path, and
writes the reply. A handler returns the reply's JSON bytes, or an awaitable of them (bind); `Unavailable` becomes a
503, any other exception a 500, and the connection goes on serving.

It trusts its one client, kube-scheduler on loopback: no size limits, no timeouts, no chunked bodies, no TLS, no
authentication. Not for production: extender/server.py's aiohttp server, with its limits and mTLS, is what gpuaas
serves with."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web

Handler = Callable[[bytes], bytes | Awaitable[bytes]]
Routes = dict[tuple[bytes, bytes], Handler]  # (method, path) -> handler


class Unavailable(RuntimeError):
    """Answered with 503 (a /readyz before the caches have synced)."""


class BareHttp(asyncio.Protocol):
    def __init__(self, routes: Routes):
        self.routes = routes
        self.buffer = bytearray()
        self.busy = False  # a handler's awaitable is running: the next request waits (HTTP/1.1 answers in order)
        self.pending: asyncio.Future[None] | None = None  # that handler's task, referenced while it runs
        self.close_after = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's TCPTransport is not an asyncio.Transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._serve()

    def _serve(self) -> None:
        while not self.busy and (request := self._next_request()) is not None:
            method, path, body = request
            handler = self.routes.get((method, path.split(b"?", 1)[0]))
            if handler is None:
                self._reply(b"404 Not Found", b'{"error": "not found"}')
                continue
            try:
                out = handler(body)
            except Exception as err:
                self._failed(err)
                continue
            if isinstance(out, bytes):
                self._reply(b"200 OK", out)
            else:
                self.busy = True
                self.pending = asyncio.ensure_future(self._finish(out))

    def _next_request(self) -> tuple[bytes, bytes, bytes] | None:
        """The next complete request in the buffer (taken out of it), or None while it is incomplete."""
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = bytes(self.buffer[:end]).split(b"\r\n")
        method, path, _ = lines[0].split(b" ", 2)
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                self.close_after = True
        if len(self.buffer) < end + 4 + length:
            return None
        body = bytes(self.buffer[end + 4:end + 4 + length])
        del self.buffer[:end + 4 + length]
        return method, path, body

    async def _finish(self, out: Awaitable[bytes]) -> None:
        try:
            self._reply(b"200 OK", await out)
        except Exception as err:
            self._failed(err)
        self.busy, self.pending = False, None
        self._serve()

    def _failed(self, err: Exception) -> None:
        status = b"503 Service Unavailable" if isinstance(err, Unavailable) else b"500 Internal Server Error"
        self._reply(status, b'{"error": "%s"}' % str(err).replace('"', "'").encode())

    def _reply(self, status: bytes, body: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                        % (status, len(body), body))
        if self.close_after:
            transport.close()


async def serve(routes: Routes, host: str, port: int) -> None:
    """Serve `routes` on host:port until cancelled."""
    server = await asyncio.get_running_loop().create_server(lambda: BareHttp(routes), host, port)
    async with server:
        await server.serve_forever()


async def serve_app(app: web.Application, routes: Callable[[web.Application], Routes], host: str, port: int) -> None:
    """`routes(app)` served on host:port by BareHttp, with `app` started as aiohttp would start it (its startup and
    cleanup contexts: sessions, informers, the extender's warm-up) but no aiohttp server listening."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await serve(routes(app), host, port)
    finally:
        await runner.cleanup()

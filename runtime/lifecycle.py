"""How a component process runs: until SIGTERM or SIGINT, which set the event its service stops on (the service then
releases its lease and waits for its writes, see the services' `run`)."""
from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable

from aiohttp import web

from .leader import LeaderElector


def run_until_signalled(run: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """asyncio.run(run(stop)) with SIGTERM and SIGINT setting `stop`."""
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(stop)

    asyncio.run(main())


async def serve_with_elector(app: web.Application, host: str, port: int, elector: LeaderElector | None,
                             stop_thread: threading.Event) -> web.AppRunner:
    """A controller's start: its elector in a thread of its own (until `stop_thread` is set) and its HTTP site
    (/metrics, /healthz, /readyz, ...) on host:port. Returns the runner, to clean up at the end."""
    if elector is not None:
        threading.Thread(target=elector.run, args=(stop_thread,), name="leader-election", daemon=True).start()
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner

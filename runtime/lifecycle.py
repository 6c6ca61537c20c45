"""How a component process runs: until SIGTERM or SIGINT, which set the event its service stops on (the service then
releases its lease and waits for its writes, see the services' `run`)."""
from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable


def run_until_signalled(run: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """asyncio.run(run(stop)) with SIGTERM and SIGINT setting `stop`."""
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(stop)

    asyncio.run(main())

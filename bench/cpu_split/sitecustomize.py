"""Where the extender's CPU goes in a cluster run: loaded into the gpuaas extender process only (bench/
scheduler_throughput.py --cpu-split puts this directory first on PYTHONPATH and names the output file in
GPUAAS_CPU_SPLIT). It wraps a few functions with the thread's CPU clock (time.thread_time: time the process ran, not
time it waited for a core, which a 2-core machine running every component has plenty of) and times the garbage
collector's passes (gc.callbacks); what the wrapped parts leave of the process's CPU is the HTTP server and client,
the event loop and bind's bookkeeping. Counting starts at the first filter call. Each part's time excludes the timed
parts inside it (queue planning is not filter's, a collection not the call's it interrupted), so the parts add up.
The totals are written at exit as JSON: {"seconds": {part: s}, "calls": {part: n}}. Not for production: a wrapper
costs ~1 us per call."""
from __future__ import annotations

import os
from pathlib import Path

_OUT = os.environ.get("GPUAAS_CPU_SPLIT")
if _OUT and b"extender" in Path("/proc/self/cmdline").read_bytes().split(b"\0"):
    import atexit
    import builtins
    import functools
    import gc
    import json
    import sys
    import time
    from collections.abc import Callable
    from typing import Any

    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    started: list[float] = []  # process CPU at the first filter

    def add(part: str, spent: float) -> None:
        if started:
            seconds[part] = seconds.get(part, 0.0) + spent
            calls[part] = calls.get(part, 0) + 1

    nested: list[float] = []  # per timed call in progress: the time of the timed calls inside it

    def timed(part: str, f: Callable[..., Any]) -> Callable[..., Any]:
        """f, its CPU counted to `part` without what timed calls inside it count to theirs (the parts add up)."""
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.thread_time()
            nested.append(0.0)
            try:
                return f(*args, **kwargs)
            finally:
                spent = time.thread_time() - t
                add(part, spent - nested.pop())
                if nested:
                    nested[-1] += spent
        return wrapper

    gc_started = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_started[0] = time.thread_time()
        else:
            spent = time.thread_time() - gc_started[0]
            add(f"gc_gen{info['generation']}", spent)
            if nested:  # a collection inside a timed call is the collector's, not that call's
                nested[-1] += spent

    def install() -> None:
        import orjson

        import extender.server as server
        import extender.service as service
        import extender.wire as wire
        import runtime.informer as informer
        import scoring.clusterview as clusterview

        first_filter = service.ExtenderService.filter

        def filter_(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not started:
                started.append(time.process_time())
            return first_filter(self, *args, **kwargs)
        service.ExtenderService.filter = timed("filter", filter_)  # type: ignore[method-assign]
        service.ExtenderService._queue_plan = timed("filter.queue_plan",  # type: ignore[method-assign]
                                                    service.ExtenderService._queue_plan)
        clusterview.ClusterView.renew = timed("bind.renew", clusterview.ClusterView.renew)  # type: ignore[method-assign]
        wire.ExtenderArgs.model_validate = timed("request.validate", wire.ExtenderArgs.model_validate)  # type: ignore[method-assign]
        server._json = timed("reply.encode", server._json)
        informer.Informer._notify = timed("watch.on_change", informer.Informer._notify)  # type: ignore[method-assign]

        class DecodeTimed:  # the informer's orjson, its loads timed
            JSONDecodeError = orjson.JSONDecodeError
            dumps = staticmethod(orjson.dumps)
            loads = staticmethod(timed("watch.decode", orjson.loads))
        informer.orjson = DecodeTimed  # type: ignore[assignment]
        import logging
        logging.StreamHandler.emit = timed("log.emit", logging.StreamHandler.emit)  # type: ignore[method-assign]
        gc.callbacks.append(on_gc)

    def write() -> None:
        if started:
            seconds["process"] = time.process_time() - started[0]
        with open(_OUT or "", "w") as f:
            json.dump({"seconds": seconds, "calls": calls}, f)

    atexit.register(write)
    # Install once every module it wraps is imported (the extender's command imports them all at start).
    real_import = builtins.__import__

    def watching_import(name: str, *args: Any, **kwargs: Any) -> Any:
        module = real_import(name, *args, **kwargs)
        needed = {"extender.server": "live_app", "extender.service": "ExtenderService", "extender.wire": "ExtenderArgs",
                  "runtime.informer": "Informer", "scoring.clusterview": "ClusterView"}
        if all(hasattr(sys.modules.get(m), attr) for m, attr in needed.items()):
            builtins.__import__ = real_import
            install()
        return module
    builtins.__import__ = watching_import

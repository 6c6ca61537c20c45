"""A list-and-watch cache of one kind of Kubernetes object, the informer pattern of client-go in a few lines of asyncio.

It lists (recording the list's resourceVersion), then watches from there with bookmarks; on `410 Gone` or any broken
watch it lists again, replacing its store, so it never misses a change for long. `synced` is set after the first
complete list. Every change is also handed to `on_change(kind, old, new)`. Objects are stored and handed on without
their `metadata.managedFields` (`trim`).

Watch events are newline-delimited JSON, one object per line. The body is read in chunks and split here, with a
bound of `MAX_EVENT_BYTES` (16 MiB) per line: aiohttp's own line reader stops at 512 KiB, which made every update of a
big object (a pod with 1 MiB of environment values) break the watch and relist. 16 MiB is well above what the apiserver
stores: etcd refuses requests over 1.5 MiB by default (`--max-request-bytes`) and kube-apiserver refuses bodies over
3 MiB, so an object's JSON in a watch event, a little larger than its stored protobuf, stays far below the bound.

Readiness: `health(now, max_stale_s)` says whether the cache can be trusted. It is fresh while a watch is open, and
for `max_stale_s` after the last sign of a working connection (a list that succeeded, a watch that opened, an event
or bookmark that arrived); past that, with the watch broken and relists failing, it is stale and says since when and
the last error. A connection that dies silently (no FIN, no RST) keeps the watch open until `resync_seconds`, when
the informer relists; that bounds how long a dead peer can pass for a working one.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from .kubeclient import ApiEndpoint

log = logging.getLogger(__name__)

Obj = dict[str, Any]
OnChange = Callable[[str, Obj | None, Obj | None], None]

MAX_EVENT_BYTES = 16 * 1024 * 1024  # one watch event (one line); see the module docstring for why 16 MiB


class EventTooLarge(ValueError):
    """A watch event line longer than the bound: the watch ends and the informer relists."""


async def split_lines(chunks: AsyncIterable[bytes], limit: int = MAX_EVENT_BYTES) -> AsyncIterator[bytes]:
    """The lines of a byte stream (newline removed), however the chunks cut them; a last line without a newline too.
    Holds at most `limit` bytes of an unfinished line; a longer line raises EventTooLarge. Each byte is searched for
    a newline once, so a line in many chunks costs linear time."""
    buf = bytearray()
    async for chunk in chunks:
        start = 0
        while (nl := chunk.find(b"\n", start)) >= 0:
            if len(buf) + nl - start > limit:
                raise EventTooLarge(f"a watch event of more than {limit} bytes")
            if buf:
                buf += chunk[start:nl]
                yield bytes(buf)
                buf.clear()
            else:
                yield chunk[start:nl]
            start = nl + 1
        if len(buf) + len(chunk) - start > limit:
            raise EventTooLarge(f"a watch event of more than {limit} bytes")
        buf += chunk[start:]
    if buf:
        yield bytes(buf)


@dataclass(frozen=True)
class Health:
    """Whether one informer's cache can be trusted now, and if not, why (for a /readyz body)."""
    ok: bool
    why: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class Readiness:
    """All of a process's informers: ready when each is healthy; `why` lists the ones that are not."""
    ok: bool
    why: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.ok

    @property
    def text(self) -> str:
        return "ok" if self.ok else "not ready: " + "; ".join(self.why)


def trim(obj: Obj) -> Obj:
    """The object as the store keeps it: without `metadata.managedFields`, which nothing here reads (server-side
    apply's bookkeeping: a third or more of a pod's JSON, and its most numerous small objects). kube-scheduler's pod
    informer drops them for the same reason (pkg/scheduler/scheduler.go, newPodInformer): memory, and here also the
    cyclic garbage collector's passes over every stored object."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def object_key(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


class Informer:
    def __init__(self, endpoint: ApiEndpoint, path: str, *, kind: str, on_change: OnChange | None = None,
                 field_selector: str | None = None, label_selector: str | None = None,
                 resync_seconds: float = 300.0, page_size: int = 500, max_event_bytes: int = MAX_EVENT_BYTES,
                 clock: Callable[[], float] = time.monotonic):
        self.endpoint = endpoint
        self.path = path  # e.g. /api/v1/nodes, /api/v1/pods
        self.kind = kind
        self.on_change = on_change
        self.params = {k: v for k, v in (("fieldSelector", field_selector), ("labelSelector", label_selector)) if v}
        self.resync_seconds = resync_seconds
        self.page_size = page_size
        self.store: dict[str, Obj] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.max_event_bytes = max_event_bytes
        self.relists = 0
        self.errors = 0
        self.clock = clock  # time.monotonic unless a test injects one; `health(now)` takes its time
        self.watching = False  # a watch stream is open now
        self.last_contact: float | None = None  # clock time of the last list, watch start, event or bookmark
        self.last_error = ""  # the last failure of a list or watch, and its clock time
        self.last_error_at: float | None = None

    def health(self, now: float, max_stale_s: float) -> Health:
        """Healthy once synced, while a watch is open, or within `max_stale_s` of the last contact; otherwise
        stale, saying for how long and the last error. Pure: reads this informer's state at `now`."""
        name = f"informer {self.kind} ({self.path})"
        detail = f"; last error {now - self.last_error_at:.0f}s ago: {self.last_error}" \
            if self.last_error and self.last_error_at is not None else ""
        if not self.synced.is_set():
            return Health(False, f"{name}: not synced yet{detail}")
        if self.watching:
            return Health(True)
        since = self.last_contact if self.last_contact is not None else now
        if now - since <= max_stale_s:
            return Health(True)
        return Health(False, f"{name}: no working watch for {now - since:.0f}s (more than {max_stale_s:g}s){detail}")

    @staticmethod
    def readiness(informers: Iterable[Informer], max_stale_s: float) -> Readiness:
        """A process's readiness: at least one informer and every one healthy, each at its own clock's time."""
        informers = list(informers)
        if not informers:
            return Readiness(False, ("no informers started yet",))
        why = tuple(h.why for h in (i.health(i.clock(), max_stale_s) for i in informers) if not h.ok)
        return Readiness(not why, why)

    def _contact(self) -> None:
        self.last_contact = self.clock()

    async def run(self, session: aiohttp.ClientSession) -> None:
        """List and watch until cancelled."""
        backoff = 0.5
        while True:
            try:
                await self._list(session)
                backoff = 0.5
                await asyncio.wait_for(self._watch(session), timeout=self.resync_seconds)
            except TimeoutError:
                pass  # periodic resync: list again
            except asyncio.CancelledError:
                raise
            except Exception as err:  # network trouble, apiserver restart: back off and relist
                self.errors += 1
                self.last_error = f"{type(err).__name__}: {err}"
                self.last_error_at = self.clock()
                log.warning("informer %s: %s; relisting in %.1fs", self.path, err, backoff)
                await asyncio.sleep(backoff * (1 + random.random() / 2))
                backoff = min(backoff * 2, 30.0)

    def _notify(self, old: Obj | None, new: Obj | None) -> None:
        # A handler's bug concerns one object: log it with its traceback and keep the watch, rather than relisting.
        if self.on_change is None:
            return
        try:
            self.on_change(self.kind, old, new)
        except Exception:
            self.errors += 1
            obj = new or old or {}
            log.exception("informer %s: handler failed on %s", self.path, object_key(obj) if obj else "?")

    async def _list(self, session: aiohttp.ClientSession) -> None:
        items: dict[str, Obj] = {}
        params = {**self.params, "limit": str(self.page_size)}
        while True:
            async with session.get(self.path, params=params) as resp:
                resp.raise_for_status()
                body = orjson.loads(await resp.read())
            for item in body.get("items") or ():
                items[object_key(item)] = trim(item)
            cont = body.get("metadata", {}).get("continue")
            if not cont:
                break
            params["continue"] = cont
        self.resource_version = body["metadata"]["resourceVersion"]
        old = self.store
        self.store = items
        self.relists += 1
        self._contact()
        if self.on_change:
            for key, obj in items.items():
                prev = old.get(key)
                if prev is None or prev["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                    self._notify(prev, obj)
            for key in old.keys() - items.keys():
                self._notify(old[key], None)
        self.synced.set()

    async def _watch(self, session: aiohttp.ClientSession) -> None:
        params = {**self.params, "watch": "1", "allowWatchBookmarks": "true",
                  "resourceVersion": self.resource_version, "timeoutSeconds": str(int(self.resync_seconds))}
        async with session.get(self.path, params=params, timeout=aiohttp.ClientTimeout(total=None,
                                                                                      sock_read=None)) as resp:
            resp.raise_for_status()
            self._contact()
            self.watching = True
            try:
                await self._events(split_lines(resp.content.iter_any(), self.max_event_bytes))
            finally:
                self.watching = False
                self._contact()  # the stream worked until now; staleness counts from its end

    async def _events(self, lines: AsyncIterable[bytes]) -> None:
        async for line in lines:
            if not line.strip():
                continue
            self._contact()
            event = orjson.loads(line)
            kind, obj = event["type"], event["object"]
            if kind == "ERROR":
                if obj.get("code") == 410:  # resourceVersion too old: start over from a list
                    return
                raise RuntimeError(f"watch error: {obj.get('message')}")
            self.resource_version = obj["metadata"]["resourceVersion"]
            if kind == "BOOKMARK":
                continue
            key = object_key(trim(obj))
            prev = self.store.get(key)
            if kind == "DELETED":
                self.store.pop(key, None)
                new = None
            else:
                self.store[key] = obj
                new = obj
            if self.on_change:
                self._notify(prev, new)

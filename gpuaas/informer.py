"""A list-and-watch cache of one kind of Kubernetes object, the informer pattern of client-go in a few lines of asyncio.

It lists (recording the list's resourceVersion), then watches from there with bookmarks; on `410 Gone` or any broken
watch it lists again, replacing its store, so it never misses a change for long. `synced` is set after the first
complete list; readiness probes wait on it. Every change is also handed to `on_change(kind, old, new)`.
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from .kubeclient import ApiEndpoint

log = logging.getLogger(__name__)

Obj = dict[str, Any]
OnChange = Callable[[str, Obj | None, Obj | None], None]


def object_key(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


class Informer:
    def __init__(self, endpoint: ApiEndpoint, path: str, *, kind: str, on_change: OnChange | None = None,
                 field_selector: str | None = None, label_selector: str | None = None,
                 resync_seconds: float = 300.0, page_size: int = 500):
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
        self.relists = 0
        self.errors = 0

    async def run(self, session: aiohttp.ClientSession) -> None:
        """List and watch until cancelled."""
        backoff = 0.5
        while True:
            try:
                await self._list(session)
                backoff = 0.5
                await asyncio.wait_for(self._watch(session), timeout=self.resync_seconds)
            except asyncio.TimeoutError:
                pass  # periodic resync: list again
            except asyncio.CancelledError:
                raise
            except Exception as err:  # network trouble, apiserver restart: back off and relist
                self.errors += 1
                log.warning("informer %s: %s; relisting in %.1fs", self.path, err, backoff)
                await asyncio.sleep(backoff * (1 + random.random() / 2))
                backoff = min(backoff * 2, 30.0)

    def _notify(self, old: Obj | None, new: Obj | None) -> None:
        # A handler's bug concerns one object: log it with its traceback and keep the watch, rather than relisting.
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
                items[object_key(item)] = item
            cont = body.get("metadata", {}).get("continue")
            if not cont:
                break
            params["continue"] = cont
        self.resource_version = body["metadata"]["resourceVersion"]
        old = self.store
        self.store = items
        self.relists += 1
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
            async for line in resp.content:
                if not line.strip():
                    continue
                event = orjson.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    if obj.get("code") == 410:  # resourceVersion too old: start over from a list
                        return
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                self.resource_version = obj["metadata"]["resourceVersion"]
                if kind == "BOOKMARK":
                    continue
                key = object_key(obj)
                prev = self.store.get(key)
                if kind == "DELETED":
                    self.store.pop(key, None)
                    new = None
                else:
                    self.store[key] = obj
                    new = obj
                if self.on_change:
                    self._notify(prev, new)

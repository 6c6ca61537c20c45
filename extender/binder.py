"""Bind a pod through the apiserver: one Binding that also carries the GPU assignment as a pod annotation (the
apiserver copies a Binding's annotations onto the pod), so the node and the devices land together or not at all."""
from __future__ import annotations

from typing import Protocol
from urllib.parse import quote

import aiohttp
import orjson

JSON_BODY = {"Content-Type": "application/json"}  # the body is encoded with orjson, not aiohttp's json.dumps


class BindError(RuntimeError):
    pass


class Binder(Protocol):
    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None: ...


def pod_path(namespace: str, name: str, *sub: str) -> str:
    """The apiserver path of a pod (or its subresource). The names were checked at the wire (scoring.names: DNS-1123,
    no '/', '?', '%' or '..'); each is quoted as one path segment all the same."""
    return "/".join(["/api/v1/namespaces", quote(namespace, safe=""), "pods", quote(name, safe=""), *sub])


class ApiBinder:
    def __init__(self, session: aiohttp.ClientSession):
        self.session = session

    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        async with self.session.post(pod_path(namespace, name, "binding"), data=orjson.dumps(body),
                                     headers=JSON_BODY) as resp:
            if resp.status >= 300:
                detail = (await resp.json(content_type=None) or {}).get("message", resp.reason)
                raise BindError(f"binding {namespace}/{name} to {node}: HTTP {resp.status}: {detail}")
            # Read the (small) Status reply to the end: aiohttp closes a connection whose body it has not fully
            # received, and a reply split across reads would then cost the next Binding a new TCP and TLS handshake.
            await resp.read()


class NoBinder:
    """Snapshot mode: nothing to bind against."""

    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        raise BindError("this extender serves a static snapshot and cannot bind")

"""Kubernetes Events from a controller: the one recorder the node scaler and the gang controller share.

Events are records, sent from a small thread pool off the decision's path (fifty of them must not delay the next
decision), the same event for the same object at most once per `repeat_s`, every request bounded by
`request_timeout`, and none sent once `may_act()` is false (the lease lost, or shutting down). A failed event is
logged, never raised: it is no reason to stop acting.
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)


class EventRecorder:
    def __init__(self, core: Any, component: str, *, request_timeout: float | None = None,
                 may_act: Callable[[], bool] = lambda: True, repeat_s: float = 300.0):
        self.core = core  # a kubernetes.client.CoreV1Api
        self.component = component
        self.timeout = request_timeout
        self.may_act = may_act
        self.repeat_s = repeat_s
        self._recent: dict[tuple[Any, ...], float] = {}
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="events")

    def event(self, obj: dict[str, str], type_: str, reason: str, message: str) -> None:
        """Record `reason: message` on the object `obj` refers to (kind, namespace, name, uid, apiVersion)."""
        key = (obj.get("kind"), obj.get("namespace"), obj.get("name"), reason, message)
        now = time.time()
        if now - self._recent.get(key, 0.0) < self.repeat_s:
            return
        self._recent[key] = now
        if len(self._recent) > 20000:
            self._recent = {k: t for k, t in self._recent.items() if now - t < self.repeat_s}
        self._pool.submit(self.send, obj, type_, reason, message)

    def close(self) -> None:
        """Wait for the events already submitted (each bounded by the request timeout, sent only while allowed)."""
        self._pool.shutdown(wait=True)

    def send(self, obj: dict[str, str], type_: str, reason: str, message: str) -> None:
        ts = dt.datetime.now(dt.UTC).isoformat()
        ns = obj.get("namespace") or "default"
        if not self.may_act():
            return  # no write once this replica may not act (lease lost or shutting down)
        try:
            self.core.create_namespaced_event(ns, {
                "metadata": {"generateName": f"{obj['name']}.", "namespace": ns},
                "involvedObject": {k: v for k, v in obj.items() if v},
                "type": type_, "reason": reason, "message": message[:1024],
                "source": {"component": self.component}, "reportingComponent": self.component,
                "reportingInstance": self.component, "firstTimestamp": ts, "lastTimestamp": ts, "count": 1},
                _preload_content=False, _request_timeout=self.timeout)
        except Exception as err:  # an event is a record, never a reason to stop acting
            log.warning("event %s on %s/%s: %s", reason, ns, obj.get("name"), err)


def node_ref(name: str) -> dict[str, str]:
    return {"apiVersion": "v1", "kind": "Node", "name": name}


def pod_ref(key: str, uid: str = "") -> dict[str, str]:
    ns, name = key.split("/", 1)
    return {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": name, "uid": uid}

"""Small helpers the end-to-end tests share: waiting on the API and reading scheduling outcomes."""
from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

from kubernetes import client

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout: float = 30.0, interval: float = 0.25, what: str = "condition") -> T:
    """Poll `probe` until it returns something truthy; return that, or fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")


def pod(api: client.ApiClient, namespace: str, name: str) -> client.V1Pod:
    return client.CoreV1Api(api).read_namespaced_pod(name, namespace)


def pod_events(api: client.ApiClient, namespace: str, name: str) -> list[client.CoreV1Event]:
    return client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}").items


def pod_phase(api: client.ApiClient, namespace: str, name: str) -> str:
    return pod(api, namespace, name).status.phase

"""Invariant checkers that run beside an end-to-end test, in threads, for the whole test:

- `PdbWatch`: polls every PodDisruptionBudget's pods (Ready and not terminating) every `interval`; once a budget's
  pods have reached minAvailable, any later poll below it is a violation. It records when each poll ended, so a test
  can check that it polled while the disruptions it guards were going on.
- `NodeDeletionWatch`: watches Nodes; when one is deleted it lists the pods still bound to it (from the apiserver);
  a pod holding resources there (not Succeeded/Failed, not a DaemonSet pod) is a violation. A watch that expires
  (410) is followed by a list, and a node missing from it is checked as deleted, so no deletion goes unchecked.
  It also logs every drain record (`gpuaas.io/drain` id) seen on a node, when it opened and how it ended (node
  deleted, or annotation gone with the node schedulable again).

A checker that fails (an exception in its thread: it could not check for a while) does not fail silently: the error is
kept, the checker goes on, and `assert_ok()` (which also fails on any violation, or a thread that did not stop) says
so. Tests end with `assert_ok()` rather than reading `violations` alone.
"""
from __future__ import annotations

import datetime as dt
import json
import threading
import time

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from nodescaler.snapshot import DRAIN_ANNOTATION


def _selector(sel) -> str:
    parts = [f"{k}={v}" for k, v in (sel.match_labels or {}).items()]
    for e in sel.match_expressions or ():
        parts.append(f"{e.key} {e.operator.lower()} ({','.join(e.values or ())})")
    return ",".join(parts)


def _ready(p) -> bool:
    if p.metadata.deletion_timestamp is not None or p.status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())


class _Thread:
    def __init__(self) -> None:
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[str] = []

    def start(self):
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.loop()
            except Exception as err:  # keep watching, but a check that could not run is reported by assert_ok
                self.errors.append(f"{time.time():.2f} {err!r}")
                time.sleep(0.2)

    def assert_ok(self) -> None:
        """Fails on any violation, any error the checker ran into (it was blind meanwhile), or a thread still running
        after stop()."""
        name = type(self).__name__
        assert not self.thread.is_alive(), f"{name} did not stop"
        assert not self.errors, f"{name} could not check, {len(self.errors)} times: {self.errors[:5]}"
        assert not self.violations, f"{name}: {self.violations}"


class PdbWatch(_Thread):
    def __init__(self, api: client.ApiClient, namespace: str, interval: float = 0.1):
        super().__init__()
        self.policy = client.PolicyV1Api(api)
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.interval = interval
        self.armed: set[str] = set()
        self.violations: list[str] = []
        self.polls = 0
        self.poll_times: list[float] = []  # time.monotonic() at the end of each complete poll
        self.armed_at: dict[str, float] = {}
        self.min_seen: dict[str, int] = {}

    def loop(self) -> None:
        for pdb in self.policy.list_namespaced_pod_disruption_budget(self.namespace).items:
            want = pdb.spec.min_available
            if want is None or isinstance(want, str):
                continue
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=_selector(pdb.spec.selector)).items
            healthy = sum(1 for p in pods if _ready(p))
            name = pdb.metadata.name
            if name in self.armed:
                self.min_seen[name] = min(self.min_seen.get(name, healthy), healthy)
                if healthy < want:
                    self.violations.append(f"{time.time():.2f} {name}: {healthy} healthy < minAvailable {want}")
            elif healthy >= want:
                self.armed.add(name)
                self.armed_at[name] = time.monotonic()
        self.polls += 1
        self.poll_times.append(time.monotonic())
        self.stop_event.wait(self.interval)

    def polls_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.poll_times if start <= t <= end)


class NodeDeletionWatch(_Thread):
    def __init__(self, api: client.ApiClient):
        super().__init__()
        self.core = client.CoreV1Api(api)
        self.deleted: list[str] = []
        self.violations: list[str] = []
        self.drains: dict[str, tuple[str, str]] = {}  # drain id -> (node, outcome: open|deleted|rolled-back)
        self.opened_at: dict[str, float] = {}  # drain id -> time.monotonic() it was first seen
        self.closed_at: dict[str, float] = {}  # drain id -> time.monotonic() it was seen to end
        self.relists = 0
        self._annotated: dict[str, str] = {}  # node -> drain id on it now
        self._known: set[str] = set()  # nodes that exist, as far as the watch has told
        self._rv: str | None = None

    def loop(self) -> None:
        if self._rv is None:  # one list, then watch from its resourceVersion without gaps
            listed = self.core.list_node()
            self._rv = listed.metadata.resource_version
            names = {n.metadata.name for n in listed.items}
            for gone in sorted(self._known - names):  # deleted while the watch was down: checked now
                self._seen("DELETED", client.V1Node(metadata=client.V1ObjectMeta(name=gone)))
            for node in listed.items:
                self._seen("ADDED", node)
        w = watch.Watch()
        try:
            for ev in w.stream(self.core.list_node, timeout_seconds=5, resource_version=self._rv):
                self._rv = ev["object"].metadata.resource_version
                self._seen(ev["type"], ev["object"])
                if self.stop_event.is_set():
                    w.stop()
                    return
        except ApiException as err:
            if err.status == 410:  # too old: list again (nodes gone meanwhile are checked then)
                self.relists += 1
                self._rv = None
                return
            raise

    def _seen(self, kind: str, node) -> None:
        name = node.metadata.name
        drain = (node.metadata.annotations or {}).get(DRAIN_ANNOTATION)
        if kind == "DELETED":
            self._known.discard(name)
            self.deleted.append(name)
            pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
            held = [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods
                    if p.status.phase not in ("Succeeded", "Failed")
                    and not any(o.kind == "DaemonSet" for o in p.metadata.owner_references or ())]
            if held:
                self.violations.append(f"node {name} deleted with pods on it: {held}")
            if name in self._annotated:
                did = self._annotated.pop(name)
                self.drains[did] = (name, "deleted")
                self.closed_at[did] = time.monotonic()
            return
        self._known.add(name)
        if drain:
            did = json.loads(drain)["id"]
            self._annotated[name] = did
            if did not in self.drains:
                self.drains[did] = (name, "open")
                self.opened_at[did] = time.monotonic()
        elif name in self._annotated:
            did = self._annotated.pop(name)
            self.drains[did] = (name, "rolled-back" if not node.spec.unschedulable else "annotation-gone-cordoned")
            self.closed_at[did] = time.monotonic()

    def open_drains(self) -> dict[str, tuple[str, str]]:
        return {d: v for d, v in self.drains.items() if v[1] not in ("deleted", "rolled-back")}


def fifo_latencies(unschedulable_at: list[float], requested_at: list[float]) -> list[float]:
    """Scale-up latency per pod for interchangeable pods: the k-th pod to turn unschedulable is served by the k-th node
    requested (any pending pod may take any new node, so which pod a grow was "for" is arbitrary). A node requested
    before its pod turned unschedulable counts 0."""
    pods, nodes = sorted(unschedulable_at), sorted(requested_at)
    return [max(0.0, n - p) for p, n in zip(pods, nodes, strict=False)]  # pods without a node yet: not counted


def failed_scheduling_times(api: client.ApiClient, namespace: str, prefix: str = "") -> dict[str, float]:
    """When kube-scheduler first failed to place each pod: the eventTime (microseconds) of its first FailedScheduling
    event, recorded together with the PodScheduled=False condition (whose lastTransitionTime has whole seconds)."""
    out: dict[str, float] = {}
    # Raw JSON: the client's model refuses events.k8s.io Events without eventTime (core/v1 events have none).
    raw = client.EventsV1Api(api).list_namespaced_event(namespace, _preload_content=False).data
    for ev in json.loads(raw)["items"]:
        name = (ev.get("regarding") or {}).get("name", "")
        if ev.get("reason") != "FailedScheduling" or not name.startswith(prefix) or not ev.get("eventTime"):
            continue
        t = dt.datetime.fromisoformat(ev["eventTime"].replace("Z", "+00:00")).timestamp()
        out[name] = min(out.get(name, float("inf")), t)
    return out

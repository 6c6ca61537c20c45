"""Defect 2 of issue 13: the leader can act after it has stepped down. On shutdown the node scaler released its Lease
while the reconcile's worker thread was still in the middle of a write (cancelling the asyncio task that awaited
`asyncio.to_thread` does not stop the thread), and its writes had no request timeout.

Here the whole `Service.run` runs with fake informers, a fake elector and a provider whose write blocks until it
times out (as a write bounded by its request timeout does); the log of what happened, in order, must show every write
ending before the lease is released, and none starting after shutdown began."""
from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import ClassVar

import pytest

import nodescaler.service as service_module
from nodescaler.controller import KubeCluster, NodeScaler
from nodescaler.provider import FakeProvider, KwokProvider, ProviderError
from nodescaler.service import Service
from runtime.informer import Health, Informer

from .builders import T0, config, pending
from .test_controller import GROUPS, FakeCluster

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


class Log:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[str] = []
        self.released = threading.Event()

    def add(self, what: str) -> None:
        with self.lock:
            self.entries.append(what)


class FakeInformer:
    """Synced at once, with the objects given, and healthy; never watches anything."""

    objects: ClassVar[dict[str, list[dict]]] = {}
    readiness = staticmethod(Informer.readiness)
    clock = staticmethod(time.monotonic)

    def __init__(self, endpoint, path, *, kind, on_change=None):
        self.store = {str(i): o for i, o in enumerate(self.objects.get(kind, []))}
        self.synced = asyncio.Event()
        self.synced.set()

    async def run(self, session) -> None:
        await asyncio.Event().wait()

    def health(self, now: float, max_stale_s: float) -> Health:
        return Health(True)


class FakeElector:
    """Leads from the start; `run` releases when stopped, as LeaderElector.run does."""

    identity, acquired_at, write_timeout = "me", 0.0, 1.0

    def __init__(self, log: Log) -> None:
        self.log = log
        self.leading = True

    def is_leader(self) -> bool:
        return self.leading

    def may_write(self, timeout: float | None = None) -> bool:
        return self.leading

    def run(self, stop: threading.Event) -> None:
        stop.wait()
        self.release()

    def release(self) -> None:
        if self.leading:
            self.leading = False
            self.log.add("release")
            self.log.released.set()


class BlockingProvider(FakeProvider):
    """A grow whose request is in flight until its timeout (1 s) or until the lease is released, then lands."""

    def __init__(self, log: Log) -> None:
        super().__init__()
        self.log = log
        self.entered = threading.Event()

    def grow(self, group, count):
        self.log.add("grow started")
        self.entered.set()
        self.log.released.wait(1.0)
        self.log.add("grow landed")
        return super().grow(group, count)


class RecordingCluster(FakeCluster):
    def __init__(self, log: Log) -> None:
        super().__init__([], [])
        self.log = log

    def event(self, obj, type_, reason, message):
        self.log.add(f"event {reason}")

    def patch_node(self, name, patch):
        self.log.add(f"patch {name}")
        return super().patch_node(name, patch)


@pytest.fixture(autouse=True)
def no_dra(monkeypatch):
    """The informers here are fakes that never call the apiserver; so is the probe for resource.k8s.io/v1 (a cluster
    without DRA: no DRA informers)."""
    async def none(*args, **kwargs):
        return {}

    monkeypatch.setattr(service_module, "dra_informers", none)


@pytest.fixture
def kubeconfig(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path


def test_shutdown_waits_for_the_reconcile_and_no_write_lands_after_the_lease_is_released(kubeconfig, monkeypatch):
    log = Log()
    now = time.time()  # the service reconciles at the wall clock's now
    monkeypatch.setattr(FakeInformer, "objects", {"Pod": [pending(f"p{i}", gpus=8, created=now - 10, since=now - 5)
                                                          for i in range(2)]})
    monkeypatch.setattr(service_module, "Informer", FakeInformer)
    cfg = config(GROUPS, interval_s=0.05)
    svc = Service(cfg, kubeconfig, identity="me")
    svc.elector = FakeElector(log)
    provider = BlockingProvider(log)
    cluster = RecordingCluster(log)
    # As Service wires it (getattr: the same test runs against e3637bb, which had only is_leader, to show the race).
    svc.scaler = NodeScaler(cfg, svc._no_snapshot, cluster, provider, metrics=svc.metrics,
                            may_act=getattr(svc, "may_write", svc.is_leader))

    async def scenario():
        stop = asyncio.Event()
        task = asyncio.create_task(svc.run("127.0.0.1", 0, stop))
        assert await asyncio.to_thread(provider.entered.wait, 30), "a reconcile started a write"
        stop.set()  # SIGTERM while the grow is in flight
        await asyncio.wait_for(task, 30)

    asyncio.run(scenario())
    entries = log.entries
    assert "release" in entries, entries
    released = entries.index("release")
    assert entries[:released].count("grow started") == entries[:released].count("grow landed") == 1, entries
    assert entries[released:] == ["release"], f"writes after the lease was released: {entries}"


def test_shutdown_lets_no_write_start_and_returns_once_the_reconcile_is_done():
    log = Log()
    cluster = FakeCluster([], [pending("p", gpus=8, created=T0)])
    started, proceed = threading.Event(), threading.Event()

    class SlowProvider(FakeProvider):
        def grow(self, group, count):
            log.add("grow started")
            started.set()
            proceed.wait(10)
            log.add("grow landed")
            return super().grow(group, count)

    scaler = NodeScaler(config(GROUPS), cluster.snapshot, cluster, SlowProvider())
    scaler.cluster.event = lambda *a: log.add("event")  # a write too
    worker = threading.Thread(target=scaler.run_once, args=(T0,))
    worker.start()
    assert started.wait(10)
    done = threading.Event()
    threading.Thread(target=lambda: (scaler.shutdown(), log.add("shutdown returned"), done.set())).start()
    assert not done.wait(0.2), "shutdown returned while a write was in flight"
    proceed.set()
    assert done.wait(10)
    worker.join(10)
    # The write in flight ended first; after shutdown began no write started (the grow's TriggeredScaleUp events).
    assert log.entries == ["grow started", "grow landed", "shutdown returned"]
    assert scaler.run_once(T0 + 1).grows == []  # and a reconcile after shutdown acts on nothing


class Recorder:
    """Stands in for CoreV1Api: records the request timeout of every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def __getattr__(self, verb):
        def call(*args, _request_timeout=None, **kwargs):
            self.calls.append((verb, _request_timeout))
            return SimpleNamespace(data=b'{"items": [], "metadata": {"name": "n"}}')
        return call


def test_every_kubernetes_call_of_the_node_scaler_is_bounded_by_the_request_timeout():
    cluster = KubeCluster(None, request_timeout=1.5)
    cluster.core = cluster.events.core = Recorder()
    cluster.get_node("n")
    cluster.patch_node("n", {})
    cluster.pods_on_node("n")
    cluster.evict("ns", "p", {})
    cluster.events.send({"kind": "Pod", "name": "p", "namespace": "ns"}, "Normal", "R", "m")
    provider = KwokProvider(None, request_timeout=1.5)
    provider.core = Recorder()
    provider.grow(config(GROUPS).group("a100"), 2)
    provider.delete_node(config(GROUPS).group("a100"), "n")
    calls = cluster.core.calls + provider.core.calls
    assert {v for v, _ in calls} == {"read_node", "patch_node", "list_pod_for_all_namespaces",
                                     "create_namespaced_pod_eviction", "create_namespaced_event", "create_node",
                                     "delete_node"}
    assert all(t == 1.5 for _, t in calls), calls


def test_no_provider_or_event_write_starts_once_the_replica_may_not_act():
    allowed = {"v": True}
    cluster = KubeCluster(None, request_timeout=1.5, may_act=lambda: allowed["v"])
    cluster.core = cluster.events.core = Recorder()
    provider = KwokProvider(None, request_timeout=1.5, may_act=lambda: allowed["v"])
    provider.core = Recorder()
    allowed["v"] = False
    cluster.events.send({"kind": "Pod", "name": "p", "namespace": "ns"}, "Normal", "R", "m")
    with pytest.raises(ProviderError, match="may not act any more"):
        provider.grow(config(GROUPS).group("a100"), 2)
    with pytest.raises(ProviderError, match="may not act any more"):
        provider.delete_node(config(GROUPS).group("a100"), "n")
    assert cluster.core.calls == [] and provider.core.calls == []


def test_a_leader_whose_watches_are_stale_does_not_act_on_its_model(kubeconfig, monkeypatch):
    """Readiness is withdrawn once a watch has been broken for max_watch_stale_s (defect 10); the leader does not
    act on such a model either: no grow for pods the stale cache shows pending, until the watches are healthy."""
    class StaleInformer(FakeInformer):
        healthy = False

        def health(self, now, max_stale_s):
            return Health(True) if StaleInformer.healthy else Health(False, "watch broken (test)")

    log = Log()
    now = time.time()
    monkeypatch.setattr(StaleInformer, "objects", {"Pod": [pending("p0", gpus=8, created=now - 10, since=now - 5)]})
    monkeypatch.setattr(service_module, "Informer", StaleInformer)
    cfg = config(GROUPS, interval_s=0.05)
    svc = Service(cfg, kubeconfig, identity="me")
    svc.elector = FakeElector(log)
    provider = FakeProvider()
    svc.scaler = NodeScaler(cfg, svc._no_snapshot, RecordingCluster(log), provider, metrics=svc.metrics,
                            may_act=svc.is_leader)

    async def scenario():
        stop = asyncio.Event()
        task = asyncio.create_task(svc.run("127.0.0.1", 0, stop))
        await asyncio.sleep(1.0)  # twenty intervals with stale watches
        grows_while_stale = list(provider.grow_calls)
        StaleInformer.healthy = True
        for _ in range(300):
            if provider.grow_calls:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 30)
        return grows_while_stale

    assert asyncio.run(scenario()) == [], "grew on a stale model"
    assert provider.grow_calls, "grew once the watches were healthy again"

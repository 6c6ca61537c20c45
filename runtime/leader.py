"""Leader election on a coordination.k8s.io/v1 Lease, client-go's algorithm with a takeover on time.

Safety is client-go's: a candidate judges expiry by its *own* clock from when it *saw the Lease record change*
(client-go's observedTime), never by comparing another machine's renewTime with its clock, so clock skew between
replicas does not matter; every write is conditional on the Lease's resourceVersion, so of two racing candidates one
gets 409; and a leader that could not renew for `renew_deadline_s` stops calling itself leader (`is_leader()`, which
every write of a controller checks first) before the lease runs out for the others (`renew_deadline_s <
lease_duration_s`). Its renewal counts from before it read the Lease, a candidate's observation from after its read
or watch event returned: both ends err on the safe side.

Takeover on time: client-go's candidates poll every retry period, so they see a renewal up to one period late and
notice the expiry up to one period late again (measured with a 4 s lease and 0.5 s period: 3.8-4.5 s after the leader
was killed). Here a candidate *watches* the Lease, so it sees each renewal within milliseconds of the write, and sleeps
until exactly the expiry it computes (observed + leaseDurationSeconds) instead of until the next retry tick. A leader
killed at any point is replaced within the lease duration of its last renewal, plus the watch's delivery and one
read and one write. When the watch is not allowed (RBAC without `list`/`watch` on leases) or broken, a candidate also
polls every retry period, still waking at the expiry instant; takeover is then within the lease plus one period.

    elector = LeaderElector(api, namespace="kube-system", name="gpuaas-nodescaler", identity=pod_name)
    threading.Thread(target=elector.run, args=(stop,), daemon=True).start()
    if elector.is_leader(): ...

The timing decision is `next_attempt` (pure); `LeaderElector.step` does one due attempt and says when the next is due,
so tests drive the whole schedule on a fake clock.
"""
from __future__ import annotations

import datetime as dt
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger("gpuaas.leader")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def pod_namespace(kubeconfig: str | Path | None = None) -> str:
    """The namespace this process runs in, as client-go's in-cluster config finds it ($POD_NAMESPACE, then the service
    account's namespace file); outside a cluster the kubeconfig's current-context namespace, else "default"."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        pass
    try:
        from kubernetes import config

        _, current = config.list_kube_config_contexts(config_file=str(kubeconfig) if kubeconfig else None)
        return (current or {}).get("context", {}).get("namespace") or "default"
    except Exception:  # no kubeconfig at all: in-cluster without the namespace file
        return "default"


class LeaderElectionConfig(BaseModel):
    """The `leader_election` section of a component's config; components subclass it to set `name` (and the
    nodescaler its historical `namespace`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = Field(default=True, description="act only while holding the Lease; off: run one replica only")
    namespace: str | None = Field(default=None, description="namespace of the Lease; empty: the namespace this "
                                  "process runs in")
    name: str = Field(description="name of the Lease")
    # client-go's defaults: 15 / 10 / 2 s
    lease_duration_s: float = Field(default=15.0, gt=0, description="a standby takes over this long after it last "
                                    "saw the Lease renewed")
    renew_deadline_s: float = Field(default=10.0, gt=0, description="the leader stops acting when it could not renew "
                                    "for this long; below lease_duration_s")
    retry_period_s: float = Field(default=2.0, gt=0, description="how often the leader renews and a candidate retries "
                                  "when it cannot watch the Lease; below renew_deadline_s")

    @model_validator(mode="after")
    def _order(self):
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("leader election needs retry_period_s < renew_deadline_s < lease_duration_s")
        return self


def write_timeout(renew_deadline_s: float, retry_period_s: float) -> float:
    """See `LeaderElector.write_timeout`; for components that run without an elector, from the same config."""
    return (renew_deadline_s - retry_period_s) / 2


def component_elector(api: Any, config: LeaderElectionConfig, *, identity: str | None,
                      kubeconfig: str | Path | None, on_change: Callable[[bool], None]
                      ) -> tuple[LeaderElector | None, float]:
    """A controller's elector (None with leader election off: one replica only) and the timeout that bounds each of
    its writes, which start only while the lease is still ours for at least that long."""
    if not config.enabled:
        return None, write_timeout(config.renew_deadline_s, config.retry_period_s)
    elector = LeaderElector.from_config(api, config, identity=identity, kubeconfig=kubeconfig, on_change=on_change)
    return elector, elector.write_timeout


def _micro(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Observed:
    holder: str | None
    renew_time: str | None
    resource_version: str | None
    duration_s: float
    seen_at: float  # our monotonic clock when this record (holder, renewTime) was first seen

    @property
    def expires_at(self) -> float:
        return self.seen_at + self.duration_s


def observe(prev: Observed | None, holder: str | None, renew_time: str | None, resource_version: str | None,
            duration_s: float, now: float) -> Observed:
    """The record as now known. `seen_at` moves only when (holder, renewTime) changed: seeing the same renewal again
    (a poll, a re-listed watch) must not extend it."""
    if prev is not None and (prev.holder, prev.renew_time) == (holder, renew_time):
        return replace(prev, resource_version=resource_version, duration_s=duration_s)
    return Observed(holder, renew_time, resource_version, duration_s, now)


@dataclass(frozen=True)
class Timings:
    lease_duration_s: float
    renew_deadline_s: float
    retry_period_s: float


def next_attempt(*, leading: bool, observed: Observed | None, identity: str, last_attempt: float | None,
                 watching: bool, timings: Timings) -> float:
    """When (our monotonic clock) to try to acquire or renew next.

    - the leader renews one retry period after its last attempt, far inside its renew deadline;
    - a lease free, unknown or ours: one retry period after the last attempt (at once if none yet);
    - a lease another holds: at the instant it expires by our observation, not at the next retry tick; without a
      watch also at every tick, since polling is then how renewals are seen. An attempt already made at or after that
      expiry (it lost a race, or the read found a renewal the watch had not delivered) waits one period.
    """
    tick = -math.inf if last_attempt is None else last_attempt + timings.retry_period_s
    if leading or observed is None or not observed.holder or observed.holder == identity:
        return tick
    expiry = observed.expires_at
    if last_attempt is not None and expiry <= last_attempt:
        return tick
    return expiry if watching else min(expiry, tick)


class LeaderElector:
    def __init__(self, api, *, namespace: str, name: str, identity: str | None = None,
                 lease_duration_s: float = 15.0, renew_deadline_s: float = 10.0, retry_period_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 on_change: Callable[[bool], None] | None = None, watch: bool = True):
        if not retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("leader election needs retry_period_s < renew_deadline_s < lease_duration_s")
        from kubernetes import client

        self.coord = client.CoordinationV1Api(api)
        self.namespace, self.name = namespace, name
        self.identity = identity or default_identity()
        self.timings = Timings(lease_duration_s, renew_deadline_s, retry_period_s)
        # The Lease holds whole seconds: round up, so that the others never wait less than we mean.
        self.lease_duration_seconds = max(1, math.ceil(lease_duration_s))
        self.clock, self.wall = clock, wall
        self.on_change = on_change
        self.use_watch = watch
        self.watching = False  # a watch on the Lease is delivering events now
        self.observed: Observed | None = None
        self.last_attempt: float | None = None
        self.acquired_at: float | None = None  # wall time our current term began (the acquiring write returned)
        self._renewed_at: float | None = None  # monotonic time our last successful acquire/renew *started*
        # Every Lease call ends within the renew deadline, as client-go bounds it: a call that hangs on a dead
        # connection must not hold the loop past the instant the leader has to stop acting (seen in a chaos run).
        self._timeout = (min(2.0, renew_deadline_s), renew_deadline_s)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._was_leader = False

    @classmethod
    def from_config(cls, api, config: LeaderElectionConfig, *, identity: str | None = None,
                    kubeconfig: str | Path | None = None,
                    on_change: Callable[[bool], None] | None = None) -> LeaderElector:
        return cls(api, namespace=config.namespace or pod_namespace(kubeconfig), name=config.name, identity=identity,
                   lease_duration_s=config.lease_duration_s, renew_deadline_s=config.renew_deadline_s,
                   retry_period_s=config.retry_period_s, on_change=on_change)

    # -- state -------------------------------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        with self._lock:
            return self._renewed_at is not None and self.clock() - self._renewed_at < self.timings.renew_deadline_s

    def valid_for(self) -> float:
        """Seconds this replica still leads by its own clock should no renewal succeed from now on (0: not leader)."""
        with self._lock:
            if self._renewed_at is None:
                return 0.0
            return max(0.0, self._renewed_at + self.timings.renew_deadline_s - self.clock())

    @property
    def write_timeout(self) -> float:
        """The request timeout of a leader's writes: half of what is left of the renew deadline just before a
        renewal (renew_deadline - retry_period), so that a healthy leader always has room for one more write."""
        return write_timeout(self.timings.renew_deadline_s, self.timings.retry_period_s)

    def may_write(self, timeout: float | None = None) -> bool:
        """A write bounded by `timeout` seconds (default `write_timeout`) may start now: it ends, landed or timed out,
        while this replica still leads, before any other can take over (renew_deadline < lease_duration)."""
        return self.valid_for() >= (self.write_timeout if timeout is None else timeout) > 0

    def _set(self, renewed_at: float | None) -> None:
        with self._lock:
            self._renewed_at = renewed_at
        leader = self.is_leader()
        if leader != self._was_leader:
            self._was_leader = leader
            self.acquired_at = self.wall() if leader else None
            log.info("leader election: %s %s lease %s/%s", self.identity,
                     "acquired" if leader else "lost", self.namespace, self.name)
            if self.on_change:
                self.on_change(leader)

    def on_lease(self, lease, now: float | None = None) -> None:
        """Take in the Lease as read or as a watch event delivered it (None: deleted), at `now` (default: the clock
        now, which is after the record was written)."""
        now = self.clock() if now is None else now
        with self._lock:
            if lease is None:
                self.observed = None
            else:
                spec = lease.spec
                renew = spec.renew_time.isoformat() if spec.renew_time else None
                self.observed = observe(self.observed, spec.holder_identity, renew, lease.metadata.resource_version,
                                        float(spec.lease_duration_seconds or self.timings.lease_duration_s), now)
        self._wake.set()

    def _next(self) -> float:
        with self._lock:
            renewed_at, observed = self._renewed_at, self.observed
        leading = renewed_at is not None
        due = next_attempt(leading=leading, observed=observed, identity=self.identity, last_attempt=self.last_attempt,
                           watching=self.watching, timings=self.timings)
        # Leading (renewed_at set): should renewals keep failing, try once more at the deadline (and announce the loss
        # then).
        if renewed_at is not None:
            deadline = renewed_at + self.timings.renew_deadline_s
            if self.last_attempt is None or deadline > self.last_attempt:
                due = min(due, deadline)
        return due

    # -- one attempt -------------------------------------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        """One attempt; True if we hold the lease afterwards."""
        from kubernetes.client.rest import ApiException

        started, now_w = self.clock(), self.wall()
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._timeout)
        except ApiException as err:
            if err.status != 404:
                raise
            self.on_lease(None)
            body = {"metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_duration_seconds,
                             "acquireTime": _micro(now_w), "renewTime": _micro(now_w), "leaseTransitions": 0}}
            try:
                created = self.coord.create_namespaced_lease(self.namespace, body, _request_timeout=self._timeout)
            except ApiException as err2:
                if err2.status == 409:
                    return False
                raise
            self._acquired(started, created)
            return True
        self.on_lease(lease)
        spec = lease.spec
        holder = spec.holder_identity
        mine = holder == self.identity
        with self._lock:
            expired = self.observed is not None and self.clock() >= self.observed.expires_at
        if holder and not mine and not expired:
            self._set(None)
            return False
        spec_body = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_duration_seconds,
                     "renewTime": _micro(now_w),
                     "acquireTime": _micro(now_w) if not mine else (spec.acquire_time.isoformat()
                                                                    if spec.acquire_time else _micro(now_w)),
                     "leaseTransitions": (spec.lease_transitions or 0) + (0 if mine else 1)}
        body = {"metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": lease.metadata.resource_version}, "spec": spec_body}
        try:
            written = self.coord.replace_namespaced_lease(self.name, self.namespace, body,
                                                           _request_timeout=self._timeout)
        except ApiException as err:
            if err.status == 409:  # someone else wrote it first
                return False
            raise
        self._acquired(started, written)
        return True

    def _acquired(self, started: float, lease) -> None:
        if lease is not None and getattr(lease, "spec", None) is not None:
            self.on_lease(lease)
        self._set(started)

    def release(self) -> None:
        """Give the lease up on a clean shutdown, so that the next leader need not wait for it to expire."""
        if not self.is_leader():
            return
        from kubernetes.client.rest import ApiException

        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._timeout)
            if lease.spec.holder_identity == self.identity:
                body = {"metadata": {"name": self.name, "namespace": self.namespace,
                                     "resourceVersion": lease.metadata.resource_version},
                        "spec": {"holderIdentity": None, "leaseDurationSeconds": 1,
                                 "leaseTransitions": lease.spec.lease_transitions or 0}}
                self.coord.replace_namespaced_lease(self.name, self.namespace, body,
                                                           _request_timeout=self._timeout)
        except ApiException as err:
            log.warning("releasing lease %s/%s: %s", self.namespace, self.name, err.reason)
        self._set(None)

    def acquire_once(self, sleep: Callable[[float], None] = time.sleep) -> bool:
        """For a one-shot run: take the lease if it is free, or once it has expired by our observation (a holder that
        is alive renews meanwhile, and then we give up). Takes at most one lease duration."""
        if self.try_acquire_or_renew():
            return True
        with self._lock:
            observed = self.observed
        if observed is None or not observed.holder:
            return False  # lost a race for a free lease: someone else is starting
        sleep(max(0.0, observed.expires_at - self.clock()))
        return self.try_acquire_or_renew()

    # -- the loop ----------------------------------------------------------------------------------------------------
    def step(self) -> float:
        """Attempt if one is due; return the monotonic time the next one is due."""
        if self.clock() >= self._next():
            self.last_attempt = self.clock()
            try:
                self.try_acquire_or_renew()
            except Exception as err:  # apiserver trouble: we stay leader only until renew_deadline runs out
                log.warning("leader election: %s", err)
            self._set(self._renewed_at)  # announce a loss by deadline
        return self._next()

    def run(self, stop: threading.Event) -> None:
        """Acquire and renew until `stop`, watching the Lease meanwhile; then release."""
        def wake_on_stop() -> None:
            stop.wait()
            self._wake.set()

        threading.Thread(target=wake_on_stop, name="leader-election-stop", daemon=True).start()
        if self.use_watch:
            threading.Thread(target=self._watch, args=(stop,), name="leader-election-watch", daemon=True).start()
        while not stop.is_set():
            self._wake.clear()  # before computing when to wake: an event that arrives meanwhile is not lost
            due = self.step()
            delay = due - self.clock()
            if delay > 0:
                self._wake.wait(delay)
        self.release()

    def _watch(self, stop: threading.Event) -> None:
        """Feed every change of the Lease to `on_lease` as it happens. Forbidden (no list/watch on leases): say so
        once and leave the candidate polling."""
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        while not stop.is_set():
            try:
                # A fresh watch each time (no resourceVersion) starts with the Lease as it is; `observe` keeps the
                # time a record was first seen, so seeing it again costs nothing.
                for event in watch.Watch().stream(self.coord.list_namespaced_lease, self.namespace,
                                                  field_selector=f"metadata.name={self.name}", timeout_seconds=60,
                                                  _request_timeout=(5, 90)):
                    now = self.clock()
                    self.watching = True
                    self.on_lease(None if event["type"] == "DELETED" else event["object"], now)
                    if stop.is_set():
                        return
                continue  # the server ended the watch after timeout_seconds: watch again at once
            except ApiException as err:
                if err.status in (401, 403):
                    log.warning("leader election: cannot watch lease %s/%s (%s): polling every %.1fs instead; grant "
                                "list and watch on it for a takeover within the lease duration", self.namespace,
                                self.name, err.reason, self.timings.retry_period_s)
                    self.watching = False
                    return
                log.info("leader election: lease watch ended: %s", err.reason)
            except Exception as err:  # connection trouble: poll meanwhile, then watch again
                log.info("leader election: lease watch ended: %s", err)
            self.watching = False
            self._wake.set()
            stop.wait(self.timings.retry_period_s)

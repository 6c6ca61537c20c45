"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

A candidate takes the Lease when it is free or expired, and the leader renews it every `retry_period`. Expiry is
judged by the candidate's own clock from when it last *saw the Lease change* (client-go's observedTime), never by
comparing another machine's renewTime with ours, so clock skew between replicas does not matter. All writes are
conditional on the Lease's resourceVersion: of two candidates racing for it, one write fails with 409.

A leader that could not renew for `renew_deadline` stops calling itself leader, before the lease runs out for the
others (`renew_deadline < lease_duration`): `is_leader()` is what every write of the controller checks first.

    elector = LeaderElector(api, namespace="kube-system", name="gpuaas-nodescaler", identity=pod_name)
    threading.Thread(target=elector.run, args=(stop,), daemon=True).start()
    if elector.is_leader(): ...
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("gpuaas.leader")


def default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _micro(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Observed:
    holder: str | None
    resource_version: str | None
    transitions: int
    duration_s: float
    seen_at: float  # our monotonic clock when this record (holder, renewTime) last changed
    renew_time: str | None


class LeaderElector:
    def __init__(self, api, *, namespace: str, name: str, identity: str | None = None,
                 lease_duration_s: float = 15.0, renew_deadline_s: float = 10.0, retry_period_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 on_change: Callable[[bool], None] | None = None):
        if not retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("leader election needs retry_period_s < renew_deadline_s < lease_duration_s")
        from kubernetes import client

        self.coord = client.CoordinationV1Api(api)
        self.namespace, self.name = namespace, name
        self.identity = identity or default_identity()
        self.lease_duration_s, self.renew_deadline_s, self.retry_period_s = \
            lease_duration_s, renew_deadline_s, retry_period_s
        self.clock, self.wall = clock, wall
        self.on_change = on_change
        self.observed: Observed | None = None
        self._renewed_at: float | None = None  # monotonic time of our last successful acquire/renew
        self._lock = threading.Lock()
        self._was_leader = False

    # -- state -------------------------------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        with self._lock:
            return self._renewed_at is not None and self.clock() - self._renewed_at < self.renew_deadline_s

    def _set(self, renewed_at: float | None) -> None:
        with self._lock:
            self._renewed_at = renewed_at
        leader = self.is_leader()
        if leader != self._was_leader:
            self._was_leader = leader
            log.info("leader election: %s %s lease %s/%s", self.identity,
                     "acquired" if leader else "lost", self.namespace, self.name)
            if self.on_change:
                self.on_change(leader)

    # -- one attempt -------------------------------------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        """One attempt; True if we hold the lease afterwards."""
        from kubernetes.client.rest import ApiException

        now_m, now_w = self.clock(), self.wall()
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            body = {"metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration_s),
                             "acquireTime": _micro(now_w), "renewTime": _micro(now_w), "leaseTransitions": 0}}
            try:
                self.coord.create_namespaced_lease(self.namespace, body)
            except ApiException as err2:
                if err2.status == 409:
                    return False
                raise
            self._set(now_m)
            return True
        spec = lease.spec
        renew = spec.renew_time.isoformat() if spec.renew_time else None
        rec = (spec.holder_identity, renew)
        if self.observed is None or (self.observed.holder, self.observed.renew_time) != rec:
            self.observed = Observed(spec.holder_identity, lease.metadata.resource_version,
                                     spec.lease_transitions or 0, float(spec.lease_duration_seconds or
                                                                        self.lease_duration_s), now_m, renew)
        else:
            self.observed.resource_version = lease.metadata.resource_version
        holder = spec.holder_identity
        mine = holder == self.identity
        expired = now_m - self.observed.seen_at > self.observed.duration_s
        if holder and not mine and not expired:
            self._set(None)
            return False
        spec_body = {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration_s),
                     "renewTime": _micro(now_w),
                     "acquireTime": _micro(now_w) if not mine else (spec.acquire_time.isoformat()
                                                                    if spec.acquire_time else _micro(now_w)),
                     "leaseTransitions": (spec.lease_transitions or 0) + (0 if mine else 1)}
        body = {"metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": lease.metadata.resource_version}, "spec": spec_body}
        try:
            self.coord.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as err:
            if err.status == 409:  # someone else wrote it first
                return False
            raise
        self._set(now_m)
        return True

    def release(self) -> None:
        """Give the lease up on a clean shutdown, so that the next leader need not wait for it to expire."""
        if not self.is_leader():
            return
        from kubernetes.client.rest import ApiException

        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity == self.identity:
                body = {"metadata": {"name": self.name, "namespace": self.namespace,
                                     "resourceVersion": lease.metadata.resource_version},
                        "spec": {"holderIdentity": None, "leaseDurationSeconds": 1,
                                 "leaseTransitions": lease.spec.lease_transitions or 0}}
                self.coord.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as err:
            log.warning("releasing lease %s/%s: %s", self.namespace, self.name, err.reason)
        self._set(None)

    def run(self, stop: threading.Event) -> None:
        """Try every retry_period until `stop`; then release."""
        while not stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception as err:  # apiserver trouble: we stay leader only until renew_deadline runs out
                log.warning("leader election: %s", err)
            self._set(self._renewed_at)  # announce a loss by deadline
            stop.wait(self.retry_period_s)
        self.release()

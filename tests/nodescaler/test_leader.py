"""gpuaas.leader against an in-memory Lease store with the apiserver's optimistic concurrency, on fake clocks."""
from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException

from gpuaas.leader import LeaderElector


class FakeCoordination:
    def __init__(self):
        self.lease = None
        self.rv = 0
        self.writes = 0

    def _obj(self):
        spec = self.lease["spec"]
        parse = lambda v: dt.datetime.fromisoformat(v.replace("Z", "+00:00")) if v else None  # noqa: E731
        return SimpleNamespace(metadata=SimpleNamespace(resource_version=str(self.rv)), spec=SimpleNamespace(
            holder_identity=spec.get("holderIdentity"), renew_time=parse(spec.get("renewTime")),
            acquire_time=parse(spec.get("acquireTime")), lease_transitions=spec.get("leaseTransitions"),
            lease_duration_seconds=spec.get("leaseDurationSeconds")))

    def read_namespaced_lease(self, name, namespace):
        if self.lease is None:
            raise ApiException(status=404)
        return self._obj()

    def create_namespaced_lease(self, namespace, body):
        if self.lease is not None:
            raise ApiException(status=409)
        self.lease, self.rv = body, self.rv + 1
        self.writes += 1

    def replace_namespaced_lease(self, name, namespace, body):
        if body["metadata"]["resourceVersion"] != str(self.rv):
            raise ApiException(status=409)
        self.lease, self.rv = body, self.rv + 1
        self.writes += 1


def elector(store, identity, clock):
    e = LeaderElector(None, namespace="ns", name="l", identity=identity, lease_duration_s=15, renew_deadline_s=10,
                      retry_period_s=2, clock=lambda: clock["t"], wall=lambda: 1_800_000_000 + clock["t"])
    e.coord = store
    return e


def test_only_one_of_two_candidates_leads_and_the_other_takes_over_after_the_lease_expires():
    store, clock = FakeCoordination(), {"t": 0.0}
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    assert a.is_leader() and not b.is_leader()
    # a keeps renewing: b never gets it
    for t in range(2, 40, 2):
        clock["t"] = float(t)
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    # a dies at t=38 (last renewal). b saw the record change at t=38; it may take over once 15 s have passed.
    clock["t"] = 52.0
    assert b.try_acquire_or_renew() is False
    clock["t"] = 53.5
    assert b.try_acquire_or_renew() is True and b.is_leader()
    assert store.lease["spec"]["holderIdentity"] == "b" and store.lease["spec"]["leaseTransitions"] == 1


def test_a_leader_that_cannot_renew_stops_leading_before_the_lease_runs_out_for_others():
    store, clock = FakeCoordination(), {"t": 0.0}
    a = elector(store, "a", clock)
    assert a.try_acquire_or_renew()
    clock["t"] = 9.9
    assert a.is_leader()
    clock["t"] = 10.1  # renew_deadline 10 s without a successful renewal
    assert not a.is_leader()


def test_racing_writers_one_wins_by_resource_version():
    store, clock = FakeCoordination(), {"t": 0.0}
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b sees a's record at t=0
    clock["t"] = 100.0  # unchanged for 100 s: expired in b's eyes, so b writes
    store_rv = store.rv
    real_replace = store.replace_namespaced_lease

    def racing_replace(name, namespace, body):  # a renews between b's read and b's write
        store.rv += 1
        return real_replace(name, namespace, body)

    store.replace_namespaced_lease = racing_replace
    assert b.try_acquire_or_renew() is False
    assert store.rv == store_rv + 1 and store.lease["spec"]["holderIdentity"] == "a"


def test_release_lets_the_next_candidate_in_at_once():
    store, clock = FakeCoordination(), {"t": 0.0}
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader()
    clock["t"] = 1.0
    assert b.try_acquire_or_renew() is True


def test_timing_parameters_must_be_ordered():
    with pytest.raises(ValueError, match="retry_period_s < renew_deadline_s < lease_duration_s"):
        LeaderElector(None, namespace="n", name="l", lease_duration_s=5, renew_deadline_s=6, retry_period_s=1)

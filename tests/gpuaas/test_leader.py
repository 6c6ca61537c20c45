"""runtime.leader against an in-memory Lease store with the apiserver's optimistic concurrency, on fake clocks: the
election's invariants, the schedule of attempts (`next_attempt`), and simulated kills and partitions that measure
the takeover time and check that two replicas never lead at once."""
from __future__ import annotations

import datetime as dt
import random
from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException

from runtime.leader import LeaderElectionConfig, LeaderElector, Observed, Timings, next_attempt, observe


class FakeCoordination:
    """One Lease with resourceVersion preconditions; `on_write(lease)` is called with every stored version."""

    def __init__(self):
        self.lease = None
        self.rv = 0
        self.writes = 0
        self.on_write = lambda lease: None

    def _obj(self):
        spec = self.lease["spec"]
        parse = lambda v: dt.datetime.fromisoformat(v.replace("Z", "+00:00")) if v else None  # noqa: E731
        return SimpleNamespace(metadata=SimpleNamespace(resource_version=str(self.rv)), spec=SimpleNamespace(
            holder_identity=spec.get("holderIdentity"), renew_time=parse(spec.get("renewTime")),
            acquire_time=parse(spec.get("acquireTime")), lease_transitions=spec.get("leaseTransitions"),
            lease_duration_seconds=spec.get("leaseDurationSeconds")))

    def _store(self, body):
        self.lease, self.rv = body, self.rv + 1
        self.writes += 1
        obj = self._obj()
        self.on_write(obj)
        return obj

    def read_namespaced_lease(self, name, namespace, _request_timeout=None):
        if self.lease is None:
            raise ApiException(status=404)
        return self._obj()

    def create_namespaced_lease(self, namespace, body, _request_timeout=None):
        if self.lease is not None:
            raise ApiException(status=409)
        return self._store(body)

    def replace_namespaced_lease(self, name, namespace, body, _request_timeout=None):
        if body["metadata"]["resourceVersion"] != str(self.rv):
            raise ApiException(status=409)
        return self._store(body)


class Unreachable:
    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise ConnectionRefusedError("apiserver unreachable")
        return fail


def elector(store, identity, clock, *, duration=15, deadline=10, retry=2, mono_offset=0.0, wall_offset=0.0):
    e = LeaderElector(None, namespace="ns", name="l", identity=identity, lease_duration_s=duration,
                      renew_deadline_s=deadline, retry_period_s=retry, clock=lambda: clock["t"] + mono_offset,
                      wall=lambda: 1_800_000_000 + clock["t"] + wall_offset, watch=False)
    e.coord = store
    return e


# ---- the election's invariants --------------------------------------------------------------------------------------
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
    clock["t"] = 52.9
    assert b.try_acquire_or_renew() is False
    clock["t"] = 53.0
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


def test_a_write_may_start_only_while_the_lease_holds_for_its_whole_request_timeout():
    # Issue 13, defect 2: a write issued just before the renew deadline could land after a successor took over. The
    # timeout of a leader's writes is half of what is left of the deadline just before a renewal: (10 - 2) / 2 = 4 s.
    store, clock = FakeCoordination(), {"t": 0.0}
    a = elector(store, "a", clock)
    assert a.write_timeout == 4.0 and not a.may_write()  # not leading yet
    assert a.try_acquire_or_renew()  # renewal started at t=0: leads until t=10 without another
    clock["t"] = 5.9
    assert a.valid_for() == pytest.approx(4.1) and a.may_write()
    clock["t"] = 6.1  # still leader, but a 4 s write started now could end at 10.1, past the deadline
    assert a.is_leader() and not a.may_write() and a.may_write(3.0)
    clock["t"] = 8.0
    assert a.try_acquire_or_renew() and a.may_write()  # renewed: 10 s again
    # A healthy leader renews every retry period: just before the next renewal 10 - 2 = 8 s remain, twice the timeout.
    clock["t"] = 8.0 + 2.0
    assert a.valid_for() == pytest.approx(8.0) and a.may_write()
    a.release()
    assert not a.may_write() and a.valid_for() == 0.0


def test_racing_writers_one_wins_by_resource_version():
    store, clock = FakeCoordination(), {"t": 0.0}
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b sees a's record at t=0
    clock["t"] = 100.0  # unchanged for 100 s: expired in b's eyes, so b writes
    store_rv = store.rv
    real_replace = store.replace_namespaced_lease

    def racing_replace(name, namespace, body, _request_timeout=None):  # a renews between b's read and b's write
        store.rv += 1
        return real_replace(name, namespace, body)

    store.replace_namespaced_lease = racing_replace
    assert b.try_acquire_or_renew() is False
    assert store.rv == store_rv + 1 and store.lease["spec"]["holderIdentity"] == "a"


def test_every_lease_call_is_bounded_by_the_renew_deadline():
    # A call hanging on a dead connection must not hold the loop past the instant the leader has to stop acting.
    store, clock = FakeCoordination(), {"t": 0.0}
    timeouts = []
    for verb in ("read_namespaced_lease", "create_namespaced_lease", "replace_namespaced_lease"):
        real = getattr(store, verb)
        setattr(store, verb, lambda *a, _real=real, _request_timeout=None: (timeouts.append(_request_timeout),
                                                                            _real(*a))[1])
    a = elector(store, "a", clock, deadline=3, duration=4, retry=0.5)
    a.try_acquire_or_renew()  # read (404), create
    clock["t"] = 0.5
    a.try_acquire_or_renew()  # read, replace
    a.release()  # read, replace
    assert len(timeouts) == 6 and all(t is not None and max(t) <= 3 for t in timeouts)


def test_release_lets_the_next_candidate_in_at_once():
    store, clock = FakeCoordination(), {"t": 0.0}
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader()
    clock["t"] = 1.0
    assert b.try_acquire_or_renew() is True


def test_a_one_shot_run_takes_a_dead_holders_lease_after_one_lease_duration_and_not_a_live_ones():
    store, clock = FakeCoordination(), {"t": 0.0}
    a, once = elector(store, "a", clock), elector(store, "once", clock)
    a.try_acquire_or_renew()  # a holds it, then dies

    def wait(seconds):
        clock["t"] += seconds
    assert once.acquire_once(sleep=wait) and clock["t"] == 15.0
    alive, late = elector(store, "alive", clock), elector(store, "late", clock)
    store.lease = None
    alive.try_acquire_or_renew()

    def wait_while_alive_renews(seconds):
        clock["t"] += seconds
        alive.try_acquire_or_renew()
    assert not late.acquire_once(sleep=wait_while_alive_renews)
    assert store.lease["spec"]["holderIdentity"] == "alive"


def test_timing_parameters_must_be_ordered():
    with pytest.raises(ValueError, match="retry_period_s < renew_deadline_s < lease_duration_s"):
        LeaderElector(None, namespace="n", name="l", lease_duration_s=5, renew_deadline_s=6, retry_period_s=1)
    with pytest.raises(ValueError, match="retry_period_s < renew_deadline_s < lease_duration_s"):
        LeaderElectionConfig(name="x", lease_duration_s=5, renew_deadline_s=5)


def test_a_fractional_lease_duration_is_written_rounded_up():
    store, clock = FakeCoordination(), {"t": 0.0}
    a = elector(store, "a", clock, duration=4.5, deadline=3, retry=0.5)
    a.try_acquire_or_renew()
    assert store.lease["spec"]["leaseDurationSeconds"] == 5


# ---- the schedule ---------------------------------------------------------------------------------------------------
T = Timings(lease_duration_s=4, renew_deadline_s=3, retry_period_s=0.5)


def held_by(holder, seen_at):
    return Observed(holder, "2026-01-01T00:00:00.000000Z", "7", 4.0, seen_at)


def test_observing_the_same_renewal_again_does_not_move_its_time():
    first = observe(None, "a", "r1", "1", 4.0, now=10.0)
    again = observe(first, "a", "r1", "2", 4.0, now=11.5)
    assert again.seen_at == 10.0 and again.resource_version == "2"
    renewed = observe(again, "a", "r2", "3", 4.0, now=12.0)
    assert renewed.seen_at == 12.0 and renewed.expires_at == 16.0


def test_a_watching_candidate_wakes_exactly_at_the_expiry_it_observed():
    # not at a retry tick (10.0, 10.5, ...): at 13.37 = seen 9.37 + 4
    due = next_attempt(leading=False, observed=held_by("a", 9.37), identity="b", last_attempt=9.5, watching=True,
                       timings=T)
    assert due == pytest.approx(13.37)


def test_a_polling_candidate_also_wakes_at_each_tick_and_at_the_expiry_between_ticks():
    assert next_attempt(leading=False, observed=held_by("a", 9.37), identity="b", last_attempt=9.5, watching=False,
                        timings=T) == 10.0
    assert next_attempt(leading=False, observed=held_by("a", 9.37), identity="b", last_attempt=13.2, watching=False,
                        timings=T) == pytest.approx(13.37)


def test_an_attempt_already_made_for_this_expiry_waits_one_period():
    # it lost the race at 13.4 (or read a renewal the watch had not delivered yet): no busy loop on a past expiry
    assert next_attempt(leading=False, observed=held_by("a", 9.37), identity="b", last_attempt=13.4, watching=True,
                        timings=T) == pytest.approx(13.9)


def test_the_leader_and_a_candidate_of_a_free_lease_go_by_ticks():
    assert next_attempt(leading=True, observed=held_by("a", 9.0), identity="a", last_attempt=9.0, watching=True,
                        timings=T) == 9.5
    assert next_attempt(leading=False, observed=None, identity="b", last_attempt=None, watching=True,
                        timings=T) == float("-inf")
    assert next_attempt(leading=False, observed=held_by(None, 9.0), identity="b", last_attempt=9.2, watching=True,
                        timings=T) == pytest.approx(9.7)


# ---- simulated kills and partitions ----------------------------------------------------------------------------------
class Sim:
    """Real time `t` advances in 1 ms steps; each elector steps whenever its own schedule says an attempt is due (its
    run loop, minus the threads); a watching elector gets every stored Lease `lag` seconds after the write."""

    def __init__(self, *, lag=0.005, watching=True, b_mono_offset=0.0, a_wall_offset=0.0, duration=4, deadline=3,
                 retry=0.5):
        self.clock = {"t": 0.0}
        self.store = FakeCoordination()
        self.a = elector(self.store, "a", self.clock, duration=duration, deadline=deadline, retry=retry,
                         wall_offset=a_wall_offset)
        self.b = elector(self.store, "b", self.clock, duration=duration, deadline=deadline, retry=retry,
                         mono_offset=b_mono_offset)
        self.alive = [self.a, self.b]
        self.inbox: list[tuple[float, object]] = []
        self.both_led_at: list[float] = []
        self.b_led_at: float | None = None
        self.b.watching = watching
        self.store.on_write = lambda lease: self.inbox.append((self.clock["t"] + lag, lease))

    def run(self, until: float, events=()):
        events = sorted(events)
        while self.clock["t"] < until:
            t = self.clock["t"]
            while events and events[0][0] <= t:
                events.pop(0)[1]()
            for at, lease in [m for m in self.inbox if m[0] <= t]:
                self.inbox.remove((at, lease))
                if self.b in self.alive and self.b.watching:
                    self.b.on_lease(lease)
            for e in self.alive:
                if e.clock() >= e._next():
                    e.step()
            if self.a.is_leader() and self.b.is_leader():
                self.both_led_at.append(t)
            if self.b_led_at is None and self.b.is_leader():
                self.b_led_at = t
            self.clock["t"] = round(t + 0.001, 6)


def kill_a_at(sim: Sim, at: float):
    def kill():
        sim.alive.remove(sim.a)
        sim.killed_at = sim.clock["t"]
    return at, kill


@pytest.mark.parametrize("seed", range(12))
def test_with_a_watch_the_standby_takes_over_within_the_lease_duration_after_a_kill(seed):
    kill_at = 6.0 + random.Random(seed).uniform(0, 0.5)  # anywhere within a's renew period
    sim = Sim(lag=0.005)
    sim.run(until=kill_at + 6, events=[kill_a_at(sim, kill_at)])
    takeover = sim.b_led_at - sim.killed_at
    # b acts at its observation of a's last renewal (the write + 5 ms of watch delivery) + the lease's 4 s;
    # a renewed within the 0.5 s before the kill
    assert 4 - 0.5 - 0.002 <= takeover <= 4 + 0.005 + 0.002, takeover
    assert sim.both_led_at == []


def test_clock_skew_between_replicas_changes_nothing():
    kill_at = 6.2
    plain = Sim()
    plain.run(until=12, events=[kill_a_at(plain, kill_at)])
    skewed = Sim(b_mono_offset=-987_654.321, a_wall_offset=3600.0)  # b's clock elsewhere, a's wall clock 1 h ahead
    skewed.run(until=12, events=[kill_a_at(skewed, kill_at)])
    assert skewed.b_led_at == pytest.approx(plain.b_led_at, abs=0.0011)


def test_without_a_watch_takeover_is_within_the_lease_plus_one_retry_period():
    for seed in range(6):
        kill_at = 6.0 + random.Random(seed).uniform(0, 0.5)
        sim = Sim(watching=False)
        sim.run(until=kill_at + 6, events=[kill_a_at(sim, kill_at)])
        takeover = sim.b_led_at - sim.killed_at
        assert 4 - 0.5 - 0.002 <= takeover <= 4 + 0.5 + 0.002, takeover
        assert sim.both_led_at == []


def test_a_partitioned_leader_stops_leading_before_the_standby_starts():
    sim = Sim()

    def partition():
        sim.a.coord = Unreachable()
        sim.partitioned_at = sim.clock["t"]

    sim.run(until=14, events=[(6.25, partition)])
    assert sim.b.is_leader() and not sim.a.is_leader()
    assert sim.both_led_at == []
    # a's last renewal was at 6.0: it stopped leading at 6.0 + renew deadline 3 s, b started at 6.0 + 4 s (+ lag)
    assert sim.b_led_at == pytest.approx(10.0 + 0.005, abs=0.0021)

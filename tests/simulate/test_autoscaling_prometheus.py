"""The simulator's Prometheus (rate() as Prometheus extrapolates it, no rate from one sample), its phases, and the GPU
limit and start delay a cluster puts on new replicas; each expected number worked out by hand."""
from __future__ import annotations

import pytest

from autoscaler.policy import QueueDepthConfig, QueueDepthPolicy, StaticPolicy
from gpuaas.loadgen.serving import ServiceModel
from gpuaas.loadgen.trace import Arrival
from gpuaas.simulate.autoscaling import GpuLimit, RateWindows, ScrapeLog, prometheus_rate, simulate

ONE_S = (5000, 0)  # 1 s of service


def arrivals(times):
    return [Arrival(t, *ONE_S) for t in times]


def test_rate_of_samples_covering_the_window_is_their_slope():
    # window (-7.5, 52.5]: samples at 0, 15, 30, 45 of 100 .. 190; 7.5 s to either end (< 1.1 x 15): extrapolated
    # over 45 + 7.5 + 7.5 = 60 s: 90 x 60 / 45 / 60 = 2.0, the slope (190 - 100) / 45
    assert prometheus_rate([0, 15, 30, 45], [100, 130, 160, 190], now=52.5, width=60) == pytest.approx(2.0)


def test_rate_of_a_young_counter_is_not_stretched_before_its_zero():
    # the gateway's counter at the start of a run: 0 at 0 s, 162 at 15 s; window (-37.5, 22.5]. Towards the start
    # it stops at the counter's zero (15 x 0 / 162 = 0 s), towards the end 7.5 s: 162 x 22.5 / 15 / 60 = 4.05/s, not
    # the 162 / 15 = 10.8/s of the two samples' slope
    assert prometheus_rate([0, 15], [0, 162], now=22.5, width=60) == pytest.approx(4.05)


def test_rate_extrapolates_half_an_interval_towards_a_far_end():
    # samples at 30 and 45 (10 and 40) in the window (-10, 50]: 40 s to the start (> 16.5), so half an interval
    # (7.5; the zero is 15 x 10 / 30 = 5 s away, nearer: 5); 5 s to the end: 30 x (15 + 5 + 5) / 15 / 60 = 0.8333
    assert prometheus_rate([30, 45], [10, 40], now=50, width=60) == pytest.approx(30 * 25 / 15 / 60)


def test_rate_counts_a_counter_reset_and_needs_two_samples():
    # 10, 20, then 5 (reset): increase 20 - 10 + 5 = 15 over the whole window [0, 30]: 15 / 30
    assert prometheus_rate([0, 15, 30], [10, 20, 5], now=30, width=30) == pytest.approx(0.5)
    assert prometheus_rate([15], [10], now=30, width=30) is None
    assert prometheus_rate([], [], now=30, width=30) is None


def test_one_scrape_gives_no_arrival_rate_so_ours_holds_the_warm_fleet():
    # nothing arrives before 100 s; the first sync (7.5 s) has one scrape: Prometheus has no rate, the controller
    # holds its 3 replicas (it used to read 0/s and drop to the floor of 1); the second (22.5 s) has two, 0/s
    policy = QueueDepthPolicy(QueueDepthConfig(min_replicas=1, max_replicas=8))
    r = simulate(arrivals([100.0 + i for i in range(10)]), policy, initial_replicas=3)
    assert r.timeline[0][:2] == (7.5, 3)
    assert r.timeline[1][:2] == (22.5, 1)


def test_phases_move_the_first_scrape_and_sync():
    policy = QueueDepthPolicy(QueueDepthConfig(min_replicas=1, max_replicas=8))
    r = simulate(arrivals([100.0 + i for i in range(10)]), policy, initial_replicas=3, scrape_offset_s=4.0,
                 sync_offset_s=1.0)
    # scrapes at 4, 19, ...; syncs at 5 (one scrape: hold), 20 (two: 0/s, down to 1)
    assert [t for t, *_ in r.timeline[:2]] == [5.0, 20.0]
    assert [live for _, live, *_ in r.timeline[:2]] == [3, 1]
    with pytest.raises(ValueError, match="phases must be >= 0"):
        simulate(arrivals([1.0]), policy, scrape_offset_s=-1)


def test_rate_windows_are_the_controllers():
    # the gateway counter doubles its pace at 60 s: 1/s before, 2/s after (0, 15, .., 60, 90, 120); scrapes every
    # 15 s. At 97.5 s a 30 s window holds the scrapes at 75 and 90: (120 - 90) / 15 = 2/s; a 60 s one those at
    # 45 .. 90: (120 - 45) / 45 = 1.667/s
    log = ScrapeLog(windows=RateWindows(short_rate=60.0))
    for t in range(0, 91, 15):
        log.scrape(float(t), {}, 0, t if t <= 60 else 60 + 2 * (t - 60))
    sig = log.signals(97.5)
    assert sig.arrival_rate_short == pytest.approx(75 / 45) and sig.arrival_rate == pytest.approx(75 / 45)
    assert ScrapeLog().signals(97.5) is None  # nothing scraped
    default = ScrapeLog()
    for t in range(0, 91, 15):
        default.scrape(float(t), {}, 0, t if t <= 60 else 60 + 2 * (t - 60))
    assert default.signals(97.5).arrival_rate_short == pytest.approx(2.0)
    with pytest.raises(ValueError, match="rate window short_rate must be > 0"):
        RateWindows(short_rate=0)


def test_replicas_beyond_the_gpu_limit_wait_pending_then_start_their_cold_start():
    # static 4 from 1 warm replica: asked for at the first sync (7.5 s). GPUs: 2 until 100 s, then 4. One more binds
    # at 7.5 s and serves at 67.5 s (60 s cold start); the other two wait Pending until 100 s and serve at 160 s
    trace = arrivals([i * 1.0 for i in range(300)])
    r = simulate(trace, StaticPolicy(4), ServiceModel(), initial_replicas=1, gpus=GpuLimit(((0.0, 2), (100.0, 4))))
    serving = {t: n for t, _, n, _ in r.timeline}
    live = {t: n for t, n, _, _ in r.timeline}
    assert live[7.5] == 4  # Pending replicas count in the Deployment's replicas
    assert serving[52.5] == 1 and serving[82.5] == 2 and serving[142.5] == 2 and serving[172.5] == 4
    # GPU time from binding: 1 x 299 s + 1 x (299 - 7.5) + 2 x (299 - 100) over the span (last arrival 299 s)
    assert r.gpu_replica_hours == pytest.approx((299 + 291.5 + 2 * 199) / 3600)


def test_start_delay_lengthens_every_new_replicas_cold_start():
    trace = arrivals([i * 1.0 for i in range(300)])
    r = simulate(trace, StaticPolicy(2), ServiceModel(), initial_replicas=1, start_delay_s=20.0)
    serving = {t: n for t, _, n, _ in r.timeline}
    assert serving[82.5] == 1 and serving[97.5] == 2  # asked at 7.5 s, serving at 7.5 + 60 + 20 = 87.5 s


class _Asks:
    """A stand-in policy for these tests: asks for `first` replicas at its first sync and `then` afterwards."""
    name, setting, sync_period_s = "asks", "", 15.0

    def __init__(self, first: int, then: int):
        self.first, self.then = first, then

    def initial_state(self, replicas: int = 0) -> int:
        return 0

    def recommend(self, snap, state):
        from autoscaler.policy import Recommendation

        return Recommendation(self.first if state == 0 else self.then, "Asked", ""), state + 1


def test_a_scale_down_drops_pending_replicas_first():
    # GPUs for 2: 1 warm; asking for 3 at 7.5 s binds one (cold until 67.5 s) and leaves one Pending. Down to 2 at
    # 22.5 s drops the Pending one (a ReplicaSet deletes unscheduled pods first), so the bound one serves at 67.5 s;
    # had the starting one gone instead, the Pending one would bind at 22.5 s and serve only at 82.5 s
    trace = arrivals([i * 1.0 for i in range(120)])
    r = simulate(trace, _Asks(3, 2), ServiceModel(), initial_replicas=1, gpus=GpuLimit(((0.0, 2),)))
    serving = {t: n for t, _, n, _ in r.timeline}
    assert serving[52.5] == 1 and serving[67.5] == 2 and r.max_replicas == 3


def test_replicas_beyond_the_limit_never_serve_and_cost_nothing():
    trace = arrivals([i * 1.0 for i in range(120)])
    r = simulate(trace, StaticPolicy(3), ServiceModel(), initial_replicas=1, gpus=GpuLimit(((0.0, 1),)))
    assert max(n for _, _, n, _ in r.timeline) == 1 and r.max_replicas == 3
    assert r.gpu_replica_hours == pytest.approx(119 / 3600)  # the warm replica's, over the span to 119 s


@pytest.mark.parametrize("steps, words", [
    ((), "at least one"),
    (((0.0, -1),), "GPUs >= 0"),
    (((10.0, 1), (5.0, 2)), "in time order"),
])
def test_gpu_limit_refuses_bad_steps(steps, words):
    with pytest.raises(ValueError, match=words):
        GpuLimit(steps)


def test_gpu_limit_is_a_step_function():
    limit = GpuLimit(((10.0, 2), (20.0, 5)))
    assert [limit.at(t) for t in (0.0, 10.0, 19.9, 20.0, 99.0)] == [2, 2, 2, 5, 5]

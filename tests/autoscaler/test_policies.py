"""Recommenders as pure functions: our queue-depth policy, the KEDA emulation, and what missing data does."""
import math

import pytest

from autoscaler.policy import HpaPolicy, KedaPolicy, QueueDepthConfig, QueueDepthPolicy
from autoscaler.snapshot import Signals, TargetSnapshot

PODS = frozenset({"p0", "p1"})


def snap(now=100.0, replicas=2, pods=PODS, error=None, **signals):
    sig = None if signals.get("none") else Signals(**{k: v for k, v in signals.items() if k != "none"})
    return TargetSnapshot(now=now, replicas=replicas, pods=pods, signals=sig, error=error)


def ours(**cfg):
    return QueueDepthPolicy(QueueDepthConfig(**cfg))


def test_scale_up_is_sized_from_arrival_rate_and_service_time():
    # 20 req/s x 2 s = 40 busy slots; + 1.0 * sqrt(40) = 6.32 -> 46.3 slots; / 8 per replica -> 6 replicas
    d, _ = ours().recommend(snap(arrival_rate=20.0, arrival_rate_short=20.0, service_time=2.0), ours().initial_state())
    assert (d.desired, d.reason) == (6, "ScaleUp")
    assert "arrival 20.00/s" in d.message


def test_queue_adds_capacity_to_drain_it():
    # 240 waiting x 2 s / 60 s drain = 8 slots more: (40 + 6.32 + 8) / 8 = 6.79 -> 7
    d, _ = ours().recommend(snap(arrival_rate=20.0, service_time=2.0, queue_per_pod={"p0": 120.0, "p1": 120.0}),
                            ours().initial_state())
    assert d.desired == 7


def test_rising_rate_looks_one_cold_start_ahead():
    p = ours()
    _, st = p.recommend(snap(now=0, arrival_rate=10.0, service_time=1.0), p.initial_state())
    # rate went 10 -> 12 in 15 s: slope 0.133/s; in 60 s: 12 + 8 = 20 req/s x 1 s = 20 slots + sqrt(20) = 24.5
    # -> ceil(24.5 / 8) = 4 (without the trend: 12 + 3.5 = 15.5 -> 2)
    d, _ = p.recommend(snap(now=15, arrival_rate=12.0, service_time=1.0), st)
    assert d.desired == 4


def test_scale_down_holds_the_highest_recommendation_of_the_window():
    p = ours(scale_down_window_s=60, hold_shape="flat")
    st = p.initial_state()
    d, st = p.recommend(snap(now=0, replicas=2, arrival_rate=20.0, service_time=2.0), st)
    assert d.desired == 6
    d, st = p.recommend(snap(now=30, replicas=6, arrival_rate=1.0, service_time=2.0), st)
    assert (d.desired, d.reason) == (6, "ScaleDownStabilized")
    d, st = p.recommend(snap(now=61, replicas=6, arrival_rate=1.0, service_time=2.0), st)
    # 1 x 2 = 2 slots + sqrt(2) = 3.4 -> 1 replica; the 6 of t=0 has left the 60 s window; the 1 of t=30 remains
    assert (d.desired, d.reason) == (1, "ScaleDown")


@pytest.mark.parametrize("case, s", [
    ("prometheus down", snap(replicas=5, error="cannot reach Prometheus at http://x: connection refused", none=True)),
    ("prometheus slow", snap(replicas=5, error="Prometheus at http://x did not answer within 1s", none=True)),
    ("NaN arrival rate", snap(replicas=5, arrival_rate=math.nan, service_time=1.0)),
    ("empty vector", snap(replicas=5, error="'sum(rate(...))' returned an empty vector", none=True)),
    ("no arrival rate", snap(replicas=5, arrival_rate=None, queue_per_pod={"p0": 0.0})),
])
def test_no_scale_down_on_missing_data(case, s):
    d, _ = ours().recommend(s, ours().initial_state())
    assert d.desired == 5, case
    assert d.reason == "MetricsUnavailable" and d.scale_down_blocked
    assert "no scale-down on missing data" in d.message


def test_missing_data_still_scales_up_on_a_visible_queue():
    s = snap(replicas=1, pods=frozenset({"p0"}), arrival_rate=None, queue_per_pod={"p0": 300.0})
    d, _ = ours().recommend(s, ours().initial_state())
    # 300 waiting x 1 s (default service time) / 60 s = 5 slots + 0 -> 1 replica... plus sqrt(0): ceil(5/8) = 1
    assert d.desired == 1
    s = snap(replicas=1, pods=frozenset({"p0"}), arrival_rate=None, queue_per_pod={"p0": 3000.0})
    d, _ = ours().recommend(s, ours().initial_state())
    assert d.desired == 7 and "scaling up to 7" in d.message  # 3000 / 60 = 50 slots -> ceil(50/8) = 7


def test_linear_hold_lets_old_recommendations_fade():
    p = ours(scale_down_window_s=60, hold_shape="linear", hold_floor=0.5)
    st = p.initial_state()
    d, st = p.recommend(snap(now=0, replicas=2, arrival_rate=40.0, service_time=2.0), st)
    # 80 slots + sqrt(80) = 88.9 -> 12 replicas
    assert d.desired == 12
    # 30 s later the 12 counts 1 - 0.5 * 30/60 = 0.75 of itself: ceil(9) = 9
    d, st = p.recommend(snap(now=30, replicas=12, arrival_rate=1.0, service_time=2.0), st)
    assert (d.desired, d.reason) == (9, "ScaleDown") and "down to 9" in d.message
    # 54 s: 12 x (1 - 0.45) = 6.6 -> 7
    d, st = p.recommend(snap(now=54, replicas=9, arrival_rate=1.0, service_time=2.0), st)
    assert d.desired == 7


def test_default_hold_fades_out_without_a_step():
    p = ours(scale_down_window_s=60)  # default: linear to nothing at the window's end
    d, st = p.recommend(snap(now=0, replicas=2, arrival_rate=40.0, service_time=2.0), p.initial_state())
    assert d.desired == 12
    held = []
    for now in (15, 30, 45, 59):
        d, st = p.recommend(snap(now=now, replicas=d.desired, arrival_rate=0.0, service_time=2.0), st)
        held.append(d.desired)
    assert held == [9, 6, 3, 1]  # 12 x (1 - age / 60), then the floor of 1 replica


def test_warm_start_remembers_the_fleet_it_starts_with():
    p = ours(scale_down_window_s=60)
    d, _ = p.recommend(snap(now=30, replicas=10, arrival_rate=0.0, service_time=1.0), p.initial_state(10))
    assert d.desired == 5  # the warm memory (10 at t = 0) at half the window
    d, _ = p.recommend(snap(now=30, replicas=10, arrival_rate=0.0, service_time=1.0), p.initial_state())
    assert d.desired == 1  # a fresh policy drops to what the load needs at once


def test_min_max_clamp_is_reported():
    d, _ = ours(max_replicas=3).recommend(snap(arrival_rate=20.0, service_time=2.0), ours().initial_state())
    assert (d.desired, d.limited) == (3, "TooManyReplicas")


def test_hpa_policy_keeps_count_when_metrics_fail():
    p = HpaPolicy(target=2)
    d, _ = p.recommend(snap(replicas=4, error="Prometheus down", none=True), p.initial_state())
    assert (d.desired, d.reason) == (4, "FailedGetPodsMetric")


def test_keda_activation_cooldown_and_scale_to_zero():
    p = KedaPolicy(target=5)
    st = p.initial_state()
    # Queue 0 at the first poll, nothing active yet, minReplicaCount 0: scaled to zero
    d, st = p.recommend(snap(now=0, replicas=1, queue_per_pod={"p0": 0.0}), st)
    assert (d.desired, d.reason) == (0, "KEDAScaleTargetDeactivated")
    # At zero, a queue seen between polls does nothing until the next poll (30 s after the last)
    d, st = p.recommend(snap(now=15, replicas=0, pods=frozenset(), gateway_waiting=12.0), st)
    assert d.desired == 0
    d, st = p.recommend(snap(now=30, replicas=0, pods=frozenset(), gateway_waiting=12.0), st)
    assert (d.desired, d.reason) == (1, "KEDAScaleTargetActivated")
    # At 1 replica the HPA does AverageValue: ceil(12 / 5) = 3
    d, st = p.recommend(snap(now=45, replicas=1, pods=frozenset({"p0"}), queue_per_pod={"p0": 12.0}), st)
    assert d.desired == 3
    # Inactive (queue 0) but the cooldown (300 s after the last active poll at 30 s) has not passed: no zero
    d, st = p.recommend(snap(now=300, replicas=3, pods=PODS, queue_per_pod={"p0": 0.0, "p1": 0.0}), st)
    assert d.desired != 0
    d, st = p.recommend(snap(now=331, replicas=3, pods=PODS, queue_per_pod={"p0": 0.0, "p1": 0.0}), st)
    assert (d.desired, d.reason) == (0, "KEDAScaleTargetDeactivated")

"""The HPA arithmetic, case by case, with the expected numbers worked out by hand."""
import pytest

from autoscaler import hpa
from autoscaler.hpa import Behavior, HpaState, ScalingPolicy, ScalingRules

P = frozenset


@pytest.mark.parametrize("current, values, target, pods, pending, expected", [
    # 3 pods at 4, 4, 4 with target 2: ratio 2.0 -> ceil(2.0 * 3) = 6
    (3, {"a": 4, "b": 4, "c": 4}, 2, P("abc"), P(), 6),
    # ratio (2.1+2+2)/3/2 = 1.0167: within tolerance 0.1 -> keep 3
    (3, {"a": 2.1, "b": 2, "c": 2}, 2, P("abc"), P(), 3),
    # all zero: ratio 0 -> ceil(0) = 0 (min replicas applies later)
    (3, {"a": 0, "b": 0, "c": 0}, 2, P("abc"), P(), 0),
    # scale-down with a missing pod: ratio 1/2 = 0.5 < 1, missing c counts as the target (2):
    # new ratio (1+1+2)/3/2 = 0.667 -> ceil(0.667 * 3) = 2
    (3, {"a": 1, "b": 1}, 2, P("abc"), P(), 2),
    # scale-up with a missing pod: ratio 6/2 = 3, missing c counts as 0: new ratio (6+6+0)/3/2 = 2 -> ceil(2*3) = 6
    (3, {"a": 6, "b": 6}, 2, P("abc"), P(), 6),
    # scale-up with a pending pod: counts as 0: (8+0)/2/2 = 2 -> ceil(2 * 2) = 4
    (2, {"a": 8}, 2, P("ab"), P("b"), 4),
    # missing pod flips the direction: ratio 2.4/2 = 1.2 > 1, missing as 0 -> (2.4+0)/2/2 = 0.6 < 1 -> keep 2
    (2, {"a": 2.4}, 2, P("ab"), P(), 2),
    # no ready pod reported: None (FailedGetPodsMetric)
    (2, {}, 2, P("ab"), P(), None),
    # a value for a pod that is not the target's is ignored: only a counts, 4/2 = 2 -> ceil(2 * 1) = 2
    (1, {"a": 4, "zzz": 100}, 2, P("a"), P(), 2),
])
def test_pods_metric_replicas(current, values, target, pods, pending, expected):
    assert hpa.pods_metric_replicas(current, values, target, pods=pods, pending=pending) == expected


@pytest.mark.parametrize("total, target, status, expected", [
    (20, 5, 2, 4),  # ceil(20/5) = 4, whatever the current count (KEDA's AverageValue example)
    (10.5, 5, 2, 2),  # 10.5 / (5*2) = 1.05: within tolerance -> 2
    (0, 5, 3, 0),
    (7, 5, 0, 2),  # from zero: ceil(7/5)
])
def test_external_average_replicas(total, target, status, expected):
    assert hpa.external_average_replicas(total, target, status) == expected


def test_scale_down_waits_for_the_stabilization_window():
    state = HpaState()
    # t=0: recommendation 10 while at 10; t=15..285: recommendation 2 -> held at 10 until 10 leaves the 300 s window
    n = hpa.normalize(10, 10, min_replicas=1, max_replicas=20, now=0, state=state)
    state = n.state
    for t in range(15, 300, 15):
        n = hpa.normalize(10, 2, min_replicas=1, max_replicas=20, now=t, state=state)
        state = n.state
        assert n.desired == 10, t
        assert n.reason == "ScaleDownStabilized"
    n = hpa.normalize(10, 2, min_replicas=1, max_replicas=20, now=300, state=state)
    assert n.desired == 2


def test_scale_up_rate_limit_default_policies():
    # From 3: max(3 + 4 pods, ceil(3 * 2) = 6) = 7 per 15 s
    n = hpa.normalize(3, 50, min_replicas=1, max_replicas=100, now=0, state=HpaState())
    assert (n.desired, n.reason) == (7, "ScaleUpLimit")
    # 10 s later the period still holds the +4 event: start = 7 - 4 = 3 -> limit 7 again, no further growth
    n2 = hpa.normalize(7, 50, min_replicas=1, max_replicas=100, now=10, state=n.state)
    assert n2.desired == 7
    # 16 s after the first event it has left the 15 s period: max(7 + 4, 14) = 14
    n3 = hpa.normalize(7, 50, min_replicas=1, max_replicas=100, now=16, state=n2.state)
    assert n3.desired == 14


def test_min_max_and_custom_scale_down_policy():
    behavior = Behavior(scale_down=ScalingRules(0, (ScalingPolicy("Pods", 1, 60),)))
    n = hpa.normalize(5, 0, min_replicas=2, max_replicas=10, now=0, state=HpaState(), behavior=behavior)
    assert n.desired == 4  # one pod per minute
    n = hpa.normalize(4, 0, min_replicas=2, max_replicas=10, now=30, state=n.state, behavior=behavior)
    assert n.desired == 4  # the minute is not over: start = 4 + 1 = 5 -> limit 4
    n = hpa.normalize(12, 12, min_replicas=2, max_replicas=10, now=0, state=HpaState())
    assert n.desired == 10  # above max is brought down to max

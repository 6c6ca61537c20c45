"""The baselines of `gpuaas simulate autoscaling`, hand-checked: HPA and KEDA on in-flight requests or queue depth,
Knative's KPA (stable and panic windows, scale to zero), and every policy's warm start."""
from __future__ import annotations

from autoscaler.policy import HpaPolicy, KedaPolicy, KpaPolicy, QueueDepthPolicy, StaticPolicy
from autoscaler.snapshot import Signals, TargetSnapshot

PODS = frozenset({"p0", "p1"})


def snap(now=100.0, replicas=2, pods=PODS, ready=None, **signals):
    return TargetSnapshot(now=now, replicas=replicas, pods=pods, signals=Signals(**signals), ready=ready)


def test_inflight_is_running_plus_waiting_per_pod():
    sig = Signals(queue_per_pod={"p0": 2.0, "p1": 0.0}, running_per_pod={"p0": 8.0, "p1": 3.0})
    assert sig.inflight_per_pod == {"p0": 10.0, "p1": 3.0}


def test_hpa_on_inflight_and_on_queue():
    s = snap(queue_per_pod={"p0": 2.0, "p1": 0.0}, running_per_pod={"p0": 8.0, "p1": 6.0})
    # inflight: (10 + 6) / 2 = 8 per pod against 4: ceil(2 x 2) = 4 replicas
    d, _ = HpaPolicy(target=4, metric="inflight").recommend(s, HpaPolicy(target=4).initial_state())
    assert d.desired == 4
    # queue: (2 + 0) / 2 = 1 per pod against 4: ratio 0.25, down to ceil(0.25 x 2) = 1 (no history, no stabilization)
    d, _ = HpaPolicy(target=4, metric="queue").recommend(s, HpaPolicy(target=4).initial_state())
    assert d.desired == 1


def test_hpa_warm_start_holds_for_the_stabilization_window():
    p = HpaPolicy(target=4, metric="inflight")
    quiet = {"queue_per_pod": {"p0": 0.0, "p1": 0.0}, "running_per_pod": {"p0": 0.0, "p1": 0.0}}
    d, st = p.recommend(snap(now=7.5, **quiet), p.initial_state(2))
    assert d.desired == 2 and d.reason == "ScaleDownStabilized"
    d, _ = p.recommend(snap(now=301, **quiet), st)  # the warm recommendation (t = 0) left the 300 s window
    assert d.desired == 1


def test_keda_inflight_counts_the_gateway():
    p = KedaPolicy(target=4, metric="inflight", min_replica_count=1)
    s = snap(now=0, queue_per_pod={"p0": 8.0, "p1": 8.0}, running_per_pod={"p0": 8.0, "p1": 8.0},
             gateway_waiting=8.0)
    assert p.total(s.signals) == 40
    d, _ = p.recommend(s, p.initial_state())
    assert d.desired == 6  # ceil(40 / 4) = 10, the scale-up limited to max(2 + 4 pods, 2 x 2) per 15 s


def concurrency(value, seconds=60):
    return (float(value),) * seconds


def test_kpa_stable_mode_sizes_on_the_60s_average():
    p = KpaPolicy(target=10)  # TV = 7 in flight per pod
    d, st = p.recommend(snap(replicas=3, ready=3, concurrency_1s=concurrency(14)), p.initial_state())
    assert d.desired == 2 and st.panic_time is None  # ceil(14 / 7); floor(3 / 2) = 1 allows the step down


def test_kpa_panics_on_the_6s_window_and_never_scales_down_while_panicking():
    p = KpaPolicy(target=10)
    burst = concurrency(7, 54) + concurrency(70, 6)  # stable avg 13.3, panic avg 70
    d, st = p.recommend(snap(now=100, replicas=2, ready=2, concurrency_1s=burst), p.initial_state())
    # panic: ceil(70 / 7) = 10 pods, 10 / 2 >= 200 %: panic, the larger of stable (2) and panic (10)
    assert d.desired == 10 and st.panic_time == 100 and st.max_panic_pods == 10
    calm = concurrency(7, 60)
    d, st = p.recommend(snap(now=130, replicas=10, ready=10, concurrency_1s=calm), st)
    assert d.desired == 10  # still within a stable window of the last over-threshold tick: no scale-down
    d, st = p.recommend(snap(now=161, replicas=10, ready=10, concurrency_1s=calm), st)
    assert d.desired == 5 and st.panic_time is None  # panic over; at most halved per tick (max-scale-down-rate 2)


def test_kpa_scales_to_zero_after_the_grace_period_and_back_from_the_activator():
    p = KpaPolicy(target=10)
    idle = concurrency(0)
    d, st = p.recommend(snap(now=100, replicas=1, ready=1, concurrency_1s=idle), p.initial_state())
    assert d.desired == 1  # asks for zero; one replica kept for the 30 s grace period
    d, st = p.recommend(snap(now=131, replicas=1, ready=1, concurrency_1s=idle), st)
    assert d.desired == 0
    # at zero, requests held by the activator are concurrency too: ready counts as 1, panic
    waking = concurrency(0, 54) + concurrency(20, 6)
    d, st = p.recommend(snap(now=140, replicas=0, pods=frozenset(), ready=0, concurrency_1s=waking), st)
    assert d.desired == 3 and st.panic_time == 140


def test_kpa_min_scale_and_warm_start():
    p = KpaPolicy(target=10, min_scale=2)
    d, _ = p.recommend(snap(replicas=3, ready=3, concurrency_1s=concurrency(0)), p.initial_state())
    assert d.desired == 2
    # a new autoscaler over more than one pod starts in panic mode, holding them (Knative's newAutoscaler)
    q = KpaPolicy(target=10)
    st = q.initial_state(6)
    assert (st.panic_time, st.max_panic_pods) == (0.0, 6)
    d, _ = q.recommend(snap(now=30, replicas=6, ready=6, concurrency_1s=concurrency(1)), st)
    assert d.desired == 6
    d, _ = q.recommend(snap(now=30, replicas=6, ready=6), st)
    assert (d.desired, d.reason) == (6, "NoData")


def test_every_policy_has_a_setting_and_a_warm_state():
    for p in (HpaPolicy(target=2), KedaPolicy(target=2), KpaPolicy(target=2), StaticPolicy(3), QueueDepthPolicy()):
        assert p.setting
        p.initial_state(4)

"""The measurement helper of the scale-up latency (first come, first served)."""
from tests.nodescaler.checks import fifo_latencies


def test_kth_pod_is_served_by_kth_node_and_early_nodes_count_zero():
    # pods at 10, 11, 12; nodes requested at 10.5, 10.9 (before the third pod), 13.
    assert fifo_latencies([12.0, 10.0, 11.0], [13.0, 10.5, 10.9]) == [0.5, 0.0, 1.0]
    assert fifo_latencies([1.0, 2.0], [1.5]) == [0.5]  # a pod without a node yet is not counted

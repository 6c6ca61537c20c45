"""The end-to-end tests' helpers: the scale-up latency measure (first come, first served), and the background
checkers, which must fail loudly when they could not check."""
import threading
from typing import ClassVar

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.nodescaler.checks import NodeDeletionWatch, _Thread, fifo_latencies


def test_kth_pod_is_served_by_kth_node_and_early_nodes_count_zero():
    # pods at 10, 11, 12; nodes requested at 10.5, 10.9 (before the third pod), 13.
    assert fifo_latencies([12.0, 10.0, 11.0], [13.0, 10.5, 10.9]) == [0.5, 0.0, 1.0]
    assert fifo_latencies([1.0, 2.0], [1.5]) == [0.5]  # a pod without a node yet is not counted


# ---- the background checkers of the end-to-end tests fail loudly ---------------------------------------------------
class _Failing(_Thread):
    violations: ClassVar[list[str]] = []

    def __init__(self):
        super().__init__()
        self.calls = 0

    def loop(self):
        self.calls += 1
        if self.calls == 1:
            raise ConnectionResetError("apiserver went away")
        self.stop_event.wait(0.01)


def test_a_checker_that_could_not_check_fails_assert_ok():
    # Before: the error went into `errors`, which no test read; the checker looked clean.
    checker = _Failing().start()
    threading.Event().wait(0.05)
    checker.stop()
    with pytest.raises(AssertionError, match="could not check"):
        checker.assert_ok()


class _FakeCore:
    """Nodes `a` (still there) and `b` (gone while the watch was down, a pod still bound to it); the watch is too
    old."""

    def list_node(self, **kw):
        if kw.get("watch"):
            raise ApiException(status=410, reason="Gone")
        return client.V1NodeList(metadata=client.V1ListMeta(resource_version="7"),
                                 items=[client.V1Node(metadata=client.V1ObjectMeta(name="a"))])

    def list_pod_for_all_namespaces(self, field_selector):
        bound = field_selector == "spec.nodeName=b"
        return client.V1PodList(items=[client.V1Pod(
            metadata=client.V1ObjectMeta(name="p", namespace="ns", owner_references=[]),
            status=client.V1PodStatus(phase="Running"))] if bound else [])


def test_a_node_deleted_while_the_node_watch_was_down_is_checked_at_the_relist():
    # Before: a 410 was counted as an error ("a deletion in the gap would go unchecked") and the gap stayed unchecked.
    watch = NodeDeletionWatch(None)
    watch.core = _FakeCore()
    watch._known = {"a", "b"}
    watch.loop()  # list (b is missing: checked as deleted), then the watch: 410, list again next time
    assert watch.relists == 1 and watch.deleted == ["b"]
    assert watch.violations == ["node b deleted with pods on it: ['ns/p']"]
    with pytest.raises(AssertionError, match="deleted with pods"):
        watch.assert_ok()

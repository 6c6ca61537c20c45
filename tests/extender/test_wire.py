import re

import numpy as np
import orjson
import pytest

from extender.wire import HostPriority, HostPriorityEncoder


def decoded(body: bytes) -> list[tuple[str, int]]:
    return [(h.Host, h.Score) for h in map(HostPriority.model_validate, orjson.loads(body))]


def test_host_priority_list_for_known_and_unknown_names():
    model = ["a100-0000", "a100-0001", "h100-0000"]
    names = ["h100-0000", 'odd "name"\\', "a100-0000"]  # an unknown name that needs JSON escaping
    rows = np.array([2, -1, 0])
    body = HostPriorityEncoder().encode(names, rows, np.array([10, 2, 7]), model)
    assert decoded(body) == [("h100-0000", 10), ('odd "name"\\', 2), ("a100-0000", 7)]


def test_scores_of_0_are_left_out_unless_every_score_is_0():
    """kube-scheduler adds nothing for a host the list leaves out, as for a 0, and decodes every entry it gets; when
    every score is 0 each is sent, so that its random tie-break among them stays (see HostPriorityEncoder)."""
    model = ["a", "b", "c", "d"]
    names = ["d", "odd", "b", "a", "c"]
    rows = np.array([3, -1, 1, 0, 2])
    enc = HostPriorityEncoder()
    assert decoded(enc.encode(names, rows, np.array([0, 0, 4, 0, 10]), model)) == [("b", 4), ("c", 10)]
    assert decoded(enc.encode(names, rows, np.array([0, 3, 0, 0, 10]), model)) == [("odd", 3), ("c", 10)]
    assert decoded(enc.encode(names, rows, np.zeros(5, dtype=np.int64), model)) == [(n, 0) for n in names]
    assert decoded(enc.encode(names, rows, np.full(5, 9), model)) == [(n, 9) for n in names]


def test_a_new_node_set_is_encoded_anew():
    enc = HostPriorityEncoder()
    assert decoded(enc.encode(["x"], np.array([0]), np.array([3]), ["x"])) == [("x", 3)]
    assert decoded(enc.encode(["y"], np.array([0]), np.array([4]), ["y", "x"])) == [("y", 4)]


def test_empty_list_and_out_of_range_scores():
    enc = HostPriorityEncoder()
    assert enc.encode([], np.array([], dtype=np.int64), np.array([], dtype=np.int64), ["x"]) == b"[]"
    with pytest.raises(ValueError, match=re.escape("0..10")):
        enc.encode(["x"], np.array([0]), np.array([11]), ["x"])


def test_fixed_width_records_and_the_joined_fallback_give_the_same_list():
    model = ["a", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "c\"q"]
    rows, scores = np.array([1, 0, 2, 0]), np.array([10, 0, 7, 3])
    names = [model[r] for r in rows]
    padded = HostPriorityEncoder()
    body = padded.encode(names, rows, scores, model)
    assert padded._records is not None and b"  " in body  # records padded to the longest entry
    joined = HostPriorityEncoder()
    joined.MAX_RECORD_BYTES = 10  # every record longer: entries joined one by one
    plain = joined.encode(names, rows, scores, model)
    assert joined._records is None and b"  " not in plain
    assert decoded(body) == decoded(plain) == [(n, s) for n, s in zip(names, scores.tolist(), strict=True) if s]


@pytest.mark.parametrize("change", ["added", "removed", "added-longest", "removed-longest", "renamed-all"])
def test_a_node_added_or_removed_moves_the_records_and_encodes_only_new_names(change):
    """After a node set change the encoder holds what a new encoder would: the same records, byte for byte (the
    padding follows the longest name), for every row."""
    model = [f"gpu-{i:04d}" for i in range(40)] + ["gpu-with-a-longer-name"]
    if change == "added":
        after = model[:7] + ["gpu-0006b"] + model[7:]
    elif change == "removed":
        after = model[:7] + model[8:]
    elif change == "added-longest":
        after = ["a-much-longer-node-name-than-any-before"] + model
    elif change == "removed-longest":
        after = model[:-1]
    else:
        after = [f"other-{i}" for i in range(41)]
    enc = HostPriorityEncoder()
    enc.encode(model[:1], np.array([0]), np.array([5]), model)
    rows = np.arange(len(after))
    scores = rows % 11
    encoded = []
    head = enc._head
    enc._head = lambda name: encoded.append(name) or head(name)  # type: ignore[method-assign]
    body = enc.encode(after, rows, scores, after)
    assert len(encoded) == {"added": 1, "removed": 0, "added-longest": 1, "removed-longest": 0}.get(change, len(after))
    fresh = HostPriorityEncoder()
    assert body == fresh.encode(after, rows, scores, after)
    assert enc._records is not None and fresh._records is not None
    assert enc._records.dtype == fresh._records.dtype and np.array_equal(enc._records, fresh._records)
    assert np.array_equal(enc._heads, fresh._heads) and np.array_equal(enc._head_len, fresh._head_len)
    assert decoded(body) == [(n, s) for n, s in zip(after, scores.tolist(), strict=True) if s]

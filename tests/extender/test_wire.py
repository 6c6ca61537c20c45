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
    body = HostPriorityEncoder().encode(names, rows, np.array([10, 0, 7]), model)
    assert decoded(body) == [("h100-0000", 10), ('odd "name"\\', 0), ("a100-0000", 7)]


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
    assert decoded(body) == decoded(plain) == list(zip(names, scores.tolist(), strict=True))

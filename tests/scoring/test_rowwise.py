import numpy as np
import pytest

from scoring.rowwise import any_per_row, count_per_row, sum_per_row


@pytest.mark.parametrize("shape", [(0, 8), (1, 8), (97, 8), (50, 16), (40, 5), (30, 1)])
def test_row_reductions_equal_numpy_axis_reductions(shape):
    rng = np.random.default_rng(len(shape) * shape[0] + shape[1])
    values = rng.integers(0, 1001, size=shape)
    for mask in (values >= 500, values == 1000, np.ones(shape, dtype=bool), np.zeros(shape, dtype=bool)):
        assert count_per_row(mask).tolist() == mask.sum(axis=1).tolist()
        assert any_per_row(mask).tolist() == mask.any(axis=1).tolist()
    assert sum_per_row(values).tolist() == values.sum(axis=1).tolist()


def test_strided_mask_falls_back():
    mask = np.random.default_rng(3).integers(0, 2, size=(20, 16)).astype(bool)[:, ::2]  # not contiguous
    assert count_per_row(mask).tolist() == mask.sum(axis=1).tolist()
    assert any_per_row(mask).tolist() == mask.any(axis=1).tolist()

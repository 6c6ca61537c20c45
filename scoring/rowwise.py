"""Per-node reductions over the GPU columns of the model's [N, G] arrays.

numpy reduces along a short last axis slowly: `(gpu_left == MILLI).sum(axis=1)` over 5,000 nodes x 8 GPUs takes
about 85 us, a tenth of a filter call. With G a multiple of 8, the G booleans of a row are G/8 machine words: "any"
is a word test, and "how many" is the sum of the word's bytes, which one multiplication gathers in the top byte.
Results are exact and equal to the axis=1 reductions; other shapes fall back to them.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

_BYTE_SUM = np.uint64(0x0101010101010101)  # x * this: byte 7 holds the sum of x's bytes (each 0 or 1 here)
_TOP_BYTE = np.uint64(56)


def _words(mask: np.ndarray) -> np.ndarray | None:
    """The rows of a bool[N, G] array as uint64[N, G/8], or None when that view does not exist."""
    if mask.dtype != np.bool_ or mask.ndim != 2 or mask.shape[1] % 8 or not mask.flags.c_contiguous:
        return None
    return mask.view(np.uint64)


def count_per_row(mask: np.ndarray) -> NDArray[np.int64]:
    """int64[N]: how many entries of each row of bool[N, G] are True."""
    words = _words(mask)
    if words is None:
        counted: NDArray[np.int64] = mask.sum(axis=1)  # numpy's stubs type an axis reduction as Any
        return counted
    counts = (words * _BYTE_SUM) >> _TOP_BYTE
    return (counts[:, 0] if counts.shape[1] == 1 else counts.sum(axis=1)).astype(np.int64)


def any_per_row(mask: np.ndarray) -> NDArray[np.bool_]:
    """bool[N]: whether each row of bool[N, G] has a True entry."""
    words = _words(mask)
    out: NDArray[np.bool_]  # numpy's stubs type these as Any (and ndarray.any(axis=1) as a scalar or an array)
    if words is None:
        out = np.any(mask, axis=1)
    else:
        out = words[:, 0] != 0 if words.shape[1] == 1 else np.any(words != 0, axis=1)
    return out


def sum_per_row(values: np.ndarray) -> np.ndarray:
    """Row sums of an [N, G] integer or float array (einsum's loop beats reduce's on a short last axis)."""
    sums: np.ndarray = np.einsum("ij->i", values)  # numpy's stubs type einsum as Any
    return sums

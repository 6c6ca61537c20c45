"""What a fraction of a GPU is worth: GPU shares priced by the cutting-stock LP over a workload's share sizes.

Packing GPU shares (one GPU, a fraction in thousandths) is bin packing with bins of 1000. Its LP relaxation (Gilmore
and Gomory's cutting-stock LP over "patterns", multisets of sizes that fit one GPU) has a dual price per size. Written
as z_s = s + y_s (a share's *value*, in thousandths of a GPU), every pattern has sum z <= 1000, and the patterns an
optimal packing uses have sum z = 1000. So z says how much of a GPU a share of size s effectively takes once the rest
of the workload is packed around it: with many 810s and few shares of 190 or less, z(810) = 1000 (an 810 is a whole
GPU) and z(160) = 0 (a 160 fits in the 190 an 810 leaves, which nothing else uses).

`ShareValues.regret(free, s)`: how much worse than an optimal pattern a GPU gets by putting a share s on it,
    K(free) - K(free - s) - z(s),  K(r) = the most value that shares of the workload can put in r thousandths;
0 when the share sits on an optimal pattern (an empty GPU is one), > 0 when it leaves a remainder the workload can
fill only badly (a 320 next to a 470 leaves 210, which only rare small shares fill). This is the look-ahead FGD
approximates with its binary fragment measure: FGD asks "does a typical pod still fit", the regret asks "how well
will the rest of the workload fill what is left".

`cutting_stock(lower, upper)` is the LP itself (minimum wasted GPU share with a lower and upper count per size), used
for the values above and, by bench/packing_headroom.py, as a bound on what any packing of given shares can reach.
Pure; the LP is OR-Tools GLOP, solved by column generation (patterns priced by a knapsack over the duals).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from ortools.linear_solver import pywraplp

from scoring.fragmentation import Workload
from scoring.model import MILLI

_EPS = 1e-9
MAX_ROUNDS = 500  # column-generation rounds; the trace's share mixes converge in 10-40


@dataclass(frozen=True)
class CuttingStock:
    """An optimal LP packing: wasted thousandths, patterns used {size: count} with their GPU counts, dual values."""

    waste_milli: float
    patterns: list[tuple[dict[int, int], float]]
    values: dict[int, float]  # z_s = s + dual_s (thousandths)
    optimal: bool


def knapsack(sizes: np.ndarray, values: np.ndarray, limits: np.ndarray, capacity: int = MILLI
             ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Best total value per capacity 0..capacity with at most limits[i] items of sizes[i] (bounded knapsack, array
    work per size and count). Returns the table and, per size, how many were taken at each capacity (for the path)."""
    best = np.zeros(capacity + 1)
    takes = []
    for s, v, lim in zip(sizes, values, limits, strict=True):
        prev = best.copy()
        take = np.zeros(capacity + 1, dtype=np.int64)
        for k in range(1, int(min(lim, capacity // s)) + 1):
            cand = np.full(capacity + 1, -np.inf)
            cand[k * s:] = prev[: capacity + 1 - k * s] + k * v
            better = cand > best + _EPS
            best = np.where(better, cand, best)
            take = np.where(better, k, take)
        takes.append(take)
    return best, takes


def _best_pattern(sizes: np.ndarray, values: np.ndarray, limits: np.ndarray) -> tuple[float, dict[int, int]]:
    best, takes = knapsack(sizes, values, limits)
    c = int(np.argmax(best))
    pattern = {}
    for i in range(len(sizes) - 1, -1, -1):  # walk the sizes back in the order they were added
        k = int(takes[i][c])
        if k:
            pattern[int(sizes[i])] = k
            c -= k * int(sizes[i])
    return float(best.max()), pattern


def cutting_stock(lower: Mapping[int, float], upper: Mapping[int, float] | None = None) -> CuttingStock:
    """Minimum wasted GPU share over GPUs packed with shares (each GPU used wastes 1000 - its content).

    Without `upper`: exactly lower[s] shares of each size, in the classic form (fewest GPUs with count >= lower, so
    duals >= 0; a reported pattern may hold more shares than exist where its GPU has room to spare, which changes
    neither the GPU count nor the waste, computed for exactly lower).
    With `upper`: between lower[s] and upper[s] shares of size s (a size missing from `upper` has upper = lower), so
    optional shares may fill what mandatory ones leave. `optimal` is False if the LP could not be solved to the end
    (then `values` are the sizes themselves, plain best fit, and the waste is no bound)."""
    sizes = sorted((int(s) for s in set(lower) | set(upper or {})), reverse=True)
    if any(not 0 < s < MILLI for s in sizes):
        raise ValueError(f"share sizes must be 1..{MILLI - 1} thousandths, got {sizes}")
    if not sizes:
        return CuttingStock(0.0, [], {}, True)
    size_arr = np.array(sizes, dtype=np.int64)
    lo = np.array([float(lower.get(s, 0.0)) for s in sizes])
    if upper is None:
        hi = np.full(len(sizes), np.inf)
    else:
        hi = np.array([float(upper.get(s, lower.get(s, 0.0))) for s in sizes])
        if (hi < lo).any():
            raise ValueError("an upper count is below its lower count")
    limits = np.minimum(hi, MILLI // size_arr).astype(np.int64)
    patterns: list[dict[int, int]] = [{s: int(k)} for s, k in zip(sizes, limits, strict=True) if k > 0]
    converged = False
    for _ in range(MAX_ROUNDS):
        solver = pywraplp.Solver.CreateSolver("GLOP")
        x = [solver.NumVar(0.0, solver.infinity(), "") for _ in patterns]
        rows = [solver.Constraint(float(lo[i]), float(hi[i]) if np.isfinite(hi[i]) else solver.infinity())
                for i in range(len(sizes))]
        for j, p in enumerate(patterns):
            for s, k in p.items():
                rows[sizes.index(s)].SetCoefficient(x[j], k)
        if upper is None:
            solver.Minimize(solver.Sum(x))
        else:
            solver.Minimize(solver.Sum([(MILLI - sum(s * k for s, k in p.items())) * x[j]
                                        for j, p in enumerate(patterns)]))
        if solver.Solve() != pywraplp.Solver.OPTIMAL:
            break
        values = (MILLI * np.array([r.dual_value() for r in rows]) if upper is None
                  else size_arr + np.array([r.dual_value() for r in rows]))
        gain, pattern = _best_pattern(size_arr, values, limits)
        if gain <= MILLI + 1e-6 or pattern in patterns:
            converged = True
            break
        patterns.append(pattern)
    if not converged:  # no LP answer: value shares by their size (plain best fit) and say so
        return CuttingStock(float("nan"), [], {s: float(s) for s in sizes}, False)
    waste = solver.Objective().Value()
    if upper is None:
        waste = MILLI * waste - float((size_arr * lo).sum())
    used = [(p, x[j].solution_value()) for j, p in enumerate(patterns) if x[j].solution_value() > 1e-7]
    return CuttingStock(waste, used, {s: float(v) for s, v in zip(sizes, values, strict=True)}, True)


def share_mix(workload: Workload) -> dict[int, float]:
    """Popularity of each GPU-share size (single GPU, below 1000) among the workload's shapes."""
    mix: dict[int, float] = {}
    for shape, p in zip(workload.shapes, workload.popularity, strict=True):
        if shape.gpus == 1 and 0 < shape.gpu_milli < MILLI:
            mix[shape.gpu_milli] = mix.get(shape.gpu_milli, 0.0) + float(p)
    return mix


# The LP is scale-free; counts per 10,000 pods keep GLOP's numbers well conditioned.
MIX_SCALE = 10_000.0
_SOLVED: dict[tuple[tuple[int, float], ...], ShareValues] = {}  # share mix -> its values (ShareValues.of)
_SOLVED_MAX = 64


class ShareValues:
    """z per share size and K per remainder for one workload; `regret` is array work over candidate GPUs."""

    def __init__(self, values: Mapping[int, float]):
        self.values = {int(s): float(v) for s, v in values.items()}
        sizes = np.array(sorted(self.values), dtype=np.int64)
        z = np.array([self.values[s] for s in sizes])
        # A remainder can hold any number of shares of any size: unbounded knapsack.
        self.fill, _ = knapsack(sizes, z, np.full(sizes.size, MILLI))
        # Sizes outside the workload are worth what the workload could put in the same room.
        self.value_of = self.fill.copy()
        self.value_of[sizes] = z

    @staticmethod
    def of(workload: Workload) -> ShareValues:
        """The values for `workload`'s share mix; remembered per mix (the LP is a pure function of it, and a planner
        makes a policy per gang: the gang controller solved it over a thousand times a round)."""
        mix = share_mix(workload)
        key = tuple(sorted(mix.items()))
        values = _SOLVED.get(key)
        if values is None:
            values = _SOLVED[key] = ShareValues(cutting_stock({s: p * MIX_SCALE for s, p in mix.items()}).values)
            while len(_SOLVED) > _SOLVED_MAX:
                _SOLVED.pop(next(iter(_SOLVED)))
        return values

    def regret(self, free: ArrayLike, share: int) -> np.ndarray:
        """Thousandths of GPU lost against an optimal pattern by taking `share` from GPUs with `free` left."""
        free = np.asarray(free, dtype=np.int64)
        if (free < share).any():
            raise ValueError(f"a share of {share} does not fit a GPU with {int(free.min())} free")
        # Rounded: LP values carry float noise (1e-13), and a regret of exactly 0 must score exactly as 0 does.
        # (Annotated: numpy's stubs type the rounded difference as Any.)
        regret: np.ndarray = np.round(self.fill[free] - self.fill[free - share] - self.value_of[share], 6)
        return regret

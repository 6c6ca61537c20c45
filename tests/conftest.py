"""Test fakes more than one test folder uses (one home, not a copy per file)."""
from __future__ import annotations


class Clock:
    """A clock a test sets: `clock()` answers `clock.t` (seconds), which the test moves."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

"""Test fakes more than one test folder uses: one home, not a copy per file. Each is a class (for tests that build
one inside a helper) and a fixture of the same name in lower case."""
from __future__ import annotations

import pytest


class Clock:
    """A clock a test sets: `clock()` answers `clock.t` (seconds), which the test moves."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()

"""What every `gpuaas simulate` sub-verb does with its results: JSON to a file or stdout, and an optional plot."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuaas.plotting import MatplotlibMissing, require_matplotlib


def write_json(payload: Any, json_out: str) -> None:
    """`json_out` "-" prints the JSON; anything else is a file path."""
    text = json.dumps(payload, indent=1)
    if json_out == "-":
        print(text)
    else:
        Path(json_out).write_text(text + "\n")


def can_plot(path: str | None, verb: str) -> bool:
    """False, with a message naming the extra to install, when a plot was asked for and matplotlib is missing. The
    sub-verbs ask before they simulate, so that a missing extra does not cost the run."""
    if path:
        try:
            require_matplotlib("--plot")
        except MatplotlibMissing as err:
            print(f"gpuaas simulate {verb}: {err}", file=sys.stderr)
            return False
    return True


def write_plot(draw: Callable[[Any, str], None], results: Any, path: str | None, verb: str) -> int:
    """Draw `results` to `path` if one was asked for; 1 (with a message naming the plot extra) when matplotlib is
    missing, else 0."""
    if not path:
        return 0
    if not can_plot(path, verb):
        return 1
    draw(results, path)
    return 0

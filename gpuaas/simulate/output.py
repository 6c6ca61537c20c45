"""What every `gpuaas simulate` sub-verb does with its results: JSON to a file or stdout, and an optional plot."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_json(payload: Any, json_out: str) -> None:
    """`json_out` "-" prints the JSON; anything else is a file path."""
    text = json.dumps(payload, indent=1)
    if json_out == "-":
        print(text)
    else:
        Path(json_out).write_text(text + "\n")


def write_plot(draw: Callable[[Any, str], None], results: Any, path: str | None, verb: str) -> int:
    """Draw `results` to `path` if one was asked for; 1 (with a message) when matplotlib is missing, else 0."""
    if not path:
        return 0
    try:
        draw(results, path)
    except ImportError:
        print(f"gpuaas simulate {verb}: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 1
    return 0

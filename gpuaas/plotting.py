"""matplotlib is an extra, not a runtime dependency: `pip install 'gpuaas[plot]'` (bin/gpuaas's venv has every extra,
the image none). What draws a plot (`gpuaas simulate ... --plot`, the report's PNGs, the demo) asks `require_matplotlib`
first, before any work, and says what to install instead of a traceback."""
from __future__ import annotations

PLOT_EXTRA = "gpuaas[plot]"
INSTALL_HINT = f"pip install '{PLOT_EXTRA}'"


class MatplotlibMissing(RuntimeError):
    """matplotlib (the `plot` extra) cannot be imported; the message says what needs it and what to install."""


def require_matplotlib(what: str) -> None:
    """Raise MatplotlibMissing ("<what> needs matplotlib ...: pip install 'gpuaas[plot]'") unless matplotlib imports."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MatplotlibMissing(f"{what} needs matplotlib, which is not installed (the plot extra): "
                                f"{INSTALL_HINT}") from None

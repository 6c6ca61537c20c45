"""The deploy/ tree as the tests see it: its bases and overlays, found on disk (a new one is tested without being
listed anywhere), rendered by the kustomize built into kubectl."""
from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpuaas.cluster.tools import Tools

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NAMESPACE = "gpuaas-system"


def kustomize_dirs(kind: str) -> list[Path]:
    """deploy/bases/* or deploy/overlays/*: every directory holding a kustomization."""
    return sorted(p.parent for p in (DEPLOY / kind).glob("*/kustomization.yaml"))


@cache
def _render(path: Path) -> str:
    result = subprocess.run([str(Tools.locate().kubectl), "kustomize", str(path)], capture_output=True, text=True,
                            timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path.relative_to(REPO)}: {result.stderr.strip()}")
    return result.stdout


def render(path: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize path` renders (a fresh copy on each call: callers may change them)."""
    return [d for d in yaml.safe_load_all(_render(path)) if d]


def objects(path: Path, kind: str) -> list[dict[str, Any]]:
    return [d for d in render(path) if d["kind"] == kind]


def named(path: Path, kind: str, name: str) -> dict[str, Any]:
    found = [d for d in objects(path, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name} in {path.relative_to(REPO)}: {len(found)} found"
    return found[0]

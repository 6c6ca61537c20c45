"""The Helm chart in deploy/helm/gpuaas as the tests see it: rendered by the helm that scripts/setup.sh builds, found
through the same tools module as kubectl. A missing helm fails the test that needs it: setup installs it."""
from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpuaas.cluster.tools import Tools
from gpuaas.helmchart import CHART

from .manifests import NAMESPACE


def helm_binary() -> Path:
    helm = Tools.locate().helm
    assert helm is not None and os.access(helm, os.X_OK), \
        f"helm not found (GPUAAS_HELM_BIN={helm}): run scripts/setup.sh, which builds it"
    return helm


def helm(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(helm_binary()), *args], input=input, capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)} (stdin {input}): {result.stderr.strip()}"
    return result


def template_text(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> str:
    """`helm template` of the chart with `values` over its defaults, as the text helm prints."""
    return _render(json.dumps(values or {}, sort_keys=True), namespace)


@cache
def _render(values_json: str, namespace: str) -> str:
    return helm("template", "gpuaas", str(CHART), "--namespace", namespace, "--values", "-", input=values_json).stdout


def template(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The objects `helm template` renders (a fresh copy on each call: callers may change them)."""
    return [d for d in yaml.safe_load_all(template_text(values, namespace)) if d]

"""The layers hold at run time: importing a component loads neither the local-cluster harness (gpuaas.cluster) nor
`cryptography` (the harness's PKI), nor any other tool of the gpuaas layer. Each import runs in a fresh interpreter,
so that what the test process has imported already does not hide what the component pulls in. The static contracts
(.importlinter) say the same about the source; this checks what actually gets loaded, lazy imports included."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

COMPONENTS = ("extender.server", "autoscaler.service", "autoscaler.metrics_api", "nodescaler.service")


def loaded_after_import(module: str) -> list[str]:
    probe = f"import importlib, json, sys; importlib.import_module({module!r}); print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("module", COMPONENTS)
def test_a_component_loads_neither_the_harness_nor_cryptography(module):
    loaded = loaded_after_import(module)
    harness = [m for m in loaded if m == "gpuaas.cluster" or m.startswith("gpuaas.cluster.")]
    assert not harness, f"importing {module} loads the local-cluster harness: {harness}"
    assert "cryptography" not in loaded, f"importing {module} loads cryptography"
    tools = [m for m in loaded if m == "gpuaas" or m.startswith("gpuaas.")]
    assert not tools, f"importing {module} loads the tools layer: {tools}"

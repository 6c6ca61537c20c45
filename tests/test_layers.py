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


# The test and plot extras (pyproject.toml [project.optional-dependencies]): `pip install .` and the image lack them.
EXTRAS_ONLY = ("pytest", "_pytest", "hypothesis", "matplotlib")


def run_fresh(probe: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def loaded_after_import(module: str) -> list[str]:
    result = run_fresh(f"import importlib, json, sys; importlib.import_module({module!r}); "
                       "print(json.dumps(sorted(sys.modules)))")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def extras_loaded(loaded: list[str]) -> list[str]:
    return sorted({m.split(".")[0] for m in loaded if m.split(".")[0] in EXTRAS_ONLY})


@pytest.mark.parametrize("module", COMPONENTS)
def test_a_component_loads_neither_the_harness_nor_cryptography(module):
    loaded = loaded_after_import(module)
    harness = [m for m in loaded if m == "gpuaas.cluster" or m.startswith("gpuaas.cluster.")]
    assert not harness, f"importing {module} loads the local-cluster harness: {harness}"
    assert "cryptography" not in loaded, f"importing {module} loads cryptography"
    tools = [m for m in loaded if m == "gpuaas" or m.startswith("gpuaas.")]
    assert not tools, f"importing {module} loads the tools layer: {tools}"


@pytest.mark.parametrize("module", ("gpuaas.cli", *COMPONENTS))
def test_importing_the_command_or_a_component_loads_no_test_or_plot_tool(module):
    assert not extras_loaded(loaded_after_import(module)), f"importing {module} needs an extra"


def test_gpuaas_help_builds_every_verb_without_the_test_or_plot_tools():
    # `gpuaas --help` imports every verb's module (the parser is built from all of them): what `pip install .`
    # without extras must be able to run.
    result = subprocess.run([sys.executable, "-m", "gpuaas.cli", "--help"], cwd=REPO, capture_output=True, text=True,
                            timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: gpuaas ") and "simulate" in result.stdout
    probe = """
import contextlib, io, json, sys
from gpuaas.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0, exc.code
print(json.dumps(sorted(sys.modules)))
"""
    result = run_fresh(probe)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert "gpuaas.simulate.cli" in loaded and "nodescaler.cli" in loaded  # the parser was built
    assert not extras_loaded(loaded), "gpuaas --help needs an extra"

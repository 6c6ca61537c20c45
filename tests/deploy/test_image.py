"""The Dockerfile, short of a Docker engine: the wheel `pip install .` builds from what the Dockerfile copies holds
every package and data file, works outside the repository, requires no test or plot tool (those are extras, which the
image does not install), and the image's ENTRYPOINT and user are the ones the manifests and pyproject name."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from .manifests import DEPLOY, REPO, render

DOCKERFILE = REPO / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# The test and plot extras: never a requirement of the package, never in the image.
EXTRAS_ONLY = {"pytest", "pytest-timeout", "hypothesis", "matplotlib", "import-linter", "ruff", "mypy"}
PACKAGES = ("scoring", "runtime", "extender", "autoscaler", "nodescaler", "gangs", "gpuaas", "gpuaas.cluster",
            "gpuaas.pools")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def copied_sources() -> list[str]:
    return [src for word, args in instructions() if word == "COPY" and "--from" not in args
            for src in args.split()[:-1]]


def tracked_package_files() -> list[str]:
    """The files of the seven packages in git: what the image must carry (sources and data)."""
    listed = subprocess.run(["git", "ls-files", "scoring", "runtime", "extender", "autoscaler", "nodescaler", "gangs",
                             "gpuaas"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return sorted(listed)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build the wheel the way the image does, from a context holding only what the Dockerfile copies."""
    context = tmp_path_factory.mktemp("context")
    for src in copied_sources():
        path = REPO / src.rstrip("/")
        if path.is_dir():
            shutil.copytree(path, context / path.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(path, context / path.name)
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
                             "--wheel-dir", str(out), "-q"], cwd=context, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    [built] = out.glob("gpuaas-*.whl")
    return built


def test_the_wheel_holds_every_package_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in tracked_package_files() if f not in names]
    assert not missing, f"the image would lack {missing}: fix [tool.setuptools] in pyproject.toml"
    for package in PACKAGES:
        assert f"{package.replace('.', '/')}/__init__.py" in names
    assert any(n.startswith("gpuaas/pools/") and n.endswith(".yaml") for n in names)


def test_the_installed_wheel_runs_every_command_deploy_starts_outside_the_repository(wheel, tmp_path):
    # A fresh venv holding the wheel, with the test venv's packages as plain path entries: the test venv's own .pth
    # files, among them the repository's editable install, stay unread, so nothing falls back to the repository.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    [site] = (venv / "lib").glob("python3*/site-packages")
    (site / "dependencies.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target", str(site),
                    str(wheel), "-q"], check=True, capture_output=True, timeout=300)
    commands = sorted({d["spec"]["template"]["spec"]["containers"][0]["args"][0]
                       for d in render(DEPLOY / "overlays" / "all") if d["kind"] == "Deployment"
                       and d["spec"]["template"]["spec"]["containers"][0]["image"].startswith("gpuaas:")})
    assert commands == ["autoscaler", "extender", "gangs", "metrics-api", "nodescaler"]
    probe = f"""
import contextlib, importlib, io, json, sys
from gpuaas.cli import main
from gpuaas.cluster.local import builtin_pool_specs
helps = {{}}
for command in {commands!r}:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([command, "--help"])
        except SystemExit as exc:
            assert exc.code == 0, (command, exc.code)
    helps[command] = out.getvalue()
files = {{p: importlib.import_module(p).__file__ for p in {PACKAGES!r}}}
print(json.dumps({{"files": files, "pools": builtin_pool_specs(), "helps": helps}}))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert all(f.startswith(str(site)) for f in seen["files"].values()), seen["files"]
    assert {"demo", "large-200"} <= set(seen["pools"])
    assert all(f"usage: gpuaas {c}" in seen["helps"][c] for c in commands)


def test_entrypoint_is_a_console_script_pyproject_declares(wheel):
    [entrypoint] = [json.loads(args) for word, args in instructions() if word == "ENTRYPOINT"]
    assert entrypoint[0] in PYPROJECT["project"]["scripts"]
    archive = zipfile.ZipFile(wheel)
    [entry_points] = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
    scripts = archive.read(entry_points).decode()
    assert f"{entrypoint[0]} = {PYPROJECT['project']['scripts'][entrypoint[0]]}" in scripts


def test_the_image_is_python_3_11_slim_and_runs_as_the_non_root_uid_the_manifests_ask_for():
    [base] = [args for word, args in instructions() if word == "FROM"]
    assert base.startswith("python:3.11-slim")
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"
    [user] = [args for word, args in instructions() if word == "USER"]
    uid = int(user.split(":")[0])  # numeric: the kubelet cannot check runAsNonRoot against a user name
    assert uid != 0
    pods = [d["spec"]["template"]["spec"] for d in render(DEPLOY / "overlays" / "all") if d["kind"] == "Deployment"
            and d["spec"]["template"]["spec"]["containers"][0]["image"].startswith("gpuaas:")]
    assert {p["securityContext"]["runAsUser"] for p in pods} == {uid}
    assert all(p["securityContext"]["runAsNonRoot"] for p in pods)
    assert any(word == "RUN" and "pip install ." in args for word, args in instructions())


def requires_dist(wheel: Path) -> list[tuple[str, str]]:
    """(distribution name, marker) of each Requires-Dist of the wheel's METADATA; marker "" when unconditional."""
    archive = zipfile.ZipFile(wheel)
    [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    out = []
    for line in archive.read(metadata).decode().splitlines():
        if line.startswith("Requires-Dist:"):
            requirement, _, marker = line.removeprefix("Requires-Dist:").partition(";")
            name = re.match(r"\s*([A-Za-z0-9._-]+)", requirement).group(1).lower().replace("_", "-")
            out.append((name, marker.strip()))
    return out


def test_the_wheel_requires_no_test_or_plot_tool_except_as_extras(wheel):
    requires = requires_dist(wheel)
    runtime = {name for name, marker in requires if not marker}
    assert runtime, "the wheel lists no runtime dependency: METADATA not read"
    assert not runtime & EXTRAS_ONLY, f"`pip install .` (and the image) would install {sorted(runtime & EXTRAS_ONLY)}"
    extras = {name: marker for name, marker in requires if marker}
    assert extras["matplotlib"] == 'extra == "plot"'
    assert extras["pytest"] == extras["hypothesis"] == 'extra == "test"'


def pip_installs() -> list[list[str]]:
    """The arguments of every `pip install` in the Dockerfile's RUN instructions (options dropped)."""
    out = []
    for word, args in instructions():
        if word != "RUN":
            continue
        for command in re.split(r"&&|\|\||;", args):
            tokens = shlex.split(command)
            for i in range(len(tokens) - 1):
                if tokens[i].endswith("pip") and tokens[i + 1] == "install":
                    out.append([t for t in tokens[i + 2:] if not t.startswith("-")])
    return out


def test_the_image_installs_the_package_alone_without_extras():
    # Runtime dependencies only: no `.[test]`, `.[plot]` or a tool named beside the package.
    assert pip_installs() == [["."]]

"""The configuration reference is generated from the models and committed; the examples in docs/ parse."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Literal

import pytest
import yaml
from pydantic import BaseModel, Field

from autoscaler.config import load_autoscaler_config, load_metrics_api_config
from extender.config import ENV_PREFIX as EXTENDER_ENV
from extender.config import ExtenderConfig
from gangs.config import load_gangs_config
from gpuaas import configref
from gpuaas.cli import main
from nodescaler.config import load_nodescaler_config
from runtime.config import load_config
from runtime.pools import load_pool_spec

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def test_committed_reference_is_what_the_models_generate():
    committed = (DOCS / "configuration.md").read_text()
    assert committed == configref.render(), (
        f"docs/configuration.md differs from the models; regenerate it with `{configref.REGENERATE}`")


def test_check_flag_reports_a_stale_file(tmp_path, capsys):
    fresh = tmp_path / "fresh.md"
    assert main(["docs", "config", "--output", str(fresh)]) == 0
    assert main(["docs", "config", "--check", str(fresh)]) == 0
    fresh.write_text(fresh.read_text().replace("| `port` |", "| `prot` |"))
    assert main(["docs", "config", "--check", str(fresh)]) == 1
    assert configref.REGENERATE in capsys.readouterr().err


@pytest.mark.parametrize("doc", configref.config_docs(), ids=lambda d: configref.github_anchor(d.title))
def test_every_field_has_a_description(doc):
    missing = [r.path for r in configref.field_rows(doc.model) if not r.description.strip()]
    assert not missing, f"{doc.model.__name__}: add Field(description=...) to {', '.join(missing)}"


class _Inner(BaseModel):
    size: int = Field(3, ge=1, le=8, description="s")


class _Outer(BaseModel):
    mode: Literal["a", "b"] = Field("a", description="m")
    inner: _Inner = Field(_Inner(), description="i")
    items: list[_Inner] = Field(min_length=1, description="l")
    path: str | None = Field(None, pattern="^x", description="p")


def test_rows_carry_path_type_default_constraints_and_environment_variable():
    rows = {r.path: r for r in configref.field_rows(_Outer, "P_")}
    assert list(rows) == ["mode", "inner", "inner.size", "items", "items[].size", "path"]
    assert rows["mode"].type == "one of `a`, `b`" and rows["mode"].default == "`a`"
    assert rows["inner.size"].constraints == "≥ 1, ≤ 8" and rows["inner.size"].env == "P_INNER__SIZE"
    assert rows["items"].default == "**required**" and rows["items"].constraints == "at least 1 item"
    assert rows["items[].size"].env is None  # an environment variable cannot address one item of a list
    assert rows["path"].type == "string or null" and rows["path"].constraints == "matches `^x`"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "example.yaml"
    path.write_text(text)
    return path


def _manifests(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        assert doc is None or ("apiVersion" in doc and "kind" in doc), f"not a Kubernetes object: {doc!r}"


def _prometheus_rules(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert rules and all(set(r) <= {"alert", "expr", "for", "labels", "annotations"} and r["expr"] for r in rules)
    promtool = shutil.which("promtool")  # installed with Prometheus by scripts/setup.sh (Debian package prometheus)
    if promtool:
        result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


# How each kind of example is loaded: the loader the component itself uses (no environment).
EXAMPLE_LOADERS = {
    "extender": lambda p: load_config(ExtenderConfig, p, env_prefix=EXTENDER_ENV, environ={}),
    "autoscaler": load_autoscaler_config,
    "metrics-api": load_metrics_api_config,
    "nodescaler": lambda p: load_nodescaler_config(p, environ={}),
    "gangs": lambda p: load_gangs_config(p, environ={}),
    "pools": load_pool_spec,
    "kubernetes": _manifests,
    "prometheus-rules": _prometheus_rules,
}
MARKER = re.compile(r"<!--\s*config:\s*([\w-]+)\s*-->")


def yaml_examples() -> list[tuple[str, int, str | None, str]]:
    """(file, line, kind from the `<!-- config: KIND -->` line above the block, text) of every ```yaml block."""
    out = []
    for md in sorted(DOCS.glob("*.md")):
        lines = md.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() == "```yaml":
                start = i
                i += 1
                body = []
                while lines[i].strip() != "```":
                    body.append(lines[i])
                    i += 1
                above = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
                m = MARKER.search(above)
                out.append((md.name, start + 1, m.group(1) if m else None, "\n".join(body) + "\n"))
            i += 1
    return out


EXAMPLES = yaml_examples()


def test_docs_have_config_examples():
    kinds = {kind for _, _, kind, _ in EXAMPLES}
    assert {"extender", "autoscaler", "metrics-api", "nodescaler", "gangs", "pools"} <= kinds


@pytest.mark.parametrize("where,line,kind,text", EXAMPLES, ids=[f"{f}:{n}" for f, n, _, _ in EXAMPLES])
def test_yaml_example_in_docs_parses_with_its_loader(tmp_path, where, line, kind, text):
    assert kind in EXAMPLE_LOADERS, (f"docs/{where}:{line}: put `<!-- config: KIND -->` above the ```yaml block, "
                                     f"KIND one of {', '.join(EXAMPLE_LOADERS)}")
    EXAMPLE_LOADERS[kind](_write(tmp_path, text))


def test_every_environment_variable_in_the_code_is_documented():
    reference = (DOCS / "configuration.md").read_text()
    sources = [*REPO.glob("*/**/*.py"), *REPO.glob("scripts/*.sh"), *REPO.glob("bin/*"), *DOCS.glob("*.md")]
    names = set()
    for path in sources:
        top = path.relative_to(REPO).parts[0]
        if top == "tests" or top.startswith("."):
            continue
        names |= set(re.findall(r"\b(GPUAAS_[A-Z0-9_]*[A-Z0-9])\b", path.read_text(errors="replace")))
    assert names, "found no GPUAAS_ variables at all: the scan is broken"
    missing = sorted(n for n in names if f"`{n}`" not in reference)
    assert not missing, f"environment variables not in docs/configuration.md: {', '.join(missing)}"

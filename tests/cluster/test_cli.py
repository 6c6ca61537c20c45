"""`gpuaas cluster up` refuses a broken pool spec before any process starts."""
from __future__ import annotations

import subprocess
import sys

import pytest

BROKEN = {
    "unknown-field": ("pools:\n- {name: a, count: 1, gpu: {model: A100-80GB, count: 8}, gpuz: 1}\n",
                      "pools[0].gpuz: unknown field"),
    "negative-count": ("pools:\n- {name: a, count: -3}\n",
                       "pools[0].count: Input should be greater than or equal to 0"),
    "mig-does-not-fit": ("pools:\n- {name: a, count: 1, gpu: {model: H100-80GB, count: 8, mig: {7g.80gb: 2}}}\n",
                         "pools[0].gpu.mig: "),
    "not-yaml": ("pools: [\n", "not valid YAML"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_spec_is_refused_before_anything_starts(tmp_path, case):
    text, message = BROKEN[case]
    spec = tmp_path / "pools.yaml"
    spec.write_text(text)
    workdir = tmp_path / "cluster"
    result = subprocess.run([sys.executable, "-m", "gpuaas.cli", "cluster", "up", "--pools", str(spec),
                             "--dir", str(workdir)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert str(spec) in result.stderr
    assert not workdir.exists()  # no PKI, no logs, no process

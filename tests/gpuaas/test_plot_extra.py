"""matplotlib is the `plot` extra: without it every plotting path says what to install (no traceback) and does so before
it does any work. The missing module is simulated with sys.modules["matplotlib"] = None (import then fails)."""
from __future__ import annotations

import json
import sys

import pytest

from gpuaas.cli import main
from gpuaas.plotting import INSTALL_HINT, MatplotlibMissing, require_matplotlib

from .test_report import make_record

HINT = "pip install 'gpuaas[plot]'"


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_the_hint_names_the_extra():
    assert INSTALL_HINT == HINT
    require_matplotlib("anything")  # the test venv has every extra: no error


def test_require_names_what_needs_it_and_the_extra(no_matplotlib):
    with pytest.raises(MatplotlibMissing) as err:
        require_matplotlib("--plot")
    assert str(err.value) == f"--plot needs matplotlib, which is not installed (the plot extra): {HINT}"


@pytest.mark.parametrize("verb", ["packing", "autoscaling"])
def test_simulate_plot_without_matplotlib_says_what_to_install_before_simulating(tmp_path, capsys, no_matplotlib,
                                                                                 verb):
    out = tmp_path / "out.json"
    # The inputs need not exist: the plot extra is checked first, so a missing one does not cost a simulation.
    args = (["--nodes", "nodes.csv", "--pods", "pods.csv", "--policy", "fgd"] if verb == "packing"
            else ["--trace", "trace.csv", "--policy", "ours"])
    rc = main(["simulate", verb, *args, "--json", str(out), "--plot", str(tmp_path / "p.png")])
    err = capsys.readouterr().err
    assert rc == 1
    assert err == f"gpuaas simulate {verb}: --plot needs matplotlib, which is not installed (the plot extra): {HINT}\n"
    assert not out.exists() and not (tmp_path / "p.png").exists()


def test_simulate_without_plot_needs_no_matplotlib(tmp_path, no_matplotlib):
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,4,T4\n")
    pods = tmp_path / "p.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(f"s{i},500,512,1,500\n"
                                                                              for i in range(4)))
    out = tmp_path / "out.json"
    assert main(["simulate", "packing", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd",
                 "--json", str(out), "--quiet"]) == 0
    assert "allocation_ratio" in json.loads(out.read_text())


def test_report_without_matplotlib_says_what_to_install(tmp_path, capsys, no_matplotlib):
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(make_record()))
    assert main(["report", str(run_json), "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == ("gpuaas report: drawing the report's plots needs matplotlib, which is not "
                                       f"installed (the plot extra): {HINT}\n")
    assert not (tmp_path / "out" / "report.html").exists()


def test_demo_without_matplotlib_stops_before_starting_anything(tmp_path, capsys, no_matplotlib):
    assert main(["demo", "--out", str(tmp_path / "report")]) == 2
    assert capsys.readouterr().err == ("gpuaas demo: the demo's report needs matplotlib, which is not installed "
                                       f"(the plot extra): {HINT}\n")
    assert not (tmp_path / "report").exists()

"""CSV loading errors name file, line and field; the packing verb writes the documented JSON."""
import json

import pytest

from gpuaas.cli import main
from gpuaas.simulate.traces import TraceError, load_nodes, load_pods

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,4,T4\nn1,96000,393216,8,V100M32\n"
PODS = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        + "".join(f"p{i},2000,4096,1,{m},\n" for i, m in enumerate([300, 500, 1000, 800] * 3))
        + "big,8000,16384,4,1000,V100M32\ncpu,1000,1024,0,0,\n")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_maps_trace_models(tmp_path):
    nodes = load_nodes(write(tmp_path, "n.csv", NODES))
    assert [n.gpu_model for n in nodes] == ["T4", "V100-32GB"]
    pods = load_pods(write(tmp_path, "p.csv", PODS))
    assert pods[-2].allowed_models == frozenset({"V100-32GB"})
    assert pods[-1].gpus == 0


@pytest.mark.parametrize("text, message", [
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,abc,1,1,T4\n", ":2: field 'cpu_milli' must be a number, got 'abc'"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,1,T4\nn1,1,1,2,B300\n", ":3: field 'model': unknown GPU model 'B300'"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,9,T4\n", ":2: field 'gpu' is 9, at most 8"),
    ("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,\n", ":2: field 'model' is empty on a node with 2 GPUs"),
    ("sn,cpu_milli,gpu,model\nn0,1,1,T4\n", "missing column(s) memory_mib"),
])
def test_node_errors_name_row_and_field(tmp_path, text, message):
    with pytest.raises(TraceError) as info:
        load_nodes(write(tmp_path, "n.csv", text))
    assert message in str(info.value)


@pytest.mark.parametrize("row, message", [
    ("p,1000,1,1,1500,", ":2: field 'gpu_milli' must be 1..1000 when num_gpu > 0, got 1500"),
    ("p,1000,1,2,500,", ":2: field 'gpu_milli' is 500 with num_gpu=2"),
    ("p,1000,-5,1,500,", ":2: field 'memory_mib' must not be negative"),
    ("p,1000,1,1,500,V100M16|X9", ":2: field 'gpu_spec': unknown GPU model 'X9'"),
    ("p,1.5,1,1,500,", ":2: field 'cpu_milli' must be a whole number, got '1.5'"),
])
def test_pod_errors_name_row_and_field(tmp_path, row, message):
    with pytest.raises(TraceError) as info:
        load_pods(write(tmp_path, "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + row + "\n"))
    assert message in str(info.value)


def test_simulate_packing_writes_json(tmp_path):
    out = tmp_path / "out.json"
    # Small shares only (100/1000 of a GPU on 12 GPUs = 0.83% each) so every arrived point 0..130 gets a record.
    small = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(f"s{i},500,512,1,100\n" for i in range(40))
    rc = main(["simulate", "packing", "--nodes", str(write(tmp_path, "n.csv", NODES)),
               "--pods", str(write(tmp_path, "p.csv", small)), "--policy", "fgd", "--seed", "42",
               "--json", str(out), "--quiet"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data["allocation_ratio"]) == {str(k) for k in range(131)}
    # 12 GPUs, 156 pods of 100 = 15600 = 130%: all fit except what CPU/GPU cannot hold, so allocation <= 100.
    assert data["allocation_ratio"]["50"] == pytest.approx(50, abs=1)
    assert data["allocation_ratio"]["130"] <= 100
    assert {"fragmentation_ratio", "failed_pods", "wall_seconds", "decision_ms"} <= set(data)


def test_simulate_packing_bad_csv_exits_2(tmp_path, capsys):
    rc = main(["simulate", "packing", "--nodes", str(write(tmp_path, "n.csv", "sn,cpu_milli,memory_mib,gpu,model\n"
                                                                             "n0,1,1,1,Z80\n")),
               "--pods", str(write(tmp_path, "p.csv", PODS)), "--policy", "fgd", "--quiet"])
    assert rc == 2
    assert "n.csv:2: field 'model'" in capsys.readouterr().err


def test_simulate_packing_unknown_policy(tmp_path, capsys):
    rc = main(["simulate", "packing", "--nodes", str(write(tmp_path, "n.csv", NODES)),
               "--pods", str(write(tmp_path, "p.csv", PODS)), "--policy", "magic", "--quiet"])
    assert rc == 2
    assert "unknown policy magic" in capsys.readouterr().err


def test_subverbs_are_open_for_registration(monkeypatch):
    from gpuaas.simulate import cli as sim_cli

    def add(sub):
        p = sub.add_parser("dummy")
        p.set_defaults(func=lambda args: 7)

    monkeypatch.setitem(sim_cli.SUBVERBS, "dummy", add)
    assert main(["simulate", "dummy"]) == 7
    with pytest.raises(ValueError, match="already registered"):
        sim_cli.register_subverb("packing", add)

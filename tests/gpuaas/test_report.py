"""The demo's report: run record validation, summary computed from the samples, PNG plots, the HTML page, the verb."""
from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from matplotlib.image import imread

from gpuaas.cli import main
from gpuaas.report import RunRecordError, compute_summary, load_run_record, parse_run_record, write_report
from gpuaas.report.plots import COLORS, SLO_COLOR

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TIMES = [60.0 * (i + 1) for i in range(10)]  # ten samples a minute apart


def _sample(t, *, total, allocated, ready, deployments):
    return {"t": t, "nodes": ready + 1, "gpu_nodes_ready": ready, "gpus_total": total, "gpus_allocated": allocated,
            "allocation_ratio": round(allocated / total, 4), "fragmentation_ratio": 0.1 if t < 300 else 0.2,
            "pods_running": 10, "pods_pending": 1, "pods_succeeded": 2, "deployments": deployments}


def _deployment(replicas, rate, attainment, wait=1.0):
    return {"replicas": replicas, "ready": replicas, "arrival_rate": rate, "queue_depth": 3.0,
            "queue_wait_p99_s": wait, "slo_attainment": attainment}


def _gpu_nodes(free_whole: int):
    """Six whole-GPU nodes (the first `free_whole` free) and two free MIG nodes, which do not count as whole."""
    nodes = [{"name": f"a100-{i}", "pool": "a100", "gpus_total": 8.0, "gpus_allocated": 0.0 if i < free_whole else 8.0,
              "whole_gpus": 8} for i in range(6)]
    return nodes + [{"name": f"mig-{i}", "gpus_total": 8.0, "gpus_allocated": 0.0, "whole_gpus": 0} for i in range(2)]


def make_record():
    """Both runs, with summary figures easy to work out by hand (see test_summary_is_computed_from_the_samples)."""
    gpuaas_samples, default_samples = [], []
    for i, t in enumerate(TIMES):
        late = i >= 5
        deployments = {"llm-chat": _deployment(3 if late else 2, 2.0, 0.9 if late else 1.0,
                                               wait=math.nan if i == 0 else 1.0 + i / 5)}
        if late:  # a Deployment that appears halfway, only in the gpuaas run
            deployments["embed"] = _deployment(1, 6.0, 0.5, wait=None)
        gpuaas_samples.append(_sample(t, total=64.0, allocated=48.0 if late else 32.0, ready=8,
                                      deployments=deployments))
        default_samples.append(_sample(t, total=64.0, allocated=16.0, ready=10,
                                       deployments={"llm-chat": _deployment(2, 2.0, 0.8, wait=3.5)}))

    def final(free_whole):
        return {"nodes": 9, "gpus_total": 64.0, "gpus_allocated": 48.0, "pods_running": 10, "pods_pending": 1,
                "pods_succeeded": 2, "replicas": {"inference/llm-chat": 3},
                "pending": [{"pod": "training/too-big", "reason": "0/9 nodes are available: Insufficient gpu."}],
                "placements": [{"pod": "training/pretrain-0", "node": "a100-5", "gpu": "A100-80GB",
                                "request": "gpu=8"}],
                "gpu_nodes": _gpu_nodes(free_whole)}

    return {
        "version": 1, "started_at": "2026-11-21T10:00:00Z", "duration_s": 600, "speed": 10.0,
        "slo_queue_wait_s": 2.0,
        "pools": [{"name": "a100", "model": "A100-80GB", "gpus_per_node": 8, "nodes": 6, "mig": None, "group": False},
                  {"name": "mig", "model": "A100-80GB", "gpus_per_node": 8, "nodes": 2, "mig": {"1g.10gb": 7}}],
        "runs": {
            "gpuaas": {"scheduler": "gpuaas", "samples": gpuaas_samples, "final": final(3),
                       "events": [{"t": 300.5, "kind": "ScaleUp", "object": "inference/llm-chat",
                                   "message": "2 -> 3 replicas"}]},
            "default": {"scheduler": "default", "samples": default_samples, "final": final(0), "events": []},
        },
    }


def _color_pixels(png, hex_color: str, tolerance: float = 0.06) -> int:
    rgb = np.array([int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(png[:, :, :3] - rgb).max(axis=2) < tolerance).sum())


def _check_png(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    png = imread(path)
    assert png.shape[0] >= 300 and png.shape[1] >= 800
    assert len(np.unique(png[:, :, :3].reshape(-1, 3), axis=0)) > 20  # more than a blank canvas and some text
    return png


def test_summary_is_computed_from_the_samples():
    record = parse_run_record(make_record())
    ours, theirs = compute_summary(record.runs["gpuaas"]), compute_summary(record.runs["default"])
    assert ours.mean_allocation_ratio == pytest.approx((5 * 0.5 + 5 * 0.75) / 10)
    assert theirs.mean_allocation_ratio == pytest.approx(0.25)
    # llm-chat: 2 req/s over ten 60 s intervals, met 1.0 then 0.9; embed: 6 req/s over five intervals, met 0.5.
    assert ours.slo_attainment == pytest.approx((120 * (5 * 1.0 + 5 * 0.9) + 360 * 5 * 0.5) / (1200 + 1800))
    assert theirs.slo_attainment == pytest.approx(0.8)
    assert ours.gpu_node_hours == pytest.approx(8 * 540 / 3600)  # 8 nodes from the first sample to the last
    assert theirs.gpu_node_hours == pytest.approx(10 * 540 / 3600)
    assert (ours.whole_nodes_free_at_end, theirs.whole_nodes_free_at_end) == (3, 0)


def test_report_of_both_runs(tmp_path):
    page = write_report(make_record(), tmp_path / "out")
    assert page == tmp_path / "out" / "report.html"
    html = page.read_text()
    for name in ("allocation.png", "nodes.png", "replicas.png", "queue_wait.png"):
        assert f'src="{name}"' in html
        png = _check_png(tmp_path / "out" / name)
        assert _color_pixels(png, COLORS["gpuaas"]) > 100, name
        assert _color_pixels(png, COLORS["default"]) > 100, name
    assert _color_pixels(imread(tmp_path / "out" / "queue_wait.png"), SLO_COLOR) > 100  # the SLO line
    # The summary, computed from the samples (no summary recorded), side by side.
    assert "<td class=num>62.5%</td><td class=num>25.0%</td>" in html
    assert "<td class=num>68.00%</td><td class=num>80.00%</td>" in html
    assert "<td class=num>1.20</td><td class=num>1.50</td>" in html
    assert "<td class=num>3 of 6</td><td class=num>0 of 6</td>" in html
    assert "training/too-big" in html and "Insufficient gpu." in html and "a100-5" in html
    assert "2 -&gt; 3 replicas" in html
    assert "1g.10gb x7" in html
    assert "<td>whole-GPU nodes free</td><td class=num>a100-0, a100-1, a100-2</td><td class=num>none</td>" in html


def test_services_table_shows_the_demo_beside_the_simulator_and_why(tmp_path):
    record = make_record()
    record["runs"]["gpuaas"]["services"] = {
        "llm-code": {"demo": 0.7615, "demo_requests": 8092, "simulated": 0.7954, "simulated_requests": 8092,
                     "initial_replicas": 3, "command": "gpuaas simulate autoscaling --rate-windows 60,37.5,120",
                     "simulated_low": 0.769, "simulated_high": 0.8172, "replayed": 0.7615, "on_demo_gpus": 0.7909,
                     "on_demo_gpus_low": 0.7488, "on_demo_gpus_high": 0.8086, "why": "-3.39 points: <phases>",
                     "replicas": [{"pod": "llm-code-a", "listed_s": 0.0, "bound_s": 0.0, "serving_s": 0.0},
                                  {"pod": "llm-code-b", "listed_s": 29.5, "bound_s": 43.5, "serving_s": 49.5,
                                   "gone_s": 132.7}],
                     "gpus": [{"t": 0.0, "held": 3, "free": 43}, {"t": 30.0, "held": 4, "free": 3}]}}
    # a record written before the measurements: the columns read "-"
    record["runs"]["default"]["services"] = {
        "llm-code": {"demo": 0.80, "demo_requests": 10, "simulated": 0.81, "simulated_requests": 10,
                     "initial_replicas": 3,
                     "command": "gpuaas simulate autoscaling --rate-windows 60,37.5,120"}}  # the same window
    html = write_report(record, tmp_path / "out").read_text()
    row = ("<td class=num>76.15%</td><td class=num>8092</td><td class=num>79.54%</td><td class=num>8092</td>"
           "<td class=num>-3.39</td><td class=num>76.90%-81.72%</td><td class=num>76.15%</td>"
           "<td class=num>79.09% (74.88%-80.86%)</td><td class=num>3</td>")
    assert row in html
    assert "<td class=num>80.00%</td><td class=num>10</td><td class=num>81.00%</td><td class=num>10</td>" \
           "<td class=num>-1.00</td><td class=num>-</td><td class=num>-</td><td class=num>-</td>" in html
    assert "<p class=warn>gpuaas llm-code: -3.39 points: &lt;phases&gt;</p>" in html  # escaped
    assert html.count("<p class=warn>") == 1  # the default run is within 3 points: no why
    assert "--rate-windows 60,37.5,120" in html


def test_record_built_through_the_model_round_trips(tmp_path):
    """What the demo does: build the record with the model, write run.json, and the report reads it back equal."""
    record = parse_run_record(make_record())
    run_json = tmp_path / "run.json"
    run_json.write_text(record.model_dump_json(indent=1))
    assert load_run_record(run_json) == record
    assert json.loads(run_json.read_text())["started_at"] == "2026-11-21T10:00:00Z"


def test_queue_wait_far_past_the_slo_still_shows_the_slo_line(tmp_path):
    record = make_record()
    for i, s in enumerate(record["runs"]["default"]["samples"]):
        s["deployments"]["llm-chat"]["queue_wait_p99_s"] = 30.0 * i  # a backlog building to minutes
    write_report(record, tmp_path)
    png = _check_png(tmp_path / "queue_wait.png")
    red = (np.abs(png[:, :, :3] - np.array([0xd6, 0x27, 0x28]) / 255).max(axis=2) < 0.06).sum(axis=1)
    dark = (png[:, :, :3].max(axis=2) < 0.2).sum(axis=1)
    half = png.shape[0] // 2
    # The lower panel (llm-chat) goes on a log scale above the SLO: its SLO line (the row with the most red) stands
    # well clear of the panel's floor (its lowest black spine), where on a linear 0..270 s axis 2 s would sit on it.
    slo_row = half + int(np.argmax(red[half:]))
    spines = half + np.nonzero(dark[half:] > png.shape[1] // 2)[0]
    top, floor = spines.min(), spines.max()
    assert red[slo_row] > png.shape[1] // 2 and top < slo_row < floor
    assert floor - slo_row > 0.2 * (floor - top)


def test_recorded_summary_is_shown_and_checked(tmp_path):
    record = make_record()
    parsed = parse_run_record(record)
    record["runs"]["gpuaas"]["summary"] = compute_summary(parsed.runs["gpuaas"]).model_dump()
    record["runs"]["default"]["summary"] = {"mean_allocation_ratio": 0.9, "slo_attainment": 0.8012,
                                            "gpu_node_hours": 1.5, "whole_nodes_free_at_end": 2}
    html = write_report(record, tmp_path).read_text()
    assert "<td class=num>62.5%</td>" in html  # recorded and computed agree: no warning
    assert html.count("class=warn") == 2
    assert "90.0% <span class=warn>(recorded; computed from the run: 25.0%)</span>" in html
    assert "2 of 6 <span class=warn>(recorded; computed from the run: 0)</span>" in html
    assert "<td class=num>80.12%</td>" in html  # within rounding of the computed 80.00%: shown as recorded


def test_recorded_figure_that_cannot_be_checked_is_marked(tmp_path):
    record = make_record()
    del record["runs"]["gpuaas"]["final"]["gpu_nodes"]
    record["runs"]["gpuaas"]["summary"] = {"whole_nodes_free_at_end": 4}
    html = write_report(record, tmp_path).read_text()
    assert "4 <span class=note>(as recorded; not in the samples to check)</span>" in html


def test_only_gpuaas_with_no_samples(tmp_path):
    record = make_record()
    del record["runs"]["default"]
    record["runs"]["gpuaas"] = {"scheduler": "gpuaas", "samples": []}
    html = write_report(record, tmp_path).read_text()
    assert not list(tmp_path.glob("*.png"))
    assert "No samples were recorded" in html
    assert "no run with kube-scheduler's default scoring" in html
    assert "not recorded" in html  # no final state
    assert html.count("n/a") == 4


def test_only_gpuaas_without_deployments(tmp_path):
    record = make_record()
    del record["runs"]["default"]
    for s in record["runs"]["gpuaas"]["samples"]:
        s["deployments"] = {}
        s["fragmentation_ratio"] = None
    write_report(record, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["allocation.png", "nodes.png"]
    png = _check_png(tmp_path / "allocation.png")
    assert _color_pixels(png, COLORS["gpuaas"]) > 100 and _color_pixels(png, COLORS["default"]) == 0


def test_text_from_the_cluster_is_escaped(tmp_path):
    record = make_record()
    final = record["runs"]["gpuaas"]["final"]
    final["pending"][0]["reason"] = "<script>alert('x')</script> & more"
    final["placements"][0]["node"] = '"><img src=x onerror=alert(1)>'
    record["runs"]["gpuaas"]["events"][0]["object"] = "inference/<b>bold</b>"
    for s in record["runs"]["gpuaas"]["samples"]:
        s["deployments"] = {"<i>chat</i>": s["deployments"]["llm-chat"]}
    html = write_report(record, tmp_path).read_text()
    assert "<script>" not in html and "<b>" not in html and "<i>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in html
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    assert "inference/&lt;b&gt;bold&lt;/b&gt;" in html


@pytest.mark.parametrize("change,message", [
    (lambda r: r["runs"]["gpuaas"]["samples"][3].update(gpus_allocated="32"),
     "runs.gpuaas.samples.3.gpus_allocated: Input should be a valid number"),
    (lambda r: r["runs"]["gpuaas"]["samples"][3].update(gpus_alocated=32.0),
     "runs.gpuaas.samples.3.gpus_alocated: unknown field"),
    (lambda r: r["runs"]["gpuaas"]["samples"][3].update(allocation_ratio=0.9),
     "runs.gpuaas.samples.3: allocation_ratio 0.9 is not gpus_allocated / gpus_total (0.5000)"),
    (lambda r: r["runs"]["gpuaas"]["samples"][3]["deployments"]["llm-chat"].update(slo_attainment=1.5),
     "runs.gpuaas.samples.3.deployments.llm-chat.slo_attainment: Input should be less than or equal to 1"),
    (lambda r: r["runs"]["gpuaas"]["samples"][3].update(t=1.0),
     "samples[3].t 1 is before samples[2].t 180"),
    (lambda r: r["runs"]["default"].update(scheduler="gpuaas"), "runs.default.scheduler is 'gpuaas'"),
    (lambda r: r["runs"].update(kube={"scheduler": "default"}),
     "runs.kube.[key]: Input should be 'gpuaas' or 'default'"),
    (lambda r: r["runs"]["gpuaas"]["final"]["pending"][0].pop("reason"),
     "runs.gpuaas.final.pending.0.reason: Field required"),
    (lambda r: r.update(slo_queue_wait_s=0), "slo_queue_wait_s: Input should be greater than 0"),
    (lambda r: r.pop("started_at"), "started_at: Field required"),
])
def test_malformed_record_names_the_field(tmp_path, change, message):
    record = copy.deepcopy(make_record())
    change(record)
    with pytest.raises(RunRecordError) as err:
        write_report(record, tmp_path)
    assert message in str(err.value)
    assert not (tmp_path / "report.html").exists()


def test_report_verb(tmp_path, capsys):
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(make_record()))  # NaN is written as NaN, as json.dumps does by default
    assert main(["report", str(run_json), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out" / "report.html")
    assert "<td class=num>62.5%</td>" in (tmp_path / "out" / "report.html").read_text()
    assert main(["report", str(run_json)]) == 0  # default: beside the record
    assert (tmp_path / "report.html").exists() and (tmp_path / "allocation.png").exists()


@pytest.mark.parametrize("text,message", [
    ('{"version": 2}', "version: Input should be 1"),
    ("[1, 2]", "expected a JSON object, got list"),
    ("{", "not valid JSON"),
])
def test_report_verb_refuses_a_bad_file(tmp_path, capsys, text, message):
    run_json = tmp_path / "run.json"
    run_json.write_text(text)
    assert main(["report", str(run_json)]) == 2
    err = capsys.readouterr().err
    assert str(run_json) in err and message in err
    assert not (tmp_path / "report.html").exists()


def test_report_verb_names_a_missing_file(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: No such file or directory" in capsys.readouterr().err

"""The demo's timeline: the same for every scheduler compared, scaled to the run, finite jobs done before the end; the
trace in compressed time; the components' configs valid."""
from __future__ import annotations

import itertools

import pytest

from autoscaler.config import AutoscalerConfig
from gpuaas.cluster.local import resolve_pool_spec
from gpuaas.cluster.stages import COMPLETE_AFTER_ANNOTATION
from gpuaas.demo.sampling import go_duration
from gpuaas.demo.stack import autoscaler_config, nodescaler_config
from gpuaas.demo.timeline import (
    FINITE_END,
    GANG_LABEL,
    INFERENCE,
    InferenceService,
    build_timeline,
    service_arrivals,
    service_model,
    timeline_workload,
)
from gpuaas.loadgen.serving import ServiceModel
from gpuaas.loadgen.trace import Arrival
from nodescaler.config import NodeScalerConfig
from scoring.kubeobjects import pod_demand


def pods(subs):
    return [o for s in subs for o in s.objects]


def test_same_arguments_same_timeline_and_every_name_once():
    a, b = build_timeline(60, seed=3), build_timeline(60, seed=3)
    assert a == b
    names = [p["metadata"]["name"] for p in pods(a)]
    assert len(names) == len(set(names))
    assert [s.at_s for s in a] == sorted(s.at_s for s in a)
    assert build_timeline(60, seed=4) != a  # the seed drives the job stream


def test_scaled_to_the_duration():
    short, long = build_timeline(60), build_timeline(300)
    assert [s.name for s in short] == [s.name for s in long]
    for s, s_long in zip(short, long, strict=True):
        assert s_long.at_s == pytest.approx(5 * s.at_s)
    assert max(s.at_s for s in long) <= 0.75 * 300


@pytest.mark.parametrize("duration", [30, 60, 300])
def test_finite_jobs_end_before_the_run_does(duration):
    for sub in build_timeline(duration):
        for pod in sub.objects:
            delay = pod["metadata"]["annotations"].get(COMPLETE_AFTER_ANNOTATION)
            if delay:
                assert sub.at_s + go_duration(delay) <= FINITE_END * duration + 1, sub.name
                assert pod["spec"]["restartPolicy"] == "Never"


def test_the_mix():
    subs = build_timeline(300)
    kinds = {s.name: s for s in subs}
    gangs = [s for s in subs if s.kind == "gang"]
    assert {g.name for g in gangs} == {"pretrain", "finetune", "sweep", "rl"}
    for g in gangs:
        assert len(g.objects) > 1 and all(p["metadata"]["labels"][GANG_LABEL] == g.name for p in g.objects)
        assert all(pod_demand(p).gpus > 1 for p in g.objects)
    mig = [p for p in pods(subs) if pod_demand(p).mig_profile]
    assert len(mig) >= 6
    assert pod_demand(kinds["too-big"].objects[0]).gpus == 16
    # The burst, with the pre-training gang and the inference services' floor, needs more whole GPUs than the fleet's
    # fixed pools have: the node group must grow.
    fleet = sum(p.count * p.gpu.count for p in resolve_pool_spec("demo").pools
                if p.gpu and not p.gpu.mig and p.autoscale is None)
    burst = sum(pod_demand(p).gpus for s in subs if s.name.startswith("batch-") for p in s.objects)
    pretrain = sum(pod_demand(p).gpus for p in kinds["pretrain"].objects)
    assert burst + pretrain + sum(s.min_replicas for s in INFERENCE) > fleet


def test_workload_is_the_whole_gpu_shapes_a_node_can_hold():
    subs = build_timeline(60)
    workload = timeline_workload(subs)
    sizes = {s.gpus for s in workload.shapes}
    assert sizes == {1, 2, 4, 8}  # MIG pods and the 16-GPU pod are left out
    assert workload.popularity.sum() == pytest.approx(1.0)


def test_service_arrivals_rotate_scale_and_compress():
    trace = [Arrival(float(t), 1000, 10) for t in range(100)]  # one request a second for 100 s
    svc = InferenceService("s", rate_scale=2, offset_s=30.0)
    out = service_arrivals(trace, svc, speed=10, duration_s=5)
    # From trace second 30 on, two copies per second (at s and s + 0.5), at a tenth of the wall time, up to 5 wall
    # seconds: trace seconds 30..80, the last one's second copy past the end.
    assert len(out) == 2 * 51 - 1
    assert out[0].t == 0.0 and out[-1].t <= 5
    assert all(b.t >= a.t for a, b in itertools.pairwise(out))
    whole = service_arrivals(trace, InferenceService("s", 1, 30.0), speed=1, duration_s=1000)
    assert len(whole) == 100  # the trace wraps around
    with pytest.raises(ValueError):
        service_arrivals(trace, svc, speed=0, duration_s=5)


def test_service_model_runs_trace_time_faster():
    base, fast = ServiceModel(), service_model(10)
    assert fast.service_time(5000, 20) == pytest.approx(base.service_time(5000, 20) / 10)
    assert fast.cold_start_s == pytest.approx(base.cold_start_s / 10)
    assert fast.slo_queue_wait_s == pytest.approx(base.slo_queue_wait_s / 10)
    assert fast.concurrency == base.concurrency and fast.max_waiting == base.max_waiting


@pytest.mark.parametrize("speed", [1, 10, 60])
def test_component_configs_are_valid(speed):
    config = AutoscalerConfig.model_validate(autoscaler_config("http://127.0.0.1:9090", speed))
    assert {t.deployment for t in config.targets} == {s.name for s in INFERENCE}
    assert config.interval_s >= 1
    nodes = NodeScalerConfig.model_validate(nodescaler_config(resolve_pool_spec("demo"), 60.0))
    assert [g.name for g in nodes.groups] == ["a100-burst"]
    assert nodes.groups[0].max_size == 4 and nodes.groups[0].min_size == 0


def test_no_node_group_no_nodescaler(tmp_path):
    spec = tmp_path / "p.yaml"
    spec.write_text("pools:\n- {name: a, count: 1, gpu: {model: A100-80GB, count: 8}}\n")
    assert nodescaler_config(resolve_pool_spec(str(spec)), 60.0) is None


def test_bad_duration_is_refused():
    with pytest.raises(ValueError, match="positive"):
        build_timeline(0)

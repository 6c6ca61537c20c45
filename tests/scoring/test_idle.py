"""scoring/idle.py: which workloads hold GPUs they do not use, worked out by hand per case."""
from __future__ import annotations

import datetime as dt

import pytest

from scoring.idle import (
    IdleReport,
    Workload,
    find_idle,
    owner_lookups,
    pod_gpus,
    pod_utilization,
    resolve_workload,
)

NOW = 1_800_000_000.0


def started(ago_s: float) -> str:
    return dt.datetime.fromtimestamp(NOW - ago_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, *, ns: str = "ml", gpus: int | None = 1, owner: tuple[str, str] | None = None, age_s: float = 7200,
        phase: str = "Running", node: str = "n1", mig: str | None = None) -> dict:
    requests = {}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    if mig:
        requests[mig] = "1"
    meta: dict = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1" if owner[0] == "ReplicaSet" else "batch/v1",
                                    "kind": owner[0], "name": owner[1], "uid": f"uid-{owner[1]}", "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
        "requests": requests, "limits": requests}}]}, "status": {"phase": phase, "startTime": started(age_s)}}


def controlled_by(kind: str, name: str) -> dict:
    return {"ownerReferences": [{"apiVersion": "apps/v1" if kind == "Deployment" else "batch/v1", "kind": kind,
                                 "name": name, "uid": f"uid-{name}", "controller": True}]}


def test_owners_resolve_replicaset_to_deployment_and_job_to_cronjob():
    pods = [pod("a", owner=("ReplicaSet", "web-5d8")), pod("b", owner=("Job", "nightly-29")),
            pod("c", owner=("Job", "once")), pod("d"), pod("e", owner=("StatefulSet", "db"))]
    assert owner_lookups(pods) == {("ReplicaSet", "ml", "web-5d8"), ("Job", "ml", "nightly-29"),
                                   ("Job", "ml", "once")}
    owners = {("ReplicaSet", "ml", "web-5d8"): controlled_by("Deployment", "web"),
              ("Job", "ml", "nightly-29"): controlled_by("CronJob", "nightly"),
              ("Job", "ml", "once"): {}}
    assert [resolve_workload(p, owners) for p in pods] == [
        Workload("ml", "Deployment", "web"), Workload("ml", "CronJob", "nightly"), Workload("ml", "Job", "once"),
        Workload("ml", "Pod", "d"), Workload("ml", "StatefulSet", "db")]
    # a ReplicaSet that could not be read: the ReplicaSet is the workload
    assert resolve_workload(pods[0], {}) == Workload("ml", "ReplicaSet", "web-5d8")
    assert resolve_workload(pods[0], owners).ref()["apiVersion"] == "apps/v1"


def test_gpus_count_whole_gpus_and_mig_slices():
    assert pod_gpus(pod("a", gpus=4)) == 4
    # 3g.40gb: 3 of an A100's 7 compute slices
    assert pod_gpus(pod("b", gpus=None, mig="nvidia.com/mig-3g.40gb")) == pytest.approx(3 / 7)
    assert pod_gpus(pod("c", gpus=None)) == 0


def test_utilization_is_the_larger_of_the_two_signals_clipped():
    util = pod_utilization({("ml", "a"): 40.0, ("ml", "b"): 2.0, ("ml", "c"): float("nan")},
                           {("ml", "a"): 0.1, ("ml", "b"): 0.3, ("ml", "d"): 1.7})
    # a: max(40/100, 0.1) = 0.4; b: max(0.02, 0.3); c: NaN dropped; d: clipped to 1
    assert util == {("ml", "a"): 0.4, ("ml", "b"): 0.3, ("ml", "d"): 1.0}


def test_idle_workloads_their_gpu_hours_and_what_is_not_judged():
    pods = [
        pod("web-1", owner=("ReplicaSet", "web-5d8"), gpus=1),
        pod("web-2", owner=("ReplicaSet", "web-5d8"), gpus=1),
        pod("train-x", owner=("Job", "train"), gpus=4, age_s=1800),
        pod("notebook", gpus=2),
        pod("fresh", gpus=1, age_s=60),
        pod("dark", gpus=1),
        pod("done", gpus=8, phase="Succeeded"),
        pod("cpu-only", gpus=None),
    ]
    owners = {("ReplicaSet", "ml", "web-5d8"): controlled_by("Deployment", "web"), ("Job", "ml", "train"): {}}
    util = {("ml", "web-1"): 0.9, ("ml", "web-2"): 0.01, ("ml", "train-x"): 0.02, ("ml", "notebook"): 0.0,
            ("ml", "fresh"): 0.0, ("ml", "done"): 0.0, ("ml", "cpu-only"): 0.0}
    report = find_idle(pods, owners, util, now=NOW, threshold=0.05, window_s=3600, min_age_s=600)
    assert isinstance(report, IdleReport)
    by_name = {w.workload.name: w for w in report.workloads}
    # web: (1 x 0.9 + 1 x 0.01) / 2 = 0.455: busy although one replica idles (the workload is judged as a whole)
    assert not by_name["web"].idle and by_name["web"].utilization == pytest.approx(0.455)
    # train: 4 GPUs at 2 % for the 30 minutes it has run: 4 x 0.5 h = 2 GPU-hours
    assert by_name["train"].idle and by_name["train"].gpu_hours == pytest.approx(2.0)
    # notebook: 2 GPUs, older than the window: 2 x 1 h
    assert by_name["notebook"].idle and by_name["notebook"].gpu_hours == pytest.approx(2.0)
    assert [w.workload.name for w in report.idle] == ["train", "notebook"]  # equal GPU-hours: by namespace, kind
    assert report.idle_gpu_hours == pytest.approx(4.0)
    assert [u.pod for _, u in report.unmeasured] == ["dark"]
    assert [u.pod for _, u in report.too_new] == ["fresh"]
    assert "done" not in by_name and "cpu-only" not in by_name


def test_threshold_is_strict_and_bad_parameters_are_refused():
    pods = [pod("a")]
    at = find_idle(pods, {}, {("ml", "a"): 0.05}, now=NOW, threshold=0.05, window_s=3600, min_age_s=0)
    assert at.idle == ()  # 5 % is not below 5 %
    with pytest.raises(ValueError, match=r"threshold must be within 0\.\.1"):
        find_idle(pods, {}, {}, now=NOW, threshold=5, window_s=3600, min_age_s=0)
    with pytest.raises(ValueError, match="window must be > 0"):
        find_idle(pods, {}, {}, now=NOW, threshold=0.05, window_s=0, min_age_s=0)

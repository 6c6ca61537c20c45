"""Scale-out for gangs gpuaas holds whole (scoring/gangs.py): capacity for every member or for none, and gated
members are not counted as pending pods one by one."""
from __future__ import annotations

from nodescaler.scaleout import plan_scale_out
from nodescaler.snapshot import build_snapshot
from scoring.gangs import GANG_GATE, KUEUE_GATE, RELEASED_ANNOTATION

from .builders import T0, config, nodes, pending, pod


def member(name: str, gang: str = "train", size: int = 4, gpus: int = 8, gates=(GANG_GATE,), **kw) -> dict:
    p = pod(name, gpus=gpus, labels={"gpuaas.io/gang": gang}, annotations={"gpuaas.io/gang-size": str(size)}, **kw)
    p["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    return p


def plan(node_objs, pod_objs, cfg=None):
    return plan_scale_out(build_snapshot(node_objs, pod_objs, [], T0), cfg or config())


def test_a_waiting_gang_grows_capacity_for_all_of_its_members():
    # 4 x 8 GPUs, one free 8-GPU node: three new a100x8 nodes, not four and not one per pod as it fails.
    out = plan(nodes("a100", 1), [member(f"w{i}") for i in range(4)])
    assert [(g.group, g.count) for g in out.grows] == [("a100x8", 3)]
    assert out.unplaceable == {}


def test_a_gang_no_group_can_grow_for_whole_grows_nothing():
    small = config([{"name": "a100x8", "template": {"gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128",
                                                    "memory": "1Ti"}, "max_size": 2, "cost_per_hour": 20}])
    out = plan([], [member(f"w{i}") for i in range(4)], small)
    assert out.grows == []
    assert all("cannot be grown for whole" in why for why in out.unplaceable.values())
    assert len(out.unplaceable) == 4


def test_a_gang_that_fits_now_is_left_to_the_gang_controller():
    out = plan(nodes("a100", 4), [member(f"w{i}") for i in range(4)])
    assert out.grows == [] and len(out.fit_now) == 4


def test_gangs_another_component_holds_or_already_released_are_not_grown_for():
    kueue = [member(f"k{i}", gang="k", gates=(GANG_GATE, KUEUE_GATE)) for i in range(4)]
    released = [member(f"r{i}", gang="r", gates=()) for i in range(4)]
    for p in released:
        p["metadata"]["annotations"][RELEASED_ANNOTATION] = "1"
    assert plan([], kueue + released).grows == []


def test_gangs_and_pending_pods_share_the_new_capacity_without_double_counting():
    out = plan([], [pending("p", gpus=8), *[member(f"w{i}", size=2) for i in range(2)]])
    assert [(g.group, g.count) for g in out.grows] == [("a100x8", 3)]

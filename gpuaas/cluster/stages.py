"""The kwok configuration: how fake nodes and pods move through their lifecycle.

kwok's own Stage documents (shipped in its Go module, copied beside the binary by setup) are used as they are, except
pod completion: kwok's stock `pod-complete` finishes only Job pods. Ours finishes any pod that carries the annotation
`pod-complete.stage.kwok.x-k8s.io/delay` (a Go duration such as "5s" or an RFC 3339 time), after that delay, and
leaves every other pod Running until it is deleted. Deletion honours the grace period (`pod-delete` waits at most
until the pod's deletionTimestamp).
"""
from __future__ import annotations

from pathlib import Path

import yaml

COMPLETE_AFTER_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"

# (folder under kwok's kustomize/stage, file) of the stock stages used unchanged.
STOCK_STAGES = (
    ("node/fast", "node-initialize.yaml"),
    ("node/heartbeat-with-lease", "node-heartbeat-with-lease.yaml"),
    ("pod/fast", "pod-ready.yaml"),
    ("pod/general", "pod-delete.yaml"),
)

KWOK_OPTIONS = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
    "kind": "KwokConfiguration",
    # Defaults are 4 workers each; bursts of hundreds of pods and a thousand node leases want more.
    "options": {"podPlayStageParallelism": 16, "nodePlayStageParallelism": 16, "nodeLeaseParallelism": 16},
}


def pod_complete_stage(stock: dict) -> dict:
    """kwok's general pod-complete stage, selecting annotated pods of any owner instead of Job pods only."""
    stage = yaml.safe_load(yaml.safe_dump(stock))  # deep copy
    stage["metadata"]["name"] = "pod-complete-after-delay"
    exprs = [e for e in stage["spec"]["selector"]["matchExpressions"] if ".ownerReferences" not in e["key"]]
    exprs.append({"key": f'.metadata.annotations["{COMPLETE_AFTER_ANNOTATION}"]', "operator": "Exists"})
    stage["spec"]["selector"]["matchExpressions"] = exprs
    # Complete at the annotated time, not at a random point up to 5 s later.
    stage["spec"]["delay"].pop("jitterDurationMilliseconds", None)
    return stage


def kwok_documents(stages_dir: Path) -> list[dict]:
    if not stages_dir.is_dir():
        raise FileNotFoundError(f"kwok stage folder {stages_dir} is missing: run scripts/setup.sh")
    docs: list[dict] = [KWOK_OPTIONS]
    for folder, name in STOCK_STAGES:
        docs.append(yaml.safe_load((stages_dir / folder / name).read_text()))
    docs.append(pod_complete_stage(yaml.safe_load((stages_dir / "pod/general/pod-complete.yaml").read_text())))
    return docs


def write_kwok_config(path: Path, stages_dir: Path) -> Path:
    path.write_text(yaml.safe_dump_all(kwok_documents(stages_dir), sort_keys=False))
    return path

from gpuaas.cluster.stages import COMPLETE_AFTER_ANNOTATION, pod_complete_stage

STOCK = {
    "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": "pod-complete"},
    "spec": {
        "selector": {"matchExpressions": [
            {"key": ".status.phase", "operator": "In", "values": ["Running"]},
            {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]},
        ]},
        "delay": {"durationMilliseconds": 1000, "jitterDurationMilliseconds": 5000},
    },
}


def test_pod_complete_selects_annotated_pods_of_any_owner_without_jitter():
    stage = pod_complete_stage(STOCK)
    keys = [e["key"] for e in stage["spec"]["selector"]["matchExpressions"]]
    assert ".metadata.ownerReferences.[].kind" not in keys
    assert f'.metadata.annotations["{COMPLETE_AFTER_ANNOTATION}"]' in keys
    assert "jitterDurationMilliseconds" not in stage["spec"]["delay"]
    assert STOCK["spec"]["delay"]["jitterDurationMilliseconds"] == 5000  # the stock document is not modified

"""Reading Nodes and Pods into the model; nodes made by the cluster harness read back as what the pool spec said."""
from __future__ import annotations

import math
import re
import sys
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaas.workloads import gpu_pod, pod_for_demand
from runtime.pools import node_objects, parse_pool_spec
from scoring.kubeobjects import (
    ObjectError,
    assigned_devices,
    node_spec,
    parse_quantity,
    pod_demand,
    pod_requests,
    requests_gpu,
)
from scoring.model import PodDemand
from scoring.names import InvalidName, dns1123_label, dns1123_subdomain


@pytest.mark.parametrize("text,value", [("500m", "0.5"), ("2", "2"), ("1Gi", str(2**30)), ("1.5k", "1500"),
                                        ("100Mi", str(100 * 2**20)), (4, "4")])
def test_quantities(text, value):
    assert parse_quantity(text) == parse_quantity(value)


def pool_node(**gpu):
    return node_objects(parse_pool_spec({"pools": [{"name": "p", "count": 1, "cpu": "96", "memory": "1Ti",
                                                     "gpu": gpu}]}).pools[0])[0]


def test_whole_gpu_node_round_trip():
    spec = node_spec(pool_node(model="H100-80GB", count=8, topology={"nvlinkDomain": 8, "numaNode": 4}))
    assert (spec.name, spec.gpus, spec.gpu_model, spec.node_group) == ("p-0000", 8, "H100-80GB", "p")
    assert spec.cpu_milli == 96_000 and spec.memory_mib == 2**20
    assert spec.gpu_blocks == (0, 0, 0, 0, 1, 1, 1, 1)  # one NVSwitch domain, two NUMA halves
    assert spec.mig_layouts is None


def test_mixed_strategy_mig_node_round_trip():
    # 6 of 8 GPUs in all-balanced (2 x 1g.10gb, 1 x 2g.20gb, 1 x 3g.40gb each); 2 whole GPUs.
    spec = node_spec(pool_node(model="A100-80GB", count=8, mig="all-balanced", migGPUs=6))
    assert spec.gpus == 8
    assert spec.mig_layouts[:2] == (None, None)
    assert all(layout == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1} for layout in spec.mig_layouts[2:])


def test_unknown_product_is_named():
    node = pool_node(model="A100-80GB", count=8)
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-Z9000"
    with pytest.raises(KeyError, match="NVIDIA-Z9000"):
        node_spec(node)


def test_whole_gpu_pod():
    demand = pod_demand(gpu_pod("train", "ml", gpus=4, cpu="8", memory="32Gi"))
    assert (demand.gpus, demand.gpu_milli, demand.cpu_milli, demand.memory_mib) == (4, 1000, 8000, 32768)
    assert demand.name == "ml/train"


def test_mig_pod_and_model_constraint():
    pod = gpu_pod("infer", mig="3g.40gb")
    pod["metadata"]["annotations"] = {"gpuaas.io/gpu-models": "NVIDIA-A100-SXM4-80GB, H100-80GB"}
    demand = pod_demand(pod)
    assert demand.mig_profile == "3g.40gb" and demand.gpus == 1
    assert demand.allowed_models == {"A100-80GB", "H100-80GB"}


def test_shared_gpu_pod():
    pod = gpu_pod("notebook")
    pod["spec"]["containers"][0]["resources"]["limits"]["gpuaas.io/gpu-share"] = "250"
    demand = pod_demand(pod)
    assert (demand.gpus, demand.gpu_milli, demand.is_share) == (1, 250, True)
    assert requests_gpu(pod)


def test_init_containers_count_as_the_scheduler_counts_them():
    pod = gpu_pod("p", cpu="1")
    pod["spec"]["initContainers"] = [
        {"name": "warmup", "resources": {"requests": {"cpu": "3"}}},                  # runs alone: max(3, 1+0)
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},  # sidecar: adds
    ]
    # max(app 1 + sidecar 0.5, warmup 3 + the sidecars started before it, 0) = 3
    assert pod_requests(pod)["cpu"] == parse_quantity("3")
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "4"
    assert pod_requests(pod)["cpu"] == parse_quantity("4.5")  # max(4 + 0.5, 3)


@pytest.mark.parametrize("mutate,message", [
    (lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/mig-1g.10gb": "1"}),
     "more than one kind of GPU"),
    (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update({"nvidia.com/gpu": "two"}),
     "'two' is not a Kubernetes quantity"),
    (lambda p: p["metadata"].update(annotations={"gpuaas.io/gpu-models": "Z9000"}), "gpuaas.io/gpu-models"),
])
def test_bad_pods_are_refused_naming_the_field(mutate, message):
    pod = gpu_pod("bad", "ns", gpus=1)
    mutate(pod)
    with pytest.raises((ObjectError, KeyError), match=message):
        pod_demand(pod)


def test_device_annotation():
    pod = gpu_pod("p", gpus=2)
    assert assigned_devices(pod) is None
    pod["metadata"]["annotations"]["gpuaas.io/devices"] = "4,5"
    assert assigned_devices(pod) == (4, 5)
    pod["metadata"]["annotations"]["gpuaas.io/devices"] = "four"
    with pytest.raises(ObjectError, match=re.escape("gpuaas.io/devices")):
        assigned_devices(pod)


@pytest.mark.parametrize("demand", [
    PodDemand(cpu_milli=6000, memory_mib=12288, gpus=2, gpu_milli=1000, name="ml/a"),
    PodDemand(cpu_milli=500, memory_mib=1024, gpus=1, gpu_milli=460, allowed_models=frozenset({"T4", "A10"}),
              name="ml/b"),
    PodDemand(cpu_milli=1000, memory_mib=2048, gpus=1, gpu_milli=1000, mig_profile="2g.20gb", name="ml/c"),
    PodDemand(cpu_milli=16000, memory_mib=65536, name="ml/d"),
])
def test_pod_for_demand_reads_back_as_the_same_demand(demand):
    assert pod_demand(pod_for_demand(demand.name.split("/")[1], "ml", demand)) == demand


def test_node_selector_and_affinity_on_the_product_label_narrow_the_models():
    pod = gpu_pod("p", gpus=1)
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod_demand(pod).allowed_models == {"H100-80GB"}
    pod["metadata"]["annotations"] = {"gpuaas.io/gpu-models": "A100-80GB,H100-80GB"}
    assert pod_demand(pod).allowed_models == {"H100-80GB"}  # both constraints hold: their intersection
    del pod["spec"]["nodeSelector"]
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                                     "values": ["NVIDIA-A100-SXM4-80GB"]}]}]}}}
    assert pod_demand(pod).allowed_models == {"A100-80GB"}
    # A second term without a product constraint allows any model: the affinity no longer narrows.
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"].append({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]})
    assert pod_demand(pod).allowed_models == {"A100-80GB", "H100-80GB"}


def test_time_sliced_node_counts_physical_gpus():
    node = pool_node(model="A100-80GB", count=4)
    node["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "4"
    for key in ("capacity", "allocatable"):
        node["status"][key]["nvidia.com/gpu"] = "16"  # the device plugin advertises replicas
    assert node_spec(node).gpus == 4


def test_a_node_whose_device_plugin_has_not_registered_offers_no_gpus():
    node = pool_node(model="H100-80GB", count=8)
    for key in ("capacity", "allocatable"):
        node["status"][key]["nvidia.com/gpu"] = "0"
    assert node_spec(node).gpus == 0


# -- quantities as resource.ParseQuantity reads them (k8s.io/apimachinery/pkg/api/resource/quantity.go) --------------

MAX = 2**63 - 1


@pytest.mark.parametrize("text,value", [
    ("1.5Ki", "1536"), ("1e3", "1000"), ("1E3", "1000"), ("1e+3", "1000"), ("12e-3", "0.012"), ("1E", "1e18"),
    (" 2 ", "2"),                      # the JSON decoder trims spaces before parsing
    ("+", "0"), ("-", "0"), (".", "0"), ("00", "0"), ("-0", "0"),  # Go's scanner: a sign or a dot alone is 0
    ("1.", "1"), (".5", "0.5"), ("0.9n", "1e-9"), ("-0.9n", "-1e-9"),  # finer than a billionth rounds away from 0
    ("0." + "0" * 4990 + "1", "1e-9"), ("1" + "0" * 18 + "e-9", "1e9"),
    ("8Ei", str(MAX)), ("9" * 30 + "Ki", str(MAX)),  # binary SI is capped at 2^63-1, silently, as Go does
    ("1e4294967296", "1"),             # Go keeps the exponent as an int32: 2^32 wraps to 0
    ("9223372036854775807", str(MAX)), (1.5, "1.5"), (3, "3"),
])
def test_quantities_read_as_kubernetes_reads_them(text, value):
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize("text,message", [
    ("1_000", "expected <sign><digits>"), ("Infinity", "expected"), ("NaN", "expected"), ("inf", "expected"),
    ("", "expected"), ("1e", "unknown suffix 'e'"), ("1ki", "unknown suffix 'ki'"), ("1.2.3", "expected"),
    ("5m5", "unknown suffix 'm5'"), ("1\x1c", "expected"), ("\u0661", "expected"), ("1e99999999999999999999", "int64"),
    ("1e999999999", "larger than 9223372036854775807"), ("9" * 5000, "larger than"),
    ("9223372036854775808", "larger than"), ("-1e19", "larger than"),
    (True, "got bool"), (None, "got NoneType"), (float("inf"), "got float"), ({"x": 1}, "got dict"),
])
def test_quantities_kubernetes_rejects_or_no_int64_holds_are_refused(text, message):
    with pytest.raises(ObjectError, match=re.escape(message)):
        parse_quantity(text, "q")


GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028" \
           "\u2029\u202f\u205f\u3000"


def reference_quantity(text: str) -> Fraction | None:
    """An independent reading of quantity.go: parseQuantityString's scanner, the suffixer, then the value as a
    fraction rounded away from zero to a billionth (binary SI capped at 2^63-1); None where Go errs or where the
    decimal value is past 2^63-1 (gpuaas refuses those). Exponents here stay small enough for exact fractions."""
    s = text.strip(GO_SPACE)
    if not s:
        return None
    pos, negative = 0, False
    if s[0] in "+-":
        negative, pos = s[0] == "-", 1
    digits = "0123456789"
    start = pos
    while pos < len(s) and s[pos] in digits:
        pos += 1
    num, denom = s[start:pos], ""
    if pos < len(s) and s[pos] == ".":
        pos += 1
        start = pos
        while pos < len(s) and s[pos] in digits:
            pos += 1
        denom = s[start:pos]
    suffix = s[pos:]
    rest = suffix.lstrip("eEinumkKMGTP")
    rest = rest[1:] if rest[:1] in ("+", "-") else rest
    if any(c not in digits for c in rest):
        return None
    decimal_si = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
    binary_si = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
    if suffix in decimal_si:
        base, exp = 10, decimal_si[suffix]
    elif suffix in binary_si:
        base, exp = 2, binary_si[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE":
        body = suffix[1:].lstrip("+-") if suffix[1:2] in ("+", "-") else suffix[1:]
        if not body or len(suffix[1:]) - len(body) > 1 or any(c not in digits for c in body):
            return None
        exp = int(suffix[1:])
        if not -2**63 <= exp < 2**63:
            return None
        base, exp = 10, (exp + 2**31) % 2**32 - 2**31
    else:
        return None
    value = Fraction(int(num + denom or "0"), 10 ** len(denom)) * Fraction(base) ** exp
    nanos = math.ceil(value * 10**9)
    if base == 2:
        nanos = min(nanos, MAX * 10**9)
    elif nanos > MAX * 10**9:
        return None
    return Fraction(-nanos if negative else nanos, 10**9)


QUANTITY_CHARS = "0123456789.+-eEinumkKMGTP _x\u0661\xa0"
small_exponents = st.integers(-30, 30).map(lambda e: f"e{e:+d}" if e % 2 else f"E{e}")
grammar_quantities = st.builds(
    lambda sign, num, dot, denom, suffix: f"{sign}{num}{dot}{denom}{suffix}",
    st.sampled_from(["", "+", "-"]), st.text("0123456789", max_size=22), st.sampled_from(["", "."]),
    st.text("0123456789", max_size=12),
    st.one_of(st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]),
              small_exponents))


@settings(max_examples=3000, deadline=None, derandomize=True)
@given(st.one_of(grammar_quantities, st.text(QUANTITY_CHARS, max_size=16)))
def test_parse_quantity_agrees_with_a_reference_reading_of_the_go_grammar(text):
    expected = reference_quantity(text)
    if expected is None:
        with pytest.raises(ObjectError):
            parse_quantity(text)
    else:
        assert Fraction(parse_quantity(text)) == expected


def test_negative_requests_and_allocatable_are_refused_naming_the_field():
    pod = gpu_pod("p", "ns", gpus=1)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "-500m"
    with pytest.raises(ObjectError, match=r"pod ns/p: spec.containers\[0\] cpu: '-500m' must be non-negative"):
        pod_demand(pod)
    node = pool_node(model="A100-80GB", count=8)
    node["status"]["allocatable"]["nvidia.com/gpu"] = "-8"
    with pytest.raises(ObjectError, match=re.escape("allocatable nvidia.com/gpu: '-8' must be non-negative")):
        node_spec(node)


@pytest.mark.parametrize("mutate,message", [
    (lambda n: n["metadata"]["labels"].update({"nvidia.com/gpu.replicas": "Infinity"}), "gpu.replicas: 'Infinity'"),
    (lambda n: n["metadata"]["labels"].update({"nvidia.com/gpu.count": "1_0"}), "gpu.count: '1_0'"),
    (lambda n: n["metadata"].update(labels="x"), "metadata.labels: must be an object"),
    (lambda n: n["status"].update(allocatable=["cpu"]), "status.allocatable: must be an object"),
    (lambda n: n["status"]["allocatable"].update(cpu="1e999999999"), "allocatable cpu: '1e999999999'"),
    (lambda n: n["status"]["allocatable"].update(cpu="9e18"), "allocatable cpu: 9E+18 is more than gpuaas models"),
    (lambda n: n["metadata"]["labels"].update({"gpuaas.io/pool": 7}), "label gpuaas.io/pool: must be a string"),
])
def test_unreadable_nodes_are_refused_naming_the_field(mutate, message):
    node = pool_node(model="A100-80GB", count=8)
    mutate(node)
    with pytest.raises(ObjectError, match=re.escape(message)):
        node_spec(node)


@pytest.mark.parametrize("raw", ["-1", "8", "1_0", "\u0661", "0,,x", 7])
def test_device_annotations_outside_the_node_are_refused(raw):
    pod = gpu_pod("p", gpus=1)
    pod["metadata"]["annotations"]["gpuaas.io/devices"] = raw
    with pytest.raises(ObjectError, match=re.escape("is not a list of GPU indices 0..7")):
        assigned_devices(pod)


def counted_lines(fn, *args) -> int:
    """Lines of scoring/kubeobjects.py executed by fn(*args): work counted in operations, not in seconds."""
    import scoring.kubeobjects as mod

    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename == mod.__file__ else None

    sys.settrace(calls)
    try:
        fn(*args)
    finally:
        sys.settrace(None)
    return count


def sidecar_pod(n: int) -> dict:
    """n sidecars, each with a resource of its own, then a regular init container and the app: the shape that made
    summing quadratic (every init container walked every sidecar's resources)."""
    sidecars = [{"name": f"s{i}", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "10m", f"example.com/r{i}": "1"}}} for i in range(n)]
    init = {"name": "setup", "resources": {"requests": {"cpu": "1"}}}
    return {"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"initContainers": sidecars + [init] + sidecars[:1] + [init],
                     "containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}]}}


def test_summing_requests_is_linear_in_containers():
    """Defect 7: 3,000 sidecars took 7 s. Doubling the sidecars must not quadruple the lines executed (a quadratic
    sum gives a ratio near 4; linear work near 2). bench/pod_parse.py times 5,000 sidecars."""
    small, large = counted_lines(pod_requests, sidecar_pod(300)), counted_lines(pod_requests, sidecar_pod(600))
    assert large / small < 2.3, (small, large)
    req = pod_requests(sidecar_pod(300))
    # cpu: app 1 + 301 sidecars x 10m = 4.01 > the init container's 1 + 300 sidecars x 10m = 4
    assert req["cpu"] == Decimal("4.01") and req["example.com/r0"] == 2 and req["example.com/r299"] == 1


# -- names (scoring/names.py), checked as the apiserver checks them ---------------------------------------------------

@pytest.mark.parametrize("check,name,ok", [
    (dns1123_label, "ml", True), (dns1123_label, "a-1", True), (dns1123_label, "a" * 63, True),
    (dns1123_label, "a" * 64, False), (dns1123_label, "a.b", False), (dns1123_label, "-a", False),
    (dns1123_label, "A", False), (dns1123_label, "", False), (dns1123_label, "a?resourceVersion=0", False),
    (dns1123_subdomain, "a100-0000", True), (dns1123_subdomain, "a.b-c.d", True), (dns1123_subdomain, "x/../y", False),
    (dns1123_subdomain, "..", False), (dns1123_subdomain, "a..b", False), (dns1123_subdomain, "a%2Fb", False),
    (dns1123_subdomain, "a\n", False), (dns1123_subdomain, "a" * 254, False), (dns1123_subdomain, 7, False),
])
def test_kubernetes_names(check, name, ok):
    if ok:
        assert check(name, "f") == name
    else:
        with pytest.raises(InvalidName, match=r"^f: "):
            check(name, "f")


def test_mig_instances_that_do_not_fit_make_the_node_unreadable_not_the_model():
    """Found by tests/extender/test_fuzz.py: 3 x 3g.40gb on one A100 was accepted here and failed when the model was
    built, a 500 on every request until the node changed."""
    node = pool_node(model="A100-80GB", count=1, mig="all-3g.40gb")
    node["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] = "3"
    with pytest.raises(ObjectError, match=re.escape("allocatable MIG instances do not fit its GPUs: 3 x 3g.40gb")):
        node_spec(node)


def test_what_a_pod_says_is_not_kept_at_any_size():
    """The quantity cache keeps short strings only (a valid quantity can be megabytes of zeros), and an unknown GPU
    product a pod selects is kept cut to a label value's 63 characters (the demand cache holds thousands)."""
    from scoring.kubeobjects import _read_short_quantity

    before = _read_short_quantity.cache_info().currsize
    assert parse_quantity("0." + "0" * 100_000 + "1") == Decimal("1e-9")
    assert _read_short_quantity.cache_info().currsize == before
    pod = gpu_pod("p", gpus=1)
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "Z" * 1_000_000}
    (allowed,) = pod_demand(pod).allowed_models
    assert allowed == "Z" * 60 + "..."

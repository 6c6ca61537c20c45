"""Property: no input makes the extender answer 5xx, and it answers the next valid request as before (issue 13).

Generated and mutated bodies for /filter, /prioritize, /bind and /explain, raw bytes (with and without a gzip
Content-Encoding), and Node objects both in request bodies and fed to the model as an informer would, are sent over
HTTP to one snapshot app (aiohttp's test server, one event loop for the whole module), and a valid /filter must then
come back exactly as it did before any fuzzing.

Two kinds of property. Those built from hypothesis strategies (JSON values, quantities, names, mutations of valid
bodies; shrinkable) cost ~5 ms an example to generate on a 2-core machine, too slow for 20,000 in CI; they run a few
hundred each, with the probe after every example. The bulk (`seeded`, 18,350) draws a seed from hypothesis, then
picks a target and applies the same kinds of mutation with a seeded random.Random (~0.1 ms); the probe follows every
PROBE_EVERY-th example and the last (a corruption of the model persists, so it is still seen). Examples are
derandomized, so CI runs the same ones every time; each property checks it ran its share of EXAMPLES_TOTAL.
"""
from __future__ import annotations

import asyncio
import copy
import gzip
import json
import logging
import random
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.config import ExtenderConfig
from extender.server import SERVICE, snapshot_app

from .fixtures import bound, names, nodes, pending

EXAMPLES = {"filter": 300, "prioritize": 200, "bind": 200, "explain": 200, "raw": 300, "nodes_in_body": 150,
            "nodes_in_model": 150, "generated": 150, "seeded": 18_350}
EXAMPLES_TOTAL = sum(EXAMPLES.values())
SETTINGS = {"deadline": None, "derandomize": True, "database": None,
            "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]}

VALID = {"Pod": pending("probe", gpus=1), "NodeNames": names()}


class Harness:
    """One app and one client on one loop; `post` and `get` return (status, text)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        items = nodes() + [pending("p", gpus=2), bound(pending("busy", gpus=6), "a100-0000", "0,1,2,3,4,5")]
        # Assumptions made by fuzzed prioritize calls expire at once: the probe's answer stays comparable.
        self.app = snapshot_app(ExtenderConfig(assume_ttl_seconds=1e-6), items)
        self.client = TestClient(TestServer(self.app), loop=self.loop)
        self.loop.run_until_complete(self.client.start_server())
        self.expected = self.post("/filter", VALID)
        assert self.expected[0] == 200

    def _run(self, coro):
        return self.loop.run_until_complete(coro)

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, str]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()

        async def go():
            async with self.client.post(path, data=data, headers={"Content-Type": "application/json",
                                                                  **(headers or {})}) as resp:
                return resp.status, await resp.text()
        return self._run(go())

    def get(self, path: str, params: dict[str, str]) -> tuple[int, str]:
        async def go():
            async with self.client.get(path, params=params) as resp:
                return resp.status, await resp.text()
        return self._run(go())

    def check(self, status: int, text: str, probe: bool = True) -> None:
        assert status < 500, text
        if probe:
            assert self.post("/filter", VALID) == self.expected  # the next valid request, answered as before

    def close(self) -> None:
        self._run(self.client.close())
        self.loop.close()


@pytest.fixture(scope="module")
def harness():
    # Tens of thousands of refused binds and expired holds would each log a warning (and pytest keep every record).
    quiet = [logging.getLogger(name) for name in ("gpuaas.extender", "scoring.clusterview", "aiohttp.server")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.CRITICAL)
    h = Harness()
    yield h
    h.close()
    for logger, level in zip(quiet, levels, strict=True):
        logger.setLevel(level)


def run_property(name: str, prop: Callable[..., None], *strategies) -> None:
    """Run `prop` on EXAMPLES[name] derandomized examples and check that they all ran."""
    ran = 0

    @settings(max_examples=EXAMPLES[name], **SETTINGS)
    @given(st.tuples(*strategies))
    def wrapped(args):
        nonlocal ran
        ran += 1
        prop(*args)

    wrapped()
    assert ran >= EXAMPLES[name], (name, ran)


# -- strategies -------------------------------------------------------------------------------------------------------

grammar_quantities = st.builds(
    lambda sign, num, dot, denom, suffix: f"{sign}{num}{dot}{denom}{suffix}",
    st.sampled_from(["", "+", "-"]), st.text("0123456789", max_size=25), st.sampled_from(["", ".", "_"]),
    st.text("0123456789", max_size=12),
    st.sampled_from(["", "m", "k", "M", "G", "E", "Ki", "Mi", "Gi", "Ei", "e3", "e-9", "E+18", "e999999999", "ki",
                     "e"]))
quantities = st.one_of(
    grammar_quantities,
    st.sampled_from(["Infinity", "-Infinity", "NaN", "inf", "1e999999999", "9" * 5000, "0." + "0" * 5000 + "1",
                     "1_000", "-1", "-0.5", "8Ei", "1e4294967296", " 1 ", "\u0661", "", "0x10"]),
    st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False))
names_ = st.one_of(st.sampled_from(["a100-0000", "x/../../nodes/a100-0000", "p?resourceVersion=0", "..", "A", "",
                                    "a" * 300, "ml", "p", "busy", "%2F", "a\nb"]),
                   st.text(max_size=30), st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True))
leaves = st.one_of(st.none(), st.booleans(), st.integers(-2**64, 2**64), st.floats(allow_nan=False,
                                                                                    allow_infinity=False),
                   st.text(max_size=20), quantities, names_)
json_values = st.recursive(leaves, lambda kids: st.lists(kids, max_size=4) |
                           st.dictionaries(st.text(max_size=12), kids, max_size=4), max_leaves=10)


def paths(value: Any, at: tuple = ()) -> list[tuple]:
    """Every path into a JSON value (dict keys and list indices), the root included."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, at + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, at + (i,))
    return out


def apply(value: Any, path: tuple, op: str, new: Any) -> Any:
    """A copy of `value` with the node at `path` replaced, deleted, doubled or wrapped."""
    if not path:
        return new if op != "wrap" else [value]
    out = copy.copy(value)
    head, rest = path[0], path[1:]
    if rest:
        out[head] = apply(value[head], rest, op, new)
    elif op == "delete":
        del out[head]
    elif op == "double" and isinstance(out, list):
        out.insert(head, out[head])
    elif op == "wrap":
        out[head] = [value[head]]
    else:
        out[head] = new
    return out


@st.composite
def mutated(draw, base: Any, values=json_values) -> Any:
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths(doc)))
        op = draw(st.sampled_from(["replace", "replace", "quantity", "delete", "double", "wrap"]))
        new = draw(quantities if op == "quantity" else values)
        doc = apply(doc, where, "replace" if op == "quantity" else op, new)
    return doc


def pod_bases() -> list[dict]:
    mig = pending("m", mig="3g.40gb")
    share = pending("s")
    share["spec"]["containers"][0]["resources"]["limits"]["gpuaas.io/gpu-share"] = "250"
    affinity = pending("a", gpus=2)
    affinity["spec"]["initContainers"] = [{"name": "side", "restartPolicy": "Always",
                                           "resources": {"requests": {"cpu": "100m"}}},
                                          {"name": "init", "resources": {"requests": {"cpu": "2"}}}]
    affinity["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                                     "values": ["NVIDIA-A100-SXM4-80GB"]}]}]}}}
    affinity["metadata"]["annotations"] = {"gpuaas.io/gpu-models": "A100-80GB,H100-80GB"}
    return [pending("w", gpus=4), mig, share, affinity]


extender_args = st.sampled_from(pod_bases()).flatmap(
    lambda pod: mutated({"Pod": pod, "NodeNames": names()[:4] + ["ghost"], "Nodes": None}))


# -- properties -------------------------------------------------------------------------------------------------------

def test_filter_bodies_mutated_never_5xx(harness):
    run_property("filter", lambda body: harness.check(*harness.post("/filter", body)), extender_args)


def test_prioritize_bodies_mutated_never_5xx(harness):
    run_property("prioritize", lambda body: harness.check(*harness.post("/prioritize", body)), extender_args)


def test_bind_bodies_mutated_never_5xx(harness):
    base = {"PodName": "p", "PodNamespace": "ml", "PodUID": "uid-p", "Node": "a100-0001"}
    bodies = st.one_of(mutated(base, st.one_of(names_, json_values)),
                       st.fixed_dictionaries(dict.fromkeys(base, names_)))
    run_property("bind", lambda body: harness.check(*harness.post("/bind", body)), bodies)


def test_explain_queries_never_5xx(harness):
    queries = st.fixed_dictionaries({"pod": st.one_of(names_, st.builds("{}/{}".format, names_, names_)),
                                     "node": names_})
    run_property("explain", lambda q: harness.check(*harness.get("/explain", q)), queries)


def test_raw_bytes_never_5xx(harness):
    valid = json.dumps(VALID).encode()
    bodies = st.one_of(st.binary(max_size=200), st.builds(lambda b, i: valid[:i] + b + valid[i:],
                                                          st.binary(max_size=8), st.integers(0, len(valid))),
                       st.sampled_from([b"NaN", b"[]", b"null", b'{"Pod": Infinity}', b'{"Pod": 1e999}',
                                        b"[" * 5000, b'{"Pod":' * 3000, b'"x"', b"1" * 5000]))

    def prop(body: bytes, path: str, encoding: str) -> None:
        headers = {}
        if encoding == "gzip":
            headers["Content-Encoding"] = "gzip"
        elif encoding == "gzipped":
            body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
        harness.check(*harness.post(path, body, headers))

    run_property("raw", prop, bodies, st.sampled_from(["/filter", "/prioritize", "/bind"]),
                 st.sampled_from(["", "gzip", "gzipped"]))


node_objects = st.sampled_from(nodes()).flatmap(mutated)


def test_node_objects_in_bodies_never_5xx(harness):
    def prop(items: list, pod: dict) -> None:
        harness.check(*harness.post("/filter", {"Pod": pod, "Nodes": {"kind": "NodeList", "items": items}}))

    run_property("nodes_in_body", prop, st.lists(node_objects, min_size=1, max_size=3), st.sampled_from(pod_bases()))


def test_node_objects_the_informer_delivers_never_break_the_model(harness):
    """A Node as the apiserver could hold it, mutated (its name kept: the apiserver guarantees one), fed to the model
    as an informer event: reading it fails with a reason for that node, and the verbs keep answering."""
    view = harness.app[SERVICE].view
    originals = {n["metadata"]["name"]: n for n in nodes()}

    def prop(node: dict, name: str) -> None:
        node = node if isinstance(node, dict) else {"value": node}
        node["metadata"] = {**(node.get("metadata") if isinstance(node.get("metadata"), dict) else {}), "name": name}
        view.on_change("Node", originals[name], node)
        try:
            status, text = harness.post("/filter", VALID)
            assert status < 500, text
            status, text = harness.post("/prioritize", VALID)
            assert status < 500, text
        finally:
            view.on_change("Node", node, originals[name])
        harness.check(200, "")

    run_property("nodes_in_model", prop, node_objects, st.sampled_from(sorted(originals)))


def test_generated_bodies_never_5xx(harness):
    def prop(body: Any, path: str) -> None:
        harness.check(*harness.post(path, body))

    bodies = st.one_of(json_values, st.fixed_dictionaries({"Pod": json_values, "NodeNames": json_values}),
                       st.fixed_dictionaries({"Pod": st.fixed_dictionaries({"metadata": json_values,
                                                                           "spec": json_values}),
                                              "NodeNames": st.just(names())}))
    run_property("generated", prop, bodies, st.sampled_from(["/filter", "/prioritize", "/bind"]))


# -- the bulk: seeded mutations --------------------------------------------------------------------------------------

PROBE_EVERY = 8
LEAVES: list[Any] = [None, True, False, 0, -1, 2**63, -2**64, 1.5, -0.0, 1e308, "", "x", "Infinity", "NaN", "-1",
                     "1e999999999", "9" * 5000, "1_000", "0." + "0" * 3000 + "1", "8Ei", "1Ki", "500m", "2",
                     "x/../../nodes/a100-0000", "p?resourceVersion=0", "..", "a100-0000", "A", "\u0661", "\x00",
                     "a" * 300, "nvidia.com/gpu", "Always", "In", "nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"]


def random_value(rng, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.15:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if depth < 3 and roll < 0.3:
        return {rng.choice(["cpu", "memory", "nvidia.com/gpu", "metadata", "name", "spec", "items", "containers",
                            "resources", "requests", "limits", "x"]): random_value(rng, depth + 1)
                for _ in range(rng.randrange(4))}
    if roll < 0.4:
        return "".join(rng.choice("0123456789.+-eEinumkKMGTP_ x") for _ in range(rng.randrange(12)))
    if roll < 0.45:
        return rng.randrange(-2**70, 2**70)
    return rng.choice(LEAVES)


def random_mutation(rng, doc: Any) -> Any:
    for _ in range(rng.randrange(1, 5)):
        where = rng.choice(paths(doc))
        op = rng.choice(["replace", "replace", "delete", "double", "wrap"])
        doc = apply(doc, where, op, random_value(rng))
    return doc


def test_seeded_mutations_never_5xx(harness):
    pods = pod_bases()
    node_list = nodes()
    view = harness.app[SERVICE].view
    originals = {n["metadata"]["name"]: n for n in node_list}
    count = 0

    def prop(seed: int) -> None:
        nonlocal count
        count += 1
        rng = random.Random(seed)
        target = rng.choice(["filter", "prioritize", "nodes", "bind", "explain", "informer"])
        probe = count % PROBE_EVERY == 0 or count == EXAMPLES["seeded"]
        if target in ("filter", "prioritize"):
            body = {"Pod": copy.deepcopy(rng.choice(pods)), "NodeNames": names()[:4] + ["ghost"]}
            harness.check(*harness.post(f"/{target}", random_mutation(rng, body)), probe)
        elif target == "nodes":
            items = [copy.deepcopy(rng.choice(node_list)) for _ in range(rng.randrange(1, 4))]
            body = {"Pod": copy.deepcopy(rng.choice(pods)), "Nodes": {"kind": "NodeList", "items": items}}
            harness.check(*harness.post("/filter", random_mutation(rng, body)), probe)
        elif target == "bind":
            body = {"PodName": "p", "PodNamespace": "ml", "PodUID": "uid-p", "Node": "a100-0001"}
            harness.check(*harness.post("/bind", random_mutation(rng, body)), probe)
        elif target == "explain":
            pod, node = rng.choice(LEAVES + ["ml/p", "ml/busy"]), rng.choice(LEAVES)
            harness.check(*harness.get("/explain", {"pod": str(pod), "node": str(node)}), probe)
        else:  # a Node as an informer delivers it, its name kept
            name = rng.choice(sorted(originals))
            node = random_mutation(rng, copy.deepcopy(originals[name]))
            node = node if isinstance(node, dict) else {"value": node}
            node["metadata"] = {**(node.get("metadata") if isinstance(node.get("metadata"), dict) else {}),
                                "name": name}
            view.on_change("Node", originals[name], node)
            try:
                harness.check(*harness.post("/filter", VALID), probe=False)
            finally:
                view.on_change("Node", node, originals[name])
            harness.check(200, "", probe)

    run_property("seeded", prop, st.integers(0, 2**64 - 1))


def test_the_examples_add_up_to_twenty_thousand():
    assert EXAMPLES_TOTAL >= 20_000

"""The floor gpuaas is timed against: a do-nothing extender on gpuaas's server stack (aiohttp on uvloop, orjson, the
wire format's pydantic models of extender/wire.py). It reads and validates each request as gpuaas does, then answers
filter with every candidate feasible and prioritize with score 0 for every candidate. What it costs is what any
extender written this way pays before deciding anything (bench/extender_latency.py).

With `--kubeconfig` it is also a binder, as gpuaas is: filter answers with the first candidate alone (so, as for a pod
gpuaas decides at filter, kube-scheduler calls no prioritize) and bind creates the pod's Binding with gpuaas's client
(extender/binder.py ApiBinder, over runtime/kubeclient.py's session). bench/scheduler_throughput.py's `floor` runs
kube-scheduler against it: what the extender protocol itself costs on this machine, with no decision made.
Usage: python bench/floor_extender.py --port PORT [--kubeconfig FILE] (serves until killed; GET /readyz answers once
it listens)"""
from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import uvloop
from aiohttp import web

from extender.binder import ApiBinder
from extender.wire import ExtenderArgs, ExtenderBindingArgs
from runtime.kubeclient import ApiEndpoint

ONE_NODE = web.AppKey("one_node", bool)
BINDER = web.AppKey("binder", ApiBinder)


async def _args(request: web.Request) -> ExtenderArgs:
    return ExtenderArgs.model_validate(orjson.loads(await request.read()))


async def filter_verb(request: web.Request) -> web.Response:
    names = (await _args(request)).node_names()
    return web.Response(body=orjson.dumps({"NodeNames": names[:1] if request.app[ONE_NODE] else names,
                                           "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}),
                        content_type="application/json")


async def prioritize_verb(request: web.Request) -> web.Response:
    args = await _args(request)
    return web.Response(body=orjson.dumps([{"Host": name, "Score": 0} for name in args.node_names()]),
                        content_type="application/json")


async def bind_verb(request: web.Request) -> web.Response:
    args = ExtenderBindingArgs.model_validate(orjson.loads(await request.read()))
    error = ""
    try:
        await request.app[BINDER].bind(args.PodNamespace, args.PodName, args.PodUID, args.Node, {})
    except Exception as err:  # kube-scheduler reads the Error and tries the pod again
        error = str(err)
    return web.Response(body=orjson.dumps({"Error": error}), content_type="application/json")


async def readyz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(kubeconfig: Path | None = None) -> web.Application:
    app = web.Application(client_max_size=8 * 2**20)
    app[ONE_NODE] = kubeconfig is not None
    app.router.add_post("/filter", filter_verb)
    app.router.add_post("/prioritize", prioritize_verb)
    app.router.add_get("/readyz", readyz)
    if kubeconfig is not None:
        endpoint = ApiEndpoint.from_kubeconfig(kubeconfig)

        async def session(app: web.Application) -> AsyncIterator[None]:
            async with endpoint.session() as s:
                app[BINDER] = ApiBinder(s)
                yield

        app.cleanup_ctx.append(session)
        app.router.add_post("/bind", bind_verb)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kubeconfig", type=Path, help="bind through this cluster; filter answers one node")
    args = parser.parse_args()
    web.run_app(make_app(args.kubeconfig), host="127.0.0.1", port=args.port, print=None, access_log=None,
                loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()

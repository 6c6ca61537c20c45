"""The floor gpuaas is timed against: a do-nothing extender on gpuaas's server stack (aiohttp on uvloop, orjson, the
wire format's pydantic models of extender/wire.py). It reads and validates each request as gpuaas does, then answers
filter with every candidate feasible and prioritize with score 0 for every candidate. What it costs is what any
extender written this way pays before deciding anything (bench/extender_latency.py).

With `--kubeconfig` it is also a binder, as gpuaas is: filter answers with the first candidate alone (so, as for a pod
gpuaas decides at filter, kube-scheduler calls no prioritize) and bind creates the pod's Binding with gpuaas's client
(extender/binder.py ApiBinder, over runtime/kubeclient.py's session). bench/scheduler_throughput.py's `floor` runs
kube-scheduler against it: what the extender protocol itself costs on this machine, with no decision made.
With `--watch` as well, it keeps the extender's two watches, nodes and pods, through the same informer
(runtime/informer.py: listed, then watched in JSON, decoded and stored), and decides nothing with them: what the
watches cost the apiserver and the extender, apart from the model built on them (bench/scheduler_throughput.py's
`floor_watching`).
Usage: python bench/floor_extender.py --port PORT [--kubeconfig FILE [--watch]] (serves until killed; GET /readyz
answers once it listens and, with --watch, once both watches have synced)"""
from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import uvloop
from aiohttp import web

from extender.binder import ApiBinder
from extender.wire import ExtenderArgs, ExtenderBindingArgs
from runtime.informer import Informer
from runtime.kubeclient import ApiEndpoint

ONE_NODE = web.AppKey("one_node", bool)
BINDER = web.AppKey("binder", ApiBinder)
WATCHES = web.AppKey("watches", list[Informer])


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
    if all(w.synced.is_set() for w in request.app[WATCHES]):
        return web.Response(text="ok")
    return web.Response(text="watches not synced", status=503)


def make_app(kubeconfig: Path | None = None, watch: bool = False) -> web.Application:
    app = web.Application(client_max_size=8 * 2**20)
    app[ONE_NODE] = kubeconfig is not None
    app[WATCHES] = []
    app.router.add_post("/filter", filter_verb)
    app.router.add_post("/prioritize", prioritize_verb)
    app.router.add_get("/readyz", readyz)
    if kubeconfig is not None:
        endpoint = ApiEndpoint.from_kubeconfig(kubeconfig)

        if watch:  # as extender/server.py's live_app watches them, without the model (on_change)
            app[WATCHES] = [Informer(endpoint, "/api/v1/nodes", kind="Node"),
                            Informer(endpoint, "/api/v1/pods", kind="Pod")]

        async def session(app: web.Application) -> AsyncIterator[None]:
            async with endpoint.session() as s:
                app[BINDER] = ApiBinder(s)
                tasks = [asyncio.create_task(w.run(s)) for w in app[WATCHES]]
                yield
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        app.cleanup_ctx.append(session)
        app.router.add_post("/bind", bind_verb)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kubeconfig", type=Path, help="bind through this cluster; filter answers one node")
    parser.add_argument("--watch", action="store_true", help="with --kubeconfig: keep the extender's two watches "
                                                            "(nodes, pods), deciding nothing with them")
    args = parser.parse_args()
    if args.watch and args.kubeconfig is None:
        parser.error("--watch needs --kubeconfig: the watches are the cluster's")
    web.run_app(make_app(args.kubeconfig, args.watch), host="127.0.0.1", port=args.port, print=None, access_log=None,
                loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()

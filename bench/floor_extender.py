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
With `--server bare` the same verbs are served by bench/bare_http.py's bare server instead of aiohttp's: what
aiohttp's server itself costs (bench/scheduler_throughput.py's `floor_bare`).
Usage: python bench/floor_extender.py --port PORT [--kubeconfig FILE [--watch]] [--server bare] (serves until
killed; GET /readyz answers once it listens and, with --watch, once both watches have synced)"""
from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import uvloop
from aiohttp import web

from bench.bare_http import Routes, Unavailable, serve_app
from extender.binder import ApiBinder
from extender.wire import ExtenderArgs, ExtenderBindingArgs
from runtime.informer import Informer
from runtime.kubeclient import ApiEndpoint

ONE_NODE = web.AppKey("one_node", bool)
BINDER = web.AppKey("binder", ApiBinder)
WATCHES = web.AppKey("watches", list[Informer])


def filter_reply(body: bytes, one_node: bool) -> bytes:
    names = ExtenderArgs.model_validate(orjson.loads(body)).node_names()
    return orjson.dumps({"NodeNames": names[:1] if one_node else names, "FailedNodes": {},
                         "FailedAndUnresolvableNodes": {}, "Error": ""})


def prioritize_reply(body: bytes) -> bytes:
    args = ExtenderArgs.model_validate(orjson.loads(body))
    return orjson.dumps([{"Host": name, "Score": 0} for name in args.node_names()])


async def bind_reply(binder: ApiBinder, body: bytes) -> bytes:
    args = ExtenderBindingArgs.model_validate(orjson.loads(body))
    error = ""
    try:
        await binder.bind(args.PodNamespace, args.PodName, args.PodUID, args.Node, {})
    except Exception as err:  # kube-scheduler reads the Error and tries the pod again
        error = str(err)
    return orjson.dumps({"Error": error})


def _json(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


async def filter_verb(request: web.Request) -> web.Response:
    return _json(filter_reply(await request.read(), request.app[ONE_NODE]))


async def prioritize_verb(request: web.Request) -> web.Response:
    return _json(prioritize_reply(await request.read()))


async def bind_verb(request: web.Request) -> web.Response:
    return _json(await bind_reply(request.app[BINDER], await request.read()))


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
    parser.add_argument("--server", choices=("aiohttp", "bare"), default="aiohttp",
                        help="bare: the same verbs on bench/bare_http.py's server instead of aiohttp's")
    args = parser.parse_args()
    if args.watch and args.kubeconfig is None:
        parser.error("--watch needs --kubeconfig: the watches are the cluster's")
    app = make_app(args.kubeconfig, args.watch)
    if args.server == "bare":
        uvloop.run(serve_app(app, bare_routes, "127.0.0.1", args.port))
    else:
        web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None, loop=uvloop.new_event_loop())


def bare_routes(app: web.Application) -> Routes:
    """make_app's verbs and /readyz, for bench/bare_http.py's server."""
    def ready(body: bytes) -> bytes:
        if not all(w.synced.is_set() for w in app[WATCHES]):
            raise Unavailable("watches not synced")
        return b"ok"

    routes: Routes = {(b"POST", b"/filter"): lambda body: filter_reply(body, app[ONE_NODE]),
                      (b"POST", b"/prioritize"): prioritize_reply, (b"GET", b"/readyz"): ready}
    if app[ONE_NODE]:  # with a cluster to bind in
        routes[b"POST", b"/bind"] = lambda body: bind_reply(app[BINDER], body)
    return routes


if __name__ == "__main__":
    main()

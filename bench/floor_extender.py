"""The floor bench/extender_latency.py times gpuaas against: a do-nothing extender on gpuaas's server stack (aiohttp on
uvloop, orjson, the wire format's pydantic models of extender/wire.py). It reads and validates each request as gpuaas
does, then answers filter with every candidate feasible and prioritize with score 0 for every candidate. What it costs
is what any extender written this way pays before deciding anything.
Usage: python bench/floor_extender.py --port PORT (serves until killed; GET /readyz answers once it listens)"""
from __future__ import annotations

import argparse

import orjson
import uvloop
from aiohttp import web

from extender.wire import ExtenderArgs


async def _args(request: web.Request) -> ExtenderArgs:
    return ExtenderArgs.model_validate(orjson.loads(await request.read()))


async def filter_verb(request: web.Request) -> web.Response:
    args = await _args(request)
    return web.Response(body=orjson.dumps({"NodeNames": args.node_names(), "FailedNodes": {},
                                           "FailedAndUnresolvableNodes": {}, "Error": ""}),
                        content_type="application/json")


async def prioritize_verb(request: web.Request) -> web.Response:
    args = await _args(request)
    return web.Response(body=orjson.dumps([{"Host": name, "Score": 0} for name in args.node_names()]),
                        content_type="application/json")


async def readyz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app() -> web.Application:
    app = web.Application(client_max_size=8 * 2**20)
    app.router.add_post("/filter", filter_verb)
    app.router.add_post("/prioritize", prioritize_verb)
    app.router.add_get("/readyz", readyz)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(make_app(), host="127.0.0.1", port=args.port, print=None, access_log=None,
                loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()

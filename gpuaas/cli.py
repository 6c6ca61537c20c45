"""gpuaas: one command for the platform's verbs.

Each verb lives in its own module, which exposes `register(subparsers)`: it adds its parser and sets `func` to a
callable that takes the parsed arguments and returns an exit code."""
from __future__ import annotations

import argparse
import importlib
import sys

# Modules that contribute a verb, in the order `gpuaas --help` lists them.
VERB_MODULES = (
    "gpuaas.demo.cli",
    "gpuaas.cluster.cli",
    "extender.cli",
    "autoscaler.cli",
    "gpuaas.loadgen.cli",
    "nodescaler.cli",
    "gangs.cli",
    "gpuaas.simulate.cli",
    "gpuaas.report.cli",
    "gpuaas.configref",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuaas", description=__doc__.splitlines()[0] if __doc__ else None)
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in VERB_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a verb whose module does not exist yet
                continue
            raise
        module.register(subparsers)
    if "nodescaler" in subparsers.choices:  # the harness's node agent rides along (the component does not import it)
        from gpuaas.cluster.cli import add_fake_node_agent

        add_fake_node_agent(subparsers.choices["nodescaler"])
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""`gpuaas docs config`: the configuration reference (docs/configuration.md), generated from the pydantic models that
validate every file a user writes, so that the reference cannot drift from what the code accepts.

Each field becomes one row: its path in the file, type, default, constraints, description (`Field(description=...)`),
and, for the configs that read them, the environment variable that overrides it. Cross-field rules live in the
descriptions ("at least min_size"), because validators cannot be read back.
"""
from __future__ import annotations

import argparse
import re
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO / "docs" / "configuration.md"
REGENERATE = "bin/gpuaas docs config --output docs/configuration.md"


@dataclass(frozen=True)
class Row:
    path: str
    type: str
    default: str
    constraints: str
    description: str
    env: str | None  # the overriding environment variable, for configs that read them


@dataclass(frozen=True)
class ConfigDoc:
    """One file a user writes: its model, how it reaches gpuaas, and an example the test suite parses."""
    title: str
    model: type[BaseModel]
    intro: str
    example: str
    example_kind: str  # the loader tests/gpuaas/test_configref.py parses the example with (see EXAMPLE_LOADERS)
    env_prefix: str | None = None
    verb: str | None = None  # the `gpuaas` verb whose flags of the same name as a top-level field override it
    notes: Callable[[], str] | None = None  # extra Markdown computed from the code (catalogs, defaults)


# ---- rendering fields ------------------------------------------------------------------------------------------------

def _name(info: FieldInfo, attr: str) -> str:
    return info.alias or attr


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return None


def type_name(tp: Any) -> str:
    """A type as a YAML author reads it."""
    args = _union_args(tp)
    if args is not None:
        parts = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "")
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin is list:
        (item,) = typing.get_args(tp)
        return "list of " + ("objects" if _is_model(item) else type_name(item) + "s")
    if origin is dict:
        key, value = typing.get_args(tp)
        return "mapping" if value is Any else f"map of {type_name(key)} to {type_name(value)}"
    if _is_model(tp):
        return "object"
    return {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}.get(tp, str(tp))


def _yaml(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(fields below)"
    if isinstance(value, list):
        value = [v.model_dump(mode="json", by_alias=True, exclude_defaults=True) if isinstance(v, BaseModel) else v
                 for v in value]
    if isinstance(value, Path):
        value = str(value)
    return f"`{_yaml(value)}`"


def constraints_text(info: FieldInfo) -> str:
    out = []
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            out.append(f"≥ {m.ge}")
        elif isinstance(m, annotated_types.Gt):
            out.append(f"> {m.gt}")
        elif isinstance(m, annotated_types.Le):
            out.append(f"≤ {m.le}")
        elif isinstance(m, annotated_types.Lt):
            out.append(f"< {m.lt}")
        elif isinstance(m, annotated_types.MinLen):
            unit = "item" if typing.get_origin(info.annotation) is list else "character"
            out.append(f"at least {m.min_length} {unit}{'s' if m.min_length != 1 else ''}")
        elif isinstance(m, annotated_types.MaxLen):
            out.append(f"at most {m.max_length}")
        elif getattr(m, "pattern", None):
            out.append(f"matches `{m.pattern}`")
    return ", ".join(out)


def _nested_model(tp: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the model a field's values are, whether they sit in a list)."""
    args = _union_args(tp)
    if args is not None:
        models = [a for a in args if _is_model(a)]
        return (models[0] if len(models) == 1 else None), False
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return (item if _is_model(item) else None), True
    return (tp if _is_model(tp) else None), False


def field_rows(model: type[BaseModel], env_prefix: str | None = None, prefix: str = "",
               env_path: tuple[str, ...] | None = ()) -> list[Row]:
    """Every field of `model` and of the models nested in it, depth first, in declaration order. `env_path` is None
    below a list (an environment variable cannot address one item)."""
    rows = []
    for attr, info in model.model_fields.items():
        name = _name(info, attr)
        path = f"{prefix}{name}"
        here = None if env_path is None else (*env_path, attr)
        env = f"{env_prefix}{'__'.join(here).upper()}" if env_prefix and here is not None else None
        rows.append(Row(path, type_name(info.annotation), default_text(info), constraints_text(info),
                        info.description or "", env))
        nested, in_list = _nested_model(info.annotation)
        if nested is not None:
            rows += field_rows(nested, env_prefix, f"{path}[]." if in_list else f"{path}.",
                               None if in_list else here)
    return rows


def github_anchor(heading: str) -> str:
    """The #anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(rows: list[Row], with_env: bool) -> str:
    head = ["field", "type", "default", "constraints", "description"] + (["environment variable"] if with_env else [])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [f"`{r.path}`", r.type, r.default, r.constraints, r.description]
        if with_env:
            cells.append(f"`{r.env}`" if r.env else "")
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def overriding_flags(verb: str, model: type[BaseModel]) -> list[str]:
    """Options of `gpuaas <verb>` whose destination is a top-level field of the model."""
    from .cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[verb]
    return [a.option_strings[0] for a in sub._actions
            if a.option_strings and a.dest in model.model_fields and a.dest != "help"]


# ---- the documents ---------------------------------------------------------------------------------------------------

def _policies() -> str:
    from scoring.policies import POLICIES

    return "Scoring policies (`policy`): " + ", ".join(f"`{p}`" for p in POLICIES) + "."


def _default_queries() -> str:
    from autoscaler.config import DEFAULT_QUERIES, PLACEHOLDERS, REQUIRED_QUERIES

    lines = ["Default queries (`targets[].queries` replaces them by name; "
             f"{', '.join(f'`{q}`' for q in REQUIRED_QUERIES)} are required, the others may be switched off with "
             "`\"\"`). Placeholders: " + ", ".join(f"`{{{p}}}`" for p in sorted(PLACEHOLDERS)) + "; `{pods}` is a "
             "regex alternation of the target's pod names.", "", "| query | default |", "| --- | --- |"]
    for name, query in DEFAULT_QUERIES.items():  # the templates as written, without str.format's doubled braces
        lines.append(f"| `{name}` | `{_cell(query.replace('{{', '{').replace('}}', '}'))}` |")
    return "\n".join(lines)


def _gpu_catalog() -> str:
    from scoring.gpus import GPU_MODELS, MIG_CONFIGS

    lines = ["GPU models (`gpu.model`: the name, the `nvidia.com/gpu.product` label or an alias; the same names are "
             "accepted in a pod's `gpuaas.io/gpu-models` annotation):", "",
             "| model | product label | aliases | memory MiB | MIG profiles |", "| --- | --- | --- | --- | --- |"]
    for m in GPU_MODELS.values():
        profiles = ", ".join(p for p in m.mig_profiles if "+" not in p) or "-"
        lines.append(f"| `{m.name}` | `{m.product}` | {', '.join(f'`{a}`' for a in m.aliases) or '-'} | "
                     f"{m.memory_mib or 'unknown'} | {profiles} |")
    lines += ["", "Named MIG layouts (`gpu.mig`, as in NVIDIA mig-parted's default config), and the models they apply "
              "to: " + ", ".join(f"`{name}` ({', '.join(models)})" for name, models in MIG_CONFIGS.items()) + "."]
    return "\n".join(lines)


def config_docs() -> list[ConfigDoc]:
    from autoscaler.config import ENV_PREFIX as AUTOSCALER_ENV
    from autoscaler.config import METRICS_API_ENV_PREFIX as METRICS_API_ENV
    from autoscaler.config import AutoscalerConfig, MetricsApiConfig
    from extender.config import ENV_PREFIX as EXTENDER_ENV
    from extender.config import ExtenderConfig
    from gangs.config import ENV_PREFIX as GANGS_ENV
    from gangs.config import GangsConfig
    from nodescaler.config import ENV_PREFIX as NODESCALER_ENV
    from nodescaler.config import NodeScalerConfig
    from runtime.pools import PoolSpec

    return [
        ConfigDoc("Extender", ExtenderConfig,
                  "`gpuaas extender --config FILE` (`extender/config.py`). Read from the file, then from "
                  f"`{EXTENDER_ENV}*` environment variables, then from command-line flags; unknown or invalid "
                  "settings stop the start with the field named.",
                  "port: 8888\npolicy: gpuaas\nlog_format: text\ntls:\n  cert_file: /etc/gpuaas/tls/tls.crt\n"
                  "  key_file: /etc/gpuaas/tls/tls.key\n  client_ca_file: /etc/gpuaas/tls/ca.crt\n",
                  "extender", env_prefix=EXTENDER_ENV, verb="extender", notes=_policies),
        ConfigDoc("Replica autoscaler", AutoscalerConfig,
                  "`gpuaas autoscaler --config FILE` (`autoscaler/config.py`). Read from the file, then from "
                  f"`{AUTOSCALER_ENV}*` environment variables; `--dry-run` sets `dry_run`. At start every query is "
                  "run once: a query Prometheus rejects, or a Prometheus that cannot be reached, stops the start.",
                  "prometheus: {url: http://prometheus.monitoring.svc:9090, timeout_s: 5}\ninterval_s: 15\n"
                  "targets:\n  - deployment: llm\n    namespace: inference\n    min_replicas: 1\n"
                  "    max_replicas: 40\n    concurrency: 8\n    cold_start_s: 60\n",
                  "autoscaler", env_prefix=AUTOSCALER_ENV, verb="autoscaler", notes=_default_queries),
        ConfigDoc("Custom metrics API", MetricsApiConfig,
                  "`gpuaas metrics-api --config FILE` (`autoscaler/config.py`). Read from the file (optional), then "
                  f"from `{METRICS_API_ENV}*` environment variables. The TLS files and the front-proxy CA are flags "
                  "(`--tls-cert`, `--tls-key`, `--client-ca`), as are `--host` and `--port`.",
                  "prometheus: {url: http://prometheus.monitoring.svc:9090, timeout_s: 5}\nmetrics:\n"
                  "  - name: queue_depth\n    series: vllm:num_requests_waiting\n"
                  "allowed_client_names: [front-proxy-client]\n",
                  "metrics-api", env_prefix=METRICS_API_ENV, verb="metrics-api"),
        ConfigDoc("Node scaler", NodeScalerConfig,
                  "`gpuaas nodescaler --config FILE` (`nodescaler/config.py`). Read from the file, then from "
                  f"`{NODESCALER_ENV}*` environment variables, then `--dry-run`. A group's `template` is validated "
                  "as a pool of the [pool spec](#pool-spec) (without `name` and `count`).",
                  "interval_s: 10\ngroups:\n  - name: a100x8\n    template: {gpu: {model: A100-80GB, count: 8}, "
                  "cpu: \"96\", memory: 1Ti}\n    min_size: 0\n    max_size: 64\n    cost_per_hour: 32.77\n"
                  "scale_in: {utilization_threshold: 0.5, unneeded_s: 600}\n"
                  "leader_election: {namespace: gpuaas-system}\n",
                  "nodescaler", env_prefix=NODESCALER_ENV, verb="nodescaler"),
        ConfigDoc("Gang controller", GangsConfig,
                  "`gpuaas gangs --config FILE` (`gangs/config.py`; [gangs](gangs.md)). Read from the file "
                  f"(optional), then from `{GANGS_ENV}*` environment variables.",
                  "interval_s: 2\nbind_timeout_s: 120\nreserve_after_s: 300\n"
                  "webhook: {port: 8443, cert_file: /etc/gpuaas/tls/tls.crt, key_file: /etc/gpuaas/tls/tls.key}\n"
                  "leader_election: {namespace: gpuaas-system}\n",
                  "gangs", env_prefix=GANGS_ENV, verb="gangs"),
        ConfigDoc("Pool spec", PoolSpec,
                  "`gpuaas cluster up --pools FILE` and `gpuaas demo --pools FILE` (`runtime/pools.py`): the "
                  "GPU node pools of a local KWOK cluster; `gpuaas/pools/*.yaml` are the built-in ones. Keys are "
                  "camelCase like a Kubernetes object's. The nodes carry what GPU feature discovery and the NVIDIA "
                  "device plugin (MIG strategy mixed) publish.",
                  "pools:\n  - name: a100\n    count: 4\n    gpu:\n      model: A100-80GB\n      count: 8\n"
                  "      topology: {nvlinkDomain: 8, numaNode: 4}\n    cpu: \"96\"\n    memory: 1Ti\n"
                  "  - name: a100-mig\n    count: 2\n    gpu: {model: A100-80GB, count: 8, mig: all-1g.10gb}\n"
                  "    taints: [{key: dedicated, value: inference, effect: NoSchedule}]\n",
                  "pools", notes=_gpu_catalog),
    ]


OTHER_ENVIRONMENT = (
    ("GPUAAS_CACHE", "`bin/gpuaas`, `bin/test`, `scripts/setup.sh`, the local cluster",
     "where setup keeps the venv, the Kubernetes, etcd and kwok binaries and the local clusters; default "
     "`~/.cache/gpuaas`"),
    ("GPUAAS_KUBE_BIN, GPUAAS_KWOK_BIN, GPUAAS_ETCD_BIN, GPUAAS_PROMETHEUS_BIN, GPUAAS_HELM_BIN, "
     "GPUAAS_KARPENTER_BIN, GPUAAS_CAPI_BIN",
     "the local cluster and the chart tests",
     "where the control-plane binaries are; `scripts/setup.sh` writes them to `$GPUAAS_CACHE/env`, and variables "
     "of the same names override that file"),
    ("GPUAAS_VENV", "`scripts/setup.sh`", "written to `$GPUAAS_CACHE/env`: the Python environment setup made"),
    ("GPUAAS_CPU_SPLIT", "`bench/cpu_split/sitecustomize.py`, in the extender process of "
     "`bench/scheduler_throughput.py --cpu-split`", "the file the extender writes its CPU per part to at exit; the "
     "benchmark sets it (not for production)"),
    ("POD_NAME", "`gpuaas nodescaler`, `gpuaas gangs`", "leader-election identity (plus a random suffix); the "
     "Deployment sets it from `metadata.name`; else the hostname"),
)


def render() -> str:
    docs = config_docs()
    out = ["<!-- Generated by gpuaas/configref.py from the pydantic models; do not edit. Regenerate with:",
           f"     {REGENERATE} -->", "", "# Configuration reference", "",
           "Every file a gpuaas component reads, field by field, generated from the pydantic models that validate it. "
           "Unknown fields are refused in every file, and every error names the file and the field. How the pieces "
           "fit: [architecture](architecture.md); running them: [operations](operations.md).", ""]
    out += [f"- [{d.title}](#{github_anchor(d.title)})" for d in docs]
    out += ["- [Other environment variables](#other-environment-variables)", ""]
    for d in docs:
        out += [f"## {d.title}", "", d.intro, ""]
        if d.env_prefix:
            out += [f"Environment variables: `{d.env_prefix}` + the field path in upper case, nested fields joined "
                    "with `__`; values are read as YAML scalars (`true`, `8888`, `[a, b]`). Fields inside lists "
                    "have no variable of their own (set the whole list, as YAML).", ""]
        if d.verb:
            flags = overriding_flags(d.verb, d.model)
            if flags:
                out += [f"Flags of `gpuaas {d.verb}` that override a field of the same name: "
                        + ", ".join(f"`{f}`" for f in flags) + ".", ""]
        out += [table(field_rows(d.model, d.env_prefix), with_env=d.env_prefix is not None), ""]
        if d.notes:
            out += [d.notes(), ""]
        out += ["Example:", "", f"<!-- config: {d.example_kind} -->", "```yaml", d.example.rstrip("\n"), "```", ""]
    out += ["## Other environment variables", "", "| variable | read by | what |", "| --- | --- | --- |"]
    out += [f"| {', '.join(f'`{v.strip()}`' for v in names.split(','))} | {who} | {what} |"
            for names, who, what in OTHER_ENVIRONMENT]
    return "\n".join(out).rstrip("\n") + "\n"


# ---- the verb --------------------------------------------------------------------------------------------------------

def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("docs", help="generate documentation from the code")
    what = p.add_subparsers(dest="docs_verb", metavar="config", required=True)
    c = what.add_parser("config", help="the configuration reference (docs/configuration.md) from the pydantic models",
                        description="Write the configuration reference as Markdown to stdout, or to --output.")
    c.add_argument("--output", type=Path, help=f"write here instead of stdout (the committed one: "
                                               f"{DEFAULT_OUTPUT.relative_to(REPO)})")
    c.add_argument("--check", type=Path, metavar="FILE", help="exit 1 if FILE differs from what would be generated")
    c.set_defaults(func=cmd_config)


def cmd_config(args: argparse.Namespace) -> int:
    text = render()
    if args.check:
        try:
            current = args.check.read_text()
        except OSError as err:
            print(f"gpuaas docs config: {args.check}: {err.strerror}", file=sys.stderr)
            return 1
        if current != text:
            print(f"{args.check} is out of date; regenerate it with `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0

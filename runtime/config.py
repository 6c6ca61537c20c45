"""The one config loader: a pydantic model filled from a YAML/JSON file, then from environment variables.

Environment variables are `<PREFIX><FIELD>` in upper case (GPUAAS_EXTENDER_PORT=8888); nested fields join with `__`
(GPUAAS_EXTENDER_TLS__CERT_FILE). Values from the environment are parsed as YAML scalars, so `true`, `8888` and
`[a, b]` mean what they look like. Unknown keys in the file are refused, so a typo never silently falls back to a
default.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

__all__ = ["ConfigError", "M", "describe_errors", "load_config", "validate"]


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the source and the field."""


def _env_overrides(prefix: str, environ: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(prefix) or key == prefix:
            continue
        path = key[len(prefix):].lower().split("__")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        merged[k] = _merge(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged


def describe_errors(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def load_config(model: type[M], path: Path | str | None = None, *, env_prefix: str,
                environ: dict[str, str] | None = None, overrides: dict[str, Any] | None = None) -> M:
    """File, then environment, then explicit overrides (command-line flags), validated by `model`."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as err:
            raise ConfigError(f"{path}: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML or JSON: {err}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of settings, got {type(loaded).__name__}")
        data = loaded or {}
    env = _env_overrides(env_prefix, dict(os.environ if environ is None else environ))
    if env:
        source += f" + {env_prefix}* environment"
    data = _merge(_merge(data, env), {k: v for k, v in (overrides or {}).items() if v is not None})
    return validate(model, data, source)


def validate(model: type[M], data: object, source: str = "config") -> M:
    """`data` (a mapping, e.g. parsed YAML) as `model`, or a ConfigError naming `source` and every bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"invalid configuration ({source}): {describe_errors(err)}") from None

"""The Prometheus shell: PromQL through prometheus-api-client, answers turned into numbers or typed errors.

Nothing here decides anything. Errors say what went wrong in words that end up in an event and a condition."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry


class MetricsError(RuntimeError):
    """A query could not be answered usefully."""


class PrometheusUnavailable(MetricsError):
    """Prometheus did not answer (down, refused, timed out, or a server error)."""


class BadQuery(MetricsError):
    """Prometheus refused the query itself (a PromQL error): a configuration problem, not an outage."""


class NoData(MetricsError):
    """The query ran but returned an empty vector or NaN."""


_STRING_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_REGEX_SPECIALS = frozenset("\\.+*?()|[]{}^$")
NOTHING = "[^\\x00-\\x{10FFFF}]"  # RE2: the empty character class


def escape_label_value(value: str) -> str:
    """`value` as the inside of a double-quoted PromQL string (a label matcher's value): backslash, double quote,
    newline, carriage return and tab escaped as PromQL (Go) string literals write them, so that `ns="{value}"` matches
    exactly `value` whatever it holds: `x",namespace!="` stays one value, it does not end the string."""
    return "".join(_STRING_ESCAPES.get(c, c) for c in value)


def regex_alternation(values: list[str]) -> str:
    """A RE2 regex that matches exactly one of `values` (for `label=~"..."`, before `escape_label_value`); with no
    values, one that matches nothing: an empty character class (`""` or `^$` would match series without the label)."""
    if not values:
        return NOTHING
    return "|".join("".join("\\" + c if c in _REGEX_SPECIALS else c for c in v) for v in values)


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


class Prometheus:
    """Instant queries against one Prometheus. `timeout_s` bounds each request; no retries (the loop retries)."""

    def __init__(self, url: str, *, timeout_s: float = 5.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._client = PrometheusConnect(url=self.url, disable_ssl=True, timeout=timeout_s,
                                         retry=Retry(total=0, connect=0, read=0, redirect=0, status=0))

    def close(self) -> None:
        self._client.close()

    def query(self, promql: str) -> list[Sample]:
        """An instant vector (or scalar) as samples. Raises BadQuery, PrometheusUnavailable."""
        try:
            result = self._client.custom_query(promql, params={"timeout": f"{max(1, int(self.timeout_s * 1000))}ms"})
        except PrometheusApiClientException as exc:
            text = str(exc)
            if "HTTP Status Code 400" in text or "HTTP Status Code 422" in text:
                raise BadQuery(f"Prometheus rejected the query {promql!r}: {_prom_error(text)}") from None
            raise PrometheusUnavailable(f"Prometheus at {self.url} failed: {_prom_error(text)}") from None
        except requests.Timeout:
            raise PrometheusUnavailable(f"Prometheus at {self.url} did not answer within {self.timeout_s:g}s") from None
        except requests.RequestException as exc:
            # Without retries urllib3 wraps a read timeout in MaxRetryError, which requests reports as ConnectionError.
            if "timed out" in str(exc).lower():
                raise PrometheusUnavailable(
                    f"Prometheus at {self.url} did not answer within {self.timeout_s:g}s") from None
            raise PrometheusUnavailable(f"cannot reach Prometheus at {self.url}: {_reason(exc)}") from None
        except ValueError as exc:  # not JSON
            raise PrometheusUnavailable(f"Prometheus at {self.url} sent an unreadable answer: {exc}") from None
        if isinstance(result, dict) or (result and isinstance(result[0], (int, float, str))):
            # scalar: [time, "value"]
            value = result[1] if isinstance(result, list) else result.get("value", [0, "NaN"])[1]
            return [Sample({}, float(value))]
        return [Sample(dict(r.get("metric", {})), float(r["value"][1])) for r in result]

    def scalar(self, promql: str) -> float:
        """The one value of a query that must return exactly one finite number; NoData otherwise."""
        samples = self.query(promql)
        if not samples:
            raise NoData(f"{promql!r} returned an empty vector")
        if len(samples) > 1:
            raise NoData(f"{promql!r} returned {len(samples)} series, expected one (aggregate it with sum)")
        value = samples[0].value
        if math.isnan(value) or math.isinf(value):
            raise NoData(f"{promql!r} returned {value}")
        return value


def _reason(exc: Exception) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "Connection reset"):
        if marker in text:
            return marker.lower()
    return type(exc).__name__


def _prom_error(text: str) -> str:
    # "HTTP Status Code 400 (b'{"status":"error","errorType":"bad_data","error":"..."}')"
    start = text.find("{")
    if start >= 0:
        raw = text[start: text.rfind("}") + 1].encode().decode("unicode_escape")
        try:
            body = json.loads(raw)
            return f"{body.get('errorType', 'error')}: {body.get('error', raw)}"
        except ValueError:
            pass
    return text

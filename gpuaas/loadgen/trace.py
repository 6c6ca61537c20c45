"""Request-arrival traces (the Azure LLM inference trace format: TIMESTAMP, ContextTokens, GeneratedTokens).

Arrivals become `Request`s with a service time from the service model; `rate_scale` K replays each arrival K times,
the copies spread evenly within the arrival's second."""
from __future__ import annotations

import csv
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file, the line and the field."""


@dataclass(frozen=True)
class Arrival:
    t: float  # seconds since the first arrival of the trace
    context_tokens: int
    generated_tokens: int


def _parse_time(raw: str, where: str) -> dt.datetime:
    text = raw.strip()
    # Python parses at most 6 fractional digits; the trace has 7.
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(f"{where}: field 'TIMESTAMP' is not a time, got {raw!r}") from None


def _tokens(row: dict, field: str, where: str) -> int:
    raw = (row.get(field) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{where}: field {field!r} must be a whole number, got {raw!r}") from None
    if value < 0:
        raise TraceError(f"{where}: field {field!r} must not be negative, got {raw!r}")
    return value


def load_trace(path: str | Path) -> list[Arrival]:
    """Read an arrival trace; times become seconds since its first row. Rows must be sorted by time."""
    path = Path(path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}")
        out: list[Arrival] = []
        t0: dt.datetime | None = None
        last = 0.0
        for line, row in enumerate(reader, start=2):
            where = f"{path}:{line}"
            when = _parse_time(row["TIMESTAMP"], where)
            t0 = t0 or when
            t = (when - t0).total_seconds()
            if t < last:
                raise TraceError(f"{where}: field 'TIMESTAMP' goes back in time ({row['TIMESTAMP']})")
            last = t
            out.append(Arrival(t, _tokens(row, "ContextTokens", where), _tokens(row, "GeneratedTokens", where)))
    if not out:
        raise TraceError(f"{path}: no arrivals")
    return out


def scale_rate(arrivals: list[Arrival], k: int) -> list[Arrival]:
    """Each arrival K times: copy i of an arrival at second s + f comes at s + ((f + i/K) mod 1)."""
    if k < 1:
        raise TraceError(f"rate scale must be a whole number >= 1, got {k}")
    if k == 1:
        return list(arrivals)
    out = []
    for a in arrivals:
        second = float(int(a.t))
        frac = a.t - second
        for i in range(k):
            out.append(Arrival(second + (frac + i / k) % 1.0, a.context_tokens, a.generated_tokens))
    out.sort(key=lambda a: a.t)
    return out


def window(arrivals: list[Arrival], offset_s: float = 0.0, duration_s: float | None = None,
           preroll_s: float = 0.0) -> list[Arrival]:
    """The trace from `offset_s - preroll_s` on, wrapping around (the trace repeats every `span` = its last arrival
    + 1 s, as the demo replays it), for `preroll_s + duration_s` seconds (default duration: what is left of one span
    after `offset_s`), times shifted to start at 0: the first `preroll_s` seconds are those before `offset_s`."""
    if not arrivals:
        return []
    if offset_s < 0 or preroll_s < 0 or (duration_s is not None and duration_s <= 0):
        raise TraceError(f"need offset >= 0, pre-roll >= 0 and duration > 0, got {offset_s}, {preroll_s}, "
                         f"{duration_s}")
    span = arrivals[-1].t + 1.0
    if offset_s == 0 and preroll_s == 0 and duration_s is None:
        return list(arrivals)
    start = (offset_s - preroll_s) % span
    length = preroll_s + (duration_s if duration_s is not None else span - offset_s % span)
    out: list[Arrival] = []
    turns = 0
    while turns * span < length + start:
        for a in arrivals:
            t = a.t + turns * span - start
            if 0 <= t < length:
                out.append(Arrival(t, a.context_tokens, a.generated_tokens))
        turns += 1
    out.sort(key=lambda a: a.t)
    return out


def synthetic_trace(duration_s: float = 3600.0, *, mean_rate: float = 2.0, seed: int = 0) -> list[Arrival]:
    """A stand-in for the Azure code trace where it is not at hand (its licence keeps it out of the repository):
    Poisson arrivals at `mean_rate` per second modulated by slow waves and short bursts, with log-normal token counts
    of the same medians (context ~1,500, generated ~13 tokens)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    # Rate per second: a slow wave, plus a burst of 2-4x lasting 20-60 s about every five minutes.
    t = np.arange(int(duration_s))
    rate = mean_rate * (1.0 + 0.4 * np.sin(2 * np.pi * t / 900.0))
    for start in rng.uniform(0, duration_s, size=max(1, int(duration_s / 300))):
        length = rng.uniform(20, 60)
        rate[(t >= start) & (t < start + length)] *= rng.uniform(2.0, 4.0)
    counts = rng.poisson(rate)
    times = np.sort(np.concatenate([s + rng.random(n) for s, n in zip(t, counts, strict=True)]))
    context = np.maximum(1, rng.lognormal(np.log(1470), 0.9, size=len(times))).astype(int)
    generated = np.maximum(1, rng.lognormal(np.log(13), 1.1, size=len(times))).astype(int)
    t0 = times[0] if len(times) else 0.0
    return [Arrival(float(x - t0), int(c), int(g)) for x, c, g in zip(times, context, generated, strict=True)]


def write_trace(path: str | Path, arrivals: list[Arrival], start: dt.datetime = dt.datetime(2026, 1, 1)) -> None:
    """`arrivals` as a trace file `load_trace` reads back (the Azure LLM format)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for a in arrivals:
            w.writerow([(start + dt.timedelta(seconds=a.t)).isoformat(sep=" "), a.context_tokens, a.generated_tokens])

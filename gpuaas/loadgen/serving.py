"""A model of LLM inference replicas serving a request trace, in simulated time.

The service model (defaults are the ones `gpuaas simulate autoscaling --help` and docs/autoscaling.md state):

- one replica = one GPU; it serves up to `concurrency` (8) requests at once;
- a request takes `ContextTokens / 5000 + GeneratedTokens / 20` seconds once it starts, whatever else runs;
- a replica serves `cold_start_s` (60 s) after it is asked for, and costs GPU time from that moment;
- a gateway routes each arriving request to the serving replica with the fewest outstanding requests (running plus
  waiting; vLLM behind a least-request load balancer); each replica queues what it cannot start (FIFO), but holds at
  most `max_waiting` (8) waiting requests: the rest wait at the gateway (FIFO) and go to the first replica with room, so
  that a backlog is not stranded on the replicas that were there when it built up and new replicas take their share;
- a replica being removed takes no new requests, hands its queued ones back to the gateway's routing and finishes those
  it runs; a replica removed before it serves is gone at once. Its GPU time ends when it is gone.

Each replica exports what vLLM does per pod: requests waiting (a gauge), requests running (a gauge), requests received
and finished (counters) and the seconds spent serving finished requests (a counter). The system also keeps the time
integral of the requests in flight (running, waiting on a replica or at the gateway), from which Knative's per-second
average concurrency is read (`inflight_seconds`). The same `ServingSystem` runs in
`gpuaas simulate autoscaling` (advanced by simulated time) and in the load replayer (advanced by the wall clock).
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field, replace

from .trace import Arrival


@dataclass(frozen=True)
class ServiceModel:
    concurrency: int = 8
    prefill_tokens_per_s: float = 5000.0
    decode_tokens_per_s: float = 20.0
    cold_start_s: float = 60.0
    scrape_interval_s: float = 15.0
    slo_queue_wait_s: float = 2.0
    max_waiting: int = 8  # waiting requests one replica holds; more wait at the gateway

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s", "scrape_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("cold_start_s", "slo_queue_wait_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def service_time(self, context_tokens: int, generated_tokens: int) -> float:
        return context_tokens / self.prefill_tokens_per_s + generated_tokens / self.decode_tokens_per_s


@dataclass(frozen=True)
class ReplicaMetrics:
    """What one replica exports, as a Prometheus scrape would see it."""
    waiting: int
    running: int
    received_total: int
    finished_total: int
    service_seconds_total: float


@dataclass
class Replica:
    name: str
    asked_at: float
    ready_at: float
    seq: int = 0  # creation order: ties between equally loaded replicas go to the oldest
    serving: bool = False
    draining: bool = False
    gone_at: float | None = None
    running: int = 0
    queue: deque = field(default_factory=deque)  # request indices, FIFO
    received_total: int = 0
    finished_total: int = 0
    service_seconds_total: float = 0.0

    @property
    def outstanding(self) -> int:
        return self.running + len(self.queue)

    def metrics(self) -> ReplicaMetrics:
        return ReplicaMetrics(len(self.queue), self.running, self.received_total, self.finished_total,
                              self.service_seconds_total)


_READY, _DONE = 0, 1


class ServingSystem:
    """Replicas serving a trace. Call `advance(t)` to move time forward; add and remove replicas in between."""

    def __init__(self, model: ServiceModel, arrivals: list[Arrival]):
        self.model = model
        self.arrival_t = [a.t for a in arrivals]
        self.service = [model.service_time(a.context_tokens, a.generated_tokens) for a in arrivals]
        self.start_t: list[float] = [math.nan] * len(arrivals)
        self.replicas: dict[str, Replica] = {}
        self.gateway: deque[int] = deque()
        self.now = 0.0
        self._next = 0  # next arrival to process
        self._events: list[tuple[float, int, int, str, int]] = []  # (time, seq, kind, replica name, request)
        self._seq = 0
        self._created = 0
        # Serving replicas that take requests, by outstanding count (routing picks the least loaded in O(room)).
        self._by_load: list[dict[int, Replica]] = [{} for _ in range(model.concurrency + model.max_waiting + 1)]
        self._inflight = 0  # requests arrived and not finished
        self.arrival_limit: int | None = None  # arrivals from this index on are held back (what-if forks)
        self._inflight_area = 0.0  # integral of _inflight over time, up to _area_t
        self._area_t = 0.0

    # ---- replicas -----------------------------------------------------------------------------------------------
    def add_replica(self, name: str, now: float | None = None, cold_start_s: float | None = None) -> Replica:
        now = self.now if now is None else now
        if name in self.replicas and self.replicas[name].gone_at is None:
            raise ValueError(f"replica {name} already exists")
        delay = self.model.cold_start_s if cold_start_s is None else cold_start_s
        self._created += 1
        r = Replica(name, asked_at=now, ready_at=now + delay, seq=self._created)
        self.replicas[name] = r
        self._push(r.ready_at, _READY, name)
        return r

    def remove_replica(self, name: str, now: float | None = None) -> None:
        now = self.now if now is None else now
        r = self.replicas[name]
        if r.gone_at is not None or r.draining:
            return
        r.draining = True
        if not r.serving:
            r.gone_at = now
            return
        del self._by_load[r.outstanding][r.seq]
        requeued, r.queue = list(r.queue), deque()
        self.gateway.extendleft(reversed(requeued))  # back to the head of the gateway's queue, in order
        self._dispatch(now)
        if r.running == 0:
            r.gone_at = now

    def remove_replicas(self, n: int, now: float | None = None) -> None:
        """Remove `n` replicas as a ReplicaSet picks the pods to delete: not yet serving first (the newest first), then
        the least busy."""
        live = self.live()
        live.sort(key=lambda r: (r.serving, r.outstanding, -r.asked_at))
        for r in live[:n]:
            self.remove_replica(r.name, now)

    def fork(self) -> ServingSystem:
        """An independent copy of the system as it is now (the arrivals and service times shared, read-only), for
        what-if runs. Replicas already gone are left out."""
        new = object.__new__(ServingSystem)
        new.model, new.arrival_t, new.service = self.model, self.arrival_t, self.service
        new.start_t = list(self.start_t)
        new.replicas = {n: replace(r, queue=deque(r.queue)) for n, r in self.replicas.items() if r.gone_at is None}
        new.gateway = deque(self.gateway)
        new.now, new._next, new._events, new._seq, new._created = (self.now, self._next, list(self._events),
                                                                   self._seq, self._created)
        new._by_load = [{} for _ in self._by_load]
        for r in new.replicas.values():
            if r.serving and not r.draining:
                new._by_load[r.outstanding][r.seq] = r
        new._inflight, new._inflight_area, new._area_t = self._inflight, self._inflight_area, self._area_t
        new.arrival_limit = self.arrival_limit
        return new

    def live(self) -> list[Replica]:
        """Replicas asked for and not being removed (what a Deployment's replica count means)."""
        return [r for r in self.replicas.values() if not r.draining]

    def serving(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.serving and not r.draining]

    # ---- time -----------------------------------------------------------------------------------------------------
    def advance(self, until: float) -> None:
        arrival_t, events = self.arrival_t, self._events
        n = len(arrival_t) if self.arrival_limit is None else min(len(arrival_t), self.arrival_limit)
        while True:
            t_arr = arrival_t[self._next] if self._next < n else math.inf
            t_ev = events[0][0] if events else math.inf
            t = min(t_arr, t_ev)
            if t > until:
                break
            self._inflight_area += self._inflight * (t - self._area_t)
            self._area_t = t
            if t_ev <= t_arr:
                _, _, kind, name, i = heapq.heappop(events)
                self._on_event(t_ev, kind, name, i)
            else:
                i = self._next
                self._next += 1
                self._inflight += 1
                self._route(i, t_arr)
        self.now = max(self.now, until)
        if until > self._area_t:
            self._inflight_area += self._inflight * (until - self._area_t)
            self._area_t = until

    @property
    def done(self) -> bool:
        """Every request has arrived and started."""
        return self._next >= len(self.arrival_t) and not self.gateway and all(
            not r.queue for r in self.replicas.values())

    # ---- metrics --------------------------------------------------------------------------------------------------
    def replica_metrics(self) -> dict[str, ReplicaMetrics]:
        """Metrics of the replicas that serve (a replica still starting exports nothing, like a loading vLLM)."""
        return {r.name: r.metrics() for r in self.replicas.values() if r.serving and r.gone_at is None}

    def gateway_waiting(self) -> int:
        return len(self.gateway)

    def inflight(self) -> int:
        """Requests arrived and not finished: running, waiting on a replica or at the gateway."""
        return self._inflight

    def inflight_seconds(self, now: float | None = None) -> float:
        """The integral of `inflight()` over time from 0 to `now` (at most the time advanced to): the difference over
        a second is that second's average concurrency, what Knative's queue-proxy and activator report."""
        now = self.now if now is None else now
        return self._inflight_area + self._inflight * (now - self._area_t)

    def arrived_total(self) -> int:
        """Requests that have reached the gateway (its request counter)."""
        return self._next

    def gpu_seconds(self, now: float | None = None) -> float:
        now = self.now if now is None else now
        return sum((r.gone_at if r.gone_at is not None else now) - r.asked_at for r in self.replicas.values())

    def queue_waits(self, now: float | None = None) -> list[float]:
        """Queue wait of every request that has arrived; one not started yet counts its wait so far."""
        now = self.now if now is None else now
        arrived = zip(self.arrival_t[: self._next], self.start_t[: self._next], strict=True)
        return [(s if s == s else now) - a for a, s in arrived]

    # ---- internals -------------------------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, name: str, i: int = -1) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, name, i))

    def _route(self, i: int, now: float) -> None:
        if self.gateway:  # first come, first served: nobody overtakes the gateway's queue
            self.gateway.append(i)
            self._dispatch(now)
            return
        best = self._least_loaded()
        if best is None:
            self.gateway.append(i)
            return
        self._assign(best, i, now)

    def _least_loaded(self) -> Replica | None:
        """The serving replica with the fewest outstanding requests and room for one more (the oldest of equals)."""
        for bucket in self._by_load[:-1]:
            if bucket:
                return bucket[min(bucket)]
        return None

    def _dispatch(self, now: float) -> None:
        while self.gateway:
            best = self._least_loaded()
            if best is None:
                return
            self._assign(best, self.gateway.popleft(), now)

    def _assign(self, best: Replica, i: int, now: float) -> None:
        best.received_total += 1
        load = self._by_load
        del load[best.outstanding][best.seq]
        load[best.outstanding + 1][best.seq] = best
        if best.running < self.model.concurrency:
            self._start(best, i, now)
        else:
            best.queue.append(i)

    def _start(self, r: Replica, i: int, now: float) -> None:
        r.running += 1
        self.start_t[i] = now
        self._push(now + self.service[i], _DONE, r.name, i)

    def _on_event(self, t: float, kind: int, name: str, i: int) -> None:
        r = self.replicas.get(name)
        if r is None:  # a replica gone before it served, left out of a fork
            return
        if kind == _READY:
            if r.draining or r.gone_at is not None:
                return
            r.serving = True
            self._by_load[r.outstanding][r.seq] = r
            self._dispatch(t)
            return
        # a request finished on r
        self._inflight -= 1
        if not r.draining:
            del self._by_load[r.outstanding][r.seq]
            self._by_load[r.outstanding - 1][r.seq] = r
        r.running -= 1
        r.finished_total += 1
        r.service_seconds_total += self.service[i]
        if r.queue:
            self._start(r, r.queue.popleft(), t)
        if self.gateway:
            self._dispatch(t)
        if r.draining and r.running == 0 and not r.queue:
            r.gone_at = t

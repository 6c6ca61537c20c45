"""Configuration of `gpuaas autoscaler` and of the custom-metrics API (pydantic: validated at start, errors name the
field). A YAML file:

    prometheus: {url: http://prometheus:9090, timeout_s: 5}
    interval_s: 15
    dry_run: false
    leader_election: {name: gpuaas-autoscaler}   # Lease in the pod's namespace; see runtime/leader.py for the timings
    targets:
      - deployment: llm            # scaled through its scale subresource
        namespace: inference
        min_replicas: 1
        max_replicas: 40
        concurrency: 8             # requests one replica serves at once
        cold_start_s: 60           # from asking for a replica to its first request
        queries: {}                # PromQL templates; the defaults below fit vLLM plus the gpuaas gateway counters

Query templates are formatted with {namespace}, {deployment}, {pods} (a regex alternation of the target's pod names)
and the windows {rate_window}, {short_rate_window}, {service_window}. The names are Kubernetes names (checked here) and
are escaped as PromQL string contents besides (autoscaler/prom.py), so a template writes them between double quotes.
"""
from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runtime.config import ConfigError, M, load_config, validate  # noqa: F401 (ConfigError: part of this module's API)
from runtime.leader import LeaderElectionConfig
from scoring.names import dns1123_label, dns1123_subdomain

from .policy import QueueDepthConfig
from .prom import escape_label_value, regex_alternation

DEFAULT_QUERIES = {
    "queue_per_pod": 'sum by (pod) (vllm:num_requests_waiting{{namespace="{namespace}",pod=~"{pods}"}})',
    "gateway_waiting": 'sum(gpuaas_gateway_requests_waiting{{namespace="{namespace}",deployment="{deployment}"}})',
    "arrival_rate": 'sum(rate(gpuaas_gateway_requests_total{{namespace="{namespace}",deployment="{deployment}"}}'
                    '[{rate_window}]))',
    "arrival_rate_short": 'sum(rate(gpuaas_gateway_requests_total{{namespace="{namespace}",'
                          'deployment="{deployment}"}}[{short_rate_window}]))',
    "service_time": 'sum(rate(vllm:request_inference_time_seconds_sum{{namespace="{namespace}",pod=~"{pods}"}}'
                    '[{service_window}])) / sum(rate(vllm:request_inference_time_seconds_count{{'
                    'namespace="{namespace}",pod=~"{pods}"}}[{service_window}]))',
}
PLACEHOLDERS = {"namespace", "deployment", "pods", "rate_window", "short_rate_window", "service_window"}
REQUIRED_QUERIES = ("queue_per_pod", "arrival_rate")
DURATION = re.compile(r"^[0-9]+(ms|s|m|h)$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrometheusConfig(Strict):
    url: str = Field("http://127.0.0.1:9090", description="base URL of the Prometheus HTTP API")
    timeout_s: float = Field(5.0, gt=0, description="a query not answered within this long counts as Prometheus "
                             "unavailable")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"must be an http(s) URL, got {v!r}")
        return v


class Windows(Strict):
    rate_window: str = Field("1m", description="range of the arrival rate (`{rate_window}` in the queries)")
    short_rate_window: str = Field("30s", description="range of the short arrival rate; the larger of the two rates "
                                   "counts")
    service_window: str = Field("2m", description="range over which the mean service time is measured")

    @field_validator("rate_window", "short_rate_window", "service_window")
    @classmethod
    def _duration(cls, v: str) -> str:
        if not DURATION.match(v):
            raise ValueError(f"must be a PromQL duration such as 30s or 2m, got {v!r}")
        return v


class Target(Strict):
    deployment: str = Field(description="Deployment to scale, through its scale subresource (a DNS-1123 subdomain)")
    namespace: str = Field("default", description="namespace of the Deployment (a DNS-1123 label)")
    min_replicas: int = Field(1, ge=0, description="fewest replicas; at most max_replicas")
    max_replicas: int = Field(100, ge=1, description="most replicas")
    concurrency: int = Field(8, ge=1, description="requests one replica serves at once")
    cold_start_s: float = Field(60.0, ge=0, description="from asking for a replica to its first request")
    beta: float = Field(1.0, ge=0, description="square-root staffing: slots = R + beta x sqrt(R), R = arrival rate x "
                        "service time")
    drain_s: float | None = Field(None, gt=0, description="the visible queue is sized to drain within this long; "
                                  "unset: cold_start_s")
    scale_down_window_s: float | None = Field(None, ge=0, description="how long past recommendations are "
                                              "remembered; unset: 30 x cold_start_s")
    hold_shape: Literal["flat", "linear"] = Field("linear", description="flat: hold the highest recommendation of the "
                                                  "window; linear: an older one counts for less, down to hold_floor")
    hold_floor: float = Field(0.0, ge=0, le=1, description="share of a recommendation still held at the end of the "
                              "window (hold_shape linear); 0: the memory fades out without a step")
    default_service_time_s: float = Field(1.0, gt=0, description="service time assumed until a request has "
                                          "finished")
    windows: Windows = Field(Windows(), description="PromQL ranges the default queries use")
    queries: dict[str, str] = Field(default_factory=dict, description="PromQL templates that replace the defaults "
                                    "listed below, by name; \"\" switches an optional one off")

    @field_validator("deployment")
    @classmethod
    def _deployment(cls, v: str) -> str:
        return dns1123_subdomain(v, None)  # pydantic names the field

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return dns1123_label(v, None)  # pydantic names the field

    @field_validator("queries")
    @classmethod
    def _queries(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(v) - set(DEFAULT_QUERIES))
        if unknown:
            raise ValueError(f"unknown query {', '.join(unknown)}; known: {', '.join(DEFAULT_QUERIES)}")
        for name, template in v.items():
            try:
                fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            except ValueError as exc:
                raise ValueError(f"{name}: not a valid template ({exc}); write literal braces as {{{{ }}}}") from None
            bad = sorted(fields - PLACEHOLDERS)
            if bad:
                raise ValueError(f"{name}: unknown placeholder {', '.join('{' + b + '}' for b in bad)}; "
                                 f"known: {', '.join(sorted(PLACEHOLDERS))}")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> Target:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        return self

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.deployment}"

    def query(self, name: str, pods: list[str]) -> str | None:
        template = self.queries.get(name, DEFAULT_QUERIES[name])
        if not template:  # an optional query switched off with ""
            return None
        return template.format(namespace=escape_label_value(self.namespace),
                               deployment=escape_label_value(self.deployment),
                               pods=escape_label_value(regex_alternation(pods)), **self.windows.model_dump())

    def required_query(self, name: str, pods: list[str]) -> str:
        """One of REQUIRED_QUERIES, which the config does not let be switched off."""
        q = self.query(name, pods)
        if q is None:
            raise ValueError(f"target {self.key}: query {name} is required and may not be empty")
        return q

    def policy_config(self, sync_period_s: float) -> QueueDepthConfig:
        return QueueDepthConfig(min_replicas=self.min_replicas, max_replicas=self.max_replicas,
                                concurrency=self.concurrency, cold_start_s=self.cold_start_s, beta=self.beta,
                                drain_s=self.drain_s, scale_down_window_s=self.scale_down_window_s,
                                hold_shape=self.hold_shape, hold_floor=self.hold_floor,
                                default_service_time_s=self.default_service_time_s, sync_period_s=sync_period_s)


IDLE_QUERIES = {
    # dcgm-exporter: one series per GPU, with the namespace and pod of the pod it is assigned to ("" when none is)
    "gpu_util": 'avg by (namespace, pod) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{{pod!=""}}[{window}]))',
    "engine_active": 'avg by (namespace, pod) (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{pod!=""}}[{window}]))',
}


class IdleGpusConfig(Strict):
    """Idle GPUs (scoring/idle.py): workloads that hold GPUs and use less than `threshold` of them over `window_s`,
    from dcgm-exporter's series in Prometheus; exported as gauges on /metrics and as an event on the workload."""
    enabled: bool = Field(True, description="look for idle GPUs every interval_s (the leader only)")
    interval_s: float = Field(60.0, gt=0, description="seconds between looks")
    window_s: float = Field(3600.0, gt=0, description="the window a workload's use is averaged over")
    threshold: float = Field(0.05, ge=0, le=1, description="a workload using less than this share of its GPUs over "
                             "the window is idle (GPU-weighted; per pod the larger of DCGM_FI_DEV_GPU_UTIL / 100 and "
                             "DCGM_FI_PROF_GR_ENGINE_ACTIVE)")
    min_age_s: float = Field(600.0, ge=0, description="pods that started less than this long ago are not judged (a "
                             "model still loading)")
    queries: dict[str, str] = Field(default_factory=dict, description="PromQL templates replacing gpu_util and "
                                    "engine_active by name ({window} is the window); \"\" switches one off. Both "
                                    "must return one series per namespace and pod")

    @field_validator("queries")
    @classmethod
    def _queries(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(v) - set(IDLE_QUERIES))
        if unknown:
            raise ValueError(f"unknown query {', '.join(unknown)}; known: {', '.join(IDLE_QUERIES)}")
        for name, template in v.items():
            try:
                fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            except ValueError as exc:
                raise ValueError(f"{name}: not a valid template ({exc}); write literal braces as {{{{ }}}}") from None
            if fields - {"window"}:
                raise ValueError(f"{name}: unknown placeholder {', '.join(sorted(fields - {'window'}))}; "
                                 "known: window")
        if all(not v.get(n, IDLE_QUERIES[n]) for n in IDLE_QUERIES):
            raise ValueError("switching off both queries leaves nothing to measure")
        return v

    def query(self, name: str) -> str | None:
        template = self.queries.get(name, IDLE_QUERIES[name])
        return template.format(window=f"{max(1, round(self.window_s))}s") if template else None


class AutoscalerLeaderElection(LeaderElectionConfig):
    name: str = Field(default="gpuaas-autoscaler", description="name of the Lease")


class AutoscalerConfig(Strict):
    prometheus: PrometheusConfig = Field(PrometheusConfig(), description="where the metrics come from")
    interval_s: float = Field(15.0, gt=0, description="seconds between syncs of every target")
    dry_run: bool = Field(False, description="decide and record events, never change a replica count")
    leader_election: AutoscalerLeaderElection = Field(AutoscalerLeaderElection(),
                                                      description="the Lease that keeps one replica acting")
    targets: list[Target] = Field(min_length=1, description="the Deployments to scale, each namespace/name once")
    idle_gpus: IdleGpusConfig = Field(IdleGpusConfig(), description="workloads holding GPUs they do not use")

    @model_validator(mode="after")
    def _unique(self) -> AutoscalerConfig:
        keys = [t.key for t in self.targets]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise ValueError(f"target {', '.join(dup)} listed more than once")
        for t in self.targets:
            for name in REQUIRED_QUERIES:
                if name in t.queries and not t.queries[name]:
                    raise ValueError(f"target {t.key}: query {name} is required and may not be empty")
        return self


class MetricRule(Strict):
    """One metric the custom-metrics API serves: per pod from `series`, per object (a Deployment: the sum over its
    pods, plus `extra_object_query` if given) from the same series."""
    name: str = Field(description="metric name the HPA asks for (`metric: {name: ...}`)")
    series: str = Field("vllm:num_requests_waiting", description="the per-pod Prometheus series; it must carry "
                        "`namespace` and `pod` labels")
    extra_object_query: str | None = Field(None, description="PromQL added to a Deployment's value (e.g. requests "
                                           "waiting at a gateway); placeholders {namespace} and {deployment}")

    @field_validator("name")
    @classmethod
    def _metric_name(cls, v: str) -> str:
        if not re.match(r"^[a-z0-9]([-_a-z0-9]*[a-z0-9])?$", v):
            raise ValueError(f"must be lowercase letters, digits, '-' or '_', got {v!r}")
        return v

    @field_validator("series")
    @classmethod
    def _series(cls, v: str) -> str:
        if not re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$", v):
            raise ValueError(f"must be a Prometheus metric name, got {v!r}")
        return v

    @field_validator("extra_object_query")
    @classmethod
    def _extra(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(v) if f is not None}
        except ValueError as exc:
            raise ValueError(f"not a valid template ({exc}); write literal braces as {{{{ }}}}") from None
        bad = sorted(fields - {"namespace", "deployment"})
        if bad:
            unknown = ", ".join("{" + b + "}" for b in bad)
            raise ValueError(f"unknown placeholder {unknown}; known: deployment, namespace")
        return v


class AuthorizationConfig(Strict):
    """Delegated authorization of the user behind each request (runtime/authz.py); the defaults are those of
    k8s.io/apiserver's delegating authorizer (answers cached 10 s, system:masters never asked about)."""
    enabled: bool = Field(True, description="ask kube-apiserver (SubjectAccessReview) whether the user may read the "
                          "metric; off: any user the aggregator lets through may")
    allow_ttl_s: float = Field(10.0, ge=0, description="seconds an allowed answer is cached")
    deny_ttl_s: float = Field(10.0, ge=0, description="seconds a denied answer is cached")
    cache_size: int = Field(8192, ge=0, description="answers cached at most (least recently used go first)")
    always_allow_groups: list[str] = Field(["system:masters"], description="groups allowed without a review")
    timeout_s: float = Field(10.0, gt=0, description="seconds to wait for a SubjectAccessReview")


class MetricsApiConfig(Strict):
    prometheus: PrometheusConfig = Field(PrometheusConfig(), description="where the metrics come from")
    metrics: list[MetricRule] = Field(default_factory=lambda: [MetricRule(name="queue_depth")], min_length=1,
                                      description="the metrics served")
    allowed_client_names: list[str] = Field(["front-proxy-client"], description="client-certificate CNs (signed by "
                                            "the front-proxy CA) that may call the API")
    authorization: AuthorizationConfig = Field(AuthorizationConfig(), description="who may read which metric: a "
                                               "SubjectAccessReview of the user the aggregator vouches for")


ENV_PREFIX = "GPUAAS_AUTOSCALER_"
METRICS_API_ENV_PREFIX = "GPUAAS_METRICS_API_"


def parse(model: type[M], raw: object, where: str = "config") -> M:
    return validate(model, raw, where)


def load_autoscaler_config(path: Path | str | None, *, environ: dict[str, str] | None = None) -> AutoscalerConfig:
    """The file, then GPUAAS_AUTOSCALER_* environment variables (runtime/config.py)."""
    return load_config(AutoscalerConfig, path, env_prefix=ENV_PREFIX, environ=environ)


def load_metrics_api_config(path: Path | str | None, *, environ: dict[str, str] | None = None) -> MetricsApiConfig:
    """The file (optional), then GPUAAS_METRICS_API_* environment variables (runtime/config.py)."""
    return load_config(MetricsApiConfig, path, env_prefix=METRICS_API_ENV_PREFIX, environ=environ)

"""Settings of the extender service: a file (`--config`), then GPUAAS_EXTENDER_* environment variables, then flags."""
from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scoring.policies import known_policy

ENV_PREFIX = "GPUAAS_EXTENDER_"


class TlsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cert_file: Path = Field(description="PEM serving certificate (with its chain) for the extender's Service name")
    key_file: Path = Field(description="PEM private key of `cert_file`")
    client_ca_file: Path = Field(description="PEM CA bundle that signs the client certificate kube-scheduler presents "
                                 "(its extender `tlsConfig.certFile`): filter, prioritize and bind need a certificate "
                                 "from it whose common name is in `client_names`; other certificates from it are users "
                                 "for /explain and /metrics (CN the user, O the groups)")
    client_names: list[str] = Field(default=["system:kube-scheduler"], min_length=1, description="common names of "
                                    "the client certificates that may call filter, prioritize and bind (and read "
                                    "/explain and /metrics)")


class ExtenderConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="127.0.0.1", description="address to listen on; without `tls` only a loopback address "
                      "(127.0.0.1, ::1, localhost): plain HTTP authenticates no caller")
    port: int = Field(default=8888, ge=0, le=65535, description="port to listen on (0: any free port)")
    policy: str = Field(default="gpuaas", description="scoring policy for prioritize and device choice (the "
                        "policies are listed below)")
    kubeconfig: Path | None = Field(default=None, description="kubeconfig file; unset: the in-cluster service account")
    snapshot: Path | None = Field(default=None, description="serve from a `kubectl get nodes,pods -A -o yaml` dump "
                                  "instead of a live cluster (for debugging a decision offline; bind is refused)")
    tls: TlsConfig | None = Field(default=None, description="serve HTTPS (kube-scheduler's `enableHTTPS`); unset: "
                                  "plain HTTP")
    assume_ttl_seconds: float = Field(default=30.0, gt=0, description="how long a binding of ours waits for the "
                                      "watch before its GPUs are released")
    max_body_bytes: int = Field(default=8 * 2**20, ge=1024, description="larger requests get 413")
    scheduler_names: list[str] = Field(default=["default-scheduler", "gpuaas-scheduler"], min_length=1,
                                       description="the kube-scheduler profiles that call this extender: bind refuses "
                                       "a pod whose spec.schedulerName is another")
    idle_timeout_seconds: float = Field(default=15.0, gt=0, description="a connection that has not sent a complete "
                                        "request header this long after connecting or after its last reply is "
                                        "closed (idle keep-alive connections, and clients sending headers slowly)")
    token_review_ttl_seconds: float = Field(default=10.0, ge=0, description="how long who a bearer token belongs to "
                                            "(TokenReview) and what that user may do (SubjectAccessReview) are cached")
    read_timeout_seconds: float = Field(default=5.0, gt=0, description="a request body slower than this gets 408")
    resync_seconds: float = Field(default=300.0, gt=0, description="list nodes and pods again this often, besides "
                                  "watching them")
    max_watch_stale_seconds: float = Field(default=60.0, gt=0, description="/readyz fails once the node or pod "
                                           "watch has been broken this long (no watch open, no list, event or "
                                           "bookmark since), and says which and why")
    queue_planning_min_pods: int = Field(default=16, ge=0, description="plan the pending GPU pods jointly "
                                         "(scoring/queueplan.py) while at least this many wait, and steer each to "
                                         "its planned node; below it, or 0, every pod is placed on its own")
    queue_plan_refresh_seconds: float = Field(default=2.0, gt=0, description="the joint plan is updated after "
                                              "this long with the pods bound, arrived or gone meanwhile (made again "
                                              "in full when one it leaves out turned overdue, when updates placed "
                                              "half as many pods as it took in, or every 30 s)")
    queue_max_wait_seconds: float = Field(default=120.0, gt=0, description="a pod left out of joint plans this long "
                                          "goes first in the next one, made in full at once")
    queue_plan_window: int = Field(default=64, ge=0, description="a joint plan reorders pods (largest first) only "
                                   "within windows of this many arrivals, so that arrival order holds between "
                                   "windows and small pods are not all passed over in a burst; 0: the whole queue")
    decide_in_filter: bool = Field(default=True, description="answer filter with gpuaas's one chosen node for a GPU "
                                   "pod whose placement kube-scheduler's own scores would not change (no preferred "
                                   "node or pod affinity, no ScheduleAnyway or default topology spreading, no DRA "
                                   "claims, no untolerated PreferNoSchedule taint on a candidate, no placed pod's "
                                   "affinity term selecting it): kube-scheduler then runs no score plugin and no "
                                   "prioritize for it; its image locality no longer weighs in there. false: every "
                                   "pod gets every feasible node, then prioritize")
    log_format: Literal["json", "text"] = Field(default="json", description="JSON lines, or text for humans")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="least severe "
                                                                    "level logged")

    @model_validator(mode="after")
    def _known_policy(self) -> ExtenderConfig:
        known_policy(self.policy)
        return self

    @model_validator(mode="after")
    def _plain_http_on_loopback_only(self) -> ExtenderConfig:
        if self.tls is None and not is_loopback(self.host):
            raise ValueError(f"host: {self.host} is reachable from other machines, and without tls (a serving "
                             "certificate and the CA of kube-scheduler's client certificate) anyone who reaches it "
                             "could bind pods; set tls, or listen on 127.0.0.1")
        return self


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

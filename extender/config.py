"""Settings of the extender service: a file (`--config`), then GPUAAS_EXTENDER_* environment variables, then flags."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scoring.policies import known_policy

ENV_PREFIX = "GPUAAS_EXTENDER_"


class TlsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cert_file: Path = Field(description="PEM serving certificate (with its chain) for the extender's Service name")
    key_file: Path = Field(description="PEM private key of `cert_file`")


class ExtenderConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="0.0.0.0", description="address to listen on")
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
    read_timeout_seconds: float = Field(default=5.0, gt=0, description="a request body slower than this gets 408")
    resync_seconds: float = Field(default=300.0, gt=0, description="list nodes and pods again this often, besides "
                                  "watching them")
    max_watch_stale_seconds: float = Field(default=60.0, gt=0, description="/readyz fails once the node or pod "
                                           "watch has been broken this long (no watch open, no list, event or "
                                           "bookmark since), and says which and why")
    log_format: Literal["json", "text"] = Field(default="json", description="JSON lines, or text for humans")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="least severe "
                                                                    "level logged")

    @model_validator(mode="after")
    def _known_policy(self) -> "ExtenderConfig":
        known_policy(self.policy)
        return self

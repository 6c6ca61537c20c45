"""Configuration of `gpuaas gangs`: the controller's planning bounds, the webhook's serving certificate, leader
election."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.config import load_config
from runtime.leader import LeaderElectionConfig as LeaseConfig
from scoring.gangs import GangSettings
from scoring.policies import known_policy

ENV_PREFIX = "GPUAAS_GANGS_"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LeaderElectionConfig(LeaseConfig):
    name: str = Field(default="gpuaas-gangs", description="name of the Lease")


class WebhookConfig(_Strict):
    port: int = Field(default=8443, ge=0, le=65535, description="HTTPS port of the mutating admission webhook "
                      "(POST /mutate-pods); the apiserver calls it")
    cert_file: Path = Field(description="PEM serving certificate for the webhook's Service name (the "
                            "MutatingWebhookConfiguration's caBundle signs it)")
    key_file: Path = Field(description="PEM private key of `cert_file`")


class GangsConfig(_Strict):
    policy: str = Field(default="gpuaas", description="scoring policy that breaks ties between placements of a gang")
    interval_s: float = Field(default=2.0, gt=0, description="plan the waiting gangs at least this often (and at "
                              "once, after a 0.2 s pause, when a member arrives or a gate goes)")
    time_limit_s: float = Field(default=1.0, gt=0, description="CP-SAT's time per gang; its greedy answer is used "
                                "when it finds none in time")
    bind_timeout_s: float = Field(default=120.0, gt=0, description="members released but not bound this long after: "
                                  "the gang is reset (its members deleted, for their owner to create them again)")
    reserve_after_s: float = Field(default=300.0, ge=0, description="a gang that has waited this long for room "
                                   "stops later gangs from backfilling past it")
    plan_budget_s: float = Field(default=5.0, ge=0, description="planning time per round after which the gangs "
                                 "still to plan get the greedy placement only (a burst of gangs must not hold the "
                                 "next round back)")
    webhook: WebhookConfig | None = Field(default=None, description="serve the mutating admission webhook that gates "
                                          "group members at creation; unset: only the controller (members must be "
                                          "created with the gate gpuaas.io/gang)")
    max_watch_stale_s: float = Field(default=60.0, gt=0, description="/readyz fails, and no gang is released, once a "
                                     "watch has been broken this long")
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig, description="one replica "
                                                  "plans and writes at a time; every replica answers the webhook")
    log_format: Literal["json", "text"] = Field(default="json", description="JSON lines, or text for humans "
                                                "(`--log-format` overrides it)")

    def model_post_init(self, _context: Any) -> None:
        known_policy(self.policy)

    def settings(self) -> GangSettings:
        return GangSettings(self.policy, self.time_limit_s, self.bind_timeout_s, self.reserve_after_s,
                            self.plan_budget_s)


def load_gangs_config(path: Path | str | None, *, environ: dict[str, str] | None = None,
                      overrides: dict[str, Any] | None = None) -> GangsConfig:
    return load_config(GangsConfig, path, env_prefix=ENV_PREFIX, environ=environ, overrides=overrides)

"""Who may call the extender, and with which credential (served over TLS; see ExtenderConfig.tls):

    POST /filter /prioritize /bind   kube-scheduler only: a client certificate signed by `tls.client_ca_file` whose
                                     common name is in `tls.client_names` (the scheduler's extender tlsConfig.certFile)
    GET  /explain?pod=NS/NAME&...    that certificate, or a user who may `get` the pod NS/NAME: a bearer token
                                     (TokenReview) or another certificate of that CA (CN the user, O the groups),
                                     authorized by a SubjectAccessReview, so nobody learns of a pod they cannot read
    GET  /metrics                    that certificate, or a user who may `get` the non-resource path /metrics (what
                                     Prometheus's usual ClusterRole grants)
    GET  /healthz /readyz            anyone: kubelet's probes present no credential, and the answers say nothing
    anything else                    kube-scheduler only (a stranger learns nothing, not even a 404 from 405)

No certificate and no token: 401. A credential that does not allow the request: 403. Plain HTTP (no `tls`, loopback
only, ExtenderConfig) authenticates nobody and this middleware is not installed.

The TLS layer asks for a client certificate but does not require one (ssl.CERT_OPTIONAL), so that kubelet's probes
connect; a certificate that does not verify against the CA fails the handshake. Which request needs what is decided
here, by `access_for`, a pure function of the path and query.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from runtime.authz import (
    AsyncReviewer,
    Attributes,
    Authorizer,
    ReviewFailed,
    TokenCache,
    User,
    forbidden_message,
    token_review,
    user_from_certificate,
    user_from_token_review,
)

from .service import BadRequest

log = logging.getLogger("gpuaas.extender")

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
SCHEDULER_ONLY = None  # access_for's answer for the verbs and every unknown path


def access_for(path: str, query: dict[str, str]) -> Attributes | str | None:
    """What a request needs: "open" (probes), SCHEDULER_ONLY (None: kube-scheduler's certificate), or the
    SubjectAccessReview attributes a user other than kube-scheduler must be allowed."""
    if path in OPEN_PATHS:
        return "open"
    if path == "/metrics":
        return Attributes(verb="get", path="/metrics")
    if path == "/explain":
        namespace, _, name = (query.get("pod") or "").rpartition("/")
        return Attributes(verb="get", path=path, resource_request=True, version="v1", namespace=namespace or "default",
                          resource="pods", name=name)
    return SCHEDULER_ONLY


@dataclass
class Callers:
    """The credentials the extender accepts. `reviewer` is None where no apiserver is at hand (a snapshot): then
    only certificates authenticate."""
    scheduler_names: frozenset[str]
    reviewer: AsyncReviewer | None = None
    authorizer: Authorizer[AsyncReviewer] | None = None
    tokens: TokenCache | None = None

    @classmethod
    def of(cls, client_names: list[str], reviewer: AsyncReviewer | None, ttl_s: float = 10.0) -> Callers:
        if reviewer is None:
            return cls(frozenset(client_names))
        return cls(frozenset(client_names), reviewer,
                   Authorizer(reviewer, allow_ttl_s=ttl_s, deny_ttl_s=ttl_s),
                   TokenCache(ttl_s=ttl_s))

    async def user_of_token(self, token: str) -> User | None:
        if self.reviewer is None or self.tokens is None:
            raise BadRequest("bearer tokens cannot be reviewed: this extender serves a snapshot, without a cluster",
                             401)
        known, user = self.tokens.get(token)
        if not known:
            user = user_from_token_review(await self.reviewer.token_review_async(token_review(token)))
            self.tokens.put(token, user)
        return user


def peer_certificate(request: web.Request) -> dict[str, Any] | None:
    """The client certificate the TLS layer verified, as ssl's getpeercert() gives it; None without one."""
    return request.transport.get_extra_info("peercert") if request.transport is not None else None


def bearer_token(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


async def check(callers: Callers, request: web.Request) -> None:
    """Raise BadRequest(401/403) unless the request's credential allows it."""
    need = access_for(request.path, dict(request.query))
    if need == "open":
        return
    user = user_from_certificate(peer_certificate(request))
    if user is not None and user.name in callers.scheduler_names:
        return  # kube-scheduler may do everything the extender serves
    if need is SCHEDULER_ONLY:
        if user is None:
            raise BadRequest(f"{request.path} needs kube-scheduler's client certificate", 401)
        raise BadRequest(f"{request.path} is for kube-scheduler only, not for {user.name}", 403)
    if user is None:
        token = bearer_token(request)
        if token is None:
            raise BadRequest(f"{request.path} needs a client certificate or a bearer token", 401)
        user = await callers.user_of_token(token)
        if user is None:
            raise BadRequest("the bearer token did not authenticate", 401)
    if callers.authorizer is None:
        raise BadRequest(f"{request.path}: {user.name} cannot be authorized: this extender has no cluster to ask", 403)
    assert isinstance(need, Attributes)
    try:
        decision = await callers.authorizer.authorize_async(user, need)
    except ReviewFailed as err:
        raise BadRequest(err.message, err.code) from None
    if not decision.allowed:
        raise BadRequest(forbidden_message(user, need, decision.reason), 403)


def middleware(callers: Callers) -> Middleware:
    @web.middleware
    async def authenticate(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        await check(callers, request)
        return await handler(request)

    return authenticate

"""Delegated authentication and authorization, the way a Kubernetes aggregated API server (or kube-rbac-proxy) does it
(k8s.io/apiserver's DelegatingAuthenticationOptions and DelegatingAuthorizationOptions: a TokenReview and a
SubjectAccessReview to kube-apiserver per request, answers cached briefly). The custom-metrics API authorizes the users
the aggregator names; the extender authenticates bearer tokens (TokenReview) and client certificates, and authorizes
both the same way (`/explain`, `/metrics`).

The aggregator (kube-apiserver) authenticates the user, then calls us with its front-proxy client certificate and the
user in request headers: X-Remote-User, X-Remote-Uid, X-Remote-Group (repeated), X-Remote-Extra-<key> (repeated;
the key percent-encoded). Those headers are trusted only because the caller has already proved, by a certificate
from the front-proxy CA with an allowed common name, that it is the aggregator (metrics_api's middleware checks that
first). We then ask kube-apiserver whether that user may do what the request asks, with the request's attributes
parsed as k8s.io/apiserver's RequestInfoFactory parses a path, so that the same RBAC rules apply as if the resource
were served by kube-apiserver itself:

    GET /apis/custom.metrics.k8s.io/v1beta1/namespaces/NS/pods/*/queue_depth
        -> verb get, group custom.metrics.k8s.io, version v1beta1, namespace NS, resource pods, name "*",
           subresource queue_depth (RBAC: resources ["pods/queue_depth"], ["*/queue_depth"] or ["*"])
    GET /apis/custom.metrics.k8s.io/v1beta1 -> non-resource path, verb get (system:discovery allows it)

Pure: `user_from_headers`, `user_from_certificate`, `request_attributes`, `access_review`, `token_review`,
`user_from_token_review`, `decision_from_review`, `forbidden_message`; `AccessDecisionCache` is a bounded TTL cache on
an injected clock; `Authorizer` puts them together around a `Reviewer` (blocking) or an `AsyncReviewer`, of which
`KubeAccessReviewer` and `ApiReviewer` are the ones that do I/O.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import parse_qs, unquote

USER_HEADER, UID_HEADER, GROUP_HEADER = "X-Remote-User", "X-Remote-Uid", "X-Remote-Group"
EXTRA_PREFIX = "X-Remote-Extra-"
ANONYMOUS, AUTHENTICATED, UNAUTHENTICATED = "system:anonymous", "system:authenticated", "system:unauthenticated"
SPECIAL_VERBS = {"proxy", "watch"}  # RequestInfoFactory's
SPECIAL_VERBS_NO_SUBRESOURCES = {"proxy"}
NAMESPACE_SUBRESOURCES = {"status", "finalize"}
METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()  # sorted (key, values): hashable, a cache key


def user_from_headers(headers: Mapping[str, str]) -> User | None:
    """The user the aggregator authenticated, from its request headers (k8s.io/apiserver's requestheader
    authenticator); None without a user name. `headers` is a multidict (aiohttp's: `getall`) or a plain mapping."""
    getall = getattr(headers, "getall", None)

    def values(name: str) -> list[str]:
        if getall is not None:
            return list(getall(name, []))
        return [v for k, v in headers.items() if k.lower() == name.lower()]

    names = [v for v in values(USER_HEADER) if v]
    if not names:
        return None
    extra: dict[str, list[str]] = {}
    for key in headers:
        if key.lower().startswith(EXTRA_PREFIX.lower()):
            name = unquote(key[len(EXTRA_PREFIX):]).lower()
            if name not in extra:
                extra[name] = values(key)
    uid = next((v for v in values(UID_HEADER) if v), "")
    groups = tuple(g for g in values(GROUP_HEADER) if g)
    # As k8s.io/apiserver's AuthenticatedGroupAdder: every authenticated user is in system:authenticated, which is
    # what RBAC's system:discovery binding names (the aggregator's own discovery requests come without groups).
    if names[0] != ANONYMOUS and not {AUTHENTICATED, UNAUTHENTICATED} & set(groups):
        groups += (AUTHENTICATED,)
    return User(names[0], uid, groups, tuple(sorted((k, tuple(v)) for k, v in extra.items())))


@dataclass(frozen=True)
class Attributes:
    """What a request asks to do (k8s.io/apiserver's RequestInfo)."""
    verb: str
    path: str
    resource_request: bool = False
    group: str = ""
    version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""


def _field_selector_name(query: Mapping[str, list[str]]) -> str:
    for selector in query.get("fieldSelector", []):
        for term in selector.split(","):
            for op in ("==", "="):
                key, sep, value = term.partition(op)
                if sep and key.strip() == "metadata.name" and "!" not in key:
                    return value.strip()
    return ""


def request_attributes(method: str, path: str, query_string: str = "") -> Attributes:
    """RequestInfoFactory.NewRequestInfo for an API path (prefixes /api and /apis)."""
    verb = method.lower()
    parts = [p for p in path.strip("/").split("/") if p != ""]
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return Attributes(verb=verb, path=path)
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:
            return Attributes(verb=verb, path=path)
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    if parts[0] in SPECIAL_VERBS:
        if len(parts) < 2:
            return Attributes(verb=verb, path=path)  # upstream errors out; nothing is served there
        verb, parts = parts[0], parts[1:]
    else:
        verb = METHOD_VERBS.get(method.upper(), "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 and verb not in SPECIAL_VERBS_NO_SUBRESOURCES else ""
    query = parse_qs(query_string)
    if not name and verb == "get":
        watch = query.get("watch", ["false"])[0].lower() not in ("false", "0")
        verb = "watch" if watch else "list"
        name = _field_selector_name(query)
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(verb, path, True, group, version, namespace, resource, subresource, name)


def access_review(user: User, attrs: Attributes) -> dict:
    """The authorization.k8s.io/v1 SubjectAccessReview asking whether `user` may do `attrs`."""
    spec: dict = {"user": user.name, "groups": list(user.groups)}
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra}
    if attrs.resource_request:
        spec["resourceAttributes"] = {k: v for k, v in (
            ("namespace", attrs.namespace), ("verb", attrs.verb), ("group", attrs.group), ("version", attrs.version),
            ("resource", attrs.resource), ("subresource", attrs.subresource), ("name", attrs.name)) if v}
    else:
        spec["nonResourceAttributes"] = {"path": attrs.path, "verb": attrs.verb}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


@dataclass(frozen=True)
class AccessDecision:
    allowed: bool
    reason: str = ""


def decision_from_review(status: Mapping) -> AccessDecision:
    """A SubjectAccessReview's status as a decision: allowed only when it says so (no opinion is a denial here, as
    kube-apiserver's authorizer chain ends)."""
    reason = status.get("reason") or ""
    if status.get("evaluationError"):
        reason = f"{reason}; {status['evaluationError']}" if reason else status["evaluationError"]
    return AccessDecision(bool(status.get("allowed")) and not status.get("denied"), reason)


def forbidden_message(user: User, attrs: Attributes, reason: str = "") -> str:
    """kube-apiserver's words for a denial (responsewriters.forbiddenMessage wrapped by errors.NewForbidden)."""
    q = json.dumps  # Go's %q, near enough
    if not attrs.resource_request:
        text = f"forbidden: User {q(user.name)} cannot {attrs.verb} path {q(attrs.path)}"
    else:
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        scope = f"in the namespace {q(attrs.namespace)}" if attrs.namespace else "at the cluster scope"
        what = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
        text = (f"{what} {q(attrs.name)} is forbidden: " if attrs.name else f"{what} is forbidden: ") + \
            f"User {q(user.name)} cannot {attrs.verb} resource {q(resource)} in API group {q(attrs.group)} {scope}"
    return text + (f": {reason}" if reason else "")


class AccessDecisionCache:
    """Decisions for (user, attributes), each kept for its TTL, at most `size` of them (least recently used go
    first). Thread-safe: the server asks from its executor's threads."""

    def __init__(self, *, allow_ttl_s: float, deny_ttl_s: float, size: int,
                 clock: Callable[[], float] = time.monotonic):
        self.allow_ttl_s, self.deny_ttl_s, self.size, self.clock = allow_ttl_s, deny_ttl_s, size, clock
        self._entries: OrderedDict[tuple[User, Attributes], tuple[float, AccessDecision]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, user: User, attrs: Attributes) -> AccessDecision | None:
        key = (user, attrs)
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            if self.clock() >= hit[0]:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return hit[1]

    def put(self, user: User, attrs: Attributes, decision: AccessDecision) -> None:
        ttl = self.allow_ttl_s if decision.allowed else self.deny_ttl_s
        if ttl <= 0 or self.size <= 0:
            return
        with self._lock:
            self._entries[(user, attrs)] = (self.clock() + ttl, decision)
            self._entries.move_to_end((user, attrs))
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class ReviewFailed(Exception):
    """The SubjectAccessReview could not be made; `code` is what the request gets (503: try again, 500: broken)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class Reviewer(Protocol):
    def review(self, body: dict) -> dict:
        """Create the SubjectAccessReview `body`; return its status ({allowed, denied, reason, evaluationError})."""


# The reviewer an Authorizer asks: a Reviewer for `authorize` (blocking), an AsyncReviewer for `authorize_async`
# (covariant: an Authorizer of a KubeAccessReviewer is an Authorizer of a Reviewer).
ReviewerT = TypeVar("ReviewerT", bound="Reviewer | AsyncReviewer", covariant=True)


class Authorizer(Generic[ReviewerT]):
    def __init__(self, reviewer: ReviewerT, *, allow_ttl_s: float = 10.0, deny_ttl_s: float = 10.0, size: int = 8192,
                 always_allow_groups: tuple[str, ...] = ("system:masters",),
                 clock: Callable[[], float] = time.monotonic):
        self.reviewer = reviewer
        self.always_allow_groups = frozenset(always_allow_groups)
        self.cache = AccessDecisionCache(allow_ttl_s=allow_ttl_s, deny_ttl_s=deny_ttl_s, size=size, clock=clock)

    def _known(self, user: User, attrs: Attributes) -> AccessDecision | None:
        if self.always_allow_groups.intersection(user.groups):
            return AccessDecision(True, "privileged group")  # kube-apiserver allows them whatever RBAC says
        return self.cache.get(user, attrs)

    def _learn(self, user: User, attrs: Attributes, status: Mapping) -> AccessDecision:
        decision = decision_from_review(status)
        self.cache.put(user, attrs, decision)
        return decision

    def authorize(self: Authorizer[Reviewer], user: User, attrs: Attributes) -> AccessDecision:
        """Blocking on a cache miss (run it in an executor). Raises ReviewFailed; failures are not cached."""
        known = self._known(user, attrs)
        if known is not None:
            return known
        return self._learn(user, attrs, self.reviewer.review(access_review(user, attrs)))

    async def authorize_async(self: Authorizer[AsyncReviewer], user: User, attrs: Attributes) -> AccessDecision:
        """The same, for an event loop: the reviewer is an AsyncReviewer."""
        known = self._known(user, attrs)
        if known is not None:
            return known
        return self._learn(user, attrs, await self.reviewer.review_async(access_review(user, attrs)))


class KubeAccessReviewer:
    """SubjectAccessReviews through the kubernetes client: the one piece that talks to kube-apiserver. It needs
    `create` on `subjectaccessreviews.authorization.k8s.io` (ClusterRole system:auth-delegator)."""

    def __init__(self, api, *, timeout_s: float = 10.0):
        from kubernetes import client

        self.authz = client.AuthorizationV1Api(api)
        self.timeout_s = timeout_s

    def review(self, body: dict) -> dict:
        from kubernetes.client.rest import ApiException

        try:
            result = self.authz.create_subject_access_review(body, _request_timeout=self.timeout_s)
        except ApiException as exc:
            if exc.status == 403:
                raise ReviewFailed(500, "this component may not create SubjectAccessReviews (bind its ServiceAccount "
                                        f"to ClusterRole system:auth-delegator): {exc.reason}") from None
            code = 503 if exc.status in (429, 500, 502, 503, 504) or exc.status is None else 500
            raise ReviewFailed(code, f"SubjectAccessReview failed: {exc.status} {exc.reason}") from None
        except Exception as exc:  # connection refused, timeout: kube-apiserver unreachable
            raise ReviewFailed(503, f"SubjectAccessReview failed: {type(exc).__name__}: {exc}") from None
        status = result.status
        return {"allowed": bool(status.allowed), "denied": bool(status.denied), "reason": status.reason or "",
                "evaluationError": status.evaluation_error or ""}


# ---- authentication: bearer tokens (TokenReview) and client certificates ------------------------------------------

def user_from_certificate(peercert: Mapping[str, Any] | None) -> User | None:
    """The user a verified client certificate names, as kube-apiserver's x509 authenticator reads it: the subject's
    common name is the user, its organizations are the groups. `peercert` is ssl's getpeercert() dict (empty or None:
    no certificate)."""
    if not peercert:
        return None
    names, groups = [], []
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.append(value)
            elif key == "organizationName":
                groups.append(value)
    if not names or not names[0]:
        return None
    return User(names[0], groups=tuple(groups) + (AUTHENTICATED,))


def token_review(token: str) -> dict:
    """The authentication.k8s.io/v1 TokenReview asking who `token` belongs to."""
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def user_from_token_review(status: Mapping) -> User | None:
    """The user a TokenReview's status names; None when the token did not authenticate."""
    info = status.get("user") or {}
    if not status.get("authenticated") or not info.get("username"):
        return None
    extra = info.get("extra") or {}
    return User(info["username"], info.get("uid") or "", tuple(info.get("groups") or ()),
                tuple(sorted((k, tuple(v)) for k, v in extra.items())))


class TokenCache:
    """Who a token belongs to, for `ttl_s` (kube-apiserver's webhook token authenticator caches 10 s too), at most
    `size` tokens; keyed by the token's SHA-256, so that the cache holds no token."""

    def __init__(self, *, ttl_s: float = 10.0, size: int = 4096, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.size, self.clock = ttl_s, size, clock
        self._entries: OrderedDict[bytes, tuple[float, User | None]] = OrderedDict()

    def get(self, token: str) -> tuple[bool, User | None]:
        key = hashlib.sha256(token.encode()).digest()
        hit = self._entries.get(key)
        if hit is None or self.clock() >= hit[0]:
            self._entries.pop(key, None)
            return False, None
        self._entries.move_to_end(key)
        return True, hit[1]

    def put(self, token: str, user: User | None) -> None:
        key = hashlib.sha256(token.encode()).digest()
        self._entries[key] = (self.clock() + self.ttl_s, user)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


class AsyncReviewer(Protocol):
    async def review_async(self, body: dict) -> dict:
        """Create the SubjectAccessReview `body`; return its status. Raises ReviewFailed."""

    async def token_review_async(self, body: dict) -> dict:
        """Create the TokenReview `body`; return its status ({authenticated, user, error}). Raises ReviewFailed."""


class ApiReviewer:
    """SubjectAccessReviews and TokenReviews through an aiohttp session on kube-apiserver (runtime.kubeclient's): the
    I/O of an event-loop server. Needs ClusterRole system:auth-delegator."""

    SAR_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    TOKEN_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"

    def __init__(self, session_of: Callable[[], Any], *, timeout_s: float = 5.0):
        self.session_of, self.timeout_s = session_of, timeout_s

    async def _create(self, path: str, body: dict) -> dict:
        import aiohttp

        try:
            async with self.session_of().post(path, json=body,
                                              timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                if resp.status == 403:
                    raise ReviewFailed(500, f"this component may not create {path.rsplit('/', 1)[1]} (bind its "
                                            "ServiceAccount to ClusterRole system:auth-delegator)")
                if resp.status >= 300:
                    code = 503 if resp.status in (429, 500, 502, 503, 504) else 500
                    raise ReviewFailed(code, f"{path.rsplit('/', 1)[1]}: kube-apiserver answered {resp.status}")
                return (await resp.json()).get("status") or {}
        except ReviewFailed:
            raise
        except Exception as exc:  # connection refused, timeout: kube-apiserver unreachable
            raise ReviewFailed(503, f"review failed: {type(exc).__name__}: {exc}") from None

    async def review_async(self, body: dict) -> dict:
        return await self._create(self.SAR_PATH, body)

    async def token_review_async(self, body: dict) -> dict:
        return await self._create(self.TOKEN_PATH, body)

"""Delegated authorization of the custom-metrics API: request attributes as kube-apiserver's RequestInfo parses them,
the user from the aggregator's headers, the SubjectAccessReview, decisions, kube-apiserver's forbidden message, and
the cache (fake reviewer, fake clock)."""
from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from runtime.authz import (
    AccessDecision,
    Attributes,
    Authorizer,
    ReviewFailed,
    User,
    access_review,
    decision_from_review,
    forbidden_message,
    request_attributes,
    user_from_headers,
)
from tests.conftest import Clock

CM = "custom.metrics.k8s.io"


@pytest.mark.parametrize("method, path, query, expected", [
    ("GET", f"/apis/{CM}/v1beta1/namespaces/inf/pods/*/queue_depth", "labelSelector=app%3Dllm",
     Attributes("get", f"/apis/{CM}/v1beta1/namespaces/inf/pods/*/queue_depth", True, CM, "v1beta1", "inf", "pods",
                "queue_depth", "*")),
    ("GET", f"/apis/{CM}/v1beta2/namespaces/inf/deployments.apps/llm/queue_depth", "",
     Attributes("get", f"/apis/{CM}/v1beta2/namespaces/inf/deployments.apps/llm/queue_depth", True, CM, "v1beta2",
                "inf", "deployments.apps", "queue_depth", "llm")),
    ("GET", f"/apis/{CM}/v1beta1/namespaces/inf/metrics/queue_depth", "",  # metrics about a namespace itself
     Attributes("get", f"/apis/{CM}/v1beta1/namespaces/inf/metrics/queue_depth", True, CM, "v1beta1", "inf",
                "metrics", "", "queue_depth")),
    ("GET", f"/apis/{CM}/v1beta1/nodes/*/queue_depth", "",  # cluster-scoped objects
     Attributes("get", f"/apis/{CM}/v1beta1/nodes/*/queue_depth", True, CM, "v1beta1", "", "nodes", "queue_depth",
                "*")),
    ("GET", f"/apis/{CM}/v1beta1", "", Attributes("get", f"/apis/{CM}/v1beta1")),  # discovery: a non-resource path
    ("GET", f"/apis/{CM}", "", Attributes("get", f"/apis/{CM}")),
    ("GET", f"/apis/{CM}/v1beta1/namespaces/inf", "",
     Attributes("get", f"/apis/{CM}/v1beta1/namespaces/inf", True, CM, "v1beta1", "inf", "namespaces", "", "inf")),
    ("GET", f"/apis/{CM}/v1beta1/pods", "", Attributes("list", f"/apis/{CM}/v1beta1/pods", True, CM, "v1beta1",
                                                       resource="pods")),
    ("GET", f"/apis/{CM}/v1beta1/pods", "watch=true&fieldSelector=metadata.name%3Dp1",
     Attributes("watch", f"/apis/{CM}/v1beta1/pods", True, CM, "v1beta1", resource="pods", name="p1")),
    ("GET", "/apis/apps/v1/watch/namespaces/inf/deployments", "",
     Attributes("watch", "/apis/apps/v1/watch/namespaces/inf/deployments", True, "apps", "v1", "inf", "deployments")),
    ("GET", "/api/v1/namespaces/inf/pods/p1/log", "",
     Attributes("get", "/api/v1/namespaces/inf/pods/p1/log", True, "", "v1", "inf", "pods", "log", "p1")),
    ("DELETE", "/apis/apps/v1/namespaces/inf/deployments", "",
     Attributes("deletecollection", "/apis/apps/v1/namespaces/inf/deployments", True, "apps", "v1", "inf",
                "deployments")),
    ("GET", "/healthz", "", Attributes("get", "/healthz")),
])
def test_request_attributes_as_kube_apiserver_parses_them(method, path, query, expected):
    assert request_attributes(method, path, query) == expected


def headers(*pairs) -> CIMultiDictProxy:
    return CIMultiDictProxy(CIMultiDict(pairs))


def test_the_user_comes_from_the_aggregators_headers():
    user = user_from_headers(headers(
        ("X-Remote-User", "alice"), ("X-Remote-Group", "devs"), ("x-remote-group", "system:authenticated"),
        ("X-Remote-Uid", "u-1"), ("X-Remote-Extra-Scopes", "a"), ("X-Remote-Extra-Scopes", "b"),
        ("X-Remote-Extra-Example.com%2fTeam", "ml")))
    assert user == User("alice", "u-1", ("devs", "system:authenticated"),
                        (("example.com/team", ("ml",)), ("scopes", ("a", "b"))))
    assert user_from_headers(headers(("X-Remote-Group", "devs"))) is None
    # every authenticated user is in system:authenticated (the aggregator's discovery requests name no group)
    assert user_from_headers({"x-remote-user": "bob"}) == User("bob", groups=("system:authenticated",))
    anonymous = headers(("X-Remote-User", "system:anonymous"), ("X-Remote-Group", "system:unauthenticated"))
    assert user_from_headers(anonymous).groups == ("system:unauthenticated",)


def test_the_access_review_carries_the_user_and_the_attributes():
    user = User("alice", "u-1", ("devs",), (("scopes", ("a",)),))
    attrs = request_attributes("GET", f"/apis/{CM}/v1beta1/namespaces/inf/pods/*/queue_depth")
    assert access_review(user, attrs) == {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": "alice", "uid": "u-1", "groups": ["devs"], "extra": {"scopes": ["a"]},
                 "resourceAttributes": {"namespace": "inf", "verb": "get", "group": CM, "version": "v1beta1",
                                        "resource": "pods", "subresource": "queue_depth", "name": "*"}}}
    assert access_review(User("bob"), request_attributes("GET", f"/apis/{CM}/v1beta1"))["spec"] == {
        "user": "bob", "groups": [], "nonResourceAttributes": {"path": f"/apis/{CM}/v1beta1", "verb": "get"}}


@pytest.mark.parametrize("status, decision", [
    ({"allowed": True, "reason": 'RBAC: allowed by RoleBinding "r"'},
     AccessDecision(True, 'RBAC: allowed by RoleBinding "r"')),
    ({"allowed": False}, AccessDecision(False)),  # no opinion: denied
    ({"allowed": False, "denied": True, "reason": "webhook says no"}, AccessDecision(False, "webhook says no")),
    ({"allowed": False, "evaluationError": "role r not found"}, AccessDecision(False, "role r not found")),
])
def test_decision_from_review(status, decision):
    assert decision_from_review(status) == decision


def test_forbidden_message_names_the_user_and_the_permission_as_kube_apiserver_does():
    attrs = request_attributes("GET", f"/apis/{CM}/v1beta1/namespaces/inf/pods/*/queue_depth")
    assert forbidden_message(User("alice"), attrs) == (
        'pods.custom.metrics.k8s.io "*" is forbidden: User "alice" cannot get resource "pods/queue_depth" in API '
        'group "custom.metrics.k8s.io" in the namespace "inf"')
    assert forbidden_message(User("bob"), request_attributes("GET", f"/apis/{CM}/v1beta1"), "no") == \
        f'forbidden: User "bob" cannot get path "/apis/{CM}/v1beta1": no'


class FakeReviewer:
    """kube-apiserver answering SubjectAccessReviews by `allows(spec)` (default: the user is one of
    `allowed_users`); records every review; raises `fail` when set."""

    def __init__(self, allowed_users=("alice",), allows=None):
        self.allows = allows or (lambda spec: spec["user"] in set(allowed_users))
        self.bodies: list[dict] = []
        self.fail: ReviewFailed | None = None

    def review(self, body):
        self.bodies.append(body)
        if self.fail:
            raise self.fail
        return {"allowed": self.allows(body["spec"])}


ATTRS = request_attributes("GET", f"/apis/{CM}/v1beta1/namespaces/inf/pods/*/queue_depth")


def test_decisions_are_cached_for_their_ttl_then_asked_again():
    reviewer, clock = FakeReviewer(), Clock(100.0)
    authz = Authorizer(reviewer, allow_ttl_s=10, deny_ttl_s=5, clock=clock)
    alice, mallory = User("alice"), User("mallory")
    for _ in range(3):
        assert authz.authorize(alice, ATTRS).allowed and not authz.authorize(mallory, ATTRS).allowed
    assert len(reviewer.bodies) == 2
    clock.t += 5  # the denial expired, the permission not yet
    authz.authorize(alice, ATTRS), authz.authorize(mallory, ATTRS)
    assert [b["spec"]["user"] for b in reviewer.bodies] == ["alice", "mallory", "mallory"]
    clock.t += 5
    authz.authorize(alice, ATTRS)
    assert len(reviewer.bodies) == 4
    # another request of the same user is another question
    authz.authorize(alice, request_attributes("GET", f"/apis/{CM}/v1beta1/namespaces/other/pods/*/queue_depth"))
    assert len(reviewer.bodies) == 5


def test_the_cache_is_bounded_least_recently_used_first():
    reviewer, clock = FakeReviewer(allowed_users={f"u{i}" for i in range(10)}), Clock(100.0)
    authz = Authorizer(reviewer, size=3, clock=clock)
    for i in range(5):
        authz.authorize(User(f"u{i}"), ATTRS)
    assert len(authz.cache) == 3
    authz.authorize(User("u4"), ATTRS)  # still cached
    authz.authorize(User("u0"), ATTRS)  # evicted: asked again
    assert [b["spec"]["user"] for b in reviewer.bodies] == ["u0", "u1", "u2", "u3", "u4", "u0"]


def test_privileged_groups_are_not_asked_about():
    reviewer = FakeReviewer(allowed_users=())
    assert Authorizer(reviewer).authorize(User("admin", groups=("system:masters",)), ATTRS).allowed
    assert reviewer.bodies == []


def test_a_failed_review_is_not_cached_and_the_next_one_is_made():
    reviewer = FakeReviewer()
    authz = Authorizer(reviewer, clock=Clock(100.0))
    reviewer.fail = ReviewFailed(503, "SubjectAccessReview failed: ConnectionRefusedError")
    with pytest.raises(ReviewFailed):
        authz.authorize(User("alice"), ATTRS)
    reviewer.fail = None
    assert authz.authorize(User("alice"), ATTRS).allowed and len(reviewer.bodies) == 2


# ---- authentication: certificates and tokens ------------------------------------------------------------------------
def test_a_client_certificate_names_its_user_and_groups_as_kube_apiserver_reads_it():
    peercert = {"subject": ((("organizationName", "system:masters"),), (("organizationName", "ops"),),
                            (("commonName", "kubernetes-admin"),))}
    from runtime.authz import user_from_certificate

    assert user_from_certificate(peercert) == User("kubernetes-admin",
                                                   groups=("system:masters", "ops", "system:authenticated"))
    assert user_from_certificate({}) is None and user_from_certificate(None) is None
    assert user_from_certificate({"subject": ((("organizationName", "x"),),)}) is None  # no CN: no user


def test_a_token_review_names_the_user_only_when_it_authenticated():
    from runtime.authz import token_review, user_from_token_review

    assert token_review("t")["spec"] == {"token": "t"}
    status = {"authenticated": True, "user": {"username": "system:serviceaccount:mon:prometheus", "uid": "u1",
                                              "groups": ["system:serviceaccounts"], "extra": {"k": ["v"]}}}
    assert user_from_token_review(status) == User("system:serviceaccount:mon:prometheus", "u1",
                                                  ("system:serviceaccounts",), (("k", ("v",)),))
    assert user_from_token_review({"authenticated": False, "user": {"username": "x"}}) is None
    assert user_from_token_review({"authenticated": True, "user": {}}) is None


def test_the_token_cache_keeps_answers_for_its_ttl_and_never_the_token():
    from runtime.authz import TokenCache

    clock = Clock(100.0)
    cache = TokenCache(ttl_s=10, size=2, clock=clock)
    assert cache.get("secret-token") == (False, None)
    cache.put("secret-token", User("alice"))
    cache.put("bad-token", None)  # a refusal is remembered too
    assert cache.get("secret-token") == (True, User("alice")) and cache.get("bad-token") == (True, None)
    assert all("secret-token" not in repr(k) for k in cache._entries)
    clock.t += 10
    assert cache.get("secret-token") == (False, None)
    for t in ("a", "b", "c"):
        cache.put(t, User(t))
    assert len(cache._entries) == 2 and cache.get("a") == (False, None)

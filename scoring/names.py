"""Kubernetes object names, checked as the apiserver checks them (k8s.io/apimachinery/pkg/util/validation), before any
name from a request reaches a URL, a query or a model key. Pure: no I/O.

    DNS-1123 label       at most 63 characters: lower-case alphanumerics and '-', starting and ending alphanumeric
                         (namespaces; Service names)
    DNS-1123 subdomain   at most 253 characters: DNS-1123 labels joined by '.' (pod, node and most object names)

A name that passes contains no '/', '%', '?', '#', '..' segment or whitespace: it is safe as one URL path segment or
PromQL label value as it is (callers still quote it, belt and braces).
"""
from __future__ import annotations

import re
from typing import Any

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(_LABEL)
_SUBDOMAIN_RE = re.compile(rf"{_LABEL}(\.{_LABEL})*")


class InvalidName(ValueError):
    """A name Kubernetes would not accept; the message names the field."""


def _at(field: str | None) -> str:
    return f"{field}: " if field else ""


def _text(value: Any, field: str | None, most: int) -> str:
    if not isinstance(value, str):
        raise InvalidName(f"{_at(field)}must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidName(f"{_at(field)}must not be empty")
    if len(value) > most:
        raise InvalidName(f"{_at(field)}must be at most {most} characters, got {len(value)}")
    return value


def _checked(value: Any, field: str | None, most: int, pattern: re.Pattern[str], kind: str) -> str:
    text = _text(value, field, most)
    if not pattern.fullmatch(text):
        raise InvalidName(f"{_at(field)}{text!r} is not a {kind}")
    return text


def dns1123_label(value: Any, field: str | None = None) -> str:
    """`value` if it is a DNS-1123 label (a namespace), else InvalidName naming `field` (if given)."""
    return _checked(value, field, DNS1123_LABEL_MAX, _LABEL_RE, "DNS-1123 label (lower-case alphanumerics and '-', "
                    "starting and ending with an alphanumeric)")


def dns1123_subdomain(value: Any, field: str | None = None) -> str:
    """`value` if it is a DNS-1123 subdomain (a pod or node name), else InvalidName naming `field` (if given)."""
    return _checked(value, field, DNS1123_SUBDOMAIN_MAX, _SUBDOMAIN_RE, "DNS-1123 subdomain (lower-case "
                    "alphanumerics, '-' and '.', starting and ending with an alphanumeric)")

#!/usr/bin/env bash
# Build the helm CLI from the helm.sh/helm/v4 Go module. Unlike k8s.io/kubernetes and etcd, helm's go.mod has no
# replace directives, so a plain `go install` works; the ldflags are the ones helm's Makefile sets, so that
# `helm version` reports the release instead of the bare "v4.3" compiled into the source.
# Usage: build-helm.sh VERSION OUTDIR  (VERSION like v4.3.1)
set -euo pipefail
V=$1; OUT=$2
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
major=${V%%.*}                     # v4.3.1 -> v4: the module path carries the major version
pkg=helm.sh/helm/$major
mkdir -p "$OUT"
GOBIN=$(cd "$OUT" && pwd) go install -trimpath \
  -ldflags "-s -w -X $pkg/internal/version.version=$V -X $pkg/internal/version.gitTreeState=clean" \
  "$pkg/cmd/helm@$V"
"$OUT/helm" version --short

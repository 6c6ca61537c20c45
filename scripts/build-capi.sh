#!/usr/bin/env bash
# Build Cluster API's core manager (the controllers for Cluster, MachineDeployment, MachineSet, Machine, ...).
# The manager is the main package sigs.k8s.io/cluster-api/core of the module sigs.k8s.io/cluster-api; that go.mod
# requires its API module sigs.k8s.io/cluster-api/api at v0.0.0-00010101000000-000000000000 and replaces it with ./api,
# a directory the module's zip leaves out (a nested module), so `go install sigs.k8s.io/cluster-api/core@VERSION`
# refuses it. A throwaway wrapper module requires both at VERSION and replaces the API module with its released
# version (the same tag); `go get -tool` records the manager, `go build` builds it with the versions CAPI's go.mod picks.
# The CRDs ship in the module (core/config/crd/bases); they are copied beside the binary.
# Usage: build-capi.sh VERSION OUTDIR  (VERSION like v1.14.2)
set -euo pipefail
V=$1; OUT=$2
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpuaas-capi.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT/crds"
OUT=$(cd "$OUT" && pwd)
cd "$work"
go mod init gpuaas.local/capi-manager >/dev/null 2>&1
go mod edit -require="sigs.k8s.io/cluster-api@$V" -replace="sigs.k8s.io/cluster-api/api=sigs.k8s.io/cluster-api/api@$V"
go get -tool "sigs.k8s.io/cluster-api/core@$V"
go build -trimpath -ldflags "-s -w" -o "$OUT/capi-manager" sigs.k8s.io/cluster-api/core
src=$(go mod download -json "sigs.k8s.io/cluster-api@$V" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -d "$src" ] || { echo "build-capi: sigs.k8s.io/cluster-api@$V not in the module cache" >&2; exit 1; }
cp "$src"/core/config/crd/bases/*.yaml "$OUT/crds/"
chmod -R u+w "$OUT/crds"
echo "capi-manager $V built with $(go env GOVERSION)"

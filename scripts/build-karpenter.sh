#!/usr/bin/env bash
# Build Karpenter's KWOK controller: sigs.k8s.io/karpenter's real core (provisioning, NodeClaim lifecycle,
# disruption) with the `kwok` cloud provider, whose instance types come from a JSON file and whose "instances" are
# KWOK Nodes. The module has no replace directives, so `go install pkg@version` builds it from the module proxy.
# Its go.mod asks for a newer Go than the other builds (v1.15.0: `go 1.26.9`, refused by GOTOOLCHAIN=local on 1.26.8):
# GOTOOLCHAIN=go$KARPENTER_GO (scripts/versions.env) makes the go command fetch exactly that toolchain from the module
# proxy (the module golang.org/toolchain) and build with it, for this build only; without KARPENTER_GO, `auto` picks
# the newest patch release of what go.mod asks for.
# The package's binary would be called `kwok`, like sigs.k8s.io/kwok's: it is installed as `karpenter-kwok`.
# The CRDs the controller needs ship in the module; they are copied beside the binary.
# Usage: build-karpenter.sh VERSION OUTDIR  (VERSION like v1.15.0)
set -euo pipefail
V=$1; OUT=$2
export GOFLAGS=-mod=mod GOTOOLCHAIN=${KARPENTER_GO:+go$KARPENTER_GO} CGO_ENABLED=0
[ -n "$GOTOOLCHAIN" ] || GOTOOLCHAIN=auto
work=$(mktemp -d "${TMPDIR:-/tmp}/gpuaas-karpenter.XXXXXX")
trap 'rm -rf "$work"' EXIT
GOBIN="$work" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/karpenter/kwok@$V"
mkdir -p "$OUT/crds"
mv "$work/kwok" "$OUT/karpenter-kwok"
src=$(go mod download -json "sigs.k8s.io/karpenter@$V" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -d "$src" ] || { echo "build-karpenter: sigs.k8s.io/karpenter@$V not in the module cache" >&2; exit 1; }
# Core CRDs (NodeClaim, NodePool, NodeOverlay) and the KWOK provider's node class (KWOKNodeClass).
for f in karpenter.sh_nodeclaims.yaml karpenter.sh_nodepools.yaml karpenter.sh_nodeoverlays.yaml; do
  cp "$src/pkg/apis/crds/$f" "$OUT/crds/"
done
cp "$src/kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml" "$OUT/crds/"
chmod -R u+w "$OUT/crds"
echo "karpenter-kwok $V built with $(go env GOVERSION)"

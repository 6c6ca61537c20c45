#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from the k8s.io/kubernetes Go module.
# `go install k8s.io/kubernetes/cmd/...@vX` is refused because k8s.io/kubernetes replaces its staging modules
# (k8s.io/api, client-go, ...) with local paths; a wrapper module that pins each staging module to its published
# v0.X.Y twin builds the same code. Usage: build-kube.sh VERSION OUTDIR  (VERSION like 1.36.3)
set -euo pipefail
KV=$1; OUT=$2
SV=0.${KV#1.}                      # v1.36.3 -> v0.36.3, the published staging modules of that release
MINOR=${SV#0.}; MINOR=${MINOR%%.*}
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
work=$(mktemp -d "${TMPDIR:-/tmp}/gpuaas-kbuild.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init local/kbuild >/dev/null 2>&1
modfile=$(go mod download -json "k8s.io/kubernetes@v$KV" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
mods=$(sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*|\1|p' "$modfile")
[ -n "$mods" ] || { echo "build-kube: no staging modules found in $modfile" >&2; exit 1; }
args=()
for m in $mods; do args+=("-replace=$m=$m@v$SV"); done
go mod edit "${args[@]}"
cmds=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
pkgs=(); for c in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c@v$KV"); done
go get "${pkgs[@]}" >/dev/null
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X $p.gitVersion=v$KV -X $p.gitMajor=1 -X $p.gitMinor=$MINOR"
  ld+=" -X $p.gitCommit=v$KV -X $p.gitTreeState=clean -X $p.buildDate=$date"
done
mkdir -p "$OUT"
for c in "${cmds[@]}"; do
  go build -trimpath -ldflags "$ld" -o "$OUT/$c" "k8s.io/kubernetes/cmd/$c"
done
"$OUT/kube-apiserver" --version

#!/usr/bin/env bash
# Build etcd from the go.etcd.io/etcd/server/v3 module. Like k8s.io/kubernetes, etcd's own go.mod uses replace
# directives, so `go install` refuses it; a three-line wrapper module whose main calls etcdmain.Main (exactly what
# upstream's server/main.go does) builds the same server. Usage: build-etcd.sh VERSION OUTDIR  (VERSION like v3.6.8)
set -euo pipefail
V=$1; OUT=$2
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
work=$(mktemp -d "${TMPDIR:-/tmp}/gpuaas-etcdbuild.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init local/etcdbuild >/dev/null 2>&1
cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
go get "go.etcd.io/etcd/server/v3@$V" >/dev/null 2>&1
go mod tidy >/dev/null 2>&1
mkdir -p "$OUT"
go build -trimpath -ldflags "-s -w" -o "$OUT/etcd" .
"$OUT/etcd" --version

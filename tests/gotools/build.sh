#!/usr/bin/env bash
# Builds the control-plane binaries the cluster tests use (kube-apiserver,
# kube-controller-manager, kubectl, etcd, helm) from the pinned Go modules in
# this folder, once per machine. Binaries are cached under
#   ${RLJOB_GOTOOLS_CACHE:-~/.cache/rljob/gotools}/<key>/bin
# where <key> names the pinned versions and hashes the go.mod/go.sum files, so
# a version bump rebuilds and an unchanged tree reuses the cache.
# Prints the bin directory on its last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

version_of() { # module, go.mod -> pinned version
  awk -v m="$1" '$1 == m || ($1 == "require" && $2 == m) {print $NF; exit}' "$2"
}
kube_v="$(version_of k8s.io/kubernetes "$here/kube/go.mod")"
etcd_v="$(version_of go.etcd.io/etcd/server/v3 "$here/etcd/go.mod")"
helm_v="$(version_of helm.sh/helm/v3 "$here/helm/go.mod")"
go_v="$(go env GOVERSION)"
digest="$(cat "$here"/*/go.mod "$here"/*/go.sum "$here"/etcd/main.go "$0" | sha256sum | cut -c1-12)"
key="k8s-${kube_v}_etcd-${etcd_v}_helm-${helm_v}_${go_v}_${digest}"
root="${RLJOB_GOTOOLS_CACHE:-$HOME/.cache/rljob/gotools}"
bin="$root/$key/bin"
want=(kube-apiserver kube-controller-manager kubectl etcd helm)

have_all() { for b in "${want[@]}"; do [[ -x "$bin/$b" ]] || return 1; done; }
if have_all; then echo "$bin"; exit 0; fi

mkdir -p "$bin.partial"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
start=$SECONDS
minor="${kube_v#v1.}"; minor="${minor%%.*}"
kube_ld="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ld+=" -X $pkg.gitVersion=$kube_v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  kube_ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
echo "building kube-apiserver, kube-controller-manager, kubectl $kube_v" >&2
(cd "$here/kube" && go build -trimpath -ldflags "$kube_ld" -o "$bin.partial/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubectl)
echo "building etcd $etcd_v" >&2
(cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin.partial/etcd" .)
echo "building helm $helm_v" >&2
(cd "$here/helm" && go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$helm_v" \
  -o "$bin.partial/" helm.sh/helm/v3/cmd/helm)
rm -rf "$bin"; mv "$bin.partial" "$bin"
echo "built in $((SECONDS - start)) s: $bin" >&2
echo "$bin"

#!/usr/bin/env bash
# Builds the binaries the cluster tests use from the pinned Go modules in this
# folder, once per machine, in two groups cached apart:
#   control plane: kube-apiserver, kube-controller-manager, kubectl (kube/),
#                  etcd (etcd/), helm (helm/)
#   node:          kubelet, kube-scheduler, kube-proxy (kube/), coredns (coredns/),
#                  pause (pause/, the pod sandbox), probe (probe/, a test program)
#   queue:         Kueue's manager (kueue/) and, as kueue-config, the manifests of
#                  the same tag (its config/ folder: CRDs, RBAC, webhooks, manager)
#   netpol:        kube-network-policies (netpol/), the node's NetworkPolicy enforcer,
#                  with netpol/nfqueue-compat.patch applied: its queue verdict through
#                  the xtables NFQUEUE target, for kernels built without nft's queue
#                  expression (CONFIG_NFT_QUEUE), as the test machines' kernel is
#   registry:      the CNCF distribution registry and go-containerregistry's crane
#                  (registry/): the images are pushed to it (python -m images.push)
#                  and the node pulls them from it
#   kwok:          kwok's controller (kwok/), the scale bench's simulated nodes, and,
#                  as kwok-stages, the node and pod stages of the same tag it plays
# Each group lives under
#   ${RLJOB_GOTOOLS_CACHE:-~/.cache/rljob/gotools}/<key>/bin
# where <key> names the pinned versions and hashes that group's go.mod/go.sum/
# main.go files (and this script), so a version bump rebuilds the group it
# touches and an unchanged tree reuses the cache. A third directory,
# bin-<hash of both keys>, links every binary of both groups in one place.
# Prints that directory on its last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
script="$here/$(basename "${BASH_SOURCE[0]}")"

version_of() { # module, go.mod -> pinned version
  awk -v m="$1" '$1 == m || ($1 == "require" && $2 == m) {print $NF; exit}' "$2"
}
digest_of() { # files... -> 12 hex digits
  cat "$@" "$script" | sha256sum | cut -c1-12
}
kube_v="$(version_of k8s.io/kubernetes "$here/kube/go.mod")"
etcd_v="$(version_of go.etcd.io/etcd/server/v3 "$here/etcd/go.mod")"
helm_v="$(version_of helm.sh/helm/v3 "$here/helm/go.mod")"
coredns_v="$(version_of github.com/coredns/coredns "$here/coredns/go.mod")"
kueue_v="$(version_of sigs.k8s.io/kueue "$here/kueue/go.mod")"
netpol_v="$(version_of sigs.k8s.io/kube-network-policies "$here/netpol/go.mod")"
registry_v="$(version_of github.com/distribution/distribution/v3 "$here/registry/go.mod")"
crane_v="$(version_of github.com/google/go-containerregistry "$here/registry/go.mod")"
kwok_v="$(version_of sigs.k8s.io/kwok "$here/kwok/go.mod")"
go_v="$(go env GOVERSION)"
kube_files=("$here"/kube/go.mod "$here"/kube/go.sum "$here"/kube/tools.go)
cp_digest="$(digest_of "${kube_files[@]}" "$here"/etcd/go.mod "$here"/etcd/go.sum \
  "$here"/etcd/main.go "$here"/helm/go.mod "$here"/helm/go.sum)"
node_digest="$(digest_of "${kube_files[@]}" "$here"/coredns/go.mod "$here"/coredns/go.sum \
  "$here"/coredns/main.go "$here"/pause/go.mod "$here"/pause/main.go \
  "$here"/probe/go.mod "$here"/probe/main.go)"
kueue_digest="$(digest_of "$here"/kueue/go.mod "$here"/kueue/go.sum "$here"/kueue/tools.go)"
netpol_digest="$(digest_of "$here"/netpol/go.mod "$here"/netpol/go.sum "$here"/netpol/tools.go \
  "$here"/netpol/nfqueue-compat.patch)"
registry_digest="$(digest_of "$here"/registry/go.mod "$here"/registry/go.sum \
  "$here"/registry/tools.go)"
kwok_digest="$(digest_of "$here"/kwok/go.mod "$here"/kwok/go.sum "$here"/kwok/tools.go)"
cp_key="k8s-${kube_v}_etcd-${etcd_v}_helm-${helm_v}_${go_v}_${cp_digest}"
kueue_key="kueue-${kueue_v}_${go_v}_${kueue_digest}"
netpol_key="netpol-${netpol_v}_${go_v}_${netpol_digest}"
registry_key="registry-${registry_v}_crane-${crane_v}_${go_v}_${registry_digest}"
node_key="node-k8s-${kube_v}_coredns-${coredns_v}_${go_v}_${node_digest}"
kwok_key="kwok-${kwok_v}_${go_v}_${kwok_digest}"
root="${RLJOB_GOTOOLS_CACHE:-$HOME/.cache/rljob/gotools}"
cp_bin="$root/$cp_key/bin"
node_bin="$root/$node_key/bin"
kueue_bin="$root/$kueue_key/bin"
netpol_bin="$root/$netpol_key/bin"
registry_bin="$root/$registry_key/bin"
kwok_bin="$root/$kwok_key/bin"
all_bin="$root/bin-$(printf '%s\n%s\n%s\n%s\n%s\n%s\n' "$cp_key" "$node_key" "$kueue_key" \
  "$netpol_key" "$registry_key" "$kwok_key" | sha256sum | cut -c1-12)"
cp_want=(kube-apiserver kube-controller-manager kubectl etcd helm)
node_want=(kubelet kube-scheduler kube-proxy coredns pause probe)
kueue_want=(kueue kueue-config)
netpol_want=(kube-network-policies)
registry_want=(registry crane)
kwok_want=(kwok kwok-stages)

have_all() { # dir, names... (a config folder counts as present when it holds its CRDs
  # or stages)
  local dir="$1"; shift
  for b in "$@"; do
    [[ (-f "$dir/$b" && -x "$dir/$b")
       || -f "$dir/$b/components/crd/bases/kueue.x-k8s.io_workloads.yaml"
       || -f "$dir/$b/pod/fast/pod-ready.yaml" ]] || return 1
  done
}
if have_all "$all_bin" "${cp_want[@]}" "${node_want[@]}" "${kueue_want[@]}" \
    "${netpol_want[@]}" "${registry_want[@]}" "${kwok_want[@]}"; then
  echo "$all_bin"; exit 0
fi

mkdir -p "$root"
exec 9>"$root/.lock"
flock 9 # one build at a time per cache; a second caller then finds the result

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
start=$SECONDS
minor="${kube_v#v1.}"; minor="${minor%%.*}"
kube_ld="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ld+=" -X $pkg.gitVersion=$kube_v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  kube_ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

if ! have_all "$cp_bin" "${cp_want[@]}"; then
  rm -rf "$cp_bin.partial"; mkdir -p "$cp_bin.partial"
  t=$SECONDS
  echo "building kube-apiserver, kube-controller-manager, kubectl $kube_v" >&2
  (cd "$here/kube" && go build -trimpath -ldflags "$kube_ld" -o "$cp_bin.partial/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl)
  echo "building etcd $etcd_v" >&2
  (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$cp_bin.partial/etcd" .)
  echo "building helm $helm_v" >&2
  (cd "$here/helm" && go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$helm_v" \
    -o "$cp_bin.partial/" helm.sh/helm/v3/cmd/helm)
  rm -rf "$cp_bin"; mv "$cp_bin.partial" "$cp_bin"
  echo "control plane built in $((SECONDS - t)) s: $cp_bin" >&2
fi

if ! have_all "$node_bin" "${node_want[@]}"; then
  rm -rf "$node_bin.partial"; mkdir -p "$node_bin.partial"
  t=$SECONDS
  echo "building kubelet, kube-scheduler, kube-proxy $kube_v" >&2
  (cd "$here/kube" && go build -trimpath -ldflags "$kube_ld" -o "$node_bin.partial/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-proxy)
  echo "building coredns $coredns_v" >&2
  (cd "$here/coredns" && go build -trimpath -ldflags "-s -w" -o "$node_bin.partial/coredns" .)
  echo "building pause, probe" >&2
  (cd "$here/pause" && go build -trimpath -ldflags "-s -w" -o "$node_bin.partial/pause" .)
  (cd "$here/probe" && go build -trimpath -ldflags "-s -w" -o "$node_bin.partial/probe" .)
  rm -rf "$node_bin"; mv "$node_bin.partial" "$node_bin"
  echo "node tools built in $((SECONDS - t)) s: $node_bin" >&2
fi

if ! have_all "$kueue_bin" "${kueue_want[@]}"; then
  rm -rf "$kueue_bin.partial"; mkdir -p "$kueue_bin.partial"
  t=$SECONDS
  echo "building kueue $kueue_v" >&2
  (cd "$here/kueue" && go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_v" \
    -o "$kueue_bin.partial/kueue" sigs.k8s.io/kueue/cmd/kueue)
  src="$(cd "$here/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  cp -r "$src/config" "$kueue_bin.partial/kueue-config"
  chmod -R u+w "$kueue_bin.partial/kueue-config"
  rm -rf "$kueue_bin"; mv "$kueue_bin.partial" "$kueue_bin"
  echo "kueue built in $((SECONDS - t)) s: $kueue_bin" >&2
fi

if ! have_all "$netpol_bin" "${netpol_want[@]}"; then
  rm -rf "$netpol_bin.partial"; mkdir -p "$netpol_bin.partial"
  t=$SECONDS
  echo "building kube-network-policies $netpol_v (patched: netpol/nfqueue-compat.patch)" >&2
  src="$(cd "$here/netpol" && go mod download sigs.k8s.io/kube-network-policies \
    && go list -m -f '{{.Dir}}' sigs.k8s.io/kube-network-policies)"
  cp -r "$src" "$netpol_bin.partial/src"; chmod -R u+w "$netpol_bin.partial/src"
  # outside any git work tree: git apply then patches the folder it runs in
  (cd "$netpol_bin.partial/src" && GIT_CEILING_DIRECTORIES="$netpol_bin.partial" \
    git apply -p1 "$here/netpol/nfqueue-compat.patch" \
    && go build -trimpath -ldflags "-s -w" -o "$netpol_bin.partial/kube-network-policies" ./cmd)
  rm -rf "$netpol_bin.partial/src"
  rm -rf "$netpol_bin"; mv "$netpol_bin.partial" "$netpol_bin"
  echo "kube-network-policies built in $((SECONDS - t)) s: $netpol_bin" >&2
fi

if ! have_all "$registry_bin" "${registry_want[@]}"; then
  rm -rf "$registry_bin.partial"; mkdir -p "$registry_bin.partial"
  t=$SECONDS
  echo "building the distribution registry $registry_v and crane $crane_v" >&2
  (cd "$here/registry" && go build -trimpath -ldflags "-s -w" -o "$registry_bin.partial/" \
    github.com/distribution/distribution/v3/cmd/registry \
    github.com/google/go-containerregistry/cmd/crane)
  rm -rf "$registry_bin"; mv "$registry_bin.partial" "$registry_bin"
  echo "registry and crane built in $((SECONDS - t)) s: $registry_bin" >&2
fi

if ! have_all "$kwok_bin" "${kwok_want[@]}"; then
  rm -rf "$kwok_bin.partial"; mkdir -p "$kwok_bin.partial"
  t=$SECONDS
  echo "building kwok $kwok_v" >&2
  (cd "$here/kwok" && go build -trimpath -ldflags "-s -w" -o "$kwok_bin.partial/kwok" \
    sigs.k8s.io/kwok/cmd/kwok)
  src="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  cp -r "$src/kustomize/stage" "$kwok_bin.partial/kwok-stages"
  chmod -R u+w "$kwok_bin.partial/kwok-stages"
  rm -rf "$kwok_bin"; mv "$kwok_bin.partial" "$kwok_bin"
  echo "kwok built in $((SECONDS - t)) s: $kwok_bin" >&2
fi

rm -rf "$all_bin.partial"; mkdir -p "$all_bin.partial"
for b in "${cp_want[@]}"; do ln -s "$cp_bin/$b" "$all_bin.partial/$b"; done
for b in "${node_want[@]}"; do ln -s "$node_bin/$b" "$all_bin.partial/$b"; done
for b in "${kueue_want[@]}"; do ln -s "$kueue_bin/$b" "$all_bin.partial/$b"; done
for b in "${netpol_want[@]}"; do ln -s "$netpol_bin/$b" "$all_bin.partial/$b"; done
for b in "${registry_want[@]}"; do ln -s "$registry_bin/$b" "$all_bin.partial/$b"; done
for b in "${kwok_want[@]}"; do ln -s "$kwok_bin/$b" "$all_bin.partial/$b"; done
rm -rf "$all_bin"; mv "$all_bin.partial" "$all_bin"
echo "binaries ready in $((SECONDS - start)) s: $all_bin" >&2
echo "$all_bin"

#!/usr/bin/env bash
# Test tooling: builds upstream's binaries from their Go modules and caches them under
# /var/tmp/kube-nlproxy-upstream/, keyed by version, as the VM kernel is cached. The tests use
# them as oracles, as a real control plane and as real nodes; the product never runs them.
#
# - kube-proxy, kube-apiserver (this directory's module pins every staging module of
#   k8s.io/kubernetes to the v0.X.Y matching v1.X.Y) and etcd (etcd/, a module of its own so
#   that etcd's client versions stay apart from the apiserver's): VERSION/ and etcd-VERSION/.
# - With --node, the real nodes' binaries (netlink-tests/src/realnode): kubelet,
#   kube-controller-manager, kube-scheduler, kubectl, upstream's e2e suite (e2e.test) and two
#   of its test images' programs (agnhost, regression-issue-74839), and Ginkgo's CLI (which
#   runs the suite in parallel processes) from the same module;
#   containerd (v2: 1.6 loses what an exec'd command writes to stderr, which specs read) and
#   CoreDNS from theirs. Cached as one zstd tarball (about a third of the ~0.9 GB); unpacked
#   into target/real-node/bin for the tests.
# - With --node or --flannel (that alone), Flannel's flanneld and CNI plugin (see below).
set -euo pipefail
cd "$(dirname "$0")"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
ver=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' go.mod)
cache=${KUBE_NLPROXY_UPSTREAM_CACHE:-/var/tmp/kube-nlproxy-upstream}
out=$cache/$ver
minor=$(echo "$ver" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$ver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
mkdir -p "$out"
for cmd in kube-proxy kube-apiserver; do
  if [ -x "$out/$cmd" ] && "$out/$cmd" --version 2>/dev/null | grep -q "$ver"; then
    echo "upstream $cmd $ver: cached in $out"
  else
    go build -trimpath -ldflags "$ldflags" -o "$out/" "k8s.io/kubernetes/cmd/$cmd"
    "$out/$cmd" --version
  fi
done
etcd_ver=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' etcd/go.mod)
etcd_out=$cache/etcd-$etcd_ver
if [ -x "$etcd_out/etcd" ] && "$etcd_out/etcd" --version 2>/dev/null | grep -q "${etcd_ver#v}"; then
  echo "etcd $etcd_ver: cached in $etcd_out"
else
  mkdir -p "$etcd_out"
  (cd etcd && go build -trimpath -ldflags "-s -w" -o "$etcd_out/etcd" go.etcd.io/etcd/server/v3)
  "$etcd_out/etcd" --version
fi

# Flannel, the real nodes' second CNI (netlink-tests/src/realnode/flannel.rs): flanneld from
# ../flannel (its own module: one SDK Flannel links is stubbed there) and the flannel CNI
# plugin from containernetworking/plugins v0.9.1, the code flannel-io/cni-plugin was forked
# from (the module proxy serves neither flannel-io/cni-plugin nor that SDK). About 2 minutes
# cold; cached as two small binaries.
if [ "${1:-}" = "--flannel" ] || [ "${1:-}" = "--node" ]; then
  flannel_ver=$(awk '/^require github.com\/flannel-io\/flannel /{print $3; exit}' ../flannel/go.mod)
  cni_ver=v0.9.1
  fl_out=$cache/flannel-$flannel_ver-cni-$cni_ver
  if [ -x "$fl_out/flanneld" ] && [ -x "$fl_out/cni/flannel" ]; then
    echo "flannel $flannel_ver: cached in $fl_out"
  else
    mkdir -p "$fl_out/cni"
    # cgo: flanneld's udp backend is C (upstream builds it the same way).
    (cd ../flannel && CGO_ENABLED=1 go build -trimpath \
      -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$flannel_ver" \
      -o "$fl_out/flanneld" github.com/flannel-io/flannel)
    (cd "$fl_out" && GOFLAGS= GOBIN="$fl_out/cni" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
      "github.com/containernetworking/plugins/plugins/meta/flannel@$cni_ver")
    "$fl_out/flanneld" --version
  fi
  if [ "$1" = "--flannel" ]; then exit 0; fi
fi

[ "${1:-}" = "--node" ] || exit 0

# The real nodes. Versions: containerd and CoreDNS as measured in
# ../shared/reference/real-node.md; bump the recipe number when what is built changes.
containerd_ver=v2.2.9
coredns_ver=v1.15.0
recipe=2
bundle=$cache/node-$ver-containerd-$containerd_ver-coredns-$coredns_ver-r$recipe.tar.zst
work=$(cd ../.. && pwd)/target/real-node/bin
stamp=$work/.bundle
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(basename "$bundle")" ]; then
  echo "real-node binaries: $work (from $bundle)"
  exit 0
fi
if [ ! -f "$bundle" ]; then
  t0=$(date +%s)
  tmp=$(mktemp -d "$cache/node-build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  export CGO_ENABLED=0
  go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/test/images/agnhost k8s.io/kubernetes/test/images/regression-issue-74839
  go test -c -trimpath -ldflags "$ldflags" -o "$tmp/e2e.test" k8s.io/kubernetes/test/e2e
  # Ginkgo's CLI runs e2e.test's specs in parallel processes, as upstream's
  # hack/ginkgo-e2e.sh does (the specs mostly wait: 3 processes cut the wall time ~3x).
  go build -trimpath -ldflags "-s -w" -o "$tmp/" github.com/onsi/ginkgo/v2/ginkgo
  cp "$out/kube-proxy" "$tmp/"
  # containerd and CoreDNS are modules of their own: `go install pkg@version` builds each
  # exactly as its go.mod says (GOFLAGS=-mod=mod does not apply outside a module).
  (cd "$tmp" && GOFLAGS= GOBIN="$tmp" go install -trimpath -ldflags "-s -w" \
    -tags "no_btrfs no_devmapper no_zfs" \
    "github.com/containerd/containerd/v2/cmd/containerd@$containerd_ver" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_ver" \
    "github.com/containerd/containerd/v2/cmd/ctr@$containerd_ver")
  (cd "$tmp" && GOFLAGS= GOBIN="$tmp" go install -trimpath -ldflags "-s -w" \
    "github.com/coredns/coredns@$coredns_ver")
  "$tmp/kubelet" --version
  "$tmp/containerd" --version
  "$tmp/coredns" -version | head -1
  tar -C "$tmp" -cf - . | zstd -q -T0 -3 -o "$bundle.tmp"
  mv "$bundle.tmp" "$bundle"
  rm -rf "$tmp"
  trap - EXIT
  echo "real-node binaries built in $(( $(date +%s) - t0 )) s: $bundle ($(du -h "$bundle" | cut -f1))"
fi
rm -rf "$work"
mkdir -p "$work"
zstd -q -d -c "$bundle" | tar -C "$work" -xf -
basename "$bundle" > "$stamp"
echo "real-node binaries: $work (from $bundle)"

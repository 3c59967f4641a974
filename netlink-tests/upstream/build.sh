#!/usr/bin/env bash
# Test tooling: builds upstream's kube-proxy and kube-apiserver from k8s.io/kubernetes (this
# directory's module pins every staging module to the matching v0.X.Y) and etcd from
# go.etcd.io/etcd/server/v3 (etcd/, a module of its own so that etcd's client versions stay
# apart from the apiserver's), caching them under /var/tmp/kube-nlproxy-upstream/VERSION as
# the VM kernel is cached. The tests use them as oracles and as a real control plane; the
# product never runs them.
set -euo pipefail
cd "$(dirname "$0")"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
ver=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' go.mod)
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

#!/usr/bin/env bash
# Test tooling: builds upstream's kube-proxy from k8s.io/kubernetes (this directory's module
# pins every staging module to the matching v0.X.Y) and caches it under
# /var/tmp/kube-nlproxy-upstream/VERSION, as the VM kernel is cached. The tests use it as an
# oracle (netlink-tests/tests/upstream_kube_proxy.rs); the product never runs it.
set -euo pipefail
cd "$(dirname "$0")"
ver=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' go.mod)
out=/var/tmp/kube-nlproxy-upstream/$ver
if [ -x "$out/kube-proxy" ] && "$out/kube-proxy" --version 2>/dev/null | grep -q "$ver"; then
  echo "upstream kube-proxy $ver: cached in $out"
  exit 0
fi
mkdir -p "$out"
minor=$(echo "$ver" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$ver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
GOFLAGS=-mod=mod GOTOOLCHAIN=local go build -trimpath -ldflags "$ldflags" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-proxy
"$out/kube-proxy" --version

#!/usr/bin/env bash
# Proves an arm64 kube-nlproxy binary on a real arm64 kernel (issue #53.1): boots Debian's
# arm64 kernel (linux-image-arm64) under qemu-system-aarch64, emulated (TCG), from an
# initramfs that holds arm64 busybox, the binary, a small cluster's manifests and
# guest-arm64.sh. In nftables mode and then IPVS mode the binary programs the kernel once
# over netlink, a TCP connection from the node to the Service's ClusterIP is answered by its
# endpoint, and `diff` then finds the kernel in sync (exit 0). Not in CI (no cross
# toolchain there): run before each release; docs/release.md has the timings.
#
#   run-arm64.sh [--timeout S] BINARY      # BINARY: target/aarch64-unknown-linux-gnu/image/kube-nlproxy
#
# Needs: qemu-system-arm (qemu-system-aarch64), cpio, xz, and Debian's arm64 packages
# through apt (it adds dpkg's arm64 architecture if missing). Cache: $KNP_VM_ARM64_CACHE,
# default /var/tmp/kube-nlproxy-vm-arm64 (~80 MB).
# Exit status: the guest script's (0 passed); 124 timeout; 125 no status; 126 harness error.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${KNP_VM_ARM64_CACHE:-/var/tmp/kube-nlproxy-vm-arm64}
STAMP=2 TIMEOUT=900
die() { echo "run-arm64: $*" >&2; exit 126; }
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) TIMEOUT=$2; shift 2;;
    -*) die "unknown option $1";;
    *) break;;
  esac
done
[ $# -eq 1 ] || die "usage: run-arm64.sh [--timeout S] BINARY"
BIN=$(realpath "$1")
[ "$(od -An -j18 -N2 -tu2 "$BIN" | tr -d ' ')" = 183 ] || die "$BIN is not an AArch64 ELF binary"

# The modules kube-nlproxy's nftables and IPVS modes use (their dependencies first;
# crc32c_generic: libcrc32c asks the crypto API for crc32c when it loads).
MODULES="crc32c_generic dummy nfnetlink nf_conntrack nf_conntrack_netlink nf_nat nf_tables nft_ct nft_nat
 nft_chain_nat nft_masq nft_numgen nft_hash nft_fib_inet nft_fib_ipv4 nft_fib_ipv6
 nft_reject_inet nft_reject_ipv4 nft_reject_ipv6 ip_vs ip_vs_rr"

setup() {
  for t in qemu-system-aarch64 dpkg-deb apt-get cpio busybox; do
    command -v $t >/dev/null || die "missing host tool '$t' (apt-get install qemu-system-arm cpio busybox-static)"
  done
  dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64 && apt-get update -qq; }
  local pkg
  pkg=$(apt-cache depends linux-image-arm64:arm64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$pkg" ] || { apt-get update -qq; pkg=$(apt-cache depends linux-image-arm64:arm64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}'); }
  [ -n "$pkg" ] || die "cannot resolve linux-image-arm64 from the apt index"
  pkg=${pkg%:arm64}
  mkdir -p "$CACHE/debs"
  ( cd "$CACHE/debs"
    ls "${pkg}"_*.deb >/dev/null 2>&1 || apt-get download "$pkg:arm64" || die "apt-get download $pkg:arm64 failed"
    ls busybox-static_*.deb >/dev/null 2>&1 || apt-get download busybox-static:arm64 || die "apt-get download busybox-static:arm64 failed"
  ) >&2
  local K="$CACHE/kroot" B="$CACHE/bbroot" R="$CACHE/initrd"
  rm -rf "$K" "$B" "$R"; mkdir -p "$K" "$B"
  dpkg-deb -x "$CACHE/debs/${pkg}"_*.deb "$K"
  dpkg-deb -x "$CACHE"/debs/busybox-static_*.deb "$B"
  local kver; kver=$(ls "$K/lib/modules")
  cp "$K/boot/vmlinuz-$kver" "$CACHE/vmlinuz"
  local M="$K/lib/modules/$kver"
  busybox depmod -b "$K" "$kver"
  mkdir -p "$R"/{bin,proc,sys,dev,tmp,etc,lib/modules}
  awk -v want="$MODULES" -v who=run-arm64 -f "$HERE/module-order.awk" "$M/modules.dep" > "$R/etc/modules.order"
  local m
  while read -r m; do mkdir -p "$R/lib/modules/$(dirname "$m")"; cp "$M/$m" "$R/lib/modules/$m"; done < "$R/etc/modules.order"
  cp "$B/bin/busybox" "$R/bin/busybox"
  for a in sh mount insmod ip nc cat echo sleep poweroff mkdir grep sed xz gzip uname; do ln -s busybox "$R/bin/$a"; done
  ( cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet ) > "$CACHE/base.cpio"
  rm -rf "$K" "$B" "$R"
  echo "$STAMP $pkg $kver" > "$CACHE/stamp"
  echo "run-arm64: guest ready: $pkg ($kver)" >&2
}

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"; flock 9
[ "$(cut -d' ' -f1 "$CACHE/stamp" 2>/dev/null)" = "$STAMP" ] || setup

W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
TOKEN=$RANDOM$RANDOM
mkdir -p "$W/root"
cp "$BIN" "$W/root/kube-nlproxy"
cp "$HERE/guest-arm64.sh" "$W/root/guest.sh"
cp "$HERE/arm64-cluster.yaml" "$W/root/cluster.yaml"
cat > "$W/root/init" <<INIT
#!/bin/sh
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
while read -r m; do insmod "/lib/modules/\$m" || echo "run-arm64: insmod \$m failed"; done < /etc/modules.order
echo "@@START-$TOKEN@@"
/bin/sh /guest.sh
echo "@@EXIT-$TOKEN=\$?@@"
poweroff -f
INIT
chmod 755 "$W/root/init" "$W/root/kube-nlproxy"
( cd "$W/root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet ) > "$W/extra.cpio"
cat "$CACHE/base.cpio" "$W/extra.cpio" > "$W/initrd.cpio"
t0=$(date +%s)
set +e
timeout "$TIMEOUT" qemu-system-aarch64 -M virt -cpu max -smp 2 -m 1024 -nographic -no-reboot \
  -kernel "$CACHE/vmlinuz" -initrd "$W/initrd.cpio" \
  -append "console=ttyAMA0 panic=-1 quiet rdinit=/init" -nic none > "$W/console" 2>&1
rc=$?
set -e
tr -d "\r" < "$W/console" | grep -E "run-arm64:" || true
tr -d '\r' < "$W/console" | sed -n "/@@START-$TOKEN@@/,/@@EXIT-$TOKEN/p" | grep -v "@@START"
echo "run-arm64: $(( $(date +%s) - t0 )) s from boot to power-off" >&2
[ $rc -eq 124 ] && { echo "run-arm64: timed out after $TIMEOUT s; console:" >&2; tail -30 "$W/console" >&2; exit 124; }
st=$(tr -d '\r' < "$W/console" | sed -n "s/.*@@EXIT-$TOKEN=\([0-9]*\)@@.*/\1/p" | tail -1)
[ -n "$st" ] || { echo "run-arm64: no exit status from the guest; console:" >&2; tail -40 "$W/console" >&2; exit 125; }
exit "$st"

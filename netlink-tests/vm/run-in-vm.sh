#!/usr/bin/env bash
# Runs one command inside a throwaway QEMU guest booting Debian's stock kernel
# (linux-image-amd64), which ships ip_vs*, dummy and the nf_tables modules that the
# development and CI machines' kernels lack. The guest's exit status becomes ours.
#
#   run-in-vm.sh --setup                         # download + build the cached guest only
#   run-in-vm.sh [--share DIR]... [--env NAME=VAL]... [--timeout S] [--mem MB] [--smp N]
#                [--append KERNEL-ARGS] [--forward-tcp PORT] [--boot-timeout S] -- CMD ARGS...
#
# --timeout S bounds one boot and its command (default 900); --boot-timeout S (default 90,
# or $KNP_VM_BOOT_TIMEOUT) bounds the boot alone: a guest that has not started the command by
# then is killed and booted once more.
# --append adds to the guest kernel's command line (e.g. ipv6.disable=1).
# --forward-tcp PORT gives the guest a virtio NIC on qemu's user network, isolated
# (restrict=on) except that 10.0.2.100:PORT reaches 127.0.0.1:PORT in the network namespace
# qemu runs in (through `nc`, one per connection); the guest configures eth0 itself
# (10.0.2.15/24).
# --share DIR mounts DIR read-write over 9p at the same absolute path in the guest; the
# guest's working directory is $PWD when it lies inside a share. The guest has busybox,
# dash as /bin/sh, iproute2's ip, nft, ipvsadm, iptables (-nft and -legacy), ipset, conntrack,
# strace and glibc (so -gnu Rust binaries reached through a share run as they are). Test oracles only: nothing here is used by src/.
#
# Needs: qemu-system-x86 busybox-static cpio (apt), and apt access to Debian's archive
# the first time (cache: $KNP_VM_CACHE, default /var/tmp/kube-nlproxy-vm, ~160 MB).
# Exit status: the command's; 124 timeout; 125 the guest died without a status, or did not
# boot twice (console log on stderr); 126 harness error.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${KNP_VM_CACHE:-/var/tmp/kube-nlproxy-vm}
# --smp N: virtual CPUs. Without KVM (the CI machines have none) qemu emulates each on its
# own host thread; the IPVS tests ask for two (netlink-tests/tests/ipvs.rs), kernel-bench's
# IPVS rows were measured on one.
MEM=1024 TIMEOUT=900 BOOT_TIMEOUT=${KNP_VM_BOOT_TIMEOUT:-90} SETUP_ONLY=0 SMP=1 APPEND="" FORWARD=""
SHARES=() ENVS=()
STAMP=11

die() { echo "run-in-vm: $*" >&2; exit 126; }

while [ $# -gt 0 ]; do
  case "$1" in
    --share) SHARES+=("$(realpath "$2")"); shift 2;;
    --env) ENVS+=("$2"); shift 2;;
    --mem) MEM=$2; shift 2;;
    --smp) SMP=$2; shift 2;;
    --timeout) TIMEOUT=$2; shift 2;;
    --append) APPEND=$2; shift 2;;
    --boot-timeout) BOOT_TIMEOUT=$2; shift 2;;
    --forward-tcp) FORWARD=$2; shift 2;;
    --setup) SETUP_ONLY=1; shift;;
    --) shift; break;;
    *) die "unknown option $1";;
  esac
done

# Loaded in this order (their dependencies first, resolved from modules.dep).
MODULES="crc32c_generic virtio_pci 9pnet_virtio 9p virtio_net dummy veth
 nfnetlink nf_conntrack nf_conntrack_netlink nf_nat nf_tables nft_ct nft_nat nft_chain_nat
 nft_masq nft_redir nft_numgen nft_hash nft_fib_inet nft_fib_ipv4 nft_fib_ipv6
 nft_reject_inet nft_reject_ipv4 nft_reject_ipv6
 ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh ip_vs_lc ip_vs_wlc ip_vs_sed ip_vs_nq ip_vs_mh
 x_tables xt_tcpudp xt_comment xt_mark xt_addrtype xt_conntrack xt_set xt_nat xt_MASQUERADE
 nft_compat ip_tables iptable_nat iptable_filter ipt_REJECT ip6t_REJECT xt_physdev xt_multiport xt_statistic xt_ipvs
 ip_set ip_set_hash_ip ip_set_hash_ipport ip_set_hash_ipportip ip_set_hash_ipportnet
 ip_set_hash_net ip_set_bitmap_port
 sctp"
# sctp: SCTP sockets for the SCTP Service tests (the host kernels lack CONFIG_IP_SCTP);
# conntrack's and IPVS's SCTP support are built into nf_conntrack and ip_vs.
ORACLE_PKGS="ipvsadm libnl-3-200 libnl-genl-3-200 libpopt0"

# Maps a host path onto the guest's merged-/usr layout.
guest_path() { case "$1" in /lib/*|/lib64/*|/bin/*|/sbin/*) echo "/usr$1";; *) echo "$1";; esac; }

# copy_with_libs ROOT FILE [LD_LIBRARY_PATH [PREFIX]]: FILE (minus PREFIX) and its libraries.
copy_with_libs() {
  local root=$1 f=$2 llp=${3:-} pfx=${4:-} d lib
  d=$(guest_path "${f#"$pfx"}"); mkdir -p "$root$(dirname "$d")"; cp -L "$f" "$root$d"
  LD_LIBRARY_PATH=$llp ldd "$f" >/dev/null 2>&1 || return 0
  for lib in $(LD_LIBRARY_PATH=$llp ldd "$f" | awk '/=> \//{print $3} /^[ \t]*\//{print $1}'); do
    d=$(guest_path "${lib#"$pfx"}"); [ -e "$root$d" ] && continue
    mkdir -p "$root$(dirname "$d")"; cp -L "$lib" "$root$d"
  done
}

setup() {
  for t in qemu-system-x86_64 dpkg-deb apt-get cpio ldd busybox xz flock timeout; do
    command -v $t >/dev/null || die "missing host tool '$t' (apt-get install qemu-system-x86 busybox-static cpio)"
  done
  local bb; bb=$(command -v busybox)
  ldd "$bb" >/dev/null 2>&1 && die "$bb is dynamically linked; install busybox-static"
  local pkg
  resolve() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
  pkg=$(resolve); [ -n "$pkg" ] || { apt-get update >&2; pkg=$(resolve); }
  [ -n "$pkg" ] || die "cannot resolve linux-image-amd64 from the apt index"
  mkdir -p "$CACHE/debs"
  ( cd "$CACHE/debs"
    ls "${pkg}"_*.deb >/dev/null 2>&1 || apt-get download "$pkg" || { apt-get update && apt-get download "$pkg"; } \
      || die "apt-get download $pkg failed"
    for p in $ORACLE_PKGS; do ls "${p}"_*.deb >/dev/null 2>&1 || apt-get download "$p" || die "apt-get download $p failed"; done
  ) >&2
  local K="$CACHE/kroot" T="$CACHE/toolroot" R="$CACHE/initrd"
  rm -rf "$K" "$T" "$R"; mkdir -p "$K" "$T"
  dpkg-deb -x "$CACHE/debs/${pkg}"_*.deb "$K"
  for d in "$CACHE"/debs/*.deb; do case "$d" in */linux-image-*) ;; *) dpkg-deb -x "$d" "$T";; esac; done
  local kver; kver=$(ls "$K/lib/modules")
  # TCG decompresses a bzImage slowly (~3.5 s per boot): boot the ELF vmlinux through PVH.
  local off
  off=$(LC_ALL=C grep -abo $'\xfd7zXZ\x00' "$K/boot/vmlinuz-$kver" | head -1 | cut -d: -f1 || true)
  rm -f "$CACHE/vmlinux"
  if [ -n "$off" ] && grep -q '^CONFIG_PVH=y' "$K/boot/config-$kver"; then
    tail -c +$((off+1)) "$K/boot/vmlinuz-$kver" | xz -dc > "$CACHE/vmlinux" 2>/dev/null || true
    [ "$(head -c4 "$CACHE/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || rm -f "$CACHE/vmlinux"
  fi
  cp "$K/boot/vmlinuz-$kver" "$CACHE/vmlinuz"
  local M="$K/lib/modules/$kver"
  busybox depmod -b "$K" "$kver"
  mkdir -p "$R"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,proc,sys,dev,tmp,run/netns,etc,root,harness}
  ln -s usr/bin "$R/bin"; ln -s usr/sbin "$R/sbin"; ln -s usr/lib "$R/lib"; ln -s usr/lib64 "$R/lib64"
  # Post-order walk of modules.dep: every module after its dependencies.
  awk -v want="$MODULES" -v who=run-in-vm -f "$HERE/module-order.awk" "$M/modules.dep" > "$R/etc/modules.order"
  local GM="$R/usr/lib/modules/$kver" m
  while read -r m; do mkdir -p "$GM/$(dirname "$m")"; cp "$M/$m" "$GM/$m"; done < "$R/etc/modules.order"
  cp "$M/modules.dep" "$M/modules.alias" "$M/modules.builtin" "$GM/" 2>/dev/null || true
  cp "$bb" "$R/usr/bin/busybox"
  local a
  for a in $(busybox --list-full); do a=$(guest_path "/$a"); [ -e "$R$a" ] || ln -s /usr/bin/busybox "$R$a"; done
  # busybox ash prefers its own applets (its ip has no dummy links): dash is /bin/sh.
  for a in dash bash ip nft strace conntrack; do
    local f; f=$(command -v $a) || die "host tool $a missing (apt-get install dash bash iproute2 nftables strace conntrack)"
    f=$(realpath "$f"); rm -f "$R/usr/bin/$a" "$R/usr/sbin/$a"; copy_with_libs "$R" "$f"
    [ -e "$R/usr/sbin/$a" ] || ln -sf "$(guest_path "$f")" "$R/usr/sbin/$a"
  done
  ln -sf dash "$R/usr/bin/sh"
  # Upstream IPVS mode's own tools, to lay down its leftovers in migration tests: the host's
  # iptables (nft and legacy flavours, one multi-call binary each, plus its extensions) and ipset.
  local multi n
  for multi in xtables-nft-multi xtables-legacy-multi ipset; do
    f=$(command -v $multi) || die "host tool $multi missing (apt-get install iptables ipset)"
    copy_with_libs "$R" "$(realpath "$f")"
  done
  # The plain names are the nft flavour, as Debian's alternatives default (upstream
  # kube-proxy execs "iptables", "ip6tables-restore", ...).
  for n in iptables ip6tables; do
    for a in "" -save -restore; do
      ln -sf xtables-nft-multi "$R/usr/sbin/$n-nft$a"; ln -sf xtables-legacy-multi "$R/usr/sbin/$n-legacy$a"
      ln -sf xtables-nft-multi "$R/usr/sbin/$n$a"
    done
  done
  mkdir -p "$R/usr/lib/x86_64-linux-gnu/xtables"
  for f in /usr/lib/x86_64-linux-gnu/xtables/*.so; do copy_with_libs "$R" "$f"; done
  rm -f "$R/usr/sbin/ipvsadm"
  local ipvsadm; ipvsadm=$(ls "$T"/usr/sbin/ipvsadm "$T"/sbin/ipvsadm 2>/dev/null | head -1 || true)
  [ -n "$ipvsadm" ] || die "ipvsadm not found in its package"
  copy_with_libs "$R" "$ipvsadm" "$T/usr/lib/x86_64-linux-gnu:$T/lib/x86_64-linux-gnu" "$T"
  for a in libgcc_s.so.1 libm.so.6 libc.so.6; do cp -L "/lib/x86_64-linux-gnu/$a" "$R/usr/lib/x86_64-linux-gnu/"; done
  echo "root:x:0:0:root:/root:/bin/sh" > "$R/etc/passwd"; echo "root:x:0:" > "$R/etc/group"
  printf '127.0.0.1 localhost\n::1 localhost\n' > "$R/etc/hosts"
  # ipset and iptables name protocols ("tcp:80") through getprotobyname.
  cp /etc/protocols "$R/etc/protocols"
  cat > "$R/init" <<'INIT'
#!/bin/sh
export PATH=/usr/sbin:/usr/bin HOME=/root
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; chmod 1777 /tmp
exec </dev/console >/dev/console 2>&1
stty -onlcr 2>/dev/null
. /harness/config
while read -r m; do insmod "/lib/modules/$(uname -r)/$m" || echo "run-in-vm: insmod $m failed"; done < /etc/modules.order
ip link set lo up
i=0
for p in $KNP_SHARES; do
  mkdir -p "$p"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,access=any "share$i" "$p" || echo "run-in-vm: cannot mount $p"
  i=$((i+1))
done
cd "$KNP_CWD" 2>/dev/null || cd /
echo "@@START-$KNP_TOKEN@@"
/bin/sh /harness/cmd.sh
echo "@@EXIT-$KNP_TOKEN=$?@@"
cd /; sync
for p in $KNP_SHARES; do umount "$p" 2>/dev/null; done
poweroff -f
INIT
  chmod 755 "$R/init"
  ( cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet ) > "$CACHE/base.cpio"
  rm -rf "$K" "$T" "$R"
  echo "$STAMP $pkg $kver" > "$CACHE/stamp"
  echo "run-in-vm: guest ready: $pkg ($kver)" >&2
}

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"; flock 9
[ "$(cut -d' ' -f1 "$CACHE/stamp" 2>/dev/null)" = "$STAMP" ] || setup
flock -u 9
[ "$SETUP_ONLY" = 1 ] && exit 0
[ $# -gt 0 ] || die "no command given"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/knp-vm.XXXXXX")
QPID=""
trap '[ -n "$QPID" ] && kill "$QPID" 2>/dev/null; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
mkdir -p "$WORK/o/harness"
q() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
{
  for v in RUST_BACKTRACE RUST_LOG NO_COLOR; do [ -n "${!v:-}" ] && echo "export $v=$(q "${!v}")"; done
  for e in "${ENVS[@]}"; do echo "export ${e%%=*}=$(q "${e#*=}")"; done
  printf 'exec'; for a in "$@"; do printf ' %s' "$(q "$a")"; done; echo
} > "$WORK/o/harness/cmd.sh"
CWD=/
for s in "${SHARES[@]}"; do case "$PWD/" in "$s"/*) CWD=$PWD;; esac; done
TOKEN=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
{ echo "KNP_TOKEN=$TOKEN"; echo "KNP_CWD=$(q "$CWD")"; echo "KNP_SHARES=$(q "${SHARES[*]}")"; } > "$WORK/o/harness/config"
( cd "$WORK/o" && find . -mindepth 1 | cpio -o -H newc -R 0:0 --quiet ) > "$WORK/overlay.cpio"
cat "$CACHE/base.cpio" "$WORK/overlay.cpio" > "$WORK/initrd.cpio"

accel=(-accel tcg,thread=multi -cpu max)
if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then accel=(-accel kvm -cpu host); fi
KERNEL=$CACHE/vmlinux; [ -f "$KERNEL" ] || KERNEL=$CACHE/vmlinuz
args=(qemu-system-x86_64 -nodefaults -no-user-config -display none -vga none -no-reboot
  "${accel[@]}" -m "$MEM" -smp "$SMP" -M pc -chardev stdio,id=con,signal=off -serial chardev:con
  -kernel "$KERNEL" -initrd "$WORK/initrd.cpio"
  -append "console=ttyS0 quiet loglevel=3 panic=-1 oops=panic rdinit=/init mitigations=off tsc=reliable no_timer_check 8250.nr_uarts=1 random.trust_cpu=on${APPEND:+ $APPEND}")
if [ -n "$FORWARD" ]; then
  args+=(-nic "user,model=virtio-net-pci,restrict=on,guestfwd=tcp:10.0.2.100:$FORWARD-cmd:nc 127.0.0.1 $FORWARD")
fi
for i in "${!SHARES[@]}"; do args+=(-virtfs "local,path=${SHARES[$i]},mount_tag=share$i,security_model=none,id=fs$i"); done

# One boot: qemu's console is read line by line; the guest's command runs between its START
# and EXIT markers. A guest that has not printed START within BOOT_TIMEOUT seconds never
# reached its command (one boot in some hundreds under TCG printed nothing at all for
# 1200 s, 2026-12-06; a healthy one prints START after ~6 s, ~20 s on a loaded CI machine),
# so it is killed and booted once more: nothing has run in it yet.
boot() {
  rm -f "$WORK/out"; : > "$WORK/console.log"; mkfifo "$WORK/out"
  timeout -k 5 "$TIMEOUT" "${args[@]}" < /dev/null > "$WORK/out" 2> "$WORK/qemu.err" &
  QPID=$!
  status="" started=0 booted=1
  local deadline=$((SECONDS + BOOT_TIMEOUT)) line rc left
  while :; do
    line="" rc=0
    if [ "$started" = 1 ]; then
      IFS= read -r line || rc=$?
    else
      left=$((deadline - SECONDS))
      [ "$left" -gt 0 ] || { booted=0; break; }
      IFS= read -r -t "$left" line || rc=$?
      [ "$rc" -gt 128 ] && { [ -n "$line" ] && printf '%s\n' "$line" >> "$WORK/console.log"; continue; }
    fi
    [ "$rc" != 0 ] && [ -z "$line" ] && break
    line=${line%$'\r'}
    printf '%s\n' "$line" >> "$WORK/console.log"
    case "$line" in
      *"@@START-$TOKEN@@"*) started=1; continue;;
      *"@@EXIT-$TOKEN="*@@*) pre=${line%%"@@EXIT-$TOKEN="*}; [ -n "$pre" ] && printf '%s\n' "$pre"
        status=${line##*"@@EXIT-$TOKEN="}; status=${status%%@@*}; continue;;
    esac
    [ "$started" = 1 ] && [ -z "$status" ] && printf '%s\n' "$line"
  done < "$WORK/out"
  [ "$booted" = 0 ] && { kill "$QPID" 2>/dev/null || true; }
  qrc=0; wait "$QPID" || qrc=$?
  QPID=""
}

boot
if [ "$booted" = 0 ]; then
  echo "run-in-vm: the guest did not reach its command within ${BOOT_TIMEOUT}s; booting it once more. Console log of the first boot:" >&2
  cat "$WORK/console.log" "$WORK/qemu.err" >&2
  boot
fi
[ -n "$status" ] && exit "$status"
rc=125
if [ "$booted" = 0 ]; then
  echo "run-in-vm: the guest did not reach its command within ${BOOT_TIMEOUT}s, twice" >&2
elif [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  echo "run-in-vm: guest timed out after ${TIMEOUT}s" >&2; rc=124
fi
echo "run-in-vm: the guest reported no exit status (qemu rc=$qrc); console log:" >&2
cat "$WORK/console.log" "$WORK/qemu.err" >&2
exit $rc

# Runs in run-arm64.sh's guest (busybox sh, arm64 kernel): each mode programs the kernel once,
# the node reaches the ClusterIP's endpoint, and diff finds nothing to change.
fail() { echo "FAIL: $*"; exit 1; }
ip link set lo up
# The node's address, and the endpoint's (a pod address, here on the node itself).
ip addr add 192.168.50.1/32 dev lo
ip addr add 10.244.1.2/32 dev lo
echo 'echo hello-from-10.244.1.2' > /hello.sh
nc -ll -p 8080 -e /bin/sh /hello.sh &
FLAGS="--manifests /cluster.yaml --hostname-override node1 --cluster-cidr 10.244.0.0/16"
uname -m -r
/kube-nlproxy --version || fail "--version"
for mode in nftables ipvs; do
  echo "== $mode"
  if [ $mode = nftables ]; then
    # The node routes the Service range as a default route would (output DNAT rewrites it).
    ip route add 10.96.0.0/12 dev lo src 192.168.50.1
  else
    ip route del 10.96.0.0/12 dev lo
  fi
  # Control: before the sync nothing answers at the ClusterIP or the NodePort.
  got=$(nc -w 3 10.96.0.10 80 </dev/null 2>/dev/null)
  [ -z "$got" ] || fail "$mode: the ClusterIP answered '$got' before the sync"
  /kube-nlproxy $FLAGS --proxy-mode $mode --once -v 0 || fail "$mode: --once"
  got=$(nc -w 5 10.96.0.10 80 </dev/null)
  [ "$got" = hello-from-10.244.1.2 ] || fail "$mode: the ClusterIP answered '$got'"
  echo "$mode: 10.96.0.10:80 answered by its endpoint"
  got=$(nc -w 5 192.168.50.1 30080 </dev/null)
  [ "$got" = hello-from-10.244.1.2 ] || fail "$mode: the NodePort answered '$got'"
  echo "$mode: NodePort 192.168.50.1:30080 answered by its endpoint"
  /kube-nlproxy diff $FLAGS --proxy-mode $mode || fail "$mode: diff exit $?"
  echo "$mode: diff finds the kernel in sync"
done
echo PASS

//! Forwarded packets that conntrack marks INVALID (kubernetes#74839): the daemon in
//! iptables mode drops and counts them, and exports the count as upstream's
//! `kubeproxy_iptables_ct_state_invalid_dropped_packets_total`; in nftables mode (as
//! upstream's) they pass and the metric does not exist. The packets are bare TCP ACKs for no
//! connection, sent with a raw socket from the external host to pod A through the node,
//! whose conntrack is strict (`nf_conntrack_tcp_loose` 0); pod A's raw socket tells
//! whether they arrived.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools
#![allow(unsafe_code)] // raw socket calls on test processes

use std::net::Ipv4Addr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use netlink_tests::cluster::{Cluster, EXT_IP};
use netlink_tests::differential::{metrics, sample};
use netlink_tests::ns::NetNs;
use netlink_tests::scenario::{self, Backends, LOCAL_EP};

const METRIC: &str = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total";
/// Source port of the crafted ACKs, to tell them from any other TCP at pod A.
const SPORT: u16 = 47_474;
const SENT: usize = 5;

/// The Internet checksum of a TCP segment with its IPv4 pseudo-header.
fn tcp_checksum(src: Ipv4Addr, dst: Ipv4Addr, segment: &[u8]) -> u16 {
    let mut buf = Vec::with_capacity(12 + segment.len());
    buf.extend(src.octets());
    buf.extend(dst.octets());
    buf.extend([0, 6]);
    buf.extend((segment.len() as u16).to_be_bytes());
    buf.extend(segment);
    if buf.len() % 2 == 1 {
        buf.push(0);
    }
    let mut sum: u32 = buf
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A bare ACK from `src:SPORT` to `dst:dport` for a connection nobody opened.
fn bare_ack(src: Ipv4Addr, dst: Ipv4Addr, dport: u16, seq: u32) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0..2].copy_from_slice(&SPORT.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..8].copy_from_slice(&seq.to_be_bytes());
    h[8..12].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    h[12] = 5 << 4; // no options
    h[13] = 0x10; // ACK
    h[14..16].copy_from_slice(&1024u16.to_be_bytes());
    let sum = tcp_checksum(src, dst, &h);
    h[16..18].copy_from_slice(&sum.to_be_bytes());
    h
}

fn raw_tcp_socket() -> i32 {
    // SAFETY: plain socket(2); the fd is checked and closed by the caller.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_TCP) };
    assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
    fd
}

fn sockaddr(ip: Ipv4Addr) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    }
}

/// Sends [`SENT`] bare ACKs from `ns` (bound to `src`) to `dst:dport`.
fn send_bare_acks(ns: &NetNs, src: Ipv4Addr, dst: Ipv4Addr, dport: u16) {
    ns.run(move || {
        let fd = raw_tcp_socket();
        let from = sockaddr(src);
        let to = sockaddr(dst);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: valid fd and sockaddr_in of the stated length.
        let rc = unsafe { libc::bind(fd, &from as *const _ as *const libc::sockaddr, len) };
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        for i in 0..SENT {
            let seg = bare_ack(src, dst, dport, 1000 + i as u32 * 100);
            // SAFETY: valid fd, buffer and sockaddr_in.
            let n = unsafe {
                libc::sendto(
                    fd,
                    seg.as_ptr().cast(),
                    seg.len(),
                    0,
                    &to as *const _ as *const libc::sockaddr,
                    len,
                )
            };
            assert_eq!(n, seg.len() as isize, "{}", std::io::Error::last_os_error());
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
    });
}

/// Counts our ACKs arriving in `ns` until `quiet` passes without one (or 5 s), starting once
/// the socket is open (signalled on `ready`).
fn count_arrivals(
    ns: &NetNs,
    quiet: Duration,
    ready: mpsc::Sender<()>,
) -> std::thread::JoinHandle<usize> {
    ns.spawn(move || {
        let fd = raw_tcp_socket();
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: valid fd and timeval.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        ready.send(()).unwrap();
        let (mut seen, t0) = (0, Instant::now());
        let mut last = Instant::now();
        let mut buf = [0u8; 2048];
        while last.elapsed() < quiet && t0.elapsed() < Duration::from_secs(5) {
            // SAFETY: valid fd and buffer.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 20 {
                continue;
            }
            let ihl = usize::from(buf[0] & 0x0f) * 4;
            let n = n as usize;
            if n >= ihl + 4 && u16::from_be_bytes([buf[ihl], buf[ihl + 1]]) == SPORT {
                seen += 1;
                last = Instant::now();
            }
        }
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
        seen
    })
}

/// Runs the daemon with `args` on a node with strict TCP tracking, sends the ACKs and
/// returns (ACKs that reached pod A, the metrics text, our ip table as `nft` lists it).
fn send_through(args: &[&str]) -> (usize, String, String) {
    let c: Cluster = scenario::web_cluster(Backends {
        ipv6: false,
        udp: false,
    });
    c.node
        .write_sysctl("net/netfilter/nf_conntrack_tcp_loose", "0");
    let _d = c.start_daemon(&scenario::web_yaml_with("", &[LOCAL_EP], false), args);
    let (tx, rx) = mpsc::channel();
    let arrivals = count_arrivals(&c.pods[0], Duration::from_millis(800), tx);
    rx.recv_timeout(Duration::from_secs(5)).expect("receiver");
    let (src, dst) = (EXT_IP.parse().unwrap(), LOCAL_EP.parse().unwrap());
    send_bare_acks(&c.ext, src, dst, 8080);
    let seen = arrivals.join().expect("receiver thread");
    let text = metrics(&c.node, "127.0.0.1:10249");
    (seen, text, c.ruleset("ip"))
}

#[test]
fn iptables_mode_drops_and_counts_forwarded_invalid_packets() {
    let (seen, text, ruleset) = send_through(&["--proxy-mode", "iptables"]);
    assert_eq!(seen, 0, "INVALID ACKs reached the pod:\n{ruleset}");
    assert!(
        ruleset.contains(&format!("ct state invalid counter packets {SENT} ")),
        "{ruleset}"
    );
    assert!(
        text.contains(&format!(
            "# HELP {METRIC} packets dropped by iptables to work around conntrack problems\n\
             # TYPE {METRIC} counter\n"
        )),
        "{text}"
    );
    assert_eq!(sample(&text, METRIC), SENT as f64, "{text}");
}

#[test]
fn nftables_mode_forwards_invalid_packets_and_has_no_such_metric() {
    let (seen, text, ruleset) = send_through(&["--proxy-mode", "nftables"]);
    assert_eq!(seen, SENT, "the ACKs must be forwarded:\n{ruleset}");
    assert!(!ruleset.contains("ct state invalid"), "{ruleset}");
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_duration_seconds"),
        "metrics were served: {text}"
    );
    assert!(!text.contains(METRIC), "{text}");
}

/// `conntrack.tcpBeLiberal` sets nf_conntrack_tcp_be_liberal before the sysctl is read:
/// no drop, as upstream, and the metric still exists at 0 (upstream registers it in
/// iptables mode whatever the sysctl).
#[test]
fn iptables_mode_with_a_liberal_conntrack_forwards_invalid_packets_and_counts_none() {
    let (seen, text, ruleset) =
        send_through(&["--proxy-mode", "iptables", "--conntrack-tcp-be-liberal"]);
    assert_eq!(seen, SENT, "the ACKs must be forwarded:\n{ruleset}");
    assert!(!ruleset.contains("ct state invalid"), "{ruleset}");
    assert!(text.contains(&format!("{METRIC} 0\n")), "{text}");
}

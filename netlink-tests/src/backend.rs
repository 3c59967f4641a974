//! Test backends and clients. A backend answers each TCP connection (or UDP datagram) with
//! `NAME PEER-IP\n`, then echoes lines, so a test sees which endpoint answered and which
//! source address it saw.
#![allow(unsafe_code)] // kill(2), setns(2), geteuid(2) and socket calls on test processes

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use crate::ns::NetNs;

/// Starts a TCP backend named `name` on `addr` inside `ns` (runs until the process exits).
pub fn tcp_backend(ns: &NetNs, name: &str, addr: SocketAddr) {
    let name = name.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    ns.spawn(move || {
        let l = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        tx.send(()).unwrap();
        for s in l.incoming().flatten() {
            let name = name.clone();
            std::thread::spawn(move || {
                let peer = s
                    .peer_addr()
                    .map(|p| p.ip().to_string())
                    .unwrap_or_default();
                let mut w = s.try_clone().unwrap();
                let _ = writeln!(w, "{name} {peer}");
                let mut r = BufReader::new(s);
                let mut line = String::new();
                while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                    let _ = w.write_all(line.as_bytes());
                    line.clear();
                }
            });
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("backend started");
}

/// Starts a UDP backend: each datagram is answered with `NAME PEER-IP`.
pub fn udp_backend(ns: &NetNs, name: &str, addr: SocketAddr) {
    let name = name.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    ns.spawn(move || {
        let s = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind udp {addr}: {e}"));
        tx.send(()).unwrap();
        let mut buf = [0u8; 1500];
        while let Ok((_, peer)) = s.recv_from(&mut buf) {
            let _ = s.send_to(format!("{name} {}", peer.ip()).as_bytes(), peer);
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("udp backend started");
}

/// The outcome of one connection attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The backend `name` answered and saw the client as `peer`.
    Answered { name: String, peer: IpAddr },
    /// Refused (TCP RST or ICMP unreachable).
    Refused,
    /// No answer within the timeout (dropped).
    Timeout,
    /// Some other error.
    Error(String),
}

impl Reply {
    pub fn name(&self) -> Option<&str> {
        match self {
            Reply::Answered { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// A backend's greeting (`NAME PEER-IP`) as a [`Reply`].
pub fn parse_greeting(s: &str) -> Reply {
    let mut it = s.split_whitespace();
    match (it.next(), it.next().and_then(|p| p.parse().ok())) {
        (Some(n), Some(peer)) => Reply::Answered {
            name: n.to_string(),
            peer,
        },
        _ => Reply::Error(format!("unexpected greeting {s:?}")),
    }
}

/// A socket error as a [`Reply`]: refused, timed out, or another error.
pub fn classify(e: &std::io::Error) -> Reply {
    match e.kind() {
        ErrorKind::ConnectionRefused => Reply::Refused,
        ErrorKind::TimedOut | ErrorKind::WouldBlock => Reply::Timeout,
        _ if e.raw_os_error() == Some(libc::EHOSTUNREACH) => Reply::Refused,
        _ => Reply::Error(e.to_string()),
    }
}

/// Connects over TCP from inside the calling thread's namespace, optionally from `src`.
pub fn tcp_probe_here(dst: SocketAddr, src: Option<IpAddr>, timeout: Duration) -> Reply {
    let res = match src {
        None => TcpStream::connect_timeout(&dst, timeout),
        Some(ip) => connect_from(ip, dst, timeout),
    };
    let mut s = match res {
        Ok(s) => s,
        Err(e) => return classify(&e),
    };
    s.set_read_timeout(Some(timeout)).ok();
    let mut buf = [0u8; 256];
    let mut got = Vec::new();
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.contains(&b'\n') {
                    break;
                }
            }
            Err(e) => return classify(&e),
        }
    }
    parse_greeting(String::from_utf8_lossy(&got).trim())
}

fn connect_from(src: IpAddr, dst: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    // std has no bind-before-connect; do it with libc.
    use std::os::fd::FromRawFd;
    let (domain, sa_src, sa_dst) = match (src, dst) {
        (IpAddr::V4(s), SocketAddr::V4(d)) => (
            libc::AF_INET,
            sockaddr_v4(s, 0),
            sockaddr_v4(*d.ip(), d.port()),
        ),
        _ => return Err(std::io::Error::other("connect_from: IPv4 only")),
    };
    // SAFETY: plain socket syscalls on a fresh fd with correctly sized sockaddr_in values.
    unsafe {
        let fd = libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as _,
            tv_usec: 0,
        };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            &tv as *const _ as *const _,
            std::mem::size_of::<libc::timeval>() as _,
        );
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(fd, &sa_src as *const _ as *const libc::sockaddr, len) != 0 {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        if libc::connect(fd, &sa_dst as *const _ as *const libc::sockaddr, len) != 0 {
            let mut e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINPROGRESS) {
                e = std::io::Error::from(ErrorKind::TimedOut);
            }
            libc::close(fd);
            return Err(e);
        }
        Ok(TcpStream::from_raw_fd(fd))
    }
}

fn sockaddr_v4(ip: std::net::Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    }
}

/// Connects over TCP from inside `ns`.
pub fn tcp_probe(ns: &NetNs, dst: SocketAddr) -> Reply {
    ns.run(move || tcp_probe_here(dst, None, Duration::from_secs(2)))
}

/// Connects from `ns` with source address `src`.
pub fn tcp_probe_from(ns: &NetNs, src: IpAddr, dst: SocketAddr) -> Reply {
    ns.run(move || tcp_probe_here(dst, Some(src), Duration::from_secs(2)))
}

/// `n` TCP probes from `ns`; returns every reply.
pub fn tcp_probes(ns: &NetNs, dst: SocketAddr, n: usize) -> Vec<Reply> {
    ns.run(move || {
        (0..n)
            .map(|_| tcp_probe_here(dst, None, Duration::from_secs(2)))
            .collect()
    })
}

/// One UDP request from `ns` (from an ephemeral port); a reject reads as [`Reply::Refused`].
pub fn udp_probe(ns: &NetNs, dst: SocketAddr) -> Reply {
    let any: SocketAddr = if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }
        .parse()
        .unwrap();
    udp_probe_from(ns, any, dst)
}

/// One UDP request from `ns`, sent from `src` (a fixed port sends one flow again).
pub fn udp_probe_from(ns: &NetNs, src: SocketAddr, dst: SocketAddr) -> Reply {
    ns.run(move || {
        let s = UdpSocket::bind(src).unwrap_or_else(|e| panic!("bind udp {src}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        // Connected, so that an ICMP port unreachable (a reject) reads as refused; the
        // reply of a DNAT'd request comes from `dst` again (conntrack undoes the NAT).
        if let Err(e) = s.connect(dst).and_then(|_| s.send(b"hello")) {
            return classify(&e);
        }
        let mut buf = [0u8; 256];
        match s.recv(&mut buf) {
            Ok(n) => parse_greeting(&String::from_utf8_lossy(&buf[..n])),
            Err(e) => classify(&e),
        }
    })
}

/// An open TCP connection kept inside a namespace thread, for tests that change endpoints
/// while it is established.
pub struct OpenConn {
    stream: TcpStream,
    pub greeting: Reply,
}

impl OpenConn {
    pub fn open(ns: &NetNs, dst: SocketAddr) -> OpenConn {
        let s = ns.run(move || {
            TcpStream::connect_timeout(&dst, Duration::from_secs(2)).expect("connect")
        });
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        OpenConn {
            stream: s,
            greeting: parse_greeting(line.trim()),
        }
    }
    /// Sends a line and expects it echoed back.
    pub fn echo(&mut self, msg: &str) -> std::io::Result<String> {
        writeln!(self.stream, "{msg}")?;
        let mut buf = [0u8; 256];
        let n = self.stream.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
    }
}

/// How many replies each backend gave (non-answers counted under their debug form).
pub fn tally(replies: &[Reply]) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for r in replies {
        let k = match r {
            Reply::Answered { name, .. } => name.clone(),
            other => format!("{other:?}"),
        };
        *m.entry(k).or_default() += 1;
    }
    m
}

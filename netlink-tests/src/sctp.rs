//! SCTP test backends and clients, the SCTP twins of [`crate::backend`]'s TCP ones: a backend
//! answers each association with `NAME PEER-IP\n` (which endpoint answered, which source
//! address it saw), then echoes messages. One-to-one style sockets (`SOCK_STREAM` +
//! `IPPROTO_SCTP`) through libc, as std has no SCTP; every client call is bounded
//! (non-blocking connect with poll, `SO_RCVTIMEO`/`SO_SNDTIMEO`) so nothing can hang. I/O,
//! except the sockaddr conversions (pure, unit-tested). Needs a kernel with SCTP sockets:
//! the IPVS tests' VM, not the development and CI hosts.
#![allow(unsafe_code)] // socket calls libc has and std has not (SCTP sockets, poll, linger)

use std::io::{Error, ErrorKind, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::backend::{classify, parse_greeting, Reply};
use crate::ns::NetNs;

/// How long a client waits for an association and for the greeting: the INIT is sent once
/// (SCTP's first retransmission comes after 3 s), like the TCP probes' one SYN in 2 s.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a client that expects an answer waits: room for one INIT retransmission (sent
/// 3 s after the first, SCTP's initial RTO) and the greeting. Under CI's load the emulated
/// VM lost one INIT in 8 (an affinity test saw a Timeout among seven answers); waiting for
/// the retransmission costs nothing when the first INIT is answered.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(7);

/// `sa` as the kernel's socket address (sockaddr_in or sockaddr_in6) and its length.
pub fn to_sockaddr(sa: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all zeros is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match sa {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The address in a sockaddr the kernel filled in, if it is IPv4 or IPv6.
pub fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn check(rc: libc::c_int) -> Result<libc::c_int> {
    if rc < 0 {
        Err(Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn timeval(d: Duration) -> libc::timeval {
    libc::timeval {
        tv_sec: d.as_secs() as _,
        tv_usec: d.subsec_micros() as _,
    }
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, val: &T) -> Result<()> {
    // SAFETY: `val` is a live, correctly sized option value for this option.
    check(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            val as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// One end of an SCTP association (one-to-one style socket).
#[derive(Debug)]
pub struct SctpStream {
    fd: OwnedFd,
}

impl SctpStream {
    /// A fresh one-to-one SCTP socket, IPv6 or IPv4.
    fn socket(ipv6: bool) -> Result<OwnedFd> {
        let domain = if ipv6 { libc::AF_INET6 } else { libc::AF_INET };
        // SAFETY: plain socket(2); the fd is owned right away.
        let fd = check(unsafe {
            libc::socket(
                domain,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                libc::IPPROTO_SCTP,
            )
        })?;
        // SAFETY: `fd` is a new descriptor nobody else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Opens an association to `dst` (from `src` when given: an address, a port or both),
    /// within `timeout`; reads and writes then time out after `timeout` too.
    pub fn connect(dst: SocketAddr, src: Option<SocketAddr>, timeout: Duration) -> Result<Self> {
        let fd = Self::socket(dst.is_ipv6())?;
        let raw = fd.as_raw_fd();
        if let Some(src) = src {
            // A test reusing one client port right after an abortive close.
            setsockopt(raw, libc::SOL_SOCKET, libc::SO_REUSEADDR, &1i32)?;
            let (ss, len) = to_sockaddr(src);
            // SAFETY: `ss` holds a valid sockaddr of length `len`.
            check(unsafe { libc::bind(raw, &ss as *const _ as *const libc::sockaddr, len) })?;
        }
        // SAFETY (both): fcntl on our own fd. Non-blocking so that the connect is bounded
        // by poll rather than by SCTP's INIT retransmissions (a minute and more).
        let flags = check(unsafe { libc::fcntl(raw, libc::F_GETFL) })?;
        check(unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
        let (ss, len) = to_sockaddr(dst);
        // SAFETY: `ss` holds a valid sockaddr of length `len`.
        let rc = unsafe { libc::connect(raw, &ss as *const _ as *const libc::sockaddr, len) };
        if rc != 0 {
            let e = Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(e);
            }
            let mut pfd = libc::pollfd {
                fd: raw,
                events: libc::POLLOUT,
                revents: 0,
            };
            let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
            // SAFETY: one valid pollfd.
            if check(unsafe { libc::poll(&mut pfd, 1, ms) })? == 0 {
                return Err(Error::from(ErrorKind::TimedOut));
            }
            let mut err: libc::c_int = 0;
            let mut elen = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: SO_ERROR into a c_int of the size given.
            check(unsafe {
                libc::getsockopt(
                    raw,
                    libc::SOL_SOCKET,
                    libc::SO_ERROR,
                    &mut err as *mut _ as *mut libc::c_void,
                    &mut elen,
                )
            })?;
            if err != 0 {
                return Err(Error::from_raw_os_error(err));
            }
        }
        // SAFETY: fcntl on our own fd.
        check(unsafe { libc::fcntl(raw, libc::F_SETFL, flags) })?;
        let s = SctpStream { fd };
        s.set_timeouts(timeout)?;
        Ok(s)
    }

    /// Bounds every later send and receive.
    pub fn set_timeouts(&self, t: Duration) -> Result<()> {
        let tv = timeval(t);
        setsockopt(
            self.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv,
        )?;
        setsockopt(
            self.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            &tv,
        )
    }

    fn name(&self, peer: bool) -> Result<SocketAddr> {
        // SAFETY: zeroed storage is valid; the kernel fills at most `len` bytes.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let p = &mut ss as *mut _ as *mut libc::sockaddr;
        let fd = self.fd.as_raw_fd();
        // SAFETY: as above.
        check(unsafe {
            if peer {
                libc::getpeername(fd, p, &mut len)
            } else {
                libc::getsockname(fd, p, &mut len)
            }
        })?;
        from_sockaddr(&ss).ok_or_else(|| Error::other("not an IP socket address"))
    }

    /// The peer's primary address.
    pub fn peer_addr(&self) -> Result<SocketAddr> {
        self.name(true)
    }

    /// Our own address (its port is the client port a NAT tuple carries).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.name(false)
    }

    /// Sends one message.
    pub fn send(&self, msg: &[u8]) -> Result<()> {
        // SAFETY: `msg` is valid for its length; MSG_NOSIGNAL: an aborted association is an
        // error, not SIGPIPE.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                msg.as_ptr() as *const libc::c_void,
                msg.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            return Err(Error::last_os_error());
        }
        Ok(())
    }

    /// Receives one message (empty: the peer shut the association down).
    pub fn recv(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 2048];
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
            )
        };
        if n < 0 {
            return Err(Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// Ends the association with an ABORT instead of the SHUTDOWN handshake, so that its
    /// client port is free at once.
    pub fn abort(self) {
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        let _ = setsockopt(self.fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, &l);
    }
}

/// Starts an SCTP backend named `name` on `addr` inside `ns`: each association is greeted
/// with `NAME PEER-IP\n`, then its messages are echoed (runs until the process exits, as
/// [`crate::backend::tcp_backend`]). Bound to `addr` itself, so its INIT ACK offers that one
/// address (an SCTP endpoint bound to the wildcard offers all of its namespace's).
pub fn sctp_backend(ns: &NetNs, name: &str, addr: SocketAddr) {
    let name = name.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    ns.spawn(move || {
        let listen = || -> Result<OwnedFd> {
            let fd = SctpStream::socket(addr.is_ipv6())?;
            setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, &1i32)?;
            let (ss, len) = to_sockaddr(addr);
            // SAFETY: `ss` holds a valid sockaddr of length `len`.
            check(unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    &ss as *const _ as *const libc::sockaddr,
                    len,
                )
            })?;
            // SAFETY: listen(2) on our own socket.
            check(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
            Ok(fd)
        };
        let l = match listen() {
            Ok(l) => {
                tx.send(Ok(())).unwrap();
                l
            }
            Err(e) => {
                tx.send(Err(format!("sctp backend on {addr}: {e}")))
                    .unwrap();
                return;
            }
        };
        loop {
            // SAFETY: accept(2) without an address; the new fd is owned right away.
            let fd = unsafe {
                libc::accept4(
                    l.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                if Error::last_os_error().kind() == ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            // SAFETY: `fd` is the new association's descriptor, owned by nobody else.
            let s = SctpStream {
                fd: unsafe { OwnedFd::from_raw_fd(fd) },
            };
            let name = name.clone();
            std::thread::spawn(move || serve(&s, &name));
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("sctp backend started")
        .unwrap_or_else(|e| panic!("{e}"));
}

fn serve(s: &SctpStream, name: &str) {
    // A client that vanished without an ABORT does not keep this thread forever.
    let _ = s.set_timeouts(Duration::from_secs(120));
    let peer = s
        .peer_addr()
        .map(|p| p.ip().to_string())
        .unwrap_or_default();
    if s.send(format!("{name} {peer}\n").as_bytes()).is_err() {
        return;
    }
    while let Ok(m) = s.recv() {
        if m.is_empty() || s.send(&m).is_err() {
            return;
        }
    }
}

/// Reads the greeting of a new association.
fn greeting(s: &SctpStream) -> Reply {
    match s.recv() {
        Ok(m) if m.is_empty() => Reply::Error("association shut down before the greeting".into()),
        Ok(m) => parse_greeting(String::from_utf8_lossy(&m).trim()),
        Err(e) => classify(&e),
    }
}

/// Opens an association from the calling thread's namespace (from `src` when given) and
/// returns the backend's greeting; the association is then shut down.
pub fn sctp_probe_here(dst: SocketAddr, src: Option<SocketAddr>, timeout: Duration) -> Reply {
    match SctpStream::connect(dst, src, timeout) {
        Ok(s) => greeting(&s),
        Err(e) => classify(&e),
    }
}

/// One association from `ns`.
pub fn sctp_probe(ns: &NetNs, dst: SocketAddr) -> Reply {
    ns.run(move || sctp_probe_here(dst, None, PROBE_TIMEOUT))
}

/// One association from `ns` with source address `src`.
pub fn sctp_probe_from(ns: &NetNs, src: IpAddr, dst: SocketAddr) -> Reply {
    ns.run(move || sctp_probe_here(dst, Some(SocketAddr::new(src, 0)), PROBE_TIMEOUT))
}

/// `n` associations from `ns`, one after the other, each expected to be answered
/// ([`ANSWER_TIMEOUT`]); every greeting.
pub fn sctp_probes(ns: &NetNs, dst: SocketAddr, n: usize) -> Vec<Reply> {
    ns.run(move || {
        (0..n)
            .map(|_| sctp_probe_here(dst, None, ANSWER_TIMEOUT))
            .collect()
    })
}

/// An association kept open across endpoint changes (the SCTP [`crate::backend::OpenConn`]).
pub struct OpenAssoc {
    stream: SctpStream,
    pub greeting: Reply,
}

impl OpenAssoc {
    /// Opens an association from `ns` (from `src` when given), panicking when none comes up.
    pub fn open(ns: &NetNs, src: Option<SocketAddr>, dst: SocketAddr) -> OpenAssoc {
        let stream = ns
            .run(move || SctpStream::connect(dst, src, ANSWER_TIMEOUT))
            .unwrap_or_else(|e| panic!("sctp association to {dst}: {e}"));
        let greeting = greeting(&stream);
        OpenAssoc { stream, greeting }
    }

    /// The client's own address (the source port conntrack keys the association by).
    pub fn local_addr(&self) -> SocketAddr {
        self.stream.local_addr().expect("getsockname")
    }

    /// Sends a message and expects it echoed back (bounded by the socket's timeouts).
    pub fn echo(&self, msg: &str) -> Result<String> {
        self.stream.send(msg.as_bytes())?;
        let m = self.stream.recv()?;
        Ok(String::from_utf8_lossy(&m).into_owned())
    }

    /// Aborts the association (its port is free for the next one at once).
    pub fn abort(self) {
        self.stream.abort()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddrs_round_trip() {
        for a in [
            "10.244.1.2:8080",
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "[fd00:10:244:1::2]:8080",
            "[::]:0",
        ] {
            let sa: SocketAddr = a.parse().unwrap();
            let (ss, len) = to_sockaddr(sa);
            let want = if sa.is_ipv4() {
                std::mem::size_of::<libc::sockaddr_in>()
            } else {
                std::mem::size_of::<libc::sockaddr_in6>()
            };
            assert_eq!(len as usize, want, "{a}");
            assert_eq!(from_sockaddr(&ss), Some(sa), "{a}");
        }
    }

    #[test]
    fn sockaddr_is_in_network_byte_order() {
        let (ss, _) = to_sockaddr("10.244.1.2:8080".parse().unwrap());
        // SAFETY: to_sockaddr wrote a sockaddr_in.
        let sin = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_port.to_ne_bytes(), 8080u16.to_be_bytes());
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 244, 1, 2]);
    }

    #[test]
    fn other_families_are_not_ip_addresses() {
        // SAFETY: zeroed storage is valid.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        ss.ss_family = libc::AF_UNIX as libc::sa_family_t;
        assert_eq!(from_sockaddr(&ss), None);
    }
}

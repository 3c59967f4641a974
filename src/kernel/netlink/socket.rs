//! The one place that opens netlink sockets and performs send/recv syscalls. The protocol
//! modules (`nft::netlink` and `nft::monitor`, `conntrack::ctnetlink`, `ipset::netlink`,
//! `ipvs::netlink` over generic netlink, `rtnl`) build messages purely and hand the bytes to
//! [`NetlinkSocket`].
#![allow(clippy::disallowed_methods)]
#![allow(unsafe_code)] // setsockopt(2) and dup(2) have no safe wrapper in netlink-sys

use std::io;
use std::os::fd::{AsRawFd, FromRawFd};

use netlink_sys::{Socket, SocketAddr};

use super::msg::{self, parse_msgs, RawMsg};
use super::{Error, Result};

pub use netlink_sys::protocols::{NETLINK_GENERIC, NETLINK_NETFILTER, NETLINK_ROUTE};

/// An owned copy of one received message.
#[derive(Debug, Clone)]
pub struct OwnedMsg {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: Vec<u8>,
}

impl OwnedMsg {
    fn from_raw(m: &RawMsg<'_>) -> Self {
        OwnedMsg {
            ty: m.ty,
            flags: m.flags,
            seq: m.seq,
            payload: m.payload.to_vec(),
        }
    }
    pub fn as_raw(&self) -> RawMsg<'_> {
        RawMsg {
            ty: self.ty,
            flags: self.flags,
            seq: self.seq,
            pid: 0,
            payload: &self.payload,
        }
    }
}

/// Joins or leaves one multicast group of a socket (see [`NetlinkSocket::group_switch`]).
#[derive(Debug, Clone)]
pub struct GroupSwitch {
    fd: std::sync::Arc<std::os::fd::OwnedFd>,
    group: u32,
}

impl GroupSwitch {
    /// Joins (`true`) or leaves the group.
    pub fn set(&self, member: bool) -> Result<()> {
        const SOL_NETLINK: i32 = 270;
        let opt = if member {
            libc::NETLINK_ADD_MEMBERSHIP
        } else {
            libc::NETLINK_DROP_MEMBERSHIP
        };
        setsockopt_int(self.fd.as_raw_fd(), SOL_NETLINK, opt, self.group as i32).map_err(|source| {
            Error::Io {
                op: "setsockopt(NETLINK_*_MEMBERSHIP)",
                source,
            }
        })
    }
}

/// Requests per `sendmsg` in [`NetlinkSocket::pipelined`]: 512 IPVS requests are ~60 KiB,
/// their acknowledgements (36 bytes each, 4 KiB more with extended error text) well inside
/// the 8 MiB receive buffer.
pub const PIPELINE_DEPTH: usize = 512;

/// A bound netlink socket with its own sequence counter.
pub struct NetlinkSocket {
    sock: Socket,
    seq: u32,
    sndbuf: usize,
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Io { op, source }
}

fn setsockopt_int(fd: i32, level: i32, opt: i32, val: i32) -> io::Result<()> {
    // SAFETY: passing a pointer to a live c_int and its size, as setsockopt(2) expects.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &val as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl NetlinkSocket {
    /// Opens and binds a socket of the given netlink protocol.
    pub fn open(protocol: isize) -> Result<Self> {
        let mut sock = Socket::new(protocol).map_err(io_err("socket"))?;
        sock.bind_auto().map_err(io_err("bind"))?;
        // Extended acks carry the kernel's reason in text; ignore kernels without them.
        let _ = sock.set_ext_ack(true);
        let _ = sock.set_cap_ack(true);
        let fd = sock.as_raw_fd();
        let tv = libc::timeval {
            tv_sec: 60,
            tv_usec: 0,
        };
        // SAFETY: pointer to a live timeval with its exact size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        let mut s = NetlinkSocket {
            sock,
            seq: 0,
            sndbuf: 0,
        };
        s.ensure_buffers(4 << 20);
        Ok(s)
    }

    /// A handle that joins and leaves `group` on this socket from elsewhere (another thread
    /// may own the socket and sit in `recv`). It holds a duplicate of the descriptor, so the
    /// socket stays open as long as the handle lives.
    pub fn group_switch(&self, group: u32) -> Result<GroupSwitch> {
        // SAFETY: dup(2) of a descriptor we own; the result is owned by the handle.
        let fd = unsafe { libc::dup(self.sock.as_raw_fd()) };
        if fd < 0 {
            return Err(Error::Io {
                op: "dup",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Ok(GroupSwitch {
            fd: std::sync::Arc::new(fd),
            group,
        })
    }

    /// Joins a multicast group (used for change notifications).
    pub fn add_membership(&self, group: u32) -> Result<()> {
        self.sock
            .add_membership(group)
            .map_err(io_err("add_membership"))
    }

    /// Makes sure one `sendmsg` of `bytes` fits. The kernel refuses a netlink message larger
    /// than the socket's send buffer with EMSGSIZE, and a 10k-service batch is tens of MiB.
    /// `SO_SNDBUFFORCE` ignores `wmem_max` but needs CAP_NET_ADMIN, which we hold anyway.
    pub fn ensure_buffers(&mut self, bytes: usize) {
        let want = bytes.saturating_add(64 << 10).min(i32::MAX as usize / 2);
        if want <= self.sndbuf {
            return;
        }
        let fd = self.sock.as_raw_fd();
        let v = want as i32;
        if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, v).is_err() {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v);
        }
        let r = (want as i32).max(8 << 20);
        if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, r).is_err() {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, r);
        }
        self.sndbuf = want;
    }

    /// Allocates the next sequence number.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Reserves `n` consecutive sequence numbers and returns the first.
    pub fn reserve_seqs(&mut self, n: u32) -> u32 {
        let first = self.seq.wrapping_add(1);
        self.seq = self.seq.wrapping_add(n);
        first
    }

    /// Sends one buffer (one or more messages) in a single syscall.
    pub fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.ensure_buffers(bytes.len());
        let kernel = SocketAddr::new(0, 0);
        let n = self
            .sock
            .send_to(bytes, &kernel, 0)
            .map_err(io_err("send"))?;
        if n != bytes.len() {
            return Err(Error::Malformed(format!(
                "short send: {n} of {} bytes",
                bytes.len()
            )));
        }
        Ok(())
    }

    /// This socket's netlink port id (the kernel stamps it on notifications we cause).
    pub fn port_id(&self) -> u32 {
        let mut addr = SocketAddr::new(0, 0);
        match self.sock.get_address(&mut addr) {
            Ok(()) => addr.port_number(),
            Err(_) => 0,
        }
    }

    /// Receives one datagram as bytes.
    pub fn recv_raw(&mut self) -> Result<Vec<u8>> {
        let (buf, _) = self.sock.recv_from_full().map_err(io_err("recv"))?;
        Ok(buf)
    }

    /// Receives notifications (a socket subscribed to multicast groups) until a receive
    /// fails: the messages of each datagram go to `is_foreign`, and `on_foreign` runs when
    /// it says one is someone else's change, or when the kernel dropped notifications
    /// (`ENOBUFS`: assume the worst). A datagram that does not parse is skipped. Meant for a
    /// thread of its own; the nftables table monitor and the rtnetlink link watch both run it.
    pub fn watch_notifications(
        &mut self,
        mut is_foreign: impl FnMut(&[RawMsg<'_>]) -> bool,
        mut on_foreign: impl FnMut(),
    ) -> Result<()> {
        loop {
            let buf = match self.recv_raw() {
                Ok(b) => b,
                Err(e) if e.errno() == Some(libc::ENOBUFS) => {
                    on_foreign();
                    continue;
                }
                Err(e) if e.errno() == Some(libc::EAGAIN) => continue,
                Err(e) => return Err(e),
            };
            let Ok(msgs) = parse_msgs(&buf) else { continue };
            if is_foreign(&msgs) {
                on_foreign();
            }
        }
    }

    /// Receives one datagram and splits it into messages.
    pub fn recv(&mut self) -> Result<Vec<OwnedMsg>> {
        let (buf, _) = self.sock.recv_from_full().map_err(io_err("recv"))?;
        let msgs = parse_msgs(&buf)?;
        Ok(msgs.iter().map(OwnedMsg::from_raw).collect())
    }

    /// Sends `n` acknowledged requests pipelined: up to [`PIPELINE_DEPTH`] of them per
    /// `sendmsg`, then reads their acknowledgements. `encode(i, seq)` encodes request `i`
    /// with sequence number `seq` (and `NLM_F_ACK`); `what(i)` names it in its error. The
    /// kernel handles the messages of one datagram in order and acknowledges each, a
    /// failed one included, so one result per request comes back, in order. For protocols
    /// without batches (IPVS, addresses), where one round trip per request was the cost:
    /// about 120k of them for an IPVS-mode full sync of 10k Services × 10 endpoints.
    pub fn pipelined(
        &mut self,
        n: usize,
        mut encode: impl FnMut(usize, u32) -> Vec<u8>,
        what: impl Fn(usize) -> String,
    ) -> Vec<Result<()>> {
        let mut out: Vec<Result<()>> = Vec::with_capacity(n);
        let mut start = 0;
        while start < n {
            let len = (n - start).min(PIPELINE_DEPTH);
            let first = self.reserve_seqs(len as u32);
            let mut buf = Vec::new();
            for j in 0..len {
                buf.extend_from_slice(&encode(start + j, first.wrapping_add(j as u32)));
            }
            let mut got: Vec<Option<Result<()>>> = (0..len).map(|_| None).collect();
            let sent = self.send(&buf);
            let mut pending = if sent.is_ok() { len } else { 0 };
            let mut failure = sent.err();
            while pending > 0 {
                let msgs = match self.recv() {
                    Ok(m) => m,
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                };
                for m in msgs {
                    let j = m.seq.wrapping_sub(first) as usize;
                    if j >= len || m.ty != msg::NLMSG_ERROR || got[j].is_some() {
                        continue;
                    }
                    got[j] = Some(match msg::parse_error(&m.as_raw()) {
                        Ok(e) if e.errno == 0 => Ok(()),
                        Ok(e) => Err(Error::Kernel {
                            errno: e.errno,
                            what: what(start + j),
                            ext_msg: e.ext_msg,
                        }),
                        Err(e) => Err(Error::Decode(e)),
                    });
                    pending -= 1;
                }
            }
            for g in got {
                out.push(g.unwrap_or_else(|| {
                    // Not sent, or no answer read: the socket's own error, per request.
                    Err(match &failure {
                        Some(Error::Io { op, source }) => Error::Io {
                            op,
                            source: source.raw_os_error().map_or_else(
                                || io::Error::from(source.kind()),
                                io::Error::from_raw_os_error,
                            ),
                        },
                        Some(e) => Error::Malformed(e.to_string()),
                        None => Error::Malformed("no acknowledgement".into()),
                    })
                }));
            }
            start += len;
        }
        out
    }

    /// Sends a dump request and collects every reply message until `NLMSG_DONE`.
    /// An `NLMSG_ERROR` for the request becomes [`Error::Kernel`].
    pub fn dump(&mut self, request: &[u8], seq: u32, what: &str) -> Result<Vec<OwnedMsg>> {
        self.send(request)?;
        let mut out = Vec::new();
        loop {
            for m in self.recv()? {
                if m.seq != seq {
                    continue;
                }
                match m.ty {
                    msg::NLMSG_DONE => return Ok(out),
                    msg::NLMSG_ERROR => {
                        let e = msg::parse_error(&m.as_raw())?;
                        if e.errno == 0 {
                            return Ok(out);
                        }
                        return Err(Error::Kernel {
                            errno: e.errno,
                            what: what.to_string(),
                            ext_msg: e.ext_msg,
                        });
                    }
                    _ => {
                        let multi = m.flags & msg::NLM_F_MULTI != 0;
                        out.push(m);
                        if !multi {
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }
}

//! [`Ipvs`] over a generic netlink socket: resolves the `IPVS` family once, then sends one
//! acknowledged request per change (IPVS has no batches; each change is atomic on its own),
//! pipelined when many are applied at once ([`Ipvs::apply`]).

use super::codec::{self, *};
use super::{Error, Ipvs, IpvsOp, RealServer, Timeouts, VirtualServer};
use crate::kernel::netlink::socket::{NetlinkSocket, NETLINK_GENERIC};
use crate::kernel::netlink::DecodeError;

pub struct NetlinkIpvs {
    sock: NetlinkSocket,
    family: u16,
}

fn af_of(vs: &VirtualServer) -> u16 {
    if vs.addr.is_ipv4() {
        libc::AF_INET as u16
    } else {
        libc::AF_INET6 as u16
    }
}

impl NetlinkIpvs {
    /// Opens a socket and resolves the family; [`Error::Unavailable`] when the kernel has no
    /// IPVS (the request for the family also makes the kernel try to load `ip_vs`).
    pub fn open() -> Result<Self, Error> {
        let op = |s: &str| s.to_string();
        let mut sock = NetlinkSocket::open(NETLINK_GENERIC).map_err(|source| Error::Netlink {
            op: op("open generic netlink socket"),
            source,
        })?;
        let seq = sock.next_seq();
        let msgs = match sock.dump(
            &encode_get_family(IPVS_GENL_NAME, seq),
            seq,
            "resolve family IPVS",
        ) {
            Ok(m) => m,
            Err(e) if e.is_not_found() => return Err(Error::Unavailable),
            Err(source) => {
                return Err(Error::Netlink {
                    op: op("resolve generic netlink family IPVS"),
                    source,
                })
            }
        };
        let family = msgs
            .iter()
            .find_map(|m| decode_family_id(&m.as_raw()))
            .ok_or_else(|| Error::Decode {
                op: op("resolve family IPVS"),
                reason: DecodeError::missing("CTRL_CMD_NEWFAMILY reply", "family id"),
            })?;
        Ok(NetlinkIpvs { sock, family })
    }

    fn request(&mut self, bytes: Vec<u8>, seq: u32, op: String) -> Result<(), Error> {
        self.sock
            .dump(&bytes, seq, &op)
            .map(|_| ())
            .map_err(|source| Error::Netlink { op, source })
    }

    fn service_cmd(&mut self, cmd: u8, vs: &VirtualServer, what: &str) -> Result<(), Error> {
        let seq = self.sock.next_seq();
        let b = encode_service(self.family, cmd, vs, seq);
        self.request(b, seq, format!("{what} virtual server {}", vs.key()))
    }

    fn dest_cmd(
        &mut self,
        cmd: u8,
        vs: &VirtualServer,
        rs: &RealServer,
        what: &str,
    ) -> Result<(), Error> {
        let seq = self.sock.next_seq();
        let b = encode_dest(self.family, cmd, vs, rs, seq);
        let rs_s = std::net::SocketAddr::new(rs.addr, rs.port);
        self.request(b, seq, format!("{what} real server {rs_s} of {}", vs.key()))
    }
}

/// The request for one op.
fn encode_op(family: u16, op: &IpvsOp, seq: u32) -> Vec<u8> {
    match op {
        IpvsOp::AddService(vs) => encode_service(family, CMD_NEW_SERVICE, vs, seq),
        IpvsOp::UpdateService(vs) => encode_service(family, CMD_SET_SERVICE, vs, seq),
        IpvsOp::DeleteService(vs) => encode_service(family, CMD_DEL_SERVICE, vs, seq),
        IpvsOp::AddDest(vs, rs) => encode_dest(family, CMD_NEW_DEST, vs, rs, seq),
        IpvsOp::UpdateDest(vs, rs) => encode_dest(family, CMD_SET_DEST, vs, rs, seq),
        IpvsOp::DeleteDest(vs, rs) => encode_dest(family, CMD_DEL_DEST, vs, rs, seq),
    }
}

/// What an op did, in the words of its error: `add virtual server TCP 10.96.0.1:80`.
pub fn describe(op: &IpvsOp) -> String {
    let rs_of = |rs: &RealServer| std::net::SocketAddr::new(rs.addr, rs.port);
    match op {
        IpvsOp::AddService(vs) => format!("add virtual server {}", vs.key()),
        IpvsOp::UpdateService(vs) => format!("update virtual server {}", vs.key()),
        IpvsOp::DeleteService(vs) => format!("delete virtual server {}", vs.key()),
        IpvsOp::AddDest(vs, rs) => format!("add real server {} of {}", rs_of(rs), vs.key()),
        IpvsOp::UpdateDest(vs, rs) => format!("update real server {} of {}", rs_of(rs), vs.key()),
        IpvsOp::DeleteDest(vs, rs) => format!("delete real server {} of {}", rs_of(rs), vs.key()),
    }
}

impl Ipvs for NetlinkIpvs {
    fn apply(&mut self, ops: &[IpvsOp]) -> Vec<Result<(), Error>> {
        let family = self.family;
        self.sock
            .pipelined(
                ops.len(),
                |i, seq| encode_op(family, &ops[i], seq),
                |i| describe(&ops[i]),
            )
            .into_iter()
            .zip(ops)
            .map(|(r, op)| {
                r.map_err(|source| Error::Netlink {
                    op: describe(op),
                    source,
                })
            })
            .collect()
    }

    fn services(&mut self) -> Result<Vec<VirtualServer>, Error> {
        let seq = self.sock.next_seq();
        let op = "list virtual servers".to_string();
        let msgs = self
            .sock
            .dump(&encode_get_services(self.family, seq), seq, &op)
            .map_err(|source| Error::Netlink {
                op: op.clone(),
                source,
            })?;
        // Firewall-mark services have no address: not ours, skipped.
        Ok(msgs
            .iter()
            .filter_map(|m| codec::decode_service(&m.as_raw()).ok())
            .collect())
    }

    fn dests(&mut self, vs: &VirtualServer) -> Result<Vec<RealServer>, Error> {
        let seq = self.sock.next_seq();
        let op = format!("list real servers of {}", vs.key());
        let msgs = self
            .sock
            .dump(&encode_get_dests(self.family, vs, seq), seq, &op)
            .map_err(|source| Error::Netlink {
                op: op.clone(),
                source,
            })?;
        msgs.iter()
            .map(|m| {
                codec::decode_dest(&m.as_raw(), af_of(vs)).map_err(|reason| Error::Decode {
                    op: op.clone(),
                    reason,
                })
            })
            .collect()
    }

    fn add_service(&mut self, vs: &VirtualServer) -> Result<(), Error> {
        self.service_cmd(CMD_NEW_SERVICE, vs, "add")
    }
    fn update_service(&mut self, vs: &VirtualServer) -> Result<(), Error> {
        self.service_cmd(CMD_SET_SERVICE, vs, "update")
    }
    fn delete_service(&mut self, vs: &VirtualServer) -> Result<(), Error> {
        self.service_cmd(CMD_DEL_SERVICE, vs, "delete")
    }
    fn add_dest(&mut self, vs: &VirtualServer, rs: &RealServer) -> Result<(), Error> {
        self.dest_cmd(CMD_NEW_DEST, vs, rs, "add")
    }
    fn update_dest(&mut self, vs: &VirtualServer, rs: &RealServer) -> Result<(), Error> {
        self.dest_cmd(CMD_SET_DEST, vs, rs, "update")
    }
    fn delete_dest(&mut self, vs: &VirtualServer, rs: &RealServer) -> Result<(), Error> {
        self.dest_cmd(CMD_DEL_DEST, vs, rs, "delete")
    }
    fn set_timeouts(&mut self, t: Timeouts) -> Result<(), Error> {
        let seq = self.sock.next_seq();
        let b = encode_config(self.family, Some(t), seq);
        self.request(b, seq, "set IPVS timeouts".into())
    }
}

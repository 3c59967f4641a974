//! [`NetlinkConntrack`]: conntrack over a `NETLINK_NETFILTER` socket. The only I/O of the
//! conntrack module.

use crate::kernel::netlink::msg::{parse_error, MsgWriter, NLMSG_ERROR};
use crate::kernel::netlink::socket::{NetlinkSocket, NETLINK_NETFILTER};
use crate::model::net::Family;

use super::codec::{decode_flow, encode_delete, encode_dump};
use super::{Conntrack, Error, Flow};

/// Deletes per sendmsg: bounded so the ACKs fit the receive buffer.
const DELETE_CHUNK: usize = 512;

pub struct NetlinkConntrack {
    sock: NetlinkSocket,
}

impl NetlinkConntrack {
    pub fn open() -> Result<Self, Error> {
        Ok(NetlinkConntrack {
            sock: NetlinkSocket::open(NETLINK_NETFILTER)?,
        })
    }

    /// Creates entries (tests seed the table with these, as `conntrack -I` would).
    pub fn create(&mut self, flows: &[(Flow, u32)]) -> Result<(), Error> {
        for (f, timeout) in flows {
            let seq = self.sock.next_seq();
            let mut w = MsgWriter::new();
            super::codec::encode_new(&mut w, f, *timeout, seq);
            self.sock.dump(w.as_bytes(), seq, "conntrack create")?;
        }
        Ok(())
    }
}

impl Conntrack for NetlinkConntrack {
    fn list(&mut self, family: Family, proto: u8) -> Result<Vec<Flow>, Error> {
        let seq = self.sock.next_seq();
        let msgs = self
            .sock
            .dump(&encode_dump(family, seq), seq, "conntrack dump")?;
        let mut out = Vec::new();
        for m in &msgs {
            let f = decode_flow(&m.as_raw())?;
            if f.proto == proto && f.family() == family {
                out.push(f);
            }
        }
        Ok(out)
    }

    fn delete(&mut self, flows: &[Flow]) -> Result<usize, Error> {
        let mut deleted = 0;
        for chunk in flows.chunks(DELETE_CHUNK) {
            let first = self.sock.reserve_seqs(chunk.len() as u32);
            let mut w = MsgWriter::new();
            for (i, f) in chunk.iter().enumerate() {
                encode_delete(&mut w, f, first.wrapping_add(i as u32));
            }
            self.sock.send(w.as_bytes())?;
            let mut pending = chunk.len();
            while pending > 0 {
                for m in self.sock.recv()? {
                    if m.ty != NLMSG_ERROR {
                        continue;
                    }
                    let e =
                        parse_error(&m.as_raw()).map_err(crate::kernel::netlink::Error::from)?;
                    if e.seq.wrapping_sub(first) as usize >= chunk.len() {
                        continue;
                    }
                    pending -= 1;
                    match e.errno {
                        0 => deleted += 1,
                        // Expired or already deleted meanwhile: nothing to do.
                        libc::ENOENT => {}
                        errno => {
                            return Err(Error::Netlink(crate::kernel::netlink::Error::Kernel {
                                errno,
                                what: "conntrack delete".into(),
                                ext_msg: e.ext_msg,
                            }))
                        }
                    }
                }
            }
        }
        Ok(deleted)
    }
}

//! [`NetlinkIpsets`]: ipset over a `NETLINK_NETFILTER` socket. The only I/O of the ipset
//! module.

use crate::kernel::netlink::socket::{NetlinkSocket, NETLINK_NETFILTER};

use super::codec::{decode_set_name, encode_destroy, encode_list_names};
use super::uapi::IPSET_ERR_BUSY;
use super::{Error, Ipsets};

pub struct NetlinkIpsets {
    sock: NetlinkSocket,
}

impl NetlinkIpsets {
    pub fn open() -> Result<Self, Error> {
        Ok(NetlinkIpsets {
            sock: NetlinkSocket::open(NETLINK_NETFILTER)?,
        })
    }
}

impl Ipsets for NetlinkIpsets {
    fn list_names(&mut self) -> Result<Vec<String>, Error> {
        let seq = self.sock.next_seq();
        let msgs = match self.sock.dump(&encode_list_names(seq), seq, "ipset list") {
            Ok(m) => m,
            // No ipset in this kernel (module absent): nothing to list.
            Err(e) if e.is_not_supported() || e.is_not_found() => return Ok(vec![]),
            Err(e) => return Err(e.into()),
        };
        let mut names: Vec<String> = msgs
            .iter()
            .filter_map(|m| decode_set_name(&m.as_raw()))
            .collect();
        names.dedup();
        Ok(names)
    }

    fn destroy(&mut self, name: &str) -> Result<(), Error> {
        let seq = self.sock.next_seq();
        match self.sock.dump(
            &encode_destroy(name, seq),
            seq,
            &format!("ipset destroy {name}"),
        ) {
            Ok(_) => Ok(()),
            Err(e) if e.errno() == Some(IPSET_ERR_BUSY) => Err(Error::Busy(name.into())),
            Err(e) => Err(e.into()),
        }
    }
}

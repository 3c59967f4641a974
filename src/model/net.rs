//! Network types every layer shares: the address [`Family`] of a table and an address prefix
//! ([`Cidr`]: `10.0.0.0/8`, `fd00::/64`, or a single address), parsed and matched without
//! extra crates. Pure; a leaf (imports nothing of the crate).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// Address family of a table. We use one table per family (`ip`, `ip6`), like upstream,
/// so that a rule's address fields have one fixed width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    Ip,
    Ip6,
}

impl Family {
    /// The `NFPROTO_*` value.
    pub fn nfproto(self) -> u8 {
        match self {
            Family::Ip => libc::NFPROTO_IPV4 as u8,
            Family::Ip6 => libc::NFPROTO_IPV6 as u8,
        }
    }
    pub fn from_nfproto(v: u8) -> Option<Family> {
        match v as i32 {
            libc::NFPROTO_IPV4 => Some(Family::Ip),
            libc::NFPROTO_IPV6 => Some(Family::Ip6),
            _ => None,
        }
    }
    /// The keyword used by `nft` and in rule syntax (`ip saddr`, `ip6 saddr`).
    pub fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }
    pub fn addr_len(self) -> usize {
        match self {
            Family::Ip => 4,
            Family::Ip6 => 16,
        }
    }
    pub fn of(addr: &IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::Ip,
            IpAddr::V6(_) => Family::Ip6,
        }
    }
    pub fn all() -> [Family; 2] {
        [Family::Ip, Family::Ip6]
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Protocol numbers we handle.
pub mod proto {
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const SCTP: u8 = 132;
    pub fn name(p: u8) -> String {
        match p {
            TCP => "tcp".into(),
            UDP => "udp".into(),
            SCTP => "sctp".into(),
            n => n.to_string(),
        }
    }
}

/// An IP prefix. The address is stored with host bits cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

fn max_prefix(a: &IpAddr) -> u8 {
    if a.is_ipv4() {
        32
    } else {
        128
    }
}

fn mask_bytes(len: usize, prefix: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let bits = (prefix as i32 - (i as i32) * 8).clamp(0, 8);
            if bits == 0 {
                0
            } else {
                0xffu8 << (8 - bits)
            }
        })
        .collect()
}

/// An address's bytes in network order (4 or 16).
pub fn ip_bytes(a: &IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}
use ip_bytes as addr_bytes;

fn from_bytes(v4: bool, b: &[u8]) -> IpAddr {
    if v4 {
        IpAddr::from(<[u8; 4]>::try_from(b).expect("4 bytes"))
    } else {
        IpAddr::from(<[u8; 16]>::try_from(b).expect("16 bytes"))
    }
}

impl Cidr {
    /// A prefix; host bits are cleared. Fails when the prefix is longer than the address.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Cidr, String> {
        if prefix > max_prefix(&addr) {
            return Err(format!("prefix length {prefix} is too long for {addr}"));
        }
        let m = mask_bytes(addr_bytes(&addr).len(), prefix);
        let b: Vec<u8> = addr_bytes(&addr)
            .iter()
            .zip(&m)
            .map(|(a, m)| a & m)
            .collect();
        Ok(Cidr {
            addr: from_bytes(addr.is_ipv4(), &b),
            prefix,
        })
    }
    /// A single address (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> Cidr {
        Cidr {
            prefix: max_prefix(&addr),
            addr,
        }
    }
    pub fn addr(&self) -> IpAddr {
        self.addr
    }
    pub fn prefix(&self) -> u8 {
        self.prefix
    }
    pub fn is_host(&self) -> bool {
        self.prefix == max_prefix(&self.addr)
    }
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }
    /// The network mask as bytes (network order).
    pub fn mask(&self) -> Vec<u8> {
        mask_bytes(addr_bytes(&self.addr).len(), self.prefix)
    }
    /// The network address as bytes.
    pub fn bytes(&self) -> Vec<u8> {
        addr_bytes(&self.addr)
    }
    pub fn contains(&self, a: &IpAddr) -> bool {
        if a.is_ipv4() != self.addr.is_ipv4() {
            return false;
        }
        let m = self.mask();
        addr_bytes(a)
            .iter()
            .zip(&m)
            .zip(addr_bytes(&self.addr))
            .all(|((x, m), n)| x & m == n)
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Cidr, String> {
        let s = s.trim();
        match s.split_once('/') {
            Some((a, p)) => {
                let addr: IpAddr = a.parse().map_err(|_| format!("invalid address in {s:?}"))?;
                let prefix: u8 = p
                    .parse()
                    .map_err(|_| format!("invalid prefix length in {s:?}"))?;
                Cidr::new(addr, prefix)
            }
            None => s
                .parse()
                .map(Cidr::host)
                .map_err(|_| format!("invalid address or CIDR {s:?}")),
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_host() {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_normalizes() {
        let c: Cidr = "10.1.2.3/8".parse().unwrap();
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert!(c.contains(&"10.200.0.1".parse().unwrap()));
        assert!(!c.contains(&"11.0.0.1".parse().unwrap()));
        assert!(!c.contains(&"::1".parse().unwrap()));
        let h: Cidr = "fd00::1".parse().unwrap();
        assert!(h.is_host());
        assert_eq!(h.to_string(), "fd00::1");
        let p: Cidr = "fd00:1::/33".parse().unwrap();
        assert_eq!(p.mask()[..5], [0xff, 0xff, 0xff, 0xff, 0x80]);
    }

    #[test]
    fn rejects_bad_input() {
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("10.0.0/8".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
    }
}

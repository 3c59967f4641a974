//! ipset over nfnetlink, as far as cleanup needs it: list set names, destroy a set. Used to
//! remove upstream kube-proxy's IPVS-mode sets without the `ipset` binary. The codec is
//! pure; `netlink` is the only I/O.

pub mod codec;
pub mod netlink;
pub(crate) mod uapi;

/// An ipset failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Netlink(#[from] crate::kernel::netlink::Error),
    #[error("ipset {0} is still referenced by a rule")]
    Busy(String),
}

/// What cleanup needs from ipset.
pub trait Ipsets {
    /// Names of every set in this network namespace; none when the kernel has no ipset.
    fn list_names(&mut self) -> Result<Vec<String>, Error>;
    /// Destroys one set (it must be unreferenced).
    fn destroy(&mut self, name: &str) -> Result<(), Error>;
}

//! kube-nlproxy: a Kubernetes service proxy that programs the kernel only through netlink.
#![deny(clippy::disallowed_methods)]

pub mod netlink;
pub mod nft;

//! kube-nlproxy: a Kubernetes service proxy that programs the kernel only through netlink.
#![deny(clippy::disallowed_methods)]

pub mod admin;
pub mod app;
pub mod config;
pub mod conntrack;
pub mod fxhash;
pub mod health;
pub mod healthcheck;
pub mod ipvs;
pub mod localhost;
pub mod metrics;
pub mod model;
pub mod netlink;
pub mod nft;
pub mod proxier;
pub mod rtnl;
pub mod source;
pub mod sync;
pub mod userspace;

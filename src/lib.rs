//! kube-nlproxy: a Kubernetes service proxy that programs the kernel only through netlink.
//!
//! Layers, each importing only those below it (checked by `tests/layers.rs`):
//! `app` (wiring) → `serve`, `source`, `config` → `modes` (nftables, ipvs, userspace) →
//! `proxy` (what every mode shares) → `kernel` (netlink clients) → `model` (pure data).
#![deny(clippy::disallowed_methods)]

pub mod app;
pub mod config;
pub mod kernel;
pub mod model;
pub mod modes;
pub mod proxy;
pub mod serve;
pub mod source;
pub mod tools;

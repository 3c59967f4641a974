//! kube-nlproxy: a Kubernetes service proxy that programs the kernel only through netlink.
//!
//! Layers, each importing only those below it (checked by `tests/layers.rs`, whose
//! `layer` table this follows): `app` (wiring) → `serve` (health, metrics, `/configz`) and
//! `tools` (status, diff, explain, services) → `config` → `modes` (nftables, ipvs,
//! userspace) and `source` (the API server, manifests) → `proxy` (what every mode shares)
//! → `kernel` (netlink clients) → `model` (pure data). Within a layer only the kernel
//! clients (one socket layer) and the layers from `serve` up import each other.
#![deny(clippy::disallowed_methods)]

pub mod allocator;
pub mod app;
pub mod config;
#[cfg(any(test, feature = "testing"))]
pub mod fuzz;
pub mod kernel;
pub mod model;
pub mod modes;
pub mod proxy;
pub mod serve;
pub mod source;
pub mod tools;

//! Netlink plumbing shared by every protocol we speak: a pure message writer and reader
//! (`msg`), and the one socket type that performs syscalls (`socket`).

pub mod error;
pub mod msg;
pub mod socket;
pub(crate) mod uapi;

pub use error::{Error, Result};

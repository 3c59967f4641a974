//! Netlink plumbing shared by every protocol we speak: a pure message writer and reader
//! (`msg`), the decode error every codec returns (`decode`), and the one socket type that
//! performs syscalls (`socket`).

pub mod decode;
pub mod error;
pub mod msg;
pub mod socket;
pub(crate) mod uapi;

pub use decode::{AttrName, DecodeError};
pub use error::{Error, Result};

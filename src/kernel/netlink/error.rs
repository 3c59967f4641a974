//! Errors of the netlink transport, classified by errno rather than by message text.

use std::io;

/// An error raised while talking netlink.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket syscall failed.
    #[error("netlink socket: {op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// The kernel answered a request with a negative errno.
    #[error("kernel rejected {what}: {}{}", io::Error::from_raw_os_error(*errno), ext_msg.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Kernel {
        errno: i32,
        what: String,
        ext_msg: Option<String>,
    },
    /// The kernel's reply could not be parsed.
    #[error("malformed netlink reply: {0}")]
    Malformed(String),
    /// A reply's bytes could not be decoded (the message layer's or a protocol's codec).
    #[error("malformed netlink reply: {0}")]
    Decode(#[from] super::DecodeError),
}

impl Error {
    /// The kernel's errno, when the kernel rejected a request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Kernel { errno, .. } => Some(*errno),
            Error::Io { source, .. } => source.raw_os_error(),
            Error::Malformed(_) | Error::Decode(_) => None,
        }
    }
    /// The object (or family) does not exist.
    pub fn is_not_found(&self) -> bool {
        self.errno() == Some(libc::ENOENT)
    }
    /// The object exists already.
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }
    /// The kernel lacks a feature (module missing or operation unsupported).
    pub fn is_not_supported(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::EOPNOTSUPP) | Some(libc::EAFNOSUPPORT) | Some(libc::EPROTONOSUPPORT)
        )
    }
    /// The caller lacks a capability.
    pub fn is_permission(&self) -> bool {
        matches!(self.errno(), Some(libc::EPERM) | Some(libc::EACCES))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

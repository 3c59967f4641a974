//! The one decode error of every netlink codec (the message layer, nf_tables, ctnetlink,
//! IPVS): kernel replies are input, and a reply we cannot read says which message and which
//! attribute, never a free-form string. With it, the two reads every decoder repeats: the
//! attributes after a message's family header, and a required attribute. Pure.

use std::fmt;

use super::msg::{Attr, Attrs, RawMsg};

/// The attribute a [`DecodeError`] is about: by name where the decoder knows one, else by
/// its number (`attribute 3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrName {
    Named(&'static str),
    Numbered(u16),
}

impl From<&'static str> for AttrName {
    fn from(name: &'static str) -> Self {
        AttrName::Named(name)
    }
}

impl From<u16> for AttrName {
    fn from(ty: u16) -> Self {
        AttrName::Numbered(ty)
    }
}

impl fmt::Display for AttrName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrName::Named(name) => f.write_str(name),
            AttrName::Numbered(ty) => write!(f, "attribute {ty}"),
        }
    }
}

/// A kernel reply that could not be decoded. `msg` names the kind of message (or nested part
/// of one: `verdict`, `expression`) being decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A message's length field disagrees with the buffer: past its end, or shorter than the
    /// message header itself.
    #[error("cannot decode {msg}: bad message length {len} at offset {offset}")]
    BadLength {
        msg: &'static str,
        len: usize,
        offset: usize,
    },
    /// The payload ends before the fixed header every message of its kind starts with.
    #[error("cannot decode {msg}: message shorter than {header}")]
    Truncated {
        msg: &'static str,
        header: &'static str,
    },
    /// A required attribute is absent.
    #[error("cannot decode {msg}: no {attr}")]
    Missing { msg: &'static str, attr: AttrName },
    /// A required attribute is present but its bytes do not hold a value of its type (too
    /// short, an address of the wrong size, a string that is not UTF-8).
    #[error("cannot decode {msg}: bad {attr} ({len} bytes)")]
    Invalid {
        msg: &'static str,
        attr: AttrName,
        len: usize,
    },
    /// A required attribute holds a value we do not know (a verdict code, an expression, a
    /// hook, a family).
    #[error("cannot decode {msg}: unsupported {attr} {value}")]
    Unsupported {
        msg: &'static str,
        attr: AttrName,
        value: String,
    },
}

impl DecodeError {
    /// [`DecodeError::Missing`].
    pub fn missing(msg: &'static str, attr: impl Into<AttrName>) -> Self {
        DecodeError::Missing {
            msg,
            attr: attr.into(),
        }
    }

    /// [`DecodeError::Unsupported`].
    pub fn unsupported(
        msg: &'static str,
        attr: impl Into<AttrName>,
        value: impl fmt::Display,
    ) -> Self {
        DecodeError::Unsupported {
            msg,
            attr: attr.into(),
            value: value.to_string(),
        }
    }
}

/// The attributes of `m` after its fixed family header of `header_len` bytes (`nfgenmsg`,
/// `genlmsghdr`: 4), or [`DecodeError::Truncated`].
pub fn attrs_after_header<'a>(
    m: &RawMsg<'a>,
    header: &'static str,
    header_len: usize,
    msg: &'static str,
) -> Result<Attrs<'a>, DecodeError> {
    m.payload
        .get(header_len..)
        .map(Attrs::new)
        .ok_or(DecodeError::Truncated { msg, header })
}

impl<'a> Attrs<'a> {
    /// The first attribute of type `ty`, or [`DecodeError::Missing`] naming it.
    pub fn require(
        &self,
        ty: u16,
        msg: &'static str,
        attr: impl Into<AttrName>,
    ) -> Result<Attr<'a>, DecodeError> {
        self.get(ty).ok_or_else(|| DecodeError::missing(msg, attr))
    }

    /// The first attribute of type `ty` read by `read` ([`Attr::be16`], [`Attr::str`], ...):
    /// [`DecodeError::Missing`] when absent, [`DecodeError::Invalid`] when `read` refuses
    /// its bytes.
    pub fn read<T>(
        &self,
        ty: u16,
        msg: &'static str,
        attr: impl Into<AttrName>,
        read: impl FnOnce(&Attr<'a>) -> Option<T>,
    ) -> Result<T, DecodeError> {
        let attr = attr.into();
        let a = self.require(ty, msg, attr)?;
        read(&a).ok_or(DecodeError::Invalid {
            msg,
            attr,
            len: a.data.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::msg::{parse_msgs, MsgWriter};

    fn message(attrs: impl FnOnce(&mut MsgWriter)) -> Vec<u8> {
        let mut w = MsgWriter::new();
        w.begin_msg(1, 0, 1);
        w.put_raw(&[2, 0, 0, 0]);
        attrs(&mut w);
        w.end_msg();
        w.into_bytes()
    }

    #[test]
    fn a_required_attribute_is_missing_or_invalid_by_name() {
        let b = message(|w| w.attr(2, &[1]));
        let m = parse_msgs(&b).unwrap()[0];
        let a = attrs_after_header(&m, "nfgenmsg", 4, "test entry").unwrap();
        assert_eq!(
            a.read(1, "test entry", "port", Attr::be16),
            Err(DecodeError::missing("test entry", "port"))
        );
        let e = a.read(2, "test entry", "port", Attr::be16).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot decode test entry: bad port (1 bytes)"
        );
        assert_eq!(a.read(2, "test entry", "flag", Attr::u8), Ok(1));
    }

    #[test]
    fn unnamed_attributes_read_by_number() {
        assert_eq!(
            DecodeError::missing("chain", 3u16).to_string(),
            "cannot decode chain: no attribute 3"
        );
    }

    #[test]
    fn a_payload_shorter_than_its_header_is_truncated() {
        let m = RawMsg {
            ty: 1,
            flags: 0,
            seq: 0,
            pid: 0,
            payload: &[2, 0],
        };
        let e = attrs_after_header(&m, "nfgenmsg", 4, "table").unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot decode table: message shorter than nfgenmsg"
        );
    }
}

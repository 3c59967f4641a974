//! Pure netlink message writing and reading: headers, attributes (TLVs), nesting.
//! No I/O here; everything works on byte buffers so it can be tested without root.

pub use super::uapi::*;

use super::decode::DecodeError;

/// Size of `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;

/// An address as netlink carries it: 4 or 16 bytes, network order.
pub use crate::model::net::ip_bytes;

/// `struct nfgenmsg` (every nfnetlink subsystem's header: nf_tables, ctnetlink): family,
/// version 0, resource id (big-endian).
pub fn nfgenmsg(family: u8, res_id: u16) -> [u8; 4] {
    let r = res_id.to_be_bytes();
    [family, 0, r[0], r[1]]
}

/// The address family of an address (`AF_INET` or `AF_INET6`).
pub fn af(a: &std::net::IpAddr) -> u8 {
    match a {
        std::net::IpAddr::V4(_) => libc::AF_INET as u8,
        std::net::IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Builds a stream of netlink messages into one buffer (a batch, or a single request).
#[derive(Debug, Default, Clone)]
pub struct MsgWriter {
    buf: Vec<u8>,
    msg_start: Option<usize>,
    nests: Vec<usize>,
}

impl MsgWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(n: usize) -> Self {
        MsgWriter {
            buf: Vec::with_capacity(n),
            ..Default::default()
        }
    }

    /// Starts a message: writes `nlmsghdr` (length patched by [`end_msg`](Self::end_msg)).
    pub fn begin_msg(&mut self, ty: u16, flags: u16, seq: u32) {
        debug_assert!(self.msg_start.is_none(), "previous message not ended");
        self.msg_start = Some(self.buf.len());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
    }

    /// Appends raw bytes (a family header such as `nfgenmsg` or `genlmsghdr`), 4-aligned.
    pub fn put_raw(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        self.pad();
    }

    pub fn end_msg(&mut self) {
        let start = self.msg_start.take().expect("end_msg without begin_msg");
        debug_assert!(self.nests.is_empty(), "unclosed nested attribute");
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    fn pad(&mut self) {
        let n = align4(self.buf.len()) - self.buf.len();
        self.buf.extend(std::iter::repeat_n(0u8, n));
    }

    /// Appends one attribute with a raw payload.
    pub fn attr(&mut self, ty: u16, data: &[u8]) {
        let len = (4 + data.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    /// A NUL-terminated string attribute.
    pub fn attr_str(&mut self, ty: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.attr(ty, &v);
    }

    pub fn attr_be32(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_be_bytes());
    }

    pub fn attr_be64(&mut self, ty: u16, v: u64) {
        self.attr(ty, &v.to_be_bytes());
    }

    pub fn attr_be16(&mut self, ty: u16, v: u16) {
        self.attr(ty, &v.to_be_bytes());
    }

    pub fn attr_u32(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_ne_bytes());
    }

    pub fn attr_u16(&mut self, ty: u16, v: u16) {
        self.attr(ty, &v.to_ne_bytes());
    }

    pub fn attr_u8(&mut self, ty: u16, v: u8) {
        self.attr(ty, &[v]);
    }

    /// Opens a nested attribute; close it with [`nest_end`](Self::nest_end).
    pub fn nest_start(&mut self, ty: u16) {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
    }

    pub fn nest_end(&mut self) {
        let start = self.nests.pop().expect("nest_end without nest_start");
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// One netlink message borrowed from a receive buffer.
#[derive(Debug, Clone, Copy)]
pub struct RawMsg<'a> {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    pub pid: u32,
    /// Everything after `nlmsghdr`.
    pub payload: &'a [u8],
}

/// Splits a buffer into netlink messages. Stops at the first truncated header; a message
/// whose length runs past the buffer (or is shorter than its header) is an error.
pub fn parse_msgs(buf: &[u8]) -> Result<Vec<RawMsg<'_>>, DecodeError> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            return Err(DecodeError::BadLength {
                msg: "netlink message",
                len,
                offset: off,
            });
        }
        out.push(RawMsg {
            ty: u16::from_ne_bytes(buf[off + 4..off + 6].try_into().unwrap()),
            flags: u16::from_ne_bytes(buf[off + 6..off + 8].try_into().unwrap()),
            seq: u32::from_ne_bytes(buf[off + 8..off + 12].try_into().unwrap()),
            pid: u32::from_ne_bytes(buf[off + 12..off + 16].try_into().unwrap()),
            payload: &buf[off + NLMSG_HDRLEN..off + len],
        });
        off += align4(len);
    }
    Ok(out)
}

/// One attribute: its type (flags stripped), whether it is nested, and its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr<'a> {
    pub ty: u16,
    pub nested: bool,
    pub data: &'a [u8],
}

impl<'a> Attr<'a> {
    pub fn be32(&self) -> Option<u32> {
        Some(u32::from_be_bytes(self.data.get(..4)?.try_into().ok()?))
    }
    pub fn be64(&self) -> Option<u64> {
        Some(u64::from_be_bytes(self.data.get(..8)?.try_into().ok()?))
    }
    pub fn be16(&self) -> Option<u16> {
        Some(u16::from_be_bytes(self.data.get(..2)?.try_into().ok()?))
    }
    pub fn u32(&self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.data.get(..4)?.try_into().ok()?))
    }
    pub fn u16(&self) -> Option<u16> {
        Some(u16::from_ne_bytes(self.data.get(..2)?.try_into().ok()?))
    }
    pub fn u8(&self) -> Option<u8> {
        self.data.first().copied()
    }
    /// A NUL-terminated (or unterminated) string.
    pub fn str(&self) -> Option<&'a str> {
        let d = self.data;
        let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
        std::str::from_utf8(&d[..end]).ok()
    }
    /// The attributes inside a nested attribute.
    pub fn nested(&self) -> Attrs<'a> {
        Attrs { buf: self.data }
    }
}

/// An iterator over the attributes in a buffer; malformed tails end the iteration.
#[derive(Debug, Clone, Copy)]
pub struct Attrs<'a> {
    buf: &'a [u8],
}

impl<'a> Attrs<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Attrs { buf }
    }
    /// The first attribute of the given type.
    pub fn get(&self, ty: u16) -> Option<Attr<'a>> {
        let mut it = *self;
        it.find(|a| a.ty == ty)
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Attr<'a>;
    fn next(&mut self) -> Option<Attr<'a>> {
        if self.buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([self.buf[0], self.buf[1]]) as usize;
        let ty = u16::from_ne_bytes([self.buf[2], self.buf[3]]);
        if len < 4 || len > self.buf.len() {
            self.buf = &[];
            return None;
        }
        let a = Attr {
            ty: ty & NLA_TYPE_MASK,
            nested: ty & NLA_F_NESTED != 0,
            data: &self.buf[4..len],
        };
        self.buf = &self.buf[align4(len).min(self.buf.len())..];
        Some(a)
    }
}

/// A decoded `NLMSG_ERROR` payload: errno (0 = ACK), the sequence it answers, and the
/// extended-ack message when the kernel supplied one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorMsg {
    pub errno: i32,
    pub seq: u32,
    pub ext_msg: Option<String>,
}

/// Decodes an `NLMSG_ERROR` message.
pub fn parse_error(m: &RawMsg<'_>) -> Result<ErrorMsg, DecodeError> {
    let p = m.payload;
    if p.len() < 4 + NLMSG_HDRLEN {
        return Err(DecodeError::Truncated {
            msg: "NLMSG_ERROR",
            header: "errno and the echoed header",
        });
    }
    let err = i32::from_ne_bytes(p[0..4].try_into().unwrap());
    let inner_len = u32::from_ne_bytes(p[4..8].try_into().unwrap()) as usize;
    let seq = u32::from_ne_bytes(p[12..16].try_into().unwrap());
    let mut ext_msg = None;
    if m.flags & NLM_F_ACK_TLVS != 0 {
        let echoed = if m.flags & NLM_F_CAPPED != 0 {
            NLMSG_HDRLEN
        } else {
            align4(inner_len)
        };
        if let Some(tlvs) = p.get(4 + echoed..) {
            ext_msg = Attrs::new(tlvs)
                .get(NLMSGERR_ATTR_MSG)
                .and_then(|a| a.str())
                .map(str::to_owned);
        }
    }
    Ok(ErrorMsg {
        // The kernel sends -errno; i32::MIN (no errno, but a datagram can say it) has no
        // negation and stays as it is rather than overflowing.
        errno: err.checked_neg().unwrap_or(err),
        seq,
        ext_msg,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the netlink fuzz targets: an `NLMSG_ERROR` carrying i32::MIN overflowed
    /// the negation (a panic in debug builds, a wrong errno in release ones).
    #[test]
    fn an_error_code_without_a_negation_is_kept() {
        let errno = |code: i32| {
            let mut payload = code.to_ne_bytes().to_vec();
            payload.extend_from_slice(&[0u8; NLMSG_HDRLEN]);
            let m = RawMsg {
                ty: 2,
                flags: 0,
                seq: 1,
                pid: 0,
                payload: &payload,
            };
            parse_error(&m).unwrap().errno
        };
        assert_eq!(errno(i32::MIN), i32::MIN);
        assert_eq!(errno(-17), 17);
    }

    #[test]
    fn writer_pads_attributes_and_patches_lengths() {
        let mut w = MsgWriter::new();
        w.begin_msg(0x0a00, NLM_F_REQUEST, 7);
        w.put_raw(&[2, 0, 0, 0]);
        w.attr_str(1, "ab");
        w.nest_start(2);
        w.attr_be32(1, 0x01020304);
        w.nest_end();
        w.end_msg();
        let b = w.into_bytes();
        assert_eq!(b.len(), 16 + 4 + 8 + 12);
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()), 40);
        // "ab\0" padded to 4, header len 7
        assert_eq!(&b[20..28], &[7, 0, 1, 0, b'a', b'b', 0, 0]);
        // nested header carries NLA_F_NESTED and covers its child
        assert_eq!(&b[28..32], &[12, 0, 2, 0x80]);
        assert_eq!(&b[32..40], &[8, 0, 1, 0, 1, 2, 3, 4]);

        let msgs = parse_msgs(&b).unwrap();
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].seq, 7);
        let attrs: Vec<_> = Attrs::new(&msgs[0].payload[4..]).collect();
        assert_eq!(attrs[0].str(), Some("ab"));
        assert!(attrs[1].nested);
        assert_eq!(attrs[1].nested().get(1).unwrap().be32(), Some(0x01020304));
    }

    #[test]
    fn attrs_stop_at_malformed_length() {
        let buf = [200u8, 0, 1, 0, 1, 2];
        assert_eq!(Attrs::new(&buf).count(), 0);
    }

    #[test]
    fn parse_msgs_rejects_truncated_message() {
        let mut w = MsgWriter::new();
        w.begin_msg(1, 0, 1);
        w.attr_u32(1, 5);
        w.end_msg();
        let b = w.into_bytes();
        assert!(parse_msgs(&b[..b.len() - 2]).is_err());
    }

    #[test]
    fn error_message_with_extended_ack() {
        // NLMSG_ERROR: errno -2, echoed header (capped), then NLMSGERR_ATTR_MSG "nope".
        let mut w = MsgWriter::new();
        w.begin_msg(NLMSG_ERROR, NLM_F_CAPPED | NLM_F_ACK_TLVS, 9);
        let mut p = Vec::new();
        p.extend_from_slice(&(-2i32).to_ne_bytes());
        p.extend_from_slice(&64u32.to_ne_bytes());
        p.extend_from_slice(&[0u8; 4]);
        p.extend_from_slice(&9u32.to_ne_bytes());
        p.extend_from_slice(&[0u8; 4]);
        w.put_raw(&p);
        w.attr_str(NLMSGERR_ATTR_MSG, "nope");
        w.end_msg();
        let b = w.into_bytes();
        let m = parse_msgs(&b).unwrap()[0];
        let e = parse_error(&m).unwrap();
        assert_eq!(
            e,
            ErrorMsg {
                errno: 2,
                seq: 9,
                ext_msg: Some("nope".into())
            }
        );
    }
}

//! Kubernetes' protobuf wire format around objects, as apimachinery's protobuf serializer
//! writes it: a response body is `k8s\0` then a `runtime.Unknown` envelope whose `raw`
//! holds the object; a watch response is frames of a 4-byte big-endian length and a
//! `metav1.WatchEvent`, whose object is again an envelope. Lists are split item by item
//! here so that one undecodable object is skipped alone (decoding the whole list with prost
//! would fail it, and every sync after it). Pure: bytes in, decoded objects out; nothing is
//! copied but the objects themselves.

use prost::bytes::Buf;

/// The media type upstream kube-proxy asks for (`clientConnection.contentType`'s default).
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// What every protobuf body and envelope starts with.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// The largest watch frame accepted. etcd keeps objects below 1.5 MiB by default
/// (`--max-request-bytes`) and the API server's own limit on a write is 3 MiB; a frame
/// claiming more than 64 MiB is a broken stream, and is refused before anything is
/// allocated for it.
pub const MAX_FRAME: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error("not a Kubernetes protobuf body: it does not start with k8s\\0")]
    NoMagic,
    #[error("malformed protobuf in {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
    #[error("the envelope holds {found:?} where {expected} was expected")]
    Kind {
        expected: &'static str,
        found: String,
    },
    #[error("the envelope's content encoding {0:?} is not supported")]
    Encoding(String),
    #[error("the envelope's content type {0:?} is not protobuf")]
    ContentType(String),
    #[error("a watch frame of {0} bytes is larger than the {MAX_FRAME}-byte limit")]
    FrameTooLarge(usize),
    #[error("the watch stream ended inside a frame ({0} bytes left over)")]
    Truncated(usize),
}

fn malformed(what: &'static str, e: impl std::fmt::Display) -> WireError {
    WireError::Malformed {
        what,
        detail: e.to_string(),
    }
}

/// One field of a protobuf message as it stands on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Varint(u64),
    Fixed,
    Bytes(&'a [u8]),
}

/// The fields of `msg` in wire order, numbers with their values, walked without
/// allocating. Groups (wire types 3 and 4, unused by Kubernetes) and anything truncated are
/// malformed; the walk ends after the first error.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    what: &'static str,
    msg: &'a [u8],
}

impl<'a> Fields<'a> {
    pub fn new(what: &'static str, msg: &'a [u8]) -> Self {
        Fields { what, msg }
    }

    fn field(&mut self) -> Result<(u32, Value<'a>), WireError> {
        let what = self.what;
        let msg = &mut self.msg;
        let key = prost::encoding::decode_varint(msg).map_err(|e| malformed(what, e))?;
        let number = u32::try_from(key >> 3).map_err(|_| malformed(what, "field number"))?;
        let value = match key & 7 {
            0 => {
                Value::Varint(prost::encoding::decode_varint(msg).map_err(|e| malformed(what, e))?)
            }
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                if msg.len() < n {
                    return Err(malformed(what, "truncated fixed-width field"));
                }
                msg.advance(n);
                Value::Fixed
            }
            2 => {
                let len = prost::encoding::decode_varint(msg).map_err(|e| malformed(what, e))?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&l| l <= msg.len())
                    .ok_or_else(|| malformed(what, "a length past the end of the message"))?;
                let (bytes, rest) = msg.split_at(len);
                *msg = rest;
                Value::Bytes(bytes)
            }
            t => return Err(malformed(what, format!("wire type {t}"))),
        };
        Ok((number, value))
    }

    /// The last bytes value of each of `numbers` (protobuf's rule: the last one wins),
    /// empty when absent, in one walk of the whole message: a malformed field anywhere is
    /// an error, even after the ones wanted.
    pub fn last_bytes<const N: usize>(self, numbers: [u32; N]) -> Result<[&'a [u8]; N], WireError> {
        let mut found = [&[][..]; N];
        for field in self {
            if let (n, Value::Bytes(b)) = field? {
                if let Some(k) = numbers.iter().position(|&want| want == n) {
                    found[k] = b;
                }
            }
        }
        Ok(found)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if !self.msg.has_remaining() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            self.msg = &[];
        }
        Some(field)
    }
}

fn utf8<'a>(what: &'static str, bytes: &'a [u8]) -> Result<&'a str, WireError> {
    std::str::from_utf8(bytes).map_err(|e| malformed(what, e))
}

/// A `runtime.Unknown` envelope: the kind it says it holds and the object's bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub raw: &'a [u8],
}

/// The envelope of a body that starts with [`MAGIC`].
pub fn envelope(body: &[u8]) -> Result<Envelope<'_>, WireError> {
    let what = "the envelope";
    let inner = body.strip_prefix(MAGIC).ok_or(WireError::NoMagic)?;
    // runtime.Unknown: typeMeta = 1, raw = 2, contentEncoding = 3, contentType = 4.
    let [type_meta, raw, encoding, content_type] =
        Fields::new(what, inner).last_bytes([1, 2, 3, 4])?;
    let [api_version, kind] = Fields::new(what, type_meta).last_bytes([1, 2])?;
    let encoding = utf8(what, encoding)?;
    if !encoding.is_empty() {
        return Err(WireError::Encoding(encoding.to_string()));
    }
    // apimachinery leaves it empty or names protobuf; JSON inside a protobuf envelope is
    // never written by an API server.
    let content_type = utf8(what, content_type)?;
    if !content_type.is_empty() && !content_type.starts_with(PROTOBUF) {
        return Err(WireError::ContentType(content_type.to_string()));
    }
    Ok(Envelope {
        api_version: utf8(what, api_version)?,
        kind: utf8(what, kind)?,
        raw,
    })
}

/// The object's bytes from a body in an envelope of `kind` (an empty kind is taken as
/// meant: apimachinery always fills it, a hand-made body may not).
pub fn object_of<'a>(body: &'a [u8], kind: &'static str) -> Result<&'a [u8], WireError> {
    let e = envelope(body)?;
    if !e.kind.is_empty() && e.kind != kind {
        return Err(WireError::Kind {
            expected: kind,
            found: e.kind.to_string(),
        });
    }
    Ok(e.raw)
}

/// A list's `metadata` and its items' bytes, one slice per item, undecoded.
#[derive(Debug, Clone, PartialEq)]
pub struct ListParts<'a> {
    pub resource_version: &'a str,
    pub continue_token: &'a str,
    pub items: Vec<&'a [u8]>,
}

/// Splits a list message (`metadata` = 1, `items` = 2, as every `…List` type has them).
pub fn list_parts(list: &[u8]) -> Result<ListParts<'_>, WireError> {
    let what = "the list";
    let mut meta: &[u8] = &[];
    let mut items = Vec::new();
    for field in Fields::new(what, list) {
        match field? {
            (1, Value::Bytes(b)) => meta = b,
            (2, Value::Bytes(b)) => items.push(b),
            _ => {}
        }
    }
    // ListMeta: resourceVersion = 2, continue = 3.
    let [resource_version, continue_token] = Fields::new(what, meta).last_bytes([2, 3])?;
    Ok(ListParts {
        resource_version: utf8(what, resource_version)?,
        continue_token: utf8(what, continue_token)?,
        items,
    })
}

/// A `metav1.WatchEvent`: its type and its object's bytes, unwrapped from their envelope
/// when they have one.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchParts<'a> {
    pub event_type: &'a str,
    /// The kind the object's envelope names ("" when it had none).
    pub kind: &'a str,
    pub object: &'a [u8],
}

/// Splits one watch frame. The frame itself is the bare `WatchEvent` (the stream
/// serializer writes no envelope); its `object.raw` is a whole body with its envelope.
/// Both are accepted with or without one.
pub fn watch_parts(frame: &[u8]) -> Result<WatchParts<'_>, WireError> {
    let what = "a watch event";
    let frame = match frame.strip_prefix(MAGIC) {
        Some(_) => envelope(frame)?.raw,
        None => frame,
    };
    // WatchEvent: type = 1, object = 2 (a RawExtension: raw = 1).
    let [event_type, object] = Fields::new(what, frame).last_bytes([1, 2])?;
    let event_type = utf8(what, event_type)?;
    let [raw] = Fields::new(what, object).last_bytes([1])?;
    let (kind, object) = if raw.starts_with(MAGIC) {
        let e = envelope(raw)?;
        (e.kind, e.raw)
    } else {
        ("", raw)
    };
    Ok(WatchParts {
        event_type,
        kind,
        object,
    })
}

/// Cuts a watch response's bytes, as they arrive in chunks of any size, into frames.
#[derive(Debug, Default)]
pub struct Frames {
    buf: Vec<u8>,
    start: usize,
}

impl Frames {
    pub fn push(&mut self, chunk: &[u8]) {
        // Drop what was consumed before growing, so the buffer stays about one frame long.
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole frame, if one has arrived. A length above [`MAX_FRAME`] is an error
    /// (the stream is then unusable: the caller ends it).
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, WireError> {
        let rest = &self.buf[self.start..];
        let Some(len) = rest.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if len > MAX_FRAME {
            return Err(WireError::FrameTooLarge(len));
        }
        if rest.len() < 4 + len {
            return Ok(None);
        }
        let at = self.start + 4;
        self.start = at + len;
        Ok(Some(&self.buf[at..at + len]))
    }

    /// At the end of the stream: bytes left that are not a whole frame.
    pub fn finish(&self) -> Result<(), WireError> {
        match self.buf.len() - self.start {
            0 => Ok(()),
            n => Err(WireError::Truncated(n)),
        }
    }
}

/// Bodies as apimachinery writes them, for tests and fuzz seeds: one encoder each.
#[cfg(any(test, feature = "testing"))]
pub mod fixtures {
    use super::MAGIC;
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
    use k8s_pb::apimachinery::pkg::runtime::{RawExtension, TypeMeta, Unknown};
    use prost::Message;

    /// `k8s\0` + `runtime.Unknown{typeMeta{apiVersion, kind}, raw}`, its encoding and
    /// content type written empty as apimachinery writes them.
    pub fn enveloped(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        }
        .encode(&mut out)
        .expect("a Vec grows");
        out
    }

    /// A `…List` message (not enveloped): `metadata.resourceVersion` = `rv`, then each
    /// item's bytes as they are (well-formed or not).
    pub fn list(rv: &str, items: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        let m = meta::ListMeta {
            resource_version: Some(rv.into()),
            ..Default::default()
        };
        prost::encoding::message::encode(1, &m, &mut out);
        for i in items {
            prost::encoding::bytes::encode(2, i, &mut out);
        }
        out
    }

    /// A `WatchEvent` of `ty` whose object is `object` in a v1 envelope of `kind`.
    pub fn event(ty: &str, kind: &str, object: Vec<u8>) -> Vec<u8> {
        meta::WatchEvent {
            r#type: Some(ty.into()),
            object: Some(RawExtension {
                raw: Some(enveloped("v1", kind, object)),
            }),
        }
        .encode_to_vec()
    }

    /// A watch response's bytes: each event after its 4-byte big-endian length.
    pub fn framed(events: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in events {
            out.extend_from_slice(&(e.len() as u32).to_be_bytes());
            out.extend_from_slice(e);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{enveloped, framed};
    use super::*;
    use prost::Message;

    /// Field 1 "a", a varint field 1, field 2 "b", field 1 "c": the last bytes value of
    /// each number wins and the varint is passed over; a malformed field after the wanted
    /// ones still fails the walk, which then ends.
    #[test]
    fn the_walk_finds_the_last_value_and_any_malformed_field() {
        let msg = [0x0a, 1, b'a', 0x08, 5, 0x12, 1, b'b', 0x0a, 1, b'c'];
        let [one, two, three] = Fields::new("m", &msg).last_bytes([1, 2, 3]).unwrap();
        assert_eq!((one, two, three), (&b"c"[..], &b"b"[..], &b""[..]));
        let walked: Vec<_> = Fields::new("m", &msg).map(Result::unwrap).collect();
        assert_eq!(walked[1], (1, Value::Varint(5)));
        assert_eq!(walked.len(), 4);

        let mut bad = msg.to_vec();
        bad.extend_from_slice(&[0x1a, 9, b'x']); // field 3 claims 9 bytes, has 1
        let err = Fields::new("m", &bad).last_bytes([1]).unwrap_err();
        assert!(err.to_string().contains("past the end"), "{err}");
        let mut walk = Fields::new("m", &bad).skip(4);
        assert!(matches!(walk.next(), Some(Err(_))));
        assert!(walk.next().is_none(), "the walk ends at its first error");
    }

    #[test]
    fn envelope_bytes_are_apimachinerys() {
        // apimachinery's protobuf serializer for a Status{code: 410} in v1: the prefix,
        // then field 1 (TypeMeta: "v1", "Status"), field 2 (raw), fields 3 and 4 empty.
        let raw = vec![0x30, 0x9a, 0x03]; // Status.code (field 6) = 410
        let body = enveloped("v1", "Status", raw.clone());
        assert_eq!(
            body,
            [
                b"k8s\0".as_slice(),
                &[0x0a, 0x0c, 0x0a, 0x02, b'v', b'1', 0x12, 0x06],
                b"Status",
                &[0x12, 0x03, 0x30, 0x9a, 0x03, 0x1a, 0x00, 0x22, 0x00],
            ]
            .concat()
        );
        let e = envelope(&body).unwrap();
        assert_eq!(
            (e.api_version, e.kind, e.raw),
            ("v1", "Status", raw.as_slice())
        );
        assert_eq!(object_of(&body, "Status").unwrap(), raw.as_slice());
        assert_eq!(
            object_of(&body, "ServiceList"),
            Err(WireError::Kind {
                expected: "ServiceList",
                found: "Status".into()
            })
        );
    }

    #[test]
    fn bodies_that_are_not_protobuf_objects_are_refused_by_name() {
        assert_eq!(envelope(b"{\"kind\":\"Status\"}"), Err(WireError::NoMagic));
        // A length running past the end.
        assert!(matches!(
            envelope(b"k8s\0\x12\x7f\x01"),
            Err(WireError::Malformed { .. })
        ));
        // A group (wire type 3).
        assert!(matches!(
            envelope(b"k8s\0\x0b"),
            Err(WireError::Malformed { .. })
        ));
        let mut gz = MAGIC.to_vec();
        k8s_pb::apimachinery::pkg::runtime::Unknown {
            content_encoding: Some("gzip".into()),
            ..Default::default()
        }
        .encode(&mut gz)
        .unwrap();
        assert_eq!(envelope(&gz), Err(WireError::Encoding("gzip".into())));
        let mut json = MAGIC.to_vec();
        k8s_pb::apimachinery::pkg::runtime::Unknown {
            content_type: Some("application/json".into()),
            ..Default::default()
        }
        .encode(&mut json)
        .unwrap();
        assert_eq!(
            envelope(&json),
            Err(WireError::ContentType("application/json".into()))
        );
    }

    #[test]
    fn a_list_is_split_into_its_items_without_decoding_them() {
        use k8s_pb::apimachinery::pkg::apis::meta::v1::ListMeta;
        let list = k8s_pb::api::core::v1::ServiceList {
            metadata: Some(ListMeta {
                resource_version: Some("42".into()),
                r#continue: Some("next".into()),
                ..Default::default()
            }),
            items: vec![Default::default(), Default::default()],
        };
        let mut bytes = list.encode_to_vec();
        // A third item that is not a Service at all still splits out on its own.
        bytes.extend_from_slice(&[0x12, 0x02, 0xff, 0xff]);
        let parts = list_parts(&bytes).unwrap();
        assert_eq!(parts.resource_version, "42");
        assert_eq!(parts.continue_token, "next");
        assert_eq!(parts.items, vec![&[][..], &[][..], &[0xff, 0xff][..]]);
    }

    #[test]
    fn watch_events_with_and_without_envelopes() {
        use k8s_pb::apimachinery::pkg::apis::meta::v1::WatchEvent;
        use k8s_pb::apimachinery::pkg::runtime::RawExtension;
        let object = vec![0x0a, 0x00];
        let event = |raw: Vec<u8>| WatchEvent {
            r#type: Some("ADDED".into()),
            object: Some(RawExtension { raw: Some(raw) }),
        };
        let inner = event(enveloped("v1", "Service", object.clone())).encode_to_vec();
        let want = WatchParts {
            event_type: "ADDED",
            kind: "Service",
            object: &object,
        };
        assert_eq!(watch_parts(&inner).unwrap(), want);
        let outer = enveloped("meta.k8s.io/v1", "WatchEvent", inner.clone());
        assert_eq!(watch_parts(&outer).unwrap(), want);
        let bare = event(object.clone()).encode_to_vec();
        assert_eq!(watch_parts(&bare).unwrap().kind, "");
        assert_eq!(watch_parts(&bare).unwrap().object, object.as_slice());
    }

    #[test]
    fn frames_are_cut_from_chunks_of_any_size() {
        let stream = framed(&[b"one".to_vec(), vec![], b"three33".to_vec()]);
        for chunk in [1, 2, 5, stream.len()] {
            let mut frames = Frames::default();
            let mut got = Vec::new();
            for c in stream.chunks(chunk) {
                frames.push(c);
                while let Some(f) = frames.next_frame().unwrap() {
                    got.push(f.to_vec());
                }
            }
            assert_eq!(got, vec![b"one".to_vec(), vec![], b"three33".to_vec()]);
            assert_eq!(frames.finish(), Ok(()));
        }
        let mut cut = Frames::default();
        cut.push(&[0, 0, 0, 9, 1, 2]);
        assert_eq!(cut.next_frame(), Ok(None));
        assert_eq!(cut.finish(), Err(WireError::Truncated(6)));
        let mut huge = Frames::default();
        huge.push(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            huge.next_frame(),
            Err(WireError::FrameTooLarge(0xffff_ffff))
        );
    }
}

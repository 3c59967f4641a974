//! A watched object decoded straight into its typed form, or, when that fails, into its
//! metadata and the error: one undecodable object is skipped alone instead of failing its
//! whole list (and every sync after it). Pure.
//!
//! It replaces watching untyped `DynamicObject`s and converting each with `try_parse`, which
//! decoded every object three times (text into a metadata struct and a JSON tree, the tree
//! written out again as a tree, that tree into the typed object): measured with
//! `examples/api_decoders.rs`, see the numbers at [`Lenient`].

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, Deserializer};
use serde::Deserialize as _;
use serde_json::value::RawValue;

/// A watched object of kind `K`: decoded, or only its metadata with why the rest did not
/// decode (a Service with `port: "eighty"` from a newer or broken API server).
///
/// Decoding takes the object's text as it stands in the response (`RawValue`: the parser
/// only finds where it ends) and decodes it as `K`; only on failure is the text decoded a
/// second time, for `metadata` alone. At 10k EndpointSlices of 10 endpoints each as watch
/// events this costs about what decoding `K` directly does, against ~3× for the untyped
/// object and `try_parse` (`cargo run --release --example api_decoders --features testing`).
///
/// The text is reached without buffering because the API server writes a watch event's
/// `type` before its `object` (apimachinery's `WatchEvent` struct, encoded by Go in field
/// order) and a list's items in an array. An event written the other way round (a proxy
/// that re-encodes with sorted keys) is buffered by serde and decoded through a JSON tree
/// instead: slower, with the same result.
#[derive(Debug, Clone)]
pub enum Lenient<K> {
    Decoded(K),
    /// Boxed: the rare case, and an ObjectMeta is ~380 bytes.
    Undecodable {
        metadata: Box<ObjectMeta>,
        error: String,
    },
}

impl<K> Lenient<K> {
    /// The typed object, or the reason it could not be decoded.
    pub fn decoded(self) -> Result<K, String> {
        match self {
            Lenient::Decoded(k) => Ok(k),
            Lenient::Undecodable { error, .. } => Err(error),
        }
    }
}

impl<K: Resource> Resource for Lenient<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn url_path(dt: &Self::DynamicType, namespace: Option<&str>) -> String {
        K::url_path(dt, namespace)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Decoded(k) => k.meta(),
            Lenient::Undecodable { metadata, .. } => metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Decoded(k) => k.meta_mut(),
            Lenient::Undecodable { metadata, .. } => metadata,
        }
    }
}

/// serde_json's name for the newtype through which its deserializer hands over an object's
/// raw text (`serde_json::value::RawValue`): asked for by this name, serde_json answers with
/// the text; any other deserializer, and serde's buffer for an event whose `object` came
/// before its `type`, answers as for an ordinary newtype, and the object is decoded through a
/// JSON tree instead (slower, same result). Should serde_json ever rename it, only the fast
/// path is lost; `the_raw_text_path_is_taken_for_the_api_servers_order` says so.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

impl<'de, K: DeserializeOwned> serde::Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_newtype_struct(RAW_VALUE_TOKEN, LenientVisitor(std::marker::PhantomData))
    }
}

struct LenientVisitor<K>(std::marker::PhantomData<K>);

#[derive(serde::Deserialize)]
struct MetadataOnly {
    #[serde(default)]
    metadata: ObjectMeta,
}

impl<K> LenientVisitor<K> {
    /// `decode` failed with `error`: the object's metadata from `metadata`, or, without even
    /// that, the whole event is undecodable (there is no name to skip it by).
    fn undecodable<E: serde::de::Error>(
        error: impl std::fmt::Display,
        metadata: Result<MetadataOnly, impl std::fmt::Display>,
    ) -> Result<Lenient<K>, E> {
        let m = metadata.map_err(E::custom)?;
        Ok(Lenient::Undecodable {
            metadata: Box::new(m.metadata),
            error: error.to_string(),
        })
    }
}

impl<'de, K: DeserializeOwned> serde::de::Visitor<'de> for LenientVisitor<K> {
    type Value = Lenient<K>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Kubernetes object")
    }

    /// serde_json's answer to [`RAW_VALUE_TOKEN`]: the object's text.
    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let raw = <Box<RawValue>>::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        match serde_json::from_str::<K>(raw.get()) {
            Ok(k) => Ok(Lenient::Decoded(k)),
            Err(e) => Self::undecodable(e, serde_json::from_str::<MetadataOnly>(raw.get())),
        }
    }

    /// Any other deserializer: through a JSON tree, which can be decoded twice.
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        let tree = serde_json::Value::deserialize(d)?;
        match K::deserialize(&tree) {
            Ok(k) => Ok(Lenient::Decoded(k)),
            Err(e) => Self::undecodable(e, MetadataOnly::deserialize(&tree)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{ObjectList, WatchEvent};

    const GOOD: &str = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"shop","resourceVersion":"7"},"spec":{"clusterIP":"10.0.0.10","ports":[{"port":80,"protocol":"TCP"}]}}"#;
    const BAD_PORT: &str = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"skew","namespace":"shop"},"spec":{"ports":[{"port":"eighty"}]}}"#;

    #[test]
    fn a_watch_event_decodes_typed_and_a_bad_object_keeps_its_name_and_error() {
        let ev: WatchEvent<Lenient<Service>> =
            serde_json::from_str(&format!(r#"{{"type":"ADDED","object":{GOOD}}}"#)).unwrap();
        let WatchEvent::Added(Lenient::Decoded(s)) = ev else {
            panic!("not decoded: {ev:?}")
        };
        assert_eq!(s.metadata.name.as_deref(), Some("web"));
        assert_eq!(s.spec.unwrap().ports.unwrap()[0].port, 80);

        let ev: WatchEvent<Lenient<Service>> =
            serde_json::from_str(&format!(r#"{{"type":"MODIFIED","object":{BAD_PORT}}}"#)).unwrap();
        let WatchEvent::Modified(o) = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(o.meta().name.as_deref(), Some("skew"));
        assert_eq!(o.meta().namespace.as_deref(), Some("shop"));
        let err = o.decoded().unwrap_err();
        assert!(err.contains("expected i32"), "{err}");
    }

    /// The API server writes `type` first; an event the other way round (a proxy that
    /// re-encodes JSON with sorted keys, as Go's maps and `json!` do) and an object decoded
    /// from a JSON tree come out the same, through the slower path.
    #[test]
    fn either_key_order_and_a_json_tree_decode_alike() {
        let seen = |o: Lenient<Service>| {
            let m = o.meta().clone();
            let d = o.decoded();
            (
                m,
                d.as_ref().ok().cloned(),
                d.err().map(|e| e[..27].to_string()),
            )
        };
        for object in [GOOD, BAD_PORT] {
            let type_first: WatchEvent<Lenient<Service>> =
                serde_json::from_str(&format!(r#"{{"type":"ADDED","object":{object}}}"#)).unwrap();
            let object_first: WatchEvent<Lenient<Service>> =
                serde_json::from_str(&format!(r#"{{"object":{object},"type":"ADDED"}}"#)).unwrap();
            let tree: Lenient<Service> =
                serde_json::from_value(serde_json::from_str(object).unwrap()).unwrap();
            let (WatchEvent::Added(a), WatchEvent::Added(b)) = (type_first, object_first) else {
                panic!("not ADDED")
            };
            assert_eq!(seen(a.clone()), seen(b), "{object}");
            assert_eq!(seen(a), seen(tree), "{object}");
        }
    }

    /// The fast path is taken for the API server's order: the typed decoder reads the text
    /// itself, so its error has a position in it; from a tree it has none.
    #[test]
    fn the_raw_text_path_is_taken_for_the_api_servers_order() {
        let decode = |line: String| match serde_json::from_str(&line).unwrap() {
            WatchEvent::<Lenient<Service>>::Added(o) => o.decoded().unwrap_err(),
            other => panic!("{other:?}"),
        };
        let raw = decode(format!(r#"{{"type":"ADDED","object":{BAD_PORT}}}"#));
        assert!(raw.ends_with("at line 1 column 115"), "{raw}");
        let tree = decode(format!(r#"{{"object":{BAD_PORT},"type":"ADDED"}}"#));
        assert!(!tree.contains("at line"), "{tree}");
    }

    #[test]
    fn a_list_skips_only_its_bad_item() {
        let body = format!(
            r#"{{"apiVersion":"v1","kind":"ServiceList","metadata":{{"resourceVersion":"9"}},"items":[{GOOD},{BAD_PORT},{GOOD}]}}"#
        );
        let list: ObjectList<Lenient<Service>> = serde_json::from_str(&body).unwrap();
        let ok: Vec<bool> = list
            .items
            .into_iter()
            .map(|o| o.decoded().is_ok())
            .collect();
        assert_eq!(ok, [true, false, true]);
    }

    #[test]
    fn an_object_without_readable_metadata_fails_the_event() {
        for object in [
            r#"{"metadata":{"name":7},"spec":{"ports":[{"port":"x"}]}}"#,
            r#""a string""#,
            "[1,2]",
        ] {
            let text = format!(r#"{{"type":"ADDED","object":{object}}}"#);
            assert!(
                serde_json::from_str::<WatchEvent<Lenient<Service>>>(&text).is_err(),
                "{object}"
            );
        }
        // Valid metadata with an invalid body still names the object.
        let o: Lenient<EndpointSlice> =
            serde_json::from_str(r#"{"metadata":{"name":"s"},"endpoints":7}"#).unwrap();
        assert_eq!(o.meta().name.as_deref(), Some("s"));
        assert!(o.decoded().is_err());
    }

    #[test]
    fn resource_names_are_the_kinds_own() {
        assert_eq!(Lenient::<Service>::plural(&()), "services");
        assert_eq!(
            Lenient::<EndpointSlice>::url_path(&(), None),
            EndpointSlice::url_path(&(), None)
        );
        assert_eq!(
            Lenient::<EndpointSlice>::api_version(&()),
            "discovery.k8s.io/v1"
        );
    }
}

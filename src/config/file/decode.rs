//! Reading a KubeProxyConfiguration file as upstream does (`loadConfig` in
//! cmd/kube-proxy/app/options.go): YAML or JSON, strict first (unknown and duplicate
//! fields are strict-decoding errors), lenient second (the same file with those fields
//! ignored or the last duplicate kept, and a warning naming each). Go's JSON rules apply:
//! `null` leaves a field at its zero value, field names are case-sensitive, a duration is a
//! string. Pure.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::v1alpha1::{KubeProxyConfiguration, API_VERSION, KIND};

/// A decoded file and what the strict pass objected to.
#[derive(Debug)]
pub struct Decoded {
    pub config: KubeProxyConfiguration,
    /// `strict decoding error: unknown field "foo"`, one per field, in file order.
    pub strict_errors: Vec<String>,
}

/// Why a file could not be read; `field` is the JSON path of the offending field.
#[derive(Debug, PartialEq, Eq)]
pub struct DecodeError {
    pub field: Option<String>,
    pub why: String,
}

fn err(field: Option<&str>, why: impl Into<String>) -> DecodeError {
    DecodeError {
        field: field.map(str::to_string),
        why: why.into(),
    }
}

/// A YAML node that keeps every mapping entry, duplicates included.
enum Node {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Node, E> {
                Ok(Node::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Node, E> {
                Ok(Node::I64(n))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Node, E> {
                Ok(Node::U64(n))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Node, E> {
                Ok(Node::F64(n))
            }
            fn visit_str<E>(self, s: &str) -> Result<Node, E> {
                Ok(Node::Str(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Node, E> {
                Ok(Node::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut v = Vec::new();
                while let Some(n) = a.next_element()? {
                    v.push(n);
                }
                Ok(Node::Seq(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut v = Vec::new();
                while let Some((k, val)) = a.next_entry()? {
                    v.push((k, val));
                }
                Ok(Node::Map(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl Node {
    /// A mapping key as sigs.k8s.io/yaml turns it into a JSON key.
    fn key(&self) -> String {
        match self {
            Node::Str(s) => s.clone(),
            Node::Bool(b) => b.to_string(),
            Node::I64(n) => n.to_string(),
            Node::U64(n) => n.to_string(),
            Node::F64(n) => n.to_string(),
            Node::Null => "null".into(),
            Node::Seq(_) | Node::Map(_) => String::new(),
        }
    }

    /// The JSON value Go would decode, recording duplicate keys (the last one wins, as in
    /// the lenient decoder) and dropping `null` members (Go leaves those fields alone).
    fn into_json(self, path: &str, dups: &mut Vec<String>) -> Value {
        match self {
            Node::Null => Value::Null,
            Node::Bool(b) => Value::Bool(b),
            Node::I64(n) => Value::from(n),
            Node::U64(n) => Value::from(n),
            Node::F64(n) => serde_json::Number::from_f64(n)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            Node::Str(s) => Value::String(s),
            Node::Seq(v) => Value::Array(
                v.into_iter()
                    .enumerate()
                    .map(|(i, n)| n.into_json(&format!("{path}[{i}]"), dups))
                    .collect(),
            ),
            Node::Map(entries) => {
                let mut m = serde_json::Map::new();
                for (k, v) in entries {
                    let k = k.key();
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    let v = v.into_json(&p, dups);
                    if m.contains_key(&k) {
                        dups.push(p);
                    }
                    if v.is_null() {
                        m.remove(&k);
                    } else {
                        m.insert(k, v);
                    }
                }
                Value::Object(m)
            }
        }
    }
}

/// Decodes a whole file.
pub fn decode(text: &str) -> Result<Decoded, DecodeError> {
    if let Err(line) = crate::source::yaml::check_depth(text) {
        return Err(err(
            None,
            format!(
                "line {line}: nests deeper than {} levels",
                crate::source::yaml::MAX_DEPTH
            ),
        ));
    }
    let node: Node = crate::source::yaml::from_str(text)
        .map_err(|e| err(None, crate::source::yaml::error_message(&e)))?;
    let mut dups = Vec::new();
    let value = node.into_json("", &mut dups);
    let Value::Object(top) = &value else {
        return Err(err(None, "not a mapping"));
    };
    match top.get("apiVersion") {
        Some(Value::String(v)) if v == API_VERSION => {}
        None => {
            return Err(err(
                Some("apiVersion"),
                format!("missing (use {API_VERSION})"),
            ))
        }
        Some(Value::String(v)) if v.starts_with("kubeproxy.config.k8s.io/") => {
            return Err(err(
                Some("apiVersion"),
                format!(
                    "{v:?} is not supported: no kind \"KubeProxyConfiguration\" is registered \
                     for that version (upstream v1.37 defines {API_VERSION} alone)"
                ),
            ))
        }
        Some(other) => {
            return Err(err(
                Some("apiVersion"),
                format!("{other} is not supported (use {API_VERSION})"),
            ))
        }
    }
    match top.get("kind") {
        Some(Value::String(k)) if k == KIND => {}
        Some(other) => {
            return Err(err(
                Some("kind"),
                format!("{other} is not {KIND} (no kind {other} is registered for {API_VERSION})"),
            ))
        }
        None => return Err(err(Some("kind"), format!("missing (use {KIND})"))),
    }
    let mut unknown = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(&value, &mut track);
    let config = serde_ignored::deserialize(de, |path| unknown.push(path.to_string()))
        .map_err(|e: serde_json::Error| err(Some(&track.path().to_string()), e.to_string()))?;
    let mut strict_errors: Vec<String> = unknown
        .into_iter()
        .map(|p| format!("strict decoding error: unknown field {p:?}"))
        .collect();
    strict_errors.extend(
        dups.into_iter()
            .map(|p| format!("strict decoding error: duplicate field {p:?}")),
    );
    Ok(Decoded {
        config,
        strict_errors,
    })
}

#[cfg(test)]
mod tests {
    use super::super::v1alpha1::GoDuration;
    use super::*;

    const HEAD: &str =
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

    #[test]
    fn kubeadms_undefaulted_file_reads_cleanly() {
        let d = decode(include_str!("testdata/kubeadm_config.conf")).unwrap();
        assert!(d.strict_errors.is_empty(), "{:?}", d.strict_errors);
        let c = d.config;
        assert_eq!(c.cluster_cidr, "10.244.0.0/16");
        assert_eq!(
            c.client_connection.kubeconfig,
            "/var/lib/kube-proxy/kubeconfig.conf"
        );
        assert_eq!(c.conntrack.max_per_core, None);
        assert_eq!(c.iptables.masquerade_bit, None);
        assert_eq!(c.node_port_addresses, None);
        assert_eq!(c.oom_score_adj, None);
        assert_eq!(c.config_sync_period, GoDuration(0));
        assert_eq!(c.logging.options.json.info_buffer_size.0, "0");
    }

    #[test]
    fn unknown_and_duplicate_fields_are_strict_errors_only() {
        // TestLoadConfig's "unknown field" and "duplicate field" rows: lenient decoding
        // succeeds, the last duplicate wins.
        let d = decode(&format!(
            "{HEAD}bindAddress: 1.1.1.1\nfoo: bar\nbindAddress: 9.8.7.6\nnftables:\n  tableName: x\n"
        ))
        .unwrap();
        assert_eq!(d.config.bind_address, "9.8.7.6");
        assert_eq!(
            d.strict_errors,
            vec![
                "strict decoding error: unknown field \"foo\"",
                "strict decoding error: unknown field \"nftables.tableName\"",
                "strict decoding error: duplicate field \"bindAddress\"",
            ]
        );
    }

    #[test]
    fn failures_like_upstreams_load_config_failures() {
        // TestLoadConfigFailures
        for (body, want) in [
            (
                "Twas bryllyg, and ye slythy toves",
                "could not find expected ':'",
            ),
            (
                "bindAddress: ::",
                "mapping values are not allowed in this context",
            ),
        ] {
            let e = decode(&format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n{body}"
            ))
            .unwrap_err();
            assert!(e.why.contains(want), "{body}: {e:?}");
        }
        let e = decode(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeSchedulerConfiguration\n",
        )
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("kind"));
        let e =
            decode("apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n")
                .unwrap_err();
        assert!(e.why.contains("v1alpha2"), "{e:?}");
        // v1.37.2 has no v1alpha2 (k8s.io/kube-proxy/config holds v1alpha1 alone): the
        // message says so, not that it is alpha upstream.
        assert!(
            e.why
                .contains("defines kubeproxy.config.k8s.io/v1alpha1 alone")
                && !e.why.contains("alpha upstream"),
            "{e:?}"
        );
        let e = decode("kind: KubeProxyConfiguration\n").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("apiVersion"));
    }

    #[test]
    fn type_errors_name_the_field() {
        for (body, field) in [
            ("iptables:\n  masqueradeBit: x\n", "iptables.masqueradeBit"),
            ("configSyncPeriod: 15\n", "configSyncPeriod"),
            ("configSyncPeriod: 1 fortnight\n", "configSyncPeriod"),
            ("conntrack:\n  min: -1.5\n", "conntrack.min"),
            ("nodePortAddresses: 10.0.0.0/8\n", "nodePortAddresses"),
            ("oomScoreAdj: 99999999999\n", "oomScoreAdj"),
            ("ipvs: [1]\n", "ipvs[0]"),
            ("featureGates:\n  Foo: maybe\n", "featureGates.Foo"),
        ] {
            let e = decode(&format!("{HEAD}{body}")).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{body}: {e:?}");
        }
    }

    #[test]
    fn nulls_and_json() {
        let d = decode(&format!(
            "{HEAD}hostnameOverride: null\nconntrack: {{maxPerCore: null, min: 0}}\n"
        ))
        .unwrap();
        assert_eq!(d.config.hostname_override, "");
        assert_eq!(d.config.conntrack.max_per_core, None);
        assert_eq!(d.config.conntrack.min, Some(0));
        let d = decode(
            r#"{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"ipvs","logging":{"flushFrequency":1000000000}}"#,
        )
        .unwrap();
        assert_eq!(d.config.mode, "ipvs");
        assert_eq!(
            d.config.logging.flush_frequency.duration,
            GoDuration::secs(1)
        );
    }
}

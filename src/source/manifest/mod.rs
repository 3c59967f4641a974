//! The manifest source: a YAML file or a directory of them (multi-document, `kind: List`
//! accepted), holding v1 Services, discovery.k8s.io/v1 EndpointSlices, networking.k8s.io/v1
//! ServiceCIDRs and v1 Nodes. A
//! document that does not parse, is not UTF-8, or is of another kind, is reported with its
//! file and line and skipped. A path that is missing or unreadable, or a file that is not a
//! regular file or exceeds [`MAX_FILE_BYTES`], is a [`ManifestError`]: never read as an
//! empty cluster. Parsing is pure (here); reading the file system is `files.rs`
//! ([`ManifestCache::load`], [`fingerprint`]).

mod files;

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use serde_json::Value;

use super::Snapshot;

pub use files::{fingerprint, load, Fingerprint, ManifestCache};

/// The largest manifest file read: 256 MiB holds about 160k Services with 10 endpoints
/// each in the shape real EndpointSlices have (15.5 MB per 10k); anything larger is refused
/// with a message rather than read without bound.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// Why a manifest path could not be read. The caller keeps the last good state.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifests {path}: {error}")]
    Unreadable {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("manifests {path}: not a regular file or directory ({kind}); refused")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("manifests {path}: {size} bytes is more than the {limit}-byte limit; refused")]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
}

impl ManifestError {
    fn unreadable(path: &Path, error: std::io::Error) -> Self {
        ManifestError::Unreadable {
            path: path.to_path_buf(),
            error,
        }
    }
}

/// Splits a YAML stream into documents with the (1-based) line each starts at. Works on
/// bytes: a document that is not UTF-8 comes back as an error naming its first bad line,
/// and the other documents still parse.
fn split_documents(bytes: &[u8]) -> Vec<(usize, Result<String, String>)> {
    fn finish(
        docs: &mut Vec<(usize, Result<String, String>)>,
        start: usize,
        cur: &mut Vec<u8>,
        bad_line: &mut Option<usize>,
    ) {
        let doc = std::mem::take(cur);
        let res = match bad_line.take() {
            Some(l) => Err(format!("line {l} is not valid UTF-8")),
            None => String::from_utf8(doc).map_err(|_| "not valid UTF-8".to_string()),
        };
        docs.push((start, res));
    }
    let mut docs = Vec::new();
    let mut cur: Vec<u8> = Vec::new();
    let mut start = 1;
    let mut bad_line: Option<usize> = None;
    let mut lines = bytes.split(|b| *b == b'\n').enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        if lines.peek().is_none() && line.is_empty() {
            break; // what follows the final newline
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.starts_with(b"---") && (line.len() == 3 || matches!(line[3], b' ' | b'\t')) {
            finish(&mut docs, start, &mut cur, &mut bad_line);
            start = i + 2;
            continue;
        }
        if line.starts_with(b"...") && line.trim_ascii_end() == b"..." {
            continue;
        }
        if bad_line.is_none() && std::str::from_utf8(line).is_err() {
            bad_line = Some(i + 1);
        }
        cur.extend_from_slice(line);
        cur.push(b'\n');
    }
    finish(&mut docs, start, &mut cur, &mut bad_line);
    docs.into_iter()
        .filter(|(_, d)| match d {
            Ok(d) => d
                .lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')),
            Err(_) => true,
        })
        .collect()
}

/// A field's value for messages: the string itself, anything else as JSON shows it.
fn shown(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "(missing)".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Decodes `v` as `T`; the error names the field (`spec.ports[0].port: invalid type …`).
fn decode<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        field_error(&path, inner.to_string())
    })
}

fn field_error(path: &str, inner: String) -> String {
    if path == "." {
        inner
    } else {
        format!("field {path}: {inner}")
    }
}

/// One object of a manifest: a YAML document's value tree, or the text of a JSON object, which
/// is decoded straight into its type (a 28 MB JSON `List` of 10k Services and slices took
/// 3.7 s through the YAML parser's value tree).
enum Object<'a> {
    Yaml(Value),
    Json(&'a serde_json::value::RawValue),
}

/// What dispatch needs of a JSON object; the rest of it is skipped unread.
/// Every field is taken as it comes (any JSON value), so that the head of any JSON object
/// reads, and an odd field is worded as the YAML path words it.
#[derive(serde::Deserialize)]
struct JsonHead<'a> {
    #[serde(rename = "apiVersion")]
    api_version: Option<Value>,
    kind: Option<Value>,
    metadata: Option<Value>,
    #[serde(borrow)]
    items: Option<&'a serde_json::value::RawValue>,
}

/// An object's apiVersion, kind (as found, and as shown in messages), `namespace/name`,
/// and its `items` when it has them.
struct Head<'a> {
    api: Option<String>,
    kind: Option<String>,
    shown_api: String,
    shown_kind: String,
    object: String,
    items: Option<Vec<Object<'a>>>,
}

impl<'a> Object<'a> {
    fn head(&self) -> Result<Head<'a>, String> {
        match self {
            Object::Yaml(v) => {
                let meta = v.get("metadata");
                let name = shown(meta.and_then(|m| m.get("name")));
                let ns = meta
                    .and_then(|m| m.get("namespace"))
                    .and_then(Value::as_str);
                Ok(Head {
                    api: v
                        .get("apiVersion")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    kind: v.get("kind").and_then(Value::as_str).map(str::to_string),
                    shown_api: shown(v.get("apiVersion")),
                    shown_kind: shown(v.get("kind")),
                    object: ns.map_or(name.clone(), |ns| format!("{ns}/{name}")),
                    items: match v.get("items") {
                        Some(Value::Array(items)) => {
                            Some(items.iter().cloned().map(Object::Yaml).collect())
                        }
                        _ => None,
                    },
                })
            }
            Object::Json(raw) => {
                let h: JsonHead<'a> = serde_json::from_str(raw.get()).map_err(json_message)?;
                let meta = h.metadata.as_ref();
                let name = shown(meta.and_then(|m| m.get("name")));
                let ns = meta
                    .and_then(|m| m.get("namespace"))
                    .and_then(Value::as_str);
                let as_string =
                    |v: &Option<Value>| v.as_ref().and_then(Value::as_str).map(str::to_string);
                Ok(Head {
                    api: as_string(&h.api_version),
                    kind: as_string(&h.kind),
                    shown_api: shown(h.api_version.as_ref()),
                    shown_kind: shown(h.kind.as_ref()),
                    object: ns.map_or(name.clone(), |ns| format!("{ns}/{name}")),
                    items: h
                        .items
                        .and_then(|i| {
                            serde_json::from_str::<Vec<&'a serde_json::value::RawValue>>(i.get())
                                .ok()
                        })
                        .map(|v| v.into_iter().map(Object::Json).collect()),
                })
            }
        }
    }

    fn decode<T: serde::de::DeserializeOwned>(self) -> Result<T, String> {
        match self {
            Object::Yaml(v) => decode(v),
            Object::Json(raw) => {
                let mut de = serde_json::Deserializer::from_str(raw.get());
                serde_path_to_error::deserialize(&mut de).map_err(|e| {
                    let path = e.path().to_string();
                    field_error(&path, json_message(e.into_inner()))
                })
            }
        }
    }
}

/// A JSON error without its position: that is within the object, not the file, and the
/// message already names the object and the field.
fn json_message(e: serde_json::Error) -> String {
    let s = e.to_string();
    match s.rsplit_once(" at line ") {
        Some((msg, _)) => msg.to_string(),
        None => s,
    }
}

fn add_object(
    v: Object<'_>,
    whence: &str,
    node_name: &str,
    snap: &mut Snapshot,
    warnings: &mut Vec<String>,
) {
    let h = match v.head() {
        Ok(h) => h,
        Err(e) => {
            warnings.push(format!("{whence}: {e}; skipped"));
            return;
        }
    };
    let object = &h.object;
    let bad = |kind: &str, e: String| format!("{whence}: {kind} {object}: {e}; skipped");
    match (h.api.as_deref(), h.kind.as_deref()) {
        (_, Some("List")) => {
            for (i, item) in h.items.into_iter().flatten().enumerate() {
                add_object(item, &format!("{whence} item {i}"), node_name, snap, warnings);
            }
        }
        (Some("v1"), Some("Service")) => match v.decode::<Service>() {
            Ok(s) => snap.services.push(s),
            Err(e) => warnings.push(bad("Service", e)),
        },
        (Some("discovery.k8s.io/v1"), Some("EndpointSlice")) => {
            match v.decode::<EndpointSlice>() {
                Ok(s) => snap.endpoint_slices.push(s),
                Err(e) => warnings.push(bad("EndpointSlice", e)),
            }
        }
        (Some("networking.k8s.io/v1"), Some("ServiceCIDR")) => match v.decode::<ServiceCIDR>() {
            Ok(c) => snap.service_cidrs.push(c),
            Err(e) => warnings.push(bad("ServiceCIDR", e)),
        },
        (Some("v1"), Some("Node")) => match v.decode::<Node>() {
            Ok(n) => {
                if n.metadata.name.as_deref() == Some(node_name) {
                    snap.node = Some(n);
                }
            }
            Err(e) => warnings.push(bad("Node", e)),
        },
        _ => warnings.push(format!(
            "{whence}: apiVersion {} kind {} ({object}) is not a v1 Service, discovery.k8s.io/v1 EndpointSlice, networking.k8s.io/v1 ServiceCIDR or v1 Node; skipped",
            h.shown_api, h.shown_kind,
        )),
    }
}

/// The `apiVersion` and `kind` of a block-style document, when both are top-level lines of
/// their own (`kind: Service` at column 0, a plain value, nothing after it) and appear once:
/// a line at column 0 of a block mapping is one of its keys. Anything else (flow style,
/// quotes, comments, a repeated key) is `None`. Pure, one pass over the lines.
fn sniff_head(doc: &str) -> Option<(&str, &str)> {
    fn plain(v: &str) -> Option<&str> {
        let ok = !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"./-".contains(&b));
        ok.then_some(v)
    }
    let (mut api, mut kind) = (None, None);
    for l in doc.lines() {
        if let Some(v) = l.strip_prefix("apiVersion: ") {
            if api.is_some() {
                return None;
            }
            api = Some(plain(v.trim_end())?);
        } else if let Some(v) = l.strip_prefix("kind: ") {
            if kind.is_some() {
                return None;
            }
            kind = Some(plain(v.trim_end())?);
        }
    }
    Some((api?, kind?))
}

/// Decodes a document of a kind we read straight into its type, without the YAML parser's
/// value tree, which doubles the work (10k realistic Services and slices, 26 MB: 0.98 s
/// instead of 1.45 s; `examples/yaml_decoders.rs`). Returns whether it did; a document it
/// cannot place, or that does not decode, goes the value-tree way, which words every
/// message as before.
fn decoded_directly(doc: &str, node_name: &str, snap: &mut Snapshot) -> bool {
    fn typed<T: serde::de::DeserializeOwned>(doc: &str) -> Option<T> {
        super::yaml::from_str(doc).ok()
    }
    match sniff_head(doc) {
        Some(("v1", "Service")) => typed(doc).map(|o| snap.services.push(o)).is_some(),
        Some(("discovery.k8s.io/v1", "EndpointSlice")) => {
            typed(doc).map(|o| snap.endpoint_slices.push(o)).is_some()
        }
        Some(("networking.k8s.io/v1", "ServiceCIDR")) => {
            typed(doc).map(|o| snap.service_cidrs.push(o)).is_some()
        }
        Some(("v1", "Node")) => typed::<Node>(doc)
            .map(|n| {
                if n.metadata.name.as_deref() == Some(node_name) {
                    snap.node = Some(n);
                }
            })
            .is_some(),
        _ => false,
    }
}

/// A file that is one JSON object (what `kubectl get -o json` writes), decoded without the
/// YAML parser. `None` when it is not: it then goes the YAML way (JSON is YAML), which
/// also words its errors.
fn json_object(bytes: &[u8]) -> Option<&serde_json::value::RawValue> {
    let text = std::str::from_utf8(bytes).ok()?;
    if !text.trim_start().starts_with('{') {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// Parses one file's text into `snap`, collecting warnings. Pure.
pub fn parse_manifest(
    text: &str,
    file: &str,
    node_name: &str,
    snap: &mut Snapshot,
    warnings: &mut Vec<String>,
) {
    parse_manifest_bytes(text.as_bytes(), file, node_name, snap, warnings)
}

/// [`parse_manifest`] of a file's bytes: a document with invalid UTF-8 is skipped with a
/// warning naming its position; the rest still apply. Pure.
pub fn parse_manifest_bytes(
    bytes: &[u8],
    file: &str,
    node_name: &str,
    snap: &mut Snapshot,
    warnings: &mut Vec<String>,
) {
    if let Some(raw) = json_object(bytes) {
        add_object(
            Object::Json(raw),
            &format!("{file}:1"),
            node_name,
            snap,
            warnings,
        );
        return;
    }
    let docs = split_documents(bytes);
    // Documents decode independently: a large file's are split over the cores (26 MB of
    // realistic YAML, 20k documents, is ~1 s of libyaml on one core), each part into a
    // snapshot and warnings of its own, joined in document order.
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_DECODE_THREADS)
        .min(docs.len() / MIN_DOCUMENTS_PER_THREAD)
        .max(1);
    decode_in_parts(&docs, workers, file, node_name, snap, warnings);
}

/// [`parse_documents`] on `workers` threads, each a contiguous part of `docs`, the parts
/// joined in order (a later part's Node replaces an earlier one's, as in one pass). Pure.
fn decode_in_parts(
    docs: &[(usize, Result<String, String>)],
    workers: usize,
    file: &str,
    node_name: &str,
    snap: &mut Snapshot,
    warnings: &mut Vec<String>,
) {
    if workers <= 1 {
        parse_documents(docs, file, node_name, snap, warnings);
        return;
    }
    let per = docs.len().div_ceil(workers).max(1);
    let parts: Vec<(Snapshot, Vec<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = docs
            .chunks(per)
            .map(|part| {
                scope.spawn(move || {
                    let (mut snap, mut warnings) = (Snapshot::default(), Vec::new());
                    parse_documents(part, file, node_name, &mut snap, &mut warnings);
                    (snap, warnings)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for (part, w) in parts {
        snap.services.extend(part.services);
        snap.endpoint_slices.extend(part.endpoint_slices);
        snap.service_cidrs.extend(part.service_cidrs);
        if part.node.is_some() {
            snap.node = part.node;
        }
        warnings.extend(w);
    }
}

/// Most threads one file's documents are decoded on.
const MAX_DECODE_THREADS: usize = 8;
/// Fewest documents worth a thread of their own (a thread costs ~20 µs; a document ~50 µs).
const MIN_DOCUMENTS_PER_THREAD: usize = 256;

/// Decodes `docs` (from [`split_documents`]) into `snap`, in order. Pure.
fn parse_documents(
    docs: &[(usize, Result<String, String>)],
    file: &str,
    node_name: &str,
    snap: &mut Snapshot,
    warnings: &mut Vec<String>,
) {
    for (line, doc) in docs {
        let line = *line;
        let whence = format!("{file}:{line}");
        let doc = match doc {
            Ok(d) => d,
            Err(why) => {
                warnings.push(format!("{whence}: document {why}; skipped"));
                continue;
            }
        };
        if let Err(at) = super::yaml::check_depth(doc) {
            warnings.push(format!(
                "{file}:{}: document nests deeper than {} levels; skipped",
                line + at - 1,
                super::yaml::MAX_DEPTH
            ));
            continue;
        }
        if decoded_directly(doc, node_name, snap) {
            continue;
        }
        match super::yaml::from_str::<Value>(doc) {
            Ok(Value::Null) => {}
            Ok(v @ Value::Object(_)) => {
                add_object(Object::Yaml(v), &whence, node_name, snap, warnings)
            }
            Ok(_) => warnings.push(format!("{whence}: document is not an object; skipped")),
            Err(e) => {
                let at = e
                    .location()
                    .map(|l| format!("{file}:{}", line + (l.line() as usize).max(1) - 1))
                    .unwrap_or(whence);
                warnings.push(format!(
                    "{at}: YAML error: {}; document skipped",
                    super::yaml::error_message(&e)
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Documents decoded in parts on several threads give what decoding them one after
    /// another gives: the same objects in the same order, the same warnings with the same
    /// lines, the last Node of this name (on any number of cores: the parts are forced).
    #[test]
    fn a_large_file_decoded_in_parts_equals_one_pass() {
        let mut text = String::new();
        for i in 0..1200 {
            match i {
                400 => text.push_str("kind: [unclosed\n"),
                700 => text.push_str("apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {at: a}}\n"),
                1100 => text.push_str("apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {at: b}}\n"),
                _ => text.push_str(&format!(
                    "apiVersion: v1\nkind: Service\nmetadata:\n  name: s{i}\n  namespace: ns\nspec:\n  clusterIP: 10.96.{}.{}\n  ports:\n  - port: 80\n",
                    i / 250,
                    i % 250 + 1
                )),
            }
            text.push_str("---\n");
        }
        let docs = split_documents(text.as_bytes());
        let (mut whole, mut w_whole) = (Snapshot::default(), Vec::new());
        decode_in_parts(&docs, 3, "f.yaml", "n1", &mut whole, &mut w_whole);
        let (mut one, mut w_one) = (Snapshot::default(), Vec::new());
        parse_documents(&docs, "f.yaml", "n1", &mut one, &mut w_one);
        // The file as the daemon reads it (threads as this machine has cores) agrees too.
        let (mut file, mut w_file) = (Snapshot::default(), Vec::new());
        parse_manifest(&text, "f.yaml", "n1", &mut file, &mut w_file);
        assert_eq!((&file.services, &w_file), (&one.services, &w_one));
        assert_eq!(whole.services.len(), 1197);
        assert_eq!(whole.services, one.services);
        assert_eq!(
            whole.services[500].metadata.name.as_deref(),
            Some("s501"),
            "document order kept"
        );
        assert_eq!(w_whole, w_one);
        assert_eq!(w_whole.len(), 1, "{w_whole:?}");
        assert!(w_whole[0].starts_with("f.yaml:"), "{w_whole:?}");
        let at = |s: &Snapshot| {
            s.node
                .as_ref()
                .and_then(|n| n.metadata.labels.as_ref())
                .and_then(|l| l.get("at").cloned())
        };
        assert_eq!(at(&whole), Some("b".into()), "the last Node wins");
        assert_eq!(at(&whole), at(&one));
    }

    const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: svc1, namespace: ns1}
spec:
  clusterIP: 172.30.0.41
  ports: [{name: p80, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc1-abc
  namespace: ns1
  labels: {kubernetes.io/service-name: svc1}
addressType: IPv4
ports: [{name: p80, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.180.0.1]
  nodeName: node1
---
apiVersion: v1
kind: Node
metadata: {name: node1, labels: {topology.kubernetes.io/zone: a}}
---
apiVersion: v1
kind: Node
metadata: {name: node2}
"#;

    #[test]
    fn parses_objects_and_keeps_only_our_node() {
        let mut s = Snapshot::default();
        let mut w = Vec::new();
        parse_manifest(GOOD, "c.yaml", "node1", &mut s, &mut w);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(s.services.len(), 1);
        assert_eq!(s.endpoint_slices.len(), 1);
        assert_eq!(s.node.unwrap().metadata.name.as_deref(), Some("node1"));
    }

    #[test]
    fn bad_documents_are_reported_with_position_and_skipped() {
        let text = format!(
            "{GOOD}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n---\nkey: [unclosed\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: bad}}\nspec: {{ports: 7}}\n"
        );
        let mut s = Snapshot::default();
        let mut w = Vec::new();
        parse_manifest(&text, "c.yaml", "node1", &mut s, &mut w);
        assert_eq!(s.services.len(), 1, "the good Service still applies");
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(
            w[0].starts_with("c.yaml:29:") && w[0].contains("ConfigMap"),
            "{w:?}"
        );
        assert!(w[1].contains("YAML error"), "{w:?}");
        assert!(
            w[2].starts_with("c.yaml:35:")
                && w[2].contains("Service bad: field spec.ports: invalid type"),
            "{w:?}"
        );
    }

    #[test]
    fn cache_reparses_only_changed_files() {
        let dir = std::env::temp_dir().join(format!("nlp-mc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svc = |n: &str| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {n}}}\nspec: {{clusterIP: 10.0.0.1}}\n")
        };
        std::fs::write(dir.join("a.yaml"), svc("a")).unwrap();
        std::fs::write(dir.join("b.yaml"), svc("b")).unwrap();
        let mut c = ManifestCache::new();
        let (s, _) = c.load(&dir, "n").unwrap();
        assert_eq!(s.services.len(), 2);
        std::fs::write(dir.join("b.yaml"), svc("b2") + "---\n" + &svc("b3")).unwrap();
        std::fs::remove_file(dir.join("a.yaml")).unwrap();
        let (s, _) = c.load(&dir, "n").unwrap();
        let names: Vec<_> = s
            .services
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["b2", "b3"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn list_kind_is_unpacked() {
        let text = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a}\n  spec: {clusterIP: 10.0.0.1}\n";
        let mut s = Snapshot::default();
        let mut w = Vec::new();
        parse_manifest(text, "l.yaml", "n", &mut s, &mut w);
        assert_eq!(s.services.len(), 1);
        assert!(w.is_empty());
    }

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nlp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path and a mode.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0, "mkfifo {}", p.display());
    }

    #[test]
    fn a_missing_or_looping_path_is_an_error_not_an_empty_cluster() {
        let d = tempdir("missing");
        let err = load(&d.join("nope.yaml"), "n").unwrap_err();
        assert!(matches!(err, ManifestError::Unreadable { .. }), "{err}");
        assert!(err.to_string().contains("nope.yaml"), "{err}");
        std::os::unix::fs::symlink(d.join("loop"), d.join("loop")).unwrap();
        assert!(load(&d.join("loop"), "n").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn fifos_and_devices_are_refused_without_reading() {
        let d = tempdir("fifo");
        let fifo = d.join("m.yaml");
        mkfifo(&fifo);
        let t0 = std::time::Instant::now();
        let err = load(&fifo, "n").unwrap_err();
        assert!(err.to_string().contains("a FIFO"), "{err}");
        let err = load(Path::new("/dev/zero"), "n").unwrap_err();
        assert!(err.to_string().contains("character device"), "{err}");
        // In a directory the FIFO is a warning; the other files still load.
        std::fs::write(d.join("a.yaml"), GOOD).unwrap();
        let (s, w) = load(&d, "node1").unwrap();
        assert_eq!(s.services.len(), 1);
        assert!(w.iter().any(|w| w.contains("a FIFO")), "{w:?}");
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "never blocks"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn files_over_the_limit_are_refused_with_the_limit_named() {
        let d = tempdir("large");
        let f = d.join("big.yaml");
        std::fs::File::create(&f)
            .unwrap()
            .set_len(MAX_FILE_BYTES + 1)
            .unwrap();
        let err = load(&f, "n").unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("{MAX_FILE_BYTES}-byte limit")),
            "{err}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_turned_unreadable_in_a_directory_keeps_what_it_held() {
        let d = tempdir("keep");
        std::fs::write(d.join("a.yaml"), GOOD).unwrap();
        let mut c = ManifestCache::new();
        assert_eq!(c.load(&d, "node1").unwrap().0.services.len(), 1);
        std::fs::remove_file(d.join("a.yaml")).unwrap();
        mkfifo(&d.join("a.yaml"));
        let (s, w) = c.load(&d, "node1").unwrap();
        assert_eq!(s.services.len(), 1, "last good content of a.yaml kept");
        assert!(
            w.iter().any(|w| w.contains("keeping what it held")),
            "{w:?}"
        );
        std::fs::remove_file(d.join("a.yaml")).unwrap();
        assert!(
            c.load(&d, "node1").unwrap().0.services.is_empty(),
            "removed: gone"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn invalid_utf8_skips_only_its_document() {
        let mut bytes = GOOD.as_bytes().to_vec();
        bytes.extend_from_slice(b"---\napiVersion: v1\nkind: Service\nmetadata: {name: bad\xff}\n");
        bytes.extend_from_slice(b"---\r\napiVersion: v1\r\nkind: Service\r\nmetadata: {name: crlf}\r\nspec: {clusterIP: 10.0.0.9}\r\n");
        let (mut s, mut w) = (Snapshot::default(), Vec::new());
        parse_manifest_bytes(&bytes, "u.yaml", "node1", &mut s, &mut w);
        let names: Vec<_> = s
            .services
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        assert_eq!(names, ["svc1", "crlf"], "{w:?}");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("u.yaml:29:") && w[0].contains("line 31 is not valid UTF-8"),
            "{w:?}"
        );
    }

    #[test]
    fn deeply_nested_documents_are_skipped_quickly_and_the_rest_applies() {
        let deep = "{a: ".repeat(50_000) + &"}".repeat(50_000);
        let text = format!("{GOOD}---\n{deep}\n");
        let t0 = std::time::Instant::now();
        let (mut s, mut w) = (Snapshot::default(), Vec::new());
        parse_manifest(&text, "d.yaml", "node1", &mut s, &mut w);
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(s.services.len(), 1);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("d.yaml:29:")
                && w[0].contains(&format!("deeper than {}", super::super::yaml::MAX_DEPTH)),
            "{w:?}"
        );
    }

    #[test]
    fn a_document_of_exploding_aliases_is_skipped_and_the_rest_applies() {
        let mut laughs = String::from("apiVersion: v1\nkind: Service\nmetadata: {name: lol}\nx0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            laughs += &format!("x{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n");
        }
        let text = format!("{GOOD}---\n{laughs}");
        let (mut s, mut w) = (Snapshot::default(), Vec::new());
        parse_manifest(&text, "l.yaml", "node1", &mut s, &mut w);
        assert_eq!(s.services.len(), 1, "{w:?}");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("l.yaml:") && w[0].contains("YAML error") && w[0].contains("skipped"),
            "{w:?}"
        );
    }

    #[test]
    fn messages_name_the_object_and_the_field() {
        let text = "apiVersion: v1\nkind: 7\nmetadata: {name: seven}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns}\nspec:\n  ports:\n  - port: eighty\n";
        let (mut s, mut w) = (Snapshot::default(), Vec::new());
        parse_manifest(text, "m.yaml", "n", &mut s, &mut w);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("apiVersion v1 kind 7 (seven)"), "{w:?}");
        assert!(
            w[1].starts_with("m.yaml:5: Service ns/web: field spec.ports[0].port:"),
            "{w:?}"
        );
    }

    /// `GOOD` as one JSON `List`, with a broken Service and an object of another kind.
    fn good_as_json_list() -> String {
        let mut items: Vec<serde_json::Value> = GOOD
            .split("\n---\n")
            .map(|d| crate::source::yaml::from_str(d).unwrap())
            .collect();
        items.push(serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"ports": [{"port": "eighty"}]}}));
        items.push(serde_json::json!({"apiVersion": "v1", "kind": 7, "metadata": "odd"}));
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
    }

    #[test]
    fn a_json_file_is_decoded_without_the_yaml_parser_to_the_same_objects() {
        let json = good_as_json_list();
        let (mut js, mut jw) = (Snapshot::default(), Vec::new());
        assert!(
            json_object(json.as_bytes()).is_some(),
            "takes the JSON path"
        );
        parse_manifest(&json, "c.json", "node1", &mut js, &mut jw);
        let (mut ys, mut yw) = (Snapshot::default(), Vec::new());
        parse_manifest(GOOD, "c.yaml", "node1", &mut ys, &mut yw);
        assert_eq!(js.services, ys.services);
        assert_eq!(js.endpoint_slices, ys.endpoint_slices);
        assert_eq!(js.node, ys.node);
        assert_eq!(jw.len(), 2, "{jw:?}");
        assert!(
            jw[0].starts_with("c.json:1 item 4: Service ns/web: field spec.ports[0].port: invalid type: string \"eighty\"")
                && !jw[0].contains(" at line "),
            "{jw:?}"
        );
        assert!(
            jw[1].starts_with("c.json:1 item 5: apiVersion v1 kind 7 ((missing))"),
            "{jw:?}"
        );
        // The same file through the YAML parser (JSON is YAML) says the same.
        let (mut s2, mut w2) = (Snapshot::default(), Vec::new());
        parse_manifest(
            &format!("# yaml\n{json}"),
            "c.json",
            "node1",
            &mut s2,
            &mut w2,
        );
        assert_eq!(s2.services, js.services);
        assert_eq!(w2.len(), 2, "{w2:?}");
        assert!(w2[1].contains("apiVersion v1 kind 7 ((missing))"), "{w2:?}");
    }

    #[test]
    fn broken_json_goes_the_yaml_way_and_is_named_with_its_line() {
        let text =
            "{\"apiVersion\": \"v1\",\n \"kind\": \"Service\",\n \"metadata\": {\"name\": \"x\"";
        assert!(json_object(text.as_bytes()).is_none());
        let (mut s, mut w) = (Snapshot::default(), Vec::new());
        parse_manifest(text, "b.json", "n", &mut s, &mut w);
        assert!(s.services.is_empty());
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("b.json:") && w[0].contains("YAML error"),
            "{w:?}"
        );
    }

    #[test]
    fn only_plain_top_level_heads_are_sniffed() {
        let ok = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n";
        assert_eq!(sniff_head(ok), Some(("v1", "Service")));
        for odd in [
            "apiVersion: v1\nkind: \"Service\"\n",
            "apiVersion: v1\nkind: Service # a comment\n",
            "apiVersion: v1\nkind: Service\nkind: Node\n",
            "{apiVersion: v1, kind: Service}\n",
            "apiVersion: v1\n  kind: Service\n",
            "kind: Service\n",
        ] {
            assert_eq!(sniff_head(odd), None, "{odd:?}");
        }
    }

    #[test]
    fn documents_decoded_directly_equal_the_value_tree_way() {
        for doc in GOOD.split("\n---\n") {
            let (mut direct, mut tree) = (Snapshot::default(), Snapshot::default());
            assert!(decoded_directly(doc, "node1", &mut direct), "{doc}");
            let v: Value = crate::source::yaml::from_str(doc).unwrap();
            let mut w = Vec::new();
            add_object(Object::Yaml(v), "x", "node1", &mut tree, &mut w);
            assert!(w.is_empty(), "{w:?}");
            assert_eq!(direct.services, tree.services);
            assert_eq!(direct.endpoint_slices, tree.endpoint_slices);
            assert_eq!(direct.node, tree.node);
        }
        // A broken one is left to the value-tree way, which names the field.
        let bad = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: eighty}]}\n";
        assert!(!decoded_directly(bad, "n", &mut Snapshot::default()));
    }

    #[test]
    fn service_cidrs_are_read_and_bad_ones_named() {
        let text = "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec: {cidrs: [10.96.0.0/12, 'fd00:96::/108']}\n---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: extra}\nspec: {cidrs: [10.96.0.0/12, nonsense]}\n";
        let (mut s, mut w) = (Snapshot::default(), Vec::new());
        parse_manifest(text, "c.yaml", "n", &mut s, &mut w);
        assert!(w.is_empty(), "{w:?}");
        let (st, w) = crate::source::convert::build_state(&s, "n", &Default::default());
        let got: Vec<String> = st.service_cidrs.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            got,
            ["10.96.0.0/12", "fd00:96::/108"],
            "union, deduplicated"
        );
        assert!(
            w.iter().any(|w| w
                .to_string()
                .contains("ServiceCIDR extra: field spec.cidrs: \"nonsense\"")),
            "{w:?}"
        );
    }
}

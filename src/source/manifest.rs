//! The manifest source: a YAML file or a directory of them (multi-document, `kind: List`
//! accepted), holding v1 Services, discovery.k8s.io/v1 EndpointSlices and v1 Nodes. A
//! document that does not parse, or is of another kind, is reported with its file and line
//! and skipped. Parsing is pure; [`load`] and [`fingerprint`] read the file system.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_yaml::Value;

use super::Snapshot;

/// Splits a YAML stream into documents with the (1-based) line each starts at.
fn split_documents(text: &str) -> Vec<(usize, String)> {
    let mut docs = Vec::new();
    let mut cur = String::new();
    let mut start = 1;
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("---") && (line.len() == 3 || line[3..].starts_with([' ', '\t'])) {
            docs.push((start, std::mem::take(&mut cur)));
            start = i + 2;
            continue;
        }
        if line.starts_with("...") && line.trim_end() == "..." {
            continue;
        }
        cur.push_str(line);
        cur.push('\n');
    }
    docs.push((start, cur));
    docs.into_iter()
        .filter(|(_, d)| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .collect()
}

fn add_object(
    v: Value,
    whence: &str,
    node_name: &str,
    snap: &mut Snapshot,
    warnings: &mut Vec<String>,
) {
    let api = v
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let kind = v
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match (api.as_str(), kind.as_str()) {
        (_, "List") => {
            if let Some(Value::Sequence(items)) = v.get("items").cloned() {
                for (i, item) in items.into_iter().enumerate() {
                    add_object(item, &format!("{whence} item {i}"), node_name, snap, warnings);
                }
            }
        }
        ("v1", "Service") => match serde_yaml::from_value::<Service>(v) {
            Ok(s) => snap.services.push(s),
            Err(e) => warnings.push(format!("{whence}: invalid Service: {e}; skipped")),
        },
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            match serde_yaml::from_value::<EndpointSlice>(v) {
                Ok(s) => snap.endpoint_slices.push(s),
                Err(e) => warnings.push(format!("{whence}: invalid EndpointSlice: {e}; skipped")),
            }
        }
        ("v1", "Node") => match serde_yaml::from_value::<Node>(v) {
            Ok(n) => {
                if n.metadata.name.as_deref() == Some(node_name) {
                    snap.node = Some(n);
                }
            }
            Err(e) => warnings.push(format!("{whence}: invalid Node: {e}; skipped")),
        },
        _ => warnings.push(format!(
            "{whence}: {api}/{kind} is not a v1 Service, discovery.k8s.io/v1 EndpointSlice or v1 Node; skipped"
        )),
    }
}

/// Parses one file's text into `snap`, collecting warnings. Pure.
pub fn parse_manifest(
    text: &str,
    file: &str,
    node_name: &str,
    snap: &mut Snapshot,
    warnings: &mut Vec<String>,
) {
    for (line, doc) in split_documents(text) {
        let whence = format!("{file}:{line}");
        match serde_yaml::from_str::<Value>(&doc) {
            Ok(Value::Null) => {}
            Ok(v @ Value::Mapping(_)) => add_object(v, &whence, node_name, snap, warnings),
            Ok(_) => warnings.push(format!("{whence}: document is not an object; skipped")),
            Err(e) => {
                let at = e
                    .location()
                    .map(|l| format!("{file}:{}", line + l.line() - 1))
                    .unwrap_or(whence);
                warnings.push(format!("{at}: YAML error: {e}; document skipped"));
            }
        }
    }
}

fn manifest_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("yaml" | "yml" | "json")
                    )
            })
            .collect();
        v.sort();
        Ok(v)
    } else {
        Ok(vec![path.to_path_buf()])
    }
}

/// Reads every manifest under `path`. An unreadable file is a warning; a missing path is an
/// error.
pub fn load(path: &Path, node_name: &str) -> std::io::Result<(Snapshot, Vec<String>)> {
    ManifestCache::new().load(path, node_name)
}

type FileKey = (u64, Option<SystemTime>, u64);

fn file_key(m: &std::fs::Metadata) -> FileKey {
    use std::os::unix::fs::MetadataExt;
    (m.len(), m.modified().ok(), m.ino())
}

/// Parsed manifests, kept per file so a reload re-parses only the files that changed
/// (a directory with one file per object then reloads in time proportional to the change).
#[derive(Debug, Default)]
pub struct ManifestCache {
    files: std::collections::BTreeMap<PathBuf, (FileKey, Snapshot, Vec<String>)>,
}

impl ManifestCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Like [`load`], reusing what did not change since the last call.
    pub fn load(
        &mut self,
        path: &Path,
        node_name: &str,
    ) -> std::io::Result<(Snapshot, Vec<String>)> {
        let files = manifest_files(path)?;
        let mut keep = std::collections::BTreeSet::new();
        for f in files {
            let key = match std::fs::metadata(&f) {
                Ok(m) => file_key(&m),
                Err(e) => {
                    self.files.insert(
                        f.clone(),
                        (
                            (0, None, 0),
                            Snapshot::default(),
                            vec![format!("{}: {e}; skipped", f.display())],
                        ),
                    );
                    keep.insert(f);
                    continue;
                }
            };
            keep.insert(f.clone());
            if self
                .files
                .get(&f)
                .is_some_and(|(k, _, _)| *k == key && key.1.is_some())
            {
                continue;
            }
            let mut snap = Snapshot::default();
            let mut warnings = Vec::new();
            match std::fs::read_to_string(&f) {
                Ok(text) => parse_manifest(
                    &text,
                    &f.display().to_string(),
                    node_name,
                    &mut snap,
                    &mut warnings,
                ),
                Err(e) => warnings.push(format!("{}: {e}; skipped", f.display())),
            }
            self.files.insert(f, (key, snap, warnings));
        }
        self.files.retain(|f, _| keep.contains(f));
        let mut out = Snapshot::default();
        let mut warnings = Vec::new();
        for (_, s, w) in self.files.values() {
            out.services.extend(s.services.iter().cloned());
            out.endpoint_slices
                .extend(s.endpoint_slices.iter().cloned());
            if s.node.is_some() {
                out.node = s.node.clone();
            }
            warnings.extend(w.iter().cloned());
        }
        Ok((out, warnings))
    }
}

/// What identifies the current content of the manifests: file names, sizes, mtimes and
/// inodes (a file replaced by rename gets a new inode).
pub type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>, u64)>;

/// Reads the fingerprint; polled to notice edits and replacements.
pub fn fingerprint(path: &Path) -> Fingerprint {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    if let Ok(meta) = std::fs::metadata(path) {
        out.push((
            path.to_path_buf(),
            meta.len(),
            meta.modified().ok(),
            meta.ino(),
        ));
    }
    for f in manifest_files(path).unwrap_or_default() {
        if let Ok(m) = std::fs::metadata(&f) {
            out.push((f, m.len(), m.modified().ok(), m.ino()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
            w[2].starts_with("c.yaml:35:") && w[2].contains("invalid Service"),
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
}

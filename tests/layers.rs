//! The layout's import rules, checked on the source text: each layer imports only the layers
//! below it, a mode never imports another mode, and no module imports, directly or through
//! others, a module that imports it back. `crate::` paths are what is checked (the crate
//! uses no `crate::{a, b}` groups; the test fails if one appears). Pure: reads `src/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

mod source;
use source::rust_files;

/// The module a file belongs to, two levels deep (`modes::ipvs`, `kernel::nft`, `proxy`).
fn module_of(root: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(root).expect("under src");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file");
    let stem = last.trim_end_matches(".rs").to_string();
    if stem != "mod" && stem != "lib" && stem != "main" {
        parts.push(stem);
    }
    unit(&parts)
}

/// The unit a path names: two segments for `modes` and `kernel`, one otherwise.
fn unit(parts: &[String]) -> String {
    match parts.first().map(String::as_str) {
        None => "crate".into(),
        Some(top @ ("modes" | "kernel")) => match parts.get(1) {
            Some(sub) => format!("{top}::{sub}"),
            None => top.into(),
        },
        Some(top) => top.into(),
    }
}

/// Every `crate::a::b` path in `text`, as the unit it names.
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // `kube_nlproxy_crate::` or similar: not ours
        }
        assert!(
            !rest.starts_with('{'),
            "crate::{{...}} groups are not checked; split them"
        );
        let path: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let parts: Vec<String> = path
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        out.insert(unit(&parts));
    }
    out
}

/// The layer of a unit: a unit may import only units of a lower layer or its own unit.
/// `model::net` is part of `model`, which every layer may use.
fn layer(unit: &str) -> u8 {
    match unit.split("::").next().unwrap_or(unit) {
        // The process's allocator and its counters: every layer may read them.
        "model" | "allocator" => 0,
        "kernel" => 1,
        "proxy" => 2,
        "modes" | "source" => 3,
        "config" => 4,
        // What the daemon serves (`/configz`, `/flagz`, `/statusz`) renders the config, and
        // the operator tools (explain, status, diff) read the config and the kernel.
        "serve" | "tools" => 5,
        "app" => 6,
        // The fuzz entry points drive decoders of every layer, the tools' explain included.
        "fuzz" => 6,
        "crate" | "main" | "lib" => 7,
        other => panic!("unit {other} has no layer: add it to tests/layers.rs"),
    }
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("readable source");
        let from = module_of(&root, &f);
        let e = g.entry(from.clone()).or_default();
        for to in imports(&text) {
            if to != from {
                e.insert(to);
            }
        }
    }
    g
}

#[test]
fn each_layer_imports_only_layers_below_it() {
    let mut bad = Vec::new();
    for (from, tos) in graph() {
        for to in tos {
            let (lf, lt) = (layer(&from), layer(&to));
            // Kernel clients may share each other's codec helpers (one socket layer).
            let same_layer_ok = lf == lt && (from.starts_with("kernel") || lf >= 5);
            if lt > lf || (lt == lf && !same_layer_ok) {
                bad.push(format!("{from} imports {to}"));
            }
        }
    }
    assert!(bad.is_empty(), "layering violations:\n{}", bad.join("\n"));
}

/// The model is the proxy's own view of the cluster: API objects are converted in the source
/// layer (`source::convert`), so nothing under `src/model/` names a k8s-openapi type.
#[test]
fn the_model_knows_no_api_type() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/model");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(files.len() > 5, "{files:?}");
    let bad: Vec<String> = files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(f)
                .expect("readable source")
                .contains("k8s_openapi")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(bad.is_empty(), "the model names API types: {bad:?}");
}

#[test]
fn no_import_circles() {
    let g = graph();
    // Depth-first search for a back edge; reports the first circle found.
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut c = stack[i..].to_vec();
            c.push(n.into());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.into());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.into());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(n, &g, &mut Vec::new(), &mut done) {
            panic!("import circle: {}", c.join(" -> "));
        }
    }
}

#[test]
fn the_checker_sees_imports() {
    // The checks above are only as good as the parser: it must find these.
    let found = imports(
        "use crate::modes::ipvs::plan::X;\nlet y = crate::proxy::Z;\nkube_nlproxy::crate::no",
    );
    assert_eq!(
        found,
        ["modes::ipvs", "proxy"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    let g = graph();
    assert!(g["modes::nftables"].contains("proxy"), "{g:?}");
    assert!(g.len() > 15, "{g:?}");
}

//! No production function is over 100 lines (issue #51), apart from the kinds whose length
//! is a list rather than steps: the dispatchers over nftables expression kinds, the metrics
//! registration table and the declarative base ruleset. A function is measured from its `fn`
//! line to its closing brace, braces counted outside strings, characters and comments; test
//! modules (`#[cfg(test)] mod tests` at a file's end, `tests.rs`, `proptests.rs`) and
//! `#[cfg(test)]` files are not production. Pure: reads `src/`.

use std::path::Path;

mod source;
use source::rust_files;

const LIMIT: usize = 100;

/// (file under src/, function): a `match` with one arm per expression kind or a table.
const LISTS: &[(&str, &str)] = &[
    ("kernel/nft/lower.rs", "lower_one"),
    ("kernel/nft/eval/machine.rs", "expr"),
    ("kernel/nft/live.rs", "canonical_rule"),
    ("kernel/nft/encode.rs", "encode_kexpr"),
    ("kernel/nft/trace.rs", "exprs"),
    ("modes/nftables/plan/base.rs", "base_chains"),
    ("serve/metrics.rs", "new"),
];

/// Files that are compiled only for tests (a `#[path]` module under `#[cfg(test)]`).
const TEST_ONLY_FILES: &[&str] = &["model/topology_upstream_table.rs"];

/// The line without its comment, string and character contents, so that only code braces
/// are counted.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => break,
            '"' => {
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            // A character literal ('{', '\n'); a lifetime ('a) has no closing quote soon.
            '\'' => {
                let rest: String = chars.clone().take(4).collect();
                if let Some(end) = rest.find('\'').filter(|&e| e > 0) {
                    for _ in 0..=end {
                        chars.next();
                    }
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// The name of the function a line declares, if it does.
fn declared_fn(line: &str) -> Option<&str> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "fn")?;
    let modifiers_only = words[..at].iter().all(|w| {
        w.starts_with("pub")
            || matches!(
                *w,
                "const" | "async" | "unsafe" | "extern" | "\"C\"" | "default"
            )
    });
    if !modifiers_only {
        return None;
    }
    let name = words.get(at + 1)?;
    let end = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    Some(&name[..end]).filter(|n| !n.is_empty())
}

/// Every production function over [`LIMIT`] lines in one file: (name, first line, length).
fn long_functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let production_end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].starts_with("mod tests"))
        .unwrap_or(lines.len());
    let mut found = Vec::new();
    for (i, line) in lines[..production_end].iter().enumerate() {
        let Some(name) = declared_fn(line) else {
            continue;
        };
        let (mut depth, mut opened) = (0i64, false);
        for (j, l) in lines.iter().enumerate().skip(i) {
            let code = code_of(l);
            for c in code.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if !opened && code.trim_end().ends_with(';') {
                break; // a declaration without a body (a trait's)
            }
            if opened && depth == 0 {
                let len = j - i + 1;
                if len > LIMIT {
                    found.push((name.to_string(), i + 1, len));
                }
                break;
            }
        }
    }
    found
}

#[test]
fn no_production_function_is_over_100_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files.sort();
    let mut over = Vec::new();
    let mut listed_seen = Vec::new();
    for f in &files {
        let rel = f
            .strip_prefix(&root)
            .expect("under src")
            .to_string_lossy()
            .into_owned();
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if matches!(name, "tests.rs" | "proptests.rs") || TEST_ONLY_FILES.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("readable source");
        for (func, line, len) in long_functions(&text) {
            if LISTS.contains(&(rel.as_str(), func.as_str())) {
                listed_seen.push((rel.clone(), func));
            } else {
                over.push(format!("src/{rel}:{line} {func}: {len} lines"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "functions over {LIMIT} lines: split them into named steps:\n{}",
        over.join("\n")
    );
    // An exemption that no longer applies goes, so the list stays true.
    for (file, func) in LISTS {
        assert!(
            listed_seen.iter().any(|(f, n)| f == file && n == func),
            "src/{file} {func} is no longer over {LIMIT} lines: remove it from LISTS"
        );
    }
}

#[test]
fn the_measure_counts_code_braces_only() {
    let head =
        "fn a() {\n    let s = \"{{\"; // }\n    let c = '{';\n    let r: &'static str = \"}\";\n";
    let text = format!("{head}}}\n");
    let mut padded = head.to_string();
    for _ in 0..LIMIT {
        padded.push_str("    x();\n");
    }
    padded.push_str("}\n");
    let found = long_functions(&padded);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "a");
    assert_eq!(found[0].2, LIMIT + 5);
    assert!(long_functions(&text).is_empty());
    assert_eq!(
        declared_fn("    pub(crate) async fn run(x: u8) {"),
        Some("run")
    );
    assert_eq!(declared_fn("    let f = |x| x; // fn not"), None);
}

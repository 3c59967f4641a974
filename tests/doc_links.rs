//! Every relative link in README.md, CHANGELOG.md, BENCHMARKS.md and docs/*.md reaches a
//! file that exists, and its `#anchor` a heading of that file (GitHub's slugs), so a renamed
//! section cannot leave a reader at a dead link (issue #53.6 found two).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside fenced code), with GitHub's `-1`, `-2`
/// suffixes for repeats.
fn anchors(md: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let Some(h) = line.strip_prefix('#') else {
            continue;
        };
        let text = h.trim_start_matches('#');
        if !text.starts_with(' ') {
            continue;
        }
        let base = slug(&text.replace('`', ""));
        let mut s = base.clone();
        let mut n = 0;
        while out.contains(&s) {
            n += 1;
            s = format!("{base}-{n}");
        }
        out.insert(s);
    }
    out
}

/// `](target)` links outside fenced code: (line number, target).
fn links(md: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in md.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((i + 1, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    out
}

fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "BENCHMARKS.md"]
        .iter()
        .map(|f| root.join(f))
        .filter(|p| p.exists())
        .collect();
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            files.push(p);
        }
    }
    files.sort();
    files
}

#[test]
fn every_relative_link_reaches_a_file_and_a_heading() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files(root) {
        let md = std::fs::read_to_string(&file).unwrap();
        for (line, target) in links(&md) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let at = format!(
                "{}:{line}: {target}",
                file.strip_prefix(root).unwrap().display()
            );
            checked += 1;
            if !dest.exists() {
                broken.push(format!("{at}: no such file"));
                continue;
            }
            if !anchor.is_empty() {
                let text = std::fs::read_to_string(&dest).unwrap_or_default();
                if !anchors(&text).contains(anchor) {
                    broken.push(format!("{at}: no heading with that anchor"));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: the scan is broken"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn slugs_and_anchors_follow_github() {
    assert_eq!(slug("Deviations from upstream"), "deviations-from-upstream");
    assert_eq!(
        slug("kubeadm: swap the image in place"),
        "kubeadm-swap-the-image-in-place"
    );
    assert_eq!(
        slug("How a change flows (from an event) to the kernel"),
        "how-a-change-flows-from-an-event-to-the-kernel"
    );
    let a = anchors("# A\n## B\n```\n# not a heading\n```\n## B\n#nospace\n### `code` C\n");
    assert_eq!(
        a,
        ["a", "b", "b-1", "code-c"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    assert_eq!(
        links("see [x](docs/a.md#b) and [y](#c)\n```\n[z](no)\n```\n"),
        vec![(1, "docs/a.md#b".to_string()), (1, "#c".to_string())]
    );
}

//! CHANGELOG.md says which version this is and which upstream kube-proxy release it tracks,
//! as `--version` does. Pure: reads CHANGELOG.md.

#[test]
fn the_changelog_names_this_version_and_the_release_it_tracks() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/CHANGELOG.md"))
        .expect("CHANGELOG.md at the root");
    let ours = env!("CARGO_PKG_VERSION");
    let tracked = kube_nlproxy::config::TRACKED_KUBE_PROXY;
    assert!(
        text.lines().any(|l| l.starts_with(&format!("## {ours} "))),
        "CHANGELOG.md has no section for {ours}"
    );
    let row = format!("| {ours} | {tracked} |");
    assert!(
        text.lines().any(|l| l.starts_with(&row)),
        "CHANGELOG.md's versioning table lacks {row:?}"
    );
    assert!(kube_nlproxy::config::version_text("", false)
        .starts_with(&format!("Kubernetes {tracked} (kube-nlproxy {ours},")));
}

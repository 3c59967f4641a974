//! docs/flags.md (README's flag reference) names every flag the binary accepts (and only
//! those). Pure.

use kube_nlproxy::config::flags::FLAGS;

#[test]
fn readme_lists_every_flag() {
    let section = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/flags.md"))
        .unwrap()
        .replace('_', "-");
    for spec in FLAGS {
        assert!(
            section.contains(&format!("`--{} ", spec.name))
                || section.contains(&format!("`--{}`", spec.name))
                || section.contains(&format!("`--{},", spec.name)),
            "docs/flags.md lacks --{}",
            spec.name
        );
    }
    // and no flag the binary does not have, in the tables
    let rows: String = section
        .lines()
        .filter(|l| l.starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n");
    for word in rows.split('`') {
        let Some(name) = word.strip_prefix("--") else {
            continue;
        };
        let name = name.split([' ', '=', ',']).next().unwrap_or("");
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
            continue;
        }
        assert!(
            FLAGS.iter().any(|s| s.name == name),
            "docs/flags.md names --{name}, which the binary does not accept"
        );
    }
}

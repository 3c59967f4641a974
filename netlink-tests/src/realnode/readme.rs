//! README's operator commands, run word for word: a block of README that follows a
//! `<!-- real-node-test: NAME -->` marker is what the real-node tests execute, so the README
//! an operator follows is the one the tests prove.
//!
//! Pure parsing, except [`Cluster::run_readme_block`].

use std::time::Duration;

use super::{workspace_root, Cluster};
use crate::bounded::OutputWithin;

/// The commands of the fenced block after the marker `NAME` in README.md: one per line,
/// comments and blank lines dropped.
pub fn block(readme: &str, name: &str) -> Vec<String> {
    let marker = format!("<!-- real-node-test: {name} -->");
    let start = readme
        .find(&marker)
        .unwrap_or_else(|| panic!("README.md has no {marker}"));
    let rest = &readme[start + marker.len()..];
    let open = rest
        .find("```")
        .unwrap_or_else(|| panic!("no code block after {marker}"));
    let body = &rest[open..];
    let body = &body[body.find('\n').map_or(body.len(), |i| i + 1)..];
    let end = body
        .find("```")
        .unwrap_or_else(|| panic!("unterminated block after {marker}"));
    body[..end]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

pub fn readme() -> String {
    doc("README.md")
}

/// A Markdown file of the repository (`README.md`, `docs/deploy.md`).
pub fn doc(path: &str) -> String {
    std::fs::read_to_string(workspace_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// How one README command runs here.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// `sha256sum -c SHA256SUMS`: in the release directory.
    Verify,
    /// `tar xzf FILE`: unpacked in the release directory.
    Unpack(String),
    /// `ctr -n k8s.io images import FILE`: on every node's containerd.
    Import(String),
    /// `kubectl ARGS` against the cluster, from the release directory.
    Kubectl(Vec<String>),
    /// `kubectl ARGS | sed ARGS | kubectl ARGS`: stages of kubectl and sed, each given the
    /// output of the one before (an edit inside a ConfigMap's embedded YAML).
    Pipeline(Vec<Stage>),
    /// `kustomize edit add component PATH`: the release directory's kustomization lists
    /// PATH last among its components, as kustomize writes it ([`add_component`]).
    AddComponent(String),
}

/// One stage of a [`Step::Pipeline`].
#[derive(Debug, PartialEq, Eq)]
pub enum Stage {
    Kubectl(Vec<String>),
    Sed(Vec<String>),
}

/// `line` split at each `|` outside single quotes.
fn stages(line: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in line.char_indices() {
        match c {
            '\'' => quoted = !quoted,
            '|' if !quoted => {
                parts.push(&line[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&line[start..]);
    parts
}

/// A command line split into words as a shell splits it, with single quotes only (a JSON
/// patch needs them); anything a shell would interpret otherwise (pipes, redirections,
/// variables, double quotes outside single ones) is refused.
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(q) => w.push(q),
                        None => return Err(format!("{line:?}: unterminated single quote")),
                    }
                }
            }
            c if c.is_whitespace() => words.extend(word.take()),
            '|' | '&' | ';' | '"' | '$' | '`' | '>' | '<' | '\\' => {
                return Err(format!("{line:?}: one plain command per line"))
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

/// Reads a command line; anything else (pipes, redirections, other programs) is refused, so
/// the README cannot hold a step the test would not really run.
pub fn step(line: &str) -> Result<Step, String> {
    let parts = stages(line);
    if parts.len() > 1 {
        return parts
            .into_iter()
            .map(|part| {
                let words = words(part)?;
                match words.first().map(String::as_str) {
                    Some("kubectl") => Ok(Stage::Kubectl(words[1..].to_vec())),
                    Some("sed") => Ok(Stage::Sed(words[1..].to_vec())),
                    _ => Err(format!("{line:?}: a pipeline of kubectl and sed only")),
                }
            })
            .collect::<Result<_, _>>()
            .map(Step::Pipeline);
    }
    let words = words(line)?;
    match words
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["sha256sum", "-c", "SHA256SUMS"] => Ok(Step::Verify),
        ["tar", "xzf", file] => Ok(Step::Unpack(file.to_string())),
        ["ctr", "-n", "k8s.io", "images", "import", file] => Ok(Step::Import(file.to_string())),
        ["kubectl", ..] => Ok(Step::Kubectl(words[1..].to_vec())),
        ["kustomize", "edit", "add", "component", path] => Ok(Step::AddComponent(path.to_string())),
        _ => Err(format!(
            "{line:?}: not a command the real-node tests know how to run"
        )),
    }
}

/// `kustomization` (a kustomization.yaml's text whose `components:` list comes last, as the
/// repository's does) with `path` appended to that list, as `kustomize edit add component`
/// appends it; an error when the list is not last, `path` is listed already or its
/// directory has no kustomization.yaml under `dir`.
pub fn add_component(
    kustomization: &str,
    path: &str,
    dir: &std::path::Path,
) -> Result<String, String> {
    let listed = kustomization
        .lines()
        .skip_while(|l| *l != "components:")
        .skip(1)
        .collect::<Vec<_>>();
    if listed.is_empty() && !kustomization.lines().any(|l| l == "components:") {
        return Err("no components: list".into());
    }
    if let Some(l) = listed
        .iter()
        .find(|l| !l.starts_with("- ") && !l.starts_with('#'))
    {
        return Err(format!(
            "components: is not the last field ({l:?} follows it)"
        ));
    }
    if listed.contains(&format!("- {path}").as_str()) {
        return Err(format!("{path} is listed already"));
    }
    if !dir.join(path).join("kustomization.yaml").exists() {
        return Err(format!("{path}/kustomization.yaml: no such component"));
    }
    let mut out = kustomization.trim_end().to_string();
    out.push_str(&format!("\n- {path}\n"));
    Ok(out)
}

/// `line` with each word `NODE` (between characters that cannot be part of a name, as in
/// `spec.nodeName=NODE`) replaced by `node`.
pub fn with_node(line: &str, node: &str) -> String {
    let part =
        |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find("NODE") {
        let before = rest[..i].chars().next_back().or(out.chars().next_back());
        let after = rest[i + 4..].chars().next();
        out.push_str(&rest[..i]);
        out.push_str(if part(before) || part(after) {
            "NODE"
        } else {
            node
        });
        rest = &rest[i + 4..];
    }
    out.push_str(rest);
    out
}

/// The release directory README's test command wrote (`cargo xtask release --arch amd64`).
pub fn built_release() -> std::path::PathBuf {
    let reference = xtask::image::default_reference().unwrap();
    let tag = reference.rsplit_once(':').map_or("", |(_, t)| t);
    let dir = workspace_root().join(format!("target/kube-nlproxy-{tag}-release"));
    assert!(
        dir.join("SHA256SUMS").exists(),
        "{}: no release: run `cargo xtask release --arch amd64` (README's test command does)",
        dir.display()
    );
    dir
}

/// Runs a local command of README's in `dir`, bounded to 2 minutes; panics naming it.
fn local(dir: &std::path::Path, line: &str, program: &str, args: &[&str]) {
    let out = std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .output_within(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("`{line}`: {e}"));
    assert!(
        out.status.success(),
        "`{line}` in {} failed: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Cluster {
    /// This cluster's copy of the release directory, where README's commands run (an
    /// operator's download: `tar xzf` writes into it, the build's copy stays as written).
    pub fn release_dir(&self) -> std::path::PathBuf {
        let dir = self.dir.join("release");
        if !dir.exists() {
            std::fs::create_dir_all(&dir).unwrap();
            for e in std::fs::read_dir(built_release()).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_file() {
                    std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
                }
            }
        }
        dir
    }

    /// Runs README's block `name` against this cluster, in [`Cluster::release_dir`], each
    /// command bounded to 6 minutes; panics naming the line that failed.
    pub fn run_readme_block(&self, name: &str) {
        self.run_doc_block("README.md", name, None);
    }

    /// [`Cluster::run_readme_block`] for a block of `path` (`docs/deploy.md`); in a recipe
    /// for one node, the word `NODE` stands for `node`'s name.
    pub fn run_doc_block(&self, path: &str, name: &str, node: Option<&str>) {
        let dir = self.release_dir();
        for line in block(&doc(path), name) {
            let line = match node {
                Some(n) => with_node(&line, n),
                None => line,
            };
            match step(&line).unwrap_or_else(|e| panic!("{path} block {name}: {e}")) {
                Step::Verify => local(&dir, &line, "sha256sum", &["-c", "--strict", "SHA256SUMS"]),
                Step::Unpack(file) => local(&dir, &line, "tar", &["xzf", &file]),
                Step::AddComponent(component) => {
                    let file = dir.join("kustomization.yaml");
                    let text = std::fs::read_to_string(&file).unwrap();
                    let edited = add_component(&text, &component, &dir)
                        .unwrap_or_else(|e| panic!("{path} block {name}: `{line}`: {e}"));
                    std::fs::write(&file, edited).unwrap();
                }
                Step::Import(file) => {
                    let path = dir.join(&file);
                    for n in &self.nodes {
                        n.import_image(&path);
                    }
                }
                Step::Kubectl(args) => {
                    self.run_stage(
                        &dir,
                        &Stage::Kubectl(args),
                        None,
                        &format!("{path} block {name}: `{line}`"),
                    );
                }
                Step::Pipeline(stages) => {
                    let what = format!("{path} block {name}: `{line}`");
                    let mut input = None;
                    for (i, stage) in stages.iter().enumerate() {
                        let out = self.run_stage(&dir, stage, input.as_deref(), &what);
                        let file = dir.join(format!(".pipe-{i}"));
                        std::fs::write(&file, out).unwrap();
                        input = Some(file);
                    }
                }
            }
        }
    }

    /// Runs one README command (kubectl against the cluster, or sed) in `dir` with `stdin`
    /// as its input, bounded to 6 minutes; returns its stdout, or panics with `what`.
    fn run_stage(
        &self,
        dir: &std::path::Path,
        stage: &Stage,
        stdin: Option<&std::path::Path>,
        what: &str,
    ) -> Vec<u8> {
        let mut cmd = match stage {
            Stage::Kubectl(args) => {
                let mut cmd = std::process::Command::new("nsenter");
                cmd.arg(format!("--net=/run/netns/{}", self.cp.ns.name))
                    .arg("--")
                    .arg(super::binaries().node.join("kubectl"))
                    .arg(format!(
                        "--kubeconfig={}",
                        self.cp.admin_kubeconfig().display()
                    ))
                    .args(args);
                cmd
            }
            Stage::Sed(args) => {
                let mut cmd = std::process::Command::new("sed");
                cmd.args(args);
                cmd
            }
        };
        cmd.current_dir(dir).stdin(match stdin {
            Some(f) => std::process::Stdio::from(std::fs::File::open(f).unwrap()),
            None => std::process::Stdio::null(),
        });
        let out = cmd
            .output_within(Duration::from_secs(360))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what} failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.describe()
        );
        out.stdout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_its_commands() {
        let md = "x\n<!-- real-node-test: go -->\n```sh\n# a comment\nkubectl apply -k .\n\nctr -n k8s.io images import target/x.tar\n```\nafter\n";
        assert_eq!(
            block(md, "go"),
            [
                "kubectl apply -k .",
                "ctr -n k8s.io images import target/x.tar"
            ]
        );
    }

    #[test]
    fn a_component_is_added_last_once() {
        let dir = std::env::temp_dir().join(format!("nlp-readme-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("deploy/components/x")).unwrap();
        std::fs::write(dir.join("deploy/components/x/kustomization.yaml"), "").unwrap();
        let k = "kind: Kustomization\ncomponents:\n# the images\n- deploy/images\n";
        assert_eq!(
            step("kustomize edit add component deploy/components/x"),
            Ok(Step::AddComponent("deploy/components/x".into()))
        );
        let added = add_component(k, "deploy/components/x", &dir).unwrap();
        assert_eq!(
            added,
            "kind: Kustomization\ncomponents:\n# the images\n- deploy/images\n- deploy/components/x\n"
        );
        assert!(add_component(&added, "deploy/components/x", &dir)
            .unwrap_err()
            .contains("listed already"));
        assert!(add_component(k, "deploy/components/y", &dir)
            .unwrap_err()
            .contains("no such component"));
        assert!(add_component(
            "components:\n- a\nimages: []\n",
            "deploy/components/x",
            &dir
        )
        .unwrap_err()
        .contains("not the last field"));
        assert!(add_component("kind: K\n", "deploy/components/x", &dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn node_stands_for_the_nodes_name() {
        assert_eq!(
            with_node(
                "kubectl delete pod --field-selector spec.nodeName=NODE",
                "node-1"
            ),
            "kubectl delete pod --field-selector spec.nodeName=node-1"
        );
        assert_eq!(
            with_node("kubectl label node NODE x=y", "n"),
            "kubectl label node n x=y"
        );
        assert_eq!(
            with_node("NODE_NAME MY-NODE NODES", "n"),
            "NODE_NAME MY-NODE NODES"
        );
    }

    #[test]
    fn steps_are_plain_commands() {
        assert_eq!(step("sha256sum -c SHA256SUMS"), Ok(Step::Verify));
        assert_eq!(
            step("tar xzf kube-nlproxy-v0.1.0-deploy.tar.gz"),
            Ok(Step::Unpack("kube-nlproxy-v0.1.0-deploy.tar.gz".into()))
        );
        assert!(step("cargo xtask image").is_err());
        assert_eq!(
            step("kubectl apply -k ."),
            Ok(Step::Kubectl(vec!["apply".into(), "-k".into(), ".".into()]))
        );
        assert!(step("kubectl get pods | grep x").is_err());
        assert!(step("curl http://x").is_err());
        assert!(step("kubectl get pods > x").is_err());
        assert!(step("kubectl get pods \"x\"").is_err());
        assert!(step("kubectl patch x -p '[1]").is_err());
        // Single quotes hold a JSON patch as one word, as in a shell.
        assert_eq!(
            step(r#"kubectl patch ds x --type json -p '[{"op":"remove","path":"/a b"}]'"#),
            Ok(Step::Kubectl(vec![
                "patch".into(),
                "ds".into(),
                "x".into(),
                "--type".into(),
                "json".into(),
                "-p".into(),
                r#"[{"op":"remove","path":"/a b"}]"#.into(),
            ]))
        );
    }

    #[test]
    fn a_pipeline_is_kubectl_and_sed_with_pipes_inside_quotes_kept() {
        assert_eq!(
            step("kubectl get cm x -o yaml | sed 's/a|b/c/' | kubectl replace -f -"),
            Ok(Step::Pipeline(vec![
                Stage::Kubectl(vec![
                    "get".into(),
                    "cm".into(),
                    "x".into(),
                    "-o".into(),
                    "yaml".into()
                ]),
                Stage::Sed(vec!["s/a|b/c/".into()]),
                Stage::Kubectl(vec!["replace".into(), "-f".into(), "-".into()]),
            ]))
        );
        assert!(step("kubectl get pods | grep x").is_err());
        assert!(step("kubectl get cm x | sed 's/a/b/' > out").is_err());
        assert!(step("kubectl get cm x | sed \"s/a/b/\"").is_err());
    }
}

#[cfg(test)]
mod kubeadm_config_edits {
    use super::*;

    /// The sed stage of README block `name`'s line that edits `kubeadm-config`.
    fn sed_of(name: &str) -> Vec<String> {
        let line = block(&readme(), name)
            .into_iter()
            .find(|l| l.contains("kubeadm-config"))
            .unwrap_or_else(|| panic!("README block {name} edits kubeadm-config"));
        match step(&line) {
            Ok(Step::Pipeline(stages)) => stages
                .into_iter()
                .find_map(|s| match s {
                    Stage::Sed(args) => Some(args),
                    Stage::Kubectl(_) => None,
                })
                .expect("a sed stage"),
            other => panic!("{line}: {other:?}"),
        }
    }

    #[allow(clippy::disallowed_methods)] // sed as README runs it
    fn sed(args: &[String], input: &str) -> String {
        use std::io::Write;
        let mut child = std::process::Command::new("sed")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sed");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = crate::bounded::wait_with_output_within(child, Duration::from_secs(10), "sed");
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    }

    /// `kubectl get cm kubeadm-config -o yaml` with `proxy` as given (4 spaces: the
    /// block scalar's indentation under `data`).
    fn configmap(proxy: &str) -> String {
        format!("apiVersion: v1\ndata:\n  ClusterConfiguration: |\n    apiServer: {{}}\n{proxy}    scheduler: {{}}\nkind: ConfigMap\n")
    }

    /// README's install turns kubeadm's `proxy: {}` off, and each way back turns it on
    /// again from that form and from the two-line form kubeadm itself writes (`kubeadm init
    /// --skip-phases=addon/kube-proxy`, or a `kubeadm upgrade` after the install).
    #[test]
    fn the_install_disables_the_addon_and_every_way_back_enables_it_in_both_forms() {
        let on = configmap("    proxy: {}\n");
        let off = configmap("    proxy: {disabled: true}\n");
        let off_by_kubeadm = configmap("    proxy:\n      disabled: true\n");
        for install in ["install", "migrate"] {
            assert_eq!(sed(&sed_of(install), &on), off, "{install}");
            assert_eq!(sed(&sed_of(install), &off), off, "{install}: twice is once");
        }
        for back in ["go-back", "go-back-deploy"] {
            assert_eq!(sed(&sed_of(back), &off), on, "{back}");
            assert_eq!(
                sed(&sed_of(back), &off_by_kubeadm),
                on,
                "{back}, kubeadm's form"
            );
            assert_eq!(sed(&sed_of(back), &on), on, "{back}: already on");
        }
    }
}

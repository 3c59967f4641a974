//! Build script: the git commit the binary is built from, for `--version` and
//! `kubernetes_build_info{git_commit}` (upstream fills both from its build). Read from the
//! checkout's `.git` files, never by running git (there may be none, as in a container
//! build); `KUBE_NLPROXY_GIT_COMMIT` in the environment wins (deploy/Dockerfile passes it,
//! as `.dockerignore` keeps `.git` out of the context). Empty when neither is there.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=KUBE_NLPROXY_GIT_COMMIT");
    let commit = match std::env::var("KUBE_NLPROXY_GIT_COMMIT") {
        Ok(c) => c,
        Err(_) => {
            let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
            git_dir(&root)
                .and_then(|g| head_commit(&g))
                .unwrap_or_default()
        }
    };
    // Only a full hexadecimal object name is written: anything else is not a commit.
    let commit = if commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        commit
    } else {
        String::new()
    };
    println!("cargo:rustc-env=KUBE_NLPROXY_GIT_COMMIT={commit}");
}

/// The repository's git directory: `.git`, or where a `.git` file (a worktree's or a
/// submodule's) points.
fn git_dir(root: &Path) -> Option<PathBuf> {
    let dot_git = root.join(".git");
    if dot_git.is_dir() {
        return Some(dot_git);
    }
    let text = std::fs::read_to_string(&dot_git).ok()?;
    let target = text.strip_prefix("gitdir:")?.trim();
    Some(root.join(target))
}

/// The commit `HEAD` names: directly (detached), or through its branch's loose ref or
/// `packed-refs`. Each file read is one the build reruns on.
fn head_commit(git: &Path) -> Option<String> {
    let head_path = git.join("HEAD");
    println!("cargo:rerun-if-changed={}", head_path.display());
    let head = std::fs::read_to_string(&head_path).ok()?;
    let head = head.trim();
    let Some(reference) = head.strip_prefix("ref:").map(str::trim) else {
        return Some(head.to_string());
    };
    // A worktree keeps its HEAD apart and shares the refs of the main git directory.
    let common = std::fs::read_to_string(git.join("commondir"))
        .map(|c| git.join(c.trim()))
        .unwrap_or_else(|_| git.to_path_buf());
    let loose = common.join(reference);
    println!("cargo:rerun-if-changed={}", loose.display());
    if let Ok(c) = std::fs::read_to_string(&loose) {
        return Some(c.trim().to_string());
    }
    let packed_path = common.join("packed-refs");
    println!("cargo:rerun-if-changed={}", packed_path.display());
    let packed = std::fs::read_to_string(packed_path).ok()?;
    packed.lines().find_map(|l| {
        let (sha, name) = l.split_once(' ')?;
        (name == reference).then(|| sha.to_string())
    })
}

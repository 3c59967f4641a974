//! The git commit a checkout is at, read from its `.git` files, never by running git (there
//! may be none, as in a container build); `KUBE_NLPROXY_GIT_COMMIT` in the environment wins
//! (deploy/Dockerfile passes it, as `.dockerignore` keeps `.git` out of the context). Empty
//! when neither is there. Shared by build.rs (`--version`, `kubernetes_build_info`) and
//! `cargo xtask image` (the `org.opencontainers.image.revision` label), so both name the
//! same commit.

use std::path::{Path, PathBuf};

/// The full commit name, or empty; `on_read` is told of each file the answer depends on.
pub fn git_commit(root: &Path, on_read: &mut dyn FnMut(&Path)) -> String {
    let commit = match std::env::var("KUBE_NLPROXY_GIT_COMMIT") {
        Ok(c) => c,
        Err(_) => git_dir(root)
            .and_then(|g| head_commit(&g, on_read))
            .unwrap_or_default(),
    };
    // Only a full hexadecimal object name is written: anything else is not a commit.
    if commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        commit
    } else {
        String::new()
    }
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
/// `packed-refs`.
fn head_commit(git: &Path, on_read: &mut dyn FnMut(&Path)) -> Option<String> {
    let head_path = git.join("HEAD");
    on_read(&head_path);
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
    on_read(&loose);
    if let Ok(c) = std::fs::read_to_string(&loose) {
        return Some(c.trim().to_string());
    }
    let packed_path = common.join("packed-refs");
    on_read(&packed_path);
    let packed = std::fs::read_to_string(packed_path).ok()?;
    packed.lines().find_map(|l| {
        let (sha, name) = l.split_once(' ')?;
        (name == reference).then(|| sha.to_string())
    })
}

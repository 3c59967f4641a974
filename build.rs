//! Build script: the git commit the binary is built from, for `--version` and
//! `kubernetes_build_info{git_commit}` (upstream fills both from its build), as
//! `build/git_commit.rs` reads it. The build reruns when the environment variable or any
//! git file read changes.

#[path = "build/git_commit.rs"]
mod git_commit;

fn main() {
    println!("cargo:rerun-if-env-changed=KUBE_NLPROXY_GIT_COMMIT");
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = git_commit::git_commit(&root, &mut |p| {
        println!("cargo:rerun-if-changed={}", p.display())
    });
    println!("cargo:rustc-env=KUBE_NLPROXY_GIT_COMMIT={commit}");
}

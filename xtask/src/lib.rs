//! Project tasks that are not the product: the release image (`cargo xtask image`), the
//! OCI image writer the real-node tests also use for their test images, and the fuzz runs
//! (`cargo xtask fuzz`).

pub mod fuzz;
#[path = "../../build/git_commit.rs"]
pub mod git_commit;
pub mod image;
pub mod oci;
pub mod release;
pub mod sbom;

//! Project tasks that are not the product: the release image (`cargo xtask image`) and the
//! OCI image writer the real-node tests also use for their test images.

#[path = "../../build/git_commit.rs"]
pub mod git_commit;
pub mod image;
pub mod oci;
pub mod release;
pub mod sbom;

//! Project tasks that are not the product: the release image (`cargo xtask image`) and the
//! OCI image writer the real-node tests also use for their test images.

pub mod image;
pub mod oci;

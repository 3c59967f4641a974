//! The `KubeProxyConfiguration` file, as upstream's `apis/config` packages hold it: the
//! v1alpha1 types with their defaults ([`v1alpha1`]), the decoder that reads a file strictly
//! then leniently ([`decode`]), the internal form validation and resolution read
//! ([`internal`]), the YAML `--write-config-to` writes ([`yaml_out`]) and Go's durations
//! ([`duration`]). Pure.

pub mod decode;
pub mod duration;
pub mod internal;
pub mod v1alpha1;
pub mod yaml_out;

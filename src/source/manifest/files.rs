//! Reading the manifests from the file system (I/O): which files a path names, each read
//! safely (regular files only, without blocking, at most [`MAX_FILE_BYTES`]), a cache that
//! re-parses only changed files, and the fingerprint the watcher polls.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::{parse_manifest_bytes, ManifestError, MAX_FILE_BYTES};
use crate::source::Snapshot;

fn kind_of(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// The manifest files under `path`: the file itself, or a directory's `*.yaml`, `*.yml` and
/// `*.json` entries (sorted). Errors when `path` cannot be read or is neither.
fn manifest_files(path: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let meta = std::fs::metadata(path).map_err(|e| ManifestError::unreadable(path, e))?;
    if meta.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| ManifestError::unreadable(path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                )
            })
            .collect();
        v.sort();
        Ok(v)
    } else if meta.is_file() {
        Ok(vec![path.to_path_buf()])
    } else {
        Err(ManifestError::NotRegular {
            path: path.to_path_buf(),
            kind: kind_of(meta.file_type()),
        })
    }
}

/// Reads one manifest file: only a regular file (opened without blocking, so a FIFO put in
/// its place cannot hang the reader), at most [`MAX_FILE_BYTES`].
fn read_file(f: &Path) -> Result<Vec<u8>, ManifestError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(f)
        .map_err(|e| ManifestError::unreadable(f, e))?;
    let meta = file
        .metadata()
        .map_err(|e| ManifestError::unreadable(f, e))?;
    if !meta.is_file() {
        return Err(ManifestError::NotRegular {
            path: f.to_path_buf(),
            kind: kind_of(meta.file_type()),
        });
    }
    let too_large = |size| ManifestError::TooLarge {
        path: f.to_path_buf(),
        size,
        limit: MAX_FILE_BYTES,
    };
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_large(meta.len()));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ManifestError::unreadable(f, e))?;
    if buf.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(buf.len() as u64));
    }
    Ok(buf)
}

/// Reads every manifest under `path` (see [`ManifestCache::load`]).
pub fn load(path: &Path, node_name: &str) -> Result<(Snapshot, Vec<String>), ManifestError> {
    ManifestCache::new().load(path, node_name)
}

type FileKey = (u64, Option<SystemTime>, u64);

fn file_key(m: &std::fs::Metadata) -> FileKey {
    use std::os::unix::fs::MetadataExt;
    (m.len(), m.modified().ok(), m.ino())
}

/// Parsed manifests, kept per file so a reload re-parses only the files that changed
/// (a directory with one file per object then reloads in time proportional to the change).
#[derive(Debug, Default)]
pub struct ManifestCache {
    files: std::collections::BTreeMap<PathBuf, (FileKey, Snapshot, Vec<String>)>,
}

impl ManifestCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every manifest under `path`, reusing what did not change since the last call.
    ///
    /// A single file that is missing, unreadable, not a regular file or too large is an
    /// error (the caller keeps its last good state). In a directory, a removed file removes
    /// exactly its objects; a file that cannot be read is a warning and keeps what it last
    /// held.
    pub fn load(
        &mut self,
        path: &Path,
        node_name: &str,
    ) -> Result<(Snapshot, Vec<String>), ManifestError> {
        let single = !std::fs::metadata(path).is_ok_and(|m| m.is_dir());
        let files = manifest_files(path)?;
        let mut keep = std::collections::BTreeSet::new();
        let mut problems = Vec::new();
        for f in files {
            let key = match std::fs::metadata(&f) {
                Ok(m) => file_key(&m),
                // Gone between listing and reading: removed, like a file not listed.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !single => continue,
                Err(e) => {
                    let err = ManifestError::unreadable(&f, e);
                    if single {
                        return Err(err);
                    }
                    problems.push(format!("{err}; keeping what it held"));
                    keep.insert(f);
                    continue;
                }
            };
            keep.insert(f.clone());
            if self
                .files
                .get(&f)
                .is_some_and(|(k, _, _)| *k == key && key.1.is_some())
            {
                continue;
            }
            let bytes = match read_file(&f) {
                Ok(b) => b,
                Err(err) if single => return Err(err),
                Err(err) => {
                    problems.push(format!("{err}; keeping what it held"));
                    continue;
                }
            };
            let mut snap = Snapshot::default();
            let mut warnings = Vec::new();
            parse_manifest_bytes(
                &bytes,
                &f.display().to_string(),
                node_name,
                &mut snap,
                &mut warnings,
            );
            self.files.insert(f, (key, snap, warnings));
        }
        self.files.retain(|f, _| keep.contains(f));
        let mut out = Snapshot::default();
        let mut warnings = problems;
        if single {
            // One file: any change re-reads it whole, so keeping its parsed objects would
            // buy nothing and hold them all (~62 MiB at 10k Services): hand them over.
            for (_, (_, s, w)) in std::mem::take(&mut self.files) {
                out = s;
                warnings.extend(w);
            }
            return Ok((out, warnings));
        }
        for (_, s, w) in self.files.values() {
            out.services.extend(s.services.iter().cloned());
            out.endpoint_slices
                .extend(s.endpoint_slices.iter().cloned());
            out.service_cidrs.extend(s.service_cidrs.iter().cloned());
            if s.node.is_some() {
                out.node = s.node.clone();
            }
            warnings.extend(w.iter().cloned());
        }
        Ok((out, warnings))
    }
}

/// What identifies the current content of the manifests: file names, sizes, mtimes and
/// inodes (a file replaced by rename gets a new inode).
pub type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>, u64)>;

/// Reads the fingerprint; polled to notice edits and replacements.
pub fn fingerprint(path: &Path) -> Fingerprint {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    if let Ok(meta) = std::fs::metadata(path) {
        out.push((
            path.to_path_buf(),
            meta.len(),
            meta.modified().ok(),
            meta.ino(),
        ));
    }
    for f in manifest_files(path).unwrap_or_default() {
        if let Ok(m) = std::fs::metadata(&f) {
            out.push((f, m.len(), m.modified().ok(), m.ino()));
        }
    }
    out
}

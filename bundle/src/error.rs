//! Errors of writing and loading bundles. Each names the bundle file (its path relative to the
//! bundle directory, as the manifest lists it), the tensor or the directory it concerns, and the
//! problem.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A file the manifest lists (or `manifest.json` itself) does not exist.
    #[error("bundle file `{file}` is missing")]
    Missing { file: String },
    /// A listed path exists but is a directory or a special file.
    #[error("bundle file `{file}` is not a regular file")]
    NotAFile { file: String },
    #[error(
        "bundle file `{file}` is {actual_bytes} bytes, the manifest lists {expected_bytes} (truncated or replaced)"
    )]
    SizeMismatch { file: String, expected_bytes: u64, actual_bytes: u64 },
    #[error("bundle file `{file}` has blake3 {actual}, the manifest lists {expected} (modified or corrupted)")]
    HashMismatch { file: String, expected: String, actual: String },
    #[error("`{file}`: bundle format {found} is newer than this runtime's {supported}; use a newer runtime or recompile the bundle")]
    FormatTooNew { file: String, found: u32, supported: u32 },
    #[error("the bundle is compiled for target `{found}`, not `{expected}`")]
    WrongTarget { expected: String, found: String },
    /// `manifest.json` is not valid JSON or does not describe a bundle. `path` is where in the
    /// document the problem is (`.` for the whole document), `message` serde's or the check's
    /// explanation.
    #[error("`{file}` is malformed at `{path}`: {message}")]
    MalformedManifest { file: String, path: String, message: String },
    /// The weights file's framing or header is broken (not about one tensor).
    #[error("`{file}` is not a valid safetensors file: {problem}")]
    MalformedSafetensors { file: String, problem: String },
    /// One tensor entry of the weights header fails a check.
    #[error("`{file}`: tensor `{tensor}`: {problem}")]
    MalformedTensor { file: String, tensor: String, problem: String },
    /// A path would reach outside the bundle directory: `..`, an absolute path, or a symlink
    /// resolving outside.
    #[error("bundle path `{file}` {reason}; every bundle file must stay inside the bundle directory")]
    PathEscape { file: String, reason: String },
    #[error("`{}`: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// The writer refuses to write into a directory that already has content.
    #[error("`{}` exists and is not empty; set the overwrite option to replace it", dir.display())]
    DirectoryNotEmpty { dir: PathBuf },
    /// Overwriting was asked for, but the directory does not look like a bundle.
    #[error("`{}` is not a bundle (no manifest.json or weights.safetensors); refusing to replace it", dir.display())]
    NotABundle { dir: PathBuf },
    /// A tensor handed to the writer is refused.
    #[error("tensor `{tensor}`: {problem}")]
    InvalidTensor { tensor: String, problem: String },
    /// A file handed to the writer is refused.
    #[error("bundle file `{file}`: {problem}")]
    InvalidFile { file: String, problem: String },
}

impl BundleError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        BundleError::Io { path: path.into(), source }
    }

    /// The bundle file this error is about, as the manifest names it, when it is about one.
    pub fn file(&self) -> Option<&str> {
        match self {
            BundleError::Missing { file }
            | BundleError::NotAFile { file }
            | BundleError::SizeMismatch { file, .. }
            | BundleError::HashMismatch { file, .. }
            | BundleError::FormatTooNew { file, .. }
            | BundleError::MalformedManifest { file, .. }
            | BundleError::MalformedSafetensors { file, .. }
            | BundleError::MalformedTensor { file, .. }
            | BundleError::PathEscape { file, .. }
            | BundleError::InvalidFile { file, .. } => Some(file),
            BundleError::WrongTarget { .. }
            | BundleError::Io { .. }
            | BundleError::DirectoryNotEmpty { .. }
            | BundleError::NotABundle { .. }
            | BundleError::InvalidTensor { .. } => None,
        }
    }
}

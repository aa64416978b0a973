//! Which relative paths a bundle may list, and resolving them without leaving the bundle.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::BundleError;

/// Checks the spelling of a bundle-relative path: `/`-separated, relative, and made only of plain
/// names (no empty, `.` or `..` components, no backslashes or NULs), so the same text names the
/// same file on every platform and cannot climb out of the bundle.
pub(crate) fn check_relative_path(path: &str) -> Result<(), BundleError> {
    let refuse = |reason: &str| Err(BundleError::PathEscape { file: path.to_string(), reason: reason.to_string() });
    if path.is_empty() {
        return refuse("is empty");
    }
    if path.starts_with('/') || Path::new(path).is_absolute() {
        return refuse("is absolute");
    }
    if path.contains('\\') {
        return refuse("contains a backslash (bundle paths use `/`)");
    }
    if path.contains('\0') {
        return refuse("contains a NUL byte");
    }
    for component in path.split('/') {
        match component {
            ".." => return refuse("contains `..`"),
            "" | "." => return refuse("contains an empty or `.` component"),
            _ => {}
        }
    }
    Ok(())
}

/// Resolves `path` (already checked by [`check_relative_path`]) inside the canonical bundle
/// directory `root`, following symlinks, and refuses a result outside `root` or that is not a
/// regular file.
pub(crate) fn resolve_inside(root: &Path, path: &str) -> Result<PathBuf, BundleError> {
    let joined = root.join(path);
    let resolved = match fs::canonicalize(&joined) {
        Ok(resolved) => resolved,
        // A dangling symlink is reported as missing, like any other absent file.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(BundleError::Missing { file: path.to_string() });
        }
        Err(e) => return Err(BundleError::io(path, e)),
    };
    if !resolved.starts_with(root) {
        return Err(BundleError::PathEscape {
            file: path.to_string(),
            reason: format!("resolves through a symlink to `{}`, outside the bundle", resolved.display()),
        });
    }
    let metadata = fs::metadata(&resolved).map_err(|e| BundleError::io(path, e))?;
    if !metadata.is_file() {
        return Err(BundleError::NotAFile { file: path.to_string() });
    }
    Ok(resolved)
}

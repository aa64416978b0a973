//! Opening a bundle: every check before any use, then the weights memory-mapped.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::digest::{blake3_hex, blake3_hex_parallel, digest_of_reader};
use super::manifest::{FileEntry, Manifest, ModelConfig, Target};
use super::paths::resolve_inside;
use super::program::Program;
use super::safetensors::{self, TensorRecord};
use super::{BundleError, Dtype, MANIFEST_FILE, WEIGHTS_FILE};

/// The largest `manifest.json` accepted (the program it stores is the only part that grows).
const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// An open, verified bundle. Its tensors are slices of a read-only memory map of the weights
/// file, each starting on a 64-byte boundary. A bundle is immutable once written: changing its
/// files while it is open is not supported (the map would show the change).
pub struct Bundle {
    dir: PathBuf,
    manifest: Manifest,
    weights: Mmap,
    tensors: BTreeMap<String, TensorRecord>,
}

/// One tensor of the weights file.
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    /// `dtype` × `shape` bytes, little-endian, starting on a 64-byte boundary.
    pub bytes: &'a [u8],
    /// The layout description the compiler stored with the tensor, if any.
    pub metadata: Option<&'a serde_json::Value>,
}

impl fmt::Debug for TensorView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The bytes can be hundreds of megabytes; their length says enough.
        f.debug_struct("TensorView")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("bytes", &format_args!("[{} bytes]", self.bytes.len()))
            .field("metadata", &self.metadata)
            .finish()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verify {
    SizesAndHashes,
    SizesOnly,
}

impl Bundle {
    /// Opens the bundle in `dir` after checking, in order: the manifest (format not newer than
    /// this runtime's, its own checksum, its fields), the target when `expected_target` names one,
    /// that every listed file is inside the directory (no `..`, absolute path or symlink leading
    /// out), exists and has the listed size, then every file's BLAKE3, then the weights header
    /// (bounds, overlaps, dtype × shape, alignment). The first failure is returned. Files the
    /// manifest does not list are ignored.
    pub fn open(dir: impl AsRef<Path>, expected_target: Option<&str>) -> Result<Bundle, BundleError> {
        Bundle::open_checked(dir.as_ref(), expected_target, Verify::SizesAndHashes)
    }

    /// [`Bundle::open`] without hashing the listed files (the manifest's own checksum, the sizes
    /// and the weights header are still checked). For benchmarks that open a bundle already
    /// verified once; anything else uses [`Bundle::open`].
    pub fn open_unverified(dir: impl AsRef<Path>, expected_target: Option<&str>) -> Result<Bundle, BundleError> {
        Bundle::open_checked(dir.as_ref(), expected_target, Verify::SizesOnly)
    }

    fn open_checked(dir: &Path, expected_target: Option<&str>, verify: Verify) -> Result<Bundle, BundleError> {
        let root = fs::canonicalize(dir).map_err(|e| BundleError::io(dir, e))?;
        let manifest = read_manifest(&root)?;
        if let Some(expected) = expected_target {
            if manifest.target.as_str() != expected {
                return Err(BundleError::WrongTarget {
                    expected: expected.to_string(),
                    found: manifest.target.as_str().to_string(),
                });
            }
        }

        // Every file is found and measured before any is hashed, so a missing or truncated file is
        // reported at once.
        let mut opened = Vec::with_capacity(manifest.files.len());
        for entry in &manifest.files {
            let path = resolve_inside(&root, &entry.path)?;
            let file = File::open(&path).map_err(|e| BundleError::io(&entry.path, e))?;
            let actual_bytes = file.metadata().map_err(|e| BundleError::io(&entry.path, e))?.len();
            check_size(entry, actual_bytes)?;
            opened.push((entry, file));
        }

        let weights_entry = manifest.file(WEIGHTS_FILE).expect("Manifest::decode requires the weights file");
        let weights_file = &opened.iter().find(|(entry, _)| entry.path == WEIGHTS_FILE).expect("opened above").1;
        let weights = map_weights(weights_entry, weights_file)?;

        if verify == Verify::SizesAndHashes {
            for (entry, file) in &mut opened {
                let actual = if entry.path == WEIGHTS_FILE {
                    digest_of_mapped(&weights)
                } else {
                    digest_of_reader(file).map_err(|e| BundleError::io(&entry.path, e))?.0
                };
                check_hash(entry, actual)?;
            }
        }

        let tensors = safetensors::parse(WEIGHTS_FILE, &weights)?;
        Ok(Bundle { dir: root, manifest, weights, tensors })
    }

    /// The bundle directory (canonical).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn target(&self) -> Target {
        self.manifest.target
    }

    pub fn model(&self) -> &ModelConfig {
        &self.manifest.model
    }

    /// The executor's program as the compiler stored it.
    pub fn program(&self) -> &Program {
        &self.manifest.program
    }

    /// The drafter program the bundle carries, if any.
    pub fn drafter(&self) -> Option<&crate::Drafter> {
        self.manifest.drafter.as_ref()
    }

    /// The tensor called `name`, if the weights file has it.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.tensors.get_key_value(name).map(|(name, record)| self.view(name, record))
    }

    /// Every tensor, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> + '_ {
        self.tensors.iter().map(|(name, record)| self.view(name, record))
    }

    /// Where a listed file is on disk (`None` when the manifest does not list `rel_path`).
    pub fn file_path(&self, rel_path: &str) -> Option<PathBuf> {
        self.manifest.file(rel_path).map(|entry| self.dir.join(&entry.path))
    }

    /// The bytes of a listed file, checked again against the manifest's size and hash as they are
    /// read (so what the caller gets is what was verified).
    pub fn read_file(&self, rel_path: &str) -> Result<Vec<u8>, BundleError> {
        let entry = self.manifest.file(rel_path).ok_or_else(|| BundleError::InvalidFile {
            file: rel_path.to_string(),
            problem: "is not listed in the manifest".to_string(),
        })?;
        let path = resolve_inside(&self.dir, &entry.path)?;
        let mut bytes = Vec::new();
        File::open(&path)
            .and_then(|mut file| file.read_to_end(&mut bytes))
            .map_err(|e| BundleError::io(rel_path, e))?;
        check_size(entry, bytes.len() as u64)?;
        check_hash(entry, blake3_hex(&bytes))?;
        Ok(bytes)
    }

    fn view<'a>(&'a self, name: &'a str, record: &'a TensorRecord) -> TensorView<'a> {
        TensorView {
            name,
            dtype: record.dtype,
            shape: &record.shape,
            bytes: &self.weights[record.range.clone()],
            metadata: record.metadata.as_ref(),
        }
    }
}

fn read_manifest(root: &Path) -> Result<Manifest, BundleError> {
    let path = resolve_inside(root, MANIFEST_FILE)?;
    let file = File::open(&path).map_err(|e| BundleError::io(MANIFEST_FILE, e))?;
    let size_bytes = file.metadata().map_err(|e| BundleError::io(MANIFEST_FILE, e))?.len();
    if size_bytes > MAX_MANIFEST_BYTES {
        return Err(BundleError::MalformedManifest {
            file: MANIFEST_FILE.to_string(),
            path: ".".to_string(),
            message: format!("{size_bytes} bytes is more than the limit of {MAX_MANIFEST_BYTES}"),
        });
    }
    let mut bytes = Vec::with_capacity(size_bytes as usize);
    file.take(MAX_MANIFEST_BYTES).read_to_end(&mut bytes).map_err(|e| BundleError::io(MANIFEST_FILE, e))?;
    Manifest::decode(&bytes)
}

fn check_size(entry: &FileEntry, actual_bytes: u64) -> Result<(), BundleError> {
    if actual_bytes != entry.size_bytes {
        return Err(BundleError::SizeMismatch {
            file: entry.path.clone(),
            expected_bytes: entry.size_bytes,
            actual_bytes,
        });
    }
    Ok(())
}

fn check_hash(entry: &FileEntry, actual: String) -> Result<(), BundleError> {
    if actual != entry.blake3 {
        return Err(BundleError::HashMismatch { file: entry.path.clone(), expected: entry.blake3.clone(), actual });
    }
    Ok(())
}

/// Maps the weights file read-only. It is at least as long as the manifest says (checked before),
/// and a safetensors file is never empty.
fn map_weights(entry: &FileEntry, file: &File) -> Result<Mmap, BundleError> {
    if entry.size_bytes < 8 {
        return Err(BundleError::MalformedSafetensors {
            file: WEIGHTS_FILE.to_string(),
            problem: format!("{} bytes is too short for the 8-byte header length", entry.size_bytes),
        });
    }
    // SAFETY: the map is read-only. Bytes seen through it can change only if another process
    // rewrites the file while the bundle is open, which `Bundle` documents as unsupported; the
    // length was checked against the manifest just before.
    let weights = unsafe { Mmap::map(file) }.map_err(|e| BundleError::io(WEIGHTS_FILE, e))?;
    check_size(entry, weights.len() as u64)?;
    Ok(weights)
}

/// Hashes the mapped weights in place, telling the kernel the pages are read once in order.
fn digest_of_mapped(weights: &Mmap) -> String {
    let _ = weights.advise(memmap2::Advice::Sequential);
    let digest = blake3_hex_parallel(weights);
    let _ = weights.advise(memmap2::Advice::Normal);
    digest
}

//! `manifest.json`: what a bundle is (format, compiler, target, model, program) and every file it
//! holds, sealed with a checksum of its own bytes.
//!
//! The manifest is pretty-printed JSON whose last member is `"manifest_blake3": "<hex>"`, followed
//! by exactly `"\n}\n`. The checksum is the BLAKE3 of every byte before the 64 hex digits (up to
//! and including the value's opening quote), so any change to the manifest, including to the
//! program it stores, is detected without a second file.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::digest::{blake3_hex, is_digest_hex};
use super::paths::check_relative_path;
use super::program::Program;
use super::{BundleError, MANIFEST_FILE, WEIGHTS_FILE};

/// The bundle format this runtime writes and reads. Bundles of a newer format are refused, and of
/// an older one too (format 1 listed SHA-256 digests; recompile such a bundle).
pub const FORMAT_VERSION: u32 = 2;

const CHECKSUM_KEY: &str = "manifest_blake3";
const CHECKSUM_MARKER: &[u8] = b"\"manifest_blake3\": \"";
const CHECKSUM_TAIL: &[u8] = b"\"\n}\n";

/// The target a bundle is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Target {
    #[serde(rename = "cpu")]
    Cpu,
    #[serde(rename = "xdna")]
    Xdna,
    #[serde(rename = "intel-npu")]
    IntelNpu,
}

impl Target {
    pub const ALL: [Target; 3] = [Target::Cpu, Target::Xdna, Target::IntelNpu];

    /// The name the CLI and the manifest use: `cpu`, `xdna` or `intel-npu`.
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::Xdna => "xdna",
            Target::IntelNpu => "intel-npu",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Target {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Target::ALL
            .into_iter()
            .find(|target| target.as_str() == name)
            .ok_or_else(|| format!("unknown target `{name}` (expected cpu, xdna or intel-npu)"))
    }
}

/// The decoder's hyper-parameters, as the executor needs them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub layers: usize,
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate: usize,
    pub vocab: usize,
    pub rms_eps: f64,
    pub rope_theta: f64,
    /// Whether the lm_head reuses the embedding table (stored once).
    pub tied_embeddings: bool,
    pub max_positions: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    /// Tokens that end generation (the eos token among them when the model has one).
    pub stop_token_ids: Vec<u32>,
}

/// One file of the bundle: its path relative to the bundle directory (`/`-separated), its size
/// and the lower-case hex BLAKE3 of its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub path: String,
    pub size_bytes: u64,
    pub blake3: String,
}

/// What the compiler states about a bundle; the writer adds the format version and the files.
#[derive(Clone, Debug, PartialEq)]
pub struct ManifestHeader {
    pub compiler_version: String,
    pub target: Target,
    pub model: ModelConfig,
    /// The executor's program, stored and checksummed with the rest.
    pub program: Program,
}

/// The decoded `manifest.json` (without its checksum, which [`Manifest::decode`] has verified).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u32,
    pub compiler_version: String,
    pub target: Target,
    pub model: ModelConfig,
    pub program: Program,
    /// A second program for speculative decoding, over the same weights file (absent when the
    /// model came without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter: Option<Drafter>,
    /// Every file of the bundle except `manifest.json`, sorted by path.
    pub files: Vec<FileEntry>,
}

/// A drafter program the bundle carries beside the decoder's. Its weights are in the same
/// weights file: a tensor both programs read (a shared embedding or lm_head) is stored once,
/// under one name; a tensor of the drafter whose name the decoder uses for other bytes is stored
/// under a name of its own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drafter {
    pub kind: DrafterKind,
    pub program: Program,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DrafterKind {
    /// A multi-token-prediction head: row t takes the decoder's final hidden state at position
    /// t (the decoder program's `hidden_states` output, an input of the drafter's) and the token
    /// at t + 1, at position t; its logits draft the token at t + 2, and its own
    /// `hidden_states_out` stands in for the decoder's when it drafts further.
    Mtp,
}

impl Manifest {
    /// The entry listing `path`, if any.
    pub fn file(&self, path: &str) -> Option<&FileEntry> {
        self.files.iter().find(|entry| entry.path == path)
    }

    /// The bytes of `manifest.json`: pretty JSON sealed with its checksum (see the module doc).
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a manifest always serialises");
        // Pretty output ends with the object's closing "\n}"; the checksum becomes its last member.
        debug_assert!(bytes.ends_with(b"\n}"));
        bytes.truncate(bytes.len() - 2);
        bytes.extend_from_slice(b",\n  ");
        bytes.extend_from_slice(CHECKSUM_MARKER);
        let checksum = blake3_hex(&bytes);
        bytes.extend_from_slice(checksum.as_bytes());
        bytes.extend_from_slice(CHECKSUM_TAIL);
        bytes
    }

    /// Decodes and checks the bytes of `manifest.json`: another format is refused before anything
    /// else (its layout may differ), then the checksum, the fields, and every listed path.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, BundleError> {
        let malformed = |path: &str, message: String| BundleError::MalformedManifest {
            file: MANIFEST_FILE.to_string(),
            path: path.to_string(),
            message,
        };
        let mut document: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| malformed(".", e.to_string()))?;

        let found = document
            .get("format_version")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| malformed("format_version", "missing, or not a non-negative integer".to_string()))?;
        if found > u64::from(FORMAT_VERSION) {
            return Err(BundleError::FormatTooNew {
                file: MANIFEST_FILE.to_string(),
                found: u32::try_from(found).unwrap_or(u32::MAX),
                supported: FORMAT_VERSION,
            });
        }
        // Checked before the checksum, whose key and algorithm older formats spell differently.
        if found < u64::from(FORMAT_VERSION) {
            let problem = format!(
                "format {found} is older than the one this runtime reads ({FORMAT_VERSION}); recompile the bundle"
            );
            return Err(malformed("format_version", problem));
        }

        verify_checksum(bytes)?;
        if let Some(object) = document.as_object_mut() {
            object.remove(CHECKSUM_KEY);
        }

        let manifest: Manifest = serde_path_to_error::deserialize(document)
            .map_err(|e| malformed(&e.path().to_string(), e.inner().to_string()))?;
        manifest.program.check().map_err(|e| malformed(&format!("program.{}", e.path), e.problem))?;
        if let Some(d) = &manifest.drafter {
            d.program.check().map_err(|e| malformed(&format!("drafter.program.{}", e.path), e.problem))?;
        }
        manifest.check_files()?;
        Ok(manifest)
    }

    fn check_files(&self) -> Result<(), BundleError> {
        let mut seen = BTreeSet::new();
        for (index, entry) in self.files.iter().enumerate() {
            check_relative_path(&entry.path)?;
            let malformed = |field: &str, message: String| BundleError::MalformedManifest {
                file: MANIFEST_FILE.to_string(),
                path: format!("files[{index}].{field}"),
                message,
            };
            if entry.path == MANIFEST_FILE {
                return Err(malformed("path", "the manifest cannot list itself".to_string()));
            }
            if !is_digest_hex(&entry.blake3) {
                return Err(malformed("blake3", format!("`{}` is not 64 lower-case hex digits", entry.blake3)));
            }
            if !seen.insert(entry.path.as_str()) {
                return Err(malformed("path", format!("`{}` is listed twice", entry.path)));
            }
        }
        if !seen.contains(WEIGHTS_FILE) {
            return Err(BundleError::MalformedManifest {
                file: MANIFEST_FILE.to_string(),
                path: "files".to_string(),
                message: format!("does not list `{WEIGHTS_FILE}`"),
            });
        }
        Ok(())
    }
}

/// Checks the manifest's own checksum against its bytes.
fn verify_checksum(bytes: &[u8]) -> Result<(), BundleError> {
    let malformed = |message: &str| BundleError::MalformedManifest {
        file: MANIFEST_FILE.to_string(),
        path: CHECKSUM_KEY.to_string(),
        message: message.to_string(),
    };
    let marker_at = bytes
        .windows(CHECKSUM_MARKER.len())
        .rposition(|window| window == CHECKSUM_MARKER)
        .ok_or_else(|| malformed("missing: the manifest must end with its checksum"))?;
    let digits_at = marker_at + CHECKSUM_MARKER.len();
    let tail_at = digits_at + 64;
    if bytes.len() < tail_at || &bytes[tail_at..] != CHECKSUM_TAIL {
        return Err(malformed("the manifest must end with its checksum, 64 hex digits, then `\"\\n}\\n`"));
    }
    let expected = String::from_utf8_lossy(&bytes[digits_at..tail_at]).into_owned();
    let actual = blake3_hex(&bytes[..digits_at]);
    if expected != actual {
        return Err(BundleError::HashMismatch { file: MANIFEST_FILE.to_string(), expected, actual });
    }
    Ok(())
}

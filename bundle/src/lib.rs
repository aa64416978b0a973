//! Bundles: the directory `NAME.npub/` the compiler writes and the runtime loads — the only thing
//! that crosses from one to the other.
//!
//! ```text
//! NAME.npub/
//!   manifest.json         format version, compiler version, target, model config, program,
//!                         and every other file with its size and BLAKE3; written last
//!   weights.safetensors   packed weights, each tensor's data 64-byte aligned in the file
//!   tokenizer.json        when the compiler was given one
//!   chat_template.jinja   when the model has one
//!   xdna/…, intel/…       target-specific files (designs, IR segments), listed like the rest
//! ```
//!
//! [`BundleWriter`] streams tensors to disk one at a time and writes the manifest atomically
//! once every file is complete. [`Bundle::open`] refuses a bundle of a newer format, for another
//! target, with a file missing, truncated, modified, outside the directory, or with a broken
//! weights header, naming the file (and tensor) and the problem; then it memory-maps the weights.
//! The manifest seals itself with a checksum of its own bytes (see [`Manifest::encode`]), so a
//! change to it is refused too.

mod digest;
mod error;
pub mod intel;
mod manifest;
pub mod packing;
mod paths;
pub mod program;
mod reader;
mod safetensors;
mod writer;
pub mod xdna;

pub use error::BundleError;
pub use manifest::{Drafter, DrafterKind, FileEntry, Manifest, ManifestHeader, ModelConfig, Target, FORMAT_VERSION};
pub use program::{Program, PROGRAM_FORMAT};
pub use reader::{Bundle, TensorView};
pub use safetensors::{Dtype, ALIGNMENT_BYTES};
pub use writer::{BundleSummary, BundleWriter, TensorSink, WriteOptions};

/// The manifest, always at the top of the bundle.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The packed weights, always present (possibly with no tensor).
pub const WEIGHTS_FILE: &str = "weights.safetensors";
/// The tokenizer, when the bundle has one.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The chat template, when the model has one.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

//! The weights file: safetensors with every tensor's data aligned to [`ALIGNMENT_BYTES`].
//!
//! Layout (the format's own): an 8-byte little-endian header length N, N bytes of JSON header,
//! then the data section. The header maps each tensor name to `{"dtype", "shape",
//! "data_offsets": [begin, end]}` (offsets relative to the data section) and may hold
//! `"__metadata__"`, a map of strings.
//!
//! What this writer adds, all within the format: the header is padded with spaces so the data
//! section starts on a multiple of 64 bytes; the gap before a tensor that would start unaligned is
//! covered by a `U8` filler entry named `__pad__.<k>`, so tensors stay contiguous and other
//! safetensors readers still accept the file; a tensor's layout description is stored in
//! `__metadata__` under `layout.<tensor name>` as JSON text.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use serde::Deserialize;

use super::BundleError;

/// Alignment, in bytes within the file, of every tensor's data (and so of every tensor's bytes in
/// a memory map, which starts on a page).
pub const ALIGNMENT_BYTES: usize = 64;

/// The largest header accepted, as other safetensors readers limit it.
pub(crate) const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Names of the filler entries that align the next tensor; never a model tensor.
pub(crate) const PADDING_PREFIX: &str = "__pad__.";
/// Names starting with this are the format's own (`__metadata__`, fillers).
pub(crate) const RESERVED_PREFIX: &str = "__";
const METADATA_KEY: &str = "__metadata__";
const LAYOUT_PREFIX: &str = "layout.";
const ALIGNMENT_KEY: &str = "alignment_bytes";

/// Element types of stored tensors. Packed int4 blocks are stored as `U8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    U8,
    I8,
    F16,
    BF16,
    F32,
    I32,
}

impl Dtype {
    pub const ALL: [Dtype; 6] = [Dtype::U8, Dtype::I8, Dtype::F16, Dtype::BF16, Dtype::F32, Dtype::I32];

    pub fn size_bytes(self) -> usize {
        match self {
            Dtype::U8 | Dtype::I8 => 1,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
        }
    }

    /// The safetensors spelling: `U8`, `I8`, `F16`, `BF16`, `F32`, `I32`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::I32 => "I32",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Dtype {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Dtype::ALL.into_iter().find(|dtype| dtype.as_str() == name).ok_or_else(|| format!("unknown dtype `{name}`"))
    }
}

/// Byte length of a tensor of `dtype` and `shape`, `None` when it overflows.
pub(crate) fn byte_len(dtype: Dtype, shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(dtype.size_bytes(), |bytes, &dim| bytes.checked_mul(dim))
}

/// One header entry as the writer records it; offsets are relative to the data section.
pub(crate) struct HeaderEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data_offsets: [u64; 2],
    /// JSON text of the tensor's layout description.
    pub layout: Option<String>,
}

/// The length prefix and the header, padded with spaces so the data section that follows starts
/// on a multiple of [`ALIGNMENT_BYTES`].
pub(crate) fn encode_header(entries: &[HeaderEntry]) -> Vec<u8> {
    encode_header_padded(entries, 0)
}

/// [`encode_header`] with the JSON padded with spaces so that the header (length prefix
/// included) is at least `min_bytes` long; `min_bytes` must be a multiple of [`ALIGNMENT_BYTES`].
pub(crate) fn encode_header_padded(entries: &[HeaderEntry], min_bytes: usize) -> Vec<u8> {
    let mut metadata = serde_json::Map::new();
    metadata.insert(ALIGNMENT_KEY.to_string(), ALIGNMENT_BYTES.to_string().into());
    let mut header = serde_json::Map::new();
    for entry in entries {
        if let Some(layout) = &entry.layout {
            metadata.insert(format!("{LAYOUT_PREFIX}{}", entry.name), layout.clone().into());
        }
        header.insert(
            entry.name.clone(),
            serde_json::json!({
                "dtype": entry.dtype.as_str(),
                "shape": entry.shape,
                "data_offsets": entry.data_offsets,
            }),
        );
    }
    header.insert(METADATA_KEY.to_string(), metadata.into());
    let mut json = serde_json::to_vec(&header).expect("a header always serialises");
    let unaligned = (8 + json.len()) % ALIGNMENT_BYTES;
    if unaligned != 0 {
        json.resize(json.len() + ALIGNMENT_BYTES - unaligned, b' ');
    }
    if 8 + json.len() < min_bytes {
        json.resize(min_bytes - 8, b' ');
    }
    let mut bytes = Vec::with_capacity(8 + json.len());
    bytes.extend_from_slice(&(json.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&json);
    bytes
}

/// A tensor found in the weights file; `range` is absolute within the file.
pub(crate) struct TensorRecord {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub range: Range<usize>,
    pub metadata: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Parses and checks the header of the safetensors `file` whose bytes are `bytes`: the header
/// length fits the file and the limit, the header is a JSON object, every entry has a known dtype,
/// offsets inside the data section whose length matches dtype × shape, data aligned to
/// [`ALIGNMENT_BYTES`] in the file, and no two tensors overlap. Fillers are checked, not returned.
pub(crate) fn parse(file: &str, bytes: &[u8]) -> Result<BTreeMap<String, TensorRecord>, BundleError> {
    let malformed = |problem: String| BundleError::MalformedSafetensors { file: file.to_string(), problem };
    let tensor_error = |tensor: &str, problem: String| BundleError::MalformedTensor {
        file: file.to_string(),
        tensor: tensor.to_string(),
        problem,
    };

    let file_len = bytes.len() as u64;
    if file_len < 8 {
        return Err(malformed(format!("{file_len} bytes is too short for the 8-byte header length")));
    }
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if header_len > MAX_HEADER_BYTES {
        return Err(malformed(format!("header length {header_len} exceeds the limit of {MAX_HEADER_BYTES} bytes")));
    }
    if 8 + header_len > file_len {
        return Err(malformed(format!("header length {header_len} runs past the end of the file ({file_len} bytes)")));
    }
    let data_start = 8 + header_len as usize;
    let data_len = file_len - data_start as u64;
    let mut header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| malformed(format!("the header is not a JSON object: {e}")))?;

    let mut layouts = match header.remove(METADATA_KEY) {
        None => BTreeMap::new(),
        Some(metadata) => parse_metadata(file, metadata)?,
    };

    let mut tensors = BTreeMap::new();
    let mut occupied = Vec::new();
    for (name, value) in header {
        let entry: RawEntry =
            serde_json::from_value(value).map_err(|e| tensor_error(&name, format!("bad entry: {e}")))?;
        let dtype: Dtype = entry.dtype.parse().map_err(|e| tensor_error(&name, e))?;
        let shape = entry
            .shape
            .iter()
            .map(|&dim| usize::try_from(dim))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| tensor_error(&name, format!("shape {:?} does not fit this machine", entry.shape)))?;
        let needed_bytes = byte_len(dtype, &shape)
            .ok_or_else(|| tensor_error(&name, format!("shape {shape:?} of {dtype} overflows the address space")))?;
        let [begin, end] = entry.data_offsets;
        if begin > end {
            return Err(tensor_error(&name, format!("data_offsets [{begin}, {end}] are reversed")));
        }
        if end > data_len {
            return Err(tensor_error(
                &name,
                format!("data_offsets [{begin}, {end}] run past the end of the data section ({data_len} bytes)"),
            ));
        }
        let held_bytes = end - begin;
        if held_bytes != needed_bytes as u64 {
            return Err(tensor_error(
                &name,
                format!("data_offsets [{begin}, {end}] hold {held_bytes} bytes, but {dtype} × {shape:?} is {needed_bytes} bytes"),
            ));
        }
        let range = data_start + begin as usize..data_start + end as usize;
        if !range.is_empty() {
            occupied.push((range.clone(), name.clone()));
        }
        if name.starts_with(PADDING_PREFIX) {
            if dtype != Dtype::U8 || shape.len() != 1 {
                return Err(tensor_error(&name, "an alignment filler must be a 1-D U8 tensor".to_string()));
            }
            continue;
        }
        if range.start % ALIGNMENT_BYTES != 0 {
            return Err(tensor_error(
                &name,
                format!("data starts at file offset {}, not a multiple of {ALIGNMENT_BYTES}", range.start),
            ));
        }
        let metadata = layouts.remove(&name);
        tensors.insert(name, TensorRecord { dtype, shape, range, metadata });
    }

    if let Some(orphan) = layouts.keys().next() {
        return Err(tensor_error(orphan, "has a layout description but no entry in the header".to_string()));
    }
    check_no_overlap(file, occupied)?;
    Ok(tensors)
}

/// Reads `__metadata__` (a map of strings) and returns the layout descriptions by tensor name.
fn parse_metadata(file: &str, metadata: serde_json::Value) -> Result<BTreeMap<String, serde_json::Value>, BundleError> {
    let malformed = |problem: String| BundleError::MalformedSafetensors { file: file.to_string(), problem };
    let serde_json::Value::Object(metadata) = metadata else {
        return Err(malformed(format!("`{METADATA_KEY}` is not an object of strings")));
    };
    let mut layouts = BTreeMap::new();
    for (key, value) in metadata {
        let serde_json::Value::String(text) = value else {
            return Err(malformed(format!("`{METADATA_KEY}`: `{key}` is not a string")));
        };
        if let Some(tensor) = key.strip_prefix(LAYOUT_PREFIX) {
            let layout = serde_json::from_str(&text).map_err(|e| BundleError::MalformedTensor {
                file: file.to_string(),
                tensor: tensor.to_string(),
                problem: format!("layout description is not JSON: {e}"),
            })?;
            layouts.insert(tensor.to_string(), layout);
        }
    }
    Ok(layouts)
}

/// Refuses two non-empty byte ranges that share a byte, naming the later one.
fn check_no_overlap(file: &str, mut occupied: Vec<(Range<usize>, String)>) -> Result<(), BundleError> {
    occupied.sort_by_key(|(range, _)| (range.start, range.end));
    let mut furthest: Option<&(Range<usize>, String)> = None;
    for current in &occupied {
        if let Some(previous) = furthest {
            if current.0.start < previous.0.end {
                return Err(BundleError::MalformedTensor {
                    file: file.to_string(),
                    tensor: current.1.clone(),
                    problem: format!(
                        "its data (file bytes {:?}) overlaps tensor `{}` (file bytes {:?})",
                        current.0, previous.1, previous.0
                    ),
                });
            }
        }
        if furthest.is_none_or(|previous| current.0.end > previous.0.end) {
            furthest = Some(current);
        }
    }
    Ok(())
}

//! Layout descriptions of packed weights: the metadata a packed tensor carries in the weights
//! header, and the names packed tensors take. The compiler writes them with the packed bytes; the
//! executor reads them to find a weight's packed form. What the bytes mean (panel order, block
//! layout) belongs to the kernels that define it — the runtime's `exec::packed` documents that.
//!
//! A description is a JSON object tagged by `packing`:
//!
//! | tag | kernel | fields |
//! |---|---|---|
//! | `npuc-wgemm-panel16/1` | 4-bit weight-only GEMM | `k`, `n`, `bits`, `block_size`, `source`, `scales`, `zero_points` (name or null) |
//! | `npuc-qgemm-panel16/1` | int8 × int8 GEMM | `k`, `n`, `source`, `unsigned` |
//! | `npuc-gemm-panel32/1` | f32 GEMM | `k`, `n`, `source` |
//!
//! `source`, `scales` and `zero_points` name the program's weights the tensor was packed from.
//! A weight whose dtype safetensors has no name for is stored as bytes with a [`RawStorage`]
//! description instead.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

pub const WGEMM_PACKING: &str = "npuc-wgemm-panel16/1";
pub const QGEMM_PACKING: &str = "npuc-qgemm-panel16/1";
pub const GEMM_PACKING: &str = "npuc-gemm-panel32/1";

/// A packed MatMulNBits weight: codes, scales and zero points in 16-column panels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WGemmLayout {
    pub k: usize,
    pub n: usize,
    pub bits: usize,
    pub block_size: usize,
    pub source: String,
    pub scales: String,
    pub zero_points: Option<String>,
}

/// Packed int8 QGemm weight codes with their column sums.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QGemmLayout {
    pub k: usize,
    pub n: usize,
    pub source: String,
    /// The source codes are u8 (stored as `w − 128`).
    pub unsigned: bool,
}

/// A float MatMul weight as the f32 GEMM's 32-column panels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmLayout {
    pub k: usize,
    pub n: usize,
    pub source: String,
}

/// A weight of a dtype the weights file cannot name, stored as its bytes (`U8`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStorage {
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// A layout description of one kind, with its tag.
pub trait Packing: Serialize + DeserializeOwned {
    const TAG: &'static str;

    /// The description as the weights header stores it.
    fn to_metadata(&self) -> Json {
        let mut json = serde_json::to_value(self).expect("a layout always serialises");
        json.as_object_mut().expect("a layout is an object").insert("packing".to_string(), Self::TAG.into());
        json
    }

    /// Decodes a tensor's description, refusing one of another tag (naming both) or with a field
    /// missing, of the wrong type, or unknown.
    fn from_metadata(metadata: Option<&Json>) -> Result<Self, LayoutError> {
        let mut json = metadata.ok_or(LayoutError::Missing)?.clone();
        let object = json.as_object_mut().ok_or(LayoutError::NotAnObject)?;
        match object.remove("packing") {
            Some(Json::String(tag)) if tag == Self::TAG => {}
            found => return Err(LayoutError::OtherPacking { found: found.unwrap_or(Json::Null), expected: Self::TAG }),
        }
        serde_json::from_value(json).map_err(|e| LayoutError::Field(e.to_string()))
    }
}

impl Packing for WGemmLayout {
    const TAG: &'static str = WGEMM_PACKING;
}

impl Packing for QGemmLayout {
    const TAG: &'static str = QGEMM_PACKING;
}

impl Packing for GemmLayout {
    const TAG: &'static str = GEMM_PACKING;
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LayoutError {
    #[error("has no layout description")]
    Missing,
    #[error("has a layout description that is not an object")]
    NotAnObject,
    #[error("has packing {found}, expected \"{expected}\"")]
    OtherPacking { found: Json, expected: &'static str },
    #[error("layout description: {0}")]
    Field(String),
}

/// Names of the packed tensors of the MatMulNBits codes weight `source`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WGemmNames {
    pub codes: String,
    pub scales: String,
    pub zero_points: String,
}

pub fn wgemm_names(source: &str) -> WGemmNames {
    WGemmNames {
        codes: format!("{source}.wgemm.codes"),
        scales: format!("{source}.wgemm.scales"),
        zero_points: format!("{source}.wgemm.zero_points"),
    }
}

/// Names of the packed QGemm tensors (codes, column sums) of the weight codes `source`.
pub fn qgemm_names(source: &str) -> (String, String) {
    (format!("{source}.qgemm.codes"), format!("{source}.qgemm.col_sums"))
}

/// The name of the panels of the f32 weight `source`.
pub fn gemm_panels_name(source: &str) -> String {
    format!("{source}.gemm.panels")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_round_trip_with_their_tag() {
        let w = WGemmLayout {
            k: 64,
            n: 48,
            bits: 4,
            block_size: 32,
            source: "w".to_string(),
            scales: "s".to_string(),
            zero_points: None,
        };
        let json = w.to_metadata();
        assert_eq!(json["packing"], WGEMM_PACKING);
        assert_eq!(WGemmLayout::from_metadata(Some(&json)).unwrap(), w);
        let q = QGemmLayout { k: 8, n: 16, source: "q".to_string(), unsigned: true };
        assert_eq!(QGemmLayout::from_metadata(Some(&q.to_metadata())).unwrap(), q);
        let g = GemmLayout { k: 8, n: 16, source: "g".to_string() };
        assert_eq!(GemmLayout::from_metadata(Some(&g.to_metadata())).unwrap(), g);
    }

    #[test]
    fn another_tag_a_missing_field_and_no_description_are_refused() {
        let g = GemmLayout { k: 8, n: 16, source: "g".to_string() }.to_metadata();
        let error = WGemmLayout::from_metadata(Some(&g)).unwrap_err().to_string();
        assert!(error.contains(GEMM_PACKING) && error.contains(WGEMM_PACKING), "{error}");
        let mut q = QGemmLayout { k: 8, n: 16, source: "q".to_string(), unsigned: false }.to_metadata();
        q.as_object_mut().unwrap().remove("unsigned");
        let error = QGemmLayout::from_metadata(Some(&q)).unwrap_err().to_string();
        assert!(error.contains("unsigned"), "{error}");
        assert_eq!(GemmLayout::from_metadata(None).unwrap_err(), LayoutError::Missing);
    }
}

//! WGemm, QGemm and float MatMul weights in a bundle, packed at compile time.
//!
//! # WGemm
//!
//! For a WGemm node whose MatMulNBits codes are the weight `W`, the compiler runs
//! [`pack_wgemm`](crate::kernels::wgemm::pack_wgemm) — the very function the kernels' layout is
//! defined by — and stores its three buffers as they are, under names derived from `W`
//! ([`packed_names`]):
//!
//! | tensor | dtype | shape |
//! |---|---|---|
//! | `W.wgemm.codes` | U8 | `[panels·blocks·block_bytes]` |
//! | `W.wgemm.scales` | F32 | `[panels·blocks·16]` |
//! | `W.wgemm.zero_points` (when the node has zero points) | U8 or F32 | `[panels·blocks·16]` |
//!
//! The codes tensor carries the layout description ([`layout_json`]): `{"packing":
//! "npuc-wgemm-panel16/1", "k", "n", "bits", "block_size", "source": W, "scales": S,
//! "zero_points": Z | null}`, where `S` and `Z` name the node's scale and zero-point weights. The
//! program is unchanged (the node still reads `W`, `S`, `Z`); the MatMulNBits tensors themselves are
//! left out of the bundle when nothing else reads them, so each weight is stored once. A tied
//! embedding read by `GatherBlockQuantized` with the lm_head's very codes, scales and zero points
//! gathers its rows from the packed form (`embed_packed`).
//!
//! The executor reads the three tensors in place from the memory map (every tensor starts on a
//! 64-byte boundary): no copy and no packing at load. The bundle format stays 1: which form a
//! WGemm's weights take is decided per weight by the presence of the packed tensors, so bundles
//! written before packing (MatMulNBits tensors only), or a WGemm the compiler could not pack, still
//! load — their weights are packed at load, and `Executor::wgemm_bytes_packed_at_load` says how
//! many bytes that copy holds. A packed layout of another `packing` tag is refused naming the
//! tensor and both tags; a runtime that predates packing refuses a packed bundle naming the
//! MatMulNBits weight it cannot find.
//!
//! # QGemm
//!
//! For a QGemm node whose int8 weight codes are the weight `W` (`[K, N]`, i8 or u8), the compiler
//! runs [`pack_qgemm_codes`](crate::kernels::qgemm::pack_qgemm_codes) and stores
//!
//! | tensor | dtype | shape |
//! |---|---|---|
//! | `W.qgemm.codes` | I8 | `[panels·⌈K/4⌉·64]` |
//! | `W.qgemm.col_sums` | I32 | `[panels·16]` |
//!
//! with the layout description `{"packing": "npuc-qgemm-panel16/1", "k", "n", "source": W,
//! "unsigned": true if W is u8}` on the codes. These are what depend on the codes; the per-column
//! zero points and scales (N values each) come from the node's own weight scale and zero point at
//! load ([`qgemm_columns`](crate::kernels::qgemm::qgemm_columns)). `W` is left out of the bundle
//! when only packed QGemms read it; a QGemm without packed tensors (an older bundle, or weight
//! codes the program computes, such as a tied lm_head quantised in the graph) is packed at load.
//!
//! # Float MatMul
//!
//! For a float MatMul whose right operand is the f32 weight `W` (`[K, N]`), the compiler stores
//! `W.gemm.panels` (F32, `[⌈N/32⌉·32·K]`, the layout of
//! [`pack_f32_panels`](crate::kernels::gemm::pack_f32_panels)) with the layout description
//! `{"packing": "npuc-gemm-panel32/1", "k", "n", "source": W}`, and leaves `W` out when only such
//! MatMuls read it. A MatMul without panels (an older bundle, a weight read transposed, such as a
//! tied lm_head reading the embedding table) reads its weight in place as it is stored.

use serde_json::{json, Value};

use crate::bundle::{Dtype, TensorView};
use crate::kernels::wgemm::{PackedWGemm, PackedZeroPoints, WGemmWeights, WGemmZeroPoints};

/// The `packing` tag of the layout description.
pub const PACKING: &str = "npuc-wgemm-panel16/1";

/// Names of the packed tensors of the MatMulNBits codes weight `source`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedNames {
    pub codes: String,
    pub scales: String,
    pub zero_points: String,
}

pub fn packed_names(source: &str) -> PackedNames {
    PackedNames {
        codes: format!("{source}.wgemm.codes"),
        scales: format!("{source}.wgemm.scales"),
        zero_points: format!("{source}.wgemm.zero_points"),
    }
}

/// The layout description stored with the codes tensor of `packed`, packed from the weights
/// `source` (codes), `scales` and `zero_points`.
pub fn layout_json(packed: &PackedWGemm, source: &str, scales: &str, zero_points: Option<&str>) -> Value {
    json!({
        "packing": PACKING,
        "k": packed.k,
        "n": packed.n,
        "bits": packed.bits,
        "block_size": packed.block_size,
        "source": source,
        "scales": scales,
        "zero_points": zero_points,
    })
}

/// A decoded layout description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedLayout {
    pub k: usize,
    pub n: usize,
    pub bits: usize,
    pub block_size: usize,
    pub source: String,
    pub scales: String,
    pub zero_points: Option<String>,
}

/// A layout description with the `packing` tag `tag`, or what is wrong with it.
fn tagged<'v>(layout: Option<&'v Value>, tag: &str) -> Result<&'v Value, String> {
    let layout = layout.ok_or("has no layout description")?;
    if layout["packing"].as_str() != Some(tag) {
        return Err(format!("has packing {}, expected \"{tag}\"", layout["packing"]));
    }
    Ok(layout)
}

/// A layout description's size `key`.
fn layout_size(layout: &Value, key: &str) -> Result<usize, String> {
    layout[key].as_u64().and_then(|v| usize::try_from(v).ok()).ok_or(format!("layout `{key}` is not a size"))
}

/// A layout description's weight name `key`.
fn layout_name(layout: &Value, key: &str) -> Result<String, String> {
    layout[key].as_str().map(str::to_string).ok_or(format!("layout `{key}` is not a weight name"))
}

/// Decodes the layout description of a packed codes tensor; the error says what is wrong.
pub fn parse_layout(layout: Option<&Value>) -> Result<PackedLayout, String> {
    let layout = tagged(layout, PACKING)?;
    let size = |key: &str| layout_size(layout, key);
    let name = |key: &str| layout_name(layout, key);
    Ok(PackedLayout {
        k: size("k")?,
        n: size("n")?,
        bits: size("bits")?,
        block_size: size("block_size")?,
        source: name("source")?,
        scales: name("scales")?,
        zero_points: match &layout["zero_points"] {
            Value::Null => None,
            _ => Some(name("zero_points")?),
        },
    })
}

/// The owned buffers of `packed` as the bundle stores them: (dtype, bytes) of codes, scales and
/// zero points (none for the default zero point).
pub fn tensor_bytes(packed: &PackedWGemm) -> [Option<(Dtype, Vec<u8>)>; 3] {
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    [
        Some((Dtype::U8, packed.codes.clone())),
        Some((Dtype::F32, f32_bytes(&packed.scales))),
        match &packed.zero_points {
            PackedZeroPoints::Default => None,
            PackedZeroPoints::U8(z) => Some((Dtype::U8, z.clone())),
            PackedZeroPoints::F32(z) => Some((Dtype::F32, f32_bytes(z))),
        },
    ]
}

/// The packed weights read in place from the bundle's tensors, checked against `layout`.
pub fn mapped_weights<'b>(
    layout: &PackedLayout,
    codes: TensorView<'b>,
    scales: TensorView<'b>,
    zero_points: Option<TensorView<'b>>,
) -> Result<WGemmWeights<'b>, String> {
    if codes.dtype != Dtype::U8 {
        return Err(format!("`{}` is {}, expected U8", codes.name, codes.dtype));
    }
    let scales = f32s(scales)?;
    let zero_points = match zero_points {
        None => WGemmZeroPoints::Default,
        Some(z) if z.dtype == Dtype::U8 => WGemmZeroPoints::U8(z.bytes),
        Some(z) => WGemmZeroPoints::F32(f32s(z)?),
    };
    WGemmWeights::from_parts(layout.k, layout.n, layout.bits, layout.block_size, codes.bytes, scales, zero_points)
        .map_err(|e| format!("`{}`: {e}", codes.name))
}

/// The `packing` tag of a float MatMul weight's panels.
pub const GEMM_PACKING: &str = "npuc-gemm-panel32/1";

/// The name of the panels of the f32 weight `source`.
pub fn gemm_panels_name(source: &str) -> String {
    format!("{source}.gemm.panels")
}

/// A decoded layout description of float MatMul panels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmLayout {
    pub k: usize,
    pub n: usize,
    pub source: String,
}

pub fn gemm_layout_json(layout: &GemmLayout) -> Value {
    json!({ "packing": GEMM_PACKING, "k": layout.k, "n": layout.n, "source": layout.source })
}

/// Decodes the layout description of float MatMul panels; the error says what is wrong.
pub fn parse_gemm_layout(layout: Option<&Value>) -> Result<GemmLayout, String> {
    let layout = tagged(layout, GEMM_PACKING)?;
    Ok(GemmLayout {
        k: layout_size(layout, "k")?,
        n: layout_size(layout, "n")?,
        source: layout_name(layout, "source")?,
    })
}

/// The `packing` tag of a packed QGemm's layout description.
pub const QGEMM_PACKING: &str = "npuc-qgemm-panel16/1";

/// Names of the packed QGemm tensors (codes, column sums) of the weight codes `source`.
pub fn qgemm_packed_names(source: &str) -> (String, String) {
    (format!("{source}.qgemm.codes"), format!("{source}.qgemm.col_sums"))
}

/// A decoded QGemm layout description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QGemmLayout {
    pub k: usize,
    pub n: usize,
    pub source: String,
    /// The source codes are u8 (stored as `w − 128`).
    pub unsigned: bool,
}

pub fn qgemm_layout_json(layout: &QGemmLayout) -> Value {
    json!({ "packing": QGEMM_PACKING, "k": layout.k, "n": layout.n, "source": layout.source, "unsigned": layout.unsigned })
}

/// Decodes a QGemm layout description; the error says what is wrong.
pub fn parse_qgemm_layout(layout: Option<&Value>) -> Result<QGemmLayout, String> {
    let layout = tagged(layout, QGEMM_PACKING)?;
    Ok(QGemmLayout {
        k: layout_size(layout, "k")?,
        n: layout_size(layout, "n")?,
        source: layout_name(layout, "source")?,
        unsigned: layout["unsigned"].as_bool().ok_or("layout `unsigned` is not a boolean")?,
    })
}

/// The bundle tensors of packed QGemm codes and column sums: (dtype, bytes) of each.
pub fn qgemm_tensor_bytes(codes: &[i8], col_sums: &[i32]) -> [(Dtype, Vec<u8>); 2] {
    [
        (Dtype::I8, codes.iter().map(|&c| c as u8).collect()),
        (Dtype::I32, col_sums.iter().flat_map(|x| x.to_le_bytes()).collect()),
    ]
}

/// Packed QGemm codes and column sums read in place from the bundle's tensors, their dtypes
/// checked (their lengths are checked against K and N with the node's per-column parameters, when
/// the executor assembles the weights).
pub fn mapped_qgemm<'w>(codes: TensorView<'w>, col_sums: TensorView<'w>) -> Result<(&'w [i8], &'w [i32]), String> {
    if codes.dtype != Dtype::I8 {
        return Err(format!("`{}` is {}, expected I8", codes.name, codes.dtype));
    }
    if col_sums.dtype != Dtype::I32 {
        return Err(format!("`{}` is {}, expected I32", col_sums.name, col_sums.dtype));
    }
    // SAFETY: i8 has the size and alignment of u8, and every bit pattern is valid.
    let codes_i8 = unsafe { std::slice::from_raw_parts(codes.bytes.as_ptr().cast::<i8>(), codes.bytes.len()) };
    Ok((codes_i8, i32s(col_sums)?))
}

fn i32s(view: TensorView<'_>) -> Result<&[i32], String> {
    if !cfg!(target_endian = "little") || view.bytes.as_ptr().align_offset(align_of::<i32>()) != 0 {
        return Err(format!("`{}` is not 4-byte aligned little-endian i32", view.name));
    }
    // SAFETY: aligned (checked), alive as long as the bundle's map, every bit pattern a valid i32.
    Ok(unsafe { std::slice::from_raw_parts(view.bytes.as_ptr().cast::<i32>(), view.bytes.len() / 4) })
}

fn f32s(view: TensorView<'_>) -> Result<&[f32], String> {
    if view.dtype != Dtype::F32 {
        return Err(format!("`{}` is {}, expected F32", view.name, view.dtype));
    }
    if !cfg!(target_endian = "little") || view.bytes.as_ptr().align_offset(align_of::<f32>()) != 0 {
        return Err(format!("`{}` is not 4-byte aligned little-endian f32", view.name));
    }
    // SAFETY: the bytes are aligned for f32 (checked), live as long as the bundle's map, and every
    // bit pattern is a valid f32.
    Ok(unsafe { std::slice::from_raw_parts(view.bytes.as_ptr().cast::<f32>(), view.bytes.len() / 4) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::wgemm::{pack_wgemm, MatMulNBits, NBitsZeroPoints};

    #[test]
    fn layout_descriptions_round_trip_and_wrong_tags_are_refused() {
        let b = vec![0x21u8; 3 * 16];
        let src = MatMulNBits {
            k: 32,
            n: 3,
            bits: 4,
            block_size: 32,
            b: &b,
            scales: &[1.0, 2.0, 3.0],
            zero_points: NBitsZeroPoints::Default,
        };
        let packed = pack_wgemm(&src).unwrap();
        let json = layout_json(&packed, "w", "w_scale", None);
        let layout = parse_layout(Some(&json)).unwrap();
        assert_eq!((layout.k, layout.n, layout.bits, layout.block_size), (32, 3, 4, 32));
        assert_eq!((layout.source.as_str(), layout.scales.as_str(), layout.zero_points), ("w", "w_scale", None));
        let mut other = json.clone();
        other["packing"] = json!("npuc-wgemm-panel16/9");
        assert!(parse_layout(Some(&other)).unwrap_err().contains("npuc-wgemm-panel16/9"));
        assert!(parse_layout(None).is_err());
    }

    #[test]
    fn gemm_layouts_round_trip_and_other_tags_are_refused() {
        let layout = GemmLayout { k: 576, n: 1536, source: "w".into() };
        let json = gemm_layout_json(&layout);
        assert_eq!(parse_gemm_layout(Some(&json)), Ok(layout));
        let mut other = json.clone();
        other["packing"] = json!("npuc-gemm-panel16/1");
        assert!(parse_gemm_layout(Some(&other)).unwrap_err().contains("npuc-gemm-panel16/1"));
        other = json.clone();
        other["k"] = json!(-1);
        assert!(parse_gemm_layout(Some(&other)).unwrap_err().contains("`k`"));
    }

    #[test]
    fn qgemm_layouts_round_trip_and_other_tags_are_refused() {
        let layout = QGemmLayout { k: 576, n: 192, source: "w".into(), unsigned: true };
        let json = qgemm_layout_json(&layout);
        assert_eq!(parse_qgemm_layout(Some(&json)), Ok(layout));
        let mut other = json.clone();
        other["packing"] = json!("npuc-qgemm-panel16/2");
        assert!(parse_qgemm_layout(Some(&other)).unwrap_err().contains("npuc-qgemm-panel16/2"));
        other = json.clone();
        other["unsigned"] = json!(1);
        assert!(parse_qgemm_layout(Some(&other)).unwrap_err().contains("unsigned"));
    }
}

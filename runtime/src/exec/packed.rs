//! WGemm, QGemm and float MatMul weights in a bundle, packed at compile time.
//!
//! # WGemm
//!
//! For a WGemm node whose MatMulNBits codes are the weight `W`, the compiler runs
//! [`pack_wgemm`](crate::kernels::wgemm::pack_wgemm) — the very function the kernels' layout is
//! defined by — and stores its three buffers as they are, under names derived from `W`
//! ([`wgemm_names`]):
//!
//! | tensor | dtype | shape |
//! |---|---|---|
//! | `W.wgemm.codes` | U8 | `[panels·blocks·block_bytes]` |
//! | `W.wgemm.scales` | F32 | `[panels·blocks·16]` |
//! | `W.wgemm.zero_points` (when the node has zero points) | U8 or F32 | `[panels·blocks·16]` |
//!
//! The codes tensor carries the layout description ([`WGemmLayout`], typed in
//! `bundle::packing`, which owns every layout description and packed name): `{"packing":
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

pub use crate::bundle::packing::{
    gemm_panels_name, qgemm_names, wgemm_names, GemmLayout, LayoutError, Packing, QGemmLayout, WGemmLayout,
};
use crate::bundle::{Dtype, TensorView};
use crate::kernels::wgemm::{PackedWGemm, PackedZeroPoints, WGemmWeights, WGemmZeroPoints};

/// A packed tensor the bundle holds that the kernels cannot read as it is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PackedError {
    #[error("`{tensor}` is {found}, expected {expected}")]
    Dtype { tensor: String, found: Dtype, expected: Dtype },
    #[error("`{tensor}` is not 4-byte aligned little-endian {element}")]
    Unaligned { tensor: String, element: &'static str },
    /// The tensors do not fit the layout description.
    #[error("`{tensor}`: {problem}")]
    Layout { tensor: String, problem: String },
}

/// The layout description of `packed`, packed from the weights `source` (codes), `scales` and
/// `zero_points`.
pub fn wgemm_layout(packed: &PackedWGemm, source: &str, scales: &str, zero_points: Option<&str>) -> WGemmLayout {
    WGemmLayout {
        k: packed.k,
        n: packed.n,
        bits: packed.bits,
        block_size: packed.block_size,
        source: source.to_string(),
        scales: scales.to_string(),
        zero_points: zero_points.map(str::to_string),
    }
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
    layout: &WGemmLayout,
    codes: TensorView<'b>,
    scales: TensorView<'b>,
    zero_points: Option<TensorView<'b>>,
) -> Result<WGemmWeights<'b>, PackedError> {
    expect_dtype(&codes, Dtype::U8)?;
    let scales = f32s(scales)?;
    let zero_points = match zero_points {
        None => WGemmZeroPoints::Default,
        Some(z) if z.dtype == Dtype::U8 => WGemmZeroPoints::U8(z.bytes),
        Some(z) => WGemmZeroPoints::F32(f32s(z)?),
    };
    WGemmWeights::from_parts(layout.k, layout.n, layout.bits, layout.block_size, codes.bytes, scales, zero_points)
        .map_err(|e| PackedError::Layout { tensor: codes.name.to_string(), problem: e.to_string() })
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
pub fn mapped_qgemm<'w>(codes: TensorView<'w>, col_sums: TensorView<'w>) -> Result<(&'w [i8], &'w [i32]), PackedError> {
    expect_dtype(&codes, Dtype::I8)?;
    expect_dtype(&col_sums, Dtype::I32)?;
    // SAFETY: i8 has the size and alignment of u8, and every bit pattern is valid.
    let codes_i8 = unsafe { std::slice::from_raw_parts(codes.bytes.as_ptr().cast::<i8>(), codes.bytes.len()) };
    Ok((codes_i8, i32s(col_sums)?))
}

fn expect_dtype(view: &TensorView<'_>, expected: Dtype) -> Result<(), PackedError> {
    match view.dtype == expected {
        true => Ok(()),
        false => Err(PackedError::Dtype { tensor: view.name.to_string(), found: view.dtype, expected }),
    }
}

fn aligned_le<T>(view: &TensorView<'_>, element: &'static str) -> Result<(), PackedError> {
    if !cfg!(target_endian = "little") || view.bytes.as_ptr().align_offset(align_of::<T>()) != 0 {
        return Err(PackedError::Unaligned { tensor: view.name.to_string(), element });
    }
    Ok(())
}

fn i32s(view: TensorView<'_>) -> Result<&[i32], PackedError> {
    aligned_le::<i32>(&view, "i32")?;
    // SAFETY: aligned (checked), alive as long as the bundle's map, every bit pattern a valid i32.
    Ok(unsafe { std::slice::from_raw_parts(view.bytes.as_ptr().cast::<i32>(), view.bytes.len() / 4) })
}

fn f32s(view: TensorView<'_>) -> Result<&[f32], PackedError> {
    expect_dtype(&view, Dtype::F32)?;
    aligned_le::<f32>(&view, "f32")?;
    // SAFETY: the bytes are aligned for f32 (checked), live as long as the bundle's map, and every
    // bit pattern is a valid f32.
    Ok(unsafe { std::slice::from_raw_parts(view.bytes.as_ptr().cast::<f32>(), view.bytes.len() / 4) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::wgemm::{pack_wgemm, MatMulNBits, NBitsZeroPoints};

    #[test]
    fn a_packed_wgemm_layout_has_the_kernels_geometry_and_round_trips() {
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
        let layout = wgemm_layout(&packed, "w", "w_scale", None);
        assert_eq!((layout.k, layout.n, layout.bits, layout.block_size), (32, 3, 4, 32));
        assert_eq!(WGemmLayout::from_metadata(Some(&layout.to_metadata())).unwrap(), layout);
    }
}

//! Embedding gathers: `out[i] = table[ids[i]]`, one `hidden`-wide row per id, from
//!
//! - an f32 table `[rows, hidden]` ([`embed_f32`]);
//! - a block-quantised table in MatMulNBits layout `[rows, blocks, block·bits/8]` — which is
//!   GatherBlockQuantized's `[rows, hidden·bits/8]` when hidden is a multiple of the block, as in
//!   SmolLM2's tied 8-bit embedding ([`embed_nbits`]);
//! - the same table already packed for the tied lm_head WGemm, so the weights are stored once
//!   ([`embed_packed`]): row `t` of the table is output column `t` of the lm_head;
//! - the transpose of a float lm_head's `[K, N]` weight, as stored or as the f32 GEMM's panels
//!   ([`embed_columns`]): row `t` is column `t` of W, gathered in place.
//!
//! Quantised rows dequantise as `(q − z)·s` in f32, exactly as the reference evaluator's
//! GatherBlockQuantized and MatMulNBits do. An id outside the table is an error.

use super::gemm::{f32_panels_len, WeightLayout, F32_PANEL};
use super::wgemm::{MatMulNBits, NBitsZeroPoints, WGemmWeights};
use super::KernelError;

fn check(ids: &[u32], rows: usize, hidden: usize, out: &[f32]) -> Result<(), KernelError> {
    if out.len() != ids.len() * hidden {
        return Err(super::shape_err(
            "embedding output",
            format!("{} values for {} ids of {hidden}", out.len(), ids.len()),
        ));
    }
    match ids.iter().find(|&&id| id as usize >= rows) {
        Some(&id) => Err(KernelError::IdOutOfRange { id: id as usize, rows }),
        None => Ok(()),
    }
}

/// Rows of an f32 table `[rows, hidden]`.
pub fn embed_f32(table: &[f32], hidden: usize, ids: &[u32], out: &mut [f32]) -> Result<(), KernelError> {
    if hidden == 0 || !table.len().is_multiple_of(hidden) {
        return Err(super::shape_err("embedding table", format!("{} values are not rows of {hidden}", table.len())));
    }
    check(ids, table.len() / hidden, hidden, out)?;
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(hidden)) {
        o.copy_from_slice(&table[id as usize * hidden..][..hidden]);
    }
    Ok(())
}

/// Rows of a block-quantised table in MatMulNBits layout (`src.n` rows of `src.k` values).
pub fn embed_nbits(src: &MatMulNBits, ids: &[u32], out: &mut [f32]) -> Result<(), KernelError> {
    let (k, bits, bs) = (src.k, src.bits, src.block_size);
    if !(bits == 4 || bits == 8) || bs == 0 || !(bs * bits).is_multiple_of(8) {
        return Err(KernelError::Unsupported {
            what: "embedding table",
            detail: format!("{bits}-bit codes in blocks of {bs}"),
        });
    }
    let blocks = k.div_ceil(bs);
    let blob = bs * bits / 8;
    let zp_row = (blocks * bits).div_ceil(8);
    let fits = src.b.len() == src.n * blocks * blob
        && src.scales.len() == src.n * blocks
        && match src.zero_points {
            NBitsZeroPoints::Default => true,
            NBitsZeroPoints::Packed(z) => z.len() == src.n * zp_row,
            NBitsZeroPoints::Float(z) => z.len() == src.n * blocks,
        };
    if !fits {
        return Err(super::shape_err(
            "embedding table",
            format!("buffers do not fit {} rows of {k} in blocks of {bs}", src.n),
        ));
    }
    check(ids, src.n, k, out)?;
    let unpack = |bytes: &[u8], i: usize| -> u8 {
        let bit = i * bits;
        ((bytes[bit / 8] >> (bit % 8)) as u32 & ((1u32 << bits) - 1)) as u8
    };
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(k)) {
        let row = id as usize;
        for (b, chunk) in o.chunks_mut(bs).enumerate() {
            let s = src.scales[row * blocks + b];
            let z = match src.zero_points {
                NBitsZeroPoints::Default => (1u32 << (bits - 1)) as f32,
                NBitsZeroPoints::Packed(zp) => unpack(&zp[row * zp_row..][..zp_row], b) as f32,
                NBitsZeroPoints::Float(zp) => zp[row * blocks + b],
            };
            let codes = &src.b[(row * blocks + b) * blob..][..blob];
            for (i, v) in chunk.iter_mut().enumerate() {
                *v = (unpack(codes, i) as f32 - z) * s;
            }
        }
    }
    Ok(())
}

/// Rows of a table packed for WGemm: row `t` is output column `t` (`w.n()` rows of `w.k()`).
pub fn embed_packed(w: &WGemmWeights, ids: &[u32], out: &mut [f32]) -> Result<(), KernelError> {
    let k = w.k();
    check(ids, w.n(), k, out)?;
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(k)) {
        w.dequantise_column(id as usize, o);
    }
    Ok(())
}

/// Columns of an f32 `[K, N]` weight stored as `layout` (`KN` or `Panels`): `out[i]` is
/// `W[:, ids[i]]`, `k` values.
pub fn embed_columns(
    w: &[f32],
    layout: WeightLayout,
    k: usize,
    n: usize,
    ids: &[u32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let expected = match layout {
        WeightLayout::KN => k * n,
        WeightLayout::Panels => f32_panels_len(k, n),
        WeightLayout::NK => return embed_f32(w, k, ids, out),
    };
    if w.len() != expected {
        return Err(super::shape_err(
            "embedding table",
            format!("{} values are not a {k}×{n} {layout:?} weight", w.len()),
        ));
    }
    check(ids, n, k, out)?;
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(k.max(1))) {
        let c = id as usize;
        let (start, stride) = match layout {
            WeightLayout::Panels => ((c / F32_PANEL) * k * F32_PANEL + c % F32_PANEL, F32_PANEL),
            _ => (c, n),
        };
        for (kk, v) in o.iter_mut().enumerate() {
            *v = w[start + kk * stride];
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::gemm::pack_f32_panels;

    /// Row t of the gathered table is column t of W, for W as stored and as panels (N = 37 is
    /// not a whole number of panels).
    #[test]
    fn columns_of_a_weight_as_stored_and_as_panels() {
        let (k, n) = (5, 37);
        let w: Vec<f32> = (0..k * n).map(|i| i as f32 * 0.5 - 3.0).collect();
        let ids = [0u32, 36, 33, 1];
        let expected: Vec<f32> =
            ids.iter().flat_map(|&t| (0..k).map(move |kk| (kk * n + t as usize) as f32 * 0.5 - 3.0)).collect();
        let panels = pack_f32_panels(&w, k, n);
        for (table, layout) in [(&w, WeightLayout::KN), (&panels, WeightLayout::Panels)] {
            let mut out = vec![0f32; ids.len() * k];
            embed_columns(table, layout, k, n, &ids, &mut out).unwrap();
            assert_eq!(out, expected, "{layout:?}");
        }
        let mut out = vec![0f32; k];
        let err = embed_columns(&w, WeightLayout::KN, k, n, &[37], &mut out).unwrap_err();
        assert!(matches!(err, KernelError::IdOutOfRange { id: 37, rows: 37 }), "{err:?}");
    }
}

//! The operands of a qgemv design, as its plan entry records them ([`QgemvLayout`]): the f32
//! rows it quantises itself, and the weight operand — each core's stream of weight elements,
//! codes then the tile's epilogue data. The compiler builds designs from these numbers and the
//! runtime fills their buffers with the same functions, so the two cannot disagree.

use serde::{Deserialize, Serialize};

/// What a qgemv design's rows operand carries, and so what its cores compute before the GEMV.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QgemvFeed {
    /// Activation rows: `QuantizeRows(x)`.
    Rows,
    /// A norm's input rows, γ as one more row: `InverseRms`, `QuantizeRows(x, γ)` and the row
    /// scales times the inverse rms.
    Norm,
    /// The gate's rows, then the up's: `QuantizeSwiGlu(g, u)`.
    Gate,
    /// A norm's input as two rows to add first (the residual stream's, then a projection's
    /// output), γ between them: `Add`, then `Norm`'s; the design also writes the sum.
    SumNorm,
}

/// The buffers of a qgemv design. The rows operand is f32 `[rows (+1 with a norm), padded_k]`
/// (a gate's `[2, rows, padded_k]`, a sum's `[2·rows + 1, padded_k]`); the output f32
/// `[rows, padded_n]` (and a sum's `[rows, padded_k]` after it); the weight operand i8,
/// `streams × tiles × parts` elements of `w_rows × part_k` bytes: stream `s`'s core takes
/// elements `s·tiles·parts ..`, tile by tile, K part by K part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QgemvLayout {
    pub feed: QgemvFeed,
    /// Rows of the rows operand and the output (the design's rows).
    pub rows: usize,
    pub padded_k: usize,
    pub padded_n: usize,
    /// The K a core reduces a call, and the K parts of a row.
    pub part_k: usize,
    pub parts: usize,
    /// Output columns of one core tile, and the tiles a stream carries.
    pub tile_cols: usize,
    pub tiles: usize,
    pub streams: usize,
    /// Activation passes the cores quantise (1, or 2 with the rounding residual's).
    pub passes: usize,
    /// Each output the sum of two weight columns: `c` (every pass) and `c + N/2` (the weight's
    /// residual pass, the first activation pass only), as `array-int8` adds a weight's passes.
    pub pairs: bool,
    /// Rows of one weight element (its columns' codes, then their epilogue data).
    pub w_rows: usize,
    /// Column scales one row of the epilogue data holds.
    pub scales_per_row: usize,
}

/// One column chunk's weights as a qgemv call takes them: `[K, N]` row-major codes, the
/// columns' scales, and which columns multiply the first activation pass only.
pub struct QgemvWeights<'a> {
    pub codes: &'a [i8],
    pub k: usize,
    pub n: usize,
    pub scales: &'a [f32],
    pub first_only: &'a dyn Fn(usize) -> bool,
}

impl QgemvLayout {
    /// Weight columns of a tile: its outputs', twice with pairs.
    pub fn w_cols(&self) -> usize {
        if self.pairs {
            2 * self.tile_cols
        } else {
            self.tile_cols
        }
    }

    /// Rows of a tile's epilogue data ([`QgemvLayout::meta`]).
    pub fn meta_rows(&self) -> usize {
        let cols = self.w_cols();
        let flags = if self.passes > 1 && !self.pairs { cols.div_ceil(self.part_k) } else { 0 };
        cols.div_ceil(self.scales_per_row) + flags
    }

    /// Bytes of the weight operand.
    pub fn weight_bytes(&self) -> usize {
        self.streams * self.tiles * self.parts * self.w_rows * self.part_k
    }

    /// Floats of the rows operand.
    pub fn rows_floats(&self) -> usize {
        match self.feed {
            QgemvFeed::Rows => self.rows * self.padded_k,
            QgemvFeed::Norm => (self.rows + 1) * self.padded_k,
            QgemvFeed::Gate => 2 * self.rows * self.padded_k,
            QgemvFeed::SumNorm => (2 * self.rows + 1) * self.padded_k,
        }
    }

    /// Where a sum-fed design's second addend starts in its rows operand, in elements: after
    /// the residual stream's rows and γ's. An array program's earlier phase writes it there.
    pub fn addend_at(&self) -> usize {
        (self.rows + 1) * self.padded_k
    }

    /// The rows operand: `x`'s rows of `k` values, zero past them, and with a norm γ as the
    /// last row; with a gate, `x` the gate's rows and `up` the up's; with a sum, `x` the
    /// residual stream's rows, then γ, then `up` the projection's rows. `None` when the rows do
    /// not fit the design, or an operand is missing or of another length.
    pub fn rows_operand(&self, (x, k): (&[f32], usize), gamma: Option<&[f32]>, up: Option<&[f32]>) -> Option<Vec<f32>> {
        let (pk, pm) = (self.padded_k, self.rows);
        if k == 0 || k > pk || x.len() % k != 0 || x.len() / k > pm {
            return None;
        }
        let mut out = vec![0f32; self.rows_floats()];
        let planes: Vec<&[f32]> = match (self.feed, gamma, up) {
            (QgemvFeed::Rows, None, None) => vec![x],
            (QgemvFeed::Norm, Some(g), None) if g.len() == k => {
                out[pm * pk..pm * pk + k].copy_from_slice(g);
                vec![x]
            }
            (QgemvFeed::SumNorm, Some(g), Some(o)) if g.len() == k && o.len() == x.len() => {
                out[pm * pk..pm * pk + k].copy_from_slice(g);
                vec![x, o]
            }
            (QgemvFeed::Gate, None, Some(u)) if u.len() == x.len() => vec![x, u],
            _ => return None,
        };
        let plane = if self.feed == QgemvFeed::SumNorm { self.addend_at() } else { pm * pk };
        for (p, rows) in planes.into_iter().enumerate() {
            for (r, row) in rows.chunks(k).enumerate() {
                let at = p * plane + r * pk;
                out[at..at + k].copy_from_slice(row);
            }
        }
        Some(out)
    }

    /// The weight operand of `cols` columns from `col_offset` (the call's outputs): for each
    /// element, its tile's weight columns' `part_k` codes a row (zero past K and past the
    /// chunk), and after a tile's last K part its epilogue data. With pairs, output `c` also
    /// takes the weight's column `c + N/2`.
    pub fn pack(&self, w: &QgemvWeights<'_>, (col_offset, cols): (usize, usize)) -> Vec<i8> {
        let (k, n, parts, w_cols) = (self.part_k, self.tile_cols, self.parts, self.w_cols());
        let mut out = vec![0i8; self.weight_bytes()];
        for (e, elem) in out.chunks_mut(self.w_rows * k).enumerate() {
            let (tile_index, part) = (e / parts, e % parts);
            let first_col = tile_index * n;
            let column = |j: usize| {
                let c = (first_col + j % n < cols).then_some(col_offset + first_col + j % n)?;
                Some(if j >= n { c + w.n / 2 } else { c })
            };
            for j in 0..w_cols {
                let Some(col) = column(j) else { continue };
                for l in 0..k {
                    let kk = part * k + l;
                    if kk < w.k {
                        elem[j * k + l] = w.codes[kk * w.n + col];
                    }
                }
            }
            if part + 1 == parts {
                let scales: Vec<f32> = (0..w_cols).map(|j| column(j).map_or(0.0, |c| w.scales[c])).collect();
                let flags: Vec<bool> = match self.pairs || self.passes == 1 {
                    true => vec![],
                    false => (0..n).map(|j| column(j).is_some_and(w.first_only)).collect(),
                };
                let meta = self.meta(&scales, &flags);
                elem[w_cols * k..w_cols * k + meta.len()].copy_from_slice(&meta);
            }
        }
        out
    }

    /// A tile's epilogue data, `meta_rows · part_k` bytes: `scales_per_row` column scales a row
    /// (each its f32 bits' little-endian bytes), then with two passes (not pairs) the columns'
    /// first-pass-only flags, `part_k` a row.
    pub fn meta(&self, scales: &[f32], first_only: &[bool]) -> Vec<i8> {
        meta(self.part_k, self.scales_per_row, scales, first_only)
    }
}

/// The epilogue data of one tile's columns (see [`QgemvLayout::meta`]); `first_only` empty
/// without flags.
pub fn meta(k: usize, per_row: usize, scales: &[f32], first_only: &[bool]) -> Vec<i8> {
    let n = scales.len();
    let flag_rows = if first_only.is_empty() { 0 } else { n.div_ceil(k) };
    let mut out = vec![0i8; (n.div_ceil(per_row) + flag_rows) * k];
    for (j, s) in scales.iter().enumerate() {
        let at = (j / per_row) * k + 4 * (j % per_row);
        out[at..at + 4].copy_from_slice(&s.to_bits().to_le_bytes().map(|b| b as i8));
    }
    let flags = n.div_ceil(per_row) * k;
    first_only.iter().enumerate().for_each(|(j, &f)| out[flags + j] = i8::from(f));
    out
}

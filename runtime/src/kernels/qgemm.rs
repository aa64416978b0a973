//! `QGemm`: int8 × int8 → int32 GEMM with the folded zero-point epilogue,
//! `y[m, n] = (Σₖ (a − zₐ)(w − z_w[n])) · sₐ · s_w[n]`, optionally requantised to
//! `sat(round_half_even(y / s_y) + z_y)` (the zero point added after rounding).
//!
//! # Signedness
//!
//! The kernels multiply unsigned activation bytes by signed weight bytes (the operand types of
//! `vpdpbusd`): activations become `a_u = a + oₐ` (oₐ = 128 for int8 activations, else 0) and
//! weights `w_s = w − o_w` (o_w = 128 for uint8 weights, else 0) — at pack time for the weights,
//! per call for the activations. With `A = oₐ + zₐ` and `B[n] = z_w[n] − o_w`,
//!
//! `Σₖ (a − zₐ)(w − z_w) = Σₖ (a_u − A)(w_s − B) = P − B·Σₖ a_u − A·Σₖ w_s + K·A·B`,
//!
//! where `P = Σₖ a_u·w_s` is what the kernels compute and the column sums `Σₖ w_s` are computed
//! once, at pack time. The terms are combined in wrapping i32 arithmetic, which is exact whenever
//! the true sum fits in i32; [`pack_qgemm`] refuses K > 33025, where |Σ (a − zₐ)(w − z_w)| could
//! reach 2³¹.
//!
//! # Packed format ([`pack_qgemm`])
//!
//! Panels of 16 columns; per panel, ⌈K/4⌉ groups of 64 bytes; in group g, byte `4c + j` holds
//! `w_s[4g + j, 16p + c]` (i8), zero past K and past N. Per column (padded to a multiple of 16):
//! `Σₖ w_s` (i32), `B` (i32), `s_w` (f32; a per-tensor scale is repeated).
//!
//! # Paths
//!
//! - VNNI: `vpdpbusd` (u8 × s8, four products summed into i32, no saturation).
//! - AVX-512BW / AVX2: both operands widened to i16 and multiplied with `vpmaddwd` (exact; the
//!   u8 × s8 `vpmaddubsw` would saturate at 2·255·127).
//! - scalar.
//!
//! All paths produce the same int32 P, and apply the same epilogue (plain f32 operations, no
//! fused multiply-add), so every output is bit-identical across paths and equal to the
//! reference evaluator's.

use super::pool::ThreadPool;
use super::{shape_err, split_range, Isa, KernelError, SyncPtr};

#[cfg(target_arch = "x86_64")]
mod x86;

pub const PANEL: usize = 16;
const GROUP_BYTES: usize = 64;
const MAX_ROWS: usize = 8;
/// The largest K whose accumulators cannot overflow i32: 2³¹ / 255².
pub const MAX_K: usize = 33025;

type Tile = [[i32; PANEL]; MAX_ROWS];

/// Weight codes `[K, N]` row-major, as the ONNX initializer holds them.
#[derive(Clone, Copy, Debug)]
pub enum QWeightCodes<'a> {
    I8(&'a [i8]),
    U8(&'a [u8]),
}

/// Activation codes `[M, K]` row-major.
#[derive(Clone, Copy, Debug)]
pub enum QActivations<'a> {
    I8(&'a [i8]),
    U8(&'a [u8]),
}

/// Where the result goes: f32, or requantised with a per-tensor scale and zero point.
#[derive(Debug)]
pub enum QOutput<'a> {
    F32(&'a mut [f32]),
    U8 { y: &'a mut [u8], scale: f32, zero_point: i32 },
    I8 { y: &'a mut [i8], scale: f32, zero_point: i32 },
}

impl QActivations<'_> {
    fn len(&self) -> usize {
        match self {
            QActivations::I8(v) => v.len(),
            QActivations::U8(v) => v.len(),
        }
    }

    /// What the kernels add to a code to make it unsigned: 128 for i8, 0 for u8.
    fn offset(&self) -> i32 {
        match self {
            QActivations::I8(_) => 128,
            QActivations::U8(_) => 0,
        }
    }

    /// Row `r` of `[m, k]` codes as the kernels' unsigned codes, into `dst` (`k` long); their sum.
    fn unsigned_row(&self, r: usize, k: usize, dst: &mut [u8]) -> i32 {
        match self {
            QActivations::I8(v) => dst.iter_mut().zip(&v[r * k..]).for_each(|(d, &x)| *d = (x as u8) ^ 0x80),
            QActivations::U8(v) => dst.copy_from_slice(&v[r * k..(r + 1) * k]),
        }
        dst.iter().map(|&x| x as i32).sum()
    }
}

impl QOutput<'_> {
    fn len(&self) -> usize {
        match self {
            QOutput::F32(y) => y.len(),
            QOutput::U8 { y, .. } => y.len(),
            QOutput::I8 { y, .. } => y.len(),
        }
    }
}

/// Packed QGemm weights, owned (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct PackedQGemm {
    pub k: usize,
    pub n: usize,
    /// [panels, ⌈K/4⌉, 16, 4].
    pub codes: Vec<i8>,
    /// Σₖ w_s per column, [panels·16].
    pub col_sums: Vec<i32>,
    /// z_w − o_w per column.
    pub zero_points: Vec<i32>,
    /// s_w per column.
    pub scales: Vec<f32>,
}

impl PackedQGemm {
    /// The weights as the kernels borrow them.
    pub fn weights(&self) -> QGemmWeights<'_> {
        QGemmWeights {
            k: self.k,
            n: self.n,
            codes: &self.codes,
            col_sums: &self.col_sums,
            zero_points: &self.zero_points,
            scales: &self.scales,
        }
    }
    /// Bytes one call reads.
    pub fn bytes(&self) -> usize {
        self.weights().bytes()
    }
}

/// Packed QGemm weights, borrowed: from a [`PackedQGemm`], or codes and column sums mapped from a
/// bundle with the per-column parameters beside them.
#[derive(Clone, Copy, Debug)]
pub struct QGemmWeights<'a> {
    k: usize,
    n: usize,
    codes: &'a [i8],
    col_sums: &'a [i32],
    zero_points: &'a [i32],
    scales: &'a [f32],
}

impl<'a> From<&'a PackedQGemm> for QGemmWeights<'a> {
    fn from(p: &'a PackedQGemm) -> Self {
        p.weights()
    }
}

impl<'a> QGemmWeights<'a> {
    /// Packed weights from their parts, checking every length against K and N.
    pub fn from_parts(
        k: usize,
        n: usize,
        codes: &'a [i8],
        col_sums: &'a [i32],
        zero_points: &'a [i32],
        scales: &'a [f32],
    ) -> Result<QGemmWeights<'a>, KernelError> {
        if k == 0 || n == 0 || k > MAX_K {
            return Err(shape_err("packed QGemm", format!("K={k} N={n} (K in 1..={MAX_K}, N positive)")));
        }
        let w = QGemmWeights { k, n, codes, col_sums, zero_points, scales };
        let columns = w.panels() * PANEL;
        if codes.len() != w.panels() * w.groups() * GROUP_BYTES {
            return Err(shape_err(
                "packed QGemm codes",
                format!("{} bytes, expected {}", codes.len(), w.panels() * w.groups() * GROUP_BYTES),
            ));
        }
        for (what, len) in
            [("column sums", col_sums.len()), ("zero points", zero_points.len()), ("scales", scales.len())]
        {
            if len != columns {
                return Err(shape_err("packed QGemm", format!("{len} {what}, expected {columns}")));
            }
        }
        Ok(w)
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn n(&self) -> usize {
        self.n
    }
    /// The columns' scales.
    pub fn scales(&self) -> &'a [f32] {
        self.scales
    }
    fn groups(&self) -> usize {
        self.k.div_ceil(4)
    }
    /// The signed codes w_s the kernels multiply, as `[K, N]` row-major: what an int8 array
    /// (an XDNA design) is given as B.
    pub fn codes_kn(&self) -> Vec<i8> {
        let (k, n, groups) = (self.k, self.n, self.groups());
        let mut out = vec![0i8; k * n];
        for (col, c) in (0..n).map(|col| (col, col % PANEL)) {
            let panel = &self.codes[(col / PANEL) * groups * GROUP_BYTES..];
            for kk in 0..k {
                out[kk * n + col] = panel[(kk / 4) * GROUP_BYTES + 4 * c + kk % 4];
            }
        }
        out
    }
    fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }
    /// Bytes one call reads.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * (self.col_sums.len() + self.zero_points.len() + self.scales.len())
    }
}

/// Packs `[K, N]` weight codes with a per-tensor (one value) or per-column (N values) scale and
/// zero point.
pub fn pack_qgemm(
    k: usize,
    n: usize,
    w: QWeightCodes,
    scale: &[f32],
    zero_point: &[i32],
) -> Result<PackedQGemm, KernelError> {
    let (codes, col_sums) = pack_qgemm_codes(k, n, w)?;
    let (zero_points, scales) = qgemm_columns(n, matches!(w, QWeightCodes::U8(_)), scale, zero_point)?;
    Ok(PackedQGemm { k, n, codes, col_sums, zero_points, scales })
}

/// The codes and column sums of [`pack_qgemm`]: what depends on the weight codes alone, and what a
/// bundle stores.
pub fn pack_qgemm_codes(k: usize, n: usize, w: QWeightCodes) -> Result<(Vec<i8>, Vec<i32>), KernelError> {
    if k == 0 || n == 0 {
        return Err(shape_err("QGemm", format!("K={k} and N={n} must be positive")));
    }
    if k > MAX_K {
        return Err(KernelError::Unsupported {
            what: "QGemm K",
            detail: format!("{k} (at most {MAX_K} keeps int32 exact)"),
        });
    }
    let len = match w {
        QWeightCodes::I8(v) => v.len(),
        QWeightCodes::U8(v) => v.len(),
    };
    if len != k * n {
        return Err(shape_err("QGemm weights", format!("{len} codes, expected K·N = {}", k * n)));
    }
    let code = |kk: usize, c: usize| -> i32 {
        match w {
            QWeightCodes::I8(v) => v[kk * n + c] as i32,
            QWeightCodes::U8(v) => v[kk * n + c] as i32 - 128,
        }
    };
    let panels = n.div_ceil(PANEL);
    let groups = k.div_ceil(4);
    let mut codes = vec![0i8; panels * groups * GROUP_BYTES];
    let mut col_sums = vec![0i32; panels * PANEL];
    // Rows of the source in order (it is row-major), each column's sum accumulated as it goes.
    for kk in 0..k {
        for (c, sum) in col_sums.iter_mut().enumerate().take(n) {
            let v = code(kk, c);
            codes[((c / PANEL) * groups + kk / 4) * GROUP_BYTES + 4 * (c % PANEL) + kk % 4] = v as i8;
            *sum += v;
        }
    }
    Ok((codes, col_sums))
}

/// The per-column zero points `B = z_w − o_w` and scales of [`pack_qgemm`] (padded to whole
/// panels), from a per-tensor or per-column scale and zero point of u8 (`unsigned_codes`) or i8
/// weights.
pub fn qgemm_columns(
    n: usize,
    unsigned_codes: bool,
    scale: &[f32],
    zero_point: &[i32],
) -> Result<(Vec<i32>, Vec<f32>), KernelError> {
    if !(scale.len() == 1 || scale.len() == n) || zero_point.len() != scale.len() {
        return Err(shape_err(
            "QGemm weight scale/zero point",
            format!("{} scales and {} zero points; both must be 1 or N={n}", scale.len(), zero_point.len()),
        ));
    }
    let offset = if unsigned_codes { 128 } else { 0 };
    let columns = n.div_ceil(PANEL) * PANEL;
    let (mut zero_points, mut scales) = (vec![0i32; columns], vec![0f32; columns]);
    for c in 0..n {
        let i = if scale.len() == 1 { 0 } else { c };
        zero_points[c] = zero_point[i] - offset;
        scales[c] = scale[i];
    }
    Ok((zero_points, scales))
}

/// Per-call activation buffers; they grow to the largest shape seen, then never allocate again.
#[derive(Clone, Debug, Default)]
pub struct QGemmScratch {
    /// a_u, [M, ⌈K/4⌉·4], zero past K.
    unsigned: Vec<u8>,
    /// a_u widened to i16 for the paths without VNNI.
    wide: Vec<i16>,
    /// Σₖ a_u per row.
    sums: Vec<i32>,
}

/// Activation rows as the kernels read them.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    unsigned: &'a [u8],
    wide: &'a [i16],
    stride: usize,
}

/// `y = QGemm(a, sₐ, zₐ, w)` for `m` rows of K codes (see the module doc). Panics when a
/// buffer's length does not fit (a caller bug).
#[allow(clippy::too_many_arguments)]
pub fn qgemm<'w>(
    isa: Isa,
    pool: &ThreadPool,
    w: impl Into<QGemmWeights<'w>>,
    a: QActivations,
    m: usize,
    a_scale: f32,
    a_zero_point: i32,
    out: QOutput,
    scratch: &mut QGemmScratch,
) {
    qgemm_scaled(isa, pool, w, a, m, AScale::Tensor(a_scale), a_zero_point, out, None, scratch)
}

/// The activations' scale: one per tensor, or one per row (activations quantised row by row,
/// as `npuc::QuantizeRows` does).
#[derive(Clone, Copy, Debug)]
pub enum AScale<'a> {
    Tensor(f32),
    Rows(&'a [f32]),
}

/// Columns whose outputs only the first rows need: from column `from` on (rounded down to a
/// panel), rows past `rows` are not computed and their outputs are left as they were — a weight's
/// residual pass beside the weight it refines, which multiplies the first activation pass only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstRows {
    pub from: usize,
    pub rows: usize,
}

/// [`qgemm`] with the activations' scale per tensor or per row: output row r is scaled by
/// `sₐ[r] · s_w[n]`, formed exactly as the per-tensor epilogue forms `sₐ · s_w[n]`; with
/// `first_rows`, the columns it names compute its rows only.
#[allow(clippy::too_many_arguments)]
pub fn qgemm_scaled<'w>(
    isa: Isa,
    pool: &ThreadPool,
    w: impl Into<QGemmWeights<'w>>,
    a: QActivations,
    m: usize,
    a_scale: AScale,
    a_zero_point: i32,
    out: QOutput,
    first_rows: Option<FirstRows>,
    scratch: &mut QGemmScratch,
) {
    let isa = isa.check();
    let w = &w.into();
    let (a_scale, row_scales) = match a_scale {
        AScale::Tensor(s) => (s, None),
        AScale::Rows(r) => {
            assert_eq!(r.len(), m, "qgemm: {} row scales for {m} rows", r.len());
            (1.0, Some(r))
        }
    };
    let (k, n) = (w.k, w.n);
    let stride = w.groups() * 4;
    let (len, offset) = (a.len(), a.offset());
    assert_eq!(len, m * k, "qgemm: a holds {len} codes, not {m}×{k}");
    let out_len = out.len();
    assert_eq!(out_len, m * n, "qgemm: y holds {out_len} values, not {m}×{n}");
    scratch.unsigned.clear();
    scratch.unsigned.resize(m * stride, 0);
    scratch.sums.clear();
    for r in 0..m {
        let sum = a.unsigned_row(r, k, &mut scratch.unsigned[r * stride..r * stride + k]);
        scratch.sums.push(sum);
    }
    scratch.wide.clear();
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        scratch.wide.extend(scratch.unsigned.iter().map(|&x| x as i16));
    }
    let rows = Rows { unsigned: &scratch.unsigned, wide: &scratch.wide, stride };
    let epi = Epilogue { k: k as i32, a_zero: a_zero_point + offset, a_scale, row_scales, row_sums: &scratch.sums };
    let panels = w.panels();
    let tasks = if pool.threads() == 1 { 1 } else { panels.min(pool.threads() * 4) };
    let dst = Dst::of(out);
    pool.run(tasks, &|t| {
        let mut tile: Tile = [[0; PANEL]; MAX_ROWS];
        for p in split_range(panels, tasks, t) {
            let cols = PANEL.min(n - p * PANEL);
            let m = match first_rows {
                Some(f) if p * PANEL >= f.from => f.rows.min(m),
                _ => m,
            };
            let mut r0 = 0;
            while r0 < m {
                let r = (m - r0).min(max_rows(isa));
                panel(isa, w, p, &rows, r0, r, &mut tile);
                for (i, acc) in tile.iter().take(r).enumerate() {
                    // SAFETY: tasks own disjoint panels, hence disjoint columns of y.
                    unsafe { epilogue(w, &epi, p, r0 + i, acc, cols, n, dst) };
                }
                r0 += r;
            }
        }
    });
}

/// The activation codes as signed int8 (u8 codes − 128), as an int8 array multiplies them.
pub fn signed_codes(a: QActivations) -> Vec<i8> {
    match a {
        QActivations::I8(v) => v.to_vec(),
        QActivations::U8(v) => v.iter().map(|&x| (x ^ 0x80) as i8).collect(),
    }
}

/// [`qgemm_scaled`]'s epilogue on products computed elsewhere (an NPU): `products` `[m, n]`
/// row-major holds P = Σₖ a_s·w_s for the codes of [`signed_codes`] and
/// [`QGemmWeights::codes_kn`]. The kernels accumulate Σₖ (a_s + 128)·w_s = P + 128·Σₖ w_s, so
/// with the column sums added the same epilogue folds the zero points and scales, and the outputs
/// are bit-identical to `qgemm_scaled`'s whenever P is exact.
#[allow(clippy::too_many_arguments)]
pub fn qgemm_from_products(
    w: QGemmWeights,
    a: QActivations,
    m: usize,
    a_scale: AScale,
    a_zero_point: i32,
    products: &[i32],
    out: QOutput,
) -> Result<(), KernelError> {
    let (k, n) = (w.k, w.n);
    let (codes_len, out_len) = (a.len(), out.len());
    if codes_len != m * k || products.len() != m * n || out_len != m * n {
        return Err(shape_err(
            "QGemm products",
            format!("{codes_len} codes, {} products, {out_len} outputs for {m}×{k}×{n}", products.len()),
        ));
    }
    let (a_scale, row_scales) = match a_scale {
        AScale::Tensor(s) => (s, None),
        AScale::Rows(r) if r.len() == m => (1.0, Some(r)),
        AScale::Rows(r) => return Err(shape_err("QGemm products", format!("{} row scales for {m} rows", r.len()))),
    };
    let mut row = vec![0u8; k];
    let sums: Vec<i32> = (0..m).map(|r| a.unsigned_row(r, k, &mut row)).collect();
    let epi = Epilogue { k: k as i32, a_zero: a_zero_point + a.offset(), a_scale, row_scales, row_sums: &sums };
    let dst = Dst::of(out);
    for row in 0..m {
        for p in 0..w.panels() {
            let cols = PANEL.min(n - p * PANEL);
            let mut acc = [0i32; PANEL];
            for (c, a) in acc.iter_mut().enumerate().take(cols) {
                let col = p * PANEL + c;
                *a = products[row * n + col].wrapping_add(128i32.wrapping_mul(w.col_sums[col]));
            }
            // SAFETY: row < m and p < panels; this loop is the only writer.
            unsafe { epilogue(&w, &epi, p, row, &acc, cols, n, dst) };
        }
    }
    Ok(())
}

fn max_rows(isa: Isa) -> usize {
    match isa {
        Isa::Scalar => MAX_ROWS,
        Isa::Avx2 => 2,
        Isa::Avx512 | Isa::Avx512Vnni => 8,
    }
}

fn panel(isa: Isa, w: &QGemmWeights, p: usize, rows: &Rows, r0: usize, r: usize, tile: &mut Tile) {
    match isa {
        Isa::Scalar => panel_scalar(w, p, rows, r0, r, tile),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `qgemm` checked the CPU's features and every buffer length.
        _ => unsafe { x86::panel(isa, w, p, rows, r0, r, tile) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => panel_scalar(w, p, rows, r0, r, tile),
    }
}

fn panel_scalar(w: &QGemmWeights, p: usize, rows: &Rows, r0: usize, r: usize, tile: &mut Tile) {
    let groups = w.groups();
    let codes = &w.codes[p * groups * GROUP_BYTES..][..groups * GROUP_BYTES];
    for (i, out) in tile.iter_mut().take(r).enumerate() {
        let a = &rows.unsigned[(r0 + i) * rows.stride..][..rows.stride];
        for (c, o) in out.iter_mut().enumerate() {
            let mut acc = 0i32;
            for (kk, &x) in a.iter().enumerate() {
                acc += x as i32 * codes[(kk / 4) * GROUP_BYTES + 4 * c + kk % 4] as i32;
            }
            *o = acc;
        }
    }
}

struct Epilogue<'a> {
    k: i32,
    /// A = oₐ + zₐ.
    a_zero: i32,
    a_scale: f32,
    /// Per-row activation scales, which replace `a_scale` when present.
    row_scales: Option<&'a [f32]>,
    row_sums: &'a [i32],
}

#[derive(Clone, Copy)]
enum Dst {
    F32(SyncPtr<f32>),
    U8(SyncPtr<u8>, f32, i32),
    I8(SyncPtr<i8>, f32, i32),
}

impl Dst {
    fn of(out: QOutput) -> Dst {
        match out {
            QOutput::F32(y) => Dst::F32(SyncPtr(y.as_mut_ptr())),
            QOutput::U8 { y, scale, zero_point } => Dst::U8(SyncPtr(y.as_mut_ptr()), scale, zero_point),
            QOutput::I8 { y, scale, zero_point } => Dst::I8(SyncPtr(y.as_mut_ptr()), scale, zero_point),
        }
    }
}

/// Folds the zero points into one panel row of P and writes it.
///
/// # Safety
/// `row < m`, `p < panels`, and no other thread writes these `cols` outputs.
#[allow(clippy::too_many_arguments)]
unsafe fn epilogue(
    w: &QGemmWeights,
    e: &Epilogue,
    p: usize,
    row: usize,
    acc: &[i32; PANEL],
    cols: usize,
    n: usize,
    dst: Dst,
) {
    let mut y = [0f32; PANEL];
    let base = p * PANEL;
    // Plain f32 operations (Rust never contracts them into fused multiply-adds), the same for
    // every path, so every path's outputs are identical.
    let fold = |y: &mut [f32; PANEL]| {
        let sa = e.row_scales.map_or(e.a_scale, |r| r[row]);
        let (a_zero, k, sum_a) = (e.a_zero, e.k, e.row_sums[row]);
        for c in 0..PANEL {
            let b = w.zero_points[base + c];
            let exact = acc[c]
                .wrapping_sub(b.wrapping_mul(sum_a))
                .wrapping_sub(a_zero.wrapping_mul(w.col_sums[base + c]))
                .wrapping_add(k.wrapping_mul(a_zero).wrapping_mul(b));
            y[c] = exact as f32 * (sa * w.scales[base + c]);
        }
    };
    fold(&mut y);
    let at = row * n + base;
    match dst {
        Dst::F32(ptr) => std::slice::from_raw_parts_mut(ptr.get().add(at), cols).copy_from_slice(&y[..cols]),
        Dst::U8(ptr, s, z) => {
            let out = std::slice::from_raw_parts_mut(ptr.get().add(at), cols);
            for (o, &v) in out.iter_mut().zip(&y) {
                *o = requantise(v, s, z, 0.0, 255.0) as u8;
            }
        }
        Dst::I8(ptr, s, z) => {
            let out = std::slice::from_raw_parts_mut(ptr.get().add(at), cols);
            for (o, &v) in out.iter_mut().zip(&y) {
                *o = requantise(v, s, z, -128.0, 127.0) as i8;
            }
        }
    }
}

/// QuantizeLinear's rounding: `clamp(round_half_even(y / s) + z)` in f32; NaN rounds to 0.
#[inline]
fn requantise(y: f32, s: f32, z: i32, lo: f32, hi: f32) -> i32 {
    let x = y / s;
    let r = if x.is_nan() {
        0.0
    } else if x.abs() < 4_194_304.0 {
        const MAGIC: f32 = 12_582_912.0;
        (x + MAGIC) - MAGIC
    } else {
        // |x| ≥ 2²²: far outside any 8-bit range, the clamp decides.
        x
    };
    (r + z as f32).clamp(lo, hi) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requantisation_rounds_half_to_even_then_adds_the_zero_point() {
        assert_eq!(requantise(2.5, 1.0, 0, 0.0, 255.0), 2);
        assert_eq!(requantise(3.5, 1.0, 10, 0.0, 255.0), 14);
        assert_eq!(requantise(-0.5, 1.0, 0, -128.0, 127.0), 0);
        assert_eq!(requantise(1e30, 1.0, 0, -128.0, 127.0), 127);
        assert_eq!(requantise(f32::NAN, 1.0, 7, 0.0, 255.0), 7);
    }

    #[test]
    fn column_sums_are_computed_once_at_pack_time() {
        let w: Vec<u8> = vec![0, 255, 128, 1];
        let p = pack_qgemm(2, 2, QWeightCodes::U8(&w), &[1.0], &[3]).unwrap();
        // w_s = w − 128: columns (−128, 0) and (127, −127).
        assert_eq!(&p.col_sums[..2], &[-128, 0]);
        assert_eq!(p.zero_points[0], 3 - 128);
        assert!(matches!(
            pack_qgemm(MAX_K + 1, 1, QWeightCodes::I8(&vec![0; MAX_K + 1]), &[1.0], &[0]),
            Err(KernelError::Unsupported { .. })
        ));
    }

    /// Products from elsewhere (here: plain loops over the signed codes) give `qgemm_scaled`'s
    /// outputs bit for bit, for u8 and i8 weights and activations, per-tensor and per-row scales,
    /// f32 and requantised outputs, and a K and N that are no multiple of 4 or 16.
    #[test]
    fn products_from_an_int8_array_give_the_kernels_outputs() {
        let (m, k, n) = (5, 37, 21);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        };
        let wu: Vec<u8> = (0..k * n).map(|_| next()).collect();
        let au: Vec<u8> = (0..m * k).map(|_| next()).collect();
        let (wi, ai): (Vec<i8>, Vec<i8>) =
            (wu.iter().map(|&v| v as i8).collect(), au.iter().map(|&v| v as i8).collect());
        let scales: Vec<f32> = (0..n).map(|j| 0.01 + j as f32 * 1e-3).collect();
        let zeros: Vec<i32> = (0..n).map(|j| j as i32 % 7 - 3).collect();
        let rows: Vec<f32> = (0..m).map(|i| 0.02 + i as f32 * 1e-3).collect();
        let pool = ThreadPool::new(1);
        for wcodes in [QWeightCodes::U8(&wu), QWeightCodes::I8(&wi)] {
            let packed = pack_qgemm(k, n, wcodes, &scales, &zeros).unwrap();
            let w = packed.weights();
            let wk = w.codes_kn();
            let expect: Vec<i8> = match wcodes {
                QWeightCodes::U8(v) => v.iter().map(|&c| (c ^ 0x80) as i8).collect(),
                QWeightCodes::I8(v) => v.to_vec(),
            };
            assert_eq!(wk, expect, "codes_kn gives w_s");
            for a in [QActivations::U8(&au), QActivations::I8(&ai)] {
                let sa = signed_codes(a);
                let mut p = vec![0i32; m * n];
                for i in 0..m {
                    for j in 0..n {
                        p[i * n + j] = (0..k).map(|kk| sa[i * k + kk] as i32 * wk[kk * n + j] as i32).sum();
                    }
                }
                for per_row in [false, true] {
                    let scale = || if per_row { AScale::Rows(&rows) } else { AScale::Tensor(0.05) };
                    let mut want = vec![0f32; m * n];
                    let mut got = vec![0f32; m * n];
                    let mut scratch = QGemmScratch::default();
                    qgemm_scaled(Isa::Scalar, &pool, w, a, m, scale(), 5, QOutput::F32(&mut want), None, &mut scratch);
                    qgemm_from_products(w, a, m, scale(), 5, &p, QOutput::F32(&mut got)).unwrap();
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                    );
                    let (mut want, mut got) = (vec![0u8; m * n], vec![0u8; m * n]);
                    let q = |y| QOutput::U8 { y, scale: 2.0, zero_point: 120 };
                    qgemm_scaled(Isa::Scalar, &pool, w, a, m, scale(), 5, q(&mut want), None, &mut scratch);
                    qgemm_from_products(w, a, m, scale(), 5, &p, q(&mut got)).unwrap();
                    assert_eq!(got, want);
                    assert!(want.iter().any(|&v| v != 0 && v != 255), "requantised outputs in range");
                }
            }
        }
        // Lengths are checked.
        let packed = pack_qgemm(k, n, QWeightCodes::I8(&wi), &scales, &zeros).unwrap();
        let mut y = vec![0f32; m * n];
        let e = qgemm_from_products(
            packed.weights(),
            QActivations::I8(&ai),
            m,
            AScale::Tensor(1.0),
            0,
            &[0; 3],
            QOutput::F32(&mut y),
        );
        assert!(e.is_err());
    }
}

//! `WGemm`: weight-only int4/int8 GEMM with onnxruntime MatMulNBits semantics,
//! `y[m, n] = Σₖ a[m, k] · (q[n, k] − z[n, blk]) · s[n, blk] (+ bias[n])`, blk = k / block_size.
//!
//! # Source format (MatMulNBits)
//!
//! `b` is uint8 `[N, blocks, block_size·bits/8]`: each row n of W holds its K codes in blocks,
//! `bits`-wide codes packed low bits first (4-bit: element 2i in the low nibble); the last block is
//! padded when K is not a multiple of the block. `scales` is f32 `[N·blocks]`. Zero points are
//! absent (2^(bits−1): 8 for 4-bit, 128 for 8-bit — the `code − 128` form of SmolLM2's tied 8-bit
//! embedding/lm_head), packed uint8 `[N, ⌈blocks·bits/8⌉]`, or f32 `[N·blocks]` (SmolLM2's Q4_1
//! mapping writes `−m/d`). f16 scales or zero points must be widened to f32 before packing
//! (exact). Supported: bits 4 and 8, block_size a multiple of 16; not supported: `g_idx`
//! (act-order block indices), which a compiler must refuse or resolve before packing.
//!
//! # Packed format ([`pack_wgemm`])
//!
//! Columns of W (outputs n) are grouped into panels of [`PANEL`] = 16; a panel stores, block by
//! block, the codes of its 16 columns interleaved so that one 64-byte load feeds 16 output lanes:
//!
//! - codes, per (panel p, block b), `block_size / kg` groups of 64 bytes, kg = 8 values of k
//!   for 4-bit and 4 for 8-bit. In group g, byte `4c + j` (c = column in the panel, j = 0..4) holds
//!   - 4-bit: `q[16p+c, k₀+j]` in the low nibble and `q[16p+c, k₀+4+j]` in the high nibble,
//!   - 8-bit: `q[16p+c, k₀+j]`,
//!
//!   with k₀ = b·block_size + g·kg. Offset of the group: `((p·blocks + b)·groups + g)·64`.
//! - scales: f32 at `(p·blocks + b)·16 + c`.
//! - zero points: none (the default), one byte each, or one f32 each, at the same index as scales.
//!
//! Codes past K are 0; columns past N have code 0, scale 0 and zero point 0. The packed form is
//! the same size as the source plus column padding to a multiple of 16 (none for real models),
//! plus, for packed-uint8 4-bit zero points, one byte instead of half a byte per block and column:
//! at block 32 that is (16 + 4 + 1) / (16 + 4 + 0.5) = 1.024× the MatMulNBits bytes.
//!
//! A bundle stores the three buffers as they are (u8 codes, f32 scales, u8 or f32 zero points)
//! with K, N, bits and block_size; [`WGemmWeights::from_parts`] borrows them from a mapped file
//! and checks their lengths. Loads are unaligned, so any alignment works; 64 bytes is best.
//!
//! # Paths and precision
//!
//! [`WGemmPrecision::Exact`] multiplies f32 activations by the codes in f32 and applies the block's
//! scale and zero point once per block: `y += s·(Σₖ q·a − z·Σₖ a)`. It differs from dequantising
//! each weight only by f32 rounding (tests bound it by `(K + 8)·ε·Σₖ |s|·(|q| + |z|)·|a|`).
//!
//! [`WGemmPrecision::Int8Activations`] quantises each activation row per weight block to int8
//! (llama.cpp's Q8 scheme: `s_a = max|a| / 127`, `a_q = round_half_even(a · (127 / max|a|))`), takes exact
//! integer dot products of codes and `a_q` (`vpdpbusd` with VNNI; `vpmaddubsw` + `vpmaddwd`
//! otherwise), and applies `y += s·s_a·(dot − z·Σ a_q)` per block. The only difference from the
//! exact result is the activation rounding: each `a` moves by at most `s_a / 2`, so
//! `|Δy| ≤ Σ_blocks (s_a / 2)·Σₖ |(q − z)·s|` (plus f32 rounding); on uniform random data the
//! relative RMS error is 0.45 % (the tests assert the bound per output, and below 1 % RMS).
//! Every path computes the same integers and the same f32 epilogue operations in the same order,
//! so this mode is bit-identical across scalar, AVX2, AVX-512 and VNNI.
//!
//! Rows are processed in chunks that share each weight load (int8 activations: up to 8 with
//! AVX-512, 4 with AVX2; exact: 4 and 2, each row with four accumulators of its own), so M = 1 is
//! the decode GEMV and larger M (prefill) loops the chunks over a panel while it is hot in L1.
//! Threads split the panels; each weight byte is read once per call. On every path a row's
//! result does not depend on M or on the rows beside it: a verify block of rows gives each row
//! the bits a single-row step gives.

use super::pool::ThreadPool;
use super::{shape_err, split_range, Isa, KernelError, SyncPtr};

#[cfg(target_arch = "x86_64")]
mod x86;

/// Output columns per panel.
pub const PANEL: usize = 16;
const GROUP_BYTES: usize = 64;
/// Rows one kernel call handles at most.
const MAX_ROWS: usize = 8;

type Tile = [[f32; PANEL]; MAX_ROWS];

/// Zero points of a MatMulNBits source.
#[derive(Clone, Copy, Debug)]
pub enum NBitsZeroPoints<'a> {
    /// 2^(bits−1).
    Default,
    /// uint8 `[N, ⌈blocks·bits/8⌉]`, `bits`-wide, low bits first.
    Packed(&'a [u8]),
    /// f32 `[N·blocks]`.
    Float(&'a [f32]),
}

/// Weights as onnxruntime's MatMulNBits holds them (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct MatMulNBits<'a> {
    pub k: usize,
    pub n: usize,
    pub bits: usize,
    pub block_size: usize,
    pub b: &'a [u8],
    pub scales: &'a [f32],
    pub zero_points: NBitsZeroPoints<'a>,
}

/// Zero points of packed weights, one per (panel, block, column).
#[derive(Clone, Copy, Debug)]
pub enum WGemmZeroPoints<'a> {
    Default,
    U8(&'a [u8]),
    F32(&'a [f32]),
}

/// Packed weights, borrowed (from a [`PackedWGemm`] or a mapped bundle file).
#[derive(Clone, Copy, Debug)]
pub struct WGemmWeights<'a> {
    k: usize,
    n: usize,
    bits: usize,
    block_size: usize,
    codes: &'a [u8],
    scales: &'a [f32],
    zero_points: WGemmZeroPoints<'a>,
}

impl<'a> WGemmWeights<'a> {
    /// Packed weights from their parts, checking every length against K, N, bits and block size.
    pub fn from_parts(
        k: usize,
        n: usize,
        bits: usize,
        block_size: usize,
        codes: &'a [u8],
        scales: &'a [f32],
        zero_points: WGemmZeroPoints<'a>,
    ) -> Result<WGemmWeights<'a>, KernelError> {
        check_config(k, n, bits, block_size)?;
        let w = WGemmWeights { k, n, bits, block_size, codes, scales, zero_points };
        let params = w.panels() * w.blocks() * PANEL;
        if codes.len() != w.panels() * w.blocks() * w.block_bytes() {
            return Err(shape_err(
                "packed codes",
                format!("{} bytes, expected {}", codes.len(), w.panels() * w.blocks() * w.block_bytes()),
            ));
        }
        if scales.len() != params {
            return Err(shape_err("packed scales", format!("{} values, expected {params}", scales.len())));
        }
        let zp_len = match zero_points {
            WGemmZeroPoints::Default => params,
            WGemmZeroPoints::U8(z) => z.len(),
            WGemmZeroPoints::F32(z) => z.len(),
        };
        if zp_len != params {
            return Err(shape_err("packed zero points", format!("{zp_len} values, expected {params}")));
        }
        Ok(w)
    }

    pub fn k(&self) -> usize {
        self.k
    }
    pub fn n(&self) -> usize {
        self.n
    }
    pub fn bits(&self) -> usize {
        self.bits
    }
    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn blocks(&self) -> usize {
        self.k.div_ceil(self.block_size)
    }
    pub fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }
    pub fn codes(&self) -> &'a [u8] {
        self.codes
    }
    pub fn scales(&self) -> &'a [f32] {
        self.scales
    }
    pub fn zero_points(&self) -> WGemmZeroPoints<'a> {
        self.zero_points
    }
    /// The weights of output columns `cols`, which start on a panel and end on one (or at N):
    /// a view of the same buffers. Panics otherwise (a caller bug).
    pub fn columns(&self, cols: std::ops::Range<usize>) -> WGemmWeights<'a> {
        assert!(
            cols.start.is_multiple_of(PANEL)
                && (cols.end.is_multiple_of(PANEL) || cols.end == self.n)
                && cols.start < cols.end,
            "columns {cols:?} of N={} are not whole panels",
            self.n
        );
        let (first, last) = (cols.start / PANEL, cols.end.div_ceil(PANEL));
        let params = self.blocks() * PANEL;
        let code_bytes = self.blocks() * self.block_bytes();
        let zero_points = match self.zero_points {
            WGemmZeroPoints::Default => WGemmZeroPoints::Default,
            WGemmZeroPoints::U8(z) => WGemmZeroPoints::U8(&z[first * params..last * params]),
            WGemmZeroPoints::F32(z) => WGemmZeroPoints::F32(&z[first * params..last * params]),
        };
        WGemmWeights {
            n: cols.len(),
            codes: &self.codes[first * code_bytes..last * code_bytes],
            scales: &self.scales[first * params..last * params],
            zero_points,
            ..*self
        }
    }
    /// K rounded up to whole blocks.
    pub fn k_padded(&self) -> usize {
        self.blocks() * self.block_size
    }
    /// Bytes one call reads: codes, scales and zero points.
    pub fn bytes(&self) -> usize {
        let zp = match self.zero_points {
            WGemmZeroPoints::Default => 0,
            WGemmZeroPoints::U8(z) => z.len(),
            WGemmZeroPoints::F32(z) => 4 * z.len(),
        };
        self.codes.len() + 4 * self.scales.len() + zp
    }
    fn groups_per_block(&self) -> usize {
        self.block_size / self.k_per_group()
    }
    fn k_per_group(&self) -> usize {
        if self.bits == 4 {
            8
        } else {
            4
        }
    }
    /// Code bytes of one (panel, block).
    fn block_bytes(&self) -> usize {
        self.groups_per_block() * GROUP_BYTES
    }
    /// The code of column `c` of panel `p` at `k` (a scalar read of the packed layout).
    fn code(&self, p: usize, c: usize, k: usize) -> u8 {
        let (b, kk) = (k / self.block_size, k % self.block_size);
        let kg = self.k_per_group();
        let (g, within) = (kk / kg, kk % kg);
        let base = ((p * self.blocks() + b) * self.groups_per_block() + g) * GROUP_BYTES + 4 * c;
        if self.bits == 4 {
            let byte = self.codes[base + within % 4];
            if within < 4 {
                byte & 0x0f
            } else {
                byte >> 4
            }
        } else {
            self.codes[base + within]
        }
    }
    /// Writes output column `col` of W dequantised, `(q − z)·s` in f32 for k in 0..K: row `col`
    /// of the table when the weights are a tied embedding / lm_head. Panics when `col ≥ N` or
    /// `out` is not K long.
    pub fn dequantise_column(&self, col: usize, out: &mut [f32]) {
        assert!(
            col < self.n && out.len() == self.k,
            "dequantise_column: column {col} of {}, {} outputs for K={}",
            self.n,
            out.len(),
            self.k
        );
        let (p, c) = (col / PANEL, col % PANEL);
        for (k, o) in out.iter_mut().enumerate() {
            let param = (p * self.blocks() + k / self.block_size) * PANEL + c;
            *o = (self.code(p, c, k) as f32 - self.zero(param)) * self.scales[param];
        }
    }

    /// The zero point at parameter index `i` = (p·blocks + b)·16 + c.
    fn zero(&self, i: usize) -> f32 {
        match self.zero_points {
            WGemmZeroPoints::Default => (1u32 << (self.bits - 1)) as f32,
            WGemmZeroPoints::U8(z) => z[i] as f32,
            WGemmZeroPoints::F32(z) => z[i],
        }
    }
}

/// Owned zero points of a [`PackedWGemm`].
#[derive(Clone, Debug, PartialEq)]
pub enum PackedZeroPoints {
    Default,
    U8(Vec<u8>),
    F32(Vec<f32>),
}

/// Weights packed by [`pack_wgemm`].
#[derive(Clone, Debug, PartialEq)]
pub struct PackedWGemm {
    pub k: usize,
    pub n: usize,
    pub bits: usize,
    pub block_size: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub zero_points: PackedZeroPoints,
}

impl PackedWGemm {
    pub fn weights(&self) -> WGemmWeights<'_> {
        let zero_points = match &self.zero_points {
            PackedZeroPoints::Default => WGemmZeroPoints::Default,
            PackedZeroPoints::U8(z) => WGemmZeroPoints::U8(z),
            PackedZeroPoints::F32(z) => WGemmZeroPoints::F32(z),
        };
        WGemmWeights::from_parts(self.k, self.n, self.bits, self.block_size, &self.codes, &self.scales, zero_points)
            .expect("a PackedWGemm is consistent by construction")
    }
}

fn check_config(k: usize, n: usize, bits: usize, block_size: usize) -> Result<(), KernelError> {
    if k == 0 || n == 0 {
        return Err(shape_err("WGemm", format!("K={k} and N={n} must be positive")));
    }
    if bits != 4 && bits != 8 {
        return Err(KernelError::Unsupported { what: "WGemm bits", detail: format!("{bits} (4 and 8 are)") });
    }
    if block_size < 16 || !block_size.is_multiple_of(16) {
        return Err(KernelError::Unsupported {
            what: "WGemm block_size",
            detail: format!("{block_size} (multiples of 16 are)"),
        });
    }
    Ok(())
}

/// Reads `bits`-wide element `i` of a packed row, low bits first.
fn unpack(row: &[u8], bits: usize, i: usize) -> u8 {
    let bit = i * bits;
    ((row[bit / 8] >> (bit % 8)) as u32 & ((1u32 << bits) - 1)) as u8
}

/// Repacks MatMulNBits weights into the panel layout of the module doc.
pub fn pack_wgemm(src: &MatMulNBits) -> Result<PackedWGemm, KernelError> {
    let MatMulNBits { k, n, bits, block_size, b, scales, zero_points } = *src;
    check_config(k, n, bits, block_size)?;
    let blocks = k.div_ceil(block_size);
    let blob = block_size * bits / 8;
    if b.len() != n * blocks * blob {
        return Err(shape_err(
            "MatMulNBits B",
            format!("{} bytes, expected N·blocks·{blob} = {}", b.len(), n * blocks * blob),
        ));
    }
    if scales.len() != n * blocks {
        return Err(shape_err(
            "MatMulNBits scales",
            format!("{} values, expected N·blocks = {}", scales.len(), n * blocks),
        ));
    }
    let zp_row_bytes = (blocks * bits).div_ceil(8);
    match zero_points {
        NBitsZeroPoints::Packed(z) if z.len() != n * zp_row_bytes => {
            return Err(shape_err(
                "MatMulNBits zero_points",
                format!("{} bytes, expected {}", z.len(), n * zp_row_bytes),
            ));
        }
        NBitsZeroPoints::Float(z) if z.len() != n * blocks => {
            return Err(shape_err("MatMulNBits zero_points", format!("{} values, expected {}", z.len(), n * blocks)));
        }
        _ => {}
    }
    let panels = n.div_ceil(PANEL);
    let params = panels * blocks * PANEL;
    let mut out = PackedWGemm {
        k,
        n,
        bits,
        block_size,
        codes: vec![],
        scales: vec![0.0; params],
        zero_points: match zero_points {
            NBitsZeroPoints::Default => PackedZeroPoints::Default,
            NBitsZeroPoints::Packed(_) => PackedZeroPoints::U8(vec![0; params]),
            NBitsZeroPoints::Float(_) => PackedZeroPoints::F32(vec![0.0; params]),
        },
    };
    let kg = if bits == 4 { 8 } else { 4 };
    let block_bytes = block_size / kg * GROUP_BYTES;
    out.codes = vec![0; panels * blocks * block_bytes];
    for col in 0..n {
        let (p, c) = (col / PANEL, col % PANEL);
        for blk in 0..blocks {
            let param = (p * blocks + blk) * PANEL + c;
            out.scales[param] = scales[col * blocks + blk];
            match (&mut out.zero_points, zero_points) {
                (PackedZeroPoints::U8(dst), NBitsZeroPoints::Packed(z)) => {
                    dst[param] = unpack(&z[col * zp_row_bytes..][..zp_row_bytes], bits, blk);
                }
                (PackedZeroPoints::F32(dst), NBitsZeroPoints::Float(z)) => dst[param] = z[col * blocks + blk],
                _ => {}
            }
            let row = &b[(col * blocks + blk) * blob..][..blob];
            let block_base = (p * blocks + blk) * block_bytes + 4 * c;
            for kk in 0..block_size.min(k - blk * block_size) {
                let code = unpack(row, bits, kk);
                let (g, within) = (kk / kg, kk % kg);
                let at = block_base + g * GROUP_BYTES;
                if bits == 4 {
                    out.codes[at + within % 4] |= code << (4 * (within / 4));
                } else {
                    out.codes[at + within] = code;
                }
            }
        }
    }
    Ok(out)
}

/// How the activations meet the codes (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WGemmPrecision {
    /// f32 activations × codes in f32.
    Exact,
    /// Activations quantised to int8 per block; exact integer dot products.
    Int8Activations,
}

/// Activation rows quantised per block to int8 by [`quantize_rows`].
#[derive(Clone, Debug, Default)]
pub struct QuantizedRows {
    m: usize,
    k: usize,
    block_size: usize,
    /// [m, blocks·block_size], zero past K.
    codes: Vec<i8>,
    /// [m, blocks]: s_a = max|a| / 127.
    scales: Vec<f32>,
    /// [m, blocks]: Σ a_q.
    sums: Vec<i32>,
}

impl QuantizedRows {
    pub fn rows(&self) -> usize {
        self.m
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn block_size(&self) -> usize {
        self.block_size
    }
    fn blocks(&self) -> usize {
        self.k.div_ceil(self.block_size)
    }
    fn stride(&self) -> usize {
        self.blocks() * self.block_size
    }
}

/// Quantises `m` rows of `k` activations per block of `block_size` (the weights' block) into
/// `out`, reusing its buffers. One quantisation serves every WGemm that reads the same input
/// (q, k and v projections; gate and up).
pub fn quantize_rows(a: &[f32], m: usize, k: usize, block_size: usize, out: &mut QuantizedRows) {
    assert!(k > 0 && block_size > 0 && a.len() == m * k, "quantize_rows: a holds {} values, not {m}×{k}", a.len());
    let blocks = k.div_ceil(block_size);
    let stride = blocks * block_size;
    out.m = m;
    out.k = k;
    out.block_size = block_size;
    out.codes.clear();
    out.codes.resize(m * stride, 0);
    out.scales.clear();
    out.scales.resize(m * blocks, 0.0);
    out.sums.clear();
    out.sums.resize(m * blocks, 0);
    for r in 0..m {
        for b in 0..blocks {
            let lo = b * block_size;
            let hi = (lo + block_size).min(k);
            let (s, sum) = quantize_block(&a[r * k + lo..r * k + hi], &mut out.codes[r * stride + lo..r * stride + hi]);
            out.scales[r * blocks + b] = s;
            out.sums[r * blocks + b] = sum;
        }
    }
}

/// Rounds half to even for |x| < 2²², without relying on SSE4.1 `roundps` being available.
#[inline(always)]
fn round_half_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³
    (x + MAGIC) - MAGIC
}

fn quantize_block(a: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = a.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    if amax == 0.0 || !amax.is_finite() {
        q.fill(0);
        return (if amax == 0.0 { 0.0 } else { amax }, 0);
    }
    let inv = 127.0 / amax;
    let mut sum = 0i32;
    for (x, o) in a.iter().zip(q.iter_mut()) {
        let v = round_half_even(x * inv).clamp(-127.0, 127.0) as i8;
        *o = v;
        sum += v as i32;
    }
    (amax / 127.0, sum)
}

/// Scratch buffers a WGemm call reuses; they grow to the largest shape seen, then never
/// allocate again.
#[derive(Clone, Debug, Default)]
pub struct WGemmScratch {
    rows: QuantizedRows,
    padded: Vec<f32>,
    sums: Vec<f32>,
}

/// Activation rows as a kernel reads them: `m` rows of `stride` (≥ K, a multiple of the block),
/// zero past K, with per-(row, block) side data.
#[derive(Clone, Copy)]
pub(crate) enum Rows<'a> {
    /// f32 activations and Σₖ a per block.
    Exact { a: &'a [f32], stride: usize, sums: &'a [f32] },
    /// int8 codes, their scales and Σₖ a_q per block.
    Int8 { codes: &'a [i8], stride: usize, scales: &'a [f32], sums: &'a [i32] },
}

/// `y[m, N] = a[m, K] · Wᵀ (+ bias)` for MatMulNBits-packed `w`. `a` is `m × K` row-major, `y`
/// is `m × N`. Panics when a buffer's length does not fit (a caller bug).
#[allow(clippy::too_many_arguments)]
pub fn wgemm(
    isa: Isa,
    pool: &ThreadPool,
    w: &WGemmWeights,
    a: &[f32],
    m: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
    precision: WGemmPrecision,
    scratch: &mut WGemmScratch,
) {
    let (k, bs) = (w.k, w.block_size);
    assert_eq!(a.len(), m * k, "wgemm: a holds {} values, not {m}×{k}", a.len());
    match precision {
        WGemmPrecision::Int8Activations => {
            quantize_rows(a, m, k, bs, &mut scratch.rows);
            wgemm_quantized(isa, pool, w, &scratch.rows, bias, y);
        }
        WGemmPrecision::Exact => {
            let blocks = w.blocks();
            let stride = w.k_padded();
            let a = if stride == k {
                a
            } else {
                scratch.padded.clear();
                scratch.padded.resize(m * stride, 0.0);
                for r in 0..m {
                    scratch.padded[r * stride..r * stride + k].copy_from_slice(&a[r * k..(r + 1) * k]);
                }
                &scratch.padded[..]
            };
            scratch.sums.clear();
            scratch.sums.extend(a.chunks_exact(bs).map(|blk| blk.iter().sum::<f32>()));
            debug_assert_eq!(scratch.sums.len(), m * blocks);
            run(isa, pool, w, m, Rows::Exact { a, stride, sums: &scratch.sums }, bias, y);
        }
    }
}

/// As [`wgemm`] in [`WGemmPrecision::Int8Activations`], for rows already quantised with the
/// weights' K and block size.
pub fn wgemm_quantized(
    isa: Isa,
    pool: &ThreadPool,
    w: &WGemmWeights,
    q: &QuantizedRows,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    assert!(
        q.k == w.k && q.block_size == w.block_size,
        "wgemm: rows quantised for K={} block {} meet weights K={} block {}",
        q.k,
        q.block_size,
        w.k,
        w.block_size
    );
    let rows = Rows::Int8 { codes: &q.codes, stride: q.stride(), scales: &q.scales, sums: &q.sums };
    run(isa, pool, w, q.m, rows, bias, y);
}

fn run(isa: Isa, pool: &ThreadPool, w: &WGemmWeights, m: usize, rows: Rows, bias: Option<&[f32]>, y: &mut [f32]) {
    let isa = isa.check();
    let n = w.n;
    assert_eq!(y.len(), m * n, "wgemm: y holds {} values, not {m}×{n}", y.len());
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "wgemm: bias holds {} values, not N={n}", b.len());
    }
    if m == 0 {
        return;
    }
    let panels = w.panels();
    let tasks = if pool.threads() == 1 { 1 } else { panels.min(pool.threads() * 4) };
    let out = SyncPtr(y.as_mut_ptr());
    pool.run(tasks, &|t| {
        let mut tile: Tile = [[0.0; PANEL]; MAX_ROWS];
        for p in split_range(panels, tasks, t) {
            let cols = PANEL.min(n - p * PANEL);
            let mut r0 = 0;
            while r0 < m {
                let r = (m - r0).min(max_rows(isa, &rows));
                panel(isa, w, p, &rows, r0, r, &mut tile);
                for (i, t) in tile.iter().take(r).enumerate() {
                    // SAFETY: tasks own disjoint panels, hence disjoint columns of y, and
                    // (r0 + i)·n + p·16 + cols ≤ m·n.
                    let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add((r0 + i) * n + p * PANEL), cols) };
                    match bias {
                        Some(b) => {
                            for ((d, &v), &bv) in dst.iter_mut().zip(t).zip(&b[p * PANEL..]) {
                                *d = v + bv;
                            }
                        }
                        None => dst.copy_from_slice(&t[..cols]),
                    }
                }
                r0 += r;
            }
        }
    });
}

/// Rows one kernel call computes: what the path's registers hold (see `x86`).
fn max_rows(isa: Isa, rows: &Rows) -> usize {
    match (isa, rows) {
        (Isa::Scalar, _) => MAX_ROWS,
        (Isa::Avx2, Rows::Exact { .. }) => 2,
        (Isa::Avx2, Rows::Int8 { .. }) => 4,
        (_, Rows::Exact { .. }) => 4,
        (_, Rows::Int8 { .. }) => 8,
    }
}

/// Computes rows `r0..r0 + r` of panel `p` into `tile[0..r]`.
fn panel(isa: Isa, w: &WGemmWeights, p: usize, rows: &Rows, r0: usize, r: usize, tile: &mut Tile) {
    match isa {
        Isa::Scalar => panel_scalar(w, p, rows, r0, r, tile),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `run` checked that the CPU has the path's features; the row and panel ranges
        // are inside the buffers `wgemm` checked.
        _ => unsafe { x86::panel(isa, w, p, rows, r0, r, tile) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => panel_scalar(w, p, rows, r0, r, tile),
    }
}

/// The portable kernel, written straight from the layout; the int8 epilogue is the very
/// sequence of f32 operations the SIMD kernels perform, so their results are bit-identical.
fn panel_scalar(w: &WGemmWeights, p: usize, rows: &Rows, r0: usize, r: usize, tile: &mut Tile) {
    let (blocks, bs) = (w.blocks(), w.block_size);
    for (i, out) in tile.iter_mut().take(r).enumerate() {
        let row = r0 + i;
        for (c, o) in out.iter_mut().enumerate() {
            let mut y = 0.0f32;
            for b in 0..blocks {
                let param = (p * blocks + b) * PANEL + c;
                let (s, z) = (w.scales[param], w.zero(param));
                match *rows {
                    Rows::Exact { a, stride, sums } => {
                        let a = &a[row * stride + b * bs..][..bs];
                        let mut acc = 0.0f32;
                        for (kk, &x) in a.iter().enumerate() {
                            acc += w.code(p, c, b * bs + kk) as f32 * x;
                        }
                        y += s * (acc - z * sums[row * blocks + b]);
                    }
                    Rows::Int8 { codes, stride, scales, sums } => {
                        let a = &codes[row * stride + b * bs..][..bs];
                        let mut dot = 0i32;
                        for (kk, &x) in a.iter().enumerate() {
                            dot += w.code(p, c, b * bs + kk) as i32 * x as i32;
                        }
                        let d = (-z).mul_add(sums[row * blocks + b] as f32, dot as f32);
                        y = d.mul_add(s * scales[row * blocks + b], y);
                    }
                }
            }
            *o = y;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_places_each_code_where_the_layout_says() {
        // N = 3, K = 40 (two blocks of 32, the second half padding), 4-bit codes (n + k) % 16.
        let (n, k, bs) = (3, 40, 32);
        let mut b = vec![0u8; n * 2 * 16];
        for col in 0..n {
            for kk in 0..k {
                let code = ((col + kk) % 16) as u8;
                let (blk, within) = (kk / bs, kk % bs);
                b[(col * 2 + blk) * 16 + within / 2] |= code << (4 * (within % 2));
            }
        }
        let scales: Vec<f32> = (0..n * 2).map(|i| i as f32).collect();
        let src = MatMulNBits {
            k,
            n,
            bits: 4,
            block_size: bs,
            b: &b,
            scales: &scales,
            zero_points: NBitsZeroPoints::Default,
        };
        let packed = pack_wgemm(&src).unwrap();
        let w = packed.weights();
        for col in 0..n {
            for kk in 0..k {
                assert_eq!(w.code(0, col, kk) as usize, (col + kk) % 16, "column {col}, k {kk}");
            }
            assert_eq!(w.scales[PANEL + col], (col * 2 + 1) as f32);
        }
        assert_eq!(w.code(0, 0, 45), 0, "codes past K are zero");
        assert_eq!(w.scales[5], 0.0, "columns past N have scale zero");
    }

    #[test]
    fn packed_size_stays_within_a_tenth_of_the_source() {
        let (n, k) = (64, 576);
        let blocks = k / 32;
        let b = vec![0x11u8; n * blocks * 16];
        let scales = vec![1.0f32; n * blocks];
        let zp = vec![0x88u8; n * blocks.div_ceil(2)];
        let src = MatMulNBits {
            k,
            n,
            bits: 4,
            block_size: 32,
            b: &b,
            scales: &scales,
            zero_points: NBitsZeroPoints::Packed(&zp),
        };
        let packed = pack_wgemm(&src).unwrap();
        let source_bytes = b.len() + 4 * scales.len() + zp.len();
        let ratio = packed.weights().bytes() as f64 / source_bytes as f64;
        assert!(ratio <= 1.1, "packed/source = {ratio}");
    }

    #[test]
    fn unsupported_configurations_are_errors() {
        let src = MatMulNBits {
            k: 32,
            n: 1,
            bits: 2,
            block_size: 32,
            b: &[0; 8],
            scales: &[1.0],
            zero_points: NBitsZeroPoints::Default,
        };
        assert!(matches!(pack_wgemm(&src), Err(KernelError::Unsupported { what: "WGemm bits", .. })));
        let src = MatMulNBits {
            k: 32,
            n: 1,
            bits: 4,
            block_size: 32,
            b: &[0; 15],
            scales: &[1.0],
            zero_points: NBitsZeroPoints::Default,
        };
        assert!(matches!(pack_wgemm(&src), Err(KernelError::Shape { what: "MatMulNBits B", .. })));
    }

    #[test]
    fn quantisation_rounds_half_to_even_and_sums_the_codes() {
        let mut q = QuantizedRows::default();
        // max 127 → scale 1: 2.5 → 2, 3.5 → 4, -0.5 → -0.
        quantize_rows(&[127.0, 2.5, 3.5, -0.5], 1, 4, 16, &mut q);
        assert_eq!(&q.codes[..4], &[127, 2, 4, 0]);
        assert_eq!((q.scales[0], q.sums[0]), (1.0, 133));
        assert!(q.codes[4..].iter().all(|&c| c == 0));
    }
}

//! Tiling per GEMM shape, chosen by a cost model, with the resource checks that make a tiling
//! legal.
//!
//! The array computes an output block of `rows·m × cols·n` at a time: compute tile (c, r) owns an
//! `m × n` tile and walks K in steps of `k`. A row of cores shares its A tile (broadcast across
//! columns), a column shares its B tile (broadcast across rows). The cost model counts compute
//! cycles at the device's int8 MAC rate (plus a fixed per-call overhead) against the busiest DMA
//! channel's bytes at 4 bytes per cycle; double buffering overlaps the two, so a tiling takes the
//! larger of them plus the first transfer. Among the tilings that fit (L1 and L2 double-buffered,
//! locks, BDs, channels, DMA dimension limits), the fastest wins; utilisation is the logical
//! shape's MACs over what the whole array could do in that time.

use crate::device::Device;
use serde::Serialize;

/// A GEMM `[m, k] × [k, n]` (m is the rows of one call: the M-block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct GemmShape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

impl std::fmt::Display for GemmShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.m, self.k, self.n)
    }
}

/// Kernel call overhead in cycles (loop setup, pointer arithmetic, pipeline fill).
pub const KERNEL_CALL_OVERHEAD_CYCLES: u64 = 64;

/// A chosen tiling and what it costs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tiling {
    pub device: Device,
    /// The logical shape the design computes.
    pub shape: GemmShape,
    /// The host buffers' shape: each dimension rounded up to what the tiling divides.
    pub padded: GemmShape,
    /// Per-core tile.
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub rows: usize,
    pub cols: usize,
    /// Bytes of one compute tile's data memory in use (double-buffered A, B, C plus the stack).
    pub l1_bytes: usize,
    /// Bytes of the busiest mem tile in use.
    pub l2_bytes: usize,
    pub compute_cycles: u64,
    pub dma_cycles: u64,
    pub total_cycles: u64,
    /// MACs of the logical shape over the array's peak in `total_cycles`.
    pub utilisation: f64,
}

impl Tiling {
    /// Output row blocks (`rows·m` each) and column blocks (`cols·n` each).
    pub fn blocks(&self) -> (usize, usize) {
        (self.padded.m / (self.rows * self.m), self.padded.n / (self.cols * self.n))
    }
    /// K steps per output tile.
    pub fn k_steps(&self) -> usize {
        self.padded.k / self.k
    }
    /// Output tiles each core computes.
    pub fn tiles_per_core(&self) -> usize {
        let (mb, nb) = self.blocks();
        mb * nb
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TilingError {
    #[error("GEMM {shape} on {device}: no tiling fits: {reason}")]
    NothingFits { shape: GemmShape, device: Device, reason: String },
    #[error("GEMM {shape}: every dimension must be at least 1")]
    Empty { shape: GemmShape },
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// A memory budget one candidate tile breaks.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BudgetError {
    #[error(
        "tile {m}x{k}x{n} needs {bytes} bytes of compute-tile memory (double-buffered A {m}x{k} i8, B {k}x{n} i8, C {m}x{n} i32, {stack_bytes} bytes of stack); the budget is {budget_bytes} bytes"
    )]
    ComputeTile { m: usize, k: usize, n: usize, bytes: usize, stack_bytes: usize, budget_bytes: usize },
    #[error(
        "tile {m}x{k}x{n} needs {bytes} bytes of mem-tile memory (double-buffered A {a_rows}x{k}, B {k}x{n}, C {a_rows}x{n} i32); the budget is {budget_bytes} bytes"
    )]
    MemTile { m: usize, k: usize, n: usize, a_rows: usize, bytes: usize, budget_bytes: usize },
    #[error("empty")]
    Empty,
}

/// Checks one candidate's memories and returns its L1 and L2 bytes, or the first budget it breaks.
fn budgets(device: Device, shape: GemmShape, m: usize, k: usize, n: usize) -> Result<(usize, usize), BudgetError> {
    let rows = device.compute_rows();
    let l1 = 2 * m * k + 2 * k * n + 2 * m * n * 4 + device.core_stack_bytes();
    if l1 > device.core_data_bytes() {
        return Err(BudgetError::ComputeTile {
            m,
            k,
            n,
            bytes: l1,
            stack_bytes: device.core_stack_bytes(),
            budget_bytes: device.core_data_bytes(),
        });
    }
    // Mem tile of column 0 holds A (all rows), its column's B and its column's C join.
    let l2 = 2 * rows * m * k + 2 * k * n + 2 * rows * m * n * 4;
    if l2 > device.mem_tile_bytes() {
        return Err(BudgetError::MemTile {
            m,
            k,
            n,
            a_rows: rows * m,
            bytes: l2,
            budget_bytes: device.mem_tile_bytes(),
        });
    }
    if shape.m == 0 {
        return Err(BudgetError::Empty);
    }
    Ok((l1, l2))
}

/// The cost of one candidate, if it fits.
fn evaluate(device: Device, shape: GemmShape, m: usize, k: usize, n: usize) -> Result<Tiling, BudgetError> {
    let (l1_bytes, l2_bytes) = budgets(device, shape, m, k, n)?;
    let (rows, cols) = (device.compute_rows(), device.columns());
    let padded = GemmShape { m: round_up(shape.m, rows * m), k: round_up(shape.k, k), n: round_up(shape.n, cols * n) };
    let (mb, nb) = (padded.m / (rows * m), padded.n / (cols * n));
    let k_steps = padded.k / k;
    let calls = (mb * nb * k_steps) as u64;
    let per_call = (m * k * n / device.macs_per_cycle()) as u64 + KERNEL_CALL_OVERHEAD_CYCLES;
    let zero = (mb * nb) as u64 * (m * n / 32) as u64;
    let compute_cycles = calls * per_call + zero;
    let bpc = device.stream_bytes_per_cycle() as u64;
    // Busiest channels: the shim channel carrying A (resent for every column block), one column's
    // B, one column's C readback, one row's A broadcast out of the mem tile.
    let a_shim = (padded.m * padded.k * nb) as u64;
    let b_col = (mb * nb * padded.k * n) as u64;
    let c_col = (padded.m * n * nb * 4) as u64;
    let a_row = (mb * nb * m * padded.k) as u64;
    let dma_cycles = [a_shim, b_col, c_col, a_row].into_iter().max().unwrap_or(0).div_ceil(bpc);
    let fill = ((rows * m * k + k * n) as u64).div_ceil(bpc) + ((rows * m * n * 4) as u64).div_ceil(bpc);
    let total_cycles = compute_cycles.max(dma_cycles) + fill;
    let peak = (device.macs_per_cycle() * rows * cols) as f64 * total_cycles as f64;
    let utilisation = (shape.m * shape.k * shape.n) as f64 / peak;
    Ok(Tiling {
        device,
        shape,
        padded,
        m,
        k,
        n,
        rows,
        cols,
        l1_bytes,
        l2_bytes,
        compute_cycles,
        dma_cycles,
        total_cycles,
        utilisation,
    })
}

/// Candidate per-core tiles: m a multiple of 4r, k of s, n of 2t (the kernel's requirements).
fn candidates(device: Device) -> Vec<(usize, usize, usize)> {
    let (r, s, t) = device.micro_tile();
    let mut out = vec![];
    for m in (4 * r..=128).step_by(4 * r) {
        for k in [32, 64, 128, 256] {
            if k % s != 0 {
                continue;
            }
            for n in (2 * t..=256).step_by(2 * t) {
                out.push((m, k, n));
            }
        }
    }
    out
}

/// The fastest tiling of `shape` that fits, with the design it implies checked against every
/// resource limit (see [`crate::design::check`]).
pub fn choose(device: Device, shape: GemmShape) -> Result<Tiling, TilingError> {
    if shape.m == 0 || shape.k == 0 || shape.n == 0 {
        return Err(TilingError::Empty { shape });
    }
    let mut fits = vec![];
    let mut first_reason = None;
    for (m, k, n) in candidates(device) {
        match evaluate(device, shape, m, k, n) {
            Ok(t) => fits.push(t),
            Err(e) => {
                first_reason.get_or_insert(e.to_string());
            }
        }
    }
    // Fastest first; among equals, the least padding, then the least L1.
    fits.sort_by(|a, b| {
        a.total_cycles
            .cmp(&b.total_cycles)
            .then((a.padded.m * a.padded.k * a.padded.n).cmp(&(b.padded.m * b.padded.k * b.padded.n)))
            .then(a.l1_bytes.cmp(&b.l1_bytes))
    });
    for t in fits {
        match crate::design::check(&crate::design::build(&t)) {
            Ok(()) => return Ok(t),
            Err(e) => {
                first_reason.get_or_insert(e.to_string());
            }
        }
    }
    Err(TilingError::NothingFits { shape, device, reason: first_reason.unwrap_or_else(|| "no candidate tile".into()) })
}

/// A tiling with a given per-core tile, checked (for tests and for `--tile` style overrides).
pub fn with_tile(device: Device, shape: GemmShape, m: usize, k: usize, n: usize) -> Result<Tiling, TilingError> {
    let (r, s, t) = device.micro_tile();
    let nothing = |reason: String| TilingError::NothingFits { shape, device, reason };
    if !m.is_multiple_of(4 * r) || !k.is_multiple_of(s) || !n.is_multiple_of(2 * t) || m == 0 || k == 0 || n == 0 {
        return Err(nothing(format!(
            "tile {m}x{k}x{n}: the kernel needs m % {} == 0, k % {s} == 0 and n % {} == 0",
            4 * r,
            2 * t
        )));
    }
    let tiling = evaluate(device, shape, m, k, n).map_err(|e| nothing(e.to_string()))?;
    crate::design::check(&crate::design::build(&tiling)).map_err(|e| nothing(e.to_string()))?;
    Ok(tiling)
}

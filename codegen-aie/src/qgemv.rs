//! GEMV designs with their A8W8 prologue and epilogue on the cores: a block of f32 activation
//! rows in, the f32 outputs of `QuantizeRows{passes}` → `QGemm{passes}` out, so the array takes
//! what the host program holds between a norm and a projection and gives back what the next op
//! reads — the step that lets a layer's projections run as one chain without the host between
//! them.
//!
//! The layout is the GEMV designs' ([`crate::gemv`]): `X` (shim of column 0 → every core,
//! broadcast) carries the rows, `W_<s>` each core its weight tiles, `C_L1L2_<s>` and `C_L2L3_<c>`
//! the outputs, now f32, back through the columns' mem tiles. What changes is the cores:
//!
//! - Every core holds the whole activation row, so each quantises it itself — the same
//!   operations on the same data give the same codes in every core, and no core waits for
//!   another's maximum. The rows arrive `passes + 1` times, K part by K part, as `X` elements of
//!   `[rows, k]` f32: the first time for each row's maximum `|x|`, the second for the codes (and,
//!   with two passes, the residual's maximum), the third for the residual's codes. The codes stay
//!   in the core's own buffers (`codes_<p>_<q>`, pass `p`, K part `q`) for every output tile.
//! - Per output tile the core zeroes one int32 accumulator per pass, multiplies each K part's
//!   weight element into them (the GEMV kernel, [`crate::kernels::gemv_i8_i32_rows`]), and while
//!   it holds the last part's element turns them into the f32 tile with the scales that element
//!   carries after its weights ([`crate::qkernels::meta_rows`]).
//!
//! The functions are [`crate::qkernels`]; the host packs the weight operand with [`pack`]. The
//! tiling type is the GEMV designs' ([`Tiling`]): `shape` the logical `rows × K × N`, `padded`
//! the host buffers (`padded.k = parts·k`, `padded.n = streams·tiles·n`), `k` one K part, `n` one
//! core tile's columns.

use crate::design::{tile_var, Buffer, Core, Design, Elem, Fifo, Kind, Link, SeqOp};
use crate::device::Device;
use crate::gemv::{
    core_tile, first_checked, output_fifos, stream_fifos, stream_sequence, streams, tiles_used, tiling_of,
    SHIM_BURST_BYTES,
};
use crate::kernels::{self, GEMV, GEMV_ZERO};
use crate::qkernels::{self, Exchange, Input, Shape};
use crate::tiling::{GemmShape, Tiling, TilingError, KERNEL_CALL_OVERHEAD_CYCLES};
use bundle::xdna::{QgemvFeed, QgemvLayout, QgemvWeights};
use std::fmt::Write;

pub mod split;

/// Largest column tile a core computes at once.
const MAX_TILE_COLS: usize = 256;

/// Cycles a core spends on one activation element for its first pass (its maximum and its
/// code, [`crate::qkernels`]), an assumption of the cost model, not a measurement: one vector
/// operation a cycle on [`crate::qkernels::LANES`] elements, of the integer operations
/// `q_absmax` and `q_codes` spend per block (constants hoisted; a test counts them in the
/// generated code).
pub const FIRST_PASS_CYCLES_PER_ELEMENT: u64 = 6;

/// Cycles per activation element of the residual pass (the residual's maximum and its codes,
/// `q_resmax` and `q_residual`), an assumption counted as above.
pub const RESIDUAL_PASS_CYCLES_PER_ELEMENT: u64 = 24;

/// Cycles per output element of the epilogue with one and with two passes, an assumption
/// counted as above from `q_dequant`'s operations per column block and row.
pub const EPILOGUE_CYCLES_PER_ELEMENT: [u64; 2] = [35, 83];

/// Cycles per activation element of a norm-fed core's prologue with one and with two passes:
/// the row's largest magnitude, the exact products' scale markers and codes, the aligned
/// squares (and the residual's codes), an assumption counted as above.
pub const NORM_CYCLES_PER_ELEMENT: [u64; 2] = [23, 44];

/// Cycles per activation element of a sum-fed core's sum ([`crate::qkernels::sum()`]: an f32
/// sum in integer operations, its operands read and the sum written twice), counted as above.
pub const SUM_CYCLES_PER_ELEMENT: u64 = 15;

/// Cycles per output element of a norm-fed core's epilogue (its row scale any f32, so the
/// scales' product is a general one), an assumption counted as above.
pub const NORM_EPILOGUE_CYCLES_PER_ELEMENT: [u64; 2] = [42, 97];

/// Cycles once a row of a norm-fed core with one and with two passes: `r` from the squares'
/// lanes (software f32: the conversions, the folds, a division, a root, a division) and the
/// row scales' products, an assumption counted as above.
pub const NORM_ROW_CYCLES: [u64; 2] = [2514, 2671];

/// Cycles per activation element of a gate-fed core's prologue with one and with two passes:
/// the gate's value (once: the values stay in the core), its scale marker and codes (and the
/// residual's codes), an assumption counted as above.
pub const GATE_CYCLES_PER_ELEMENT: [u64; 2] = [25, 43];

/// [`GATE_CYCLES_PER_ELEMENT`] for a core whose memory does not keep the gate's values: it
/// computes them again each time the rows stream, once a pass and once for the maximum.
pub const GATE_RESTREAMED_CYCLES_PER_ELEMENT: [u64; 2] = [37, 67];

/// Cycles per output element of an epilogue that sums a weight's two passes ([`Shape::pairs`]):
/// `[[one pass, two passes] of plain rows, the same with a norm]`, counted as above.
pub const PAIRS_EPILOGUE_CYCLES_PER_ELEMENT: [[u64; 2]; 2] = [[83, 130], [97, 152]];

/// Cycles of one round of a split design's exchange ([`split`]) besides its bytes' streams: two
/// DMA hops (a prologue core's slot to the mem tile, the joined slots to every core), each a
/// lock handshake and a descriptor's start, an assumption, not a measurement.
pub const EXCHANGE_ROUND_CYCLES: u64 = 400;

/// Cycles a prologue core spends combining one core's slot for one row
/// ([`crate::qkernels::combine`]: four bytes assembled, a maximum), counted as above (scalar).
pub const COMBINE_CYCLES_PER_SLOT: u64 = 21;

/// Cycles per row and round a prologue core spends writing its row state into its slot
/// ([`crate::qkernels::share`]), counted as above (scalar).
pub const SHARE_CYCLES_PER_ROW: u64 = 80;

/// Cycles per [`crate::qkernels::LANES`] codes a GEMV core of a split design takes from the
/// slots into its codes buffers ([`crate::qkernels::unpack`]), counted as above.
pub const UNPACK_CYCLES_PER_BLOCK: u64 = 9;

/// Cycles of one int8 product-and-sum in the GEMV kernel's scalar form (rows that are no whole
/// number of micro-tile rows), an assumption: two loads, two widenings, a product and a sum.
pub const SCALAR_CYCLES_PER_MAC: u64 = 3;

/// What a qgemv design's rows are, and so what its cores compute from them before the
/// quantisation's codes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Feed {
    /// Activation rows: `QuantizeRows(x)`.
    Rows,
    /// A norm's input rows: the cores compute the norm (`InverseRms`, `QuantizeRows(x, γ)`,
    /// [`crate::qkernels::norm_functions`]), ε a constant of their code; with `sum` the input
    /// is the residual stream's rows plus a projection's, which the cores add first and the
    /// design also writes out ([`crate::qkernels::sum()`]; split designs only).
    Norm { epsilon: f32, sum: bool },
    /// A SwiGlu's gate and up rows: the cores compute the gate in integers
    /// (`QuantizeSwiGlu(g, u)`, [`crate::qkernels::gate_functions`]); `kept`: its values stay in
    /// the core and the rows stream once, or (where they do not fit) they are computed again
    /// as the rows stream once a pass.
    Gate { kept: bool },
}

impl Feed {
    pub fn input(self) -> Input {
        match self {
            Feed::Rows => Input::Rows,
            Feed::Norm { sum: false, .. } => Input::Norm,
            Feed::Norm { sum: true, .. } => Input::SumNorm,
            Feed::Gate { .. } => Input::Gate,
        }
    }

    /// What the rows operand carries, as the plan records it.
    pub fn operand(self) -> QgemvFeed {
        match self {
            Feed::Rows => QgemvFeed::Rows,
            Feed::Norm { sum: false, .. } => QgemvFeed::Norm,
            Feed::Norm { sum: true, .. } => QgemvFeed::SumNorm,
            Feed::Gate { .. } => QgemvFeed::Gate,
        }
    }

    /// Whether the rows stream once: a gate's values kept in the core.
    pub fn kept(self) -> bool {
        matches!(self, Feed::Gate { kept: true })
    }
}

/// A qgemv tiling, its activation passes, the GEMV kernel's rows ([`Shape::kernel_rows`]), what
/// its rows are, and whether each output sums a weight's two passes ([`Shape::pairs`]).
#[derive(Clone, Debug, PartialEq)]
pub struct QTiling {
    pub tiling: Tiling,
    pub passes: usize,
    pub kernel_rows: usize,
    pub feed: Feed,
    pub pairs: bool,
    /// The cost model's cycles of a core's prologue (its row's quantisation, and a norm's or a
    /// gate's work), part of `tiling.compute_cycles`: every core runs it over the whole row,
    /// or with `split` prologue cores each its slice (and the exchange).
    pub prologue_cycles: u64,
    /// Prologue cores the quantisation is split across ([`split`]); 0: none.
    pub split: usize,
    /// Elements of each weight stream its column's mem tile buffers on the way to the core, so
    /// the stream runs on while the prologue does (`stage_weights`); 0: straight to the core.
    pub staged: usize,
    /// Both passes' codes in one buffer and one GEMV call ([`Shape::stacked`]; split designs).
    pub stacked: bool,
    /// Where the outputs start in the output argument, in elements (0: at its start): an array
    /// program's phase writing into a later phase's rows operand ([`QTiling::writing_at`]).
    pub out_at: usize,
}

impl QTiling {
    /// This tiling with its outputs written from element `at` of a longer output argument: the
    /// same design but for its output transfers' offset and the argument's length.
    pub fn writing_at(&self, at: usize) -> QTiling {
        QTiling { out_at: at, ..self.clone() }
    }

    fn shape(&self) -> Shape {
        let t = &self.tiling;
        let (passes, kernel_rows, input, pairs) = (self.passes, self.kernel_rows, self.feed.input(), self.pairs);
        Shape { rows: t.m, k: t.k, n: t.n, passes, kernel_rows, input, pairs, stacked: self.stacked }
    }

    /// The design's operands as the plan records them (`bundle::xdna::QgemvLayout`).
    pub fn layout(&self) -> QgemvLayout {
        let t = &self.tiling;
        let sh = self.shape();
        let (parts, tiles) = self.parts_and_tiles();
        QgemvLayout {
            feed: self.feed.operand(),
            rows: t.padded.m,
            padded_k: t.padded.k,
            padded_n: t.padded.n,
            part_k: t.k,
            parts,
            tile_cols: t.n,
            tiles,
            streams: streams(t.device),
            passes: self.passes,
            pairs: self.pairs,
            w_rows: sh.w_rows(),
            scales_per_row: qkernels::scales_per_row(t.k),
        }
    }

    /// K parts and output tiles per core.
    pub fn parts_and_tiles(&self) -> (usize, usize) {
        let t = &self.tiling;
        (t.padded.k / t.k, t.padded.n / (streams(t.device) * t.n))
    }
}

/// K parts and the length of one, at least `min_parts`: each part's `x_rows × k` f32 element
/// fits one memory bank, and `k` one shim descriptor dimension, a multiple of the micro-tile's
/// `s` (of 32 with a norm, whose squares take 32-value blocks). More parts than the fewest
/// shorten the weight elements, which must fit a bank with their epilogue data.
fn k_parts(device: Device, (x_rows, input): (usize, Input), k: usize, min_parts: usize) -> (usize, usize) {
    let s = if input.norm() { qkernels::NORM_LANES } else { device.micro_tile().1 };
    let bank = device.core_data_bytes() / device.core_banks();
    let max_part = (device.shim_dma().max_size.min(bank / (4 * x_rows)) / s) * s;
    let parts = k.div_ceil(max_part).max(min_parts);
    (parts, k.div_ceil(parts).div_ceil(s) * s)
}

/// Extra K parts [`choose`] tries beyond the fewest: shorter parts shrink the rows' element,
/// the weights' elements and a gate's values' buffer, which must fit beside the codes of the
/// whole row (and shorter weight elements overlap their stream better).
const EXTRA_PARTS: usize = 10;

/// Bytes of a core's data memory: one `X` element (the prologue's passes are short beside the
/// weights' stream, so it is not double-buffered), two weight elements, two output tiles, the
/// row state, the codes, the accumulators, a gate's values and the stack.
fn core_bytes(device: Device, (sh, kept): (Shape, bool), parts: usize, split: Option<Exchange>) -> usize {
    let (rows, k, n) = (sh.rows, sh.k, sh.n);
    let (state, mut squares) = if sh.input.norm() { (6, qkernels::NORM_LANES) } else { (4, 0) };
    let mut gate_values = if sh.input == Input::Gate { gate_buffers(parts, kept) * 2 * rows * k * 4 } else { 0 };
    let x = split.map_or(sh.x_rows() * k * 4, |ex| ex.cores * ex.slot());
    if split.is_some() {
        // The prologue cores keep a norm's lanes and a gate's values.
        (squares, gate_values) = (0, 0);
    }
    gate_values
        + x
        + 2 * sh.w_rows() * k
        + 2 * rows * n * 4
        + (state + squares) * rows * 4
        + sh.buffered_passes() * parts * sh.kernel_rows * k
        + sh.buffered_passes() * sh.kernel_rows * sh.w_cols() * 4
        + device.core_stack_bytes()
}

/// The cost and memory of one candidate (tile width, fewest K parts, kernel rows, prologue
/// cores), if it fits.
fn evaluate(
    device: Device,
    shape: GemmShape,
    (passes, feed, pairs): (usize, Feed, bool),
    (n, min_parts, kr, (split, stage, stacked)): (usize, usize, usize, (usize, bool, bool)),
) -> Option<QTiling> {
    let input = feed.input();
    if input == Input::SumNorm && split == 0 {
        // A sum's prologue cores write it through their spare output channel.
        return None;
    }
    let x_rows = Shape { rows: shape.m, k: 0, n, passes, kernel_rows: kr, input, pairs, stacked }.x_rows();
    let (rows, (parts, k)) = (shape.m, k_parts(device, (x_rows, input), shape.k, min_parts));
    let sh = Shape { rows, k, n, passes, kernel_rows: kr, input, pairs, stacked };
    if stacked && (split == 0 || passes < 2 || kr < passes * rows) {
        return None;
    }
    if k < qkernels::MIN_K {
        return None;
    }
    let ex = (split > 0).then(|| Exchange::of(sh, (parts * k, split)));
    let block = if input.norm() { qkernels::NORM_LANES } else { qkernels::LANES };
    if ex.is_some_and(|ex| !(parts * k).is_multiple_of(split * block) || !split::fits(device, ex)) {
        return None;
    }
    let tiles = shape.n.div_ceil(streams(device) * n);
    let bank = device.core_data_bytes() / device.core_banks();
    let l1 = core_bytes(device, (sh, feed.kept()), parts, ex);
    if sh.w_rows() * k > bank || l1 > device.core_data_bytes() || tiles > device.shim_dma().max_repeat {
        return None;
    }
    let bpc = device.stream_bytes_per_cycle() as u64;
    let burst = k.div_ceil(SHIM_BURST_BYTES) * SHIM_BURST_BYTES;
    let weight_bytes = (tiles * parts * sh.w_rows() * burst) as u64;
    let x_streams = if ex.is_some() { 1 } else { x_streams(passes, feed) };
    // A sum's bytes back (through the columns' spare channels, counted as if they shared one).
    let sum_rows = if input == Input::SumNorm { rows } else { 0 };
    let x_bytes = ((x_streams * x_rows + sum_rows) * parts * k * 4) as u64;
    let prologue = match ex {
        Some(ex) => split::prologue_cycles(device, (ex, feed)),
        None => prologue_cycles((sh, feed), parts),
    };
    let macs = (kr * sh.w_cols() * k) as u64;
    let vector = kr.is_multiple_of(device.micro_tile().0);
    let per_call = if vector { macs / device.macs_per_cycle() as u64 } else { macs * SCALAR_CYCLES_PER_MAC }
        + KERNEL_CALL_OVERHEAD_CYCLES;
    let epilogue = match (input.norm(), pairs) {
        (false, false) => EPILOGUE_CYCLES_PER_ELEMENT,
        (true, false) => NORM_EPILOGUE_CYCLES_PER_ELEMENT,
        (norm, true) => PAIRS_EPILOGUE_CYCLES_PER_ELEMENT[usize::from(norm)],
    };
    let per_tile = (sh.buffered_passes() * parts) as u64 * per_call + (rows * n) as u64 * epilogue[passes - 1];
    let compute_cycles = prologue + tiles as u64 * per_tile;
    let (staged, stall) = staging(device, prologue, sh.w_rows() * k, stage);
    let dma_cycles = (weight_bytes + x_bytes).div_ceil(bpc) + stall;
    let first_in = ((x_rows * k * 4 + sh.w_rows() * k) as u64).div_ceil(bpc);
    let tiling = tiling_of(device, shape, (parts, k, n, tiles), l1, (compute_cycles, dma_cycles, first_in));
    let prologue_cycles = prologue;
    Some(QTiling { tiling, passes, kernel_rows: kr, feed, pairs, prologue_cycles, split, staged, stacked, out_at: 0 })
}

/// Most elements a weight stream's mem-tile buffer takes: both of a column's streams' buffers
/// and their links' descriptors within the mem tile's 48.
pub const MAX_STAGED: usize = 10;

/// The mem-tile buffer of a weight stream of `elem` bytes an element (with `stage`, enough
/// elements to run on through `prologue` cycles, at most [`MAX_STAGED`]; else none), and the
/// cycles the stream still stops for: a core's weight FIFO holds two elements, and its stream
/// stops once they and the mem tile's are full, until the prologue ends.
fn staging(device: Device, prologue: u64, elem: usize, stage: bool) -> (usize, u64) {
    let bpc = device.stream_bytes_per_cycle() as u64;
    let needed = (prologue * bpc).div_ceil(elem as u64).saturating_sub(2) as usize;
    let depth = if stage { needed.clamp(1, MAX_STAGED) } else { 0 };
    let buffered = ((2 + depth) * elem) as u64 / bpc;
    (depth, prologue.saturating_sub(buffered))
}

/// Puts each weight stream `W_<s>` through its column's mem tile: the shim fills `W_L3_<s>`
/// (`q.staged` elements deep) and a link moves its elements on to the core; the runtime
/// sequence's weight transfers go to `W_L3_<s>`.
fn stage_weights(q: &QTiling, d: &mut Design) {
    let depth = q.staged;
    let mut staged = vec![];
    for f in d.fifos.iter_mut().filter(|f| f.name.starts_with("W_") && f.producer.1 == Device::SHIM_ROW) {
        let first = Fifo {
            name: format!("W_L3_{}", &f.name[2..]),
            consumers: vec![(f.producer.0, Device::MEM_TILE_ROW)],
            depth,
            ..f.clone()
        };
        f.producer = (f.producer.0, Device::MEM_TILE_ROW);
        d.links.push(Link {
            inputs: vec![first.name.clone()],
            outputs: vec![f.name.clone()],
            src_offsets: vec![],
            dst_offsets: vec![],
        });
        staged.push((f.name.clone(), first));
    }
    for op in &mut d.seq {
        let (SeqOp::Dma { fifo, .. } | SeqOp::Wait { fifo }) = op;
        if let Some((_, first)) = staged.iter().find(|(name, _)| name == fifo) {
            *fifo = first.name.clone();
        }
    }
    d.fifos.extend(staged.into_iter().map(|(_, f)| f));
}

/// The cycles of a core's prologue over the whole row: `parts` K parts of `sh.k`.
fn prologue_cycles((sh, feed): (Shape, Feed), parts: usize) -> u64 {
    let per_element = match feed {
        Feed::Rows => FIRST_PASS_CYCLES_PER_ELEMENT + (sh.passes as u64 - 1) * RESIDUAL_PASS_CYCLES_PER_ELEMENT,
        Feed::Norm { sum: false, .. } => NORM_CYCLES_PER_ELEMENT[sh.passes - 1],
        Feed::Norm { sum: true, .. } => NORM_CYCLES_PER_ELEMENT[sh.passes - 1] + SUM_CYCLES_PER_ELEMENT,
        Feed::Gate { kept: true } => GATE_CYCLES_PER_ELEMENT[sh.passes - 1],
        Feed::Gate { kept: false } => GATE_RESTREAMED_CYCLES_PER_ELEMENT[sh.passes - 1],
    };
    let once = if sh.input.norm() { NORM_ROW_CYCLES[sh.passes - 1] } else { 0 };
    (parts * sh.rows * sh.k) as u64 * per_element + sh.rows as u64 * once
}

/// How many times the rows stream to the cores: once a pass and once for the first maximum,
/// or once for a gate whose values stay in the cores.
fn x_streams(passes: usize, feed: Feed) -> usize {
    if feed.kept() {
        1
    } else {
        passes + 1
    }
}

/// A gate-fed core's buffers of the gate's values: one a K part when kept, else one it reuses.
fn gate_buffers(parts: usize, kept: bool) -> usize {
    if kept {
        parts
    } else {
        1
    }
}

/// The fastest qgemv tiling of `shape` with `passes` (1 or 2) whose design passes every check:
/// among tile widths that fit, the fewest predicted cycles, then the least padding.
pub fn choose(device: Device, shape: GemmShape, passes: usize) -> Result<QTiling, TilingError> {
    choose_with(device, shape, (passes, Feed::Rows, false))
}

/// [`choose`] for a projection whose weight has two passes side by side, summed in the epilogue
/// ([`Shape::pairs`]): `shape.n` outputs from `2·shape.n` weight columns, the rows as `feed`
/// says (a gate's values kept or not, whichever is faster).
pub fn choose_pairs(device: Device, shape: GemmShape, passes: usize, feed: Feed) -> Result<QTiling, TilingError> {
    match feed {
        Feed::Gate { .. } => choose_gate_with(device, shape, (passes, true)),
        Feed::Norm { .. } => choose_norm_with(device, shape, (passes, feed, true)),
        Feed::Rows => choose_with(device, shape, (passes, feed, true)),
    }
}

/// [`choose`] for a gate-fed design: the rows are a SwiGlu's gate and up rows, `K` values each;
/// the gate's values kept in the cores or computed again a pass, whichever is faster.
pub fn choose_gate(device: Device, shape: GemmShape, passes: usize) -> Result<QTiling, TilingError> {
    choose_gate_with(device, shape, (passes, false))
}

/// [`choose_gate`] unsplit ([`split`]), the gate's values kept in the cores or not.
pub fn choose_gate_with_values(
    device: Device,
    shape: GemmShape,
    passes: usize,
    kept: bool,
) -> Result<QTiling, TilingError> {
    choose_among(device, shape, (passes, Feed::Gate { kept }, false), Some(0))
}

fn choose_gate_with(device: Device, shape: GemmShape, (passes, pairs): (usize, bool)) -> Result<QTiling, TilingError> {
    let kept = choose_with(device, shape, (passes, Feed::Gate { kept: true }, pairs));
    let again = choose_with(device, shape, (passes, Feed::Gate { kept: false }, pairs));
    match (kept, again) {
        (Ok(k), Ok(a)) => Ok(if a.tiling.total_cycles < k.tiling.total_cycles { a } else { k }),
        (Ok(k), Err(_)) => Ok(k),
        (Err(_), again) => again,
    }
}

/// [`choose`] for a norm-fed design: the rows are a norm's input (`K` values, at most the
/// aligned sum's [`ir::pinned_norm::ALIGNED_MAX_D`]), with ε `epsilon`.
pub fn choose_norm(device: Device, shape: GemmShape, passes: usize, epsilon: f32) -> Result<QTiling, TilingError> {
    choose_norm_with(device, shape, (passes, Feed::Norm { epsilon, sum: false }, false))
}

/// [`choose_norm`] for a sum-fed design: the rows are the residual stream's and a projection's,
/// which the cores add before the norm and write back ([`Feed::Norm`] with `sum`).
pub fn choose_sum(device: Device, shape: GemmShape, passes: usize, epsilon: f32) -> Result<QTiling, TilingError> {
    choose_norm_with(device, shape, (passes, Feed::Norm { epsilon, sum: true }, false))
}

/// A norm-fed design for `feed` (a [`Feed::Norm`], its rows a sum or not).
fn choose_norm_with(device: Device, shape: GemmShape, how: (usize, Feed, bool)) -> Result<QTiling, TilingError> {
    norm_k(device, shape)?;
    choose_with(device, shape, how)
}

/// A norm-fed design's K: at most what the aligned sum of squares takes.
fn norm_k(device: Device, shape: GemmShape) -> Result<(), TilingError> {
    if shape.k > ir::pinned_norm::ALIGNED_MAX_D {
        let reason = format!(
            "a norm-fed core sums a row's squares in integer lanes: K must be at most {}",
            ir::pinned_norm::ALIGNED_MAX_D
        );
        return Err(TilingError::NothingFits { shape, device, reason });
    }
    Ok(())
}

fn choose_with(device: Device, shape: GemmShape, how: (usize, Feed, bool)) -> Result<QTiling, TilingError> {
    choose_among(device, shape, how, None)
}

/// [`choose`] for rows that are `feed` (a gate's values kept) with the quantisation split
/// across `cores` prologue cores ([`split`]), 2 to [`split::MAX_CORES`], the passes' codes
/// `stacked` or not ([`Shape::stacked`], two passes): the fastest such tiling, whether or not
/// another is faster.
pub fn choose_split(
    device: Device,
    shape: GemmShape,
    (passes, feed): (usize, Feed),
    (cores, stacked): (usize, bool),
) -> Result<QTiling, TilingError> {
    if !(2..=split::MAX_CORES).contains(&cores) || feed == (Feed::Gate { kept: false }) {
        let reason = format!("a split prologue takes 2 to {} cores and keeps a gate's values", split::MAX_CORES);
        return Err(TilingError::NothingFits { shape, device, reason });
    }
    takes(device, shape)?;
    if let Feed::Norm { .. } = feed {
        norm_k(device, shape)?;
    }
    let fits = candidates(device, shape, (passes, feed, false), Some(cores));
    let fits = fits.into_iter().filter(|q| q.stacked == stacked).collect();
    first_checked(fits, build, (shape, device))
}

/// The fastest tiling that passes every check, with `only_split` prologue cores if given (0:
/// unsplit).
fn choose_among(
    device: Device,
    shape: GemmShape,
    how: (usize, Feed, bool),
    only_split: Option<usize>,
) -> Result<QTiling, TilingError> {
    takes(device, shape)?;
    first_checked(candidates(device, shape, how, only_split), build, (shape, device))
}

/// Every tiling that fits, the fewest predicted cycles first (then the least padding), with
/// `only_split` prologue cores if given.
fn candidates(
    device: Device,
    shape: GemmShape,
    (passes, feed, pairs): (usize, Feed, bool),
    only_split: Option<usize>,
) -> Vec<QTiling> {
    let (r, _, t) = device.micro_tile();
    let x_rows =
        Shape { rows: shape.m, k: 0, n: 0, passes, kernel_rows: 0, input: feed.input(), pairs, stacked: false }
            .x_rows();
    let fewest = k_parts(device, (x_rows, feed.input()), shape.k, 1).0;
    let stacked_rows = passes * shape.m;
    // Kernel rows with the passes apart and (split designs only) stacked.
    let kernel_rows = [
        (shape.m.next_multiple_of(r), false),
        (shape.m, false),
        (stacked_rows.next_multiple_of(r), true),
        (stacked_rows, true),
    ];
    let splits: Vec<usize> = match (feed, only_split) {
        (Feed::Gate { kept: false }, _) | (_, Some(0)) => vec![0],
        (_, Some(cores)) => vec![cores],
        (_, None) => [0].into_iter().chain(2..=split::MAX_CORES).collect(),
    };
    let candidates = (t..=MAX_TILE_COLS).step_by(t).flat_map(|n| {
        let splits = splits.clone();
        (fewest..=fewest + EXTRA_PARTS)
            .flat_map(move |p| kernel_rows.map(move |kr| (n, p, kr)))
            .flat_map(move |(n, p, kr)| splits.clone().into_iter().map(move |s| (n, p, kr, s)))
            .flat_map(|(n, p, (kr, stacked), s)| [false, true].map(|staged| (n, p, kr, (s, staged, stacked))))
    });
    let mut fits: Vec<QTiling> = candidates.filter_map(|c| evaluate(device, shape, (passes, feed, pairs), c)).collect();
    fits.dedup_by(|a, b| {
        let key = |q: &QTiling| (q.tiling.k, q.tiling.n, q.kernel_rows, q.split, q.staged, q.stacked);
        key(a) == key(b)
    });
    fits.sort_by(|a, b| {
        let (a, b) = (&a.tiling, &b.tiling);
        a.total_cycles.cmp(&b.total_cycles).then(a.padded.n.cmp(&b.padded.n))
    });
    fits
}

/// A shape a qgemv design can take: not empty, K at least [`qkernels::MIN_K`].
fn takes(device: Device, shape: GemmShape) -> Result<(), TilingError> {
    if shape.m == 0 || shape.k == 0 || shape.n == 0 {
        return Err(TilingError::Empty { shape });
    }
    if shape.k < qkernels::MIN_K {
        let reason = format!(
            "a qgemv core reads {} columns' scales at once from one row of its weight element: K must be at least {}",
            qkernels::LANES,
            qkernels::MIN_K
        );
        return Err(TilingError::NothingFits { shape, device, reason });
    }
    Ok(())
}

/// The design file's stem: `qgemv<passes>_<rows>x<K>x<N>_<device>`, for a norm-fed design
/// `nqgemv…_eps<ε>` (`snqgemv…` when it adds a sum first; ε is a constant of its code; `1e-5` written `1em5`, as the name is also
/// the device's symbol, an MLIR bare identifier, which takes no `-`), for a gate-fed one
/// `gqgemv…`, ending `_kept` when its cores keep the gate's values; then `_split<P>` when `P`
/// prologue cores quantise the rows ([`split`]), `_stacked` when both passes' codes share a
/// buffer and a GEMV call ([`Shape::stacked`]), `_staged<D>` when each weight stream runs
/// through a `D`-element mem-tile buffer, `_pairs` when each output sums a weight's two
/// passes, and `_at<E>` when the outputs start at element `E` of their argument.
pub fn design_name(q: &QTiling) -> String {
    let pairs = if q.pairs { "_pairs" } else { "" };
    let split = if q.split > 0 { format!("_split{}", q.split) } else { String::new() };
    let staged = if q.staged > 0 { format!("_staged{}", q.staged) } else { String::new() };
    let stacked = if q.stacked { "_stacked" } else { "" };
    let at = if q.out_at > 0 { format!("_at{}", q.out_at) } else { String::new() };
    format!("{}{split}{stacked}{staged}{pairs}{at}", feed_name(q))
}

fn feed_name(q: &QTiling) -> String {
    let t = &q.tiling;
    match q.feed {
        Feed::Rows => format!("qgemv{}_{}_{}", q.passes, t.shape, t.device),
        Feed::Norm { epsilon, sum } => {
            let eps = format!("{epsilon:e}").replace('-', "m");
            let sum = if sum { "s" } else { "" };
            format!("{sum}nqgemv{}_{}_{}_eps{eps}", q.passes, t.shape, t.device)
        }
        Feed::Gate { kept } => {
            let kept = if kept { "_kept" } else { "" };
            format!("gqgemv{}_{}_{}{kept}", q.passes, t.shape, t.device)
        }
    }
}

/// The core functions of a tiling besides the GEMV kernels.
fn core_functions(q: &QTiling) -> Vec<kernels::Function> {
    let sh = q.shape();
    match q.feed {
        Feed::Rows => qkernels::functions(sh),
        Feed::Norm { epsilon, .. } => qkernels::norm_functions(sh, q.tiling.shape.k, epsilon)
            .expect("choose_norm takes only K parts of 32-value blocks and rows the aligned sum takes"),
        Feed::Gate { .. } => {
            let mut f = qkernels::gate_functions(sh);
            f.push(qkernels::dequant(sh));
            f
        }
    }
}

/// The rows operand of a qgemv call, `[padded rows (+1), padded K]` f32: `x`'s rows of `k`
/// values, zero past them, and for a norm-fed design γ as the last row
/// ([`QgemvLayout::rows_operand`]).
pub fn rows_operand(q: &QTiling, (x, k): (&[f32], usize), gamma: Option<&[f32]>) -> Vec<f32> {
    q.layout().rows_operand((x, k), gamma, None).expect("rows the design takes")
}

/// The rows operand of a gate-fed qgemv call, `[2, padded rows, padded K]` f32: the gate's rows
/// `g` of `k` values, then the up's `u`, zero past them.
pub fn gate_operand(q: &QTiling, (g, u): (&[f32], &[f32]), k: usize) -> Vec<f32> {
    q.layout().rows_operand((g, k), None, Some(u)).expect("rows the design takes")
}

/// The design of a qgemv tiling.
pub fn build(q: &QTiling) -> Design {
    let mut d = if q.split > 0 { split::build(q) } else { build_unsplit(q) };
    if q.staged > 0 {
        stage_weights(q, &mut d);
    }
    if q.out_at > 0 {
        write_at(q.out_at, &mut d);
    }
    d
}

/// Moves a design's output transfers (argument 2) `at` elements into a longer argument.
fn write_at(at: usize, d: &mut Design) {
    d.args[2].0 += at;
    for op in &mut d.seq {
        if let SeqOp::Dma { arg: 2, offset, .. } = op {
            *offset += at;
        }
    }
}

fn build_unsplit(q: &QTiling) -> Design {
    let t = &q.tiling;
    let (parts, tiles) = q.parts_and_tiles();
    let dev = t.device;
    let sh = q.shape();
    let mut fifos = vec![];
    let mut links = vec![];
    input_fifos(q, &mut fifos);
    output_fifos(t, Elem::F32, &mut fifos, &mut links);
    let mut calls: Vec<String> = core_functions(q).into_iter().map(|f| f.name).collect();
    calls.extend([GEMV_ZERO.into(), GEMV.into()]);
    let cores: Vec<Core> = (0..streams(dev))
        .map(|s| Core {
            tile: core_tile(dev, s),
            a: "X".into(),
            b: format!("W_{s}"),
            c: format!("C_L1L2_{s}"),
            tiles,
            k_steps: parts,
            calls: calls.clone(),
            prologue: false,
        })
        .collect();
    let mut functions = core_functions(q);
    let rkn = (q.kernel_rows, t.k, sh.w_cols());
    functions.extend([kernels::gemv_zero_i32(rkn), kernels::gemv_i8_i32_rows(dev, rkn, sh.w_rows())]);
    let p = t.padded;
    let w_len = streams(dev) * tiles * parts * sh.w_rows() * t.k;
    Design {
        kind: Kind::QGemv {
            passes: q.passes,
            kernel_rows: q.kernel_rows,
            input: sh.input,
            kept: q.feed.kept(),
            pairs: q.pairs,
            split: 0,
            stacked: false,
        },
        name: design_name(q),
        tiling: t.clone(),
        tiles: tiles_used(dev),
        fifos,
        links,
        buffers: cores.iter().flat_map(|c| buffers((sh, q.feed.kept()), parts, c.tile)).collect(),
        functions,
        cores,
        args: vec![(sh.x_rows() * p.k, Elem::F32), (w_len, Elem::I8), (p.m * p.n, Elem::F32)],
        seq: runtime_sequence(q),
    }
}

/// A core's own buffers: the row state, the codes of every pass and K part, an accumulator per
/// pass, with a norm the squares' lanes, and with a gate its values (of every K part, when kept).
fn buffers((sh, kept): (Shape, bool), parts: usize, tile: (usize, usize)) -> Vec<Buffer> {
    let (c, r) = tile;
    let mut b = gemv_buffers(sh, parts, tile);
    match sh.input {
        Input::Norm | Input::SumNorm => {
            let shape = vec![sh.rows, qkernels::NORM_LANES];
            b.push(Buffer { tile, name: format!("ss_{c}_{r}"), shape, elem: Elem::I32 });
        }
        Input::Gate => b.extend((0..gate_buffers(parts, kept)).map(|q| {
            let shape = vec![2, sh.rows, sh.k];
            Buffer { tile, name: format!("gv_{c}_{r}_{q}"), shape, elem: Elem::I32 }
        })),
        Input::Rows => {}
    }
    b
}

/// The buffers a core's GEMV and epilogue use: the row state, the codes of every pass (one
/// buffer a K part when stacked) and K part, an accumulator per pass.
fn gemv_buffers(sh: Shape, parts: usize, tile: (usize, usize)) -> Vec<Buffer> {
    let (c, r) = tile;
    let state = if sh.input.norm() { 6 } else { 4 };
    let mut b = vec![Buffer { tile, name: format!("rs_{c}_{r}"), shape: vec![state, sh.rows], elem: Elem::F32 }];
    for p in 0..sh.buffered_passes() {
        for q in 0..parts {
            let shape = vec![sh.kernel_rows, sh.k];
            b.push(Buffer { tile, name: format!("codes_{c}_{r}_{p}_{q}"), shape, elem: Elem::I8 });
        }
        b.push(Buffer {
            tile,
            name: format!("acc_{c}_{r}_{p}"),
            shape: vec![sh.kernel_rows, sh.w_cols()],
            elem: Elem::I32,
        });
    }
    b
}

/// `X`, broadcast from column 0's shim to every core (one element at a time: the prologue reads
/// it once per pass), and each core's weight stream with its tiles' epilogue data. A gate's
/// element is its `[2, rows, k]` planes of words.
fn input_fifos(q: &QTiling, fifos: &mut Vec<Fifo>) {
    let (t, sh) = (&q.tiling, q.shape());
    let w_shape = vec![sh.w_rows(), t.k];
    let (x_shape, elem) = match sh.input {
        Input::Gate => (vec![2, sh.rows, t.k], Elem::I32),
        _ => (vec![sh.x_rows(), t.k], Elem::F32),
    };
    fifos.extend(stream_fifos(t.device, ("X", 1, elem), x_shape, w_shape));
}

/// The runtime sequence: `X` `passes + 1` times (a gate's once), each core one contiguous run
/// of the packed operand ([`pack`]), see [`crate::gemv::stream_sequence`].
fn runtime_sequence(q: &QTiling) -> Vec<SeqOp> {
    let t = &q.tiling;
    let (parts, tiles) = q.parts_and_tiles();
    let (p, x_rows, k, w_rows) = (t.padded, q.shape().x_rows(), t.k, q.shape().w_rows());
    let per_core = tiles * parts * w_rows * k;
    let x = (0, 0, [x_streams(q.passes, q.feed), parts, x_rows, k], [0, k, p.k, 1]);
    let w = |s: usize| (1, s * per_core, [tiles, parts, w_rows, k], [parts * w_rows * k, w_rows * k, k, 1]);
    stream_sequence(t, tiles, ("X", x), &w)
}

/// The weight operand of a qgemv call: for each core, tile and K part, the element the core's
/// stream carries — its weight columns' `k` codes a row (output column `j`'s K part, the weight
/// read as `w[kk][col]` from `[K, N]` row-major codes, zero past K and past the chunk), then the
/// tile's epilogue data: its columns' scales and first-pass-only flags. `cols` columns from
/// `col_offset` of the weight make the call's outputs; with pairs ([`Shape::pairs`]) output `c`
/// also takes the weight's column `c + N/2` (its residual pass), and the flags are implied.
pub fn pack(
    q: &QTiling,
    (w, k_total, n_total): (&[i8], usize, usize),
    (col_offset, cols): (usize, usize),
    scales: &[f32],
    first_only: &dyn Fn(usize) -> bool,
) -> Vec<i8> {
    let weights = QgemvWeights { codes: w, k: k_total, n: n_total, scales, first_only };
    q.layout().pack(&weights, (col_offset, cols))
}

/// One statement of a qgemv core's body, printed in both forms from this one structure.
enum CoreOp {
    /// `%res = acquire @fifo` of one element (`produce`: port 0) and its buffer as `%res_buf`.
    Acquire {
        res: String,
        fifo: String,
        produce: bool,
        ty: String,
    },
    Release {
        fifo: String,
        produce: bool,
    },
    Call {
        callee: String,
        args: Vec<(String, String)>,
    },
    /// `for %tile in 0..%ctiles { body }`.
    Tiles {
        body: Vec<CoreOp>,
    },
    /// Ops in order.
    Seq(Vec<CoreOp>),
}

/// A core's buffers and operands as its calls name them; `kept`: a gate's values of every K
/// part in buffers of their own.
struct Operands {
    sh: Shape,
    tile: (usize, usize),
    kept: bool,
}

type Operand = (String, String);

impl Operands {
    fn rs(&self) -> Operand {
        (format!("%rs_{}_{}", self.tile.0, self.tile.1), self.sh.rs_ty())
    }
    fn squares(&self) -> Operand {
        (format!("%ss_{}_{}", self.tile.0, self.tile.1), qkernels::squares_ty(self.sh))
    }
    fn codes(&self, p: usize, q: usize) -> Operand {
        (format!("%codes_{}_{}_{p}_{q}", self.tile.0, self.tile.1), self.sh.codes_ty())
    }
    fn acc(&self, p: usize) -> Operand {
        (format!("%acc_{}_{}_{p}", self.tile.0, self.tile.1), self.sh.acc_ty())
    }
    fn gate_values(&self, q: usize) -> Operand {
        let q = if self.kept { q } else { 0 };
        (format!("%gv_{}_{}_{q}", self.tile.0, self.tile.1), qkernels::gu_ty(self.sh))
    }
}

fn call(callee: &str, args: Vec<Operand>) -> CoreOp {
    CoreOp::Call { callee: callee.into(), args }
}

/// One pass over the rows: every K part of `X` acquired once (`%x<pass>_<part>`), `f` the
/// calls on it.
fn stream_pass(
    ops: &mut Vec<CoreOp>,
    core: &Core,
    (sh, pass): (Shape, usize),
    f: &dyn Fn(usize, Operand) -> Vec<CoreOp>,
) {
    for q in 0..core.k_steps {
        let res = format!("%x{pass}_{q}");
        ops.push(CoreOp::Acquire { res: res.clone(), fifo: core.a.clone(), produce: false, ty: sh.x_ty() });
        ops.push(CoreOp::Seq(f(q, (format!("{res}_buf"), sh.x_ty()))));
        ops.push(CoreOp::Release { fifo: core.a.clone(), produce: false });
    }
}

/// `QuantizeRows(x)`'s calls: the maximum, the codes (and the residual's maximum), the
/// residual's codes.
fn prologue(core: &Core, o: &Operands) -> Vec<CoreOp> {
    let (sh, rs) = (o.sh, o.rs());
    let mut ops = vec![call(qkernels::RESET, vec![rs.clone()])];
    stream_pass(&mut ops, core, (sh, 0), &|_, x| vec![call(qkernels::ABSMAX, vec![x, rs.clone()])]);
    ops.push(call(qkernels::SCALE[0], vec![rs.clone()]));
    stream_pass(&mut ops, core, (sh, 1), &|q, x| {
        let mut calls = vec![call(qkernels::CODES, vec![x.clone(), rs.clone(), o.codes(0, q)])];
        if sh.passes > 1 {
            calls.push(call(qkernels::RESIDUAL_MAX, vec![x, rs.clone(), o.codes(0, q)]));
        }
        calls
    });
    if sh.passes > 1 {
        ops.push(call(qkernels::SCALE[1], vec![rs.clone()]));
        stream_pass(&mut ops, core, (sh, 2), &|q, x| {
            vec![call(qkernels::RESIDUAL, vec![x, rs.clone(), o.codes(0, q), o.codes(1, q)])]
        });
    }
    ops
}

/// A norm-fed core's calls: the row's largest magnitude and scale markers, the codes (and the
/// residual's markers) with the squares, the root, the residual's codes, then `S = S₀·r`.
fn norm_prologue(core: &Core, o: &Operands) -> Vec<CoreOp> {
    let (sh, rs, ss) = (o.sh, o.rs(), o.squares());
    let mut ops = vec![call(qkernels::NORM_RESET, vec![rs.clone(), ss.clone()])];
    stream_pass(&mut ops, core, (sh, 0), &|_, x| {
        vec![call(qkernels::NORM_TOP, vec![x.clone(), rs.clone()]), call(qkernels::PRODUCT_MAX, vec![x, rs.clone()])]
    });
    ops.push(call(qkernels::PRODUCT_SCALE[0], vec![rs.clone()]));
    stream_pass(&mut ops, core, (sh, 1), &|q, x| {
        let codes = call(qkernels::PRODUCT_CODES, vec![x.clone(), rs.clone(), o.codes(0, q)]);
        vec![codes, call(qkernels::NORM_SQUARES, vec![x, rs.clone(), ss.clone()])]
    });
    ops.push(call(qkernels::NORM_ROOT, vec![rs.clone(), ss.clone()]));
    if sh.passes > 1 {
        ops.push(call(qkernels::PRODUCT_SCALE[1], vec![rs.clone()]));
        stream_pass(&mut ops, core, (sh, 2), &|q, x| {
            vec![call(qkernels::PRODUCT_RESIDUAL, vec![x, rs.clone(), o.codes(1, q)])]
        });
    }
    ops.push(call(qkernels::NORM_RESCALE, vec![rs]));
    ops
}

/// A gate-fed core's calls: each K part's gate values computed into the core's own buffer as
/// the rows arrive (once), with the scale markers; then the codes (and the residual's markers)
/// and the residual's codes from those buffers. Without room to keep them, see
/// [`restreamed_gate_prologue`].
fn gate_prologue(core: &Core, o: &Operands) -> Vec<CoreOp> {
    if !o.kept {
        return restreamed_gate_prologue(core, o);
    }
    let (sh, rs) = (o.sh, o.rs());
    let mut ops = vec![call(qkernels::RESET, vec![rs.clone()])];
    stream_pass(&mut ops, core, (sh, 0), &|q, x| {
        let values = call(qkernels::GATE_VALUES, vec![x, o.gate_values(q)]);
        vec![values, call(qkernels::GATE_MAX, vec![o.gate_values(q), rs.clone()])]
    });
    ops.push(call(qkernels::PRODUCT_SCALE[0], vec![rs.clone()]));
    for q in 0..core.k_steps {
        ops.push(call(qkernels::GATE_CODES, vec![o.gate_values(q), rs.clone(), o.codes(0, q)]));
    }
    if sh.passes > 1 {
        ops.push(call(qkernels::PRODUCT_SCALE[1], vec![rs.clone()]));
        for q in 0..core.k_steps {
            ops.push(call(qkernels::GATE_RESIDUAL, vec![o.gate_values(q), rs.clone(), o.codes(1, q)]));
        }
    }
    ops
}

/// A gate-fed core's calls when it keeps no values: each time the rows stream (for the
/// markers, the codes, the residual's codes) each K part's values computed again into one
/// buffer, then the pass's call on them.
fn restreamed_gate_prologue(core: &Core, o: &Operands) -> Vec<CoreOp> {
    let (sh, rs, gv) = (o.sh, o.rs(), o.gate_values(0));
    let mut ops = vec![call(qkernels::RESET, vec![rs.clone()])];
    let on_values = |pass: usize, q: usize, x: Operand| {
        let then = match pass {
            0 => call(qkernels::GATE_MAX, vec![gv.clone(), rs.clone()]),
            1 => call(qkernels::GATE_CODES, vec![gv.clone(), rs.clone(), o.codes(0, q)]),
            _ => call(qkernels::GATE_RESIDUAL, vec![gv.clone(), rs.clone(), o.codes(1, q)]),
        };
        vec![call(qkernels::GATE_VALUES, vec![x, gv.clone()]), then]
    };
    for pass in 0..=sh.passes {
        if pass > 0 {
            ops.push(call(qkernels::PRODUCT_SCALE[pass - 1], vec![rs.clone()]));
        }
        stream_pass(&mut ops, core, (sh, pass), &|q, x| on_values(pass, q, x));
    }
    ops
}

/// One output tile: the accumulators zeroed, each K part's weights multiplied in, and with the
/// last part's element the epilogue.
fn tile_body(core: &Core, o: &Operands) -> Vec<CoreOp> {
    let sh = o.sh;
    let y = ("%y_buf".to_string(), sh.y_ty());
    let mut body = vec![CoreOp::Acquire { res: "%y".into(), fifo: core.c.clone(), produce: true, ty: sh.y_ty() }];
    let passes = sh.buffered_passes();
    body.extend((0..passes).map(|p| call(GEMV_ZERO, vec![o.acc(p)])));
    for q in 0..core.k_steps {
        let w = (format!("%w{q}_buf"), sh.w_ty());
        body.push(CoreOp::Acquire { res: format!("%w{q}"), fifo: core.b.clone(), produce: false, ty: sh.w_ty() });
        body.extend((0..passes).map(|p| call(GEMV, vec![o.codes(p, q), w.clone(), o.acc(p)])));
        if q + 1 == core.k_steps {
            let mut args: Vec<Operand> = (0..passes).map(|p| o.acc(p)).collect();
            args.extend([o.rs(), w.clone(), y.clone()]);
            body.push(call(qkernels::DEQUANT, args));
        }
        body.push(CoreOp::Release { fifo: core.b.clone(), produce: false });
    }
    body.push(CoreOp::Release { fifo: core.c.clone(), produce: true });
    body
}

/// The ops of a qgemv core's body.
fn core_ops(d: &Design, core: &Core) -> Vec<CoreOp> {
    let Kind::QGemv { passes, kernel_rows, input, kept, pairs, split, stacked } = d.kind else {
        unreachable!("qgemv core bodies are printed for qgemv designs only")
    };
    let t = &d.tiling;
    let sh = Shape { rows: t.m, k: t.k, n: t.n, passes, kernel_rows, input, pairs, stacked };
    let o = Operands { sh, tile: core.tile, kept };
    let ex = (split > 0).then(|| Exchange::of(sh, (t.padded.k, split)));
    if core.prologue {
        return split::prologue_ops(core, ex.expect("a prologue core belongs to a split design"));
    }
    let mut ops = match (input, ex) {
        (_, Some(ex)) => split::unpack_ops(core, &o, (t.padded.k / t.k, ex)),
        (Input::Rows, None) => prologue(core, &o),
        (Input::Norm | Input::SumNorm, None) => norm_prologue(core, &o),
        (Input::Gate, None) => gate_prologue(core, &o),
    };
    ops.push(CoreOp::Tiles { body: tile_body(core, &o) });
    ops
}

/// A qgemv core's body in generic form, for its activation passes and kernel rows.
pub(crate) fn generic_core(d: &Design, core: &Core, o: &mut String) {
    let (c, r) = core.tile;
    let _ = writeln!(o, "    %core_{c}_{r} = \"aie.core\"({}) ({{", tile_var(core.tile));
    let _ = writeln!(o, "      %c0 = \"arith.constant\"() {{value = 0 : index}} : () -> index");
    let _ = writeln!(o, "      %c1 = \"arith.constant\"() {{value = 1 : index}} : () -> index");
    let _ = writeln!(o, "      %ctiles = \"arith.constant\"() {{value = {} : index}} : () -> index", core.tiles);
    generic_ops(&core_ops(d, core), o, 6);
    let _ = writeln!(o, "      \"aie.end\"() : () -> ()");
    let _ = writeln!(o, "    }}) {{stack_size = {} : i32}} : (index) -> index", d.tiling.device.core_stack_bytes());
}

fn generic_ops(ops: &[CoreOp], o: &mut String, pad: usize) {
    let sp = " ".repeat(pad);
    for op in ops {
        match op {
            CoreOp::Acquire { res, fifo, produce, ty } => {
                let port = if *produce { 0 } else { 1 };
                let _ = writeln!(o, "{sp}{res} = \"aie.objectfifo.acquire\"() {{objFifo_name = @{fifo}, port = {port} : i32, size = 1 : i32}} : () -> !aie.objectfifosubview<{ty}>");
                let _ = writeln!(o, "{sp}{res}_buf = \"aie.objectfifo.subview.access\"({res}) {{index = 0 : i32}} : (!aie.objectfifosubview<{ty}>) -> {ty}");
            }
            CoreOp::Release { fifo, produce } => {
                let port = if *produce { 0 } else { 1 };
                let _ = writeln!(o, "{sp}\"aie.objectfifo.release\"() {{objFifo_name = @{fifo}, port = {port} : i32, size = 1 : i32}} : () -> ()");
            }
            CoreOp::Call { callee, args } => {
                let (names, tys): (Vec<&str>, Vec<&str>) = args.iter().map(|(a, t)| (a.as_str(), t.as_str())).unzip();
                let _ = writeln!(
                    o,
                    "{sp}\"func.call\"({}) {{callee = @{callee}}} : ({}) -> ()",
                    names.join(", "),
                    tys.join(", ")
                );
            }
            CoreOp::Seq(ops) => generic_ops(ops, o, pad),
            CoreOp::Tiles { body } => {
                let _ = writeln!(o, "{sp}\"scf.for\"(%c0, %ctiles, %c1) ({{\n{sp}^bb0(%tile: index):");
                generic_ops(body, o, pad + 2);
                let _ = writeln!(o, "{sp}  \"scf.yield\"() : () -> ()\n{sp}}}) : (index, index, index) -> ()");
            }
        }
    }
}

/// A qgemv core's body in custom form.
pub(crate) fn pretty_core(d: &Design, core: &Core, o: &mut String) {
    let (c, r) = core.tile;
    let _ = writeln!(o, "    %core_{c}_{r} = aie.core({}) {{", tile_var(core.tile));
    let _ = writeln!(o, "      %c0 = arith.constant 0 : index\n      %c1 = arith.constant 1 : index");
    let _ = writeln!(o, "      %ctiles = arith.constant {} : index", core.tiles);
    pretty_ops(&core_ops(d, core), o, 6);
    let _ = writeln!(o, "      aie.end");
    let _ = writeln!(o, "    }} {{stack_size = {} : i32}}", d.tiling.device.core_stack_bytes());
}

fn pretty_ops(ops: &[CoreOp], o: &mut String, pad: usize) {
    let sp = " ".repeat(pad);
    let port = |produce: bool| if produce { "Produce" } else { "Consume" };
    for op in ops {
        match op {
            CoreOp::Acquire { res, fifo, produce, ty } => {
                let sub = format!("!aie.objectfifosubview<{ty}>");
                let _ = writeln!(o, "{sp}{res} = aie.objectfifo.acquire @{fifo}({}, 1) : {sub}", port(*produce));
                let _ = writeln!(o, "{sp}{res}_buf = aie.objectfifo.subview.access {res}[0] : {sub} -> {ty}");
            }
            CoreOp::Release { fifo, produce } => {
                let _ = writeln!(o, "{sp}aie.objectfifo.release @{fifo}({}, 1)", port(*produce));
            }
            CoreOp::Call { callee, args } => {
                let (names, tys): (Vec<&str>, Vec<&str>) = args.iter().map(|(a, t)| (a.as_str(), t.as_str())).unzip();
                let _ = writeln!(o, "{sp}func.call @{callee}({}) : ({}) -> ()", names.join(", "), tys.join(", "));
            }
            CoreOp::Seq(ops) => pretty_ops(ops, o, pad),
            CoreOp::Tiles { body } => {
                let _ = writeln!(o, "{sp}scf.for %tile = %c0 to %ctiles step %c1 {{");
                pretty_ops(body, o, pad + 2);
                let _ = writeln!(o, "{sp}}}");
            }
        }
    }
}

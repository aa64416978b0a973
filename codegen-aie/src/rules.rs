//! mlir-aie's rules for object FIFOs, their links and the DMA buffer descriptors they lower to,
//! checked on a [`Design`], so a design mlir-aie's `aie-opt` would refuse, or would lower to
//! descriptors the hardware cannot run, fails here without mlir-aie. Each [`Rule`] says which part
//! of mlir-aie it follows; the limits per tile kind are [`crate::device`]'s, as mlir-aie's target
//! model gives them for npu1 (AIE2) and npu2 (AIE2P).
//!
//! How mlir-aie lowers a link decides what its access patterns may address: the link's buffer
//! belongs to one FIFO (a join's output, a distribute's input), and the other side gets one
//! descriptor per FIFO, at its offset, as long as its transfer; the owner's descriptors are one
//! per transfer too, each applying the owner's access pattern to that transfer alone.

use crate::design::{Design, Elem, Fifo, Link, SeqOp, Tile};
use crate::device::{Device, DmaLimits};

/// A rule a design breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A FIFO has a depth and at least one consumer (`ObjectFifoCreateOp`).
    FifoEnds,
    /// No FIFO's name is one mlir-aie gives the consumer end it splits off another FIFO
    /// (`<name>_cons`, or `<name>_<i>_cons` for consumer `i` of several): the two would share a
    /// symbol, and a core's uses of one become the other's.
    FifoNames,
    /// No `dimensionsToStream` on a shim producer (`ObjectFifoCreateOp::verify`).
    ShimProducerLayout,
    /// A link names FIFOs, and is a join, a distribute or one-to-one, never both
    /// (`ObjectFifoLinkOp::verify`).
    LinkKind,
    /// A FIFO is in at most one link (`ObjectFifoLinkOp::verify`).
    LinkOnce,
    /// The link point is one tile every FIFO meets at, and a join or distribute is not on a shim
    /// (`ObjectFifoLinkOp::getOptionalSharedTile`, `verify`).
    LinkTile,
    /// One source offset per join input, one destination offset per distribute output, none
    /// otherwise (`ObjectFifoLinkOp::verify`).
    LinkOffsets,
    /// Offsets rise and cut the buffer into transfers, each inside it and exactly one element of
    /// its FIFO, of the same element type (`getJoinTransferLengths`,
    /// `getDistributeTransferLengths`).
    LinkTransfers,
    /// A join's output pattern stays inside, and covers, each input's transfer
    /// (`ObjectFifoLinkOp::verify`: "out of bounds access in join input"; the objectfifo
    /// stateful transform's one descriptor per input).
    JoinPattern,
    /// A distribute output's pattern stays inside, and covers, its own transfer (the stateful
    /// transform's one descriptor per output, at its offset, as long as its transfer).
    DistributePattern,
    /// Any other producer's pattern stays inside, and covers, its element (`DMABDOp::verify`:
    /// "out of bounds access in buffer").
    FifoPattern,
    /// A descriptor's dimensions, sizes, strides and length (`DMABDOp::verify`,
    /// `AIEX::verifyStridesWraps`).
    BdLimits,
    /// A tile's data memory holds its FIFO buffers (and a core's stack).
    Memory,
    /// Each FIFO buffer fits one memory bank, as mlir-aie's bank-aware allocator places them
    /// (`AIEAssignBuffers`; a larger buffer makes it fall back to sequential allocation, where
    /// buffers a core or DMA uses at once can share a bank), and on a compute tile that
    /// allocator places them all: largest first, each in the first bank from the one after the
    /// last placement with room left, the stack at the bottom of bank 0
    /// (`simpleBankAwareAllocation`), so bytes that fit in total can still fail to pack.
    Banks,
    /// DMA channels per direction and tile (`MemTileDMAOp::verify`, the switchbox DMA ports).
    Channels,
    /// Locks per tile: a pair per FIFO end, a pair per transfer at a join or distribute
    /// (`createObjectFifoLocks`; `getNumLocks`).
    Locks,
    /// Buffer descriptors per tile, per mem-tile channel, and per half of a mem tile's: its
    /// even channels take BDs 0–23, its odd ones 24–47 (`getNumBDs`, `isBdChannelAccessible`;
    /// the stateful transform's one per buffer and transfer).
    Bds,
    /// A runtime DMA on a shim FIFO, word-aligned, within the shim descriptor's limits
    /// (`NpuDmaMemcpyNdOp::verify`, `verifyStridesWraps`).
    RuntimeDma,
    /// Runtime DMA ids below the shim's BD count, none reused before the wait that frees it.
    ShimBdIds,
    /// Every function a core calls is defined in the design with a body, so mlir-aie compiles the
    /// core's code from the design alone (a declaration would link an object no bundle carries).
    CoreCalls,
    /// The design's name is its device's symbol, written unquoted: an MLIR bare identifier (a
    /// letter or `_`, then letters, digits, `_`, `$` or `.`).
    SymbolName,
    /// A core function's elementwise integer operations (`arith` binary ops, compares, selects,
    /// casts other than bitcasts) take vectors of at most 256 bits: mlir-aie's
    /// `convert-vector-to-aievec` (at the commit checked against) leaves `arith.subi` on wider
    /// integer vectors illegal for the LLVM backend, has no LLVM lowering for their bitwise ops,
    /// and cannot translate their compare masks; 8 lanes of i32 lower.
    VectorWidth,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::FifoEnds => "fifo-ends",
            Rule::FifoNames => "fifo-names",
            Rule::ShimProducerLayout => "shim-producer-layout",
            Rule::LinkKind => "link-kind",
            Rule::LinkOnce => "link-once",
            Rule::LinkTile => "link-tile",
            Rule::LinkOffsets => "link-offsets",
            Rule::LinkTransfers => "link-transfers",
            Rule::JoinPattern => "join-pattern",
            Rule::DistributePattern => "distribute-pattern",
            Rule::FifoPattern => "fifo-pattern",
            Rule::BdLimits => "bd-limits",
            Rule::Memory => "memory",
            Rule::Banks => "banks",
            Rule::Channels => "channels",
            Rule::Locks => "locks",
            Rule::Bds => "bds",
            Rule::RuntimeDma => "runtime-dma",
            Rule::ShimBdIds => "shim-bd-ids",
            Rule::CoreCalls => "core-calls",
            Rule::SymbolName => "symbol-name",
            Rule::VectorWidth => "vector-width",
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A rule a design breaks, what breaks it (a FIFO, a link, a tile, the runtime sequence) and how.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("design {design}: {subject}: {rule}: {what}")]
pub struct ResourceError {
    pub design: String,
    pub rule: Rule,
    pub subject: String,
    pub what: String,
}

/// A limit of a DMA buffer descriptor that an access pattern breaks.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatternError {
    #[error("{dims} dimensions, the descriptor walks at most {max_dims}")]
    Dimensions { dims: usize, max_dims: usize },
    #[error("innermost stride {stride} of a sub-word element, must be 1")]
    InnerStride { stride: usize },
    #[error("innermost size {size} × {elem_bytes} bytes is not a whole number of 32-bit words")]
    InnerSizeNotWords { size: usize, elem_bytes: usize },
    #[error("repeat {repeat} outside 1..={max_repeat}")]
    Repeat { repeat: usize, max_repeat: usize },
    #[error("size {size} outside 1..={max_size}")]
    Size { size: usize, max_size: usize },
    #[error("stride 0, a descriptor's strides are positive")]
    ZeroStride,
    #[error("stride {stride} × {elem_bytes} bytes is not a whole number of 32-bit words")]
    StrideNotWords { stride: usize, elem_bytes: usize },
    #[error("stride {stride} exceeds {max_stride_words} words")]
    Stride { stride: usize, max_stride_words: usize },
    #[error("{words} words in one transfer, the descriptor moves at most {max_len_words}")]
    Length { words: usize, max_len_words: usize },
}

/// Checks one access pattern (size, stride; outermost first) against a descriptor's limits.
/// `runtime`: a runtime sequence's shim DMA, whose first of `limits.dims + 1` dimensions is the
/// iteration (repeat) dimension, stride 0 allowed; otherwise an object FIFO's descriptor in a
/// tile, whose strides mlir-aie requires positive and counts in elements.
pub fn check_pattern(
    limits: DmaLimits,
    elem_bytes: usize,
    dims: &[(usize, usize)],
    runtime: bool,
) -> Result<(), PatternError> {
    let mut nd = dims;
    if runtime && dims.len() == limits.dims + 1 {
        let (repeat, stride) = dims[0];
        if repeat == 0 || repeat > limits.max_repeat {
            return Err(PatternError::Repeat { repeat, max_repeat: limits.max_repeat });
        }
        // A zero iteration stride repeats the same transfer.
        if repeat > 1 && stride > 0 {
            stride_words(limits, elem_bytes, stride, true)?;
        }
        nd = &dims[1..];
    }
    if nd.len() > limits.dims {
        return Err(PatternError::Dimensions { dims: dims.len(), max_dims: limits.dims });
    }
    let Some(&(inner_size, inner_stride)) = nd.last() else { return Ok(()) };
    if elem_bytes < 4 && inner_size > 1 && inner_stride != 1 {
        return Err(PatternError::InnerStride { stride: inner_stride });
    }
    if !(inner_size * elem_bytes).is_multiple_of(4) {
        return Err(PatternError::InnerSizeNotWords { size: inner_size, elem_bytes });
    }
    for (i, &(size, stride)) in nd.iter().enumerate() {
        if size == 0 || size > limits.max_size {
            return Err(PatternError::Size { size, max_size: limits.max_size });
        }
        if !runtime && stride == 0 {
            return Err(PatternError::ZeroStride);
        }
        if size > 1 && i + 1 < nd.len() {
            stride_words(limits, elem_bytes, stride, runtime)?;
        }
    }
    let words = dims.iter().map(|d| d.0).product::<usize>() * elem_bytes / 4;
    if words > limits.max_len_words {
        return Err(PatternError::Length { words, max_len_words: limits.max_len_words });
    }
    Ok(())
}

/// A stepped stride: positive, whole words, within the step field (counted in words on the
/// runtime path, as `verifyStridesWraps` encodes it; in elements in a tile, as `DMABDOp::verify`
/// compares it).
fn stride_words(limits: DmaLimits, elem_bytes: usize, stride: usize, runtime: bool) -> Result<(), PatternError> {
    if stride == 0 {
        return Err(PatternError::ZeroStride);
    }
    if !(stride * elem_bytes).is_multiple_of(4) {
        return Err(PatternError::StrideNotWords { stride, elem_bytes });
    }
    let counted = if runtime { stride * elem_bytes / 4 } else { stride };
    if counted > limits.max_stride_words {
        return Err(PatternError::Stride { stride, max_stride_words: limits.max_stride_words });
    }
    Ok(())
}

/// The highest element index a pattern addresses from its base.
pub fn max_index(dims: &[(usize, usize)]) -> usize {
    dims.iter().map(|&(size, stride)| stride * size.saturating_sub(1)).sum()
}

/// Checks every rule of a design: its FIFOs, its links and the patterns they imply, every
/// tile's memory, channels, locks and descriptors, and the runtime sequence.
pub fn check(d: &Design) -> Result<(), ResourceError> {
    check_symbol_name(d)?;
    check_core_calls(d)?;
    check_vector_widths(d)?;
    check_fifos(d)?;
    check_fifo_names(d)?;
    check_links(d)?;
    check_producer_patterns(d)?;
    let mut tiles: Vec<Tile> = d.fifos.iter().flat_map(|f| f.consumers.iter().copied().chain([f.producer])).collect();
    tiles.sort_unstable();
    tiles.dedup();
    for t in tiles {
        check_tile(d, t)?;
    }
    check_runtime_sequence(d)
}

fn fail<T>(d: &Design, rule: Rule, subject: String, what: String) -> Result<T, ResourceError> {
    Err(ResourceError { design: d.name.clone(), rule, subject, what })
}

fn fifo<'d>(d: &'d Design, name: &str) -> Option<&'d Fifo> {
    d.fifos.iter().find(|f| f.name == name)
}

fn fifo_subject(f: &Fifo) -> String {
    format!("object FIFO {}", f.name)
}

fn link_subject(l: &Link) -> String {
    format!("link [{}] -> [{}]", l.inputs.join(", "), l.outputs.join(", "))
}

fn tile_subject(t: Tile) -> String {
    let kind = match t.1 {
        Device::SHIM_ROW => "shim tile",
        Device::MEM_TILE_ROW => "mem tile",
        _ => "compute tile",
    };
    format!("{kind} ({}, {})", t.0, t.1)
}

/// The design's name is an MLIR bare identifier.
fn check_symbol_name(d: &Design) -> Result<(), ResourceError> {
    let mut chars = d.name.chars();
    let first = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first && chars.all(|c| c.is_ascii_alphanumeric() || "_$.".contains(c)) {
        return Ok(());
    }
    let what = "is not an MLIR bare identifier, as the device's unquoted symbol must be".to_string();
    fail(d, Rule::SymbolName, format!("design name {:?}", d.name), what)
}

/// Bits of a vector type `vector<AxBx..xiN>` (None for a scalar or a float vector).
fn int_vector_bits(ty: &str) -> Option<usize> {
    let inner = ty.trim().strip_prefix("vector<")?.strip_suffix('>')?;
    let (dims, elem) = inner.rsplit_once('x')?;
    let bits: usize = elem.strip_prefix('i')?.parse().ok()?;
    dims.split('x').try_fold(bits, |acc, d| d.parse::<usize>().ok().map(|d| acc * d))
}

/// The widest integer vector an elementwise statement of `body` (nested loops included) takes.
fn widest_elementwise(body: &[crate::kernels::Stmt]) -> Option<(usize, String)> {
    use crate::kernels::Stmt;
    body.iter()
        .filter_map(|s| match s {
            Stmt::Bin { ty, .. } | Stmt::Cmp { ty, .. } | Stmt::Select { ty, .. } => {
                int_vector_bits(ty).map(|b| (b, ty.clone()))
            }
            Stmt::Cast { op, from, .. } if *op != "bitcast" => int_vector_bits(from).map(|b| (b, from.clone())),
            Stmt::For { body, .. } => widest_elementwise(body),
            _ => None,
        })
        .max_by_key(|(b, _)| *b)
}

/// Core functions' elementwise integer operations stay within 256-bit vectors.
fn check_vector_widths(d: &Design) -> Result<(), ResourceError> {
    for f in &d.functions {
        if let Some((bits, ty)) = f.body.as_deref().and_then(widest_elementwise).filter(|(b, _)| *b > 256) {
            let what = format!("computes elementwise on {ty} ({bits} bits); mlir-aie lowers at most 256");
            return fail(d, Rule::VectorWidth, format!("function @{}", f.name), what);
        }
    }
    Ok(())
}

/// Every function a core calls has a body in the design.
fn check_core_calls(d: &Design) -> Result<(), ResourceError> {
    for core in &d.cores {
        for callee in &core.calls {
            let what = match d.functions.iter().find(|f| &f.name == callee) {
                None => format!("calls @{callee}, which the design does not define"),
                Some(f) if f.body.is_none() => format!(
                    "calls @{callee}, which the design declares without a body (its code would be an object file no bundle carries)"
                ),
                Some(_) => continue,
            };
            return fail(d, Rule::CoreCalls, format!("core on {}", tile_subject(core.tile)), what);
        }
    }
    Ok(())
}

/// Every FIFO has a depth and a consumer, and a shim producer streams its buffer linearly.
fn check_fifos(d: &Design) -> Result<(), ResourceError> {
    for f in &d.fifos {
        if f.depth == 0 || f.consumers.is_empty() || f.elems() == 0 {
            let what = format!("depth {}, {} consumers, {} elements", f.depth, f.consumers.len(), f.elems());
            return fail(d, Rule::FifoEnds, fifo_subject(f), what);
        }
        if f.producer.1 == Device::SHIM_ROW && !f.to_stream.is_empty() {
            let what = "a shim producer has no dimensionsToStream; lay the data out in the runtime DMA".into();
            return fail(d, Rule::ShimProducerLayout, fifo_subject(f), what);
        }
    }
    Ok(())
}

/// The names mlir-aie gives the consumer ends it splits off `f` (every FIFO whose ends are on
/// different tiles, as all of a design's are).
fn consumer_end_names(f: &Fifo) -> Vec<String> {
    match f.consumers.len() {
        1 => vec![format!("{}_cons", f.name)],
        n => (0..n).map(|i| format!("{}_{i}_cons", f.name)).collect(),
    }
}

/// Every FIFO and every consumer end mlir-aie will split off has a name of its own.
fn check_fifo_names(d: &Design) -> Result<(), ResourceError> {
    let mut seen: std::collections::HashMap<String, &str> = std::collections::HashMap::new();
    for f in &d.fifos {
        for name in std::iter::once(f.name.clone()).chain(consumer_end_names(f)) {
            if let Some(other) = seen.insert(name.clone(), &f.name) {
                let what = format!("{name} names both {other}'s and {}'s FIFO or consumer end", f.name);
                return fail(d, Rule::FifoNames, fifo_subject(f), what);
            }
        }
    }
    Ok(())
}

/// A link's FIFOs, its kind and the FIFO that owns its buffer with the transfers cut from it.
struct Resolved<'d> {
    ins: Vec<&'d Fifo>,
    outs: Vec<&'d Fifo>,
    join: bool,
    distribute: bool,
    /// The link point: the tile that holds the link's buffer.
    tile: Tile,
}

impl<'d> Resolved<'d> {
    /// The FIFO whose buffers the link uses: a join's output, otherwise the input.
    fn owner(&self) -> &'d Fifo {
        if self.join {
            self.outs[0]
        } else {
            self.ins[0]
        }
    }
    /// Transfers per buffer: one per join input or distribute output.
    fn factor(&self) -> usize {
        if self.join {
            self.ins.len()
        } else {
            self.outs.len()
        }
    }
}

/// The link's FIFOs and link point, checked: FIFOs that exist, one kind, one link point off the
/// shim for a join or distribute.
fn resolve<'d>(d: &'d Design, l: &Link) -> Result<Resolved<'d>, ResourceError> {
    let subject = || link_subject(l);
    let find = |names: &[String]| names.iter().map(|n| fifo(d, n).ok_or(n.clone())).collect::<Result<Vec<_>, _>>();
    let (ins, outs) = match (find(&l.inputs), find(&l.outputs)) {
        (Ok(i), Ok(o)) if !i.is_empty() && !o.is_empty() => (i, o),
        (Err(n), _) | (_, Err(n)) => return fail(d, Rule::LinkKind, subject(), format!("names no FIFO {n}")),
        _ => return fail(d, Rule::LinkKind, subject(), "links nothing to nothing".into()),
    };
    let (join, distribute) = (ins.len() > 1, outs.len() > 1);
    if join && distribute {
        return fail(d, Rule::LinkKind, subject(), "joins and distributes at once".into());
    }
    let tile = if join { outs[0].producer } else { ins[0].consumers[0] };
    let meets = if join {
        ins.iter().all(|f| f.consumers[0] == tile)
    } else if distribute {
        outs.iter().all(|f| f.producer == tile)
    } else {
        ins[0].consumers.contains(&outs[0].producer)
    };
    if !meets {
        return fail(d, Rule::LinkTile, subject(), "its FIFOs share no link tile".into());
    }
    let tile = if join || distribute { tile } else { outs[0].producer };
    if (join || distribute) && tile.1 == Device::SHIM_ROW {
        return fail(d, Rule::LinkTile, subject(), "a join or distribute cannot be on a shim tile".into());
    }
    Ok(Resolved { ins, outs, join, distribute, tile })
}

/// The link whose link point is `tile` and that `f` takes part in.
fn link_at<'d>(d: &'d Design, f: &Fifo, tile: Tile) -> Option<Resolved<'d>> {
    d.links
        .iter()
        .filter(|l| l.inputs.contains(&f.name) || l.outputs.contains(&f.name))
        .filter_map(|l| resolve(d, l).ok())
        .find(|r| r.tile == tile)
}

/// Every link: FIFOs in one link each, its kind and tile, offsets, and transfers.
fn check_links(d: &Design) -> Result<(), ResourceError> {
    for f in &d.fifos {
        let n = d.links.iter().filter(|l| l.inputs.contains(&f.name) || l.outputs.contains(&f.name)).count();
        if n > 1 {
            return fail(d, Rule::LinkOnce, fifo_subject(f), format!("in {n} links"));
        }
    }
    for l in &d.links {
        let r = resolve(d, l)?;
        let (want_src, want_dst) = match (r.join, r.distribute) {
            (true, _) => (r.ins.len(), 0),
            (_, true) => (0, r.outs.len()),
            _ => (0, 0),
        };
        if l.src_offsets.len() != want_src || l.dst_offsets.len() != want_dst {
            let what = format!(
                "{} source and {} destination offsets; a link of {} inputs and {} outputs takes {want_src} and {want_dst}",
                l.src_offsets.len(),
                l.dst_offsets.len(),
                r.ins.len(),
                r.outs.len()
            );
            return fail(d, Rule::LinkOffsets, link_subject(l), what);
        }
        check_transfers(d, l, &r)?;
    }
    Ok(())
}

/// The transfers `(offset, length)` that `offsets` cut a buffer of `elems` into, as mlir-aie
/// computes them: each to the next offset, the last to the buffer's end.
pub fn transfers(offsets: &[usize], elems: usize) -> Result<Vec<(usize, usize)>, String> {
    let ends = offsets.iter().skip(1).copied().chain([elems]);
    offsets
        .iter()
        .zip(ends)
        .map(|(&off, end)| match end.checked_sub(off) {
            Some(len) if len > 0 => Ok((off, len)),
            _ => Err(format!("offsets {offsets:?} do not rise inside a buffer of {elems}")),
        })
        .collect()
}

/// Each FIFO on the split side of a join or distribute is exactly one transfer of the owner's
/// buffer, of the same element type; a one-to-one link moves whole elements.
fn check_transfers(d: &Design, l: &Link, r: &Resolved) -> Result<(), ResourceError> {
    let owner = r.owner();
    let (split, offsets): (&[&Fifo], &[usize]) = if r.join {
        (&r.ins, &l.src_offsets)
    } else if r.distribute {
        (&r.outs, &l.dst_offsets)
    } else {
        (&r.outs, &[0])
    };
    let cut = transfers(offsets, owner.elems()).or_else(|e| fail(d, Rule::LinkTransfers, link_subject(l), e))?;
    for (f, &(off, len)) in split.iter().zip(&cut) {
        if f.elems() != len || f.elem != owner.elem {
            let what = format!(
                "{} is {} {} elements; its transfer at {off} of {} is {len} {}",
                f.name,
                f.elems(),
                f.elem.mlir(),
                owner.name,
                owner.elem.mlir()
            );
            return fail(d, Rule::LinkTransfers, link_subject(l), what);
        }
    }
    Ok(())
}

/// The transfers a FIFO's producer descriptors walk, and the rule that keeps its pattern in
/// them: each join input's transfer for a join's output, its own transfer for a distribute
/// output, its element otherwise.
fn producer_transfers(d: &Design, f: &Fifo) -> (Vec<usize>, Rule) {
    match link_at(d, f, f.producer) {
        Some(r) if r.join && r.outs[0].name == f.name => (r.ins.iter().map(|i| i.elems()).collect(), Rule::JoinPattern),
        Some(r) if r.distribute => (vec![f.elems()], Rule::DistributePattern),
        _ => (vec![f.elems()], Rule::FifoPattern),
    }
}

/// Every producer's access pattern: within its tile's descriptor limits, inside and covering
/// every transfer it is applied to.
fn check_producer_patterns(d: &Design) -> Result<(), ResourceError> {
    let dev = d.tiling.device;
    for f in d.fifos.iter().filter(|f| !f.to_stream.is_empty()) {
        let limits = if f.producer.1 == Device::MEM_TILE_ROW { dev.mem_tile_dma() } else { dev.core_dma() };
        check_pattern(limits, f.elem.bytes(), &f.to_stream, false)
            .or_else(|e| fail(d, Rule::BdLimits, fifo_subject(f), format!("access pattern: {e}")))?;
        let (lens, rule) = producer_transfers(d, f);
        let (top, covered) = (max_index(&f.to_stream), f.to_stream.iter().map(|&(s, _)| s).product::<usize>());
        for len in lens {
            if top >= len || covered != len {
                let what =
                    format!("access pattern reaches index {top} and moves {covered} elements of a transfer of {len}");
                return fail(d, rule, fifo_subject(f), what);
            }
        }
    }
    Ok(())
}

/// What one tile's FIFO ends use.
#[derive(Default)]
struct TileUse {
    bytes: usize,
    /// The largest buffer and the FIFO it belongs to.
    largest: (usize, String),
    locks: usize,
    bds: usize,
    mm2s: usize,
    s2mm: usize,
    /// Descriptors of the channels of even and of odd index: a mem tile's even channels take
    /// BDs 0–23, its odd ones 24–47.
    halves: [usize; 2],
}

/// What the FIFO ends at `t` use: at a link point the owner's buffers with a lock pair and a
/// descriptor per transfer and buffer, the other side a descriptor per owner buffer; elsewhere
/// each end its buffers, a lock pair and a descriptor per buffer. Fails on a mem-tile channel
/// needing more descriptors than it reaches.
fn tile_use(d: &Design, t: Tile) -> Result<TileUse, ResourceError> {
    let mut u = TileUse::default();
    for b in d.buffers.iter().filter(|b| b.tile == t) {
        u.bytes += b.bytes();
        if b.bytes() > u.largest.0 {
            u.largest = (b.bytes(), b.name.clone());
        }
    }
    for f in d.fifos.iter().filter(|f| f.producer == t || f.consumers.contains(&t)) {
        let bytes = |f: &Fifo| f.depth * f.elems() * f.elem.bytes();
        let buffer = f.elems() * f.elem.bytes();
        if buffer > u.largest.0 && (link_at(d, f, t).is_none_or(|r| r.owner().name == f.name)) {
            u.largest = (buffer, f.name.clone());
        }
        let bds = match link_at(d, f, t) {
            Some(r) if r.owner().name == f.name => {
                u.bytes += bytes(f);
                u.locks += 2 * r.factor();
                f.depth * r.factor()
            }
            Some(r) => r.owner().depth,
            None => {
                u.bytes += bytes(f);
                u.locks += 2;
                f.depth
            }
        };
        if t.1 == Device::MEM_TILE_ROW && bds > d.tiling.device.mem_tile_channel_bds() {
            let what = format!(
                "{}'s channel needs {bds} BDs; one channel reaches {}",
                f.name,
                d.tiling.device.mem_tile_channel_bds()
            );
            return fail(d, Rule::Bds, tile_subject(t), what);
        }
        u.bds += bds;
        // mlir-aie gives a tile's FIFO ends their channels in declaration order, each direction
        // from 0.
        let channel = if f.producer == t { &mut u.mm2s } else { &mut u.s2mm };
        u.halves[*channel % 2] += bds;
        *channel += 1;
    }
    Ok(u)
}

/// One tile's memory, DMA channels, locks and descriptors (a shim's descriptors are the runtime
/// sequence's, checked there).
fn check_tile(d: &Design, t: Tile) -> Result<(), ResourceError> {
    let dev = d.tiling.device;
    let mut u = tile_use(d, t)?;
    let (bytes, channels, locks, bds) = match t.1 {
        Device::SHIM_ROW => (usize::MAX, dev.shim_channels(), usize::MAX, usize::MAX),
        Device::MEM_TILE_ROW => {
            (dev.mem_tile_bytes(), dev.mem_tile_channels(), dev.mem_tile_locks(), dev.mem_tile_bds())
        }
        _ => {
            u.bytes += dev.core_stack_bytes();
            (dev.core_data_bytes(), dev.core_channels(), dev.core_locks(), dev.core_bds())
        }
    };
    let subject = || tile_subject(t);
    let bank = match t.1 {
        Device::SHIM_ROW => usize::MAX,
        Device::MEM_TILE_ROW => dev.mem_tile_bytes() / dev.mem_tile_banks(),
        _ => dev.core_data_bytes() / dev.core_banks(),
    };
    if u.largest.0 > bank {
        let what = format!("{}'s buffer of {} bytes is larger than a {bank}-byte bank", u.largest.1, u.largest.0);
        return fail(d, Rule::Banks, subject(), what);
    }
    if u.bytes > bytes {
        return fail(
            d,
            Rule::Memory,
            subject(),
            format!("needs {} bytes of data memory; the budget is {bytes}", u.bytes),
        );
    }
    if t.1 >= Device::FIRST_COMPUTE_ROW {
        bank_aware_placement(d, t)?;
    }
    if u.mm2s > channels || u.s2mm > channels {
        let what = format!("needs {} outgoing and {} incoming DMA channels; it has {channels}", u.mm2s, u.s2mm);
        return fail(d, Rule::Channels, subject(), what);
    }
    if u.locks > locks {
        return fail(d, Rule::Locks, subject(), format!("needs {} locks; it has {locks}", u.locks));
    }
    if t.1 == Device::MEM_TILE_ROW {
        for (parity, &n) in ["even", "odd"].iter().zip(&u.halves) {
            if n > bds / 2 {
                let what = format!("its {parity} channels need {n} BDs; they share {} of its {bds}", bds / 2);
                return fail(d, Rule::Bds, subject(), what);
            }
        }
    }
    if u.bds > bds {
        return fail(d, Rule::Bds, subject(), format!("needs {} BDs; it has {bds}", u.bds));
    }
    Ok(())
}

/// A compute tile's buffers placed as mlir-aie's bank-aware allocator places them (see
/// [`Rule::Banks`]): one per FIFO element the tile holds, and the core's own buffers.
fn bank_aware_placement(d: &Design, t: Tile) -> Result<(), ResourceError> {
    let dev = d.tiling.device;
    let (banks, bank) = (dev.core_banks(), dev.core_data_bytes() / dev.core_banks());
    let mut buffers: Vec<(usize, String)> = vec![];
    for f in d.fifos.iter().filter(|f| f.producer == t || f.consumers.contains(&t)) {
        buffers.extend((0..f.depth).map(|i| (f.elems() * f.elem.bytes(), format!("{}[{i}]", f.name))));
    }
    buffers.extend(d.buffers.iter().filter(|b| b.tile == t).map(|b| (b.bytes(), b.name.clone())));
    // Equal sizes are interchangeable, so the placement's success does not depend on their order.
    buffers.sort_by_key(|b| std::cmp::Reverse(b.0));
    let mut next: Vec<usize> = (0..banks).map(|i| i * bank).collect();
    next[0] += dev.core_stack_bytes();
    let mut start = 0;
    for (size, name) in buffers {
        let Some(b) = (0..banks).map(|i| (start + i) % banks).find(|&b| next[b] + size <= (b + 1) * bank) else {
            let free: Vec<usize> = (0..banks).map(|b| (b + 1) * bank - next[b]).collect();
            let what =
                format!("{name} ({size} bytes) fits no bank in mlir-aie's bank-aware placement (free: {free:?})");
            return fail(d, Rule::Banks, tile_subject(t), what);
        };
        next[b] += size;
        start = (b + 1) % banks;
    }
    Ok(())
}

/// The runtime sequence: every DMA on a FIFO that touches a shim, word-aligned and within the
/// shim descriptor's limits, with a BD id below the shim's count that no DMA in flight holds.
fn check_runtime_sequence(d: &Design) -> Result<(), ResourceError> {
    let dev = d.tiling.device;
    let mut in_flight: Vec<(usize, usize, String)> = vec![];
    for op in &d.seq {
        match op {
            SeqOp::Dma { arg, offset, sizes, strides, id, fifo: name, .. } => {
                let subject = || format!("runtime DMA on {name}");
                let shim = fifo(d, name).and_then(|f| {
                    [f.producer].into_iter().chain(f.consumers.iter().copied()).find(|t| t.1 == Device::SHIM_ROW)
                });
                let Some((shim_col, _)) = shim else {
                    return fail(d, Rule::RuntimeDma, subject(), "its FIFO does not touch a shim tile".into());
                };
                let elem = d.args.get(*arg).map_or(Elem::I8, |a| a.1);
                if !(offset * elem.bytes()).is_multiple_of(4) {
                    return fail(d, Rule::RuntimeDma, subject(), format!("offset {offset} is not word-aligned"));
                }
                let dims: Vec<(usize, usize)> = sizes.iter().zip(strides).map(|(&s, &t)| (s, t)).collect();
                check_pattern(dev.shim_dma(), elem.bytes(), &dims, true)
                    .or_else(|e| fail(d, Rule::RuntimeDma, subject(), e.to_string()))?;
                if *id >= dev.shim_bds() {
                    let what = format!("BD id {id} on shim column {shim_col}; it has {}", dev.shim_bds());
                    return fail(d, Rule::ShimBdIds, subject(), what);
                }
                if in_flight.iter().any(|(c, i, _)| *c == shim_col && i == id) {
                    let what = format!("reuses BD {id} of shim column {shim_col} before waiting on it");
                    return fail(d, Rule::ShimBdIds, subject(), what);
                }
                in_flight.push((shim_col, *id, name.clone()));
            }
            SeqOp::Wait { fifo: name } => in_flight.retain(|(_, _, f)| f != name),
        }
    }
    Ok(())
}

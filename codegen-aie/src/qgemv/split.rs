//! qgemv designs whose row quantisation is split across prologue cores: instead of every GEMV
//! core quantising the whole row itself (its prologue as long as the row, whatever the core
//! count), `P` prologue cores on compute tiles the GEMV cores leave free each quantise a slice of
//! the row's K values — plain rows, a norm's input with γ, or a gate's and up's rows, with the
//! unsplit core's functions — and the GEMV cores receive the codes.
//!
//! - `X` (shim of column 0 → its mem tile) carries the rows once, `[P, x_rows, slice]` (the
//!   runtime DMA lays each core's slice out contiguously); the link distributes slice `j` to
//!   `XS_<j>`, prologue core `j`'s.
//! - A round of the exchange: every prologue core writes its slot (`S_<j>`, [`Exchange`]: its
//!   row state, a norm's squares' lanes, and in the last round its codes) to column 0's mem
//!   tile, whose link joins the slots into `J` and broadcasts them to every prologue and GEMV
//!   core. Each pass's maximum takes a round (a norm's two rounds carry its largest magnitude
//!   and its lanes too), combined by every core into the same scales, and the codes the last.
//!   A GEMV core releases the maxima's rounds untouched and takes the last apart into its codes
//!   buffers and row state ([`crate::qkernels::unpack`]; both passes' codes in one buffer when
//!   stacked); from there its body is the unsplit design's.
//!
//! - With a sum ([`Input::SumNorm`]) each slice carries the residual stream's rows, γ's and the
//!   projection's rows; a prologue core adds its slice's two first ([`qkernels::sum()`]) and
//!   writes the sum through `H_<c>_<r>`, its own second output channel, straight to column `j`'s
//!   shim, into the sequence's fourth argument — the hub has no channel to spare.
//!
//! The maximum of the partial maxima is the row's maximum bit for bit, and the sum of the
//! partial lanes the row's lanes, so the codes, scales and outputs equal the unsplit design's,
//! and the program's.

use super::{call, stream_pass, CoreOp, Feed, Operand, Operands, QTiling, Shape};
use crate::design::{Buffer, Core, Design, Elem, Fifo, Kind, Link, SeqOp, Tile};
use crate::device::Device;
use crate::gemv::{core_tile, output_fifos, stream_fifos, stream_sequence, streams, tiles_used};
use crate::kernels::{self, GEMV, GEMV_ZERO};
use crate::qkernels::{self, Exchange, Input};

/// Most prologue cores a design takes: column 0's mem tile, which distributes the slices and
/// joins the slots beside its own core's outputs, has six channels each way.
pub const MAX_CORES: usize = 4;

/// The exchange of a split tiling.
pub fn exchange(q: &QTiling) -> Exchange {
    Exchange::of(q.shape(), (q.tiling.padded.k, q.split))
}

/// A prologue core's slice of `X`: its shape and element type.
fn slice_of(ex: Exchange) -> (Vec<usize>, Elem) {
    match ex.input {
        Input::Gate => (vec![2, ex.rows, ex.slice], Elem::I32),
        _ => (vec![ex.shape().x_rows(), ex.slice], Elem::F32),
    }
}

/// Prologue core `j`'s tile: the compute tiles no GEMV core takes, column by column.
pub fn prologue_tile(device: Device, j: usize) -> Tile {
    let gemv: Vec<Tile> = (0..streams(device)).map(|s| core_tile(device, s)).collect();
    let rows = Device::FIRST_COMPUTE_ROW..Device::FIRST_COMPUTE_ROW + device.compute_rows();
    let free = (0..device.columns()).flat_map(|c| rows.clone().map(move |r| (c, r))).filter(|t| !gemv.contains(t));
    free.into_iter().nth(j).expect("a device has more free compute tiles than MAX_CORES")
}

/// The mem tile of the exchange and the slices' distribution.
const HUB: Tile = (0, Device::MEM_TILE_ROW);

/// The design of a split qgemv tiling.
pub fn build(q: &QTiling) -> Design {
    let t = &q.tiling;
    let (parts, tiles) = q.parts_and_tiles();
    let (dev, sh, ex) = (t.device, q.shape(), exchange(q));
    let mut fifos = vec![];
    let mut links = vec![];
    exchange_fifos(q, &mut fifos, &mut links);
    if ex.input == Input::SumNorm {
        fifos.extend(sum_fifos(q));
    }
    let w_shape = vec![sh.w_rows(), t.k];
    fifos.extend(stream_fifos(dev, ("X", 1, Elem::I8), vec![1], w_shape).into_iter().skip(1));
    output_fifos(t, Elem::F32, &mut fifos, &mut links);
    let gemv_calls = vec![qkernels::UNPACK.into(), GEMV_ZERO.into(), GEMV.into(), qkernels::DEQUANT.into()];
    let mut cores: Vec<Core> = (0..streams(dev))
        .map(|s| Core {
            tile: core_tile(dev, s),
            a: "J".into(),
            b: format!("W_{s}"),
            c: format!("C_L1L2_{s}"),
            tiles,
            k_steps: parts,
            calls: gemv_calls.clone(),
            prologue: false,
        })
        .collect();
    let epsilon = if let Feed::Norm { epsilon, .. } = q.feed { epsilon } else { 0.0 };
    let prologue = qkernels::prologue_functions(ex, (t.shape.k, epsilon));
    cores.extend((0..q.split).map(|j| Core {
        tile: prologue_tile(dev, j),
        a: format!("XS_{j}"),
        b: "J".into(),
        c: format!("S_{j}"),
        tiles: 0,
        k_steps: 1,
        calls: prologue.iter().map(|f| f.name.clone()).collect(),
        prologue: true,
    }));
    let mut functions = prologue;
    let rkn = (q.kernel_rows, t.k, sh.w_cols());
    functions.extend([
        qkernels::unpack(ex, sh, parts),
        qkernels::dequant(sh),
        kernels::gemv_zero_i32(rkn),
        kernels::gemv_i8_i32_rows(dev, rkn, sh.w_rows()),
    ]);
    let p = t.padded;
    let w_len = streams(dev) * tiles * parts * sh.w_rows() * t.k;
    let buffers = cores.iter().flat_map(|c| core_buffers((sh, ex), parts, c)).collect();
    let mut args = vec![(x_len(q), Elem::F32), (w_len, Elem::I8), (p.m * p.n, Elem::F32)];
    if ex.input == Input::SumNorm {
        args.push((ex.rows * p.k, Elem::F32));
    }
    Design {
        kind: Kind::QGemv {
            passes: q.passes,
            kernel_rows: q.kernel_rows,
            input: ex.input,
            kept: false,
            pairs: q.pairs,
            split: q.split,
            stacked: q.stacked,
        },
        name: super::design_name(q),
        tiling: t.clone(),
        tiles: tiles_used(dev).into_iter().chain((0..q.split).map(|j| prologue_tile(dev, j))).collect(),
        fifos,
        links,
        buffers,
        functions,
        cores,
        args,
        seq: runtime_sequence(q),
    }
}

/// `X` into the hub and its slices out to the prologue cores; each core's slot into the hub and
/// the joined slots out to every core.
fn exchange_fifos(q: &QTiling, fifos: &mut Vec<Fifo>, links: &mut Vec<Link>) {
    let (dev, ex) = (q.tiling.device, exchange(q));
    let prologue: Vec<Tile> = (0..q.split).map(|j| prologue_tile(dev, j)).collect();
    let fifo = |name: String, (producer, consumers): (Tile, Vec<Tile>), shape: Vec<usize>, elem| Fifo {
        name,
        producer,
        consumers,
        depth: 1,
        shape,
        elem,
        to_stream: vec![],
    };
    let (x_shape, elem) = slice_of(ex);
    let x_elems: usize = x_shape.iter().product();
    fifos.push(fifo("X".into(), ((0, Device::SHIM_ROW), vec![HUB]), vec![q.split * x_elems], elem));
    for (j, &tile) in prologue.iter().enumerate() {
        fifos.push(fifo(format!("XS_{j}"), (HUB, vec![tile]), x_shape.clone(), elem));
        fifos.push(fifo(format!("S_{j}"), (tile, vec![HUB]), vec![1, ex.slot()], Elem::I8));
    }
    let everyone: Vec<Tile> = prologue.iter().copied().chain((0..streams(dev)).map(|s| core_tile(dev, s))).collect();
    fifos.push(fifo("J".into(), (HUB, everyone), vec![q.split, ex.slot()], Elem::I8));
    links.push(Link {
        inputs: vec!["X".into()],
        outputs: (0..q.split).map(|j| format!("XS_{j}")).collect(),
        src_offsets: vec![],
        dst_offsets: (0..q.split).map(|j| j * x_elems).collect(),
    });
    links.push(Link {
        inputs: (0..q.split).map(|j| format!("S_{j}")).collect(),
        outputs: vec!["J".into()],
        src_offsets: (0..q.split).map(|j| j * ex.slot()).collect(),
        dst_offsets: vec![],
    });
}

/// With a sum ([`Input::SumNorm`]), `H_<c>_<r>`: prologue core `j`'s slice of the sum, through its
/// spare output channel straight to the shim of column `j` (whose second S2MM channel no output
/// takes; a mem tile on the way would take channels the exchange's hub has none of).
fn sum_fifos(q: &QTiling) -> Vec<Fifo> {
    let (dev, ex) = (q.tiling.device, exchange(q));
    (0..q.split)
        .map(|j| Fifo {
            name: sum_fifo(prologue_tile(dev, j)),
            producer: prologue_tile(dev, j),
            consumers: vec![(j, Device::SHIM_ROW)],
            depth: 1,
            shape: vec![ex.rows, ex.slice],
            elem: Elem::F32,
            to_stream: vec![],
        })
        .collect()
}

/// The FIFO of the sum out of the prologue core on `tile`.
fn sum_fifo((c, r): Tile) -> String {
    format!("H_{c}_{r}")
}

/// A core's own buffers: a GEMV core's row state, codes and accumulators as the unsplit
/// design's; a prologue core's row state, its slice's codes of each pass, and a norm's squares'
/// lanes or a gate's values.
fn core_buffers((sh, ex): (Shape, Exchange), parts: usize, core: &Core) -> Vec<Buffer> {
    let (tile, (c, r)) = (core.tile, core.tile);
    if !core.prologue {
        return super::gemv_buffers(sh, parts, tile);
    }
    let state = vec![ex.state_words(), ex.rows];
    let mut b = vec![Buffer { tile, name: format!("rs_{c}_{r}"), shape: state, elem: Elem::F32 }];
    b.extend((0..ex.passes).map(|p| Buffer {
        tile,
        name: format!("pc_{c}_{r}_{p}"),
        shape: vec![ex.rows, ex.slice],
        elem: Elem::I8,
    }));
    match ex.input {
        Input::Norm | Input::SumNorm => {
            let shape = vec![ex.rows, qkernels::NORM_LANES];
            b.push(Buffer { tile, name: format!("ss_{c}_{r}"), shape, elem: Elem::I32 });
        }
        Input::Gate => b.push(Buffer { tile, name: format!("gv_{c}_{r}"), shape: slice_of(ex).0, elem: Elem::I32 }),
        Input::Rows => {}
    }
    b
}

/// Elements of the rows operand: `[x_rows, padded K]`, a gate's `[2, rows, padded K]`.
fn x_len(q: &QTiling) -> usize {
    let (ex, p) = (exchange(q), q.tiling.padded);
    let planes = if ex.input == Input::Gate { 2 * ex.rows } else { ex.shape().x_rows() };
    planes * p.k
}

/// `X` once, each prologue core's slice contiguous; the weights and outputs as the unsplit
/// design's.
fn runtime_sequence(q: &QTiling) -> Vec<SeqOp> {
    let t = &q.tiling;
    let (parts, tiles) = q.parts_and_tiles();
    let (p, k, w_rows, ex) = (t.padded, t.k, q.shape().w_rows(), exchange(q));
    let per_core = tiles * parts * w_rows * k;
    let x = match ex.input {
        Input::Gate => (0, 0, [q.split, 2, ex.rows, ex.slice], [ex.slice, ex.rows * p.k, p.k, 1]),
        _ => (0, 0, [1, q.split, ex.shape().x_rows(), ex.slice], [0, ex.slice, p.k, 1]),
    };
    let w = |s: usize| (1, s * per_core, [tiles, parts, w_rows, k], [parts * w_rows * k, w_rows * k, k, 1]);
    let mut seq = stream_sequence(t, tiles, ("X", x), &w);
    if ex.input == Input::SumNorm {
        sum_sequence(q, &mut seq);
    }
    seq
}

/// The sum's slices into argument 3, `[rows, padded K]`, each prologue core's at its columns,
/// issued before the rest's waits and waited for last.
fn sum_sequence(q: &QTiling, seq: &mut Vec<SeqOp>) {
    let (ex, pk, dev) = (exchange(q), q.tiling.padded.k, q.tiling.device);
    let first_wait = seq.iter().position(|op| matches!(op, SeqOp::Wait { .. })).unwrap_or(seq.len());
    let dmas = (0..q.split).map(|j| SeqOp::Dma {
        arg: 3,
        offset: j * ex.slice,
        sizes: [1, 1, ex.rows, ex.slice],
        strides: [0, 0, pk, 1],
        id: SUM_BD,
        fifo: sum_fifo(prologue_tile(dev, j)),
        issue_token: true,
    });
    seq.splice(first_wait..first_wait, dmas);
    seq.extend((0..q.split).map(|j| SeqOp::Wait { fifo: sum_fifo(prologue_tile(dev, j)) }));
}

/// The BD id of a sum's transfer on its column's shim: above those the weights' and outputs'
/// transfers take.
const SUM_BD: usize = 14;

/// One exchange round of a prologue core: its slot written by `fill`, then every slot combined
/// by `then` (or, with none, released untouched).
fn round(core: &Core, ex: Exchange, r: usize, (fill, then): (CoreOp, Option<&str>)) -> Vec<CoreOp> {
    let (slot, joined) = (format!("%slot{r}"), format!("%joined{r}"));
    let mut ops = vec![CoreOp::Acquire { res: slot, fifo: core.c.clone(), produce: true, ty: ex.slot_ty() }, fill];
    ops.push(CoreOp::Release { fifo: core.c.clone(), produce: true });
    ops.push(CoreOp::Acquire { res: joined.clone(), fifo: core.b.clone(), produce: false, ty: ex.slots_ty() });
    if let Some(combine) = then {
        let mut args = vec![(format!("{joined}_buf"), ex.slots_ty()), state(core, ex)];
        if ex.input.norm() && r == 1 {
            args.push(squares(core, ex));
        }
        ops.push(call(combine, args));
    }
    ops.push(CoreOp::Release { fifo: core.b.clone(), produce: false });
    ops
}

/// A prologue core's row state.
fn state(core: &Core, ex: Exchange) -> Operand {
    (format!("%rs_{}_{}", core.tile.0, core.tile.1), ex.rs_ty())
}

/// A norm-fed prologue core's squares' lanes.
fn squares(core: &Core, ex: Exchange) -> Operand {
    (format!("%ss_{}_{}", core.tile.0, core.tile.1), qkernels::squares_ty(ex.shape()))
}

/// A prologue core's body: the unsplit core's functions on its slice, a round of the exchange
/// after each partial maximum (with a norm's squares), then its codes into its last slot.
pub(super) fn prologue_ops(core: &Core, ex: Exchange) -> Vec<CoreOp> {
    let (c, r) = core.tile;
    let pc = |p: usize| (format!("%pc_{c}_{r}_{p}"), ex.shape().codes_ty());
    let slot = |r: usize| (format!("%slot{r}_buf"), ex.slot_ty());
    let share = |r: usize| {
        let mut args = vec![state(core, ex)];
        if ex.input.norm() {
            args.push(squares(core, ex));
        }
        args.push(slot(r));
        call(qkernels::SHARE, args)
    };
    let exchanged = |r: usize| round(core, ex, r, (share(r), Some(qkernels::COMBINE[r])));
    let reset = match ex.input {
        Input::Norm | Input::SumNorm => call(qkernels::NORM_RESET, vec![state(core, ex), squares(core, ex)]),
        _ => call(qkernels::RESET, vec![state(core, ex)]),
    };
    let mut ops = vec![reset];
    let (xs, gv) = (ex.shape(), (format!("%gv_{c}_{r}"), qkernels::gu_ty(ex.shape())));
    stream_pass(&mut ops, core, (xs, 0), &|_, x| {
        let mut ops = sum_ops(core, ex, &x);
        let phases = phases(ex, (x, gv.clone()), (state(core, ex), squares(core, ex)), &pc);
        for (r, phase) in phases.into_iter().enumerate() {
            if r > 0 {
                ops.extend(exchanged(r - 1));
            }
            ops.extend(phase);
        }
        ops
    });
    let mut args = vec![state(core, ex)];
    args.extend((0..ex.passes).map(pc));
    args.push(slot(ex.rounds() - 1));
    ops.extend(round(core, ex, ex.rounds() - 1, (call(qkernels::PACK, args), None)));
    ops
}

/// With a sum, a prologue core's first calls on its slice `x`: the residual stream's rows plus
/// the projection's, into `x` for the norm and out through its `H_<c>_<r>`.
fn sum_ops(core: &Core, ex: Exchange, x: &Operand) -> Vec<CoreOp> {
    if ex.input != Input::SumNorm {
        return vec![];
    }
    let fifo = sum_fifo(core.tile);
    let h = ("%h_buf".to_string(), qkernels::sum_ty(ex.shape()));
    vec![
        CoreOp::Acquire { res: "%h".into(), fifo: fifo.clone(), produce: true, ty: h.1.clone() },
        call(qkernels::SUM, vec![x.clone(), h]),
        CoreOp::Release { fifo, produce: true },
    ]
}

/// A prologue core's calls on its slice `x` between the exchange's rounds: one list before each
/// round of maxima and one after the last.
fn phases(
    ex: Exchange,
    (x, gv): (Operand, Operand),
    (rs, ss): (Operand, Operand),
    pc: &dyn Fn(usize) -> Operand,
) -> Vec<Vec<CoreOp>> {
    let two = ex.passes > 1;
    match ex.input {
        Input::Rows => {
            let mut first = vec![call(qkernels::SCALE[0], vec![rs.clone()])];
            first.push(call(qkernels::CODES, vec![x.clone(), rs.clone(), pc(0)]));
            let mut p = vec![vec![call(qkernels::ABSMAX, vec![x.clone(), rs.clone()])], first];
            if two {
                p[1].push(call(qkernels::RESIDUAL_MAX, vec![x.clone(), rs.clone(), pc(0)]));
                let scale = call(qkernels::SCALE[1], vec![rs.clone()]);
                p.push(vec![scale, call(qkernels::RESIDUAL, vec![x, rs, pc(0), pc(1)])]);
            }
            p
        }
        Input::Gate => {
            let values = call(qkernels::GATE_VALUES, vec![x, gv.clone()]);
            let mut p = vec![vec![values, call(qkernels::GATE_MAX, vec![gv.clone(), rs.clone()])]];
            let scale = call(qkernels::PRODUCT_SCALE[0], vec![rs.clone()]);
            p.push(vec![scale, call(qkernels::GATE_CODES, vec![gv.clone(), rs.clone(), pc(0)])]);
            if two {
                let scale = call(qkernels::PRODUCT_SCALE[1], vec![rs.clone()]);
                p.push(vec![scale, call(qkernels::GATE_RESIDUAL, vec![gv, rs, pc(1)])]);
            }
            p
        }
        Input::Norm | Input::SumNorm => {
            let top = call(qkernels::NORM_TOP, vec![x.clone(), rs.clone()]);
            let mut p = vec![vec![top, call(qkernels::PRODUCT_MAX, vec![x.clone(), rs.clone()])]];
            let scale = call(qkernels::PRODUCT_SCALE[0], vec![rs.clone()]);
            let codes = call(qkernels::PRODUCT_CODES, vec![x.clone(), rs.clone(), pc(0)]);
            p.push(vec![scale, codes, call(qkernels::NORM_SQUARES, vec![x.clone(), rs.clone(), ss.clone()])]);
            let mut last = vec![call(qkernels::NORM_ROOT, vec![rs.clone(), ss])];
            if two {
                last.push(call(qkernels::PRODUCT_SCALE[1], vec![rs.clone()]));
                last.push(call(qkernels::PRODUCT_RESIDUAL, vec![x, rs.clone(), pc(1)]));
            }
            last.push(call(qkernels::NORM_RESCALE, vec![rs]));
            p.push(last);
            p
        }
    }
}

/// A GEMV core's start: the maxima's rounds released untouched, then its codes and row state
/// from the last.
pub(super) fn unpack_ops(core: &Core, o: &Operands, (parts, ex): (usize, Exchange)) -> Vec<CoreOp> {
    let mut ops = vec![];
    for r in 0..ex.rounds() {
        let joined = format!("%joined{r}");
        ops.push(CoreOp::Acquire { res: joined.clone(), fifo: core.a.clone(), produce: false, ty: ex.slots_ty() });
        if r + 1 == ex.rounds() {
            let mut args = vec![(format!("{joined}_buf"), ex.slots_ty()), o.rs()];
            let passes = o.sh.buffered_passes();
            args.extend((0..passes).flat_map(|p| (0..parts).map(move |q| (p, q))).map(|(p, q)| o.codes(p, q)));
            ops.push(call(qkernels::UNPACK, args));
        }
        ops.push(CoreOp::Release { fifo: core.a.clone(), produce: false });
    }
    ops
}

/// Whether a prologue core's slice, slots and state (a gate's values, a norm's lanes) fit its
/// memory and banks.
pub(super) fn fits(device: Device, ex: Exchange) -> bool {
    let bank = device.core_data_bytes() / device.core_banks();
    let x = 4 * slice_of(ex).0.iter().product::<usize>();
    let extra = match ex.input {
        Input::Gate => x,
        Input::Norm => 4 * qkernels::NORM_LANES * ex.rows,
        // The sum's element besides the lanes.
        Input::SumNorm => 4 * (qkernels::NORM_LANES + ex.slice) * ex.rows,
        Input::Rows => 0,
    };
    let own = 4 * ex.state_words() * ex.rows + ex.passes * ex.rows * ex.slice + extra;
    let bytes = x + (1 + ex.cores) * ex.slot() + own;
    x <= bank && ex.cores * ex.slot() <= bank && bytes + device.core_stack_bytes() <= device.core_data_bytes()
}

/// The cycles before a split design's GEMV cores hold their codes: a prologue core's work on
/// its slice (`feed`'s, as an unsplit core's on one K part), each round of the exchange (its
/// slots' bytes streamed out and back, the row state written, the maxima combined), and a GEMV
/// core's unpacking.
pub(super) fn prologue_cycles(device: Device, (ex, feed): (Exchange, Feed)) -> u64 {
    use super::{COMBINE_CYCLES_PER_SLOT, EXCHANGE_ROUND_CYCLES, SHARE_CYCLES_PER_ROW, UNPACK_CYCLES_PER_BLOCK};
    let (rows, passes, cores) = (ex.rows as u64, ex.passes as u64, ex.cores as u64);
    let slice = super::prologue_cycles((ex.shape(), feed), 1);
    let bytes = ((1 + ex.cores) * ex.slot()) as u64;
    let share = SHARE_CYCLES_PER_ROW * rows * ex.state_words() as u64 / 4;
    let round = EXCHANGE_ROUND_CYCLES + bytes.div_ceil(device.stream_bytes_per_cycle() as u64) + share;
    let words: usize = (0..ex.rounds() - 1).map(|r| qkernels::exchange_maxima(ex, r).len()).sum();
    let lanes = u64::from(ex.input.norm());
    let combine = (words as u64 + lanes) * rows * cores * COMBINE_CYCLES_PER_SLOT;
    let codes = passes * rows * (ex.cores * ex.slice) as u64;
    let unpack = codes.div_ceil(qkernels::LANES as u64) * UNPACK_CYCLES_PER_BLOCK;
    slice + ex.rounds() as u64 * round + combine + unpack
}

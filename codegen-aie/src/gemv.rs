//! GEMV designs: a block of up to [`GEMV_ROWS`] activation rows against an int8 weight, for
//! decode, which reads every weight once per token and so is bound by how fast weights enter the
//! array, not by its MACs.
//!
//! Layout on a device with `C` columns of two shim DMA channels each ([`streams`]: 7 on npu1, 15
//! on npu2):
//! - `A` (shim of column 0 → every core, broadcast) carries the activation rows once, as `parts`
//!   elements of `rows × k` (K cut into parts, each element within one memory bank and one
//!   descriptor dimension); each core acquires all of them at its start and holds them to its end.
//!   When they do not fit a core beside its weight and output buffers (K past about 6,000 for 8
//!   rows), the shim sends them again for every output tile, double-buffered as the weights are
//!   ([`resident`]): the broadcast channel then carries `rows·K` bytes a tile against a weight
//!   stream's `n·K`.
//! - `W_<s>` (one shim channel → core `s`): every other shim channel streams one core its weight
//!   tiles, `n × k` elements of the weight transposed (B is `[N, K]` row-major, so each output
//!   column's K part is one contiguous run of DDR and the shim reads in long bursts). Core `s` owns
//!   the contiguous output columns `[s·tiles·n, (s+1)·tiles·n)`.
//! - `C_L1L2_<s>` takes each core's `rows × n` int32 tile to its column's mem tile, where the
//!   link joins the column's cores; `C_L2L3_<c>` streams the joined tiles back through the
//!   column's shim, which scatters each into the row-major `[rows, N]` output.
//!
//! A core, per output tile: zeroes its C tile (`gemv_zero_i32`), then per K part takes one weight
//! element and accumulates `C += A_part · W_tileᵀ` (`gemv_i8_i32`). Both are the design's own
//! functions ([`crate::kernels`]), int8 products summed in int32 as the GEMM designs compute, so
//! the A8W8 epilogue ([`crate::quant`]) is the same.
//!
//! The tiling type is the GEMM designs' ([`Tiling`]) with these meanings: `shape` the logical
//! `rows × K × N`, `padded` the host buffers (`padded.k = parts·k`, `padded.n = streams·tiles·n`),
//! `m` the rows, `k` one K part, `n` one core tile's columns, `rows` the cores of the busiest
//! column, `cols` the array columns.

use crate::design::{tile_var, Core, Design, Elem, Fifo, Kind, Link, SeqOp};
use crate::device::Device;
use crate::kernels::{self, GEMV, GEMV_ZERO};
use crate::tiling::{GemmShape, Tiling, TilingError, KERNEL_CALL_OVERHEAD_CYCLES};
use std::fmt::Write;

/// Rows of the GEMV designs: a decode step's one row, or a short verify block, zero-padded.
pub const GEMV_ROWS: usize = 8;

/// Bytes the shim DMA reads from DDR in one burst, an assumption of the cost model: a contiguous
/// run of the weight shorter than a whole number of bursts costs the bursts it touches.
pub const SHIM_BURST_BYTES: usize = 64;

/// Largest column tile a core computes at once.
const MAX_TILE_COLS: usize = 256;

/// Weight streams of a device: every shim memory-to-stream channel but the one carrying the
/// activations.
pub fn streams(device: Device) -> usize {
    device.columns() * device.shim_channels() - 1
}

/// The array column and compute row of weight stream `s`'s core: column 0 has one stream (its
/// other channel carries A), every other column as many as its shim has channels.
pub fn core_tile(device: Device, s: usize) -> (usize, usize) {
    let per = device.shim_channels();
    let (col, row) = if s < per - 1 { (0, s) } else { (1 + (s - (per - 1)) / per, (s - (per - 1)) % per) };
    (col, Device::FIRST_COMPUTE_ROW + row)
}

/// The weight streams (their cores) in array column `c`, in order.
pub(crate) fn column_streams(device: Device, c: usize) -> Vec<usize> {
    (0..streams(device)).filter(|&s| core_tile(device, s).0 == c).collect()
}

/// K parts and the length of one: each part's `rows × k` activation element fits one compute-tile
/// memory bank, and `k` one dimension of the shim descriptors that lay it out, a multiple of the
/// micro-tile's `s`.
fn k_parts(device: Device, rows: usize, k: usize) -> (usize, usize) {
    let s = device.micro_tile().1;
    let bank = device.core_data_bytes() / device.core_banks();
    let max_part = (device.shim_dma().max_size.min(bank / rows) / s) * s;
    let parts = k.div_ceil(max_part);
    (parts, k.div_ceil(parts).div_ceil(s) * s)
}

/// Bytes of a core's data memory with `a_buffers` activation buffers of `rows × k`, two weight
/// buffers of `n × k`, two output tiles and the stack.
fn core_bytes(device: Device, rows: usize, a_buffers: usize, (k, n): (usize, usize)) -> usize {
    a_buffers * rows * k + 2 * n * k + 2 * rows * n * 4 + device.core_stack_bytes()
}

/// Whether the activation rows stay resident in every core (every K part held at once, within
/// its memory and its buffer descriptors beside the weights' and outputs' two each), or are
/// streamed again with every output tile.
fn resident_fits(device: Device, rows: usize, parts: usize, (k, n): (usize, usize)) -> bool {
    core_bytes(device, rows, parts, (k, n)) <= device.core_data_bytes() && parts + 4 <= device.core_bds()
}

/// Whether a GEMV tiling keeps the activation rows resident (see the module doc).
pub fn resident(t: &Tiling) -> bool {
    resident_fits(t.device, t.m, parts_and_tiles(t).0, (t.k, t.n))
}

/// Output tiles per core (`tiles`) and their width `n` for a candidate.
fn tiles_for(device: Device, n_total: usize, n: usize) -> usize {
    n_total.div_ceil(streams(device) * n)
}

/// The cost and memory of one candidate tile width, if it fits.
fn evaluate(device: Device, shape: GemmShape, n: usize) -> Option<Tiling> {
    let (rows, (parts, k)) = (shape.m, k_parts(device, shape.m, shape.k));
    let tiles = tiles_for(device, shape.n, n);
    let bank = device.core_data_bytes() / device.core_banks();
    let resident = resident_fits(device, rows, parts, (k, n));
    let a_buffers = if resident { parts } else { 2 };
    let l1 = core_bytes(device, rows, a_buffers, (k, n));
    if n * k > bank || l1 > device.core_data_bytes() || tiles > device.shim_dma().max_repeat {
        return None;
    }
    let bpc = device.stream_bytes_per_cycle() as u64;
    let burst = k.div_ceil(SHIM_BURST_BYTES) * SHIM_BURST_BYTES;
    let weight_bytes = (tiles * parts * n * burst) as u64;
    let a_bytes = (if resident { 1 } else { tiles } * parts * rows * burst) as u64;
    let dma_cycles = weight_bytes.max(a_bytes).div_ceil(bpc);
    let per_call = (rows * n * k / device.macs_per_cycle()) as u64 + KERNEL_CALL_OVERHEAD_CYCLES;
    let compute_cycles = (tiles * parts) as u64 * per_call + tiles as u64 * (rows * n / 32) as u64;
    let first_in = ((a_buffers.min(parts) * rows * k + n * k) as u64).div_ceil(bpc);
    Some(tiling_of(device, shape, (parts, k, n, tiles), l1, (compute_cycles, dma_cycles, first_in)))
}

/// The tiling of a GEMV-family design on `shape.m` rows: `parts` K parts of `k`, `tiles` output
/// tiles of `n` columns a core, `l1` bytes of a core's memory, its compute and DMA cycles and the
/// cycles before its first tile can start (`first_in`); the last tiles' way out through the
/// busiest column's mem tile is added.
pub(crate) fn tiling_of(
    device: Device,
    shape: GemmShape,
    (parts, k, n, tiles): (usize, usize, usize, usize),
    l1: usize,
    (compute_cycles, dma_cycles, first_in): (u64, u64, u64),
) -> Tiling {
    let rows = shape.m;
    let per_column = (0..device.columns()).map(|c| column_streams(device, c).len()).max().unwrap_or(1);
    let fill = first_in + ((per_column * rows * n * 4) as u64).div_ceil(device.stream_bytes_per_cycle() as u64);
    let total_cycles = compute_cycles.max(dma_cycles) + fill;
    let padded = GemmShape { m: rows, k: parts * k, n: streams(device) * tiles * n };
    let peak = (device.macs_per_cycle() * device.compute_rows() * device.columns()) as f64 * total_cycles as f64;
    Tiling {
        device,
        shape,
        padded,
        m: rows,
        k,
        n,
        rows: per_column,
        cols: device.columns(),
        l1_bytes: l1,
        l2_bytes: 2 * per_column * rows * n * 4,
        compute_cycles,
        dma_cycles,
        total_cycles,
        utilisation: (shape.m * shape.k * shape.n) as f64 / peak,
    }
}

/// The fastest GEMV tiling of `shape` (`m` the rows, 1..=[`GEMV_ROWS`] or more if they fit)
/// whose design passes every check: among tile widths that fit, the fewest predicted cycles, then
/// the least padding.
pub fn choose(device: Device, shape: GemmShape) -> Result<Tiling, TilingError> {
    if shape.m == 0 || shape.k == 0 || shape.n == 0 {
        return Err(TilingError::Empty { shape });
    }
    let t = device.micro_tile().2;
    let mut fits: Vec<Tiling> = (t..=MAX_TILE_COLS).step_by(t).filter_map(|n| evaluate(device, shape, n)).collect();
    fits.sort_by(|a, b| a.total_cycles.cmp(&b.total_cycles).then(a.padded.n.cmp(&b.padded.n)));
    first_checked(fits, build, (shape, device))
}

/// The first of `candidates` (best first) whose design passes every check, else an error with the
/// first candidate's reason (or that none fits a core's memory).
pub(crate) fn first_checked<T>(
    candidates: Vec<T>,
    build: impl Fn(&T) -> Design,
    (shape, device): (GemmShape, Device),
) -> Result<T, TilingError> {
    let mut first_reason = None;
    for candidate in candidates {
        match crate::design::check(&build(&candidate)) {
            Ok(()) => return Ok(candidate),
            Err(e) => {
                first_reason.get_or_insert(e.to_string());
            }
        }
    }
    let reason = first_reason.unwrap_or_else(|| "no column tile fits a core's memory".into());
    Err(TilingError::NothingFits { shape, device, reason })
}

/// The design file's stem: `gemv_<rows>x<K>x<N>_<device>`.
pub fn design_name(t: &Tiling) -> String {
    format!("gemv_{}_{}", t.shape, t.device)
}

/// K parts and output tiles per core of a GEMV tiling.
pub fn parts_and_tiles(t: &Tiling) -> (usize, usize) {
    (t.padded.k / t.k, t.padded.n / (streams(t.device) * t.n))
}

/// The design of a GEMV tiling.
pub fn build(t: &Tiling) -> Design {
    let (parts, tiles) = parts_and_tiles(t);
    let dev = t.device;
    let mut fifos = vec![];
    let mut links = vec![];
    input_fifos(t, parts, &mut fifos);
    output_fifos(t, Elem::I32, &mut fifos, &mut links);
    let cores = (0..streams(dev))
        .map(|s| Core {
            tile: core_tile(dev, s),
            a: "A".into(),
            b: format!("W_{s}"),
            c: format!("C_L1L2_{s}"),
            tiles,
            k_steps: parts,
            calls: vec![GEMV_ZERO.into(), GEMV.into()],
            prologue: false,
        })
        .collect();
    let p = t.padded;
    Design {
        kind: Kind::Gemv,
        name: design_name(t),
        tiling: t.clone(),
        tiles: tiles_used(dev),
        fifos,
        links,
        buffers: vec![],
        functions: kernels::gemv_functions(t.device, (t.m, t.k, t.n)),
        cores,
        args: vec![(p.m * p.k, Elem::I8), (p.n * p.k, Elem::I8), (p.m * p.n, Elem::I32)],
        seq: runtime_sequence(t),
    }
}

/// Each column's shim and mem tile, then the compute tiles of the weight streams.
pub(crate) fn tiles_used(device: Device) -> Vec<(usize, usize)> {
    let mut tiles = vec![];
    for c in 0..device.columns() {
        tiles.push((c, Device::SHIM_ROW));
        tiles.push((c, Device::MEM_TILE_ROW));
    }
    tiles.extend((0..streams(device)).map(|s| core_tile(device, s)));
    tiles
}

/// `A`, broadcast from column 0's shim to every core with a buffer per K part, and each core's
/// weight stream from its column's shim.
fn input_fifos(t: &Tiling, parts: usize, fifos: &mut Vec<Fifo>) {
    let depth = if resident(t) { parts } else { 2 };
    fifos.extend(stream_fifos(t.device, ("A", depth, Elem::I8), vec![t.m, t.k], vec![t.n, t.k]));
}

/// The activations' FIFO (`name`, `depth`, `elem`) broadcast from column 0's shim to every core
/// in elements of `a_shape`, and each core's weight stream `W_<s>` from its column's shim in
/// double-buffered int8 elements of `w_shape`.
pub(crate) fn stream_fifos(
    dev: Device,
    (name, depth, elem): (&str, usize, Elem),
    a_shape: Vec<usize>,
    w_shape: Vec<usize>,
) -> Vec<Fifo> {
    let cores: Vec<(usize, usize)> = (0..streams(dev)).map(|s| core_tile(dev, s)).collect();
    let a = Fifo {
        name: name.into(),
        producer: (0, Device::SHIM_ROW),
        consumers: cores.clone(),
        depth,
        shape: a_shape,
        elem,
        to_stream: vec![],
    };
    let weights = cores.iter().enumerate().map(|(s, &core)| Fifo {
        name: format!("W_{s}"),
        producer: (core.0, Device::SHIM_ROW),
        consumers: vec![core],
        depth: 2,
        shape: w_shape.clone(),
        elem: Elem::I8,
        to_stream: vec![],
    });
    std::iter::once(a).chain(weights).collect()
}

/// Each core's output tile (of `elem`s) to its column's mem tile, joined there (a one-to-one
/// link for a column of one core) and streamed to the column's shim.
pub(crate) fn output_fifos(t: &Tiling, elem: Elem, fifos: &mut Vec<Fifo>, links: &mut Vec<Link>) {
    let dev = t.device;
    let tile_elems = t.m * t.n;
    for c in 0..dev.columns() {
        let column = column_streams(dev, c);
        for &s in &column {
            fifos.push(Fifo {
                name: format!("C_L1L2_{s}"),
                producer: core_tile(dev, s),
                consumers: vec![(c, Device::MEM_TILE_ROW)],
                depth: 2,
                shape: vec![t.m, t.n],
                elem,
                to_stream: vec![],
            });
        }
        fifos.push(Fifo {
            name: format!("C_L2L3_{c}"),
            producer: (c, Device::MEM_TILE_ROW),
            consumers: vec![(c, Device::SHIM_ROW)],
            depth: 2,
            shape: vec![column.len() * tile_elems],
            elem,
            to_stream: vec![],
        });
        let joined = column.len() > 1;
        links.push(Link {
            inputs: column.iter().map(|s| format!("C_L1L2_{s}")).collect(),
            outputs: vec![format!("C_L2L3_{c}")],
            src_offsets: if joined { (0..column.len()).map(|r| r * tile_elems).collect() } else { vec![] },
            dst_offsets: vec![],
        });
    }
}

/// The runtime sequence: A once (resident) or once per output tile, each core its weight tiles
/// (`[tiles, parts, n, k]` of the transposed weight), see [`stream_sequence`].
fn runtime_sequence(t: &Tiling) -> Vec<SeqOp> {
    let (parts, tiles) = parts_and_tiles(t);
    let (p, rows, k, n) = (t.padded, t.m, t.k, t.n);
    let repeat = if resident(t) { 1 } else { tiles };
    let a = (0, 0, [repeat, parts, rows, k], [0, k, p.k, 1]);
    let w = |s: usize| (1, s * tiles * n * p.k, [tiles, parts, n, k], [n * p.k, k, p.k, 1]);
    stream_sequence(t, tiles, ("A", a), &w)
}

/// One transfer of a runtime sequence: the host argument, its offset, sizes and strides.
pub(crate) type Transfer = (usize, usize, [usize; 4], [usize; 4]);

/// The runtime sequence of a GEMV-family design: per column its output readback (argument 2,
/// each core's tiles into the row-major `[rows, N]` output), then (column 0) the activations'
/// transfer on `a_fifo` and each of the column's weight streams (`weights(s)` on `W_<s>`), every
/// transfer one descriptor; then a wait on each.
pub(crate) fn stream_sequence(
    t: &Tiling,
    tiles: usize,
    (a_fifo, a): (&str, Transfer),
    weights: &dyn Fn(usize) -> Transfer,
) -> Vec<SeqOp> {
    let dev = t.device;
    let (p, rows, n) = (t.padded, t.m, t.n);
    let mut seq = vec![];
    let mut waits = vec![];
    for c in 0..dev.columns() {
        let column = column_streams(dev, c);
        let readback = (2, column[0] * tiles * n, [tiles, column.len(), rows, n], [n, tiles * n, p.n, 1]);
        let mut ops = vec![(format!("C_L2L3_{c}"), readback, false)];
        if c == 0 {
            ops.push((a_fifo.to_string(), a, true));
        }
        ops.extend(column.iter().map(|&s| (format!("W_{s}"), weights(s), true)));
        for (id, (fifo, (arg, offset, sizes, strides), issue_token)) in ops.into_iter().enumerate() {
            seq.push(SeqOp::Dma { arg, offset, sizes, strides, id, fifo: fifo.clone(), issue_token });
            waits.push(SeqOp::Wait { fifo });
        }
    }
    seq.extend(waits);
    seq
}

/// The generic-form lines of GEMV core operations.
struct GenericOps {
    ta: String,
    tw: String,
    tc: String,
}

impl GenericOps {
    fn acquire(res: &str, fifo: &str, port: u8, size: usize, ty: &str) -> String {
        format!(
            "{res} = \"aie.objectfifo.acquire\"() {{objFifo_name = @{fifo}, port = {port} : i32, size = {size} : i32}} : () -> !aie.objectfifosubview<{ty}>"
        )
    }
    fn access(res: &str, of: &str, index: usize, ty: &str) -> String {
        format!(
            "{res} = \"aie.objectfifo.subview.access\"({of}) {{index = {index} : i32}} : (!aie.objectfifosubview<{ty}>) -> {ty}"
        )
    }
    fn release(fifo: &str, port: u8, size: usize) -> String {
        format!(
            "\"aie.objectfifo.release\"() {{objFifo_name = @{fifo}, port = {port} : i32, size = {size} : i32}} : () -> ()"
        )
    }

    /// One K part of one output tile: its activation part (acquired here unless resident), one
    /// weight element, the kernel call.
    fn part(&self, o: &mut String, core: &Core, p: usize, resident: bool) {
        let (ta, tw, tc) = (&self.ta, &self.tw, &self.tc);
        let sp = "        ";
        if !resident {
            let _ = writeln!(o, "{sp}{}", Self::acquire(&format!("%as{p}"), &core.a, 1, 1, ta));
            let _ = writeln!(o, "{sp}{}", Self::access(&format!("%a{p}"), &format!("%as{p}"), 0, ta));
        }
        let _ = writeln!(o, "{sp}{}", Self::acquire(&format!("%w{p}"), &core.b, 1, 1, tw));
        let _ = writeln!(o, "{sp}{}", Self::access(&format!("%wbuf{p}"), &format!("%w{p}"), 0, tw));
        let _ =
            writeln!(o, "{sp}\"func.call\"(%a{p}, %wbuf{p}, %cbuf) {{callee = @{GEMV}}} : ({ta}, {tw}, {tc}) -> ()");
        let _ = writeln!(o, "{sp}{}", Self::release(&core.b, 1, 1));
        if !resident {
            let _ = writeln!(o, "{sp}{}", Self::release(&core.a, 1, 1));
        }
    }
}

/// A GEMV core's body in generic form: acquire every K part of A (when resident), then per
/// output tile zero C and accumulate one weight element per part into it.
pub(crate) fn generic_core(d: &Design, core: &Core, o: &mut String) {
    let t = &d.tiling;
    let [ta, tw, tc] = kernels::gemv_types((t.m, t.k, t.n));
    let ops = GenericOps { ta, tw, tc };
    let resident = resident(t);
    let (c, r) = core.tile;
    let _ = writeln!(o, "    %core_{c}_{r} = \"aie.core\"({}) ({{", tile_var(core.tile));
    let _ = writeln!(o, "      %c0 = \"arith.constant\"() {{value = 0 : index}} : () -> index");
    let _ = writeln!(o, "      %c1 = \"arith.constant\"() {{value = 1 : index}} : () -> index");
    let _ = writeln!(o, "      %ctiles = \"arith.constant\"() {{value = {} : index}} : () -> index", core.tiles);
    if resident {
        let _ = writeln!(o, "      {}", GenericOps::acquire("%a", &core.a, 1, core.k_steps, &ops.ta));
        for p in 0..core.k_steps {
            let _ = writeln!(o, "      {}", GenericOps::access(&format!("%a{p}"), "%a", p, &ops.ta));
        }
    }
    let _ = writeln!(o, "      \"scf.for\"(%c0, %ctiles, %c1) ({{\n      ^bb0(%tile: index):");
    let _ = writeln!(o, "        {}", GenericOps::acquire("%c", &core.c, 0, 1, &ops.tc));
    let _ = writeln!(o, "        {}", GenericOps::access("%cbuf", "%c", 0, &ops.tc));
    let _ = writeln!(o, "        \"func.call\"(%cbuf) {{callee = @{GEMV_ZERO}}} : ({}) -> ()", ops.tc);
    for p in 0..core.k_steps {
        ops.part(o, core, p, resident);
    }
    let _ = writeln!(o, "        {}", GenericOps::release(&core.c, 0, 1));
    let _ = writeln!(o, "        \"scf.yield\"() : () -> ()\n      }}) : (index, index, index) -> ()");
    if resident {
        let _ = writeln!(o, "      {}", GenericOps::release(&core.a, 1, core.k_steps));
    }
    let _ = writeln!(o, "      \"aie.end\"() : () -> ()");
    let _ = writeln!(o, "    }}) {{stack_size = {} : i32}} : (index) -> index", t.device.core_stack_bytes());
}

/// A GEMV core's body in custom form (see [`generic_core`]).
pub(crate) fn pretty_core(d: &Design, core: &Core, o: &mut String) {
    let t = &d.tiling;
    let [ta, tw, tc] = kernels::gemv_types((t.m, t.k, t.n));
    let sub = |ty: &str| format!("!aie.objectfifosubview<{ty}>");
    let resident = resident(t);
    let (c, r) = core.tile;
    let _ = writeln!(o, "    %core_{c}_{r} = aie.core({}) {{", tile_var(core.tile));
    let _ = writeln!(o, "      %c0 = arith.constant 0 : index\n      %c1 = arith.constant 1 : index");
    let _ = writeln!(o, "      %ctiles = arith.constant {} : index", core.tiles);
    if resident {
        let _ = writeln!(o, "      %a = aie.objectfifo.acquire @{}(Consume, {}) : {}", core.a, core.k_steps, sub(&ta));
        for p in 0..core.k_steps {
            let _ = writeln!(o, "      %a{p} = aie.objectfifo.subview.access %a[{p}] : {} -> {ta}", sub(&ta));
        }
    }
    let _ = writeln!(o, "      scf.for %tile = %c0 to %ctiles step %c1 {{");
    let _ = writeln!(o, "        %c = aie.objectfifo.acquire @{}(Produce, 1) : {}", core.c, sub(&tc));
    let _ = writeln!(o, "        %cbuf = aie.objectfifo.subview.access %c[0] : {} -> {tc}", sub(&tc));
    let _ = writeln!(o, "        func.call @{GEMV_ZERO}(%cbuf) : ({tc}) -> ()");
    for p in 0..core.k_steps {
        if !resident {
            let _ = writeln!(o, "        %as{p} = aie.objectfifo.acquire @{}(Consume, 1) : {}", core.a, sub(&ta));
            let _ = writeln!(o, "        %a{p} = aie.objectfifo.subview.access %as{p}[0] : {} -> {ta}", sub(&ta));
        }
        let _ = writeln!(o, "        %w{p} = aie.objectfifo.acquire @{}(Consume, 1) : {}", core.b, sub(&tw));
        let _ = writeln!(o, "        %wbuf{p} = aie.objectfifo.subview.access %w{p}[0] : {} -> {tw}", sub(&tw));
        let _ = writeln!(o, "        func.call @{GEMV}(%a{p}, %wbuf{p}, %cbuf) : ({ta}, {tw}, {tc}) -> ()");
        let _ = writeln!(o, "        aie.objectfifo.release @{}(Consume, 1)", core.b);
        if !resident {
            let _ = writeln!(o, "        aie.objectfifo.release @{}(Consume, 1)", core.a);
        }
    }
    let _ = writeln!(o, "        aie.objectfifo.release @{}(Produce, 1)", core.c);
    let _ = writeln!(o, "      }}");
    if resident {
        let _ = writeln!(o, "      aie.objectfifo.release @{}(Consume, {})", core.a, core.k_steps);
    }
    let _ = writeln!(o, "      aie.end");
    let _ = writeln!(o, "    }} {{stack_size = {} : i32}}", t.device.core_stack_bytes());
}

//! One MLIR-AIE design per tiling: its structure ([`Design`]), mlir-aie's rules and the
//! resource checks on it ([`check`], from [`crate::rules`]), and its two texts: the generic
//! operation form ([`Design::generic`], parseable by MLIR with unregistered dialects; this is what
//! the interpreter reads) and the readable custom form mlir-aie's tools take ([`Design::pretty`]).
//!
//! Layout of a design on `rows × cols` compute tiles:
//! - `A_L3L2` (shim of column 0 → mem tile of column 0) carries, per K step, the `rows·m × k` slab
//!   of A; the link distributes it to `A_L2L1_<r>`, one per row of cores, broadcast across the
//!   columns, whose mem-tile DMA pre-tiles each `m × k` part into r×s micro-blocks.
//! - `B_L3L2_<c>` (shim of column c → its mem tile) carries `k × n` tiles of B; `B_L2L1_<c>` is
//!   broadcast down the column and pre-tiled into s×t micro-blocks.
//! - `C_L1L2_<c>_<r>` takes each core's `m × n` int32 tile (r×t micro-blocks) to its column's mem
//!   tile; the link joins the rows, and `C_L2L3_<c>` streams the `rows·m × n` block back to the
//!   shim in row-major order. mlir-aie lowers a join's output pattern once per input transfer, so
//!   the pattern re-lays one core's `m × n` tile row-major inside its own transfer, and the
//!   joined stream is the tiles one after the other: the block, row-major.
//! - Each core zeroes its C tile, accumulates `k_steps` calls of the int8 kernel into it, and
//!   releases it, once per output tile it owns. Both functions are the design's own, with bodies
//!   ([`crate::kernels`]); the L1 FIFOs' memref types are the blocked layouts they index. The runtime sequence moves, for every (row block, column
//!   block), C's readback, A's slab and B's tiles, and waits every few blocks so no shim tile ever
//!   has more buffer descriptors in flight than it holds.

use crate::device::Device;
use crate::kernels::{self, Function};
use crate::tiling::Tiling;
use std::fmt::Write;

pub use crate::kernels::{MATMUL as MATMUL_KERNEL, ZERO as ZERO_KERNEL};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    I8,
    I32,
    F32,
}

impl Elem {
    pub fn bytes(self) -> usize {
        match self {
            Elem::I8 => 1,
            Elem::I32 | Elem::F32 => 4,
        }
    }
    pub fn mlir(self) -> &'static str {
        match self {
            Elem::I8 => "i8",
            Elem::I32 => "i32",
            Elem::F32 => "f32",
        }
    }
}

pub type Tile = (usize, usize);

#[derive(Clone, Debug)]
pub struct Fifo {
    pub name: String,
    pub producer: Tile,
    pub consumers: Vec<Tile>,
    pub depth: usize,
    pub shape: Vec<usize>,
    pub elem: Elem,
    /// The producer DMA's access pattern (size, stride) outermost first; empty: linear.
    pub to_stream: Vec<(usize, usize)>,
}

impl Fifo {
    pub fn elems(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn memref(&self) -> String {
        memref(&self.shape, self.elem)
    }
}

/// A core's own buffer (`aie.buffer`), which only its core reads and writes.
#[derive(Clone, Debug)]
pub struct Buffer {
    pub tile: Tile,
    /// Its symbol; its SSA value is `%` and the same name.
    pub name: String,
    pub shape: Vec<usize>,
    pub elem: Elem,
}

impl Buffer {
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.elem.bytes()
    }
    pub fn memref(&self) -> String {
        memref(&self.shape, self.elem)
    }
}

#[derive(Clone, Debug)]
pub struct Link {
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub src_offsets: Vec<usize>,
    pub dst_offsets: Vec<usize>,
}

#[derive(Clone, Debug)]
pub struct Core {
    pub tile: Tile,
    pub a: String,
    pub b: String,
    pub c: String,
    pub tiles: usize,
    pub k_steps: usize,
    /// The functions its body calls, each defined with a body in [`Design::functions`].
    pub calls: Vec<String>,
    /// A qgemv prologue core ([`crate::qgemv::split`]): it quantises a slice of the rows and
    /// computes no outputs (`a` its slice's FIFO, `b` the exchange's broadcast, `c` its slot's).
    pub prologue: bool,
}

#[derive(Clone, Debug)]
pub enum SeqOp {
    Dma {
        arg: usize,
        offset: usize,
        sizes: [usize; 4],
        strides: [usize; 4],
        id: usize,
        fifo: String,
        issue_token: bool,
    },
    Wait {
        fifo: String,
    },
}

/// What a design computes: a GEMM M-block, or a GEMV block over streamed weights
/// ([`crate::gemv`], whose tiling fields say what they mean there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gemm,
    Gemv,
    /// A GEMV whose cores quantise their activation rows in `passes` and dequantise their
    /// outputs, its GEMV kernel on `kernel_rows` ([`crate::qgemv`]); `input` says what the rows
    /// are: activations, a norm's input (γ riding in each `X` element, the cores computing the
    /// norm), or a gate's and up's rows (the cores computing the gate); with `kept` the gate's
    /// values stay in the cores, so the rows stream once; with `pairs` each output sums a
    /// weight's two passes.
    QGemv {
        passes: usize,
        kernel_rows: usize,
        input: crate::qkernels::Input,
        kept: bool,
        pairs: bool,
        /// Prologue cores the quantisation is split across (0: every core quantises the whole
        /// row itself).
        split: usize,
        /// Both passes' codes as rows of one buffer and one GEMV call ([`crate::qkernels::Shape::stacked`]).
        stacked: bool,
    },
}

#[derive(Clone, Debug)]
pub struct Design {
    pub kind: Kind,
    pub tiling: Tiling,
    pub name: String,
    pub tiles: Vec<Tile>,
    pub fifos: Vec<Fifo>,
    pub links: Vec<Link>,
    /// The cores' own buffers.
    pub buffers: Vec<Buffer>,
    /// The cores' code ([`crate::kernels`]).
    pub functions: Vec<Function>,
    pub cores: Vec<Core>,
    /// Runtime-sequence arguments: A, B (int8) and C (int32), flat.
    pub args: Vec<(usize, Elem)>,
    pub seq: Vec<SeqOp>,
}

pub fn memref(shape: &[usize], elem: Elem) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("memref<{}x{}>", dims.join("x"), elem.mlir())
}

/// The design file's stem for a tiling: `gemm_<M>x<K>x<N>_<device>`.
pub fn design_name(t: &Tiling) -> String {
    format!("gemm_{}_{}", t.shape, t.device)
}

/// Column blocks issued between waits: the shim tile of column 0 uses three descriptors per block
/// (A, its B, its C), and every shim tile has `shim_bds` of them.
fn blocks_per_wait(device: Device) -> usize {
    device.shim_bds() / 3
}

/// The design of a tiling.
pub fn build(t: &Tiling) -> Design {
    let mut fifos = vec![];
    let mut links = vec![];
    a_fifos(t, &mut fifos, &mut links);
    b_fifos(t, &mut fifos, &mut links);
    c_fifos(t, &mut fifos, &mut links);
    let p = t.padded;
    Design {
        kind: Kind::Gemm,
        name: design_name(t),
        tiling: t.clone(),
        tiles: tiles(t),
        fifos,
        links,
        buffers: vec![],
        functions: kernels::core_functions(t.device, (t.m, t.k, t.n)),
        cores: cores(t),
        args: vec![(p.m * p.k, Elem::I8), (p.k * p.n, Elem::I8), (p.m * p.n, Elem::I32)],
        seq: runtime_sequence(t),
    }
}

/// Every tile the design uses: each column's shim and mem tile, then the compute tiles column by
/// column.
fn tiles(t: &Tiling) -> Vec<Tile> {
    let mut tiles = vec![];
    for c in 0..t.cols {
        tiles.push((c, Device::SHIM_ROW));
        tiles.push((c, Device::MEM_TILE_ROW));
    }
    for c in 0..t.cols {
        for rr in 0..t.rows {
            tiles.push((c, Device::FIRST_COMPUTE_ROW + rr));
        }
    }
    tiles
}

/// A's FIFOs: the shim's `rows·m × k` slab into column 0's mem tile, distributed to one FIFO per
/// row of cores (broadcast across the columns, pre-tiled into r×s micro-blocks).
fn a_fifos(t: &Tiling, fifos: &mut Vec<Fifo>, links: &mut Vec<Link>) {
    let (r, s, _) = t.device.micro_tile();
    let (rows, cols, m, k) = (t.rows, t.cols, t.m, t.k);
    let row0 = Device::FIRST_COMPUTE_ROW;
    fifos.push(Fifo {
        name: "A_L3L2".into(),
        producer: (0, 0),
        consumers: vec![(0, 1)],
        depth: 2,
        shape: vec![rows * m * k],
        elem: Elem::I8,
        to_stream: vec![],
    });
    for rr in 0..rows {
        fifos.push(Fifo {
            name: format!("A_L2L1_{rr}"),
            producer: (0, 1),
            consumers: (0..cols).map(|c| (c, row0 + rr)).collect(),
            depth: 2,
            shape: kernels::blocked_shapes(t.device, (m, k, t.n))[0].clone(),
            elem: Elem::I8,
            to_stream: vec![(m / r, r * k), (k / s, s), (r, k), (s, 1)],
        });
    }
    links.push(Link {
        inputs: vec!["A_L3L2".into()],
        outputs: (0..rows).map(|rr| format!("A_L2L1_{rr}")).collect(),
        src_offsets: vec![],
        dst_offsets: (0..rows).map(|rr| rr * m * k).collect(),
    });
}

/// B's FIFOs, per column: the shim's `k × n` tiles into the column's mem tile, broadcast down the
/// column pre-tiled into s×t micro-blocks.
fn b_fifos(t: &Tiling, fifos: &mut Vec<Fifo>, links: &mut Vec<Link>) {
    let (_, s, tt) = t.device.micro_tile();
    let (k, n) = (t.k, t.n);
    let row0 = Device::FIRST_COMPUTE_ROW;
    for c in 0..t.cols {
        fifos.push(Fifo {
            name: format!("B_L3L2_{c}"),
            producer: (c, 0),
            consumers: vec![(c, 1)],
            depth: 2,
            shape: vec![k * n],
            elem: Elem::I8,
            to_stream: vec![],
        });
        fifos.push(Fifo {
            name: format!("B_L2L1_{c}"),
            producer: (c, 1),
            consumers: (0..t.rows).map(|rr| (c, row0 + rr)).collect(),
            depth: 2,
            shape: kernels::blocked_shapes(t.device, (t.m, k, n))[1].clone(),
            elem: Elem::I8,
            to_stream: vec![(k / s, s * n), (n / tt, tt), (s, n), (tt, 1)],
        });
        links.push(Link {
            inputs: vec![format!("B_L3L2_{c}")],
            outputs: vec![format!("B_L2L1_{c}")],
            src_offsets: vec![],
            dst_offsets: vec![],
        });
    }
}

/// C's FIFOs, per column: each core's `m × n` int32 tile into the column's mem tile, joined by
/// row and streamed back to the shim in row-major order. The output's access pattern addresses
/// one core's tile (one join input's transfer), which is all mlir-aie lets it address.
fn c_fifos(t: &Tiling, fifos: &mut Vec<Fifo>, links: &mut Vec<Link>) {
    let (r, _, tt) = t.device.micro_tile();
    let (rows, m, n) = (t.rows, t.m, t.n);
    let row0 = Device::FIRST_COMPUTE_ROW;
    for c in 0..t.cols {
        for rr in 0..rows {
            fifos.push(Fifo {
                name: format!("C_L1L2_{c}_{rr}"),
                producer: (c, row0 + rr),
                consumers: vec![(c, 1)],
                depth: 2,
                shape: kernels::blocked_shapes(t.device, (m, t.k, n))[2].clone(),
                elem: Elem::I32,
                to_stream: vec![],
            });
        }
        fifos.push(Fifo {
            name: format!("C_L2L3_{c}"),
            producer: (c, 1),
            consumers: vec![(c, 0)],
            depth: 2,
            shape: vec![rows * m * n],
            elem: Elem::I32,
            to_stream: vec![(m / r, r * n), (r, tt), (n / tt, r * tt), (tt, 1)],
        });
        links.push(Link {
            inputs: (0..rows).map(|rr| format!("C_L1L2_{c}_{rr}")).collect(),
            outputs: vec![format!("C_L2L3_{c}")],
            src_offsets: (0..rows).map(|rr| rr * m * n).collect(),
            dst_offsets: vec![],
        });
    }
}

/// One core per compute tile, column by column.
fn cores(t: &Tiling) -> Vec<Core> {
    let mut cores = vec![];
    for c in 0..t.cols {
        for rr in 0..t.rows {
            cores.push(Core {
                tile: (c, Device::FIRST_COMPUTE_ROW + rr),
                a: format!("A_L2L1_{rr}"),
                b: format!("B_L2L1_{c}"),
                c: format!("C_L1L2_{c}_{rr}"),
                tiles: t.tiles_per_core(),
                k_steps: t.k_steps(),
                calls: vec![ZERO_KERNEL.into(), MATMUL_KERNEL.into()],
                prologue: false,
            });
        }
    }
    cores
}

/// The runtime sequence: for every row block, the column blocks in batches of
/// [`blocks_per_wait`], each batch's DMAs followed by a wait on every FIFO they used.
fn runtime_sequence(t: &Tiling) -> Vec<SeqOp> {
    let (mb, nb) = t.blocks();
    let per_wait = blocks_per_wait(t.device);
    let mut seq = vec![];
    for i in 0..mb {
        let mut j = 0;
        while j < nb {
            let batch = per_wait.min(nb - j);
            batch_dmas(t, i, j..j + batch, &mut seq);
            batch_waits(t.cols, &mut seq);
            j += batch;
        }
    }
    seq
}

/// The DMAs of the column blocks `blocks` of row block `i`: per block, every column's C
/// readback, A's slab, then every column's B tiles, with shim BD ids counted per column from 0.
fn batch_dmas(t: &Tiling, i: usize, blocks: std::ops::Range<usize>, seq: &mut Vec<SeqOp>) {
    let (rows, cols, m, k, n) = (t.rows, t.cols, t.m, t.k, t.n);
    let p = t.padded;
    let mut next_id = vec![0usize; cols];
    for jj in blocks {
        for (c, next) in next_id.iter_mut().enumerate() {
            let col = (jj * cols + c) * n;
            let id = *next;
            *next += 1;
            seq.push(SeqOp::Dma {
                arg: 2,
                offset: i * rows * m * p.n + col,
                sizes: [1, 1, rows * m, n],
                strides: [0, 0, p.n, 1],
                id,
                fifo: format!("C_L2L3_{c}"),
                issue_token: false,
            });
        }
        let id = next_id[0];
        next_id[0] += 1;
        seq.push(SeqOp::Dma {
            arg: 0,
            offset: i * rows * m * p.k,
            sizes: [1, p.k / k, rows * m, k],
            strides: [0, k, p.k, 1],
            id,
            fifo: "A_L3L2".into(),
            issue_token: true,
        });
        for (c, next) in next_id.iter_mut().enumerate() {
            let col = (jj * cols + c) * n;
            let id = *next;
            *next += 1;
            seq.push(SeqOp::Dma {
                arg: 1,
                offset: col,
                sizes: [1, p.k / k, k, n],
                strides: [0, k * p.n, p.n, 1],
                id,
                fifo: format!("B_L3L2_{c}"),
                issue_token: true,
            });
        }
    }
}

/// A wait on every shim FIFO of a batch: each column's C, A, then each column's B.
fn batch_waits(cols: usize, seq: &mut Vec<SeqOp>) {
    let c_fifos = (0..cols).map(|c| format!("C_L2L3_{c}"));
    let b_fifos = (0..cols).map(|c| format!("B_L3L2_{c}"));
    for fifo in c_fifos.chain(["A_L3L2".to_string()]).chain(b_fifos) {
        seq.push(SeqOp::Wait { fifo });
    }
}

pub use crate::rules::{check, check_pattern, PatternError, ResourceError, Rule};

fn dims_attr(dims: &[(usize, usize)]) -> String {
    let parts: Vec<String> = dims.iter().map(|(s, t)| format!("<size = {s}, stride = {t}>")).collect();
    parts.join(", ")
}

/// `a, b, c`.
fn usize_list(v: &[usize]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

pub(crate) fn tile_var(t: Tile) -> String {
    format!("%tile_{}_{}", t.0, t.1)
}

/// An `I64ArrayAttr` (`[0 : i64, 512 : i64]`), the type `aie.objectfifo.link`'s offsets have;
/// not the dense `array<i64: ...>` form, which its verifier refuses.
fn i64_array_attr(v: &[usize]) -> String {
    format!("[{}]", v.iter().map(|x| format!("{x} : i64")).collect::<Vec<_>>().join(", "))
}

/// A `DenseI64ArrayAttr` (`array<i64: 0, 512>`), the type of the runtime DMAs' static offsets,
/// sizes and strides.
fn i64_array(v: &[usize]) -> String {
    if v.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
    }
}

/// The `aie.device` enum value of a device in the generic form.
pub(crate) fn device_enum(d: Device) -> u32 {
    match d {
        Device::Npu1 => 4,
        Device::Npu2 => 8,
    }
}

impl Design {
    /// The memref types of a core's A, B and C tiles: the blocked layouts the kernels index.
    fn kernel_types(&self) -> (String, String, String) {
        let t = &self.tiling;
        let [a, b, c] = kernels::tile_types(t.device, (t.m, t.k, t.n));
        (a, b, c)
    }

    fn module_attrs(&self) -> String {
        let t = &self.tiling;
        let kind = match self.kind {
            Kind::Gemm => "gemm",
            Kind::Gemv => "gemv",
            Kind::QGemv { .. } => "qgemv",
        };
        format!(
            "npuc.design = \"{kind}\", npuc.gemm_shape = {}, npuc.padded_shape = {}, npuc.tile = {}",
            i64_array(&[t.shape.m, t.shape.k, t.shape.n]),
            i64_array(&[t.padded.m, t.padded.k, t.padded.n]),
            i64_array(&[t.m, t.k, t.n])
        )
    }

    /// The generic operation form: every operation as `"dialect.op"(operands) ({regions}) {attrs}
    /// : type`, parseable by MLIR without the AIE dialects.
    pub fn generic(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "\"builtin.module\"() ({{");
        self.generic_device(&mut o);
        let _ = writeln!(o, "}}) {{{}}} : () -> ()", self.module_attrs());
        o
    }

    /// The design's `aie.device` operation in generic form (`sym_name` its name).
    pub fn generic_device(&self, o: &mut String) {
        let t = &self.tiling;
        let _ = writeln!(o, "  \"aie.device\"() ({{");
        self.generic_kernels_and_tiles(o);
        self.generic_fifos(o);
        for core in &self.cores {
            self.generic_core(o, core);
        }
        self.generic_sequence(o);
        let _ = writeln!(o, "    \"aie.end\"() : () -> ()");
        let _ =
            writeln!(o, "  }}) {{device = {} : i32, sym_name = \"{}\"}} : () -> ()", device_enum(t.device), self.name);
    }

    /// The cores' functions and the tiles, in generic form.
    fn generic_kernels_and_tiles(&self, o: &mut String) {
        for f in &self.functions {
            o.push_str(&f.generic(4));
        }
        for &tile in &self.tiles {
            let _ = writeln!(
                o,
                "    {} = \"aie.tile\"() {{col = {} : i32, row = {} : i32}} : () -> index",
                tile_var(tile),
                tile.0,
                tile.1
            );
        }
        for b in &self.buffers {
            let _ = writeln!(
                o,
                "    %{0} = \"aie.buffer\"({1}) {{sym_name = \"{0}\"}} : (index) -> {2}",
                b.name,
                tile_var(b.tile),
                b.memref()
            );
        }
    }

    /// The object FIFOs and their links, in generic form.
    fn generic_fifos(&self, o: &mut String) {
        for f in &self.fifos {
            let mut operands = vec![tile_var(f.producer)];
            operands.extend(f.consumers.iter().map(|&c| tile_var(c)));
            let from = vec!["[]"; f.consumers.len()].join(", ");
            let _ = writeln!(
                o,
                "    \"aie.objectfifo\"({}) {{dimensionsFromStreamPerConsumer = #aie<bd_dim_layout_array_array[{from}]>, dimensionsToStream = #aie<bd_dim_layout_array[{}]>, disable_synchronization = false, elemNumber = {} : i32, elemType = !aie.objectfifo<{}>, plio = false, sym_name = \"{}\", via_DMA = false}} : ({}) -> ()",
                operands.join(", "),
                dims_attr(&f.to_stream),
                f.depth,
                f.memref(),
                f.name,
                vec!["index"; operands.len()].join(", ")
            );
        }
        for l in &self.links {
            let syms = |v: &[String]| v.iter().map(|s| format!("@{s}")).collect::<Vec<_>>().join(", ");
            let _ = writeln!(
                o,
                "    \"aie.objectfifo.link\"() {{dst_offsets = {}, fifoIns = [{}], fifoOuts = [{}], src_offsets = {}}} : () -> ()",
                i64_array_attr(&l.dst_offsets),
                syms(&l.inputs),
                syms(&l.outputs),
                i64_array_attr(&l.src_offsets)
            );
        }
    }

    /// One core's body in generic form.
    fn generic_core(&self, o: &mut String, core: &Core) {
        match self.kind {
            Kind::Gemm => self.generic_gemm_core(o, core),
            Kind::Gemv => crate::gemv::generic_core(self, core, o),
            Kind::QGemv { .. } => crate::qgemv::generic_core(self, core, o),
        }
    }

    /// A GEMM core's body in generic form: per output tile, zero C, then `k_steps` kernel calls.
    fn generic_gemm_core(&self, o: &mut String, core: &Core) {
        let (ta, tb, tc) = self.kernel_types();
        let (c, r) = core.tile;
        let sub = |ty: &str| format!("!aie.objectfifosubview<{ty}>");
        let _ = writeln!(o, "    %core_{c}_{r} = \"aie.core\"({}) ({{", tile_var(core.tile));
        let _ = writeln!(o, "      %c0 = \"arith.constant\"() {{value = 0 : index}} : () -> index");
        let _ = writeln!(o, "      %c1 = \"arith.constant\"() {{value = 1 : index}} : () -> index");
        let _ = writeln!(o, "      %ctiles = \"arith.constant\"() {{value = {} : index}} : () -> index", core.tiles);
        let _ = writeln!(o, "      %ksteps = \"arith.constant\"() {{value = {} : index}} : () -> index", core.k_steps);
        let _ = writeln!(o, "      \"scf.for\"(%c0, %ctiles, %c1) ({{");
        let _ = writeln!(o, "      ^bb0(%tile: index):");
        let _ = writeln!(o, "        %0 = \"aie.objectfifo.acquire\"() {{objFifo_name = @{}, port = 0 : i32, size = 1 : i32}} : () -> {}", core.c, sub(&tc));
        let _ = writeln!(
            o,
            "        %1 = \"aie.objectfifo.subview.access\"(%0) {{index = 0 : i32}} : ({}) -> {tc}",
            sub(&tc)
        );
        let _ = writeln!(o, "        \"func.call\"(%1) {{callee = @{ZERO_KERNEL}}} : ({tc}) -> ()");
        let _ = writeln!(o, "        \"scf.for\"(%c0, %ksteps, %c1) ({{");
        let _ = writeln!(o, "        ^bb0(%kstep: index):");
        let _ = writeln!(o, "          %2 = \"aie.objectfifo.acquire\"() {{objFifo_name = @{}, port = 1 : i32, size = 1 : i32}} : () -> {}", core.a, sub(&ta));
        let _ = writeln!(
            o,
            "          %3 = \"aie.objectfifo.subview.access\"(%2) {{index = 0 : i32}} : ({}) -> {ta}",
            sub(&ta)
        );
        let _ = writeln!(o, "          %4 = \"aie.objectfifo.acquire\"() {{objFifo_name = @{}, port = 1 : i32, size = 1 : i32}} : () -> {}", core.b, sub(&tb));
        let _ = writeln!(
            o,
            "          %5 = \"aie.objectfifo.subview.access\"(%4) {{index = 0 : i32}} : ({}) -> {tb}",
            sub(&tb)
        );
        let _ =
            writeln!(o, "          \"func.call\"(%3, %5, %1) {{callee = @{MATMUL_KERNEL}}} : ({ta}, {tb}, {tc}) -> ()");
        let _ = writeln!(
            o,
            "          \"aie.objectfifo.release\"() {{objFifo_name = @{}, port = 1 : i32, size = 1 : i32}} : () -> ()",
            core.a
        );
        let _ = writeln!(
            o,
            "          \"aie.objectfifo.release\"() {{objFifo_name = @{}, port = 1 : i32, size = 1 : i32}} : () -> ()",
            core.b
        );
        let _ = writeln!(o, "          \"scf.yield\"() : () -> ()");
        let _ = writeln!(o, "        }}) : (index, index, index) -> ()");
        let _ = writeln!(
            o,
            "        \"aie.objectfifo.release\"() {{objFifo_name = @{}, port = 0 : i32, size = 1 : i32}} : () -> ()",
            core.c
        );
        let _ = writeln!(o, "        \"scf.yield\"() : () -> ()");
        let _ = writeln!(o, "      }}) : (index, index, index) -> ()");
        let _ = writeln!(o, "      \"aie.end\"() : () -> ()");
        let _ =
            writeln!(o, "    }}) {{stack_size = {} : i32}} : (index) -> index", self.tiling.device.core_stack_bytes());
    }

    /// The runtime sequence in generic form.
    fn generic_sequence(&self, o: &mut String) {
        let arg_types: Vec<String> = self.args.iter().map(|&(len, e)| memref(&[len], e)).collect();
        let _ = writeln!(o, "    \"aie.runtime_sequence\"() ({{");
        let params: Vec<String> = arg_types.iter().enumerate().map(|(i, ty)| format!("%arg{i}: {ty}")).collect();
        let _ = writeln!(o, "    ^bb0({}):", params.join(", "));
        for op in &self.seq {
            match op {
                SeqOp::Dma { arg, offset, sizes, strides, id, fifo, issue_token } => {
                    let _ = writeln!(
                        o,
                        "      \"aiex.npu.dma_memcpy_nd\"(%arg{arg}) {{id = {id} : i64, issue_token = {issue_token}, metadata = @{fifo}, operandSegmentSizes = array<i32: 1, 0, 0, 0>, static_offsets = {}, static_sizes = {}, static_strides = {}}} : ({}) -> ()",
                        i64_array(&[0, 0, 0, *offset]),
                        i64_array(sizes),
                        i64_array(strides),
                        arg_types[*arg]
                    );
                }
                SeqOp::Wait { fifo } => {
                    let _ = writeln!(o, "      \"aiex.npu.dma_wait\"() {{symbol = @{fifo}}} : () -> ()");
                }
            }
        }
        let _ = writeln!(o, "    }}) {{sym_name = \"sequence\"}} : () -> ()");
    }

    /// The custom (pretty) form mlir-aie's `aie-opt` and `aiecc` take.
    pub fn pretty(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "module attributes {{{}}} {{", self.module_attrs());
        self.pretty_device(&mut o);
        let _ = writeln!(o, "}}");
        o
    }

    /// The design's `aie.device` operation in custom form (`@name`).
    pub fn pretty_device(&self, o: &mut String) {
        let t = &self.tiling;
        let _ = writeln!(o, "  aie.device({}) @{} {{", t.device, self.name);
        self.pretty_kernels_and_tiles(o);
        self.pretty_fifos(o);
        for core in &self.cores {
            self.pretty_core(o, core);
        }
        self.pretty_sequence(o);
        let _ = writeln!(o, "    }}\n  }}");
    }

    /// The cores' functions and the tiles, in custom form.
    fn pretty_kernels_and_tiles(&self, o: &mut String) {
        for f in &self.functions {
            o.push_str(&f.pretty(4));
        }
        for &tile in &self.tiles {
            let _ = writeln!(o, "    {} = aie.tile({}, {})", tile_var(tile), tile.0, tile.1);
        }
        for b in &self.buffers {
            let _ = writeln!(
                o,
                "    %{0} = aie.buffer({1}) {{sym_name = \"{0}\"}} : {2}",
                b.name,
                tile_var(b.tile),
                b.memref()
            );
        }
    }

    /// The object FIFOs and their links, in custom form.
    fn pretty_fifos(&self, o: &mut String) {
        for f in &self.fifos {
            let dims = if f.to_stream.is_empty() {
                String::new()
            } else {
                format!(" dimensionsToStream [{}]", dims_attr(&f.to_stream))
            };
            let cons: Vec<String> = f.consumers.iter().map(|&c| tile_var(c)).collect();
            let _ = writeln!(
                o,
                "    aie.objectfifo @{}({}{dims}, {{{}}}, {} : i32) : !aie.objectfifo<{}>",
                f.name,
                tile_var(f.producer),
                cons.join(", "),
                f.depth,
                f.memref()
            );
        }
        for l in &self.links {
            let syms = |v: &[String]| v.iter().map(|s| format!("@{s}")).collect::<Vec<_>>().join(", ");
            let _ = writeln!(
                o,
                "    aie.objectfifo.link [{}] -> [{}]([{}] [{}])",
                syms(&l.inputs),
                syms(&l.outputs),
                usize_list(&l.src_offsets),
                usize_list(&l.dst_offsets)
            );
        }
    }

    /// One core's body in custom form.
    fn pretty_core(&self, o: &mut String, core: &Core) {
        match self.kind {
            Kind::Gemm => self.pretty_gemm_core(o, core),
            Kind::Gemv => crate::gemv::pretty_core(self, core, o),
            Kind::QGemv { .. } => crate::qgemv::pretty_core(self, core, o),
        }
    }

    /// A GEMM core's body in custom form.
    fn pretty_gemm_core(&self, o: &mut String, core: &Core) {
        let (ta, tb, tc) = self.kernel_types();
        let (c, r) = core.tile;
        let sub = |ty: &str| format!("!aie.objectfifosubview<{ty}>");
        let _ = writeln!(o, "    %core_{c}_{r} = aie.core({}) {{", tile_var(core.tile));
        let _ = writeln!(o, "      %c0 = arith.constant 0 : index\n      %c1 = arith.constant 1 : index");
        let _ = writeln!(
            o,
            "      %ctiles = arith.constant {} : index\n      %ksteps = arith.constant {} : index",
            core.tiles, core.k_steps
        );
        let _ = writeln!(o, "      scf.for %tile = %c0 to %ctiles step %c1 {{");
        let _ = writeln!(o, "        %0 = aie.objectfifo.acquire @{}(Produce, 1) : {}", core.c, sub(&tc));
        let _ = writeln!(o, "        %1 = aie.objectfifo.subview.access %0[0] : {} -> {tc}", sub(&tc));
        let _ = writeln!(o, "        func.call @{ZERO_KERNEL}(%1) : ({tc}) -> ()");
        let _ = writeln!(o, "        scf.for %kstep = %c0 to %ksteps step %c1 {{");
        let _ = writeln!(o, "          %2 = aie.objectfifo.acquire @{}(Consume, 1) : {}", core.a, sub(&ta));
        let _ = writeln!(o, "          %3 = aie.objectfifo.subview.access %2[0] : {} -> {ta}", sub(&ta));
        let _ = writeln!(o, "          %4 = aie.objectfifo.acquire @{}(Consume, 1) : {}", core.b, sub(&tb));
        let _ = writeln!(o, "          %5 = aie.objectfifo.subview.access %4[0] : {} -> {tb}", sub(&tb));
        let _ = writeln!(o, "          func.call @{MATMUL_KERNEL}(%3, %5, %1) : ({ta}, {tb}, {tc}) -> ()");
        let _ = writeln!(o, "          aie.objectfifo.release @{}(Consume, 1)", core.a);
        let _ = writeln!(o, "          aie.objectfifo.release @{}(Consume, 1)", core.b);
        let _ = writeln!(o, "        }}");
        let _ = writeln!(o, "        aie.objectfifo.release @{}(Produce, 1)", core.c);
        let _ = writeln!(o, "      }}");
        let _ = writeln!(o, "      aie.end");
        let _ = writeln!(o, "    }} {{stack_size = {} : i32}}", self.tiling.device.core_stack_bytes());
    }

    /// The runtime sequence in custom form.
    fn pretty_sequence(&self, o: &mut String) {
        let arg_types: Vec<String> = self.args.iter().map(|&(len, e)| memref(&[len], e)).collect();
        let params: Vec<String> = arg_types.iter().enumerate().map(|(i, ty)| format!("%arg{i}: {ty}")).collect();
        let _ = writeln!(o, "    aie.runtime_sequence @sequence({}) {{", params.join(", "));
        for op in &self.seq {
            match op {
                SeqOp::Dma { arg, offset, sizes, strides, id, fifo, issue_token } => {
                    let token = if *issue_token { ", issue_token = true" } else { "" };
                    let _ = writeln!(
                        o,
                        "      aiex.npu.dma_memcpy_nd(%arg{arg}[0, 0, 0, {offset}][{}][{}]) {{id = {id} : i64{token}, metadata = @{fifo}}} : {}",
                        usize_list(sizes),
                        usize_list(strides),
                        arg_types[*arg]
                    );
                }
                SeqOp::Wait { fifo } => {
                    let _ = writeln!(o, "      aiex.npu.dma_wait {{symbol = @{fifo}}}");
                }
            }
        }
    }
}

//! The host plan: which design every projection call uses, cut how.
//!
//! A call with fewer rows than the threshold (default 16: decode, a short verify step) runs as
//! blocks of [`gemv::GEMV_ROWS`] rows on a GEMV design ([`crate::gemv`]): 1–8 rows one block,
//! 9–15 two. Larger calls are cut into M-blocks of the GEMM designs: the prefill block, and for
//! what is left (or a small call) the smallest block the array takes (`4 rows × 4r`). Wide
//! projections are cut into equal column chunks, so one design serves every chunk: of at most
//! `max_design_cols` for the GEMM designs, whose column tiles share a core's memory with the
//! A tile, and of at most `max_gemv_cols` for the GEMV designs, whose cores stream any number of
//! column tiles — fewer, wider calls, each paying one dispatch. A projection whose last columns
//! are its weight's residual pass (`first_pass_columns`) has its M-block chunks cut at that
//! boundary, those chunks taking the first activation pass's rows only; its GEMV chunks take
//! every row of both. The last chunk, like the last M-block and any K or N the tiling does not
//! divide, is zero-padded by the host, and the design's padded host shape is part of its text.
//!
//! The bundle stores the plan as `bundle::xdna` defines it ([`Plan::to_plan_file`]); a call's
//! array calls are that module's `array_calls` ([`Plan::calls`]), which the runtime applies to
//! the numbers the file records.

use crate::chain::{self, ChainSite};
use crate::design::{self, Design};
use crate::device::Device;
use crate::gemm::{self, GemmSite};
use crate::gemv;
use crate::qgemv::{self, QTiling};
use crate::sequence::{self, ArrayProgram};
use crate::tiling::{self, GemmShape, Tiling};
use bundle::xdna::{
    self, PlanChain, PlanDesign, PlanGemm, PlanProgram, PlanShape, PlanSite, PlanTiling, QgemvLayout, XdnaPlan,
};
use std::collections::{BTreeMap, HashMap};

/// A column chunk of one projection, as the plan file records it.
pub use bundle::xdna::PlanChunk as Chunk;
/// A GEMV column chunk of one projection, as the plan file records it.
pub use bundle::xdna::PlanGemvChunk as GemvChunk;
/// Where a bundle keeps the plan, and the format it is in.
pub use bundle::xdna::{PLAN_FILE, PLAN_FORMAT};

pub const DEFAULT_HOST_THRESHOLD_ROWS: usize = 16;
pub const DEFAULT_PREFILL_ROWS: usize = 256;
pub const DEFAULT_MAX_DESIGN_COLS: usize = 4096;
pub const DEFAULT_MAX_GEMV_COLS: usize = 16384;

#[derive(Clone, Copy, Debug)]
pub struct PlanOptions {
    pub device: Device,
    /// Calls with fewer rows run on the GEMV designs (on the host without them).
    pub host_threshold_rows: usize,
    /// Rows of the GEMV designs; 0 builds none, and leaves small calls on the host.
    pub gemv_rows: usize,
    pub prefill_rows: usize,
    pub max_design_cols: usize,
    pub max_gemv_cols: usize,
}

impl PlanOptions {
    pub fn new(device: Device) -> PlanOptions {
        PlanOptions {
            device,
            host_threshold_rows: DEFAULT_HOST_THRESHOLD_ROWS,
            gemv_rows: gemv::GEMV_ROWS,
            prefill_rows: DEFAULT_PREFILL_ROWS,
            max_design_cols: DEFAULT_MAX_DESIGN_COLS,
            max_gemv_cols: DEFAULT_MAX_GEMV_COLS,
        }
    }
}

/// The smallest M-block the array takes on a device: every compute row gets `4r` rows.
pub fn decode_rows(device: Device) -> usize {
    device.compute_rows() * 4 * device.micro_tile().0
}

#[derive(Clone, Debug, PartialEq)]
pub struct PlannedGemm {
    pub site: GemmSite,
    pub chunks: Vec<Chunk>,
    pub gemv_chunks: Vec<GemvChunk>,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub options: PlanOptions,
    pub gemv_rows: usize,
    pub decode_rows: usize,
    pub designs: BTreeMap<String, Design>,
    pub gemms: Vec<PlannedGemm>,
    /// Decode's chained projections, each on qgemv designs ([`crate::chain`]).
    pub chains: Vec<PlannedChain>,
    /// `(QGemm node, reason)` for each projection that runs unchained.
    pub unchained: Vec<(String, String)>,
    /// The operands of the qgemv designs, by name.
    pub layouts: BTreeMap<String, QgemvLayout>,
    /// Decode's MLPs as one program each (both chains one chunk).
    pub programs: Vec<PlannedProgram>,
    /// Those programs, by name (layers of one shape share one).
    pub array_programs: BTreeMap<String, ArrayProgram>,
}

/// A chained projection and its column chunks, each one call of a qgemv design of
/// [`CHAIN_ROWS`] rows.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedChain {
    pub site: ChainSite,
    pub chunks: Vec<GemvChunk>,
    /// The chunks' design's tiling.
    pub tiling: QTiling,
    /// Chunks of designs of `block_rows` rows (the GEMV block's), for short verify steps (none,
    /// and 0, where no design of that many rows fits).
    pub block_chunks: Vec<GemvChunk>,
    pub block_rows: usize,
}

/// Decode's MLP as one array program of its two chains ([`crate::sequence::mlp`]).
#[derive(Clone, Debug)]
pub struct PlannedProgram {
    pub site: chain::MlpSite,
    /// The attention's output projection in front, when the program is the layer's
    /// ([`crate::sequence::layer`]; a chain index).
    pub o: Option<usize>,
    /// Its program in [`Plan::array_programs`].
    pub name: String,
}

impl PlannedProgram {
    /// Its chains in phase order.
    pub fn chains(&self) -> Vec<usize> {
        self.o.into_iter().chain([self.site.gate_up, self.site.down]).collect()
    }
}

/// Rows of the chained designs: decode's one.
pub const CHAIN_ROWS: usize = 1;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error(transparent)]
    Tiling(#[from] tiling::TilingError),
    #[error("projection `{node}`: {source}")]
    Site { node: String, source: tiling::TilingError },
}

/// Column chunks of an `n`-wide projection: equal widths of at most `max_cols`.
pub fn chunks(n: usize, max_cols: usize) -> Vec<(usize, usize)> {
    let count = n.div_ceil(max_cols.max(1));
    let width = n.div_ceil(count);
    (0..count).map(|i| (i * width, width.min(n - i * width))).collect()
}

/// Plans every projection of `g`, and its chained projections for decode: a chain whose
/// designs do not fit the device runs unchained, and says why.
pub fn plan(g: &ir::Graph, options: PlanOptions) -> Result<Plan, PlanError> {
    let mut plan = plan_sites(gemm::collect(g), options)?;
    let (sites, mut unchained) = chain::collect(g);
    let mut designs = ChainDesigns { options, chosen: HashMap::new() };
    for site in sites {
        let plain = designs.planned(&site);
        // The residual sum too, where its designs fit as the plain chain's do.
        let summed = chain::summed(g, &site).and_then(|s| designs.planned(&s).ok());
        let chosen = match (summed, plain) {
            (Some(s), Ok(p)) if s.block_rows >= p.block_rows => Ok(s),
            (Some(s), Err(_)) => Ok(s),
            (_, p) => p,
        };
        match chosen {
            Ok(chain) => {
                designs.add_to(&mut plan, &chain);
                plan.chains.push(chain);
            }
            Err(e) => unchained.push((site.qgemm, format!("no qgemv design takes it: {e}"))),
        }
    }
    plan.unchained = unchained;
    (plan.programs, plan.array_programs) = mlp_programs(g, &plan.chains);
    Ok(plan)
}

/// What decides a chain's designs: rows, K, outputs, passes, pairs, and the feed (a norm's ε
/// by its bits).
type ChainShape = (usize, usize, usize, usize, bool, u8, u32);

/// A chain shape's column chunks, tiling and design.
type ChainChoice = Result<(Vec<GemvChunk>, QTiling, Design), String>;

/// The chains' designs, chosen once per [`ChainShape`] (a model's layers repeat theirs).
struct ChainDesigns {
    options: PlanOptions,
    chosen: HashMap<ChainShape, ChainChoice>,
}

impl ChainDesigns {
    /// `site` on its one-row designs, and on the block's where they fit.
    fn planned(&mut self, site: &ChainSite) -> Result<PlannedChain, String> {
        let (chunks, q) = self.chunks(site, CHAIN_ROWS)?;
        let rows = self.options.gemv_rows;
        let block = (rows > CHAIN_ROWS).then(|| self.chunks(site, rows));
        let (block_chunks, block_rows) = match block {
            Some(Ok((block_chunks, _))) => (block_chunks, rows),
            _ => (vec![], 0),
        };
        Ok(PlannedChain { site: site.clone(), chunks, tiling: q, block_chunks, block_rows })
    }

    /// A chain's chunks and design tiling for steps of `rows` rows ([`chain_chunks`]).
    fn chunks(&mut self, site: &ChainSite, rows: usize) -> Result<(Vec<GemvChunk>, QTiling), String> {
        let (feed, epsilon) = match site.feed {
            qgemv::Feed::Rows => (0, 0),
            qgemv::Feed::Norm { epsilon, sum } => (1 + 2 * u8::from(sum), epsilon.to_bits()),
            qgemv::Feed::Gate { .. } => (2, 0),
        };
        let key = (rows, site.k, site.n, site.passes, site.pairs, feed, epsilon);
        let options = self.options;
        let choice =
            self.chosen.entry(key).or_insert_with(|| chain_chunks(options, site, rows).map_err(|e| e.to_string()));
        choice.as_ref().map(|(chunks, q, _)| (chunks.clone(), q.clone())).map_err(Clone::clone)
    }

    /// The designs `chain` calls, into the plan (once each).
    fn add_to(&self, plan: &mut Plan, chain: &PlannedChain) {
        let names: Vec<&str> = chain.chunks.iter().chain(&chain.block_chunks).map(|c| c.design.as_str()).collect();
        for (_, q, d) in self.chosen.values().flatten() {
            if names.contains(&d.name.as_str()) && !plan.designs.contains_key(&d.name) {
                plan.layouts.insert(d.name.clone(), q.layout());
                plan.designs.insert(d.name.clone(), d.clone());
            }
        }
    }
}

/// The MLPs among `chains` whose designs make one program: each chain one chunk, the down
/// design reading the gate/up design's output row as it is, and where the attention's output
/// projection writes the gate/up design's rows, that projection first (the layer's program).
/// Layers of one shape share their program, built once.
fn mlp_programs(g: &ir::Graph, chains: &[PlannedChain]) -> (Vec<PlannedProgram>, BTreeMap<String, ArrayProgram>) {
    let sites: Vec<&ChainSite> = chains.iter().map(|c| &c.site).collect();
    let (mut planned, mut programs) = (vec![], BTreeMap::new());
    let mut by_designs: HashMap<Vec<&str>, Option<String>> = HashMap::new();
    for site in chain::mlps(g, &sites) {
        let o = chain::projection_into(g, &sites, &site).filter(|&o| chains[o].chunks.len() == 1);
        let phases: Vec<&PlannedChain> = o.into_iter().chain([site.gate_up, site.down]).map(|c| &chains[c]).collect();
        let [.., up, down] = phases[..] else { unreachable!("an MLP's two chains") };
        if up.chunks.len() != 1 || down.chunks.len() != 1 {
            continue;
        }
        let key: Vec<&str> = phases.iter().map(|c| c.chunks[0].design.as_str()).collect();
        let name = by_designs.entry(key).or_insert_with(|| {
            let program = match phases[..] {
                [o, up, down] => sequence::layer(&o.tiling, &up.tiling, &down.tiling).ok()?,
                _ => sequence::mlp(&up.tiling, &down.tiling).ok()?,
            };
            let name = program.name.clone();
            programs.insert(name.clone(), program);
            Some(name)
        });
        if let Some(name) = name.clone() {
            planned.push(PlannedProgram { site, o, name });
        }
    }
    (planned, programs)
}

/// A chain's column chunks over its outputs, as few equal ones as a design takes (narrower
/// while none fits, down to `max_design_cols`), and their design's tiling.
fn chain_chunks(
    options: PlanOptions,
    site: &ChainSite,
    rows: usize,
) -> Result<(Vec<GemvChunk>, QTiling, Design), tiling::TilingError> {
    let mut count = site.n.div_ceil(options.max_gemv_cols.max(1));
    loop {
        let parts = chunks(site.n, site.n.div_ceil(count));
        let shape = GemmShape { m: rows, k: site.k, n: parts[0].1 };
        let chosen = match (site.pairs, site.feed) {
            (true, feed) => qgemv::choose_pairs(options.device, shape, site.passes, feed),
            (false, qgemv::Feed::Rows) => qgemv::choose(options.device, shape, site.passes),
            (false, qgemv::Feed::Norm { epsilon, sum: false }) => {
                qgemv::choose_norm(options.device, shape, site.passes, epsilon)
            }
            (false, qgemv::Feed::Norm { epsilon, sum: true }) => {
                qgemv::choose_sum(options.device, shape, site.passes, epsilon)
            }
            (false, qgemv::Feed::Gate { .. }) => qgemv::choose_gate(options.device, shape, site.passes),
        };
        match chosen {
            Ok(q) => {
                let d = qgemv::build(&q);
                let chunk = |(col_offset, cols)| GemvChunk { col_offset, cols, design: d.name.clone() };
                return Ok((parts.into_iter().map(chunk).collect(), q, d));
            }
            Err(e) if parts[0].1 <= options.max_design_cols => return Err(e),
            Err(_) => count += 1,
        }
    }
}

/// The designs a plan is building, by shape and kind, each tiled once.
struct Designs {
    device: Device,
    designs: BTreeMap<String, Design>,
    names: BTreeMap<(bool, GemmShape), String>,
}

impl Designs {
    /// The name of the design of `shape` (a GEMV design when `gemv`), built on first use.
    fn name(&mut self, shape: GemmShape, gemv: bool) -> Result<String, tiling::TilingError> {
        if let Some(name) = self.names.get(&(gemv, shape)) {
            return Ok(name.clone());
        }
        let d = if gemv {
            gemv::build(&gemv::choose(self.device, shape)?)
        } else {
            design::build(&tiling::choose(self.device, shape)?)
        };
        self.names.insert((gemv, shape), d.name.clone());
        let name = d.name.clone();
        self.designs.insert(d.name.clone(), d);
        Ok(name)
    }
}

/// Plans the given projections.
pub fn plan_sites(sites: Vec<GemmSite>, options: PlanOptions) -> Result<Plan, PlanError> {
    let decode = decode_rows(options.device);
    let mut designs = Designs { device: options.device, designs: BTreeMap::new(), names: BTreeMap::new() };
    let mut gemms = vec![];
    for site in sites {
        let at = |source| PlanError::Site { node: site.node.clone(), source };
        let chunks = m_block_chunks(&mut designs, &site, options, decode).map_err(at)?;
        let gemv_chunks = match options.gemv_rows {
            0 => vec![],
            rows => gemv_chunks(&mut designs, &site, rows, options).map_err(at)?,
        };
        gemms.push(PlannedGemm { site, chunks, gemv_chunks });
    }
    Ok(Plan {
        options,
        gemv_rows: options.gemv_rows,
        decode_rows: decode,
        designs: designs.designs,
        gemms,
        chains: vec![],
        unchained: vec![],
        layouts: BTreeMap::new(),
        programs: vec![],
        array_programs: BTreeMap::new(),
    })
}

/// A projection's M-block chunks: its main columns with every pass, then its residual pass's
/// columns (if any) with the first pass only, each range in equal chunks of one design pair.
fn m_block_chunks(
    designs: &mut Designs,
    site: &GemmSite,
    options: PlanOptions,
    decode: usize,
) -> Result<Vec<Chunk>, tiling::TilingError> {
    let main = site.n - site.first_pass_columns;
    let ranges = [(0, main, site.passes), (main, site.first_pass_columns, 1)];
    let mut out = vec![];
    for (start, width, passes) in ranges.into_iter().filter(|&(_, width, _)| width > 0) {
        let parts = chunks(width, options.max_design_cols);
        let shape = |m| GemmShape { m, k: site.k, n: parts[0].1 };
        let decode_design = designs.name(shape(decode), false)?;
        let prefill_design = designs.name(shape(options.prefill_rows.max(decode)), false)?;
        out.extend(parts.into_iter().map(|(offset, cols)| Chunk {
            col_offset: start + offset,
            cols,
            decode_design: decode_design.clone(),
            prefill_design: prefill_design.clone(),
            passes,
        }));
    }
    Ok(out)
}

/// A projection's GEMV chunks: every column, in as few equal chunks of one design as a GEMV
/// design takes — at most `max_gemv_cols` wide, narrower while no GEMV design fits (a core's
/// weight tile must fit one memory bank and its tiles one descriptor's repeat count, which bounds
/// the width on a device for a K), down to `max_design_cols`, where a width that does not fit is
/// the projection's error.
fn gemv_chunks(
    designs: &mut Designs,
    site: &GemmSite,
    rows: usize,
    options: PlanOptions,
) -> Result<Vec<GemvChunk>, tiling::TilingError> {
    let mut count = site.n.div_ceil(options.max_gemv_cols.max(1));
    let (parts, design) = loop {
        let parts = chunks(site.n, site.n.div_ceil(count));
        match designs.name(GemmShape { m: rows, k: site.k, n: parts[0].1 }, true) {
            Ok(design) => break (parts, design),
            Err(e) if parts[0].1 <= options.max_design_cols => return Err(e),
            Err(_) => count += 1,
        }
    };
    Ok(parts.into_iter().map(|(col_offset, cols)| GemvChunk { col_offset, cols, design: design.clone() }).collect())
}

impl Plan {
    /// How the plan cuts a call's rows, as the plan file records it.
    pub fn routing(&self) -> xdna::Routing {
        xdna::Routing {
            host_threshold_rows: self.options.host_threshold_rows,
            gemv_rows: self.gemv_rows,
            decode_rows: self.decode_rows,
            prefill_rows: self.options.prefill_rows,
        }
    }

    /// The array calls of one call of `g` with `rows` rows (its stacked passes included), as the
    /// runtime makes them; `None` when the call stays on the host.
    pub fn calls<'p>(&self, g: &'p PlannedGemm, rows: usize) -> Option<Vec<xdna::ArrayCall<'p>>> {
        xdna::array_calls(self.routing(), g.site.passes, (&g.chunks, &g.gemv_chunks), rows)
    }
}

/// Where a call of `rows` rows runs: `None` on the host, else the blocks `(design rows, rows
/// used)` it is cut into (GEMV blocks, or GEMM M-blocks) — the routing the runtime applies to the
/// numbers the plan records.
pub fn route(plan: &Plan, rows: usize) -> Option<Vec<(usize, usize)>> {
    plan.routing().route(rows)
}

/// Bundle path of a design's generic and pretty texts.
pub fn design_files(name: &str) -> (String, String) {
    (format!("xdna/{name}.mlir"), format!("xdna/{name}.pretty.mlir"))
}

/// mlir-aie's compiler driver, as its Python package installs it.
pub const AIECC: &str = "aiecc.py";

/// The arguments `aiecc.py` takes, run in the bundle's folder, to build a design's device
/// artifacts from its custom form: the cores compiled by Peano (no xchesscc, no xbridge: mlir-aie
/// lowers the cores' MLIR functions to LLVM and Peano's `opt`/`llc` compile them for the device
/// the design names, AIE2 for npu1, AIE2P for npu2; `PEANO_INSTALL_DIR` says where Peano is), no
/// host code, and the instruction stream, PDI and xclbin written as `xdna/<name>.insts.bin`,
/// `.pdi` and `.xclbin`, the files the runtime loads.
pub fn build_args(name: &str) -> Vec<String> {
    let (_, pretty) = design_files(name);
    vec![
        "--no-xchesscc".into(),
        "--no-xbridge".into(),
        "--no-compile-host".into(),
        "--aie-generate-npu-insts".into(),
        format!("--npu-insts-name=xdna/{name}.insts.bin"),
        "--aie-generate-pdi".into(),
        format!("--pdi-name=xdna/{name}.pdi"),
        "--aie-generate-xclbin".into(),
        format!("--xclbin-name=xdna/{name}.xclbin"),
        pretty,
    ]
}

/// [`build_args`] as one shell command line (design names need no quoting).
pub fn build_command(name: &str) -> String {
    format!("{AIECC} {}", build_args(name).join(" "))
}

impl Plan {
    /// The plan as the bundle stores it (`xdna/plan.json`), without what only the build knows:
    /// MLIR's verdict, and the device artifacts aiecc built.
    pub fn to_plan_file(&self) -> XdnaPlan {
        XdnaPlan {
            format: PLAN_FORMAT.to_string(),
            device: self.options.device.name().to_string(),
            host_threshold_rows: self.options.host_threshold_rows,
            gemv_rows: self.gemv_rows,
            decode_rows: self.decode_rows,
            prefill_rows: self.options.prefill_rows.max(self.decode_rows),
            max_design_cols: self.options.max_design_cols,
            max_gemv_cols: self.options.max_gemv_cols,
            designs: self.designs.values().map(|d| design_entry(d, self.layouts.get(&d.name))).collect(),
            gemms: self.gemms.iter().map(gemm_entry).collect(),
            chains: self.chains.iter().map(chain_entry).collect(),
            programs: self.programs.iter().map(|p| program_entry(p, &self.array_programs[&p.name])).collect(),
            mlir: None,
            artifacts: None,
        }
    }
}

fn design_entry(d: &Design, layout: Option<&QgemvLayout>) -> PlanDesign {
    let (file, pretty) = design_files(&d.name);
    PlanDesign {
        name: d.name.clone(),
        file,
        pretty,
        build: build_command(&d.name),
        kind: match d.kind {
            design::Kind::Gemm => xdna::DesignKind::Gemm,
            design::Kind::Gemv => xdna::DesignKind::Gemv,
            design::Kind::QGemv { .. } => xdna::DesignKind::Qgemv,
        },
        array_columns: d.tiling.cols,
        tiling: tiling_entry(&d.tiling),
        qgemv: layout.copied(),
        insts: None,
        xclbin: None,
        pdi: None,
        aiecc_error: None,
    }
}

fn shape_entry(s: GemmShape) -> PlanShape {
    PlanShape { m: s.m, k: s.k, n: s.n }
}

fn tiling_entry(t: &Tiling) -> PlanTiling {
    PlanTiling {
        device: t.device.name().to_string(),
        shape: shape_entry(t.shape),
        padded: shape_entry(t.padded),
        m: t.m,
        k: t.k,
        n: t.n,
        rows: t.rows,
        cols: t.cols,
        l1_bytes: t.l1_bytes,
        l2_bytes: t.l2_bytes,
        compute_cycles: t.compute_cycles,
        dma_cycles: t.dma_cycles,
        total_cycles: t.total_cycles,
        utilisation: t.utilisation,
    }
}

fn gemm_entry(g: &PlannedGemm) -> PlanGemm {
    let s = &g.site;
    PlanGemm {
        site: PlanSite {
            node: s.node.clone(),
            op: s.op.clone(),
            k: s.k,
            n: s.n,
            weight: s.weight.clone(),
            transposed: s.transposed,
            passes: s.passes,
            first_pass_columns: s.first_pass_columns,
        },
        chunks: g.chunks.clone(),
        gemv_chunks: g.gemv_chunks.clone(),
    }
}

fn chain_entry(c: &PlannedChain) -> PlanChain {
    let s = &c.site;
    PlanChain {
        qgemm: s.qgemm.clone(),
        feed: s.feed.operand(),
        nodes: s.nodes.clone(),
        inputs: s.inputs.clone(),
        gamma: s.gamma.clone(),
        output: s.output.clone(),
        sum: s.sum.clone(),
        k: s.k,
        n: s.n,
        pairs: s.pairs,
        rows: CHAIN_ROWS,
        chunks: c.chunks.clone(),
        block_rows: c.block_rows,
        block_chunks: c.block_chunks.clone(),
    }
}

fn program_entry(p: &PlannedProgram, program: &ArrayProgram) -> PlanProgram {
    let (file, pretty) = design_files(&p.name);
    PlanProgram {
        name: p.name.clone(),
        file,
        pretty,
        chains: p.chains(),
        between: p.site.between.clone(),
        array_columns: program.phases.iter().map(|ph| ph.design.tiling.cols).max().unwrap_or(0),
        insts: None,
        pdi: None,
    }
}

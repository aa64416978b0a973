//! The host plan: which design every projection call uses, cut how.
//!
//! A call with fewer rows than the threshold (default 16: decode, a short verify step) runs as
//! blocks of [`gemv::GEMV_ROWS`] rows on a GEMV design ([`crate::gemv`]): 1–8 rows one block,
//! 9–15 two. Larger calls are cut into M-blocks of the GEMM designs: the prefill block, and for what is left (or a small call) the smallest
//! block the array takes (`4 rows × 4r`). Wide projections (lm_head) are cut into equal column
//! chunks of at most `max_design_cols`, so one design serves every chunk; the last chunk, like the
//! last M-block and any K or N the tiling does not divide, is zero-padded by the host, and the
//! design's padded host shape is part of its text.
//!
//! The bundle stores the plan as `bundle::xdna` defines it ([`Plan::to_plan_file`]); the routing
//! is that module's `route_rows`, which the runtime applies to the numbers the file records.

use crate::design::{self, Design};
use crate::device::Device;
use crate::gemm::{self, GemmSite};
use crate::gemv;
use crate::tiling::{self, GemmShape, Tiling};
use bundle::xdna::{self, PlanDesign, PlanGemm, PlanShape, PlanSite, PlanTiling, XdnaPlan};
use std::collections::BTreeMap;

/// A column chunk of one projection, as the plan file records it.
pub use bundle::xdna::PlanChunk as Chunk;
/// Where a bundle keeps the plan, and the format it is in.
pub use bundle::xdna::{PLAN_FILE, PLAN_FORMAT};

pub const DEFAULT_HOST_THRESHOLD_ROWS: usize = 16;
pub const DEFAULT_PREFILL_ROWS: usize = 256;
pub const DEFAULT_MAX_DESIGN_COLS: usize = 4096;

#[derive(Clone, Copy, Debug)]
pub struct PlanOptions {
    pub device: Device,
    /// Calls with fewer rows run on the GEMV designs (on the host without them).
    pub host_threshold_rows: usize,
    /// Rows of the GEMV designs; 0 builds none, and leaves small calls on the host.
    pub gemv_rows: usize,
    pub prefill_rows: usize,
    pub max_design_cols: usize,
}

impl PlanOptions {
    pub fn new(device: Device) -> PlanOptions {
        PlanOptions {
            device,
            host_threshold_rows: DEFAULT_HOST_THRESHOLD_ROWS,
            gemv_rows: gemv::GEMV_ROWS,
            prefill_rows: DEFAULT_PREFILL_ROWS,
            max_design_cols: DEFAULT_MAX_DESIGN_COLS,
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
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub options: PlanOptions,
    pub gemv_rows: usize,
    pub decode_rows: usize,
    pub designs: BTreeMap<String, Design>,
    pub gemms: Vec<PlannedGemm>,
}

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

/// Plans every projection of `g`.
pub fn plan(g: &ir::Graph, options: PlanOptions) -> Result<Plan, PlanError> {
    plan_sites(gemm::collect(g), options)
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
        let parts = chunks(site.n, options.max_design_cols);
        let width = parts[0].1;
        let at = |source| PlanError::Site { node: site.node.clone(), source };
        let shape = |m| GemmShape { m, k: site.k, n: width };
        let decode_design = designs.name(shape(decode), false).map_err(at)?;
        let prefill_design = designs.name(shape(options.prefill_rows.max(decode)), false).map_err(at)?;
        let gemv_design = match options.gemv_rows {
            0 => None,
            rows => Some(designs.name(shape(rows), true).map_err(at)?),
        };
        let chunks = parts
            .into_iter()
            .map(|(col_offset, cols)| Chunk {
                col_offset,
                cols,
                decode_design: decode_design.clone(),
                prefill_design: prefill_design.clone(),
                gemv_design: gemv_design.clone(),
            })
            .collect();
        gemms.push(PlannedGemm { site, chunks });
    }
    Ok(Plan { options, gemv_rows: options.gemv_rows, decode_rows: decode, designs: designs.designs, gemms })
}

/// Where a call of `rows` rows runs: `None` on the host, else the blocks `(design rows, rows
/// used)` it is cut into (GEMV blocks, or GEMM M-blocks) — the routing the runtime applies to the
/// numbers the plan records.
pub fn route(plan: &Plan, rows: usize) -> Option<Vec<(usize, usize)>> {
    xdna::route_rows(
        plan.options.host_threshold_rows,
        plan.gemv_rows,
        plan.decode_rows,
        plan.options.prefill_rows,
        rows,
    )
}

/// The design a block of `block_rows` rows of `chunk` runs on, as the runtime picks it.
pub fn block_design<'c>(plan: &Plan, chunk: &'c Chunk, block_rows: usize) -> Option<&'c str> {
    xdna::block_design(chunk, plan.gemv_rows, plan.decode_rows, block_rows)
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
            designs: self.designs.values().map(design_entry).collect(),
            gemms: self.gemms.iter().map(gemm_entry).collect(),
            mlir: None,
            artifacts: None,
        }
    }
}

fn design_entry(d: &Design) -> PlanDesign {
    let (file, pretty) = design_files(&d.name);
    PlanDesign {
        name: d.name.clone(),
        file,
        pretty,
        build: build_command(&d.name),
        kind: match d.kind {
            design::Kind::Gemm => xdna::DesignKind::Gemm,
            design::Kind::Gemv => xdna::DesignKind::Gemv,
        },
        array_columns: d.tiling.cols,
        tiling: tiling_entry(&d.tiling),
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
        },
        chunks: g.chunks.clone(),
    }
}

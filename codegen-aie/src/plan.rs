//! The host plan: which design every projection call uses, and which calls stay on the host.
//!
//! A call with fewer rows than the threshold (default 16: decode) runs on the host. Larger calls
//! are cut into M-blocks: the prefill block, and for what is left (or a small call) the smallest
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
    pub host_threshold_rows: usize,
    pub prefill_rows: usize,
    pub max_design_cols: usize,
}

impl PlanOptions {
    pub fn new(device: Device) -> PlanOptions {
        PlanOptions {
            device,
            host_threshold_rows: DEFAULT_HOST_THRESHOLD_ROWS,
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

/// Plans the given projections.
pub fn plan_sites(sites: Vec<GemmSite>, options: PlanOptions) -> Result<Plan, PlanError> {
    let decode = decode_rows(options.device);
    let mut designs = BTreeMap::new();
    let mut gemms = vec![];
    let mut tilings: BTreeMap<GemmShape, Tiling> = BTreeMap::new();
    for site in sites {
        let mut out = vec![];
        let parts = chunks(site.n, options.max_design_cols);
        let width = parts[0].1;
        let mut names = vec![];
        for m in [decode, options.prefill_rows.max(decode)] {
            let shape = GemmShape { m, k: site.k, n: width };
            let t = match tilings.get(&shape) {
                Some(t) => t.clone(),
                None => {
                    let t = tiling::choose(options.device, shape)
                        .map_err(|source| PlanError::Site { node: site.node.clone(), source })?;
                    tilings.insert(shape, t.clone());
                    t
                }
            };
            let d = design::build(&t);
            names.push(d.name.clone());
            designs.entry(d.name.clone()).or_insert(d);
        }
        for (col_offset, cols) in parts {
            out.push(Chunk { col_offset, cols, decode_design: names[0].clone(), prefill_design: names[1].clone() });
        }
        gemms.push(PlannedGemm { site, chunks: out });
    }
    Ok(Plan { options, decode_rows: decode, designs, gemms })
}

/// Where a call of `rows` rows runs: `None` on the host, else the M-blocks `(design rows, rows
/// used)` it is cut into — the routing the runtime applies to the numbers the plan records.
pub fn route(plan: &Plan, rows: usize) -> Option<Vec<(usize, usize)>> {
    xdna::route_rows(plan.options.host_threshold_rows, plan.decode_rows, plan.options.prefill_rows, rows)
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
        },
        chunks: g.chunks.clone(),
    }
}

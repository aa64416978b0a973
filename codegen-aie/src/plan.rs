//! The host plan: which design every projection call uses, and which calls stay on the host.
//!
//! A call with fewer rows than the threshold (default 16: decode) runs on the host. Larger calls
//! are cut into M-blocks: the prefill block, and for what is left (or a small call) the smallest
//! block the array takes (`4 rows × 4r`). Wide projections (lm_head) are cut into equal column
//! chunks of at most `max_design_cols`, so one design serves every chunk; the last chunk, like the
//! last M-block and any K or N the tiling does not divide, is zero-padded by the host, and the
//! design's padded host shape is part of its text.

use crate::design::{self, Design};
use crate::device::Device;
use crate::gemm::{self, GemmSite};
use crate::tiling::{self, GemmShape, Tiling};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

pub const DEFAULT_HOST_THRESHOLD_ROWS: usize = 16;
pub const DEFAULT_PREFILL_ROWS: usize = 256;
pub const DEFAULT_MAX_DESIGN_COLS: usize = 4096;
pub const PLAN_FORMAT: &str = "npuc-xdna-plan/1";
/// Where a bundle keeps the plan (the runtime's `xrt` backend reads it there).
pub use xdna_driver::plan::PLAN_FILE;

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

/// A column chunk of one projection.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Chunk {
    pub col_offset: usize,
    pub cols: usize,
    /// Design for the small M-block and for the prefill M-block.
    pub decode_design: String,
    pub prefill_design: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
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
    xdna_driver::plan::route_rows(plan.options.host_threshold_rows, plan.decode_rows, plan.options.prefill_rows, rows)
}

/// Bundle path of a design's generic and pretty texts.
pub fn design_files(name: &str) -> (String, String) {
    (format!("xdna/{name}.mlir"), format!("xdna/{name}.pretty.mlir"))
}

impl Plan {
    /// The plan as the bundle stores it (`xdna/plan.json`).
    pub fn to_json(&self) -> Value {
        let designs: Vec<Value> = self
            .designs
            .values()
            .map(|d| {
                let (generic, pretty) = design_files(&d.name);
                json!({ "name": d.name, "file": generic, "pretty": pretty, "kernel_object": design::kernel_object(&d.tiling), "tiling": d.tiling })
            })
            .collect();
        json!({
            "format": PLAN_FORMAT,
            "device": self.options.device.name(),
            "host_threshold_rows": self.options.host_threshold_rows,
            "decode_rows": self.decode_rows,
            "prefill_rows": self.options.prefill_rows.max(self.decode_rows),
            "max_design_cols": self.options.max_design_cols,
            "designs": designs,
            "gemms": self.gemms,
        })
    }
}

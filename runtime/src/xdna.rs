//! The `xrt` backend's run path: an xdna bundle on the host executor with its array-sized GEMMs
//! on the XDNA NPU, through the amdxdna driver's ioctls (`xdna_driver`).
//!
//! [`XdnaOffload`] is the executor's [`GemmOffload`]: for a QGemm the plan gives designs to, a
//! call of at least `host_threshold_rows` rows is cut as the plan cuts it (M-blocks of the decode
//! or prefill design, column chunks), each block zero-padded to its design's host shape and run
//! on the NPU with that design's PDI and instruction stream (one hardware context per design,
//! made on first use); the int32 products come back to the executor, which applies the same
//! epilogue as its own kernels. Smaller calls, and nodes without designs, stay on the host.
//!
//! The plan is `bundle::xdna`'s typed `xdna/plan.json`, routed with its `route_rows`, the function
//! the compiler plans with; a plan that does not decode is refused naming the field's JSON path.

use crate::bundle::xdna::{route_rows, PlanChunk, PlanDesign, PlanError, XdnaPlan, PLAN_FILE};
use crate::bundle::{Bundle, BundleError};
use crate::exec::{GemmOffload, OffloadError};
use crate::kernels::qgemm::{self, QActivations, QGemmWeights};
use std::collections::HashMap;
use xdna_driver::{Driver, HwContext, Npu, NpuError};

/// Why an xdna bundle cannot run on the NPU, or a call on it failed.
#[derive(Debug, thiserror::Error)]
pub enum XdnaError {
    /// The plan file is missing from the bundle, or fails its check against the manifest.
    #[error(transparent)]
    PlanFile(#[from] BundleError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(
        "design {design}: the bundle has no {path} (device artifacts come from mlir-aie's aiecc on PATH at compile \
         time); run the bundle with --backend host"
    )]
    MissingArtifact { design: String, path: String },
    #[error("design {design}: {error}")]
    Npu { design: String, error: NpuError },
    #[error("{codes} activation codes for {m}×{k}")]
    Activations { codes: usize, m: usize, k: usize },
    #[error(
        "design {design} ({}×{}×{}) cannot take a {rows}×{k}×{cols} block at column {col_offset}",
        padded.0,
        padded.1,
        padded.2
    )]
    BlockTooLarge {
        design: String,
        padded: (usize, usize, usize),
        rows: usize,
        k: usize,
        cols: usize,
        col_offset: usize,
    },
}

struct DesignRun {
    /// Host shape (M, K, N) of the design's buffers.
    padded: (usize, usize, usize),
    cols: u32,
    pdi: Vec<u8>,
    insts: Vec<u8>,
}

/// The executor's offload onto an XDNA NPU (see the module doc).
pub struct XdnaOffload<D: Driver> {
    npu: Npu<D>,
    designs: HashMap<String, DesignRun>,
    gemms: HashMap<String, Vec<PlanChunk>>,
    contexts: HashMap<String, HwContext>,
    /// Per node, each column chunk's weight codes as the design's B operand (`[K, N]` zero-padded
    /// to its host shape), made on first use.
    operands: HashMap<String, Vec<Vec<i8>>>,
    host_threshold: usize,
    decode_rows: usize,
    prefill_rows: usize,
    /// Design runs submitted.
    pub runs: u64,
}

/// A design's device artifacts, read from the bundle.
fn design_run(bundle: &Bundle, d: &PlanDesign) -> Result<DesignRun, XdnaError> {
    let artifact =
        |path: String| bundle.read_file(&path).map_err(|_| XdnaError::MissingArtifact { design: d.name.clone(), path });
    let padded = &d.tiling.padded;
    Ok(DesignRun {
        padded: (padded.m, padded.k, padded.n),
        cols: d.tiling.cols as u32,
        pdi: artifact(d.pdi_file())?,
        insts: artifact(d.insts_file())?,
    })
}

impl<D: Driver + Send> XdnaOffload<D> {
    /// Reads the bundle's plan and every design's device artifacts (`xdna/<name>.pdi` and
    /// `xdna/<name>.insts.bin`, which aiecc writes at compile time).
    pub fn new(npu: Npu<D>, bundle: &Bundle) -> Result<XdnaOffload<D>, XdnaError> {
        let bytes = bundle.read_file(PLAN_FILE)?;
        let plan = XdnaPlan::decode(&bytes)?;
        let mut designs = HashMap::new();
        for d in &plan.designs {
            designs.insert(d.name.clone(), design_run(bundle, d)?);
        }
        let gemms = plan.gemms.into_iter().map(|g| (g.site.node, g.chunks)).collect();
        Ok(XdnaOffload {
            npu,
            designs,
            gemms,
            contexts: HashMap::new(),
            operands: HashMap::new(),
            host_threshold: plan.host_threshold_rows,
            decode_rows: plan.decode_rows,
            prefill_rows: plan.prefill_rows,
            runs: 0,
        })
    }
}

/// Runs one block of `design` on the NPU, making the design's hardware context on first use.
fn run_block<D: Driver>(
    npu: &mut Npu<D>,
    contexts: &mut HashMap<String, HwContext>,
    d: &DesignRun,
    design: &str,
    a: &[i8],
    b: &[i8],
) -> Result<Vec<i32>, XdnaError> {
    let failed = |error| XdnaError::Npu { design: design.to_string(), error };
    if !contexts.contains_key(design) {
        let ctx = npu.context(&d.pdi, d.cols).map_err(failed)?;
        contexts.insert(design.to_string(), ctx);
    }
    let (pm, _, pn) = d.padded;
    npu.run_gemm(&contexts[design], &d.insts, a, b, pm * pn).map_err(failed)
}

/// Each column chunk's weight codes as its design's B operand: `[K, N]` zero-padded to the host
/// shape.
fn operands(chunks: &[PlanChunk], designs: &HashMap<String, DesignRun>, w: QGemmWeights<'_>) -> Vec<Vec<i8>> {
    let (k, n) = (w.k(), w.n());
    let wk = w.codes_kn();
    chunks
        .iter()
        .map(|c| {
            let (_, pk, pn) = designs[&c.prefill_design].padded;
            let mut b = vec![0i8; pk * pn];
            if k <= pk && c.cols <= pn && c.col_offset + c.cols <= n {
                for kk in 0..k {
                    b[kk * pn..kk * pn + c.cols].copy_from_slice(&wk[kk * n + c.col_offset..][..c.cols]);
                }
            }
            b
        })
        .collect()
}

impl<D: Driver + Send> GemmOffload for XdnaOffload<D> {
    fn products(
        &mut self,
        node: &str,
        a: QActivations<'_>,
        m: usize,
        w: QGemmWeights<'_>,
    ) -> Result<Option<Vec<i32>>, OffloadError> {
        Ok(self.offload(node, a, m, w)?)
    }
}

impl<D: Driver + Send> XdnaOffload<D> {
    /// The products of one QGemm call computed on the NPU, or `None` when the call stays on the
    /// host (too few rows, or a node without designs).
    fn offload(
        &mut self,
        node: &str,
        a: QActivations<'_>,
        m: usize,
        w: QGemmWeights<'_>,
    ) -> Result<Option<Vec<i32>>, XdnaError> {
        let Some(blocks) = route_rows(self.host_threshold, self.decode_rows, self.prefill_rows, m) else {
            return Ok(None);
        };
        let Some(chunks) = self.gemms.get(node) else { return Ok(None) };
        let a = qgemm::signed_codes(a);
        let (k, n) = (w.k(), w.n());
        if a.len() != m * k {
            return Err(XdnaError::Activations { codes: a.len(), m, k });
        }
        let operands = self.operands.entry(node.to_string()).or_insert_with(|| operands(chunks, &self.designs, w));
        let mut p = vec![0i32; m * n];
        let mut r0 = 0;
        for (block, used) in blocks {
            for (c, b) in chunks.iter().zip(operands.iter()) {
                let design = if block == self.decode_rows { &c.decode_design } else { &c.prefill_design };
                let d = &self.designs[design];
                let (pm, pk, pn) = d.padded;
                if used > pm || k > pk || c.cols > pn || c.col_offset + c.cols > n || b.len() != pk * pn {
                    return Err(XdnaError::BlockTooLarge {
                        design: design.clone(),
                        padded: d.padded,
                        rows: used,
                        k,
                        cols: c.cols,
                        col_offset: c.col_offset,
                    });
                }
                let mut ab = vec![0i8; pm * pk];
                for i in 0..used {
                    ab[i * pk..i * pk + k].copy_from_slice(&a[(r0 + i) * k..(r0 + i + 1) * k]);
                }
                let out = run_block(&mut self.npu, &mut self.contexts, d, design, &ab, b)?;
                self.runs += 1;
                for i in 0..used {
                    p[(r0 + i) * n + c.col_offset..][..c.cols].copy_from_slice(&out[i * pn..][..c.cols]);
                }
            }
            r0 += used;
        }
        Ok(Some(p))
    }
}

impl<D: Driver> Drop for XdnaOffload<D> {
    fn drop(&mut self) {
        for (_, ctx) in self.contexts.drain() {
            self.npu.release(ctx);
        }
    }
}

//! The `xrt` backend's run path: an xdna bundle on the host executor with its array-sized GEMMs
//! on the XDNA NPU, through the amdxdna driver's ioctls (`xdna_driver`).
//!
//! [`XdnaOffload`] is the executor's [`GemmOffload`]: for a QGemm the plan gives designs to, a
//! call is cut as the plan cuts it (`route_rows`: below `host_threshold_rows` rows, blocks of the
//! GEMV design — a decode step's one row, zero-padded to the design's rows —, from there on
//! M-blocks of the decode or prefill design; column chunks), each block zero-padded to its
//! design's host shape and run on the NPU with that design's PDI and instruction stream (one
//! hardware context per design, made on first use); the int32 products come back to the
//! executor, which applies the same epilogue as its own kernels. A GEMM design's B operand is
//! the weight `[K, N]`, a GEMV design's the weight transposed (`[N, K]`), each made once per node
//! and kind. Calls the plan has no design for (no GEMV designs in a plan of format `/2`), and
//! nodes without designs, stay on the host.
//!
//! The plan is `bundle::xdna`'s typed `xdna/plan.json`, routed with its `route_rows`, the function
//! the compiler plans with; a plan that does not decode is refused naming the field's JSON path.

use crate::bundle::xdna::{
    block_design, route_rows, DesignKind, PlanChunk, PlanDesign, PlanError, XdnaPlan, PLAN_FILE,
};
use crate::bundle::{Bundle, BundleError};
use crate::exec::{GemmOffload, OffloadError};
use crate::kernels::qgemm::{self, QActivations, QGemmWeights};
use std::collections::HashMap;
use std::sync::Arc;
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
    kind: DesignKind,
    /// Host shape (M, K, N) of the design's buffers.
    padded: (usize, usize, usize),
    /// Array columns of its hardware context.
    cols: u32,
    pdi: Vec<u8>,
    insts: Vec<u8>,
}

/// The executor's offload onto an XDNA NPU (see the module doc).
pub struct XdnaOffload<D: Driver> {
    npu: Npu<D>,
    designs: HashMap<String, DesignRun>,
    /// Per node, its column chunks (shared, so a call holds them beside `&mut self`).
    gemms: HashMap<String, Arc<[PlanChunk]>>,
    contexts: HashMap<String, HwContext>,
    /// Per node and design kind, each column chunk's weight codes as the design's B operand
    /// (`[K, N]` for a GEMM, `[N, K]` for a GEMV, zero-padded to its host shape), made on first
    /// use.
    operands: HashMap<(String, DesignKind), Vec<Vec<i8>>>,
    host_threshold: usize,
    gemv_rows: usize,
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
        kind: d.kind,
        padded: (padded.m, padded.k, padded.n),
        cols: d.array_columns as u32,
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
        let gemms = plan.gemms.into_iter().map(|g| (g.site.node, g.chunks.into())).collect();
        Ok(XdnaOffload {
            npu,
            designs,
            gemms,
            contexts: HashMap::new(),
            operands: HashMap::new(),
            host_threshold: plan.host_threshold_rows,
            gemv_rows: plan.gemv_rows,
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

/// Each column chunk's weight codes as the B operand of its designs of `kind` (`design` names
/// the chunk's design of that kind): `[K, N]` for a GEMM, `[N, K]` for a GEMV, zero-padded to the
/// host shape. A chunk that does not fit its design gets an empty operand, which the call refuses.
fn operands(
    chunks: &[PlanChunk],
    designs: &HashMap<String, DesignRun>,
    w: QGemmWeights<'_>,
    design: &dyn Fn(&PlanChunk) -> Option<String>,
) -> Vec<Vec<i8>> {
    let (k, n) = (w.k(), w.n());
    let wk = w.codes_kn();
    chunks
        .iter()
        .map(|c| {
            let Some(d) = design(c).and_then(|name| designs.get(&name)) else { return vec![] };
            let (_, pk, pn) = d.padded;
            if k > pk || c.cols > pn || c.col_offset + c.cols > n {
                return vec![];
            }
            let mut b = vec![0i8; pk * pn];
            for kk in 0..k {
                let row = &wk[kk * n + c.col_offset..][..c.cols];
                match d.kind {
                    DesignKind::Gemm => b[kk * pn..kk * pn + c.cols].copy_from_slice(row),
                    DesignKind::Gemv => row.iter().enumerate().for_each(|(j, &x)| b[j * pk + kk] = x),
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
    /// host (a node without designs, or a block the plan has no design for).
    fn offload(
        &mut self,
        node: &str,
        a: QActivations<'_>,
        m: usize,
        w: QGemmWeights<'_>,
    ) -> Result<Option<Vec<i32>>, XdnaError> {
        let Some(blocks) = route_rows(self.host_threshold, self.gemv_rows, self.decode_rows, self.prefill_rows, m)
        else {
            return Ok(None);
        };
        let Some(chunks) = self.gemms.get(node).cloned() else { return Ok(None) };
        let (gemv_rows, decode_rows) = (self.gemv_rows, self.decode_rows);
        if blocks
            .iter()
            .any(|&(block, _)| chunks.iter().any(|c| block_design(c, gemv_rows, decode_rows, block).is_none()))
        {
            return Ok(None);
        }
        let a = qgemm::signed_codes(a);
        let (k, n) = (w.k(), w.n());
        if a.len() != m * k {
            return Err(XdnaError::Activations { codes: a.len(), m, k });
        }
        let mut p = vec![0i32; m * n];
        let mut r0 = 0;
        for (block, used) in blocks {
            let kind = block_design(&chunks[0], gemv_rows, decode_rows, block)
                .map_or(DesignKind::Gemm, |d| self.designs[d].kind);
            let key = (node.to_string(), kind);
            let by_kind = |c: &PlanChunk| match kind {
                DesignKind::Gemv => c.gemv_design.clone(),
                DesignKind::Gemm => Some(c.prefill_design.clone()),
            };
            // Taken out while the chunks run, so the NPU can be borrowed beside them.
            let bs = self.operands.remove(&key).unwrap_or_else(|| operands(&chunks, &self.designs, w, &by_kind));
            for (c, b) in chunks.iter().zip(&bs) {
                let design = block_design(c, gemv_rows, decode_rows, block).unwrap_or_default();
                let rows = &a[r0 * k..(r0 + used) * k];
                let out = self.run_chunk(design, c, b, rows, (used, k, n))?;
                let pn = self.designs[design].padded.2;
                for i in 0..used {
                    p[(r0 + i) * n + c.col_offset..][..c.cols].copy_from_slice(&out[i * pn..][..c.cols]);
                }
            }
            self.operands.insert(key, bs);
            r0 += used;
        }
        Ok(Some(p))
    }

    /// One block of one column chunk on `design`: `rows` (`used × k` codes) zero-padded to the
    /// design's host shape with the chunk's B operand `b`; returns the padded int32 output.
    fn run_chunk(
        &mut self,
        design: &str,
        c: &PlanChunk,
        b: &[i8],
        rows: &[i8],
        (used, k, n): (usize, usize, usize),
    ) -> Result<Vec<i32>, XdnaError> {
        let d = &self.designs[design];
        let (pm, pk, pn) = d.padded;
        if used > pm || k > pk || c.cols > pn || c.col_offset + c.cols > n || b.len() != pk * pn {
            return Err(XdnaError::BlockTooLarge {
                design: design.to_string(),
                padded: d.padded,
                rows: used,
                k,
                cols: c.cols,
                col_offset: c.col_offset,
            });
        }
        let mut ab = vec![0i8; pm * pk];
        for (i, row) in rows.chunks(k).enumerate() {
            ab[i * pk..i * pk + k].copy_from_slice(row);
        }
        let out = run_block(&mut self.npu, &mut self.contexts, d, design, &ab, b)?;
        self.runs += 1;
        Ok(out)
    }
}

impl<D: Driver> Drop for XdnaOffload<D> {
    fn drop(&mut self) {
        for (_, ctx) in self.contexts.drain() {
            self.npu.release(ctx);
        }
    }
}

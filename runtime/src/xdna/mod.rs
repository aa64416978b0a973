//! The `xrt` backend's run path: an xdna bundle on the host executor with its array-sized GEMMs
//! on the XDNA NPU, through the amdxdna driver's ioctls (`xdna_driver`).
//!
//! [`XdnaOffload`] is the executor's [`GemmOffload`]: for a QGemm the plan gives designs to, a
//! call is cut as the plan cuts it (`XdnaPlan::calls`: below `host_threshold_rows` rows, blocks
//! of the GEMV design over the projection's GEMV column chunks — a decode step's rows,
//! zero-padded to the design's rows —, from there on M-blocks of the decode or prefill design
//! over its M-block chunks, a residual pass's chunk taking the first activation pass's rows),
//! each block zero-padded to its design's host shape and run on the NPU with that design's PDI
//! and instruction stream (one hardware context per design, made on first use); the int32
//! products come back to the executor, which applies the same epilogue as its own kernels. A GEMM
//! design's B operand is the weight chunk `[K, n]`, a GEMV design's the chunk transposed
//! (`[n, K]`), each made once per node, chunk and kind. Calls the plan has no design for, and
//! nodes without designs, stay on the host. A one-row step's chained projections, and the MLPs
//! the plan makes one array program, skip all that: the executor hands their f32 inputs over
//! and takes their f32 outputs back (`chains`).
//!
//! The plan is `bundle::xdna`'s typed `xdna/plan.json`, routed with its `array_calls`, the
//! function the compiler's cost model counts with; a plan that does not decode is refused naming
//! the field's JSON path.

use crate::bundle::xdna::{
    array_calls, ArrayCall, DesignKind, PlanChain, PlanDesign, PlanError, PlanGemm, PlanProgram, QgemvLayout, Routing,
    XdnaPlan, PLAN_FILE,
};
use crate::bundle::{Bundle, BundleError};
use crate::exec::{GemmOffload, OffloadChain, OffloadError};
use crate::kernels::qgemm::{self, QActivations, QGemmWeights};
use std::collections::HashMap;
use std::sync::Arc;
use xdna_driver::{Driver, HwContext, Npu, NpuError};

mod chains;

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
    #[error("design {design} is not a qgemv design, which a chain calls")]
    NotQgemv { design: String },
    #[error("design {design} cannot take {rows} rows of {k} values")]
    ChainRows { design: String, rows: usize, k: usize },
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
    /// A qgemv design's operands.
    layout: Option<QgemvLayout>,
}

/// A B operand's node, chunk (first column), design kind and host shape (K, N).
type OperandKey = (String, usize, DesignKind, (usize, usize));

/// The executor's offload onto an XDNA NPU (see the module doc).
pub struct XdnaOffload<D: Driver> {
    npu: Npu<D>,
    designs: HashMap<String, DesignRun>,
    /// Per node, its projection's chunks (shared, so a call holds them beside `&mut self`).
    gemms: HashMap<String, Arc<PlanGemm>>,
    contexts: HashMap<String, HwContext>,
    /// Per node, chunk (its first column), design kind and host shape (K, N), the chunk's weight
    /// codes as the design's B operand (`[K, n]` for a GEMM, `[n, K]` for a GEMV, zero-padded),
    /// made on first use: a chunk's decode and prefill designs share one when their shapes agree.
    operands: HashMap<OperandKey, Vec<i8>>,
    routing: Routing,
    /// Decode's chained projections, and per chain and chunk its weight operand (made on
    /// first use).
    chains: Vec<PlanChain>,
    chain_operands: HashMap<chains::ChunkKey, Vec<u8>>,
    /// What the executor runs as one call each: a chain, or a program of chains.
    units: Vec<chains::Unit>,
    programs: Vec<PlanProgram>,
    /// Each program's device artifacts, by name.
    program_runs: HashMap<String, DesignRun>,
    /// Programs the bundle has no device artifacts for: they run as their chains.
    pub unbuilt_programs: Vec<String>,
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
        layout: d.qgemv,
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
        let routing = plan.routing();
        let chains::Units { units, programs, unbuilt: unbuilt_programs, runs: program_runs } =
            chains::units(bundle, &plan)?;
        let gemms = plan.gemms.into_iter().map(|g| (g.site.node.clone(), Arc::new(g))).collect();
        Ok(XdnaOffload {
            npu,
            designs,
            gemms,
            contexts: HashMap::new(),
            operands: HashMap::new(),
            routing,
            chains: plan.chains,
            chain_operands: HashMap::new(),
            units,
            programs,
            program_runs,
            unbuilt_programs,
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
    let (pm, _, pn) = d.padded;
    let bytes = |v: &[i8]| v.iter().map(|&x| x as u8).collect::<Vec<u8>>();
    let mut outs = run_design(npu, contexts, (d, design), &[&bytes(a), &bytes(b)], &[4 * pm * pn])?;
    let out = outs.pop().expect("one output");
    Ok(out.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Runs `design` on the NPU with `inputs` and outputs of `out_bytes` each after them, making
/// its hardware context on first use; returns the outputs.
fn run_design<D: Driver>(
    npu: &mut Npu<D>,
    contexts: &mut HashMap<String, HwContext>,
    (d, design): (&DesignRun, &str),
    inputs: &[&[u8]],
    out_bytes: &[usize],
) -> Result<Vec<Vec<u8>>, XdnaError> {
    let failed = |error| XdnaError::Npu { design: design.to_string(), error };
    if !contexts.contains_key(design) {
        let ctx = npu.context(&d.pdi, d.cols).map_err(failed)?;
        contexts.insert(design.to_string(), ctx);
    }
    npu.run_outputs(&contexts[design], &d.insts, inputs, out_bytes).map_err(failed)
}

/// One chunk's weight codes as the B operand of `d`, from the whole weight's codes `wk`
/// (`[k, n]` row-major): `[K, cols]` for a GEMM, `[cols, K]` for a GEMV, zero-padded to the
/// design's host shape; empty when the chunk does not fit the design, which the call then refuses.
fn operand(d: &DesignRun, wk: &[i8], (k, n): (usize, usize), col_offset: usize, cols: usize) -> Vec<i8> {
    let (_, pk, pn) = d.padded;
    let transposed = match d.kind {
        DesignKind::Gemm => false,
        DesignKind::Gemv => true,
        // A qgemv design's operand carries the weight's scales, which this int32 offload has not.
        DesignKind::Qgemv => return vec![],
    };
    if k > pk || cols > pn || col_offset + cols > n {
        return vec![];
    }
    let mut b = vec![0i8; pk * pn];
    for kk in 0..k {
        let row = &wk[kk * n + col_offset..][..cols];
        if transposed {
            row.iter().enumerate().for_each(|(j, &x)| b[j * pk + kk] = x);
        } else {
            b[kk * pn..kk * pn + cols].copy_from_slice(row);
        }
    }
    b
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

    fn chains(&self) -> Vec<OffloadChain> {
        self.units.iter().map(|u| self.offload_chain(u)).collect()
    }

    fn run_chain(
        &mut self,
        index: usize,
        inputs: &[&[f32]],
        rows: usize,
        w: &[QGemmWeights<'_>],
    ) -> Result<Vec<Vec<f32>>, OffloadError> {
        Ok(self.run_unit(index, inputs, rows, w)?)
    }
}

impl<D: Driver + Send> XdnaOffload<D> {
    /// The products of one QGemm call computed on the NPU, or `None` when the call stays on the
    /// host (a node without designs, or rows the plan has no design for). Rows a call's chunk
    /// does not take (a residual pass's chunk, of the later passes' rows) stay 0: the epilogue
    /// does not read them.
    fn offload(
        &mut self,
        node: &str,
        a: QActivations<'_>,
        m: usize,
        w: QGemmWeights<'_>,
    ) -> Result<Option<Vec<i32>>, XdnaError> {
        let Some(gemm) = self.gemms.get(node).cloned() else { return Ok(None) };
        let chunks = (&gemm.chunks[..], &gemm.gemv_chunks[..]);
        let Some(calls) = array_calls(self.routing, gemm.site.passes, chunks, m) else { return Ok(None) };
        let a = qgemm::signed_codes(a);
        let (k, n) = (w.k(), w.n());
        if a.len() != m * k {
            return Err(XdnaError::Activations { codes: a.len(), m, k });
        }
        let mut p = vec![0i32; m * n];
        // The weight's codes, unpacked once for every operand this call makes.
        let mut wk = None;
        for call in calls {
            let d = &self.designs[call.design];
            let key = (node.to_string(), call.col_offset, d.kind, (d.padded.1, d.padded.2));
            // Taken out while the block runs, so the NPU can be borrowed beside it.
            let b = self.operands.remove(&key).unwrap_or_else(|| {
                let wk = wk.get_or_insert_with(|| w.codes_kn());
                operand(d, wk, (k, n), call.col_offset, call.cols)
            });
            let rows = &a[call.first * k..(call.first + call.used) * k];
            let out = self.run_block(&call, &b, rows, (k, n))?;
            let pn = self.designs[call.design].padded.2;
            for i in 0..call.used {
                p[(call.first + i) * n + call.col_offset..][..call.cols].copy_from_slice(&out[i * pn..][..call.cols]);
            }
            self.operands.insert(key, b);
        }
        Ok(Some(p))
    }

    /// One block on its design: `rows` (`used × k` codes) zero-padded to the design's host shape
    /// with the chunk's B operand `b`; returns the padded int32 output.
    fn run_block(
        &mut self,
        call: &ArrayCall<'_>,
        b: &[i8],
        rows: &[i8],
        (k, n): (usize, usize),
    ) -> Result<Vec<i32>, XdnaError> {
        let d = &self.designs[call.design];
        let (pm, pk, pn) = d.padded;
        let (used, cols, col_offset) = (call.used, call.cols, call.col_offset);
        if used > pm || k > pk || cols > pn || col_offset + cols > n || b.len() != pk * pn {
            let design = call.design.to_string();
            return Err(XdnaError::BlockTooLarge { design, padded: d.padded, rows: used, k, cols, col_offset });
        }
        let mut ab = vec![0i8; pm * pk];
        for (i, row) in rows.chunks(k).enumerate() {
            ab[i * pk..i * pk + k].copy_from_slice(row);
        }
        let out = run_block(&mut self.npu, &mut self.contexts, d, call.design, &ab, b)?;
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

//! The `xrt` backend's run path: an xdna bundle on the host executor with its array-sized GEMMs
//! on the XDNA NPU, through the amdxdna driver's ioctls (`xdna_driver`).
//!
//! [`XdnaOffload`] is the executor's [`GemmOffload`]: for a QGemm the plan gives designs to, a
//! call of at least `host_threshold_rows` rows is cut as the plan cuts it (M-blocks of the decode
//! or prefill design, column chunks), each block zero-padded to its design's host shape and run
//! on the NPU with that design's PDI and instruction stream (one hardware context per design,
//! made on first use); the int32 products come back to the executor, which applies the same
//! epilogue as its own kernels. Smaller calls, and nodes without designs, stay on the host.

use crate::bundle::Bundle;
use crate::exec::GemmOffload;
use crate::kernels::qgemm::{self, QActivations, QGemmWeights};
use serde_json::Value;
use std::collections::HashMap;
use xdna_driver::plan::{route_rows, PLAN_FILE};
use xdna_driver::{Driver, HwContext, Npu};

struct DesignRun {
    /// Host shape (M, K, N) of the design's buffers.
    padded: (usize, usize, usize),
    cols: u32,
    pdi: Vec<u8>,
    insts: Vec<u8>,
}

struct Chunk {
    col_offset: usize,
    cols: usize,
    decode: String,
    prefill: String,
}

/// The executor's offload onto an XDNA NPU (see the module doc).
pub struct XdnaOffload<D: Driver> {
    npu: Npu<D>,
    designs: HashMap<String, DesignRun>,
    gemms: HashMap<String, Vec<Chunk>>,
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

fn usize_of(v: &Value, what: &str) -> Result<usize, String> {
    v.as_u64().map(|x| x as usize).ok_or_else(|| format!("{PLAN_FILE}: `{what}` is not a number"))
}

impl<D: Driver + Send> XdnaOffload<D> {
    /// Reads the bundle's plan and every design's device artifacts (`xdna/<name>.pdi` and
    /// `xdna/<name>.insts.bin`, which aiecc writes at compile time).
    pub fn new(npu: Npu<D>, bundle: &Bundle) -> Result<XdnaOffload<D>, String> {
        let bytes = bundle.read_file(PLAN_FILE).map_err(|e| e.to_string())?;
        let plan: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{PLAN_FILE}: {e}"))?;
        let mut designs = HashMap::new();
        for d in plan["designs"].as_array().into_iter().flatten() {
            let name = d["name"].as_str().ok_or_else(|| format!("{PLAN_FILE}: a design without a name"))?;
            let t = &d["tiling"];
            let padded = (
                usize_of(&t["padded"]["m"], "padded.m")?,
                usize_of(&t["padded"]["k"], "padded.k")?,
                usize_of(&t["padded"]["n"], "padded.n")?,
            );
            let artifact = |key: &str, ext: &str| -> Result<Vec<u8>, String> {
                let path = d[key].as_str().map(str::to_string).unwrap_or_else(|| format!("xdna/{name}.{ext}"));
                bundle.read_file(&path).map_err(|_| {
                    format!(
                        "design {name}: the bundle has no {path} (device artifacts come from mlir-aie's aiecc on \
                         PATH at compile time); run the bundle with --backend host"
                    )
                })
            };
            let run = DesignRun {
                padded,
                cols: usize_of(&t["cols"], "cols")? as u32,
                pdi: artifact("pdi", "pdi")?,
                insts: artifact("insts", "insts.bin")?,
            };
            designs.insert(name.to_string(), run);
        }
        let mut gemms = HashMap::new();
        for g in plan["gemms"].as_array().into_iter().flatten() {
            let node = g["site"]["node"].as_str().ok_or_else(|| format!("{PLAN_FILE}: a GEMM without a node"))?;
            let mut chunks = Vec::new();
            for c in g["chunks"].as_array().into_iter().flatten() {
                let name = |k: &str| -> Result<String, String> {
                    let n = c[k].as_str().ok_or_else(|| format!("{PLAN_FILE}: {node}: no {k}"))?;
                    if !designs.contains_key(n) {
                        return Err(format!("{PLAN_FILE}: {node} calls unknown design {n}"));
                    }
                    Ok(n.to_string())
                };
                chunks.push(Chunk {
                    col_offset: usize_of(&c["col_offset"], "col_offset")?,
                    cols: usize_of(&c["cols"], "cols")?,
                    decode: name("decode_design")?,
                    prefill: name("prefill_design")?,
                });
            }
            gemms.insert(node.to_string(), chunks);
        }
        Ok(XdnaOffload {
            npu,
            designs,
            gemms,
            contexts: HashMap::new(),
            operands: HashMap::new(),
            host_threshold: usize_of(&plan["host_threshold_rows"], "host_threshold_rows")?,
            decode_rows: usize_of(&plan["decode_rows"], "decode_rows")?,
            prefill_rows: usize_of(&plan["prefill_rows"], "prefill_rows")?,
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
) -> Result<Vec<i32>, String> {
    if !contexts.contains_key(design) {
        let ctx = npu.context(&d.pdi, d.cols).map_err(|e| format!("design {design}: {e}"))?;
        contexts.insert(design.to_string(), ctx);
    }
    let (pm, _, pn) = d.padded;
    npu.run_gemm(&contexts[design], &d.insts, a, b, pm * pn).map_err(|e| format!("design {design}: {e}"))
}

/// Each column chunk's weight codes as its design's B operand: `[K, N]` zero-padded to the host
/// shape.
fn operands(chunks: &[Chunk], designs: &HashMap<String, DesignRun>, w: QGemmWeights<'_>) -> Vec<Vec<i8>> {
    let (k, n) = (w.k(), w.n());
    let wk = w.codes_kn();
    chunks
        .iter()
        .map(|c| {
            let (_, pk, pn) = designs[&c.prefill].padded;
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
    ) -> Result<Option<Vec<i32>>, String> {
        let Some(blocks) = route_rows(self.host_threshold, self.decode_rows, self.prefill_rows, m) else {
            return Ok(None);
        };
        let Some(chunks) = self.gemms.get(node) else { return Ok(None) };
        let a = qgemm::signed_codes(a);
        let (k, n) = (w.k(), w.n());
        if a.len() != m * k {
            return Err(format!("{} activation codes for {m}×{k}", a.len()));
        }
        let operands = self.operands.entry(node.to_string()).or_insert_with(|| operands(chunks, &self.designs, w));
        let mut p = vec![0i32; m * n];
        let mut r0 = 0;
        for (block, used) in blocks {
            for (c, b) in chunks.iter().zip(operands.iter()) {
                let design = if block == self.decode_rows { &c.decode } else { &c.prefill };
                let d = &self.designs[design];
                let (pm, pk, pn) = d.padded;
                if used > pm || k > pk || c.cols > pn || c.col_offset + c.cols > n || b.len() != pk * pn {
                    return Err(format!(
                        "design {design} ({pm}×{pk}×{pn}) cannot take a {used}×{k}×{} block at column {}",
                        c.cols, c.col_offset
                    ));
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

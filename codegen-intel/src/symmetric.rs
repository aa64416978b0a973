//! Symmetric weights for the NPU, and the host program that runs the same model.
//!
//! The Intel NPU decompresses symmetric int4/int8 weights only (`code · scale`, no zero point),
//! with f16 scales. [`symmetrize`] rewrites every `WGemm`/`WGemmRowScaled` whose weights have
//! zero points other than the default 2^(bits−1), or whose scales are not f16 values, into the
//! same op over new weights: codes stored as MatMulNBits expects them (unsigned, default zero
//! point, so the host executor runs them unchanged) and f32 scales that are exactly f16 values.
//! The IR writer reads those very weights (code − 2^(bits−1) is the two's complement `i4`/`i8`
//! code, a flip of the top bit), so the host program and the OpenVINO IR compute with identical
//! weight values. Re-quantising an asymmetric weight costs accuracy: the error is measured per
//! weight and reported, or the model is refused when the options ask for that.

use crate::{ConstantError, IntelError};
use bytes::Bytes;
use ir::graph::{Graph, Value, ValueDef, ValueId};
use ir::{DType, Domain, Weight, WeightId, WeightStore};
use std::collections::HashMap;
use std::sync::Arc;

/// What to do with weights that have non-default zero points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asymmetric {
    /// Re-quantise them symmetrically (per group, the f16 scale near max|w| / (2^(bits−1) − 1) with the
    /// least squared error).
    Requantize,
    /// Refuse the model, naming the first such weight.
    Reject,
}

/// The cost of making one weight symmetric with f16 scales.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightError {
    /// The codes' weight name in the model.
    pub weight: String,
    /// Whether the codes changed (asymmetric zero points) or only the scales were rounded to f16.
    pub requantized: bool,
    /// For a float weight compressed for the NPU: the format it was stored in.
    pub from_float: Option<crate::float::FloatWeights>,
    /// max |w' − w| / max |w| over the weight.
    pub max_rel: f64,
    /// mean |w' − w| / mean |w| over the weight.
    pub mean_rel: f64,
}

struct Decoded {
    groups: usize,
    block: usize,
    bits: usize,
    bytes_per_group: usize,
}

impl Decoded {
    fn code(&self, w: &[u8], n: usize, k: usize) -> i32 {
        let (g, j) = (k / self.block, k % self.block);
        let base = (n * self.groups + g) * self.bytes_per_group;
        match self.bits {
            8 => w[base + j] as i32,
            _ => {
                let b = w[base + j / 2];
                (if j % 2 == 0 { b & 0x0f } else { b >> 4 }) as i32
            }
        }
    }
}

fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// The f16 scale for one group that minimises the squared rounding error: max|w|/qmax and a few
/// smaller ones (clipping the largest weights a little buys finer steps for all the others).
pub(crate) fn best_scale(w: &[f32], qmax: f32, offset: i32) -> f32 {
    let absmax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut best = (f64::INFINITY, f16_round(absmax / qmax));
    for step in 0..12 {
        let scale = f16_round(absmax / qmax * (1.0 - 0.025 * step as f32));
        if scale <= 0.0 {
            break;
        }
        let sse: f64 = w
            .iter()
            .map(|&v| {
                let q = ((v / scale).round() as i32).clamp(-offset, offset - 1);
                ((q as f32 * scale - v) as f64).powi(2)
            })
            .sum();
        if sse < best.0 {
            best = (sse, scale);
        }
    }
    best.1
}

/// The weight behind a value, when the value is one.
pub(crate) fn weight_of(g: &Graph, v: ValueId) -> Option<WeightId> {
    match g.value(v).def {
        ValueDef::Weight(w) => Some(w),
        _ => None,
    }
}

/// The graph with symmetric weights and f16-exact scales in every weight-only GEMM, and the error
/// that cost per weight. Nodes other than `WGemm`/`WGemmRowScaled` are unchanged, except that a
/// `GatherBlockQuantized` reading a rescaled scale weight (a tied embedding) reads the rescaled one.
pub fn symmetrize(g: &Graph, policy: Asymmetric) -> Result<(Graph, Vec<WeightError>), IntelError> {
    let promoted = promote_constants(g)?;
    let g = &promoted;
    let mut s = Symmetrize {
        g,
        policy,
        store: copy_store(g),
        out: g.clone(),
        reports: Vec::new(),
        done: HashMap::new(),
        rescaled: HashMap::new(),
    };
    for (ni, node) in g.nodes.iter().enumerate() {
        if node.domain == Domain::Npuc && matches!(node.op, "WGemm" | "WGemmRowScaled") {
            s.gemm(ni)?;
        }
    }
    // A tied embedding reads the GEMM's weights: it must read the symmetric ones too. An embedding
    // of its own with zero points is re-quantised the same way.
    for (ni, node) in g.nodes.iter().enumerate() {
        if node.op == "GatherBlockQuantized" {
            s.embedding(ni)?;
        }
    }
    let Symmetrize { mut out, store, reports, .. } = s;
    // Trailing optional inputs that became absent are dropped, as the importer writes them.
    for node in out.nodes.iter_mut() {
        while node.inputs.last().is_some_and(|i| i.is_none()) {
            node.inputs.pop();
        }
    }
    out.weights = Arc::new(store);
    Ok((out.pruned(), reports))
}

/// A store holding `g`'s weights, with the same ids.
pub(crate) fn copy_store(g: &Graph) -> WeightStore {
    let mut store = WeightStore::default();
    for (_, w) in g.weights.iter() {
        store.add(Weight::new(w.name.clone(), w.dtype, w.shape.clone(), w.bytes.clone()));
    }
    store
}

/// [`symmetrize`] under way: the new weights and program, and what is already done.
struct Symmetrize<'a> {
    g: &'a Graph,
    policy: Asymmetric,
    store: WeightStore,
    out: Graph,
    reports: Vec<WeightError>,
    /// (codes, scales, zero points) → (new codes value, new scales value).
    done: HashMap<(WeightId, WeightId, Option<ValueId>), (ValueId, ValueId)>,
    /// Scales rounded to f16 whose codes stayed → the new scales value.
    rescaled: HashMap<WeightId, ValueId>,
}

impl Symmetrize<'_> {
    /// Node `ni`, a weight-only GEMM, over symmetric codes and f16-exact scales.
    fn gemm(&mut self, ni: usize) -> Result<(), IntelError> {
        let g = self.g;
        let node = &g.nodes[ni];
        let attr = |k: &str| node.attrs.int(k).ok().flatten().unwrap_or(0).max(0) as usize;
        let (k, n, bits, block) = (attr("K"), attr("N"), attr("bits"), attr("block_size"));
        let bad = |msg: String| IntelError::Unsupported { node: node.name.clone(), msg };
        if !(bits == 4 || bits == 8) || block == 0 || k == 0 || n == 0 || (bits == 4 && block % 2 != 0) {
            return Err(bad(format!("weight-only GEMM with K={k} N={n} bits={bits} block_size={block}")));
        }
        let input = |i: usize| node.inputs.get(i).copied().flatten();
        let (Some(wv), Some(sv)) = (input(1), input(2)) else {
            return Err(bad("weight-only GEMM without weights or scales".into()));
        };
        let (Some(wid), Some(sid)) = (weight_of(g, wv), weight_of(g, sv)) else {
            let kind = |v: ValueId| match g.value(v).def {
                ValueDef::Node { node, .. } => format!("`{}` computed by {}", g.value(v).name, g.node(node).op),
                _ => format!("`{}`", g.value(v).name),
            };
            return Err(bad(format!("weights {} and scales {} must be model weights", kind(wv), kind(sv))));
        };
        let key = (wid, sid, input(3));
        if let Some(&(nw, ns)) = self.done.get(&key) {
            self.rewire(ni, nw, ns);
            return Ok(());
        }
        let groups = k.div_ceil(block);
        let d = Decoded { groups, block, bits, bytes_per_group: block * bits / 8 };
        let w = g.weights.get(wid);
        if w.dtype != DType::U8 || w.bytes.len() != n * groups * d.bytes_per_group {
            return Err(bad(format!(
                "weights `{}` are {} {:?}, expected uint8 [{n}, {groups}, {}]",
                w.name, w.dtype, w.shape, d.bytes_per_group
            )));
        }
        let s = g.weights.get(sid);
        let scales = s.to_tensor().map_err(|e| bad(format!("scales `{}`: {e}", s.name)))?.to_f32_vec();
        if scales.len() != n * groups {
            return Err(bad(format!("scales `{}` hold {} values, expected {n}×{groups}", s.name, scales.len())));
        }
        let offset = 1i32 << (bits - 1);
        let zero_points = match key.2 {
            None => None,
            Some(z) => Some(decode_zero_points(g, &node.name, z, n, groups, bits)?),
        };
        let asymmetric = zero_points.as_ref().is_some_and(|z| z.iter().any(|&v| v != offset as f32));
        if asymmetric && self.policy == Asymmetric::Reject {
            return Err(IntelError::Asymmetric { node: node.name.clone(), weight: w.name.clone() });
        }
        let (codes, new_scales, max_rel, mean_rel) =
            requantize(&w.bytes, &scales, zero_points.as_deref(), n, k, &d, asymmetric);
        let nw =
            if asymmetric { self.add_weight(wv, format!("{}.sym", w.name), DType::U8, &w.shape, codes) } else { wv };
        let ns = self.add_weight(sv, format!("{}.f16", s.name), DType::F32, &s.shape, f32_bytes(&new_scales));
        if !asymmetric {
            self.rescaled.insert(sid, ns);
        }
        self.done.insert(key, (nw, ns));
        self.rewire(ni, nw, ns);
        self.reports.push(WeightError {
            weight: w.name.clone(),
            requantized: asymmetric,
            from_float: None,
            max_rel,
            mean_rel,
        });
        Ok(())
    }

    /// Node `ni`, a quantised embedding, over the symmetric codes and scales of the GEMM whose
    /// weights it shares, or over its own re-quantised ones when it has zero points of its own.
    fn embedding(&mut self, ni: usize) -> Result<(), IntelError> {
        let g = self.g;
        let node = &g.nodes[ni];
        let bad = |msg: String| IntelError::Unsupported { node: node.name.clone(), msg };
        let input = |i: usize| node.inputs.get(i).copied().flatten();
        let (Some(dv), Some(sv)) = (input(0), input(2)) else {
            return Err(bad("a quantised embedding without data or scales".into()));
        };
        // The codes, possibly through a Reshape (a tied lm_head's [N, G, group] codes).
        let reshape = match g.value(dv).def {
            ValueDef::Node { node, .. } if g.node(node).op == "Reshape" => Some(node),
            _ => None,
        };
        let codes_v = match reshape {
            Some(r) => g.node(r).inputs[0].ok_or_else(|| bad("a Reshape without input".into()))?,
            None => dv,
        };
        let (Some(wid), Some(sid)) = (weight_of(g, codes_v), weight_of(g, sv)) else {
            return Err(bad("a quantised embedding whose codes and scales are not model weights".into()));
        };
        let zp = input(3);
        let replacement = match (zp, self.done.get(&(wid, sid, zp))) {
            (None, _) => self.rescaled.get(&sid).map(|&ns| (codes_v, ns)),
            (Some(_), Some(&pair)) => Some(pair),
            (Some(z), None) => Some(self.own_embedding(node, (codes_v, wid), (sv, sid), z)?),
        };
        if let Some((nw, ns)) = replacement {
            match reshape {
                Some(r) => self.out.nodes[r.0 as usize].inputs[0] = Some(nw),
                None => self.out.nodes[ni].inputs[0] = Some(nw),
            }
            self.out.nodes[ni].inputs[2] = Some(ns);
        }
        if let Some(slot) = self.out.nodes[ni].inputs.get_mut(3) {
            *slot = None;
        }
        Ok(())
    }

    /// An embedding's own codes and scales with zero points `z`, re-quantised as a GEMM's are:
    /// the new codes and scales values.
    fn own_embedding(
        &mut self,
        node: &ir::Node,
        (codes_v, wid): (ValueId, WeightId),
        (sv, sid): (ValueId, WeightId),
        z: ValueId,
    ) -> Result<(ValueId, ValueId), IntelError> {
        let g = self.g;
        let bad = |msg: String| IntelError::Unsupported { node: node.name.clone(), msg };
        let bits = node.attrs.int_or("bits", 4).map_err(|e| bad(e.to_string()))?.max(0) as usize;
        let block = node.attrs.int_or("block_size", 128).map_err(|e| bad(e.to_string()))?.max(0) as usize;
        let w = g.weights.get(wid);
        let rows = w.shape.first().copied().unwrap_or(0);
        let bytes_per_row = w.bytes.len().checked_div(rows).unwrap_or(0);
        let width = bytes_per_row * 8 / bits.max(1);
        if !(bits == 4 || bits == 8) || block == 0 || width == 0 || !width.is_multiple_of(block) || w.dtype != DType::U8
        {
            return Err(bad(format!(
                "embedding `{}` of {} {:?} with {bits}-bit blocks of {block}",
                w.name, w.dtype, w.shape
            )));
        }
        let groups = width / block;
        let d = Decoded { groups, block, bits, bytes_per_group: block * bits / 8 };
        let s = g.weights.get(sid);
        let scales = s.to_tensor().map_err(|e| bad(format!("scales `{}`: {e}", s.name)))?.to_f32_vec();
        if scales.len() != rows * groups {
            return Err(bad(format!("scales `{}` hold {} values, expected {rows}×{groups}", s.name, scales.len())));
        }
        let zero_points = decode_zero_points(g, &node.name, z, rows, groups, bits)?;
        let offset = (1u32 << (bits - 1)) as f32;
        let asymmetric = zero_points.iter().any(|&v| v != offset);
        if asymmetric && self.policy == Asymmetric::Reject {
            return Err(IntelError::Asymmetric { node: node.name.clone(), weight: w.name.clone() });
        }
        let (codes, new_scales, max_rel, mean_rel) =
            requantize(&w.bytes, &scales, Some(&zero_points), rows, width, &d, asymmetric);
        let nw = self.add_weight(codes_v, format!("{}.sym", w.name), DType::U8, &w.shape, codes);
        let ns = self.add_weight(sv, format!("{}.f16", s.name), DType::F32, &s.shape, f32_bytes(&new_scales));
        self.done.insert((wid, sid, Some(z)), (nw, ns));
        self.reports.push(WeightError {
            weight: w.name.clone(),
            requantized: asymmetric,
            from_float: None,
            max_rel,
            mean_rel,
        });
        Ok((nw, ns))
    }

    /// A new weight of `bytes` and the value holding it, typed as `like` is.
    fn add_weight(&mut self, like: ValueId, name: String, dtype: DType, shape: &[usize], bytes: Vec<u8>) -> ValueId {
        let id = self.store.add(Weight::new(name.clone(), dtype, shape.to_vec(), Bytes::from(bytes)));
        let old = self.g.value(like);
        self.out.values.push(Value { name, dtype: old.dtype, shape: old.shape.clone(), def: ValueDef::Weight(id) });
        ValueId(self.out.values.len() as u32 - 1)
    }

    /// GEMM node `ni` reads codes `nw` and scales `ns`, and no zero points.
    fn rewire(&mut self, ni: usize, nw: ValueId, ns: ValueId) {
        let inputs = &mut self.out.nodes[ni].inputs;
        inputs[1] = Some(nw);
        inputs[2] = Some(ns);
        if inputs.len() > 3 {
            inputs[3] = None;
        }
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Symmetric codes (MatMulNBits layout, default zero point) and f16-exact scales for the `[n, k]`
/// weight `w` in `d`'s layout with `scales` and `zero_points`, and the relative error (max, mean).
/// Only the scales are rounded unless `asymmetric`.
fn requantize(
    w: &[u8],
    scales: &[f32],
    zero_points: Option<&[f32]>,
    n: usize,
    k: usize,
    d: &Decoded,
    asymmetric: bool,
) -> (Vec<u8>, Vec<f32>, f64, f64) {
    let (groups, block, bits) = (d.groups, d.block, d.bits);
    let offset = 1i32 << (bits - 1);
    let qmax = (offset - 1) as f32;
    let mut codes = vec![0u8; w.len()];
    let mut new_scales = vec![0f32; n * groups];
    let (mut max_err, mut max_w, mut sum_err, mut sum_w) = (0f64, 0f64, 0f64, 0f64);
    let mut row = vec![0f32; block];
    for ni2 in 0..n {
        for gi in 0..groups {
            let len = block.min(k - gi * block);
            let sc = scales[ni2 * groups + gi];
            let zp = zero_points.map_or(offset as f32, |z| z[ni2 * groups + gi]);
            for (j, r) in row.iter_mut().enumerate().take(len) {
                *r = (d.code(w, ni2, gi * block + j) as f32 - zp) * sc;
            }
            let scale = if asymmetric { best_scale(&row[..len], qmax, offset) } else { f16_round(sc) };
            new_scales[ni2 * groups + gi] = scale;
            let base = (ni2 * groups + gi) * d.bytes_per_group;
            for j in 0..block {
                let q = if j >= len {
                    0
                } else if asymmetric {
                    if scale > 0.0 {
                        ((row[j] / scale).round() as i32).clamp(-offset, offset - 1)
                    } else {
                        0
                    }
                } else {
                    d.code(w, ni2, gi * block + j) - offset
                };
                if j < len {
                    let err = (q as f32 * scale - row[j]).abs() as f64;
                    max_err = max_err.max(err);
                    sum_err += err;
                    max_w = max_w.max(row[j].abs() as f64);
                    sum_w += row[j].abs() as f64;
                }
                let u = (q + offset) as u8;
                if bits == 8 {
                    codes[base + j] = u;
                } else {
                    codes[base + j / 2] |= if j % 2 == 0 { u } else { u << 4 };
                }
            }
        }
    }
    let max_rel = if max_w > 0.0 { max_err / max_w } else { 0.0 };
    let mean_rel = if sum_w > 0.0 { sum_err / sum_w } else { 0.0 };
    (codes, new_scales, max_rel, mean_rel)
}

/// The graph with the constants that hold quantised weights (small models keep them by value)
/// turned into weights, so that every weight-only GEMM and quantised gather reads model weights.
fn promote_constants(g: &Graph) -> Result<Graph, IntelError> {
    let mut store = copy_store(g);
    let mut out = g.clone();
    let mut compile_time = vec![false; g.values.len()];
    for (n, ct) in g.nodes.iter().zip(g.compile_time_nodes()) {
        for &o in &n.outputs {
            compile_time[o.0 as usize] = ct;
        }
    }
    for n in &g.nodes {
        let slots: &[usize] = match (n.domain, n.op) {
            (Domain::Npuc, "WGemm" | "WGemmRowScaled") => &[1, 2, 3],
            (Domain::Microsoft, "GatherBlockQuantized") => &[0, 2],
            _ => continue,
        };
        for &i in slots {
            let Some(mut v) = n.inputs.get(i).copied().flatten() else { continue };
            // A Reshape of the codes (a tied embedding) is looked through.
            if let ValueDef::Node { node, .. } = g.value(v).def {
                let p = g.node(node);
                if p.op == "Reshape" {
                    if let Some(src) = p.inputs[0] {
                        v = src;
                    }
                }
            }
            let computed = match &g.value(v).def {
                ValueDef::Const(t) => Some(t.clone()),
                ValueDef::Node { .. } if compile_time[v.0 as usize] => Some(
                    evaluate_constant(g, v).map_err(|error| IntelError::Constant { node: n.name.clone(), error })?,
                ),
                _ => None,
            };
            if let Some(t) = &computed {
                let bytes = t
                    .to_le_bytes()
                    .map_err(|e| IntelError::Unsupported { node: n.name.clone(), msg: e.to_string() })?;
                let val = g.value(v);
                let id = store.add(Weight::new(val.name.clone(), t.dtype, t.shape.clone(), Bytes::from(bytes)));
                out.values[v.0 as usize].def = ValueDef::Weight(id);
            }
        }
    }
    out.weights = Arc::new(store);
    Ok(out)
}

/// The value of `v`, computed from weights and constants only (a slice of a fused weight).
pub(crate) fn evaluate_constant(g: &Graph, v: ValueId) -> Result<ir::Tensor, ConstantError> {
    match &g.value(v).def {
        ValueDef::Const(t) => Ok(t.clone()),
        ValueDef::Weight(w) => Ok(g.weights.get(*w).to_tensor()?),
        ValueDef::Input => Err(ConstantError::NotConstant { value: g.value(v).name.clone() }),
        ValueDef::Node { node, output } => {
            let n = g.node(*node);
            let mut inputs = Vec::new();
            for i in &n.inputs {
                inputs.push(match i {
                    Some(i) => Some(evaluate_constant(g, *i)?),
                    None => None,
                });
            }
            let refs: Vec<Option<&ir::Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
            let op = ir::OpRef { node: &n.name, domain: n.domain, op: n.op, opset: n.opset, attrs: &n.attrs };
            let mut out = ir::eval::eval_op(&op, &refs, n.outputs.len())?;
            Ok(out.swap_remove(*output))
        }
    }
}

/// The zero points `z` of node `node`, one per group of each of `n` rows: float, or packed
/// `bits`-bit codes.
fn decode_zero_points(
    g: &Graph,
    node: &str,
    z: ValueId,
    n: usize,
    groups: usize,
    bits: usize,
) -> Result<Vec<f32>, IntelError> {
    let bad = |msg: String| IntelError::Unsupported { node: node.to_string(), msg };
    let t = match &g.value(z).def {
        ValueDef::Weight(w) => g.weights.get(*w).to_tensor().map_err(|e| bad(e.to_string()))?,
        ValueDef::Const(t) => t.clone(),
        _ => return Err(bad("zero points must be constant".into())),
    };
    if t.dtype.is_float() {
        let v = t.to_f32_vec();
        if v.len() != n * groups {
            return Err(bad(format!("float zero points hold {} values, expected {n}×{groups}", v.len())));
        }
        return Ok(v);
    }
    let codes = t.as_i64().ok_or_else(|| bad("zero points are neither float nor uint8".into()))?;
    let bytes: Vec<u8> = codes.iter().map(|&b| b as u8).collect();
    let row_bytes = (groups * bits).div_ceil(8);
    if bytes.len() != n * row_bytes {
        return Err(bad(format!("packed zero points hold {} bytes, expected {n}×{row_bytes}", bytes.len())));
    }
    let mut out = Vec::with_capacity(n * groups);
    for r in 0..n {
        for gi in 0..groups {
            let v = if bits == 8 {
                bytes[r * row_bytes + gi]
            } else {
                let b = bytes[r * row_bytes + gi / 2];
                if gi % 2 == 0 {
                    b & 0x0f
                } else {
                    b >> 4
                }
            };
            out.push(v as f32);
        }
    }
    Ok(out)
}

/// The program the IR computes: it multiplies float activations by the decompressed weights, so a
/// MatMulNBits' `accuracy_level` 4 (int8 activations per block on onnxruntime's CPU) is dropped
/// from every WGemm, and the program the IR is checked against and the host's form of it compute
/// what the IR does.
pub fn float_activations(mut g: Graph) -> Graph {
    for node in g.nodes.iter_mut().filter(|n| n.domain == Domain::Npuc && n.op.starts_with("WGemm")) {
        node.attrs.remove("accuracy_level");
    }
    g
}

/// The host executor's form of an intel-npu program: the row-scaled ops replaced by the plain ones
/// they equal in f32 (RmsNormRowScaled → RmsNorm, SkipRmsNormRowScaled → SkipRmsNorm,
/// WGemmRowScaled → WGemm, L2NormRowScaled → ai.onnx LpNormalization{p=2, axis=-1},
/// GatedRmsNormRowScaled → com.microsoft GatedRMSNorm; same inputs and attributes). The
/// rescalings matter on an fp16 device, where the IR keeps them.
pub fn host_forms(g: &Graph) -> Graph {
    let mut out = float_activations(g.clone());
    for node in out.nodes.iter_mut().filter(|n| n.domain == Domain::Npuc) {
        match node.op {
            "RmsNormRowScaled" => node.op = "RmsNorm",
            "SkipRmsNormRowScaled" => node.op = "SkipRmsNorm",
            "WGemmRowScaled" => node.op = "WGemm",
            "L2NormRowScaled" => {
                (node.domain, node.op, node.opset) = (Domain::Onnx, "LpNormalization", 22);
                node.attrs.set("axis", ir::Attr::Int(-1));
                node.attrs.set("p", ir::Attr::Int(2));
            }
            "GatedRmsNormRowScaled" => (node.domain, node.op, node.opset) = (Domain::Microsoft, "GatedRMSNorm", 1),
            _ => {}
        }
    }
    out
}

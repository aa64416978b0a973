//! Compressed weights for float models.
//!
//! A float model's projections are `MatMul`s by constant `[K, N]` f32 weights; the NPU wants them
//! compressed. [`compress`] rewrites each one, on the program both the IR and the host executor
//! run, as:
//!
//! - [`FloatWeights::Int4`] (the default): a `WGemm` over symmetric 4-bit codes, groups of 128
//!   along K when 128 divides K, else one group per output channel;
//! - [`FloatWeights::Int8`]: a `WGemm` over symmetric 8-bit codes, one group per output channel;
//! - [`FloatWeights::F16`]: the same `MatMul` over the weight rounded to f16 (the IR stores it as
//!   f16 and converts it).
//!
//! The embedding table (a `Gather` of a float weight by token ids, not a RoPE cache) becomes a
//! `GatherBlockQuantized` over symmetric int8 codes in blocks of up to 128 along the row for both
//! integer formats (reported as int8), and an f16 table for f16.
//!
//! The codes are stored as MatMulNBits expects them (unsigned, default zero point) with f32 scales
//! that are f16 values, exactly as [`crate::symmetric::symmetrize`] leaves a quantised model, so
//! the IR writer and the host executor compute with the very same weight values. The error each
//! weight costs is measured and reported. A per-channel group covers all of K, padded with zero
//! codes up to a multiple of 16 (what the host kernels take).

use crate::symmetric::{best_scale, copy_store, evaluate_constant, WeightError};
use crate::IntelError;
use bytes::Bytes;
use ir::attr::Attr;
use ir::graph::{Graph, Node, Value, ValueDef, ValueId};
use ir::{DType, Domain, Weight, WeightId, WeightStore};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// How float projection weights are stored for the NPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatWeights {
    Int4,
    Int8,
    F16,
}

impl FloatWeights {
    pub fn name(self) -> &'static str {
        match self {
            FloatWeights::Int4 => "int4",
            FloatWeights::Int8 => "int8",
            FloatWeights::F16 => "f16",
        }
    }
}

impl std::str::FromStr for FloatWeights {
    type Err = IntelError;
    fn from_str(s: &str) -> Result<Self, IntelError> {
        match s {
            "int4" => Ok(FloatWeights::Int4),
            "int8" => Ok(FloatWeights::Int8),
            "f16" => Ok(FloatWeights::F16),
            other => Err(IntelError::UnknownWeightFormat(other.to_string())),
        }
    }
}

/// The program with its float projections compressed, the weights stored as f16 (for
/// [`FloatWeights::F16`]; the IR writes them as f16 constants), and the error per weight.
pub fn compress(g: &Graph, format: FloatWeights) -> Result<(Graph, HashSet<WeightId>, Vec<WeightError>), IntelError> {
    let compile_time = g.compile_time_nodes();
    let mut ct_value: Vec<bool> =
        g.values.iter().map(|v| matches!(v.def, ValueDef::Weight(_) | ValueDef::Const(_))).collect();
    for (n, &ct) in g.nodes.iter().zip(&compile_time) {
        for &o in &n.outputs {
            ct_value[o.0 as usize] = ct;
        }
    }
    let mut c = Compress {
        g,
        format,
        store: copy_store(g),
        out: g.clone(),
        reports: Vec::new(),
        f16_weights: HashSet::new(),
        done: HashMap::new(),
        ct_value,
    };
    for (ni, node) in g.nodes.iter().enumerate() {
        if node.domain == Domain::Onnx && node.op == "MatMul" && !compile_time[ni] {
            c.projection(ni)?;
        }
    }
    // The embedding: int8 codes in blocks along the row (GatherBlockQuantized) for the integer
    // formats, f16 for f16. A row that is no whole number of 16-wide blocks stays f32.
    // (Not the RoPE caches the cos/sin tables gather from: those stay exact.)
    let rope_tables = rope_table_nodes(g);
    for (ni, node) in g.nodes.iter().enumerate() {
        if node.domain == Domain::Onnx && node.op == "Gather" && !compile_time[ni] && !rope_tables[ni] {
            c.embedding(ni)?;
        }
    }
    let Compress { mut out, store, reports, f16_weights, .. } = c;
    out.weights = Arc::new(store);
    Ok((out.pruned(), f16_weights, reports))
}

/// The nodes that compute the inputs of a Rope other than the rotated one (its cos/sin tables).
fn rope_table_nodes(g: &Graph) -> Vec<bool> {
    let mut tables = vec![false; g.nodes.len()];
    let mut stack: Vec<ValueId> = g
        .nodes
        .iter()
        .filter(|n| n.domain == Domain::Npuc && n.op == "Rope")
        .flat_map(|n| n.inputs.iter().skip(1).flatten().copied())
        .collect();
    while let Some(v) = stack.pop() {
        if let ValueDef::Node { node, .. } = g.value(v).def {
            if !std::mem::replace(&mut tables[node.0 as usize], true) {
                stack.extend(g.node(node).inputs.iter().flatten().copied());
            }
        }
    }
    tables
}

/// [`compress`] under way: the new weights and program, and what is already done.
struct Compress<'a> {
    g: &'a Graph,
    format: FloatWeights,
    store: WeightStore,
    out: Graph,
    reports: Vec<WeightError>,
    f16_weights: HashSet<WeightId>,
    /// The same weight read by several MatMuls is compressed once: its new inputs.
    done: HashMap<ValueId, Vec<Option<ValueId>>>,
    /// Values known at compile time.
    ct_value: Vec<bool>,
}

impl Compress<'_> {
    /// MatMul node `ni`, when it multiplies an activation by a constant `[K, N]` float weight, over
    /// the compressed weight.
    fn projection(&mut self, ni: usize) -> Result<(), IntelError> {
        let (g, format) = (self.g, self.format);
        let node = &g.nodes[ni];
        let (Some(a), Some(b)) = (node.inputs.first().copied().flatten(), node.inputs.get(1).copied().flatten()) else {
            return Ok(());
        };
        if !self.ct_value[b.0 as usize]
            || self.ct_value[a.0 as usize]
            || !g.value(b).dtype.is_float()
            || g.value(b).shape.len() != 2
        {
            return Ok(());
        }
        let bad = |msg: String| IntelError::Unsupported { node: node.name.clone(), msg };
        if let Some(inputs) = self.done.get(&b) {
            let mut inputs = inputs.clone();
            inputs[0] = Some(a);
            replace(&mut self.out, ni, format, inputs, g.value(b));
            return Ok(());
        }
        let w = evaluate_constant(g, b).map_err(|e| bad(format!("weight `{}`: {e}", g.value(b).name)))?;
        let (k, n) = match w.shape[..] {
            [k, n] if k > 0 && n > 0 => (k, n),
            _ => return Err(bad(format!("weight `{}` of shape {:?}", g.value(b).name, w.shape))),
        };
        let data = w.to_f32_vec();
        let name = g.value(b).name.clone();
        let inputs = match format {
            FloatWeights::F16 => vec![Some(a), Some(self.f16_weight(&name, &data, vec![k, n]))],
            FloatWeights::Int4 | FloatWeights::Int8 => {
                let (cv, sv) = self.quantized_projection(&name, &data, k, n);
                vec![Some(a), Some(cv), Some(sv)]
            }
        };
        self.done.insert(b, inputs.clone());
        replace(&mut self.out, ni, format, inputs, g.value(b));
        Ok(())
    }

    /// The weight `name` rounded to f16 (stored as f32), reported; the value holding it.
    fn f16_weight(&mut self, name: &str, data: &[f32], shape: Vec<usize>) -> ValueId {
        let rounded: Vec<f32> = data.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
        self.reports.push(error_of(name, data, &rounded, self.format));
        let bytes: Vec<u8> = rounded.iter().flat_map(|v| v.to_le_bytes()).collect();
        let id = self.store.add(Weight::new(format!("{name}.f16"), DType::F32, shape.clone(), Bytes::from(bytes)));
        self.f16_weights.insert(id);
        push(&mut self.out, format!("{name}.f16"), DType::F32, shape, id)
    }

    /// The `[k, n]` weight `name` as symmetric codes and scales in the format's layout (see
    /// [`compress`]), reported; the values holding the codes and the scales.
    fn quantized_projection(&mut self, name: &str, data: &[f32], k: usize, n: usize) -> (ValueId, ValueId) {
        let bits = if self.format == FloatWeights::Int4 { 4 } else { 8 };
        let block = if bits == 4 && k.is_multiple_of(128) { 128 } else { k.div_ceil(16) * 16 };
        let groups = k.div_ceil(block);
        let (codes, scales, dequantised) = quantize(data, k, n, bits, block);
        self.reports.push(error_of(name, data, &dequantised, self.format));
        let per_group = block * bits / 8;
        let codes_shape = vec![n, groups, per_group];
        let cid =
            self.store.add(Weight::new(format!("{name}.q{bits}"), DType::U8, codes_shape.clone(), Bytes::from(codes)));
        let sbytes: Vec<u8> = scales.iter().flat_map(|v| v.to_le_bytes()).collect();
        let sid =
            self.store.add(Weight::new(format!("{name}.scales"), DType::F32, vec![n * groups], Bytes::from(sbytes)));
        let cv = push(&mut self.out, format!("{name}.q{bits}"), DType::U8, codes_shape, cid);
        let sv = push(&mut self.out, format!("{name}.scales"), DType::F32, vec![n * groups], sid);
        (cv, sv)
    }

    /// Gather node `ni`, when it reads rows of a float `[rows, width]` weight by token ids, over the
    /// table stored as f16 or as int8 blocks along the row.
    fn embedding(&mut self, ni: usize) -> Result<(), IntelError> {
        let g = self.g;
        let node = &g.nodes[ni];
        let (Some(dv), Some(idx)) = (node.inputs.first().copied().flatten(), node.inputs.get(1).copied().flatten())
        else {
            return Ok(());
        };
        let axis = node.attrs.int_or("axis", 0).unwrap_or(-1);
        let ValueDef::Weight(wid) = g.value(dv).def else { return Ok(()) };
        let w = g.weights.get(wid);
        if axis != 0 || w.dtype != DType::F32 || w.shape.len() != 2 || self.ct_value[idx.0 as usize] {
            return Ok(());
        }
        let (rows, width) = (w.shape[0], w.shape[1]);
        let data =
            w.to_tensor().map_err(|e| IntelError::Unsupported { node: node.name.clone(), msg: e.to_string() })?;
        let data = data.to_f32_vec();
        if self.format == FloatWeights::F16 {
            let v = self.f16_weight(&w.name, &data, w.shape.clone());
            self.out.nodes[ni].inputs[0] = Some(v);
            return Ok(());
        }
        let Some(block) = [128, 64, 32, 16].into_iter().find(|b| width % b == 0) else { return Ok(()) };
        // Row r of the table is output channel r of a [width, rows] weight.
        let transposed: Vec<f32> = (0..width * rows).map(|i| data[(i % rows) * width + i / rows]).collect();
        let (codes, scales, deq) = quantize(&transposed, width, rows, 8, block);
        let deq_rows: Vec<f32> = (0..rows * width).map(|i| deq[(i % width) * rows + i / width]).collect();
        let mut report = error_of(&w.name, &data, &deq_rows, self.format);
        report.from_float = Some(FloatWeights::Int8);
        self.reports.push(report);
        let cname = format!("{}.q8", w.name);
        let cid = self.store.add(Weight::new(cname.clone(), DType::U8, vec![rows, width], Bytes::from(codes)));
        let sbytes: Vec<u8> = scales.iter().flat_map(|v| v.to_le_bytes()).collect();
        let groups = width / block;
        let sname = format!("{}.scales", w.name);
        let sid = self.store.add(Weight::new(sname.clone(), DType::F32, vec![rows, groups], Bytes::from(sbytes)));
        let cv = push(&mut self.out, cname, DType::U8, vec![rows, width], cid);
        let sv = push(&mut self.out, sname, DType::F32, vec![rows, groups], sid);
        self.out.nodes[ni] = gather_block_quantized(&self.out.nodes[ni], block, [cv, idx, sv]);
        Ok(())
    }
}

/// `old` (a Gather by `idx`) as a GatherBlockQuantized of int8 blocks of `block` along the row.
fn gather_block_quantized(old: &Node, block: usize, [cv, idx, sv]: [ValueId; 3]) -> Node {
    let mut attrs = ir::Attrs::default();
    for (key, v) in [("bits", 8), ("block_size", block as i64), ("gather_axis", 0), ("quantize_axis", 1)] {
        attrs.set(key, Attr::Int(v));
    }
    Node {
        name: old.name.clone(),
        domain: Domain::Microsoft,
        op: "GatherBlockQuantized",
        opset: 1,
        attrs,
        inputs: vec![Some(cv), Some(idx), Some(sv)],
        outputs: old.outputs.clone(),
    }
}

fn push(out: &mut Graph, name: String, dtype: DType, shape: Vec<usize>, id: WeightId) -> ValueId {
    let shape = shape.into_iter().map(|d| ir::Dim::known(d as i64)).collect();
    out.values.push(Value { name, dtype, shape, def: ValueDef::Weight(id) });
    ValueId(out.values.len() as u32 - 1)
}

/// Node `ni` becomes a `MatMul` (f16) or a `WGemm` over `inputs`.
fn replace(out: &mut Graph, ni: usize, format: FloatWeights, inputs: Vec<Option<ValueId>>, w: &Value) {
    let node = &mut out.nodes[ni];
    node.inputs = inputs;
    if format == FloatWeights::F16 {
        return;
    }
    let dim = |i: usize| w.shape[i].as_known().unwrap_or(0);
    let (k, n) = (dim(0), dim(1));
    let bits = if format == FloatWeights::Int4 { 4 } else { 8 };
    let block = if bits == 4 && k % 128 == 0 { 128 } else { (k as usize).div_ceil(16) as i64 * 16 };
    let mut attrs = ir::Attrs::default();
    for (key, v) in [("K", k), ("N", n), ("bits", bits), ("block_size", block)] {
        attrs.set(key, Attr::Int(v));
    }
    *node = Node {
        name: node.name.clone(),
        domain: Domain::Npuc,
        op: "WGemm",
        opset: 1,
        attrs,
        inputs: std::mem::take(&mut node.inputs),
        outputs: node.outputs.clone(),
    };
}

/// Symmetric `bits`-bit codes of the `[k, n]` row-major weight in MatMulNBits layout (`[n,
/// groups, block·bits/8]`, unsigned with the default zero point, zero codes past K), the f16-exact
/// scales `[n · groups]`, and the weight they represent (`[k, n]`).
fn quantize(w: &[f32], k: usize, n: usize, bits: usize, block: usize) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let groups = k.div_ceil(block);
    let per_group = block * bits / 8;
    let offset = 1i32 << (bits - 1);
    let qmax = (offset - 1) as f32;
    let mut codes = vec![0u8; n * groups * per_group];
    let mut scales = vec![0f32; n * groups];
    let mut deq = vec![0f32; k * n];
    let mut row = vec![0f32; block];
    for c in 0..n {
        for gi in 0..groups {
            let len = block.min(k - gi * block);
            for (j, r) in row.iter_mut().enumerate().take(len) {
                *r = w[(gi * block + j) * n + c];
            }
            let scale = best_scale(&row[..len], qmax, offset);
            scales[c * groups + gi] = scale;
            let base = (c * groups + gi) * per_group;
            for j in 0..block {
                let q = if j < len && scale > 0.0 {
                    ((row[j] / scale).round() as i32).clamp(-offset, offset - 1)
                } else {
                    0
                };
                if j < len {
                    deq[(gi * block + j) * n + c] = q as f32 * scale;
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
    (codes, scales, deq)
}

fn error_of(name: &str, w: &[f32], approx: &[f32], format: FloatWeights) -> WeightError {
    let (mut max_err, mut max_w, mut sum_err, mut sum_w) = (0f64, 0f64, 0f64, 0f64);
    for (&v, &a) in w.iter().zip(approx) {
        let e = (a - v).abs() as f64;
        max_err = max_err.max(e);
        sum_err += e;
        max_w = max_w.max(v.abs() as f64);
        sum_w += v.abs() as f64;
    }
    WeightError {
        weight: name.to_string(),
        requantized: false,
        from_float: Some(format),
        max_rel: if max_w > 0.0 { max_err / max_w } else { 0.0 },
        mean_rel: if sum_w > 0.0 { sum_err / sum_w } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes MatMulNBits codes the way the format defines them, independently of `quantize`.
    fn decode(codes: &[u8], scales: &[f32], k: usize, n: usize, bits: usize, block: usize) -> Vec<f32> {
        let groups = k.div_ceil(block);
        let per_group = block * bits / 8;
        let mut out = vec![0f32; k * n];
        for c in 0..n {
            for kk in 0..k {
                let (gi, j) = (kk / block, kk % block);
                let base = (c * groups + gi) * per_group;
                let u = if bits == 8 { codes[base + j] } else { (codes[base + j / 2] >> (4 * (j % 2))) & 15 };
                out[kk * n + c] = (u as i32 - (1 << (bits - 1))) as f32 * scales[c * groups + gi];
            }
        }
        out
    }

    #[test]
    fn codes_decode_to_the_reported_weight_within_half_a_step() {
        // K = 40 is not a multiple of 16: one padded group per channel.
        for (k, bits, block) in [(256usize, 4usize, 128usize), (40, 4, 48), (40, 8, 48)] {
            let n = 3;
            let w: Vec<f32> = (0..k * n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
            let (codes, scales, deq) = quantize(&w, k, n, bits, block);
            assert_eq!(decode(&codes, &scales, k, n, bits, block), deq);
            assert!(scales.iter().all(|&s| half::f16::from_f32(s).to_f32() == s && s > 0.0));
            let groups = k.div_ceil(block);
            for (i, (&v, &d)) in w.iter().zip(&deq).enumerate() {
                let s = scales[(i % n) * groups + (i / n) / block];
                // Clipping the largest weights (at most 27.5% of max|w|) is allowed; elsewhere half a step.
                let limit = if v.abs() > 0.7 * 50.0 / 17.0 { 0.28 * 50.0 / 17.0 } else { 0.5 * s + 1e-6 };
                assert!((v - d).abs() <= limit, "k={k} bits={bits}: {v} → {d} (scale {s})");
            }
        }
    }
}

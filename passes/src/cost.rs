//! What one step of a program costs: multiply-accumulates and bytes moved, the two quantities a
//! decoder's speed is bounded by (a decode step reads every weight once and does little
//! arithmetic per byte; a prefill block does `rows` times more arithmetic on the same bytes).
//!
//! Counted at concrete sizes (`batch_size = 1`, `sequence_length = rows`, `past_sequence_length
//! = past`):
//! - MACs: every `MatMul`, `WGemm`, `WGemmRowScaled` and `QGemm` (output elements × K), and every
//!   `Attention` (2 · q_heads · rows · (past + rows) · head_dim: scores and the weighted sum).
//! - Weight bytes: the bytes of every weight a node reads, each time it reads it, in its stored
//!   dtype (4-bit blocks as packed); a view of a weight (Transpose, Reshape, Slice) counts the
//!   view's elements at the weight's dtype; a gather (the embedding) counts the rows it returns.
//! - KV bytes: what attention reads from the cache, at f32 (past + rows positions of K and V).
//!
//! A target's time for a step is then at least max(weight bytes / bandwidth, MACs / throughput);
//! `npuc passes` prints both numbers for a decode step and a prefill block.

use ir::graph::{Graph, ValueDef, ValueId};
use ir::DType;

/// The sizes a step is counted at.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct StepSizes {
    pub rows: u64,
    pub past: u64,
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct StepCost {
    pub macs: u64,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
}

fn dims(g: &Graph, v: ValueId, s: StepSizes) -> Option<Vec<u64>> {
    let bind = |name: &str| -> Option<i64> {
        match name {
            "batch_size" | "batch" => Some(1),
            "sequence_length" => Some(s.rows as i64),
            "past_sequence_length" => Some(s.past as i64),
            "total_sequence_length" => Some((s.past + s.rows) as i64),
            _ => None,
        }
    };
    g.value(v).shape.iter().map(|d| d.eval(&bind).and_then(|x| u64::try_from(x).ok())).collect()
}

fn bytes_of(dtype: DType, numel: u64) -> u64 {
    dtype.storage_bytes(numel).unwrap_or(0)
}

/// Bytes of weight a node reads through input `v`: a weight, or a view of one.
fn weight_read(g: &Graph, v: ValueId, s: StepSizes) -> u64 {
    match &g.value(v).def {
        ValueDef::Weight(w) => g.weights.get(*w).bytes.len() as u64,
        ValueDef::Node { node, .. } => {
            let n = g.node(*node);
            let view = matches!(n.op, "Transpose" | "Reshape" | "Slice" | "Squeeze" | "Unsqueeze");
            match n.inputs.first().copied().flatten() {
                Some(src) if view && matches!(g.value(src).def, ValueDef::Weight(_)) => {
                    let numel: u64 = dims(g, v, s).map_or(0, |d| d.iter().product());
                    bytes_of(g.value(src).dtype, numel)
                }
                _ => 0,
            }
        }
        _ => 0,
    }
}

/// The cost of one step of `g` at sizes `s`.
pub fn step_cost(g: &Graph, s: StepSizes) -> StepCost {
    let mut c = StepCost::default();
    for n in &g.nodes {
        let is_view = |v: &ValueId| match &g.value(*v).def {
            ValueDef::Node { node, .. } => {
                let p = g.node(*node);
                matches!(p.op, "Transpose" | "Reshape" | "Slice" | "Squeeze" | "Unsqueeze")
            }
            _ => false,
        };
        // Views are counted where they are read, not where they are made.
        if matches!(n.op, "Transpose" | "Reshape" | "Slice" | "Squeeze" | "Unsqueeze") {
            continue;
        }
        if matches!(n.op, "Gather" | "GatherBlockQuantized") {
            // A gather reads the rows it returns, not its table.
            if let Some(out) = dims(g, n.outputs[0], s) {
                c.weight_bytes += bytes_of(g.value(n.outputs[0]).dtype, out.iter().product());
            }
        } else {
            for v in n.inputs.iter().flatten() {
                if matches!(g.value(*v).def, ValueDef::Weight(_)) || is_view(v) {
                    c.weight_bytes += weight_read(g, *v, s);
                }
            }
        }
        let out = dims(g, n.outputs[0], s);
        let k = n.inputs.first().copied().flatten().and_then(|a| dims(g, a, s)).and_then(|d| d.last().copied());
        match n.op {
            "MatMul" | "WGemm" | "WGemmRowScaled" | "QGemm" => {
                if let (Some(out), Some(k)) = (out, k) {
                    c.macs += out.iter().product::<u64>() * k;
                }
            }
            "Attention" => {
                if let Some(q) = out.filter(|q| q.len() == 4) {
                    let (heads, rows, d) = (q[1], q[2], q[3]);
                    c.macs += 2 * heads * rows * (s.past + rows) * d;
                }
                if let Some(kv) =
                    n.inputs.get(1).copied().flatten().and_then(|k| dims(g, k, s)).filter(|k| k.len() == 4)
                {
                    c.kv_bytes += 2 * kv[1] * (s.past + s.rows) * kv[3] * 4;
                }
            }
            _ => {}
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::build::{GraphBuilder, ValueType};
    use ir::{Dim, Tensor};

    #[test]
    fn counts_gemm_macs_and_weight_bytes_per_step() {
        // y = x [1, S, 8] · W [8, 4] with W f32 (128 bytes), then y · Wᵀ' through a Transpose of a
        // [4, 4] weight (64 bytes).
        let mut b = GraphBuilder::new("t");
        let x =
            b.input("x", ValueType::new(DType::F32, vec![Dim::known(1), Dim::sym("sequence_length"), Dim::known(8)]));
        let w = b.weight("w", &Tensor::from_f32(DType::F32, vec![8, 4], vec![0.5; 32]));
        let w2 = b.weight("w2", &Tensor::from_f32(DType::F32, vec![4, 4], vec![0.5; 16]));
        let ty = ValueType::new(DType::F32, vec![Dim::known(1), Dim::sym("sequence_length"), Dim::known(4)]);
        let y = b.op("MatMul", &[x, w], ty.clone());
        let t = b
            .node(ir::Domain::Onnx, "Transpose")
            .attr("perm", ir::Attr::Ints(vec![1, 0]))
            .inputs(&[w2])
            .output("w2t", ValueType::known(DType::F32, &[4, 4]))
            .add()[0];
        let z = b.op("MatMul", &[y, t], ty);
        b.output(z);
        let g = b.finish().unwrap();
        let decode = step_cost(&g, StepSizes { rows: 1, past: 10 });
        assert_eq!(decode.macs, 8 * 4 + 4 * 4);
        assert_eq!(decode.weight_bytes, 128 + 64);
        let prefill = step_cost(&g, StepSizes { rows: 16, past: 0 });
        assert_eq!(prefill.macs, 16 * (8 * 4 + 4 * 4));
        assert_eq!(prefill.weight_bytes, 128 + 64);
    }
}

//! `array-norms`: the norms that feed the array's projections, in the form an array program
//! computes them.
//!
//! After `array-int8`, a norm's output is read by a `QuantizeRows` only: its rows become int8
//! codes and one scale a row. A row's `1/rms` is one scalar, so it need not touch the values:
//!
//! ```text
//! y = RmsNorm(x, γ)                  r = npuc::InverseRms(x)       (1/√(Σx²/d + ε) a row, [.., 1])
//! C, S = QuantizeRows(y)      →      C, S₀ = QuantizeRows(x, γ)     (the codes of the exact x·γ)
//!                                    S = Mul(S₀, r)                 (both passes' scales)
//! ```
//!
//! and a `SkipRmsNorm(a, b, γ[, bias])` becomes its residual sum `(a + b) (+ bias)`, in that
//! order as its own, then the same. `QGemm` multiplies its int32 products by `S`, so the
//! projection is `r·(xγ)·W`: RmsNorm's value, with the codes taken from `xγ` instead of `xγ·r`.
//! On an array core no f32 operation a value is left: the codes of the exact product are
//! shifts and compares of the significands' product (`ir::norm_codes`), and `r` meets the row's
//! scale once a row. `r`'s sum of squares is the aligned one (`squares = "aligned"`,
//! `ir::pinned_norm::aligned_sum_squares`: each significand on the row's largest exponent to 11
//! bits, squared and summed in integers), 24 integer operations a 32-value block of core code
//! where RmsNorm's f32 squares are 262 (`qkernels::inverse_rms`); rows longer than it takes
//! (16,352) keep the f32 sum. Over `tools/xdna_kl_prompts.py`'s eight prompts, SmolLM2's KL is
//! the same with either sum: prefill mean 3.6·10⁻³ (f32) and 3.7·10⁻³ (aligned), decode 1.6·10⁻³.
//!
//! Quantising `x·γ` keeps γ where the measurements want it: before attention γ damps the
//! channels where a first token's activations are hundreds, and quantising without it lets them
//! set the row's scale (DESIGN.md, "What the norm's numerics allow"). `tools/xdna_kl_prompts.py`
//! measures the program this pass leaves against ONNX Runtime over eight prompts.
//!
//! A norm whose output anything but `QuantizeRows` reads (a graph output, a float op, an
//! A8W8 model's `QuantizeLinear`) is left as it is.

use crate::{Pass, PassDetail, PassError};
use ir::graph::{Graph, Node, NodeId, ValueDef, ValueId};
use ir::pinned_norm::{bfloat16_values, ALIGNED_MAX_D};
use ir::{Attr, Attrs, DType, Dim, Domain};
use std::collections::HashMap;

pub struct ArrayNorms;

impl Pass for ArrayNorms {
    fn name(&self) -> &'static str {
        "array-norms"
    }
    fn contract(&self) -> &'static str {
        "Expects array-int8's program. Guarantees no RmsNorm or SkipRmsNorm output is read by a QuantizeRows: such a norm's rows are quantised as x·γ and its InverseRms multiplies the row scales, the projections' values those of the norm."
    }
    fn run(&self, graph: Graph) -> Result<(Graph, PassDetail), PassError> {
        Ok(rewrite(graph))
    }
}

/// What a rewritten norm's readers take instead of its output: its rows `x`, `γ` and `1/rms`.
#[derive(Clone, Copy)]
struct NormParts {
    x: ValueId,
    gamma: ValueId,
    inverse_rms: ValueId,
}

/// The readers of every value, by node index.
fn readers(g: &Graph) -> Vec<Vec<usize>> {
    let mut r = vec![Vec::new(); g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for v in n.inputs.iter().flatten() {
            r[v.0 as usize].push(i);
        }
    }
    r
}

/// Whether `n` is a norm whose normalised output only `QuantizeRows` nodes read.
fn quantised_norm(g: &Graph, readers: &[Vec<usize>], n: &Node) -> bool {
    if n.domain != Domain::Npuc || !matches!(n.op, "RmsNorm" | "SkipRmsNorm") {
        return false;
    }
    let y = n.outputs[0];
    let read = &readers[y.0 as usize];
    !g.outputs.contains(&y)
        && !read.is_empty()
        && read.iter().all(|&r| {
            let q = &g.nodes[r];
            q.domain == Domain::Npuc && q.op == "QuantizeRows" && q.inputs[0] == Some(y)
        })
}

/// The program being built: the graph's values, and its nodes in order.
struct Program {
    values: Vec<ir::graph::Value>,
    nodes: Vec<Node>,
}

impl Program {
    fn value(&mut self, name: String, dtype: DType, shape: Vec<Dim>) -> ValueId {
        let def = ValueDef::Node { node: NodeId(0), output: 0 };
        self.values.push(ir::graph::Value { name, dtype, shape, def });
        ValueId(self.values.len() as u32 - 1)
    }

    fn push(&mut self, name: String, op: (Domain, &'static str), attrs: Attrs, inputs: &[ValueId], out: ValueId) {
        let opset = if op.0 == Domain::Onnx { 14 } else { 1 };
        let inputs = inputs.iter().map(|&v| Some(v)).collect();
        self.nodes.push(Node { name, domain: op.0, op: op.1, opset, attrs, inputs, outputs: vec![out] });
    }

    /// The norm's input rows: RmsNorm's x, or SkipRmsNorm's residual sum as Adds (into its own
    /// sum output when the program reads it).
    fn rows(&mut self, n: &Node, y: &ir::graph::Value) -> ValueId {
        let input = |i: usize| n.inputs.get(i).copied().flatten();
        let (Some(a), Some(b)) = (input(0), input(1)) else { unreachable!("a norm has its input") };
        if n.op == "RmsNorm" {
            return a;
        }
        let sum = match n.outputs.get(1) {
            Some(&s) => s,
            None => self.value(format!("{}/sum", n.name), y.dtype, y.shape.clone()),
        };
        let add = (Domain::Onnx, "Add");
        match input(3) {
            None => self.push(format!("{}/sum", n.name), add, Attrs::default(), &[a, b], sum),
            Some(bias) => {
                let partial = self.value(format!("{}/skip_sum", n.name), y.dtype, y.shape.clone());
                self.push(format!("{}/skip_sum", n.name), add, Attrs::default(), &[a, b], partial);
                self.push(format!("{}/sum", n.name), add, Attrs::default(), &[partial, bias], sum);
            }
        }
        sum
    }

    /// A quantised norm's rows, γ and `InverseRms(x)`.
    fn norm(&mut self, n: &Node) -> NormParts {
        let y = self.values[n.outputs[0].0 as usize].clone();
        let x = self.rows(n, &y);
        let gamma = n.inputs[if n.op == "RmsNorm" { 1 } else { 2 }].expect("a norm has its γ");
        let mut row = y.shape.clone();
        if let Some(last) = row.last_mut() {
            *last = Dim::known(1);
        }
        let aligned = y.shape.last().and_then(Dim::as_known).is_some_and(|d| d > 0 && d as usize <= ALIGNED_MAX_D);
        let inverse_rms = self.value(format!("{}/inverse_rms", n.name), y.dtype, row);
        let mut attrs = n.attrs.clone();
        if aligned {
            attrs.set("squares", Attr::Str("aligned".into()));
        }
        self.push(format!("{}/inverse_rms", n.name), (Domain::Npuc, "InverseRms"), attrs, &[x], inverse_rms);
        NormParts { x, gamma, inverse_rms }
    }

    /// `QuantizeRows(x, γ)` (the codes of the exact products `x·γ`), its row scales then
    /// multiplied by `1/rms` into the value its QGemms read.
    fn quantize(&mut self, q: &Node, parts: NormParts) {
        let scaled = q.outputs[1];
        let s = self.values[scaled.0 as usize].clone();
        let unscaled = self.value(format!("{}/unscaled", s.name), s.dtype, s.shape.clone());
        let mut q = q.clone();
        q.inputs = vec![Some(parts.x), Some(parts.gamma)];
        q.outputs[1] = unscaled;
        let name = format!("{}/norm_scales", q.name);
        self.nodes.push(q);
        self.push(name, (Domain::Onnx, "Mul"), Attrs::default(), &[unscaled, parts.inverse_rms], scaled);
    }
}

fn rewrite(g: Graph) -> (Graph, PassDetail) {
    let readers = readers(&g);
    let mut program = Program { values: g.values.clone(), nodes: Vec::with_capacity(g.nodes.len()) };
    let mut parts: HashMap<ValueId, NormParts> = HashMap::new();
    let (mut plain, mut skip) = (0usize, 0usize);
    for n in &g.nodes {
        let quantised = n.inputs.first().copied().flatten().and_then(|a| parts.get(&a).copied());
        match quantised {
            Some(p) if n.op == "QuantizeRows" => program.quantize(n, p),
            _ if quantised_norm(&g, &readers, n) => {
                parts.insert(n.outputs[0], program.norm(n));
                if n.op == "RmsNorm" {
                    plain += 1;
                } else {
                    skip += 1;
                }
            }
            _ => program.nodes.push(n.clone()),
        }
    }
    let kept = g.nodes.iter().filter(|n| matches!(n.op, "RmsNorm" | "SkipRmsNorm")).count() - parts.len();
    let bfloat16 = parts.values().filter(|p| bfloat16_values(&g, p.gamma)).count();
    let Program { values, nodes } = program;
    let out = g.with_nodes(values, nodes);
    let summary = format!(
        "{} norms → x·γ quantised, 1/rms on the row scales ({plain} RmsNorm, {skip} SkipRmsNorm; γ bfloat16 in {bfloat16}, whose product with x a core computes in 32 integer bits); {kept} norms left as they are",
        parts.len()
    );
    let data = serde_json::json!({
        "rewritten": parts.len(),
        "rms_norm": plain,
        "skip_rms_norm": skip,
        "gamma_bfloat16": bfloat16,
        "kept": kept,
    });
    (out, PassDetail { summary, data })
}

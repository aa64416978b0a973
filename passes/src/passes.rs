//! The passes every pipeline is built from.

use crate::{Pass, PassDetail, PassError};
use ir::Graph;
use rewrites::saturate::{extract_graph, saturate, Fp16Cost, HostCost, Limits, Phase};
use rewrites::Family;
use std::time::Duration;

/// `canonicalize`: expects a verified imported graph; guarantees the same program with dead nodes
/// removed and Identity nodes bypassed (except those that name a graph output), so later passes
/// and snapshots see only computation.
pub struct Canonicalize;

impl Pass for Canonicalize {
    fn name(&self) -> &'static str {
        "canonicalize"
    }
    fn contract(&self) -> &'static str {
        "Expects a verified imported graph. Guarantees the same program with dead nodes removed and Identity nodes bypassed (except those naming a graph output)."
    }
    fn run(&self, graph: Graph) -> Result<(Graph, PassDetail), PassError> {
        let before = graph.nodes.len();
        let g = graph.pruned();
        let summary = format!("{} nodes removed", before - g.nodes.len());
        Ok((g, PassDetail { summary, data: serde_json::Value::Null }))
    }
}

/// `saturate`: builds the e-graph of the graph, runs the rule schedule (cheap canonical families
/// to saturation, then the fusion families for a bounded number of iterations, each phase with
/// node, iteration and time limits), and extracts the cheapest program under the target's cost
/// model. Guarantees an equivalent program (every rule is an identity of the fused ops' reference
/// semantics) and reports, per phase, the stop reason, iterations and e-graph size, plus every
/// candidate group a rule declined and why. A merge of two classes whose types disagree is a
/// broken rule and fails the pass.
pub struct Saturate {
    pub phases: Vec<Phase>,
    pub cost: CostModel,
}

/// The cost model a [`Saturate`] extracts under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostModel {
    /// [`HostCost`]: fused ops over their decompositions.
    Host,
    /// [`Fp16Cost`]: as `Host`, and the row-scaled forms over the RmsNorm, SkipRmsNorm and WGemm
    /// they replace.
    Fp16,
}

impl Saturate {
    /// The default schedule over the given families: everything but `attention` first, to
    /// saturation; then `attention` (which needs the fused norms and ropes) for a bounded number of
    /// iterations.
    pub fn with_families(families: Vec<Family>) -> Saturate {
        let (fusion, canonical): (Vec<Family>, Vec<Family>) = families.into_iter().partition(|f| f.name == "attention");
        let mut phases = vec![Phase {
            name: "canonical".into(),
            families: canonical,
            extra_rules: vec![],
            limits: Limits { nodes: 2_000_000, iterations: 30, time: Duration::from_secs(30) },
        }];
        if !fusion.is_empty() {
            phases.push(Phase {
                name: "fusion".into(),
                families: fusion,
                extra_rules: vec![],
                limits: Limits { nodes: 2_000_000, iterations: 8, time: Duration::from_secs(30) },
            });
        }
        Saturate { phases, cost: CostModel::Host }
    }

    /// The schedule of fp16 targets: the default schedule over `families`, then a phase `fp16`
    /// running `fp16_families` (the `fp16-rescale` family rewrites each fused op once; the
    /// iteration limit leaves room for the backoff scheduler to ban and readmit a rule on a model
    /// with many of them), extracting under [`Fp16Cost`].
    pub fn for_fp16(families: Vec<Family>, fp16_families: Vec<Family>) -> Saturate {
        let mut s = Saturate::with_families(families);
        s.phases.push(Phase {
            name: "fp16".into(),
            families: fp16_families,
            extra_rules: vec![],
            limits: Limits { nodes: 2_000_000, iterations: 12, time: Duration::from_secs(30) },
        });
        s.cost = CostModel::Fp16;
        s
    }
}

impl Pass for Saturate {
    fn name(&self) -> &'static str {
        "saturate"
    }
    fn contract(&self) -> &'static str {
        "Expects a canonical graph. Runs the rule schedule on its e-graph (with limits, reporting stop reasons and sizes) and extracts the cheapest equivalent program under the target's cost model."
    }
    fn run(&self, graph: Graph) -> Result<(Graph, PassDetail), PassError> {
        let sat = saturate(&graph, &self.phases, false);
        if !sat.report.type_conflicts.is_empty() {
            return Err(PassError::TypeConflicts {
                count: sat.report.type_conflicts.len(),
                first: sat.report.type_conflicts[0].clone(),
            });
        }
        let g = match self.cost {
            CostModel::Host => extract_graph(&graph, &sat, HostCost),
            CostModel::Fp16 => extract_graph(&graph, &sat, Fp16Cost),
        };
        let phases: Vec<String> = sat
            .report
            .phases
            .iter()
            .map(|p| {
                format!(
                    "{}: {} after {} iterations, {} e-nodes / {} e-classes",
                    p.name,
                    p.stop_reason,
                    p.iterations.len(),
                    p.egraph_nodes,
                    p.egraph_classes
                )
            })
            .collect();
        let mut summary = phases.join("; ");
        if !sat.report.declined.is_empty() {
            summary.push_str(&format!("; {} groups declined", sat.report.declined.len()));
        }
        let data = serde_json::to_value(&sat.report).unwrap_or(serde_json::Value::Null);
        Ok((g, PassDetail { summary, data }))
    }
}

/// `lower-slices`: expects a graph after `saturate`. Each `Split` whose part sizes are known
/// becomes one `Slice` per part (the builder splits packed QKV and gate/up products that the
/// rewrites did not split into per-part GEMMs; the executor and the code generators know Slice).
/// Then a `Slice` of a weight with constant bounds that selects one contiguous run of its bytes
/// (step 1, every axis after the first sliced one whole, whole bytes) becomes a weight of its own
/// viewing the same bytes, so the executor and the code generators see weights, not slicing: how
/// a packed weight reaches the per-part GEMMs the `weight-only` rules make of a `MatMulNBits →
/// Split`. Guarantees the same program; no weight byte is copied.
pub struct LowerSlices;

impl Pass for LowerSlices {
    fn name(&self) -> &'static str {
        "lower-slices"
    }
    fn contract(&self) -> &'static str {
        "Expects a graph after saturate. Guarantees the same program with every Split of known part sizes written as Slices, and every Slice of a weight by constant bounds selecting one contiguous byte run replaced by a weight viewing those bytes."
    }
    fn run(&self, graph: Graph) -> Result<(Graph, PassDetail), PassError> {
        let (mut graph, splits) = splits_to_slices(graph);
        let mut folded = 0;
        for n in 0..graph.nodes.len() {
            let Some((out, weight)) = weight_slice(&graph, n) else { continue };
            let taken = graph.values.iter().any(|v| v.name == weight.name);
            let name = weight.name.clone();
            let id = std::sync::Arc::make_mut(&mut graph.weights).add(weight);
            let value = &mut graph.values[out.0 as usize];
            if !taken {
                value.name = name;
            }
            value.def = ir::graph::ValueDef::Weight(id);
            // The Slice now defines a value nothing reads, so pruning drops it.
            let mut orphan = value.clone();
            orphan.name = format!("{}.folded", orphan.name);
            orphan.def = ir::graph::ValueDef::Node { node: ir::NodeId(n as u32), output: 0 };
            graph.values.push(orphan);
            graph.nodes[n].outputs[0] = ir::ValueId(graph.values.len() as u32 - 1);
            folded += 1;
        }
        let g = graph.pruned();
        let summary = format!("{splits} Split parts as Slices, {folded} weight slices as weights");
        Ok((g, PassDetail { summary, data: serde_json::json!({ "split_parts": splits, "weight_slices": folded }) }))
    }
}

/// The weight node `n` computes when it is a contiguous Slice of a weight: (its output, the view).
fn weight_slice(graph: &Graph, n: usize) -> Option<(ir::ValueId, ir::Weight)> {
    use ir::graph::ValueDef;
    let node = &graph.nodes[n];
    if node.op != "Slice" || node.domain != ir::Domain::Onnx {
        return None;
    }
    let ValueDef::Weight(src) = graph.value(node.inputs[0]?).def else { return None };
    let w = graph.weights.get(src);
    let konst = |k: usize| -> Option<Vec<i64>> {
        match &graph.value(node.inputs.get(k).copied().flatten()?).def {
            ValueDef::Const(t) => t.as_i64().map(<[i64]>::to_vec),
            _ => None,
        }
    };
    let (starts, ends) = (konst(1)?, konst(2)?);
    let rank = w.shape.len();
    let axes = match node.inputs.get(3).copied().flatten() {
        Some(_) => konst(3)?,
        None => (0..starts.len() as i64).collect(),
    };
    let steps = match node.inputs.get(4).copied().flatten() {
        Some(_) => konst(4)?,
        None => vec![1; starts.len()],
    };
    let mut lo = vec![0usize; rank];
    let mut hi = w.shape.clone();
    for (i, &a) in axes.iter().enumerate() {
        let axis = usize::try_from(if a < 0 { a + rank as i64 } else { a }).ok().filter(|&x| x < rank)?;
        if *steps.get(i)? != 1 {
            return None;
        }
        let len = w.shape[axis] as i64;
        let clamp = |v: i64| (if v < 0 { v + len } else { v }).clamp(0, len) as usize;
        lo[axis] = clamp(*starts.get(i)?);
        hi[axis] = clamp(*ends.get(i)?).max(lo[axis]);
    }
    // Contiguous: only the first axis with a partial range may differ from the whole dim, and
    // every axis before it has length 1 in the result.
    let first = (0..rank).find(|&a| lo[a] != 0 || hi[a] != w.shape[a]).unwrap_or(rank);
    if (first + 1..rank).any(|a| lo[a] != 0 || hi[a] != w.shape[a]) || (0..first).any(|a| w.shape[a] != 1) {
        return None;
    }
    let inner: usize = w.shape[first.min(rank)..].iter().skip(1).product();
    let (start_el, count_el) =
        if first == rank { (0, w.numel()) } else { (lo[first] * inner, (hi[first] - lo[first]) * inner) };
    let bits = w.dtype.bits() as usize;
    if !(start_el * bits).is_multiple_of(8) || !(count_el * bits).is_multiple_of(8) {
        return None;
    }
    let bytes = w.bytes.slice(start_el * bits / 8..(start_el + count_el) * bits / 8);
    let shape: Vec<usize> = (0..rank).map(|a| hi[a] - lo[a]).collect();
    let range = if first == rank { String::new() } else { format!("{}:{}", lo[first], hi[first]) };
    let name = format!("{}[{}{range}]", w.name, ",".repeat(first.min(rank)));
    Some((node.outputs[0], ir::Weight::new(name, w.dtype, shape, bytes)))
}

/// Rewrites every `Split` whose parts have known sizes along the split axis into one `Slice` per
/// part; returns the graph and the number of Slices made.
fn splits_to_slices(mut g: Graph) -> (Graph, usize) {
    let old = std::mem::take(&mut g.nodes);
    let mut made = 0;
    for node in old {
        let parts =
            if node.op == "Split" && node.domain == ir::Domain::Onnx { split_parts(&mut g, &node) } else { None };
        for n in parts.unwrap_or_else(|| vec![node]) {
            let id = ir::NodeId(g.nodes.len() as u32);
            for (k, &o) in n.outputs.iter().enumerate() {
                g.values[o.0 as usize].def = ir::graph::ValueDef::Node { node: id, output: k };
            }
            made += usize::from(n.op == "Slice" && n.name.contains(".part"));
            g.nodes.push(n);
        }
    }
    (g, made)
}

/// The Slices that compute `split`'s outputs, when every output's size along the axis is known.
fn split_parts(g: &mut Graph, split: &ir::Node) -> Option<Vec<ir::Node>> {
    let x = split.inputs.first().copied().flatten()?;
    let rank = g.value(x).shape.len() as i64;
    let axis = split.attrs.int("axis").ok().flatten().unwrap_or(0);
    let axis = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&axis) {
        return None;
    }
    let lens: Vec<i64> =
        split.outputs.iter().map(|&o| g.value(o).shape.get(axis as usize)?.as_known()).collect::<Option<_>>()?;
    let konst = |g: &mut Graph, name: String, v: i64| {
        let t = ir::Tensor::from_i64(ir::DType::I64, vec![1], vec![v]);
        g.values.push(ir::Value {
            name,
            dtype: ir::DType::I64,
            shape: vec![ir::Dim::known(1)],
            def: ir::graph::ValueDef::Const(t),
        });
        ir::ValueId(g.values.len() as u32 - 1)
    };
    let axis_id = konst(g, format!("{}.axis", split.name), axis);
    let mut start = 0;
    let mut nodes = Vec::with_capacity(lens.len());
    for (k, (&o, len)) in split.outputs.iter().zip(lens).enumerate() {
        let s = konst(g, format!("{}.part{k}.start", split.name), start);
        let e = konst(g, format!("{}.part{k}.end", split.name), start + len);
        start += len;
        nodes.push(ir::Node {
            name: format!("{}.part{k}", split.name),
            domain: ir::Domain::Onnx,
            op: "Slice",
            opset: split.opset.max(13),
            attrs: ir::Attrs::default(),
            inputs: vec![Some(x), Some(s), Some(e), Some(axis_id)],
            outputs: vec![o],
        });
    }
    Some(nodes)
}

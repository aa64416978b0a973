//! Decode's chained projections in a compiled program: the runs of nodes one qgemv design call
//! computes from f32 rows to f32 outputs ([`crate::qgemv`]), so the host neither quantises the
//! rows nor sums the weight's passes.
//!
//! A chain is found from its `QGemm` back to what quantises its rows, and forward to what reads
//! its output:
//!
//! ```text
//! rows:  QuantizeRows(x)                                          ─┐
//! norm:  InverseRms{aligned}(x), QuantizeRows(x, γ), Mul(scales, r) ├─ QGemm ─┬─ (the output)
//! gate:  QuantizeSwiGlu(g, u)                                     ─┘          └─ Slice, Slice, Add  (pairs)
//! ```
//!
//! With pairs the weight's last half of columns is its residual pass (`first_pass_columns` half
//! the columns) and the two `Slice`s take the halves apart for the `Add`, which the design does
//! in its epilogue. A norm-fed chain needs γ of bfloat16 values (a core multiplies by it in 32
//! integer bits), the zero points must all be 0, and nothing outside the chain may read a value
//! its nodes compute but the last one's output. [`collect`] returns the chains and, for every
//! `QGemm` that is none, why. A norm-fed chain can start one node earlier, at the residual
//! `Add` its norm reads ([`summed`]): its inputs are then the two addends, and the sum, which
//! later nodes read too, a second output.

use crate::qgemv::Feed;
use ir::graph::{Graph, Node, ValueDef, ValueId};
use ir::{DType, Domain};

/// A chained projection of a program (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct ChainSite {
    pub qgemm: String,
    pub feed: Feed,
    /// Every node, in program order; the last writes `output`.
    pub nodes: Vec<String>,
    /// The rows (a norm's input), a gate's rows then the up's, or a sum's two addends.
    pub inputs: Vec<String>,
    pub gamma: Option<String>,
    pub output: String,
    /// A sum-fed chain's second output ([`summed`]): the residual `Add`'s sum.
    pub sum: Option<String>,
    /// Values a row read and written (`n` half the weight's columns with pairs).
    pub k: usize,
    pub n: usize,
    pub pairs: bool,
    /// The activation passes the rows are quantised in.
    pub passes: usize,
}

/// The program's chains, and `(QGemm node, reason)` for each `QGemm` that is not one.
pub fn collect(g: &Graph) -> (Vec<ChainSite>, Vec<(String, String)>) {
    let readers = readers(g);
    let (mut chains, mut refused) = (vec![], vec![]);
    for (i, n) in g.nodes.iter().enumerate() {
        if n.domain != Domain::Npuc || n.op != "QGemm" {
            continue;
        }
        match chain_of(g, &readers, i) {
            Ok(c) => chains.push(c),
            Err(reason) => refused.push((n.name.clone(), reason)),
        }
    }
    (chains, refused)
}

/// Per value, the nodes reading it.
fn readers(g: &Graph) -> Vec<Vec<usize>> {
    let mut r = vec![Vec::new(); g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for v in n.inputs.iter().flatten() {
            r[v.0 as usize].push(i);
        }
    }
    r
}

fn producer(g: &Graph, v: ValueId) -> Option<usize> {
    match g.value(v).def {
        ValueDef::Node { node, .. } => Some(node.0 as usize),
        _ => None,
    }
}

fn input(n: &Node, i: usize) -> Result<ValueId, String> {
    n.inputs.get(i).copied().flatten().ok_or_else(|| format!("`{}` has no input {i}", n.name))
}

fn int_attr(n: &Node, name: &str, default: i64) -> i64 {
    n.attrs.int(name).ok().flatten().unwrap_or(default)
}

/// Whether `v` is a weight or constant of integers that are all 0.
fn zeros(g: &Graph, v: ValueId) -> bool {
    match &g.value(v).def {
        ValueDef::Weight(w) => g.weights.get(*w).bytes.iter().all(|&b| b == 0),
        ValueDef::Const(t) => t.as_i64().is_some_and(|x| x.iter().all(|&v| v == 0)),
        _ => false,
    }
}

/// What quantises a chain's rows: its nodes (program indices), feed, inputs and γ.
struct Quantised {
    nodes: Vec<usize>,
    feed: Feed,
    inputs: Vec<ValueId>,
    gamma: Option<ValueId>,
}

fn chain_of(g: &Graph, readers: &[Vec<usize>], q: usize) -> Result<ChainSite, String> {
    let n = &g.nodes[q];
    let passes = int_attr(n, "passes", 1).max(1) as usize;
    let first = int_attr(n, "first_pass_columns", 0).max(0) as usize;
    let w = input(n, 3)?;
    let (k, columns) = match (&g.value(w).def, g.value(w).shape.as_slice()) {
        (ValueDef::Weight(_), [k, c]) => (k.as_known().unwrap_or(0) as usize, c.as_known().unwrap_or(0) as usize),
        _ => return Err("its weight is not a [K, N] weight of the bundle".into()),
    };
    if g.value(w).dtype != DType::I8 || !zeros(g, input(n, 2)?) || !zeros(g, input(n, 5)?) {
        return Err("its codes are not int8 with zero points 0".into());
    }
    let mut quantised = quantised_rows(g, n, passes)?;
    let pairs = first > 0;
    let (tail, output) = match pairs {
        true if 2 * first == columns => passes_sum(g, readers, n, first)?,
        true => return Err(format!("{first} of {columns} columns take the first pass only, not half")),
        false => (vec![], n.outputs[0]),
    };
    quantised.nodes.push(q);
    quantised.nodes.extend(tail);
    quantised.nodes.sort_unstable();
    closed(g, readers, &quantised.nodes, output)?;
    let name = |v: ValueId| g.value(v).name.clone();
    Ok(ChainSite {
        qgemm: n.name.clone(),
        feed: quantised.feed,
        nodes: quantised.nodes.iter().map(|&i| g.nodes[i].name.clone()).collect(),
        inputs: quantised.inputs.iter().map(|&v| name(v)).collect(),
        gamma: quantised.gamma.map(name),
        output: name(output),
        sum: None,
        k,
        n: if pairs { first } else { columns },
        pairs,
        passes,
    })
}

/// The nodes quantising a QGemm's rows: its codes' producer, and a norm's `InverseRms` and
/// `Mul` of the row scales.
fn quantised_rows(g: &Graph, qgemm: &Node, passes: usize) -> Result<Quantised, String> {
    let codes = input(qgemm, 0)?;
    let p = producer(g, codes).ok_or("its codes are no node's")?;
    let pn = &g.nodes[p];
    let known = pn.domain == Domain::Npuc && matches!(pn.op, "QuantizeRows" | "QuantizeSwiGlu");
    if !known || pn.outputs.first() != Some(&codes) {
        return Err(format!("its codes come from `{}` ({}), not a quantisation of rows", pn.name, pn.op));
    }
    if int_attr(pn, "passes", 1).max(1) as usize != passes {
        return Err(format!("`{}` quantises other passes than the QGemm takes", pn.name));
    }
    let scales = input(qgemm, 1)?;
    let unscaled = pn.outputs.get(1).copied();
    if pn.op == "QuantizeSwiGlu" {
        if Some(scales) != unscaled {
            return Err("a gate's row scales are scaled again".into());
        }
        let inputs = vec![input(pn, 0)?, input(pn, 1)?];
        return Ok(Quantised { nodes: vec![p], feed: Feed::Gate { kept: true }, inputs, gamma: None });
    }
    let x = input(pn, 0)?;
    let Some(gamma) = pn.inputs.get(1).copied().flatten() else {
        return match Some(scales) == unscaled {
            true => Ok(Quantised { nodes: vec![p], feed: Feed::Rows, inputs: vec![x], gamma: None }),
            false => Err("its row scales are scaled again without a norm".into()),
        };
    };
    norm_rows(g, (p, x, gamma), (scales, unscaled))
}

/// A norm-fed chain's `InverseRms` and `Mul`: the row scales are `QuantizeRows(x, γ)`'s times
/// `InverseRms{aligned}(x)`, and γ is of bfloat16 values.
fn norm_rows(
    g: &Graph,
    (p, x, gamma): (usize, ValueId, ValueId),
    (scales, unscaled): (ValueId, Option<ValueId>),
) -> Result<Quantised, String> {
    let mul = producer(g, scales).map(|i| (i, &g.nodes[i]));
    let Some((mul, m)) = mul.filter(|(_, m)| m.op == "Mul" && m.inputs.first().copied().flatten() == unscaled) else {
        return Err("a norm's row scales are not its quantisation's times the inverse rms".into());
    };
    let r = input(m, 1)?;
    let inv = producer(g, r).filter(|&i| {
        let n = &g.nodes[i];
        n.op == "InverseRms" && n.inputs.first().copied().flatten() == Some(x)
    });
    let Some(inv) = inv else { return Err("a norm's scales are not multiplied by its rows' inverse rms".into()) };
    let attrs = &g.nodes[inv].attrs;
    if attrs.str("squares").ok().flatten() != Some("aligned") {
        return Err("its norm sums squares in another order than a core does".into());
    }
    if !ir::pinned_norm::bfloat16_values(g, gamma) {
        return Err(format!("its norm's γ `{}` is not bfloat16, which a core multiplies by", g.value(gamma).name));
    }
    let epsilon = attrs.float("epsilon").ok().flatten().unwrap_or(1e-5);
    let nodes = vec![inv, p, mul];
    Ok(Quantised { nodes, feed: Feed::Norm { epsilon, sum: false }, inputs: vec![x], gamma: Some(gamma) })
}

/// A norm-fed chain taking its norm's input's `Add` too, if that input is the sum of two f32
/// values of its own shape that nodes compute (the residual stream and a projection's output):
/// the `Add` its first node, the two addends its inputs, the sum its second output
/// ([`crate::qgemv::Feed::Norm`] with `sum`). Other nodes may read the sum.
pub fn summed(g: &Graph, site: &ChainSite) -> Option<ChainSite> {
    let Feed::Norm { epsilon, sum: false } = site.feed else { return None };
    let by_name = |name: &str| g.values.iter().position(|v| v.name == name).map(|i| ValueId(i as u32));
    let x = by_name(site.inputs.first()?)?;
    let add = &g.nodes[producer(g, x)?];
    let addends: Vec<ValueId> = add.inputs.iter().flatten().copied().collect();
    let computed = |v: ValueId| {
        let value = g.value(v);
        value.dtype == DType::F32 && value.shape == g.value(x).shape && matches!(value.def, ValueDef::Node { .. })
    };
    let fits = add.domain == Domain::Onnx && add.op == "Add" && add.outputs == [x] && addends.len() == 2;
    if !fits || !addends.iter().all(|&v| computed(v)) || g.value(x).dtype != DType::F32 {
        return None;
    }
    let mut nodes = vec![add.name.clone()];
    nodes.extend(site.nodes.iter().cloned());
    Some(ChainSite {
        feed: Feed::Norm { epsilon, sum: true },
        nodes,
        inputs: addends.iter().map(|&v| g.value(v).name.clone()).collect(),
        sum: Some(g.value(x).name.clone()),
        ..site.clone()
    })
}

/// A pairs QGemm's two `Slice`s (its first `first` columns, then the rest) and their `Add`:
/// the nodes and the sum.
fn passes_sum(g: &Graph, readers: &[Vec<usize>], q: &Node, first: usize) -> Result<(Vec<usize>, ValueId), String> {
    let out = q.outputs[0];
    let slices = &readers[out.0 as usize];
    let halves = halves_of(g, out, slices, first);
    let Some(halves) = halves.filter(|_| slices.len() == 2) else {
        return Err("its output is not read as its two passes' halves alone".into());
    };
    let sums: Vec<usize> = halves.iter().flat_map(|&s| readers[g.nodes[s].outputs[0].0 as usize].clone()).collect();
    let add = sums[0];
    let ins: Vec<ValueId> = g.nodes[add].inputs.iter().flatten().copied().collect();
    let want: Vec<ValueId> = halves.iter().map(|&s| g.nodes[s].outputs[0]).collect();
    let is_sum = g.nodes[add].op == "Add" && sums.iter().all(|&s| s == add) && ins.len() == 2;
    if !is_sum || !(ins == want || ins == [want[1], want[0]]) {
        return Err("its passes' halves are not summed by one Add".into());
    }
    Ok((vec![halves[0], halves[1], add], g.nodes[add].outputs[0]))
}

/// The column range `[start, end)` node `i` slices its input `of` to, if it is a `Slice` of
/// the last axis by constants.
fn slice_range(g: &Graph, i: usize, of: ValueId) -> Option<(i64, i64)> {
    let n = &g.nodes[i];
    let c = |j: usize| match &g.value(n.inputs.get(j).copied().flatten()?).def {
        ValueDef::Const(t) => t.as_i64().and_then(|v| (v.len() == 1).then_some(v[0])),
        _ => None,
    };
    let last_axis = c(3).is_some_and(|a| a == -1 || a == g.value(of).shape.len() as i64 - 1);
    let sliced = n.op == "Slice" && n.inputs.len() == 4 && n.inputs[0] == Some(of);
    (sliced && last_axis).then_some((c(1)?, c(2)?))
}

/// Among `slices` (nodes reading `of`), the one of columns `[0, half)` and the one of
/// `[half, 2·half)`, if both are there.
fn halves_of(g: &Graph, of: ValueId, slices: &[usize], half: usize) -> Option<Vec<usize>> {
    let half = half as i64;
    [(0, half), (half, 2 * half)]
        .iter()
        .map(|&want| slices.iter().copied().find(|&s| slice_range(g, s, of) == Some(want)))
        .collect()
}

/// Decode's MLP as a program's two phases: the gate/up chain `gate_up` whose output the
/// `between` slices take apart into the gate's and up's rows, the gate-fed chain `down`'s
/// inputs (indices into [`collect`]'s chains).
#[derive(Clone, Debug, PartialEq)]
pub struct MlpSite {
    pub gate_up: usize,
    pub down: usize,
    pub between: Vec<String>,
}

/// The MLPs among `chains`: a gate-fed pairs chain whose gate and up rows are the halves of a
/// norm- or rows-fed pairs chain's output and read by nothing else, the output read by nothing
/// else either.
pub fn mlps(g: &Graph, chains: &[&ChainSite]) -> Vec<MlpSite> {
    let readers = readers(g);
    let by_name: std::collections::HashMap<&str, ValueId> =
        g.values.iter().enumerate().map(|(i, v)| (v.name.as_str(), ValueId(i as u32))).collect();
    let node_index: std::collections::HashMap<&str, usize> =
        g.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    let mut out = vec![];
    for (d, down) in chains.iter().enumerate().filter(|(_, c)| matches!(c.feed, Feed::Gate { .. }) && c.pairs) {
        let (Some(&gv), Some(&uv)) = (by_name.get(down.inputs[0].as_str()), by_name.get(down.inputs[1].as_str()))
        else {
            continue;
        };
        let head = node_index.get(down.nodes[0].as_str()).copied();
        let only_down = |v: ValueId| readers[v.0 as usize].len() == 1 && Some(readers[v.0 as usize][0]) == head;
        let found = chains.iter().enumerate().find_map(|(u, up)| {
            let out_v = *by_name.get(up.output.as_str())?;
            let halves = halves_of(g, out_v, &readers[out_v.0 as usize], down.k)?;
            let outs: Vec<ValueId> = halves.iter().map(|&s| g.nodes[s].outputs[0]).collect();
            let fits = up.pairs && !matches!(up.feed, Feed::Gate { .. }) && up.n == 2 * down.k;
            let alone = readers[out_v.0 as usize].len() == 2 && outs == [gv, uv] && outs.iter().all(|&v| only_down(v));
            (fits && alone).then(|| (u, halves.iter().map(|&s| g.nodes[s].name.clone()).collect()))
        });
        if let Some((gate_up, between)) = found {
            out.push(MlpSite { gate_up, down: d, between });
        }
    }
    out
}

/// The attention's output projection in front of `mlp`: among `chains`, a rows-fed pairs chain
/// whose output is the second addend of the MLP's sum-fed gate/up chain and read by nothing
/// else, so that a program can write it straight into the gate/up rows operand.
pub fn projection_into(g: &Graph, chains: &[&ChainSite], mlp: &MlpSite) -> Option<usize> {
    let up = chains[mlp.gate_up];
    if !matches!(up.feed, Feed::Norm { sum: true, .. }) {
        return None;
    }
    let addend = up.inputs.get(1)?;
    let readers = readers(g);
    let value = g.values.iter().position(|v| v.name == *addend)?;
    let read_by: Vec<&str> = readers[value].iter().map(|&r| g.nodes[r].name.as_str()).collect();
    chains.iter().position(|o| {
        o.feed == Feed::Rows && o.pairs && o.output == *addend && read_by == [up.nodes[0].as_str()] && o.n == up.k
    })
}

/// Nothing outside `nodes` reads a value they compute, but `output`, and none is a graph output.
fn closed(g: &Graph, readers: &[Vec<usize>], nodes: &[usize], output: ValueId) -> Result<(), String> {
    for &i in nodes {
        for &v in &g.nodes[i].outputs {
            if v == output {
                continue;
            }
            let outside = readers[v.0 as usize].iter().find(|r| !nodes.contains(r));
            if let Some(&r) = outside {
                return Err(format!("`{}` reads `{}`, which the chain computes", g.nodes[r].name, g.value(v).name));
            }
            if g.outputs.contains(&v) {
                return Err(format!("`{}` is a graph output", g.value(v).name));
            }
        }
    }
    Ok(())
}

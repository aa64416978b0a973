//! `array-int8`: the projections as the xdna array computes them.
//!
//! The AIE compute tiles multiply int8 by int8 into int32 (`matmul_i8_i32`); the array takes a
//! projection whose weight is int8 per output channel and whose activations are quantised per
//! row when the step runs. This pass rewrites every projection of a float or weight-only program
//! — a `MatMul` by a constant 2-D float weight (the tied lm_head reads the embedding through a
//! Transpose), a `WGemm` (4- or 8-bit blocks, dequantised exactly first) — into
//!
//! ```text
//! C, S = npuc::QuantizeRows{passes=2}(a)            (per row: s = max|a|/127; C = [c; c'],
//!                                                    S = [s; s'] with the residual's pass second)
//! y = npuc::QGemm{passes=2}(C, S, 0, W8, s_cols, 0)  (W8 int8 [K, N], s_cols [N]: c·W8 + c'·W8,
//!                                                    both passes rows of one call)
//! ```
//!
//! and where the weights take a second pass too (every one but the lm_head's), its columns follow the main
//! pass's in the same weight and multiply the first activation pass only, so one call reads both:
//!
//! ```text
//! y2 = npuc::QGemm{passes=2, first_pass_columns=N}(C, S, 0, [W8 | W8'], [s_cols | s_cols'], 0)
//! y  = y2[.., :N] + y2[.., N:]                       (c·W8 + c'·W8 + c·W8')
//! ```
//!
//! with W8 = round_half_even(W / s_col), s_col = max_k |W[k, col]| / 127, and a second pass
//! quantising what the first rounded away the same way (a' = a − c·s per row; W' = W − W8·s_col
//! per column): about 15 bits a side, every product an exact int8 × int8 → int32 one. One pass a
//! side is not enough: a row's scale is set by its largest channel, and a first token's massive
//! activations leave the rest of its row a few codes ([`precision_of`] has the measurements).
//! The int32 products and their epilogue are `QGemm`'s reference semantics, so a bundle compiled
//! for xdna runs on the host backend with the array's numerics, and a design's int32 readback
//! goes through the same epilogue. `QGemm`s the `qdq` family built (A8W8 models) already are
//! what the array takes and stay as they are; a MatMul of two activations (attention inside a
//! QDQ model) has no constant weight and stays on the host, in float.
//!
//! The summary counts the projections rewritten and the worst per-weight error of the int8
//! weights (max|W8·s − W| / max|W|); the error this costs on the logits is measured against the
//! float program in `tests/xdna_numerics.rs`.

use crate::{Pass, PassDetail, PassError};
use ir::fused::{NBitsError, NBitsWeights};
use ir::graph::{Graph, Node, NodeId, Value, ValueDef, ValueId};
use ir::weights::{Weight, WeightId, WeightStore};
use ir::{Attr, Attrs, DType, Dim, Domain, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

pub struct ArrayInt8;

/// The largest K whose int32 accumulator cannot overflow: |Σₖ a·w| ≤ K · 127 · 127 < 2³¹ for the
/// symmetric int8 codes this pass makes.
pub const MAX_ARRAY_K: usize = (i32::MAX as usize) / (127 * 127);

impl Pass for ArrayInt8 {
    fn name(&self) -> &'static str {
        "array-int8"
    }
    fn contract(&self) -> &'static str {
        "Expects the extracted program. Guarantees every projection with a constant weight (MatMul by a 2-D float weight, WGemm, QGemm) is a sum of QGemms with int8 per-channel weights fed by one QuantizeRows, activations in two passes and every weight but the lm_head's in two passes (or an A8W8 QGemm left as it was); MatMuls of two activations stay float."
    }
    fn run(&self, graph: Graph) -> Result<(Graph, PassDetail), PassError> {
        rewrite(graph)
    }
}

/// A projection found in the program: its activation, its weight, what it came from.
struct Projection {
    a: ValueId,
    k: usize,
    n: usize,
    /// The weight (or constant) the int8 form is named after and cached by: a weight read by two
    /// projections is quantised once.
    source: Source,
    weights: Weights,
    bias: Option<ValueId>,
}

/// Where a projection's weight values come from, read where they lie (a model's weights are a
/// memory map: no f32 or f64 copy of a whole weight is made).
enum Weights {
    /// f32 little-endian bytes, row-major [K, N] — or [N, K] when `nk` (a table the tied lm_head
    /// reads transposed).
    F32 { bytes: bytes::Bytes, nk: bool },
    /// A WGemm's blocks, dequantised column by column.
    NBits(NBitsWeights),
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Weight(WeightId),
    Const(ValueId),
}

impl Source {
    fn name(self, g: &Graph) -> String {
        match self {
            Source::Weight(w) => g.weights.get(w).name.clone(),
            Source::Const(v) => g.value(v).name.clone(),
        }
    }
}

/// The tensor of a weight or constant value, or of a view of one the program computes at run
/// time (a Slice of a packed projection's rows, a Reshape): those are evaluated here, once.
fn weight_tensor(g: &Graph, v: ValueId) -> Option<(Source, Tensor)> {
    match &g.value(v).def {
        ValueDef::Weight(w) => Some((Source::Weight(*w), g.weights.get(*w).to_tensor().ok()?)),
        ValueDef::Const(t) => Some((Source::Const(v), t.clone())),
        ValueDef::Input => None,
        ValueDef::Node { node, .. } => {
            let n = g.node(*node);
            if n.domain != Domain::Onnx || !matches!(n.op, "Slice" | "Reshape" | "Squeeze" | "Unsqueeze") {
                return None;
            }
            let args: Option<Vec<Option<Tensor>>> = n
                .inputs
                .iter()
                .map(|i| match i {
                    None => Some(None),
                    Some(v) => weight_tensor(g, *v).map(|(_, t)| Some(t)),
                })
                .collect();
            let args = args?;
            let refs: Vec<Option<&Tensor>> = args.iter().map(Option::as_ref).collect();
            let op = ir::OpRef { node: &n.name, domain: n.domain, op: n.op, opset: n.opset, attrs: &n.attrs };
            let t = ir::eval::eval_op(&op, &refs, n.outputs.len()).ok()?.swap_remove(0);
            Some((Source::Const(v), t))
        }
    }
}

/// A float weight's f32 bytes and shape, without copying a mapped weight.
fn f32_weight(g: &Graph, v: ValueId) -> Option<(Source, Vec<usize>, bytes::Bytes)> {
    if let ValueDef::Weight(w) = g.value(v).def {
        let wt = g.weights.get(w);
        if wt.dtype == DType::F32 {
            return Some((Source::Weight(w), wt.shape.clone(), wt.bytes.clone()));
        }
    }
    let (source, t) = weight_tensor(g, v)?;
    if !t.dtype.is_float() {
        return None;
    }
    let bytes: Vec<u8> = t.to_f32_vec().iter().flat_map(|x| x.to_le_bytes()).collect();
    Some((source, t.shape.clone(), bytes::Bytes::from(bytes)))
}

/// The projection `n` computes, if it is one the array takes and not yet int8.
fn projection(g: &Graph, n: &Node) -> Result<Option<Projection>, NBitsError> {
    let input = |i: usize| n.inputs.get(i).copied().flatten();
    match (n.domain, n.op) {
        (Domain::Npuc, "WGemm" | "WGemmRowScaled") => {
            let (Some(a), Some(w), Some(s)) = (input(0), input(1), input(2)) else { return Ok(None) };
            let (Some((source, w)), Some((_, s))) = (weight_tensor(g, w), weight_tensor(g, s)) else { return Ok(None) };
            let z = match input(3) {
                Some(z) => match weight_tensor(g, z) {
                    Some((_, z)) => Some(z),
                    None => return Ok(None),
                },
                None => None,
            };
            let nb = NBitsWeights::new(&n.attrs, &w, &s, z.as_ref())?;
            Ok(Some(Projection { a, k: nb.k, n: nb.n, source, weights: Weights::NBits(nb), bias: input(4) }))
        }
        (Domain::Onnx, "MatMul") => {
            let (Some(a), Some(b)) = (input(0), input(1)) else { return Ok(None) };
            if !g.value(a).dtype.is_float() {
                return Ok(None);
            }
            if let Some((source, shape, bytes)) = f32_weight(g, b).filter(|(_, s, _)| s.len() == 2) {
                let weights = Weights::F32 { bytes, nk: false };
                return Ok(Some(Projection { a, k: shape[0], n: shape[1], source, weights, bias: None }));
            }
            // The tied lm_head: MatMul(x, Transpose(table [N, K])), the permutation [1, 0] written
            // out or left to its default (the reverse), as torch's exporter leaves it.
            let ValueDef::Node { node, .. } = g.value(b).def else { return Ok(None) };
            let t = g.node(node);
            let perm = t.attrs.ints("perm").ok().flatten();
            if t.op != "Transpose" || perm.is_some_and(|p| p != [1, 0]) {
                return Ok(None);
            }
            let Some((source, shape, bytes)) = t.inputs[0].and_then(|v| f32_weight(g, v)) else { return Ok(None) };
            if shape.len() != 2 {
                return Ok(None);
            }
            let weights = Weights::F32 { bytes, nk: true };
            Ok(Some(Projection { a, k: shape[1], n: shape[0], source, weights, bias: None }))
        }
        _ => Ok(None),
    }
}

/// Quantises column by column (one output channel at a time), each thread taking a range of
/// columns: `column(col, buf)` fills buf with W[:, col]. Returns (codes [N, K], scales [N],
/// max|W8·s − W|, max|W|).
fn quantize_by_column(
    k: usize,
    n: usize,
    column: &(dyn Fn(usize, &mut [f32]) + Sync),
) -> (Vec<i8>, Vec<f32>, f64, f64) {
    let mut codes = vec![0i8; n * k];
    let mut scales = vec![0f32; n];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(n.max(1));
    let per = n.div_ceil(threads);
    let (err, max) = std::thread::scope(|scope| {
        let jobs: Vec<_> = codes
            .chunks_mut(per * k)
            .zip(scales.chunks_mut(per))
            .enumerate()
            .map(|(t, (codes, scales))| {
                scope.spawn(move || {
                    let mut buf = vec![0f32; k];
                    let (mut err, mut max) = (0.0f64, 0.0f64);
                    for (j, s) in scales.iter_mut().enumerate() {
                        column(t * per + j, &mut buf);
                        let m = buf.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                        *s = if m > 0.0 { m / 127.0 } else { 1.0 };
                        for (c, &w) in codes[j * k..(j + 1) * k].iter_mut().zip(&buf) {
                            let q = (w / *s).round_ties_even().clamp(-127.0, 127.0);
                            *c = q as i8;
                            err = err.max((q as f64 * *s as f64 - w as f64).abs());
                        }
                        max = max.max(m as f64);
                    }
                    (err, max)
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).fold((0.0f64, 0.0f64), |(e, m), (a, b)| (e.max(a), m.max(b)))
    });
    (codes, scales, err, max)
}

/// [`quantize_columns`] of a row-major [K, N] f32 weight, read in row order (twice: the column
/// maxima, then the codes), each thread taking a range of rows.
fn quantize_rows_major(bytes: &[u8], k: usize, n: usize) -> (Vec<i8>, Vec<f32>, f64) {
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(k.max(1));
    let per = k.div_ceil(threads);
    let rows = |t: usize| t * per..((t + 1) * per).min(k);
    let maxima: Vec<f32> = std::thread::scope(|scope| {
        let jobs: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut m = vec![0f32; n];
                    for r in rows(t) {
                        for (m, w) in m.iter_mut().zip(bytes[r * n * 4..(r + 1) * n * 4].chunks_exact(4)) {
                            *m = m.max(f32::from_le_bytes(w.try_into().unwrap()).abs());
                        }
                    }
                    m
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap())
            .reduce(|a, b| a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect())
            .unwrap_or_default()
    });
    let scales: Vec<f32> = maxima.iter().map(|&m| if m > 0.0 { m / 127.0 } else { 1.0 }).collect();
    let mut codes = vec![0i8; k * n];
    let err = std::thread::scope(|scope| {
        let scales = &scales;
        let jobs: Vec<_> = codes
            .chunks_mut(per * n)
            .enumerate()
            .map(|(t, out)| {
                scope.spawn(move || {
                    let mut err = 0.0f32;
                    let src = &bytes[t * per * n * 4..][..out.len() * 4];
                    for (row_out, row_in) in out.chunks_mut(n).zip(src.chunks(n * 4)) {
                        for ((c, w), &s) in row_out.iter_mut().zip(row_in.chunks_exact(4)).zip(scales) {
                            let w = f32::from_le_bytes(w.try_into().unwrap());
                            let q = (w / s).round_ties_even().clamp(-127.0, 127.0);
                            *c = q as i8;
                            // |q·s − w| ≤ s/2: the error of one code, in f32 (exact enough to report).
                            err = err.max((q * s - w).abs());
                        }
                    }
                    err as f64
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).fold(0.0f64, f64::max)
    });
    let max = maxima.iter().fold(0.0f32, |m, v| m.max(*v)) as f64;
    (codes, scales, if max > 0.0 { err / max } else { 0.0 })
}

/// Per output channel (column of W [K, N]): s = max|W[:, col]|/127 (1 for a zero column), codes
/// rounded half to even (in f32, as a kernel would). Returns (codes row-major [K, N], scales [N],
/// max|W8·s − W| / max|W|).
fn quantize_columns(w: &Weights, k: usize, n: usize) -> (Vec<i8>, Vec<f32>, f64) {
    let (nk, scales, err, max) = match w {
        Weights::F32 { bytes, nk: true } => quantize_by_column(k, n, &|col, buf: &mut [f32]| {
            for (b, w) in buf.iter_mut().zip(bytes[col * k * 4..(col + 1) * k * 4].chunks_exact(4)) {
                *b = f32::from_le_bytes(w.try_into().unwrap());
            }
        }),
        Weights::F32 { bytes, nk: false } => return quantize_rows_major(bytes, k, n),
        Weights::NBits(nb) => quantize_by_column(k, n, &|col, buf: &mut [f32]| {
            for (kk, b) in buf.iter_mut().enumerate() {
                let blk = kk / nb.block;
                *b = ((nb.code(col, kk) - nb.zero(col, blk)) * nb.scale(col, blk)) as f32;
            }
        }),
    };
    (transposed(&nk, n, k), scales, if max > 0.0 { err / max } else { 0.0 })
}

/// `[rows, cols]` row-major into `[cols, rows]`, in tiles so both sides stay in cache.
fn transposed<T: Copy + Default>(m: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = vec![T::default(); rows * cols];
    const TILE: usize = 64;
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    out[c * rows + r] = m[r * cols + c];
                }
            }
        }
    }
    out
}

/// Every node's projection, if it is one the array takes (`None` for the rest and for those
/// whose K the array's accumulators cannot take).
fn projections(g: &Graph) -> Result<Vec<Option<Projection>>, PassError> {
    g.nodes
        .iter()
        .map(|n| {
            projection(g, n).map_err(|source| PassError::ProjectionWeights {
                node: n.name.clone(),
                op: n.op.to_string(),
                source,
            })
        })
        .collect()
}

/// Every projection's activations take two int8 passes: a row's scale is set by its largest
/// channel, and a first token's massive activations leave the rest of its row a few codes (on
/// SmolLM2-135M as optimum exports it, worst prefill logits KL against float 0.51 with one pass,
/// 0.017 with two). Every weight but the lm_head's takes two passes as well: over eight prompts
/// (`tools/xdna_kl_prompts.py`) attention's single-pass weights left prefill KL up to 0.022
/// (mean 0.011), and their second pass brings it to 0.0056 (mean 0.0037). The lm_head (the
/// projection writing a graph output) stays one pass: its second pass would take decode KL from
/// 0.004 to 0.0002 but adds the largest weight's bytes to every token.
fn precision_of(g: &Graph, n: &Node) -> Precision {
    let lm_head = n.outputs.iter().any(|o| g.outputs.contains(o));
    Precision { activation_passes: 2, weight_passes: if lm_head { 1 } else { 2 } }
}

/// Projections the array computes as one call, by the node that emits them (the first): those
/// reading one activation at one precision — q, k and v of a norm; gate and up — their weights
/// side by side. A member whose bias the program computes stays alone (its bias may not exist
/// yet where the group is emitted). Every other member maps to an empty list.
fn groups(g: &Graph, found: &[Option<Projection>]) -> Vec<Vec<usize>> {
    let mut groups = vec![Vec::new(); found.len()];
    let mut first: HashMap<(ValueId, Precision), usize> = HashMap::new();
    for (i, (n, p)) in g.nodes.iter().zip(found).enumerate() {
        let Some(p) = p.as_ref().filter(|p| p.k <= MAX_ARRAY_K) else { continue };
        let constant_bias = p.bias.is_none_or(|b| matches!(g.value(b).def, ValueDef::Weight(_) | ValueDef::Const(_)));
        let key = (p.a, precision_of(g, n));
        match first.get(&key) {
            Some(&f) if constant_bias => groups[f].push(i),
            _ => {
                groups[i].push(i);
                if constant_bias {
                    first.insert(key, i);
                }
            }
        }
    }
    groups
}

fn rewrite(g: Graph) -> Result<(Graph, PassDetail), PassError> {
    let found = projections(&g)?;
    let groups = groups(&g, &found);
    let mut program = Int8Program::new(&g);
    for (i, (n, p)) in g.nodes.iter().zip(&found).enumerate() {
        match p {
            None => program.keep(n),
            Some(p) if p.k > MAX_ARRAY_K => {
                let reason = format!(
                    "K = {}: the array accumulates int8 × int8 products in int32, which can overflow past K = {MAX_ARRAY_K}",
                    p.k
                );
                program.host.push(serde_json::json!({"node": n.name, "op": n.op, "reason": reason}));
                program.nodes.push(n.clone());
            }
            // Emitted with the first of its group.
            Some(_) if groups[i].is_empty() => {}
            Some(_) => {
                let members: Vec<(&Node, &Projection)> =
                    groups[i].iter().map(|&m| (&g.nodes[m], found[m].as_ref().expect("a projection"))).collect();
                let precision = precision_of(&g, n);
                for _ in &members {
                    program.count(precision);
                }
                program.rewritten += members.len();
                let projections: Vec<&Projection> = members.iter().map(|&(_, p)| p).collect();
                let weights = program.int8_weights(&g, &projections, precision.weight_passes);
                program.push_int8_group(&g, &members, weights, precision.activation_passes);
            }
        }
    }
    let data = program.report();
    let summary = program.summary();
    let Int8Program { values, nodes, store, .. } = program;
    // Pruning drops what the old projections read.
    let out = Graph { weights: Arc::new(store), ..g }.with_nodes(values, nodes);
    Ok((out, PassDetail { summary, data }))
}

/// Little-endian bytes of f32 values.
fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// How finely the array's int8 products resolve a projection: its activations and its weights
/// each in one int8 pass, or in two (the second quantising what the first rounded away: about 15
/// bits), every pass an exact int8 × int8 → int32 product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Precision {
    activation_passes: u8,
    weight_passes: u8,
}

/// A projection's activations: codes and row scales (both passes stacked when two).
type RowCodes = (ValueId, ValueId);

/// One weight pass: its codes [K, N], column scales and zero points.
type WeightCodes = (ValueId, ValueId, ValueId);

/// One projection's int8 weight as data: codes [K, N] row-major and column scales, and the
/// residual pass's when the weights take two.
struct Quantised {
    n: usize,
    main: (Vec<i8>, Vec<f32>),
    residual: Option<(Vec<i8>, Vec<f32>)>,
}

/// Codes [K, nᵢ] and scales [nᵢ] of several weights side by side: [K, Σnᵢ] and [Σnᵢ].
fn side_by_side<'q>(
    parts: impl Iterator<Item = (&'q (Vec<i8>, Vec<f32>), usize)> + Clone,
    k: usize,
) -> (Vec<i8>, Vec<f32>) {
    let mut codes = Vec::new();
    for row in 0..k {
        for ((c, _), n) in parts.clone() {
            codes.extend_from_slice(&c[row * n..(row + 1) * n]);
        }
    }
    (codes, parts.flat_map(|((_, s), _)| s.iter().copied()).collect())
}

/// The int8 weight values of one projection — (codes, scales, zeros) — and, when the weights
/// take two passes, the width of the residual pass's columns, which follow the main pass's in
/// the same weight ([K, N + N]: one call reads both).
#[derive(Clone, Copy)]
struct Int8Weights {
    codes: WeightCodes,
    residual_columns: usize,
}

/// A dense row-major [K, N] f32 copy of a projection's weight (for the ones quantised in two
/// passes).
fn dense_kn(w: &Weights, k: usize, n: usize) -> Vec<f32> {
    let f = |b: &[u8]| f32::from_le_bytes(b.try_into().unwrap());
    let nk: Vec<f32> = match w {
        Weights::F32 { bytes, nk: false } => return bytes.chunks_exact(4).map(f).collect(),
        Weights::F32 { bytes, nk: true } => bytes.chunks_exact(4).map(f).collect(),
        Weights::NBits(nb) => nb.dequantized().into_iter().map(|v| v as f32).collect(),
    };
    transposed(&nk, n, k)
}

/// The rewritten program as it is built, and what the pass reports about it.
struct Int8Program {
    store: WeightStore,
    values: Vec<Value>,
    nodes: Vec<Node>,
    /// The int8 scalar zero point every QGemm's activation codes take.
    zero_a: ValueId,
    /// Source weight and its passes → its int8 values, so a shared weight is quantised once.
    quantised: HashMap<(Vec<Source>, u8), Int8Weights>,
    /// Activation and its passes → its codes: projections of one input (q, k, v; gate, up)
    /// share one QuantizeRows.
    rows: HashMap<(ValueId, u8), RowCodes>,
    /// Projections by (activation passes, weight passes).
    by_precision: std::collections::BTreeMap<(u8, u8), usize>,
    rewritten: usize,
    kept_qgemm: usize,
    activation_matmuls: usize,
    worst_error: f64,
    per_weight: Vec<serde_json::Value>,
    /// Nodes the array does not take, with the reason: they stay on the host, as they are.
    host: Vec<serde_json::Value>,
}

impl Int8Program {
    fn new(g: &Graph) -> Int8Program {
        let mut store = WeightStore::default();
        for (_, w) in g.weights.iter() {
            store.add(Weight::new(w.name.clone(), w.dtype, w.shape.clone(), w.bytes.clone()));
        }
        let mut program = Int8Program {
            store,
            values: g.values.clone(),
            nodes: Vec::with_capacity(g.nodes.len()),
            zero_a: ValueId(0),
            quantised: HashMap::new(),
            rows: HashMap::new(),
            by_precision: Default::default(),
            rewritten: 0,
            kept_qgemm: 0,
            activation_matmuls: 0,
            worst_error: 0.0,
            per_weight: Vec::new(),
            host: Vec::new(),
        };
        let zero = ValueDef::Const(Tensor::from_i64(DType::I8, vec![], vec![0]));
        program.zero_a = program.add_value("array_int8.zero".into(), DType::I8, vec![], zero);
        program
    }

    fn add_value(&mut self, name: String, dtype: DType, shape: Vec<Dim>, def: ValueDef) -> ValueId {
        self.values.push(Value { name, dtype, shape, def });
        ValueId(self.values.len() as u32 - 1)
    }

    /// A new weight and the program value that names it.
    fn add_weight(&mut self, name: String, dtype: DType, shape: Vec<usize>, data: Vec<u8>) -> ValueId {
        let dims = shape.iter().map(|&d| Dim::known(d as i64)).collect();
        let id = self.store.add(Weight::new(name.clone(), dtype, shape, bytes::Bytes::from(data)));
        self.add_value(name, dtype, dims, ValueDef::Weight(id))
    }

    /// Keeps a node that is no projection the array takes, counting the products it leaves as
    /// they are.
    fn keep(&mut self, n: &Node) {
        match (n.domain, n.op) {
            (Domain::Npuc, "QGemm") => self.kept_qgemm += 1,
            (Domain::Onnx, "MatMul") => {
                self.activation_matmuls += 1;
                self.host.push(serde_json::json!({"node": n.name, "op": n.op, "reason": "a product of two activations: the array's designs stream a constant weight"}));
            }
            _ => {}
        }
        self.nodes.push(n.clone());
    }

    fn count(&mut self, precision: Precision) {
        *self.by_precision.entry((precision.activation_passes, precision.weight_passes)).or_default() += 1;
    }

    /// One projection's weight in `passes` int8 passes, as data (its error recorded).
    fn quantise(&mut self, g: &Graph, p: &Projection, passes: u8) -> Quantised {
        let dense = (passes > 1).then(|| dense_kn(&p.weights, p.k, p.n));
        let (codes, scales, error) = match &dense {
            None => quantize_columns(&p.weights, p.k, p.n),
            Some(w) => quantize_rows_major(&f32_bytes(w), p.k, p.n),
        };
        self.worst_error = self.worst_error.max(error);
        let name = p.source.name(g);
        self.per_weight.push(serde_json::json!({"weight": name, "k": p.k, "n": p.n, "max_rel_error": error}));
        let residual = dense.map(|w| {
            // What the first pass's codes miss, quantised per output channel in its turn.
            let r: Vec<f32> =
                w.iter().zip(&codes).enumerate().map(|(j, (w, &c))| w - f32::from(c) * scales[j % p.n]).collect();
            let (rc, rs, _) = quantize_rows_major(&f32_bytes(&r), p.k, p.n);
            (rc, rs)
        });
        Quantised { n: p.n, main: (codes, scales), residual }
    }

    /// The int8 weights of a group of projections of one activation (one projection, or q, k
    /// and v), side by side along N, in `passes` passes, quantised on first use.
    fn int8_weights(&mut self, g: &Graph, members: &[&Projection], passes: u8) -> Int8Weights {
        let key = (members.iter().map(|p| p.source).collect::<Vec<_>>(), passes);
        if let Some(&v) = self.quantised.get(&key) {
            return v;
        }
        let parts: Vec<Quantised> = members.iter().map(|p| self.quantise(g, p, passes)).collect();
        let k = members[0].k;
        let base = members.iter().map(|p| p.source.name(g)).collect::<Vec<_>>().join("+");
        let residual: Option<Vec<_>> = parts.iter().map(|q| q.residual.as_ref().map(|r| (r, q.n))).collect();
        let residual_columns = residual.as_ref().map_or(0, |r| r.iter().map(|(_, n)| n).sum());
        let main = parts.iter().map(|q| (&q.main, q.n));
        let codes = side_by_side(main.chain(residual.into_iter().flatten()), k);
        let v = Int8Weights { codes: self.weight_values(&base, k, &codes), residual_columns };
        self.quantised.insert(key, v);
        v
    }

    /// The (W8, s_cols, zeros) values of codes [K, N] and scales [N], named after `base`.
    fn weight_values(&mut self, base: &str, k: usize, (codes, scales): &(Vec<i8>, Vec<f32>)) -> WeightCodes {
        let n = scales.len();
        (
            self.add_weight(format!("{base}.int8"), DType::I8, vec![k, n], codes.iter().map(|&c| c as u8).collect()),
            self.add_weight(format!("{base}.int8_scale"), DType::F32, vec![n], f32_bytes(scales)),
            self.add_weight(format!("{base}.int8_zero"), DType::I8, vec![n], vec![0; n]),
        )
    }

    /// `QuantizeRows(a)` → one `QGemm` per weight pass over the group's weights side by side,
    /// summed, then each member's columns (a `Slice` when the group has more than one) and its
    /// bias (`Add`).
    fn push_int8_group(&mut self, g: &Graph, members: &[(&Node, &Projection)], w: Int8Weights, a_passes: u8) {
        let (first, p) = members[0];
        let rows = self.quantize_rows(g, first, p.a, a_passes);
        let placeholder = ValueDef::Node { node: NodeId(0), output: 0 };
        let out_of = |n: &Node| g.value(n.outputs[0]);
        // Where each member's product lands: its output, or a value its bias is added to.
        let mut products = Vec::new();
        for &(n, p) in members {
            let v = out_of(n);
            products.push(match p.bias {
                None => n.outputs[0],
                Some(_) => self.add_value(format!("{}/product", n.name), v.dtype, v.shape.clone(), placeholder.clone()),
            });
        }
        if let [product] = products[..] {
            self.push_products(&first.name, rows, w, a_passes, product, out_of(first));
        } else {
            let mut v = out_of(first).clone();
            if let Some(last) = v.shape.last_mut() {
                *last = Dim::known(members.iter().map(|(_, p)| p.n as i64).sum());
            }
            let all = self.add_value(format!("{}/group", first.name), v.dtype, v.shape.clone(), placeholder.clone());
            self.push_products(&first.name, rows, w, a_passes, all, &v);
            let mut start = 0;
            for (&(n, p), &product) in members.iter().zip(&products) {
                self.push_columns(&n.name, all, start..start + p.n, product);
                start += p.n;
            }
        }
        for (&(n, p), &product) in members.iter().zip(&products) {
            if let Some(bias) = p.bias {
                let inputs = vec![Some(product), Some(bias)];
                self.push_node(format!("{}/bias", n.name), Domain::Onnx, "Add", 14, inputs, vec![n.outputs[0]]);
            }
        }
    }

    /// The products into `out` (shaped as `v`): one `QGemm` whose rows are the stacked activation
    /// passes (`passes = 2`), so the weight is read once for both. Weights in two passes hold the
    /// residual's columns after the main's: those multiply the first activation pass only
    /// (`first_pass_columns`; main × residual activations is kept, residual × residual is below
    /// both residuals' rounding), and `out` = main columns + residual columns.
    fn push_products(&mut self, name: &str, rows: RowCodes, w: Int8Weights, a_passes: u8, out: ValueId, v: &Value) {
        let placeholder = ValueDef::Node { node: NodeId(0), output: 0 };
        let residual = w.residual_columns;
        let wide = match residual {
            0 => out,
            r => {
                let mut shape = v.shape.clone();
                if let Some(last) = shape.last_mut() {
                    *last = Dim::known(2 * r as i64);
                }
                self.add_value(format!("{name}/passes"), v.dtype, shape, placeholder.clone())
            }
        };
        let (w8, s_cols, z_cols) = w.codes;
        let inputs = vec![Some(rows.0), Some(rows.1), Some(self.zero_a), Some(w8), Some(s_cols), Some(z_cols)];
        self.push_node(name.to_string(), Domain::Npuc, "QGemm", 1, inputs, vec![wide]);
        let attrs = &mut self.nodes.last_mut().expect("just pushed").attrs;
        if a_passes > 1 {
            attrs.set("passes", Attr::Int(i64::from(a_passes)));
            if residual > 0 {
                attrs.set("first_pass_columns", Attr::Int(residual as i64));
            }
        }
        if residual > 0 {
            let main = self.add_value(format!("{name}/main"), v.dtype, v.shape.clone(), placeholder.clone());
            let refined = self.add_value(format!("{name}/residual"), v.dtype, v.shape.clone(), placeholder);
            self.push_columns(&format!("{name}/main"), wide, 0..residual, main);
            self.push_columns(&format!("{name}/residual"), wide, residual..2 * residual, refined);
            let inputs = vec![Some(main), Some(refined)];
            self.push_node(format!("{name}/sum"), Domain::Onnx, "Add", 14, inputs, vec![out]);
        }
    }

    /// `out` = the columns `cols` of `all` (a `Slice` of the last axis).
    fn push_columns(&mut self, name: &str, all: ValueId, cols: std::ops::Range<usize>, out: ValueId) {
        let int = |s: &mut Self, what: &str, v: usize| {
            let t = Tensor::from_i64(DType::I64, vec![1], vec![v as i64]);
            s.add_value(format!("{name}/columns_{what}"), DType::I64, vec![Dim::known(1)], ValueDef::Const(t))
        };
        let (start, end) = (int(self, "start", cols.start), int(self, "end", cols.end));
        let axis = Tensor::from_i64(DType::I64, vec![1], vec![-1]);
        let axes =
            self.add_value(format!("{name}/columns_axis"), DType::I64, vec![Dim::known(1)], ValueDef::Const(axis));
        let inputs = vec![Some(all), Some(start), Some(end), Some(axes)];
        self.push_node(format!("{name}/columns"), Domain::Onnx, "Slice", 13, inputs, vec![out]);
    }

    /// `QuantizeRows(a)` in one pass, or two stacked on a leading axis: (codes, row scales); once
    /// per activation.
    fn quantize_rows(&mut self, g: &Graph, n: &Node, input: ValueId, passes: u8) -> RowCodes {
        if let Some(&rows) = self.rows.get(&(input, passes)) {
            return rows;
        }
        let a = g.value(input);
        let (mut code_shape, mut row_shape) = (a.shape.clone(), a.shape.clone());
        if let Some(last) = row_shape.last_mut() {
            *last = Dim::known(1);
        }
        if passes > 1 {
            code_shape.insert(0, Dim::known(2));
            row_shape.insert(0, Dim::known(2));
        }
        let placeholder = ValueDef::Node { node: NodeId(0), output: 0 };
        let codes = self.add_value(format!("{}/codes", n.name), DType::I8, code_shape, placeholder.clone());
        let rows = self.add_value(format!("{}/row_scales", n.name), DType::F32, row_shape, placeholder);
        let name = format!("{}/quantize_rows", n.name);
        self.push_node(name, Domain::Npuc, "QuantizeRows", 1, vec![Some(input)], vec![codes, rows]);
        if passes > 1 {
            self.nodes.last_mut().expect("just pushed").attrs.set("passes", Attr::Int(2));
        }
        self.rows.insert((input, passes), (codes, rows));
        (codes, rows)
    }

    fn push_node(
        &mut self,
        name: String,
        domain: Domain,
        op: &'static str,
        opset: i64,
        inputs: Vec<Option<ValueId>>,
        outputs: Vec<ValueId>,
    ) {
        self.nodes.push(Node { name, domain, op, opset, attrs: Attrs::default(), inputs, outputs });
    }

    fn summary(&self) -> String {
        let precisions: Vec<String> =
            self.by_precision.iter().map(|((a, w), count)| format!("{count} A{}W{}", 8 * a, 8 * w)).collect();
        let mut summary = format!(
            "{} projections → int8 QGemm ({}; worst weight error {:.2e} of max|W|), {} A8W8 QGemm kept, {} activation MatMuls left float",
            self.rewritten,
            precisions.join(", "),
            self.worst_error,
            self.kept_qgemm,
            self.activation_matmuls
        );
        for h in &self.host {
            summary.push_str(&format!(
                "; host: `{}` ({})",
                h["node"].as_str().unwrap_or(""),
                h["reason"].as_str().unwrap_or("")
            ));
        }
        summary
    }

    fn report(&self) -> serde_json::Value {
        let precision: Vec<serde_json::Value> = self
            .by_precision
            .iter()
            .map(
                |((a, w), count)| serde_json::json!({"activation_passes": a, "weight_passes": w, "projections": count}),
            )
            .collect();
        serde_json::json!({
            "rewritten": self.rewritten,
            "precision": precision,
            "kept_qgemm": self.kept_qgemm,
            "activation_matmuls": self.activation_matmuls,
            "worst_weight_error": self.worst_error,
            "weights": self.per_weight,
            "host": self.host,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::build::{GraphBuilder, ValueType};

    fn rows(width: usize) -> ValueType {
        ValueType::new(DType::F32, vec![Dim::known(1), Dim::sym("sequence_length"), Dim::known(width as i64)])
    }

    /// Refusals, as a fixture: a projection whose K the array's int32 accumulators cannot take,
    /// and a product of two activations, stay float MatMuls on the host, each with its reason; a
    /// projection beside them is taken.
    #[test]
    fn shapes_and_operands_the_array_cannot_take_stay_on_the_host_with_a_reason() {
        let big_k = MAX_ARRAY_K + 1;
        let mut b = GraphBuilder::new("refusals");
        let x = b.input("x", rows(big_k));
        let w_big = b.weight("w_big", &Tensor::from_f32(DType::F32, vec![big_k, 2], vec![0.25; big_k * 2]));
        let y = b.node(Domain::Onnx, "MatMul").name("too_long").inputs(&[x, w_big]).output("y", rows(2)).add()[0];
        let w = b.weight("w", &Tensor::from_f32(DType::F32, vec![2, 2], vec![0.5, -1.0, 2.0, 0.75]));
        let z = b.node(Domain::Onnx, "MatMul").name("taken").inputs(&[y, w]).output("z", rows(2)).add()[0];
        let zt = b
            .node(Domain::Onnx, "Transpose")
            .attr("perm", ir::Attr::Ints(vec![0, 2, 1]))
            .inputs(&[z])
            .output("zt", ValueType::new(DType::F32, vec![Dim::known(1), Dim::known(2), Dim::sym("sequence_length")]))
            .add()[0];
        let gram = b
            .node(Domain::Onnx, "MatMul")
            .name("gram")
            .inputs(&[zt, z])
            .output("gram", ValueType::known(DType::F32, &[1, 2, 2]))
            .add()[0];
        b.output(gram);
        let g = b.finish().unwrap();
        let (out, detail) = ArrayInt8.run(g).unwrap();
        out.verify().unwrap();
        let op_of = |name: &str| out.nodes.iter().find(|n| n.name == name).unwrap().op;
        assert_eq!(op_of("too_long"), "MatMul");
        assert_eq!(op_of("gram"), "MatMul");
        assert_eq!(op_of("taken"), "QGemm");
        let host = detail.data["host"].as_array().unwrap();
        let reason =
            |node: &str| host.iter().find(|h| h["node"] == node).unwrap()["reason"].as_str().unwrap().to_string();
        assert!(
            reason("too_long").contains(&format!("K = {big_k}")) && reason("too_long").contains("int32"),
            "{host:?}"
        );
        assert!(reason("gram").contains("two activations"), "{host:?}");
        assert_eq!(host.len(), 2);
        assert!(detail.summary.contains("host: `too_long`"), "{}", detail.summary);
    }

    /// Projections reading one activation (q and k of one norm) are one QuantizeRows and one
    /// QGemm over their weights side by side, sliced: each computes what it computes alone.
    #[test]
    fn projections_of_one_activation_are_one_call_over_their_weights_side_by_side() {
        let build = |names: &[&str]| {
            let mut b = GraphBuilder::new("qk");
            let x = b.input("x", rows(3));
            for &name in names {
                let w = match name {
                    "q" => vec![0.5, -1.0, 2.0, 0.75, 0.1, -0.3],
                    _ => vec![1.5, 0.2, -0.7, 0.4, 0.9, 1.1],
                };
                let w = b.weight(&format!("w{name}"), &Tensor::from_f32(DType::F32, vec![3, 2], w));
                let y = b.node(Domain::Onnx, "MatMul").name(name).inputs(&[x, w]).output(name, rows(2)).add()[0];
                b.output(y);
            }
            ArrayInt8.run(b.finish().unwrap()).unwrap().0
        };
        let both = build(&["q", "k"]);
        both.verify().unwrap();
        let count = |op: &str| both.nodes.iter().filter(|n| n.op == op).count();
        assert_eq!((count("QuantizeRows"), count("QGemm"), count("Slice")), (1, 1, 2));
        let qgemm = both.nodes.iter().find(|n| n.op == "QGemm").unwrap();
        assert_eq!(both.value(qgemm.inputs[3].unwrap()).shape, [Dim::known(3), Dim::known(4)]);
        let x = Tensor::from_f32(DType::F32, vec![1, 2, 3], vec![0.3, -2.5, 1.25, 40.0, 0.01, -0.02]);
        let input = std::collections::HashMap::from([("x".to_string(), x)]);
        let run = |g: &Graph| ir::run::run_graph(g, &input).unwrap();
        let (together, q, k) = (run(&both), run(&build(&["q"])), run(&build(&["k"])));
        assert_eq!((&together["q"], &together["k"]), (&q["q"], &k["k"]));
    }
}

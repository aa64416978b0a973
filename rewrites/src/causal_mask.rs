//! Is an additive attention mask "causal AND attention_mask" (within a sliding window)? Checked
//! by evaluating it.
//!
//! Exporters build the causal mask in many spellings (transformers' eager and `masking_utils`
//! masks, its SDPA path's boolean `LessOrEqual`/`And` with the padding mask gathered through
//! index arithmetic, `Where(mask, 0, -inf)`); matching each node for node breaks with every
//! transformers release. The mask is index arithmetic on sizes and on `attention_mask`, so this
//! module evaluates the mask's e-class with the reference evaluator at several concrete sizes
//! (batch 2; query length S and past P in {(3, 0), (1, 4), (3, 2), (2, 5)}) and several
//! attention masks (all ones, left padding, a hole), and compares every visible row with the
//! definition: key t is visible to query i of batch b when `t ≤ P + i` and `attention_mask[b, t]
//! ≠ 0`, where the mask must be 0, and hidden where it must be at or below −1e30 (float32 min or
//! −∞); a boolean mask (ONNX Attention's, `true` = attend) must be true and false there. Rows with no visible key (padding queries) are not compared: the fused op outputs zeros
//! there and nothing reads them.
//!
//! `Shape` is answered from the analysis' symbolic shapes under the sizes of the case, so the
//! activations a mask takes its sizes from are never computed. Graph inputs other than
//! `attention_mask` get canonical values (integer `[batch, S]` inputs count positions from P, the
//! rest are zeros); a mask that reads a weight, or whose evaluation fails, is declined with the
//! reason. Sampling sizes is evidence, not a proof; the sizes cover decode (S = 1), prefill with
//! and without a past, and a past longer than the block.
//!
//! Sliding windows (Mistral, Gemma's local layers) show only past the window, so first a decode
//! row is evaluated at pasts of 16, 128, 1024 and [`LONGEST_PAST`] positions: when it hides keys
//! a causal mask would show, the count it shows is the window w, and every case is then compared
//! with the windowed definition (key t visible to query i only when `P + i − t < w`), with cases
//! added that straddle the window. A window longer than [`LONGEST_PAST`] is not seen: the
//! programs npuc compiles hold position tables of that many rows, so no longer context runs.

use crate::apply::Decline;
use egg::Id;
use ir::egraph::{EGraph, ENode, Head};
use ir::eval::EvalError;
use ir::op::OpRef;
use ir::{Attrs, DType, Dim, Tensor};
use std::collections::{HashMap, HashSet};

/// (query length, past length) of each case.
const SIZES: [(usize, usize); 4] = [(3, 0), (1, 4), (3, 2), (2, 5)];
const BATCH: usize = 2;
/// E-classes one evaluation may visit: a mask is tens of nodes, never thousands.
const CLASS_BUDGET: usize = 4000;
/// The longest past a decode row is probed at for a sliding window.
pub const LONGEST_PAST: usize = 8192;
/// Windows up to this long are also checked inside one prefill block (a block of w + 2 rows).
const BLOCK_CHECKED_WINDOW: usize = 256;

/// Why a mask is not proven "causal AND attention_mask": the decline reason a rule records.
#[derive(Debug, thiserror::Error)]
pub enum NotCausal {
    #[error("batch, query and past lengths ({batch}, {seq}, {past}) are not plain sizes")]
    SymbolicSizes { batch: Dim, seq: Dim, past: Dim },
    #[error("the key length overflows")]
    KeyLengthOverflow,
    #[error("{count} graph inputs are shaped [{batch}, {total}]; which is the padding mask is unclear")]
    AmbiguousPadding { count: usize, batch: Dim, total: Dim },
    #[error("no integer graph input is shaped [{batch}, {total}] to read the padding from")]
    NoPaddingInput { batch: Dim, total: Dim },
    #[error("evaluating the mask: {0}")]
    Eval(ProbeError),
    #[error("a decode row at past {past} is shaped {shape:?}")]
    DecodeRowShape { past: usize, shape: Vec<usize> },
    #[error("a decode row at past {past} shows no key")]
    DecodeRowEmpty { past: usize },
    #[error("the mask is not causal{} AND attention_mask (S={s_len}, past={p_len}): {mismatch}", in_window(.window))]
    Differs { window: Option<usize>, s_len: usize, p_len: usize, mismatch: Mismatch },
}

fn in_window(window: &Option<usize>) -> String {
    window.map_or(String::new(), |w| format!(" in a window of {w}"))
}

impl From<NotCausal> for Decline {
    fn from(e: NotCausal) -> Decline {
        Decline(Some(e.to_string()))
    }
}

/// Where an evaluated mask parts from the definition.
#[derive(Debug, thiserror::Error)]
pub enum Mismatch {
    #[error("it is shaped {shape:?}, not broadcastable to [{BATCH}, 1, {s_len}, {total}]")]
    Shape { shape: Vec<usize>, s_len: usize, total: usize },
    #[error("attention_mask is not int64")]
    MaskNotInt64,
    #[error("batch {batch}, query {query}, key {key} is {} but the mask holds {value}", if *.visible { "visible" } else { "hidden" })]
    Entry { batch: usize, query: usize, key: usize, visible: bool, value: f64 },
}

/// Why a class does not evaluate under a case's sizes.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("more than {CLASS_BUDGET} e-classes")]
    Budget,
    #[error("a cycle")]
    Cycle,
    #[error("no node")]
    NoNode,
    #[error("{}", .0.msg)]
    Eval(EvalError),
    #[error("it reads a weight")]
    ReadsWeight,
    #[error("not a value")]
    NotAValue,
    #[error("a value of unknown type")]
    UnknownType,
    #[error("size {0} is not one of the case's")]
    UnknownSize(Dim),
    #[error("size {0} is negative")]
    NegativeSize(Dim),
    #[error("an input of unknown type")]
    UnknownInputType,
    #[error("input `{name}` would hold {elements} elements")]
    InputTooLarge { name: String, elements: usize },
    #[error("input `{name}` is {dtype}")]
    InputDtype { name: String, dtype: DType },
}

/// What an additive mask was proven to be: causal AND the padding read from a graph input
/// (its class), within a sliding window of `window` positions when there is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CausalMask {
    pub padding: Id,
    pub window: Option<usize>,
}

/// What `mask` (broadcastable to `[B, 1, S, T]`) is, when it equals "causal AND attention_mask"
/// (in a sliding window) on every case; why not otherwise.
pub fn padding_source(egraph: &EGraph, mask: Id, batch: &Dim, seq: &Dim, past: &Dim) -> Result<CausalMask, NotCausal> {
    let syms = [batch, seq, past].map(|d| d.as_symbol().map(str::to_string));
    let [Some(b), Some(s), Some(p)] = syms else {
        return Err(NotCausal::SymbolicSizes { batch: batch.clone(), seq: seq.clone(), past: past.clone() });
    };
    let total = past.add(seq).ok_or(NotCausal::KeyLengthOverflow)?;
    let input = attention_mask_input(egraph, batch, &total)?;
    let case = Case { egraph, mask, syms: [b, s, p], input: &input };
    let window = match case.window() {
        Ok(w) => w,
        // Where the short cases already part from the definition, that says more.
        Err(e) => return Err(case.check(&SIZES, None).err().unwrap_or(e)),
    };
    let mut sizes = SIZES.to_vec();
    if let Some(w) = window {
        sizes.extend([(3, w), (1, w + 2), (2, w + 5)]);
        if w <= BLOCK_CHECKED_WINDOW {
            sizes.push((w + 2, 1));
        }
    }
    case.check(&sizes, window)?;
    Ok(CausalMask { padding: input.0, window })
}

/// The mask's class evaluated under concrete sizes.
struct Case<'a> {
    egraph: &'a EGraph,
    mask: Id,
    /// The batch, query length and past length's symbols.
    syms: [String; 3],
    input: &'a MaskInput,
}

impl Case<'_> {
    fn eval(&self, s_len: usize, p_len: usize, am_value: &Tensor) -> Result<Tensor, NotCausal> {
        let [b, s, p] = &self.syms;
        let mut sizes =
            HashMap::from([(b.clone(), BATCH as i64), (s.clone(), s_len as i64), (p.clone(), p_len as i64)]);
        if let Some((mask_batch, mask_total)) = &self.input.2 {
            sizes.insert(mask_batch.clone(), BATCH as i64);
            sizes.insert(mask_total.clone(), (s_len + p_len) as i64);
        }
        let mut probe = Probe::new(self.egraph, sizes, (self.input.1.clone(), am_value.clone()), p_len as i64);
        probe.eval(self.mask).map_err(NotCausal::Eval)
    }

    /// Compares the mask with the definition for every (query length, past) of `sizes` and
    /// every padding pattern.
    fn check(&self, sizes: &[(usize, usize)], window: Option<usize>) -> Result<(), NotCausal> {
        for &(s_len, p_len) in sizes {
            for pattern in 0..3 {
                let am_value = attention_mask_value(pattern, s_len + p_len);
                let value = self.eval(s_len, p_len, &am_value)?;
                compare(&value, &am_value, s_len, p_len, window).map_err(|mismatch| NotCausal::Differs {
                    window,
                    s_len,
                    p_len,
                    mismatch,
                })?;
            }
        }
        Ok(())
    }

    /// The sliding window a decode row shows (see the module doc), if any.
    fn window(&self) -> Result<Option<usize>, NotCausal> {
        for past in [16, 128, 1024, LONGEST_PAST] {
            let am = attention_mask_value(0, past + 1);
            let value = self.eval(1, past, &am)?;
            let row = value.to_f64_vec();
            let Some(row) = row.get(row.len().saturating_sub(past + 1)..).filter(|r| r.len() == past + 1) else {
                return Err(NotCausal::DecodeRowShape { past, shape: value.shape.clone() });
            };
            let shows = |m: f64| if value.dtype == DType::Bool { m != 0.0 } else { m == 0.0 };
            let shown = row.iter().filter(|&&m| shows(m)).count();
            if shown < past + 1 {
                // The definition's check (compare) says whether these are the last `shown` keys.
                return if shown == 0 { Err(NotCausal::DecodeRowEmpty { past }) } else { Ok(Some(shown)) };
            }
        }
        Ok(None)
    }
}

/// The one integer graph input shaped `[batch, past + seq]`; failing that, the one integer
/// rank-2 input whose two sizes are names no other input uses (torch.export names the mask's
/// sizes apart when the graph reads it only through index arithmetic): then also those names,
/// which the probe binds to the batch and the key length.
fn attention_mask_input(egraph: &EGraph, batch: &Dim, total: &Dim) -> Result<MaskInput, NotCausal> {
    let inputs: Vec<(Id, String, Vec<Dim>)> = egraph
        .classes()
        .flat_map(|c| c.nodes.iter().map(move |n| (c.id, n)))
        .filter_map(|(id, n)| match &n.head {
            Head::Input(name) => {
                let ty = egraph[id].data.ty()?;
                ty.dtype.is_int().then(|| (id, name.to_string(), ty.shape.clone()))
            }
            _ => None,
        })
        .collect();
    let want = [batch.clone(), total.clone()];
    let exact: Vec<_> = inputs.iter().filter(|(_, _, s)| *s == want).collect();
    match exact.as_slice() {
        [(id, name, _)] => return Ok((*id, name.clone(), None)),
        [] => {}
        _ => {
            return Err(NotCausal::AmbiguousPadding { count: exact.len(), batch: batch.clone(), total: total.clone() })
        }
    }
    let free: Vec<MaskInput> = inputs
        .iter()
        .filter_map(|(id, name, shape)| {
            let [a, b] = &shape[..] else { return None };
            let (a, b) = (a.as_symbol()?, b.as_symbol()?);
            (a != b && !used_by_another_input(egraph, a, name) && !used_by_another_input(egraph, b, name))
                .then(|| (*id, name.clone(), Some((a.to_string(), b.to_string()))))
        })
        .collect();
    match <[MaskInput; 1]>::try_from(free) {
        Ok([one]) => Ok(one),
        Err(_) => Err(NotCausal::NoPaddingInput { batch: batch.clone(), total: total.clone() }),
    }
}

/// Some graph input other than `me` has a size that mentions `sym`.
fn used_by_another_input(egraph: &EGraph, sym: &str, me: &str) -> bool {
    egraph.classes().any(|c| {
        c.nodes.iter().any(|n| matches!(&n.head, Head::Input(other) if &**other != me))
            && c.data.ty().is_some_and(|t| t.shape.iter().any(|d| d.symbols().any(|x| x == sym)))
    })
}

/// The padding mask's class, its input name, and its own size names when they are not the
/// batch's and the key length's.
type MaskInput = (Id, String, Option<(String, String)>);

/// `[BATCH, total]` 0/1 masks: all ones; left padding of two in row 0; a hole at 1 in row 1.
fn attention_mask_value(pattern: usize, total: usize) -> Tensor {
    let mut v = vec![1i64; BATCH * total];
    match pattern {
        1 => v.iter_mut().take(2.min(total)).for_each(|x| *x = 0),
        2 if total > 1 => v[total + 1] = 0,
        _ => {}
    }
    Tensor::from_i64(DType::I64, vec![BATCH, total], v)
}

/// Compares an evaluated mask with the definition on every row that sees at least one key.
/// `window` bounds how far back a query sees (its own position included).
fn compare(mask: &Tensor, am: &Tensor, s_len: usize, p_len: usize, window: Option<usize>) -> Result<(), Mismatch> {
    let total = s_len + p_len;
    let not_broadcastable = || Mismatch::Shape { shape: mask.shape.clone(), s_len, total };
    if mask.rank() > 4 || mask.shape.last() != Some(&total) {
        return Err(not_broadcastable());
    }
    let mut dims = vec![1usize; 4 - mask.rank()];
    dims.extend(&mask.shape);
    if dims[0] != 1 && dims[0] != BATCH || dims[2] != 1 && dims[2] != s_len {
        return Err(not_broadcastable());
    }
    let (m, a) = (mask.to_f64_vec(), am.as_i64().ok_or(Mismatch::MaskNotInt64)?.to_vec());
    let boolean = mask.dtype == DType::Bool;
    for b in 0..BATCH {
        for h in 0..dims[1] {
            for i in 0..s_len {
                let in_window = |t: usize| window.is_none_or(|w| p_len + i - t < w);
                let visible = |t: usize| t <= p_len + i && in_window(t) && a[b * total + t] != 0;
                if !(0..total).any(visible) {
                    continue;
                }
                for t in 0..total {
                    let at = (((b % dims[0]) * dims[1] + h) * dims[2] + i % dims[2]) * total + t;
                    let ok = match (boolean, visible(t)) {
                        (true, shown) => (m[at] != 0.0) == shown,
                        (false, true) => m[at] == 0.0,
                        (false, false) => m[at] <= -1e30,
                    };
                    if !ok {
                        let (batch, query, key, visible, value) = (b, i, t, visible(t), m[at]);
                        return Err(Mismatch::Entry { batch, query, key, visible, value });
                    }
                }
            }
        }
    }
    Ok(())
}

/// One evaluation of e-classes under concrete sizes and inputs.
struct Probe<'a> {
    egraph: &'a EGraph,
    sizes: HashMap<String, i64>,
    mask_input: (String, Tensor),
    /// The past length of the case: positions start there.
    past: i64,
    memo: HashMap<Id, Vec<Tensor>>,
    visiting: HashSet<Id>,
    visited: usize,
}

impl<'a> Probe<'a> {
    fn new(egraph: &'a EGraph, sizes: HashMap<String, i64>, mask_input: (String, Tensor), past: i64) -> Probe<'a> {
        Probe { egraph, sizes, mask_input, past, memo: HashMap::new(), visiting: HashSet::new(), visited: 0 }
    }

    fn eval(&mut self, class: Id) -> Result<Tensor, ProbeError> {
        Ok(self.eval_outputs(class, 1)?.swap_remove(0))
    }

    /// The class's value(s): the first of its nodes that evaluates, constants first.
    fn eval_outputs(&mut self, class: Id, outputs: usize) -> Result<Vec<Tensor>, ProbeError> {
        let class = self.egraph.find(class);
        if let Some(t) = self.memo.get(&class).filter(|t| t.len() >= outputs) {
            return Ok(t.clone());
        }
        if let Some(t) = self.egraph.analysis.constant_of(&self.egraph[class].data) {
            return Ok(vec![t.clone()]);
        }
        self.visited += 1;
        if self.visited > CLASS_BUDGET {
            return Err(ProbeError::Budget);
        }
        if !self.visiting.insert(class) {
            return Err(ProbeError::Cycle);
        }
        let mut why = ProbeError::NoNode;
        for node in &self.egraph[class].nodes {
            match self.eval_node(class, node, outputs) {
                Ok(v) => {
                    self.visiting.remove(&class);
                    self.memo.insert(class, v.clone());
                    return Ok(v);
                }
                Err(e) => why = e,
            }
        }
        self.visiting.remove(&class);
        Err(why)
    }

    fn eval_node(&mut self, class: Id, node: &ENode, outputs: usize) -> Result<Vec<Tensor>, ProbeError> {
        match &node.head {
            Head::Input(name) => Ok(vec![self.input(class, name)?]),
            Head::Proj(i) => Ok(vec![self.eval_outputs(node.children[0], i + 1)?.swap_remove(*i)]),
            Head::Op { op: "Shape", attrs, .. } => Ok(vec![self.shape_of(node.children[0], &attrs.attrs)?]),
            Head::Op { domain, op, attrs } => {
                let mut args = Vec::with_capacity(node.children.len());
                for &c in &node.children {
                    let absent = self.egraph[c].nodes.iter().any(|n| matches!(n.head, Head::Absent));
                    args.push(if absent { None } else { Some(self.eval(c)?) });
                }
                let refs: Vec<Option<&Tensor>> = args.iter().map(Option::as_ref).collect();
                let op_ref = OpRef { node: "mask", domain: *domain, op, opset: 21, attrs: &attrs.attrs };
                ir::eval::eval_op(&op_ref, &refs, outputs).map_err(ProbeError::Eval)
            }
            Head::Weight(_) => Err(ProbeError::ReadsWeight),
            Head::Const(_) | Head::Absent | Head::Outputs => Err(ProbeError::NotAValue),
        }
    }

    /// `Shape(x)` from x's symbolic shape under the case's sizes.
    fn shape_of(&self, x: Id, attrs: &Attrs) -> Result<Tensor, ProbeError> {
        let ty = self.egraph[x].data.ty().ok_or(ProbeError::UnknownType)?;
        let r = ty.shape.len() as i64;
        let clamp = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) } as usize;
        let start = clamp(attrs.int("start").ok().flatten().unwrap_or(0));
        let end = clamp(attrs.int("end").ok().flatten().unwrap_or(r)).max(start);
        // Only the sizes the Shape reads need to be known.
        let v: Vec<i64> = ty.shape[start..end]
            .iter()
            .map(|d| d.eval(&|s| self.sizes.get(s).copied()).ok_or_else(|| ProbeError::UnknownSize(d.clone())))
            .collect::<Result<_, _>>()?;
        Ok(Tensor::from_i64(DType::I64, vec![v.len()], v))
    }

    fn concrete_shape(&self, x: Id) -> Result<Vec<usize>, ProbeError> {
        let ty = self.egraph[x].data.ty().ok_or(ProbeError::UnknownType)?;
        ty.shape
            .iter()
            .map(|d| {
                let v = d.eval(&|s| self.sizes.get(s).copied()).ok_or_else(|| ProbeError::UnknownSize(d.clone()))?;
                usize::try_from(v).map_err(|_| ProbeError::NegativeSize(d.clone()))
            })
            .collect()
    }

    /// A graph input's value: the case's attention mask, positions for `[batch, S]` integers,
    /// zeros otherwise.
    fn input(&self, class: Id, name: &str) -> Result<Tensor, ProbeError> {
        if name == self.mask_input.0 {
            return Ok(self.mask_input.1.clone());
        }
        let ty = self.egraph[class].data.ty().ok_or(ProbeError::UnknownInputType)?;
        let shape = self.concrete_shape(class)?;
        let n: usize = shape.iter().product();
        if n > 1 << 20 {
            return Err(ProbeError::InputTooLarge { name: name.to_string(), elements: n });
        }
        if ty.dtype.is_int() {
            let cols = *shape.last().unwrap_or(&1);
            let v = (0..n).map(|k| if shape.len() == 2 { self.past + (k % cols) as i64 } else { 0 }).collect();
            return Ok(Tensor::from_i64(ty.dtype, shape, v));
        }
        if ty.dtype.is_float() {
            return Ok(Tensor::from_f32(ty.dtype, shape, vec![0.0; n]));
        }
        Err(ProbeError::InputDtype { name: name.to_string(), dtype: ty.dtype })
    }
}

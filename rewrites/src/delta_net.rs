//! Rule family `delta-net`: the gated delta rule of Gated DeltaNet layers into
//! `npuc::DeltaNet{q_heads, kv_heads, scale, [qk_l2norm_eps]}(q, k, v, past_state, decay, beta)`, outputs (y,
//! present_state) as the source node's, and a constant factor on the queries into its `scale`:
//! `Sᵀ(c·q)·s = Sᵀq·(c·s)`.
//!
//! Exporter patterns recognised:
//! - onnxruntime-genai's builder (Qwen3.5, Qwen3.5-MoE): `com.microsoft::LinearAttention{
//!   update_rule="gated_delta", scale=1}` over the l2-normalised keys and the l2-normalised queries
//!   times `1/√d_k` (`Mul(q, c)`), with decay and beta from `LinearAttentionGate`
//!   (`decay_scale·softplus(a + dt_bias)`, `σ(b)`).
//! - the opset-27 ai.onnx `LinearAttention`, which has the same inputs, attributes and recurrence.
//!
//! The builder's q/k L2 norms (`Reshape → LpNormalization{p=2} → Reshape` per head, no ε) fold
//! in as `qk_l2norm_eps = 0`: DeltaNet normalises q and k per head of d_k itself (the host
//! executor into scratch it owns, the intel-npu target's host step in place), so the recurrence
//! reads the convolution's q and k directly. The gate (`LinearAttentionGate`) stays outside: it
//! is a whole op both targets run, and the recurrence reads its decay and beta as buffers. The
//! scalar factor on q folds because it is an attribute: the product is taken once per output
//! row instead of once per query element (the two round differently by an ulp).
//!
//! Declined, with the reason recorded: update rules other than `gated_delta` (no decay or no
//! beta: not the gated delta rule), per-token state windows (`state_window > 0`, CUDA only in
//! onnxruntime), a missing decay or beta, the default scale (`scale = 0`, 1/√d_k) when the
//! query's width is not known, and a q/k norm that is not the L2 norm over heads of d_k (another
//! p or axis, other groups, only one of q and k normalised).

use crate::apply::{no_match, Computed, Decline, Fold, Folded};
use crate::cond::{self, var};
use crate::egraph_ops::{
    attrs, dims, is_absent, is_op, known_shape, nodes_with_children, rank, scalar_value, type_of, union,
};
use crate::Rewrite;
use egg::{rewrite as rw, Id, Subst, Symbol, Var};
use ir::egraph::{EGraph, ENode, Head};
use ir::{Attr, Attrs, Domain};

/// The family's rules.
#[rustfmt::skip]
pub fn rules() -> Vec<Rewrite> {
    vec![
        // LinearAttention{gated_delta}(q, k, v, s, g, β) = DeltaNet(q, k, v, s, g, β)
        rw!("delta-net-linear-attention-ms"; "(com.microsoft::LinearAttention ?q ?k ?v ?s ?g ?b)" => { LinearAttentionOp::new() }),
        // ai.onnx LinearAttention{gated_delta}(q, k, v, s, g, β) = DeltaNet(q, k, v, s, g, β)
        rw!("delta-net-linear-attention";    "(LinearAttention ?q ?k ?v ?s ?g ?b)"                => { LinearAttentionOp::new() }),
        // DeltaNet{scale}(q·c, ..) = DeltaNet{scale·c}(q, ..)
        rw!("delta-net-query-scale";         "(npuc::DeltaNet (Mul ?q ?c) ?k ?v ?s ?g ?b)"        => { QueryScale::new() } if cond::is_scalar("?c")),
        // DeltaNet{scale}(c·q, ..) = DeltaNet{scale·c}(q, ..)
        rw!("delta-net-scale-query";         "(npuc::DeltaNet (Mul ?c ?q) ?k ?v ?s ?g ?b)"        => { QueryScale::new() } if cond::is_scalar("?c")),
        // DeltaNet(l2(q), l2(k), ..) = DeltaNet{qk_l2norm_eps=0}(q, k, ..), l2 the builder's Reshape → LpNormalization{p=2} → Reshape per head
        rw!("delta-net-qk-l2norm";           "(npuc::DeltaNet ?q ?k ?v ?s ?g ?b)"                 => { QkL2Norm::new() }),
    ]
}

const INPUTS: [&str; 6] = ["?q", "?k", "?v", "?s", "?g", "?b"];

fn delta_net_attrs(q_heads: i64, kv_heads: i64, scale: f32) -> Attrs {
    attrs(&[("q_heads", Attr::Int(q_heads)), ("kv_heads", Attr::Int(kv_heads)), ("scale", Attr::Float(scale))])
}

/// Adds `DeltaNet{attrs}(inputs)` and unions it with `class`, the node it equals: the whole
/// tuple when the class has both outputs, its output 0 when the class is a one-output node.
fn add_delta_net(egraph: &mut EGraph, class: Id, attrs: Attrs, inputs: Vec<Id>, rule: Symbol) -> Vec<Id> {
    let outputs = egraph[class].data.types.len();
    let node = egraph.add(ENode::op(Domain::Npuc, "DeltaNet", attrs, inputs));
    if outputs == 1 {
        let y = egraph.add(ENode { head: Head::Proj(0), children: vec![node] });
        return union(egraph, class, y, rule);
    }
    union(egraph, class, node, rule)
}

/// The scale a LinearAttention's `scale` attribute means: itself, or 1/√d_k for 0.
fn resolved_scale(egraph: &EGraph, q: Id, q_heads: i64, scale: f32) -> Result<f32, Decline> {
    if scale != 0.0 {
        return Ok(scale);
    }
    let width = known_shape(egraph, q).and_then(|s| s.last().copied());
    match width {
        Some(w) if w > 0 && w % q_heads as usize == 0 => Ok(1.0 / ((w / q_heads as usize) as f32).sqrt()),
        _ => Err("scale = 0 means 1/√d_k, and the query's width is not known: DeltaNet's scale is explicit".into()),
    }
}

/// Class `product` holds `Mul(q, c)` or `Mul(c, q)`.
fn scales_query(egraph: &EGraph, product: Id, q: Id, c: Id) -> bool {
    let (q, c) = (egraph.find(q), egraph.find(c));
    egraph[product].nodes.iter().any(|n| {
        let children: Vec<Id> = n.children.iter().map(|&x| egraph.find(x)).collect();
        is_op(n, Domain::Onnx, "Mul") && (children == [q, c] || children == [c, q])
    })
}

/// LinearAttention (either domain) of the six inputs: `DeltaNet` when the update rule is the gated
/// delta rule, without a state window, with its decay and beta.
struct LinearAttentionOp {
    inputs: [Var; 6],
}

impl LinearAttentionOp {
    fn new() -> Computed<Self> {
        Computed::new(LinearAttentionOp { inputs: INPUTS.map(var) })
    }
}

impl Fold for LinearAttentionOp {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let inputs = self.inputs.map(|v| subst[v]);
        let node = nodes_with_children(egraph, eclass, "LinearAttention", &inputs).next().ok_or_else(no_match)?;
        let a = node.head.attrs().cloned().unwrap_or_default();
        let update_rule = a.str("update_rule").ok().flatten().unwrap_or("gated_delta").to_string();
        if update_rule != "gated_delta" {
            return Err(format!(
                "update_rule {update_rule:?} is not the gated delta rule DeltaNet computes (it needs both the decay and the delta term)"
            )
            .into());
        }
        if let Some(w) = a.int("state_window").ok().flatten().filter(|&w| w != 0) {
            return Err(format!(
                "state_window = {w} (per-token state windows) is not folded; onnxruntime runs it on CUDA only"
            )
            .into());
        }
        let heads = |name: &str| a.int(name).ok().flatten().filter(|&h| h > 0);
        let (Some(q_heads), Some(kv_heads)) = (heads("q_num_heads"), heads("kv_num_heads")) else {
            return Err(no_match());
        };
        if is_absent(egraph, inputs[4]) || is_absent(egraph, inputs[5]) {
            return Err("the decay or beta input is absent; DeltaNet's gated delta rule reads both".into());
        }
        let scale = resolved_scale(egraph, inputs[0], q_heads, a.float("scale").ok().flatten().unwrap_or(0.0))?;
        Ok(add_delta_net(egraph, eclass, delta_net_attrs(q_heads, kv_heads, scale), inputs.to_vec(), rule))
    }
}

/// `DeltaNet{scale}(Mul(?q, ?c), ..)`: `DeltaNet{scale·c}(q, ..)` for a finite, non-zero scalar c.
struct QueryScale {
    inputs: [Var; 6],
    c: Var,
}

impl QueryScale {
    fn new() -> Computed<Self> {
        Computed::new(QueryScale { inputs: INPUTS.map(var), c: var("?c") })
    }
}

impl Fold for QueryScale {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let [q, rest @ ..] = self.inputs.map(|v| subst[v]);
        let c = scalar_value(egraph, subst[self.c]).ok_or_else(no_match)?;
        let c_class = subst[self.c];
        // The node whose query is the matched product: the class also holds the DeltaNets this
        // rule built, whose queries are already unscaled and whose scale must not take c again.
        let reads_product = |n: &&ENode| {
            n.children.len() == 6
                && n.children[1..].iter().zip(&rest).all(|(&a, &b)| egraph.find(a) == egraph.find(b))
                && scales_query(egraph, n.children[0], q, c_class)
        };
        let node = egraph[eclass]
            .nodes
            .iter()
            .filter(|n| n.head.op() == Some("DeltaNet"))
            .find(reads_product)
            .ok_or_else(no_match)?;
        if type_of(egraph, node.children[0]) != type_of(egraph, q) {
            return Err(no_match());
        }
        let a = node.head.attrs().cloned().unwrap_or_default();
        let (Ok(Some(q_heads)), Ok(Some(kv_heads)), Ok(Some(scale))) =
            (a.int("q_heads"), a.int("kv_heads"), a.float("scale"))
        else {
            return Err(no_match());
        };
        let folded = (f64::from(scale) * c) as f32;
        if folded == 0.0 || !folded.is_finite() {
            return Err(format!("the query factor {c} times scale {scale} is {folded}, not a usable scale").into());
        }
        let mut inputs = vec![q];
        inputs.extend(rest);
        Ok(add_delta_net(egraph, eclass, delta_net_attrs(q_heads, kv_heads, folded), inputs, rule))
    }
}

/// `DeltaNet(Reshape(LpNormalization(Reshape(q))), Reshape(LpNormalization(Reshape(k))), ..)`,
/// each LpNormalization the L2 norm over heads of d_k: `DeltaNet{qk_l2norm_eps = 0}(q, k, ..)`.
struct QkL2Norm {
    inputs: [Var; 6],
}

impl QkL2Norm {
    fn new() -> Computed<Self> {
        Computed::new(QkL2Norm { inputs: INPUTS.map(var) })
    }
}

/// The last dimension of a class's value, when known (the others may be symbolic).
fn last_dim(egraph: &EGraph, x: Id) -> Option<usize> {
    dims(egraph, x)?.last()?.as_known().and_then(|d| usize::try_from(d).ok())
}

/// The value class `x` L2-normalises per head of `dk` — `x` holds `Reshape(LpNormalization{p=2,
/// last axis}(Reshape(src, [.., heads, dk])), _)` of src's own type —: `None` when `x` is no
/// such spelling, a decline when it is one that normalises something else.
fn l2_normed_source(egraph: &EGraph, x: Id, dk: usize, what: &str) -> Option<Result<Id, Decline>> {
    let op_of = |class: Id, op: &str| egraph[class].nodes.iter().find(|n| is_op(n, Domain::Onnx, op)).cloned();
    let unflat = op_of(x, "Reshape")?;
    let lp = op_of(unflat.children[0], "LpNormalization")?;
    let flat = lp.children[0];
    let src = op_of(flat, "Reshape")?.children[0];
    let a = lp.head.attrs().cloned().unwrap_or_default();
    let rank = rank(egraph, flat).unwrap_or(0);
    if !ir::gated_norms::is_last_axis_l2(&a, rank) {
        let (p, axis) = (a.int_or("p", 2).unwrap_or(0), a.int_or("axis", -1).unwrap_or(0));
        return Some(Err(format!(
            "{what}'s LpNormalization has p = {p} along axis {axis} of {rank}: DeltaNet's qk_l2norm is the L2 norm over each head"
        )
        .into()));
    }
    let group = last_dim(egraph, flat);
    if group != Some(dk) {
        return Some(Err(format!(
            "{what}'s L2 norm runs over groups of {group:?}, not DeltaNet's heads of d_k = {dk}"
        )
        .into()));
    }
    if type_of(egraph, src) != type_of(egraph, x) {
        return Some(Err(format!("{what}'s per-head L2 norm is not reshaped back to {what}'s own shape").into()));
    }
    Some(Ok(src))
}

impl Fold for QkL2Norm {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let inputs = self.inputs.map(|v| subst[v]);
        let node = nodes_with_children(egraph, eclass, "DeltaNet", &inputs)
            .find(|n| n.head.attrs().is_some_and(|a| matches!(a.float("qk_l2norm_eps"), Ok(None))))
            .ok_or_else(no_match)?;
        let mut a = node.head.attrs().cloned().unwrap_or_default();
        let q_heads = a.int("q_heads").ok().flatten().filter(|&h| h > 0).ok_or_else(no_match)?;
        let width = last_dim(egraph, inputs[0]).ok_or_else(no_match)?;
        let dk = width / q_heads as usize;
        let (q, k) = match (l2_normed_source(egraph, inputs[0], dk, "q"), l2_normed_source(egraph, inputs[1], dk, "k"))
        {
            (None, None) => return Err(no_match()),
            (Some(q), Some(k)) => (q?, k?),
            (Some(_), None) => return Err("only q is L2-normalised; DeltaNet's qk_l2norm normalises q and k".into()),
            (None, Some(_)) => return Err("only k is L2-normalised; DeltaNet's qk_l2norm normalises q and k".into()),
        };
        a.set("qk_l2norm_eps", Attr::Float(0.0));
        let mut children = vec![q, k];
        children.extend_from_slice(&inputs[2..]);
        Ok(add_delta_net(egraph, eclass, a, children, rule))
    }
}

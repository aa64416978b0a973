//! Named rule conditions shared by the families, and the small queries they are built from.
//!
//! A condition factory takes pattern variable names and returns the closure egg wants; the name
//! of the factory is what a rule table reads (`if is_scalar_const("?two", 2.0)`).

use egg::{Id, Subst, Var};
use ir::egraph::{EGraph, Head};
use ir::{DType, Tensor};

/// The pattern variable `name` (panics on a malformed name: rule tables are static).
pub fn var(name: &str) -> Var {
    name.parse().unwrap_or_else(|_| panic!("`{name}` is not a pattern variable"))
}

/// The class's constant value, if it is a small constant.
pub fn constant(egraph: &EGraph, id: Id) -> Option<&Tensor> {
    egraph.analysis.constant_of(&egraph[id].data)
}

/// The value of a constant with exactly one element.
pub fn scalar_value(egraph: &EGraph, id: Id) -> Option<f64> {
    let t = constant(egraph, id)?;
    (t.numel() == 1).then(|| t.to_f64_vec()[0])
}

/// The values of a constant integer tensor.
pub fn int_values(egraph: &EGraph, id: Id) -> Option<Vec<i64>> {
    constant(egraph, id)?.as_i64().map(|v| v.to_vec())
}

/// True when the class holds a weight leaf (an initializer of the model).
pub fn holds_weight(egraph: &EGraph, id: Id) -> bool {
    egraph[id].nodes.iter().any(|n| matches!(n.head, Head::Weight(_)))
}

/// True when the class is a weight or a small constant: data known at compile time.
pub fn is_compile_time(egraph: &EGraph, id: Id) -> bool {
    holds_weight(egraph, id) || egraph[id].data.constant.is_some()
}

/// Rank of the class's value, when known.
pub fn rank(egraph: &EGraph, id: Id) -> Option<usize> {
    egraph[id].data.ty().map(|t| t.shape.len())
}

/// Dtype of the class's value, when known.
pub fn dtype(egraph: &EGraph, id: Id) -> Option<DType> {
    egraph[id].data.ty().map(|t| t.dtype)
}

/// `?v` is a one-element constant equal to `value` (relative tolerance 1e-6).
pub fn is_scalar_const(v: &str, value: f64) -> impl Fn(&mut EGraph, Id, &Subst) -> bool {
    let v = var(v);
    move |egraph, _, subst| {
        scalar_value(egraph, subst[v]).is_some_and(|x| (x - value).abs() <= 1e-6 * value.abs().max(1e-30))
    }
}

/// `?v` is a one-element constant (any value): an epsilon, a scale.
pub fn is_scalar(v: &str) -> impl Fn(&mut EGraph, Id, &Subst) -> bool {
    let v = var(v);
    move |egraph, _, subst| scalar_value(egraph, subst[v]).is_some()
}

/// `?v` is known at compile time (weight or constant).
pub fn is_constant(v: &str) -> impl Fn(&mut EGraph, Id, &Subst) -> bool {
    let v = var(v);
    move |egraph, _, subst| is_compile_time(egraph, subst[v])
}

/// `?axes` is a constant naming only the last axis of `?x` (`[-1]` or `[rank-1]`).
pub fn is_last_axis(axes: &str, x: &str) -> impl Fn(&mut EGraph, Id, &Subst) -> bool {
    let (axes, x) = (var(axes), var(x));
    move |egraph, _, subst| {
        let Some(r) = rank(egraph, subst[x]) else { return false };
        matches!(int_values(egraph, subst[axes]).as_deref(), Some([a]) if *a == -1 || *a == r as i64 - 1)
    }
}

/// `?x` is a float tensor.
pub fn is_float(x: &str) -> impl Fn(&mut EGraph, Id, &Subst) -> bool {
    let x = var(x);
    move |egraph, _, subst| dtype(egraph, subst[x]).is_some_and(|d| d.is_float())
}

/// True when the class's value depends on compile-time data only: a weight, a constant, or a
/// Transpose, Reshape, Slice, Cast or QuantizeLinear of such values (looked through four levels),
/// as in the codes `QuantizeLinear(Transpose(weight), s, z)` a quantiser writes for a tied lm_head.
pub fn is_compile_time_expr(egraph: &EGraph, id: Id) -> bool {
    compile_time_within(egraph, id, 4)
}

fn compile_time_within(egraph: &EGraph, id: Id, depth: usize) -> bool {
    if is_compile_time(egraph, id) || egraph[id].nodes.iter().any(|n| n.head == Head::Absent) {
        return true;
    }
    depth > 0
        && egraph[id].nodes.iter().any(|n| {
            matches!(n.head.op(), Some("Transpose" | "Reshape" | "Slice" | "Cast" | "QuantizeLinear"))
                && n.children.iter().all(|&c| compile_time_within(egraph, c, depth - 1))
        })
}

/// An applier that records a fixed reason for the matched class and rewrites nothing: the right
/// hand side of rules that exist to say why a look-alike group is not folded.
pub struct Decline(pub &'static str);

impl egg::Applier<ir::egraph::ENode, ir::egraph::NpuAnalysis> for Decline {
    fn apply_one(
        &self,
        egraph: &mut EGraph,
        eclass: Id,
        _: &Subst,
        _: Option<&egg::PatternAst<ir::egraph::ENode>>,
        rule: egg::Symbol,
    ) -> Vec<Id> {
        let class = egraph.find(eclass);
        egraph.analysis.decline(rule.as_str(), class, self.0);
        vec![]
    }
}

/// Unions `a` and `b` on behalf of `rule` (explanations name it); the changed class, if any, as an
/// applier reports it.
pub fn union(egraph: &mut EGraph, a: Id, b: Id, rule: egg::Symbol) -> Vec<Id> {
    union_all(egraph, rule, &[(a, b)])
}

/// Unions each pair (class, equal class) on behalf of `rule` and returns the classes that changed.
pub fn union_all(egraph: &mut EGraph, rule: egg::Symbol, pairs: &[(Id, Id)]) -> Vec<Id> {
    let mut changed = vec![];
    for &(a, b) in pairs {
        if egraph.union_trusted(a, b, rule) {
            changed.push(egraph.find(a));
        }
    }
    changed
}

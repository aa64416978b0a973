//! Named rule conditions shared by the families (the queries they are built from are
//! [`crate::egraph_ops`]'s).
//!
//! A condition factory takes pattern variable names and returns the closure egg wants; the name
//! of the factory is what a rule table reads (`if is_scalar_const("?two", 2.0)`).

use crate::egraph_ops::{dtype, int_values, is_compile_time, rank, scalar_value};
use egg::{Id, Subst, Var};
use ir::egraph::EGraph;

/// The pattern variable `name` (panics on a malformed name: rule tables are static).
pub fn var(name: &str) -> Var {
    name.parse().unwrap_or_else(|_| panic!("`{name}` is not a pattern variable"))
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

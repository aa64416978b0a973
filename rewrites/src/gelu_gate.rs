//! Rule family `gelu-gate`: the tanh approximation of GELU,
//! `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, into `npuc::GeluTanh(x)`, and the gated MLP
//! product `GeluTanh(gate) · up` into `npuc::GeluGate(gate, up)` (Gemma's MLP, whose
//! `hidden_activation` is `gelu_pytorch_tanh`).
//!
//! Exporter patterns recognised:
//! - optimum-onnx (torch's TorchScript exporter) on Gemma 3:
//!   `Mul(0.5, Mul(x, Add(1, Tanh(Mul(c, Add(x, Mul(k, Mul(x, Mul(x, x)))))))))`;
//! - `torch.onnx.export(dynamo=True)` on Gemma 3: `Mul(x, Mul(0.5, Add(Tanh(Mul(c, Add(x,
//!   Mul(k, Pow(x, 3))))), 1)))`;
//! - onnxruntime's quantize_static on the optimum graph: the same, with `x` a DequantizeLinear
//!   class (matched as any other `x`);
//! - `torch.onnx.export(dynamo=True, opset_version=23)`: ONNX's `Gelu{approximate="tanh"}`.
//!
//! The cube is `x³` in any of the spellings [`is_cube`] accepts; `c` must be √(2/π) and `k`
//! 0.044715 to within 1e-6. The fused ops compute the same formula in f32, in their own order:
//! results differ from the decomposed graph's by rounding (a few ulp), not by formula.
//!
//! Not folded: the exact (erf) GELU (`Gelu` without `approximate`), which stays as it is.

use crate::cond::{self, var};
use crate::egraph_ops::scalar_value;
use crate::Rewrite;
use egg::{rewrite as rw, Id, Subst};
use ir::egraph::{EGraph, Head};

/// √(2/π).
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic term's coefficient.
const CUBIC: f64 = 0.044715;

/// The family's rules.
#[rustfmt::skip]
pub fn rules() -> Vec<Rewrite> {
    vec![
        // 0.5 · (x · (1 + tanh(c·(x + k·x³)))) = GeluTanh(x)
        rw!("gelu-tanh-half-outside"; "(Mul ?half (Mul ?x (Add ?one (Tanh (Mul ?c (Add ?x (Mul ?k ?cube)))))))" => "(npuc::GeluTanh ?x)"
            if cond::is_scalar_const("?half", 0.5) if cond::is_scalar_const("?one", 1.0)
            if cond::is_scalar_const("?c", SQRT_2_OVER_PI) if cond::is_scalar_const("?k", CUBIC) if is_cube("?cube", "?x")),
        // x · (0.5 · (tanh(c·(x + k·x³)) + 1)) = GeluTanh(x)
        rw!("gelu-tanh-half-inside";  "(Mul ?x (Mul ?half (Add (Tanh (Mul ?c (Add ?x (Mul ?k ?cube)))) ?one)))" => "(npuc::GeluTanh ?x)"
            if cond::is_scalar_const("?half", 0.5) if cond::is_scalar_const("?one", 1.0)
            if cond::is_scalar_const("?c", SQRT_2_OVER_PI) if cond::is_scalar_const("?k", CUBIC) if is_cube("?cube", "?x")),
        // ONNX's Gelu{approximate="tanh"} (opset 20; torch's opset-23 export) = GeluTanh(x)
        rw!("gelu-tanh-onnx";         "(Gelu{approximate=\"tanh\"} ?x)"                                             => "(npuc::GeluTanh ?x)"),
        // GeluTanh(g) · u = GeluGate(g, u)
        rw!("gelu-gate-gelu-up";      "(Mul (npuc::GeluTanh ?g) ?u)"                                             => "(npuc::GeluGate ?g ?u)"),
        // u · GeluTanh(g) = GeluGate(g, u)
        rw!("gelu-gate-up-gelu";      "(Mul ?u (npuc::GeluTanh ?g))"                                             => "(npuc::GeluGate ?g ?u)"),
    ]
}

/// `?cube` is `?x³`: `Pow(x, 3)`, `Mul(x, Mul(x, x))` or `Mul(Mul(x, x), x)`.
fn is_cube(cube: &str, x: &str) -> impl Fn(&mut EGraph, Id, &Subst) -> bool {
    let (cube, x) = (var(cube), var(x));
    move |egraph, _, subst| cube_of(egraph, subst[cube]) == Some(egraph.find(subst[x]))
}

/// The class whose cube `id` is, when one of its nodes spells a cube.
fn cube_of(egraph: &EGraph, id: Id) -> Option<Id> {
    let square_of = |c: Id| {
        egraph[c].nodes.iter().find_map(|n| match (n.head.op(), &n.children[..]) {
            (Some("Mul"), [a, b]) if egraph.find(*a) == egraph.find(*b) => Some(egraph.find(*a)),
            _ => None,
        })
    };
    egraph[id].nodes.iter().find_map(|n| match (&n.head, n.head.op(), &n.children[..]) {
        (Head::Op { .. }, Some("Pow"), [base, e]) if scalar_value(egraph, *e) == Some(3.0) => Some(egraph.find(*base)),
        (_, Some("Mul"), [a, b]) if square_of(*b) == Some(egraph.find(*a)) => Some(egraph.find(*a)),
        (_, Some("Mul"), [a, b]) if square_of(*a) == Some(egraph.find(*b)) => Some(egraph.find(*b)),
        _ => None,
    })
}

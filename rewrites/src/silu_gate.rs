//! Rule family `silu-gate`: the SiLU activation `x · σ(x)` into `npuc::Silu(x)`, and the gated
//! MLP product `Silu(gate) · up` into `npuc::SwiGlu(gate, up)`.
//!
//! Exporter patterns recognised:
//! - torch's exporters on `nn.SiLU` / `F.silu` and onnxruntime-genai's builder: `Mul(x,
//!   Sigmoid(x))`; the other order `Mul(Sigmoid(x), x)` from models that
//!   write `torch.sigmoid(x) * x`.
//! - Llama/Qwen3 MLPs: `Mul(act(gate), up)`; `Mul(up, act(gate))` from models written the other
//!   way round.
//! - onnxruntime's quantize_static and Quark's A8W8 quantize only MatMul inputs and outputs: the gate reaches
//!   `Sigmoid` and `Mul` through the same DequantizeLinear class, which the patterns match as any
//!   other `x`.
//! - a packed gate|up product (Phi-3's checkpoint fuses them; torch dynamo splits the product
//!   with one `Split`, optimum with two `Slice`s): the SwiGlu reads the two parts. Repacking the projections around the SwiGlu
//!   is the weight-only family's decision, not this one's.
//!
//! Both rewrites are exact: `Silu` and `SwiGlu` compute the same f32 Sigmoid and products, in the
//! same order, with the same broadcasting.
//!
//! Declined, with the reason recorded: `x · DQ(Q(σ(x)))`, a sigmoid requantized before the
//! product (what a quantizer that also quantizes Sigmoid outputs writes): `Silu` would skip that
//! rounding.

use crate::apply::declines;
use crate::Rewrite;
use egg::rewrite as rw;

/// The family's rules.
#[rustfmt::skip]
pub fn rules() -> Vec<Rewrite> {
    vec![
        // x · σ(x) = Silu(x)
        rw!("silu-gate-x-sigmoid";           "(Mul ?x (Sigmoid ?x))"                                           => "(npuc::Silu ?x)"),
        // σ(x) · x = Silu(x)
        rw!("silu-gate-sigmoid-x";           "(Mul (Sigmoid ?x) ?x)"                                           => "(npuc::Silu ?x)"),
        // Silu(g) · u = SwiGlu(g, u)
        rw!("silu-gate-silu-up";             "(Mul (npuc::Silu ?g) ?u)"                                        => "(npuc::SwiGlu ?g ?u)"),
        // u · Silu(g) = SwiGlu(g, u)
        rw!("silu-gate-up-silu";             "(Mul ?u (npuc::Silu ?g))"                                        => "(npuc::SwiGlu ?g ?u)"),
        // x · DQ(Q(σ(x))): the sigmoid is requantized, declined
        rw!("silu-gate-requantized-sigmoid"; "(Mul ?x (DequantizeLinear (QuantizeLinear (Sigmoid ?x) ?s ?z) ?s ?z))" => { declines(REQUANTIZED) }),
    ]
}

const REQUANTIZED: &str =
    "σ(x) passes through QuantizeLinear/DequantizeLinear before the product; Silu(x) would skip that rounding";

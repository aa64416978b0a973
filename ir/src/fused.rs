//! npuc's fused ops: their exact semantics (the reference implementations below), and type
//! inference for them (and for the simple ONNX ops a rewrite may create).
//!
//! | op | inputs → outputs | semantics |
//! |---|---|---|
//! | `RmsNorm{epsilon}` | x, γ → y | y = x / √(mean(x², last axis) + ε) · γ |
//! | `SkipRmsNorm{epsilon}` | x, skip, γ, [bias] → y, s | s = x + skip (+ bias); y = RmsNorm(s) |
//! | `Silu` | x → y | y = x · σ(x) |
//! | `SwiGlu` | gate, up → y | y = (gate·σ(gate)) · up, σ and its `exp` as [`crate::pinned_gate`] pins them (the order every host path and an array core follow) |
//! | `GeluTanh` | x → y | y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), GELU's tanh form: ONNX `Gelu` with `approximate = "tanh"` |
//! | `GeluGate` | gate, up → y | y = GeluTanh(gate) · up |
//! | `Rope{interleaved}` | x, cos, sin → y | rotary embedding over x's last axis with full-width cos/sin broadcast to x: rotate-half (`interleaved=0`) y = x·cos + [−x₂, x₁]·sin; interleaved pairs (2i, 2i+1) otherwise |
//! | `QGemm` | a, sₐ, zₐ, w, s_w, z_w, [s_y, z_y] → y | a [.., K] and w [K, N] integer codes; sₐ per tensor or per row of a (shape [.., 1], as [`QuantizeRows`](quantize_rows) gives it), zₐ per tensor; s_w, z_w per tensor or per output column ([N]); acc = Σₖ (a−zₐ)(w−z_w) exact in integers; y = acc·(sₐ·s_w) in f32; with s_y, z_y (per tensor): y = sat(round_half_even(y/s_y) + z_y), the zero point added after rounding, in z_y's type. Asymmetric zero points are exact: acc = Σₖa·w − z_w·Σₖa − zₐ·Σₖw + K·zₐ·z_w, so a kernel may precompute the weight column sums Σₖw once per weight (see [`qgemm`]). With `passes` = P, a holds activation passes along a new leading axis ([Q, .., K], Q ≥ P, sₐ [Q, .., 1], as `QuantizeRows{passes}` stacks them) and y [.., N] is the sum of the first P passes' products, added in pass order in f32: rows of all P passes in one call, so each weight is read once (no requantisation then); with `first_pass_columns` = R (P ≥ 2) the last R columns take the first pass's product only — a weight's residual pass beside the weight it refines, one call reading both |
//! | `WGemm{K,N,bits,block_size}` | a, w, scales, [zero_points], [bias] → y | y = MatMulNBits(a, w, scales, zero_points): w is uint8 [N, ⌈K/block_size⌉, block_size·bits/8], `bits`-wide codes packed along K low bits first; scales [N·blocks]; zero points packed uint8 or float [N·blocks], by default 2^(bits−1). The weights are never expanded to float |
//! | `Attention{q_heads,kv_heads,scale,[window]}` | q, k, v, [past_k], [past_v], [mask], [sinks] → y, present_k, present_v | causal grouped-query attention, BNSH layout, optionally in a sliding window and with a sink logit per query head, see [`attention`] |
//! | `DeltaNet{q_heads,kv_heads,scale,[qk_l2norm_eps]}` | q, k, v, past_state, decay, beta → y, present_state | with `qk_l2norm_eps` ε, q and k first normalised per head (each d_k run divided by √(Σx² + ε); ε = 0 is ai.onnx `LpNormalization{p=2}`, a zero head staying zero, see [`l2_normed_qk`]); then the gated delta rule over the tokens in order, per KV head h a state S [d_k, d_v] (the past state, zeros when absent): S ← exp(g_t)·S with g_t = decay[t, h] (log space, `[B, T, H_kv]`) or decay[t, h·d_k + i] on row i (`[B, T, H_kv·d_k]`); S ← S + k_t ⊗ β_t(v_t − Sᵀk_t) with β per head (`[B, T, H_kv]`) or shared (`[B, T, 1]`); y_t = scale · Sᵀq_t. q, k, v packed `[B, T, heads·size]`; grouped (H_q a multiple of H_kv) or inversely grouped heads, exactly as com.microsoft `LinearAttention{update_rule="gated_delta"}` (see [`delta_net`]). scale is explicit (no 1/√d_k default). y `[B, T, max(H_q, H_kv)·d_v]`, present_state `[B, H_kv, d_k, d_v]` |
//! | `CausalConv{activation}` | x, w, [bias], past_state → y, present_state | depthwise causal convolution over the last axis of x `[B, C, T]` with w `[C, 1, k]`, the `k − 1` inputs before the block read from past_state `[B, C, k − 1]` (zeros when absent); `activation` `none` or `silu` applied to the sum (+ bias); present_state the last `k − 1` inputs. com.microsoft `CausalConvWithState` with its defaults (one spatial dimension, channels first, no dilation, no state window), see [`causal_conv`] |
//! | `Moe{k, normalize_routing_weights, activation_type, swiglu_fusion, activation_alpha, activation_beta, swiglu_limit, [expert_weight_bits, block_size, accuracy_level]}` | x, router_logits, fc1, [fc1_scales], [fc1_bias], fc2, [fc2_scales], [fc2_bias], [shared, shared_gate] → y | each token row routed on its own: softmax of its router logits over all experts, the k largest (ties to the lower index) as mixing weights, divided by their sum when `normalize_routing_weights` is 1; each chosen expert computes `fc2 · act(fc1 · x + b1) + b2` and the results are summed with the weights, in f64, rounded once. Float experts (`[E, rows, K]`, no scales) as com.microsoft `MoE`; with scales, `expert_weight_bits`-bit codes dequantised per row or `block_size` run of K as com.microsoft `QMoE` (default zero point 2^(bits−1); int8 GEMM inputs for blocked 8-bit experts and blocked 4-bit ones at `accuracy_level` 4), whose weights are always renormalised, so the op requires `normalize_routing_weights = 1` with scales. With a shared expert's output `shared` (x's shape) and its gate logits `shared_gate` (`[.., 1]`, one per row), y = routed + round(shared · round(σ(shared_gate))), exactly com.microsoft `GatedAdd(routed, shared, Sigmoid(shared_gate))` (Qwen3.5-MoE's gated shared expert; the expert's MLP stays outside the op). See [`moe`] |
//! | `QuantizeRows{[passes]}` | x, [γ] → codes, scales | with γ ([K]): the codes of the exact products x·γ (not their f32 roundings), every step exact, see [`crate::norm_codes`] (a norm feeding the xdna array); without, symmetric int8 per row of x's last axis: s = the smallest power of two ≥ max\|row\| / 127 (the quotient in f32) and ≥ 2⁻¹²⁶ (1 for a row of zeros or a non-finite maximum), codes = round_half_even(x / s) as int8 (within ±127), scales [.., 1] f32; see [`quantize_rows_scale`]. A power of two makes x / s and the residual below exact, so integer code (an NPU core's) computes the codes exactly and cheaply; see [`quantize_rows`]. With `passes` = 2, the rounding residual r = x − codes·s (in f32) is quantised the same way (x ≈ codes·s + codes_r·s_r to about 15 bits, see [`quantize_rows_residual`]) and the two passes are stacked on a new leading axis: codes [2, .., K], scales [2, .., 1], the residual's rows after the first pass's, so a `QGemm{passes}` multiplies both in one call. What the xdna array is fed: activations quantised per row at run time, their product with per-channel int8 weights a `QGemm` |
//! | `QuantizeSwiGlu{[passes]}` | gate, up → codes, scales | SwiGlu in integers — g and u rounded to 11 significant bits, σ to 10 fractional bits by shifts, a cubic and Newton steps — and its exact values quantised as `QuantizeRows(x, γ)`'s products, in one pass or two stacked as `QuantizeRows`'; see [`crate::integer_gate`] (a gate feeding the xdna array) |
//! | `InverseRms{epsilon, [squares]}` | x → r | per row of x's last axis (d values): r = 1/√(ss/d + ε) in f32, r [.., 1]. With `squares` = "f32" (the default) ss is the sum of squares in [`crate::pinned_norm`]'s order, so r is bit for bit the factor RmsNorm scales the row by; with "aligned", [`crate::pinned_norm::aligned_sum_squares`]: each value's significand on the row's largest exponent to 11 bits, squared and summed in integers (rows of at most 16,352). The xdna program's norms: `x·γ` quantised, r multiplied into the row scales |
//! | `RmsNormRowScaled{epsilon}` | x, γ → y | RmsNorm on the row brought to magnitude 1, per row of the last axis: c = [`row_scale`] (the largest power of two ≤ max\|x\|; 1 for a row of zeros), u = x/c, m = mean(u²), e = (√ε/c)², y = u / max(√(m + e), 2⁻¹⁴) · γ, every step rounded in this order (see [`rms_norm_row_scaled`]). Equal to RmsNorm in exact arithmetic; 1 ≤ max\|u\| < 2, so m ∈ [1/D, 4) |
//! | `SkipRmsNormRowScaled{epsilon}` | x, skip, γ, [bias] → y, s | s = x + skip (+ bias) exactly as SkipRmsNorm's (unscaled: it is an output); y = RmsNormRowScaled(s) |
//! | `WGemmRowScaled{K,N,bits,block_size}` | a, w, scales, [zero_points] → y | c = [`row_scale`] of each row of a (over K); y = WGemm(a/c, w, scales, zero_points) · c. Dividing and multiplying by a power of two is exact, so it equals WGemm bit for bit in the reference evaluator (outside the subnormal range); on a device the sums of code × activation it accumulates see \|a/c\| < 2 |
//! | `L2NormRowScaled` | x → y | ai.onnx `LpNormalization{p=2}` over the last axis on the row brought to magnitude 1: c = [`row_scale`], u = x/c, y = u / max(‖u‖, 2⁻¹²⁶), every step rounded in the order [`crate::gated_norms::l2_norm_steps`] gives. Equal to the L2 norm in exact arithmetic (a row of zeros gives zeros); Σu² ∈ [1, 4D) |
//! | `GatedRmsNormRowScaled{epsilon, activation}` | x, γ, gate → y | com.microsoft `GatedRMSNorm` with each group of len(γ) values of the last axis row-scaled as in `RmsNormRowScaled` (ε becoming (√ε/c)²), then times act(gate); see [`crate::gated_norms::gated_rms_norm_rows`] |

use crate::attr::{Attr, AttrError, Attrs};
use crate::dim::Dim;
use crate::dtype::DType;
use crate::egraph::TypeInfo;
use crate::eval::{eval_op, EvalError};
use crate::gated_norms::{gated_rms_norm_rows, l2_norm_rows};
use crate::op::{Domain, OpRef};
use crate::tensor::Tensor;

fn err(op: &OpRef, msg: impl Into<String>) -> EvalError {
    EvalError { node: op.node.to_string(), op: op.op.to_string(), msg: msg.into() }
}

fn onnx(
    op: &OpRef,
    name: &'static str,
    domain: Domain,
    attrs: &Attrs,
    inputs: &[Option<&Tensor>],
    n: usize,
) -> Result<Vec<Tensor>, EvalError> {
    let r = OpRef { node: op.node, domain, op: name, opset: 23, attrs };
    eval_op(&r, inputs, n)
}

/// Evaluates a fused op.
pub fn eval(op: &OpRef, inputs: &[Option<&Tensor>], num_outputs: usize) -> Result<Vec<Tensor>, EvalError> {
    let input = |i: usize| inputs.get(i).copied().flatten().ok_or_else(|| err(op, format!("input {i} is missing")));
    let eps = op.attrs.float_or("epsilon", 1e-5).map_err(|e| err(op, e.to_string()))?;
    let mut norm_attrs = Attrs::default();
    norm_attrs.set("epsilon", Attr::Float(eps));
    norm_attrs.set("axis", Attr::Int(-1));
    match op.op {
        "RmsNorm" => onnx(op, "RMSNormalization", Domain::Onnx, &norm_attrs, &[Some(input(0)?), Some(input(1)?)], 1),
        "SkipRmsNorm" => {
            let mut a = Attrs::default();
            a.set("epsilon", Attr::Float(eps));
            let r = onnx(op, "SkipSimplifiedLayerNormalization", Domain::Microsoft, &a, inputs, 4)?;
            let mut out = vec![r[0].clone(), r[3].clone()];
            out.truncate(num_outputs.max(1));
            Ok(out)
        }
        "Silu" => {
            let x = input(0)?;
            let s = onnx(op, "Sigmoid", Domain::Onnx, &Attrs::default(), &[Some(x)], 1)?;
            onnx(op, "Mul", Domain::Onnx, &Attrs::default(), &[Some(x), Some(&s[0])], 1)
        }
        "SwiGlu" => {
            // σ as `pinned_gate` defines it (the host kernels' and an array core's), then
            // (g·σ)·u.
            let (g, u) = (input(0)?, input(1)?);
            let s = Tensor::from_f32(
                g.dtype,
                g.shape.clone(),
                g.to_f32_vec().into_iter().map(crate::pinned_gate::sigmoid).collect(),
            );
            let silu = onnx(op, "Mul", Domain::Onnx, &Attrs::default(), &[Some(g), Some(&s)], 1)?;
            onnx(op, "Mul", Domain::Onnx, &Attrs::default(), &[Some(&silu[0]), Some(u)], 1)
        }
        "GeluTanh" => gelu_tanh(op, input(0)?),
        "GeluGate" => {
            let g = gelu_tanh(op, input(0)?)?;
            onnx(op, "Mul", Domain::Onnx, &Attrs::default(), &[Some(&g[0]), Some(input(1)?)], 1)
        }
        "Rope" => rope(op, input(0)?, input(1)?, input(2)?).map(|t| vec![t]),
        // WGemm's inputs are (a, w, scales, [zero_points], [bias]); MatMulNBits has g_idx
        // between the zero points and the bias.
        "WGemm" => {
            let get = |i: usize| inputs.get(i).copied().flatten();
            onnx(op, "MatMulNBits", Domain::Microsoft, op.attrs, &[get(0), get(1), get(2), get(3), None, get(4)], 1)
        }
        "QGemm" => qgemm(op, inputs).map(|t| vec![t]),
        "QuantizeRows" => {
            let mut out = quantize_rows_op(op, input(0)?, inputs.get(1).copied().flatten())?;
            out.truncate(num_outputs.max(1));
            Ok(out)
        }
        "QuantizeSwiGlu" => {
            let mut out = quantize_swiglu(op, input(0)?, input(1)?)?;
            out.truncate(num_outputs.max(1));
            Ok(out)
        }
        "InverseRms" => inverse_rms(op, input(0)?, eps).map(|t| vec![t]),
        "Attention" => attention(op, inputs, num_outputs),
        "DeltaNet" => delta_net(op, inputs, num_outputs),
        "CausalConv" => causal_conv(op, inputs, num_outputs),
        "Moe" => moe(op, inputs),
        "RmsNormRowScaled"
        | "SkipRmsNormRowScaled"
        | "WGemmRowScaled"
        | "L2NormRowScaled"
        | "GatedRmsNormRowScaled" => row_scaled(op, inputs, num_outputs, eps),
        other => Err(err(op, format!("unknown fused op {other}"))),
    }
}

/// The row-scaled forms of the `fp16-rescale` family.
fn row_scaled(op: &OpRef, inputs: &[Option<&Tensor>], num_outputs: usize, eps: f32) -> Result<Vec<Tensor>, EvalError> {
    let input = |i: usize| inputs.get(i).copied().flatten().ok_or_else(|| err(op, format!("input {i} is missing")));
    match op.op {
        "RmsNormRowScaled" => rms_norm_row_scaled_tensor(op, input(0)?, input(1)?, eps).map(|t| vec![t]),
        "SkipRmsNormRowScaled" => {
            let mut a = Attrs::default();
            a.set("epsilon", Attr::Float(eps));
            let sum = onnx(op, "SkipSimplifiedLayerNormalization", Domain::Microsoft, &a, inputs, 4)?.swap_remove(3);
            let y = rms_norm_row_scaled_tensor(op, &sum, input(2)?, eps)?;
            let mut out = vec![y, sum];
            out.truncate(num_outputs.max(1));
            Ok(out)
        }
        "WGemmRowScaled" => wgemm_row_scaled(op, inputs).map(|t| vec![t]),
        "L2NormRowScaled" => l2_norm_rows(op, input(0)?, true, &|v| v).map(|t| vec![t]),
        "GatedRmsNormRowScaled" => {
            gated_rms_norm_rows(op, [input(0)?, input(1)?, input(2)?], true, &|v| v).map(|t| vec![t])
        }
        other => Err(err(op, format!("unknown row-scaled op {other}"))),
    }
}

/// The scale `c` of one row for the row-scaled ops: the largest power of two not above max|x|
/// (1 for a row of zeros; an infinite max gives an infinite scale, and the row becomes NaN as it
/// does in RmsNorm). A power of two makes `x / c` and `y · c` exact in binary floating point
/// (outside the subnormal range), leaves 1 ≤ max|x/c| < 2, and is itself an fp16 value whenever
/// max|x| is one (at most 2¹⁵).
pub fn row_scale(row: &[f64]) -> f64 {
    let max = row.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if max == 0.0 || !max.is_finite() {
        return if max == 0.0 { 1.0 } else { max };
    }
    // Clearing the mantissa of a positive normal f64 leaves 2^exponent.
    let c = f64::from_bits(max.to_bits() & !((1u64 << 52) - 1));
    if c > 0.0 {
        c
    } else {
        max
    }
}

/// One row of `RmsNormRowScaled{ε}`, with `gamma(j)` the scale of element j. Every elementary
/// operation is rounded by `round`, in this order:
///
/// ```text
/// c = row_scale(x)                                  (a power of two: exact)
/// u_j = round(x_j / c)
/// s = 0; for each j: s = round(s + round(u_j · u_j))  (left to right)
/// m = round(s / D)
/// e = round(t · t) with t = round(round(√ε) / c)
/// r = max(round(√ round(m + e)), 2⁻¹⁴)                (ROOT_FLOOR)
/// y_j = round(round(u_j / r) · γ_j)
/// ```
///
/// The reference evaluator passes the identity (everything in f64, rounded to the output dtype
/// once); a reduced-precision simulation passes its rounding.
///
/// In fp16 (normal range 2⁻¹⁴ ≈ 6.1·10⁻⁵ to 65504, denormals flushed): 1 ≤ max|u| < 2, so
/// s ∈ [1, 4D) and m ∈ [1/D, 4) whatever the row's magnitude. ε/c² is formed as (√ε/c)²: c is a
/// normal fp16 power of two in [2⁻¹⁴, 2¹⁵] and, for 2⁻²⁸ ≤ ε < 2⁻¹² (decoders use 10⁻⁶ to 10⁻⁵),
/// √ε is normal and t < 2⁸, so e never overflows; squaring c first would overflow for c > 2⁸ and flush to zero for c < 2⁻⁷.
/// Where t·t underflows (c > 2⁷·√ε) e < 2⁻¹⁴, and flushing it scales y by at most √(1 + 2⁻¹⁴/m):
/// under half an fp16 ulp whenever m ≥ 1/16, i.e. unless a few spikes dominate the row. Squares
/// u_j² that flush are those of elements below 2⁻⁷·c, which add less than 2⁻¹⁴ each to s ≥ 1.
/// The floor on r acts only on a row of zeros (any other row has r ≥ 1/√D), whose ε flushes in
/// fp16: the row stays zeros, as 0/√ε in f32, instead of 0/0.
pub fn rms_norm_row_scaled(
    row: &[f64],
    gamma: impl Fn(usize) -> f64,
    epsilon: f64,
    round: impl Fn(f64) -> f64,
) -> Vec<f64> {
    rms_norm_steps(row, gamma, epsilon, (row_scale(row), ROOT_FLOOR), round)
}

/// The least root the row-scaled norms divide by: fp16's smallest normal, 2⁻¹⁴.
pub const ROOT_FLOOR: f64 = 6.103515625e-5;

/// The steps of [`rms_norm_row_scaled`] with the scale `c` and the root's floor given: `(1, 0)` is
/// plain RmsNorm computed step by step (what a device without the rescale rules computes, e.g. in
/// [`crate::fp16sim`]).
pub fn rms_norm_steps(
    row: &[f64],
    gamma: impl Fn(usize) -> f64,
    epsilon: f64,
    (c, floor): (f64, f64),
    round: impl Fn(f64) -> f64,
) -> Vec<f64> {
    let u: Vec<f64> = row.iter().map(|&x| round(x / c)).collect();
    let mut s = 0.0;
    for &v in &u {
        s = round(s + round(v * v));
    }
    let m = round(s / row.len() as f64);
    let t = round(round(epsilon.sqrt()) / c);
    let e = round(t * t);
    let r = round(round(m + e).sqrt()).max(floor);
    u.iter().enumerate().map(|(j, &v)| round(round(v / r) * gamma(j))).collect()
}

/// `RmsNormRowScaled` of a tensor over its last axis, γ broadcast to x (as RmsNorm's
/// RMSNormalization does); the output takes x's dtype.
fn rms_norm_row_scaled_tensor(op: &OpRef, x: &Tensor, gamma: &Tensor, epsilon: f32) -> Result<Tensor, EvalError> {
    rms_norm_rows(op, x, gamma, epsilon as f64, true, &|v| v)
}

/// [`rms_norm_steps`] over every row of x's last axis, γ broadcast to x; each row's scale is its
/// [`row_scale`] when `row_scaled`, else 1 (RmsNorm step by step). Every step is rounded by
/// `round`; the output takes x's dtype.
pub(crate) fn rms_norm_rows(
    op: &OpRef,
    x: &Tensor,
    gamma: &Tensor,
    epsilon: f64,
    row_scaled: bool,
    round: &dyn Fn(f64) -> f64,
) -> Result<Tensor, EvalError> {
    if !x.dtype.is_float() || !gamma.dtype.is_float() {
        return Err(err(op, format!("{} needs float x and γ, got {} and {}", op.op, x.dtype, gamma.dtype)));
    }
    let d = match x.shape.last() {
        Some(&d) if d > 0 => d,
        _ => return Err(err(op, format!("x of shape {:?} has no last axis to normalise", x.shape))),
    };
    let broadcasts =
        gamma.rank() <= x.rank() && gamma.shape.iter().rev().zip(x.shape.iter().rev()).all(|(g, x)| *g == 1 || g == x);
    if !broadcasts {
        return Err(err(op, format!("γ of shape {:?} does not broadcast to x {:?}", gamma.shape, x.shape)));
    }
    let (xv, gv) = (x.to_f64_vec(), gamma.to_f64_vec());
    let mut y = Vec::with_capacity(xv.len());
    for (r, row) in xv.chunks(d).enumerate() {
        let g = |j: usize| gv[broadcast_index(&x.shape, &gamma.shape, r * d + j)];
        let scale = if row_scaled { (row_scale(row), ROOT_FLOOR) } else { (1.0, 0.0) };
        y.extend(rms_norm_steps(row, g, epsilon, scale, round));
    }
    Ok(crate::eval::float_tensor(x.dtype, x.shape.clone(), y))
}

/// `WGemmRowScaled`: each row of a divided by its [`row_scale`], the WGemm of that, and each
/// output row multiplied back. Both scalings are exact, so this is WGemm's value bit for bit
/// (outside the subnormal range).
fn wgemm_row_scaled(op: &OpRef, inputs: &[Option<&Tensor>]) -> Result<Tensor, EvalError> {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let Some(a) = get(0) else { return Err(err(op, "WGemmRowScaled needs a")) };
    let k = match a.shape.last() {
        Some(&k) if k > 0 && a.dtype.is_float() => k,
        _ => return Err(err(op, format!("a must be a float tensor [.., K > 0], got {} {:?}", a.dtype, a.shape))),
    };
    let av = a.to_f64_vec();
    let scales: Vec<f64> = av.chunks(k).map(row_scale).collect();
    let scaled: Vec<f64> = av.iter().enumerate().map(|(i, &v)| v / scales[i / k]).collect();
    let scaled = crate::eval::float_tensor(a.dtype, a.shape.clone(), scaled);
    let y = onnx(op, "MatMulNBits", Domain::Microsoft, op.attrs, &[Some(&scaled), get(1), get(2), get(3)], 1)?
        .swap_remove(0);
    if scales.is_empty() {
        return Ok(y);
    }
    let n = y.numel() / scales.len();
    let yv: Vec<f64> = y.to_f64_vec().iter().enumerate().map(|(i, &v)| v * scales[i / n]).collect();
    Ok(crate::eval::float_tensor(y.dtype, y.shape.clone(), yv))
}

/// Broadcast index of `out_index` (row-major over `out_shape`) into a tensor of `shape`.
fn broadcast_index(out_shape: &[usize], shape: &[usize], mut out_index: usize) -> usize {
    let mut idx = 0;
    let mut stride = 1;
    let offset = out_shape.len() - shape.len();
    for d in (0..out_shape.len()).rev() {
        let coord = out_index % out_shape[d];
        out_index /= out_shape[d];
        if d >= offset {
            let sd = shape[d - offset];
            if sd != 1 {
                idx += coord * stride;
            }
            stride *= sd;
        }
    }
    idx
}

fn rope(op: &OpRef, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, EvalError> {
    let interleaved = op.attrs.int_or("interleaved", 0).map_err(|e| err(op, e.to_string()))? != 0;
    if !x.dtype.is_float() || !cos.dtype.is_float() || !sin.dtype.is_float() {
        return Err(err(op, format!("Rope needs float x, cos and sin, got {}, {}, {}", x.dtype, cos.dtype, sin.dtype)));
    }
    let d = *x.shape.last().ok_or_else(|| err(op, "x is a scalar"))?;
    if d % 2 != 0 {
        return Err(err(op, format!("rotary width {d} is odd")));
    }
    for t in [cos, sin] {
        if t.rank() > x.rank() || t.shape.last() != Some(&d) {
            return Err(err(
                op,
                format!("cos/sin of shape {:?} do not broadcast to x {:?} over the full width", t.shape, x.shape),
            ));
        }
        for (a, b) in t.shape.iter().rev().zip(x.shape.iter().rev()) {
            if *a != 1 && a != b {
                return Err(err(op, format!("cos/sin of shape {:?} do not broadcast to x {:?}", t.shape, x.shape)));
            }
        }
    }
    let (xv, cv, sv) = (x.to_f32_vec(), cos.to_f32_vec(), sin.to_f32_vec());
    let mut out = vec![0f32; xv.len()];
    for (i, o) in out.iter_mut().enumerate() {
        let j = i % d;
        let row = i - j;
        let (partner, sign) = if interleaved {
            if j % 2 == 0 {
                (row + j + 1, -1.0)
            } else {
                (row + j - 1, 1.0)
            }
        } else if j < d / 2 {
            (row + j + d / 2, -1.0)
        } else {
            (row + j - d / 2, 1.0)
        };
        let c = cv[broadcast_index(&x.shape, &cos.shape, i)];
        let s = sv[broadcast_index(&x.shape, &sin.shape, i)];
        *o = xv[i] * c + sign * xv[partner] * s;
    }
    Ok(Tensor::from_f32(x.dtype, x.shape.clone(), out))
}

/// QGemm, in its obviously correct form: every output accumulates Σₖ (a − zₐ)(w − z_w) in i64,
/// then scales once in f32 and optionally requantises with QuantizeLinear's rounding.
///
/// Kernels compute the same integers another way. Expanding the product,
/// `Σₖ (a − zₐ)(w − z_w) = Σₖ a·w − z_w·Σₖ a − zₐ·Σₖ w + K·zₐ·z_w`: the raw int8×int8 → int32
/// product, a per-row sum of the activation codes, and per-column weight sums Σₖ w that depend
/// on the weight alone (computed once per weight, at compile time). Every term is an exact integer,
/// so the zero points, asymmetric ones included, cost no accuracy.
fn qgemm(op: &OpRef, inputs: &[Option<&Tensor>]) -> Result<Tensor, EvalError> {
    match activation_passes(op.attrs).map_err(|m| err(op, m))? {
        None => qgemm_rows(op, inputs),
        Some(passes) => qgemm_passes(op, inputs, passes),
    }
}

/// `QGemm{passes}`: the first `passes` passes of a stacked activation as the rows of one plain
/// QGemm, then each row's products summed over the passes in pass order (the last
/// `first_pass_columns` columns keep the first pass's product).
fn qgemm_passes(op: &OpRef, inputs: &[Option<&Tensor>], passes: usize) -> Result<Tensor, EvalError> {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let (Some(a), Some(sa)) = (get(0), get(1)) else {
        return Err(err(op, "QGemm needs a, a_scale, a_zero_point, w, w_scale, w_zero_point"));
    };
    let (Some(&stacked), Some(&k)) = (a.shape.first(), a.shape.last()) else {
        return Err(err(op, "a QGemm with passes wants a [passes, .., K]"));
    };
    if a.rank() < 2 || passes > stacked || k == 0 || sa.numel() != a.numel() / k || get(6).is_some() {
        return Err(err(
            op,
            format!(
                "a QGemm of {passes} passes wants a [≥ {passes}, .., K] with a scale per row and no output requantisation, got a {:?}, scale {:?}",
                a.shape, sa.shape
            ),
        ));
    }
    let rows = a.numel() / k / stacked;
    let (Some(codes), scales) = (a.as_i64(), sa.to_f32_vec()) else {
        return Err(err(op, "QGemm operands and zero points must be integers"));
    };
    let a_rows = Tensor::from_i64(a.dtype, vec![passes * rows, k], codes[..passes * rows * k].to_vec());
    let s_rows = Tensor::from_f32(DType::F32, vec![passes * rows, 1], scales[..passes * rows].to_vec());
    let mut rest: Vec<Option<&Tensor>> = vec![Some(&a_rows), Some(&s_rows)];
    rest.extend(inputs.iter().skip(2).copied());
    let y = qgemm_rows(op, &rest)?;
    let n = y.shape[1];
    let products = y.as_f32().expect("QGemm gives f32");
    let summed = n - first_pass_columns(op.attrs, passes, n).map_err(|m| err(op, m))?;
    let mut sum = products[..rows * n].to_vec();
    for pass in products.chunks(rows * n).skip(1) {
        for (s, p) in sum.chunks_mut(n).zip(pass.chunks(n)) {
            s[..summed].iter_mut().zip(&p[..summed]).for_each(|(s, &p)| *s += p);
        }
    }
    let mut shape = a.shape[1..].to_vec();
    *shape.last_mut().unwrap() = n;
    Ok(Tensor::from_f32(DType::F32, shape, sum))
}

/// `QGemm` of a [.., K] by w [K, N].
fn qgemm_rows(op: &OpRef, inputs: &[Option<&Tensor>]) -> Result<Tensor, EvalError> {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let (a, sa, za, w, sw, zw) = match (get(0), get(1), get(2), get(3), get(4), get(5)) {
        (Some(a), Some(sa), Some(za), Some(w), Some(sw), Some(zw)) => (a, sa, za, w, sw, zw),
        _ => return Err(err(op, "QGemm needs a, a_scale, a_zero_point, w, w_scale, w_zero_point")),
    };
    let (Some(av), Some(wv), Some(zav), Some(zwv)) = (a.as_i64(), w.as_i64(), za.as_i64(), zw.as_i64()) else {
        return Err(err(op, "QGemm operands and zero points must be integers"));
    };
    if w.rank() != 2 || a.rank() < 1 {
        return Err(err(op, format!("QGemm wants a [.., K] and w [K, N], got {:?} and {:?}", a.shape, w.shape)));
    }
    let (k, n) = (w.shape[0], w.shape[1]);
    if *a.shape.last().unwrap() != k {
        return Err(err(op, format!("inner dims differ: {:?} × {:?}", a.shape, w.shape)));
    }
    let sa_v = sa.to_f32_vec();
    let sw_v = sw.to_f32_vec();
    let m = a.numel() / k;
    if !(sa_v.len() == 1 || (sa_v.len() == m && sa.shape.last() == Some(&1))) || zav.len() != 1 {
        return Err(err(op, "activation scale must be per tensor or per row ([.., 1]), its zero point per tensor"));
    }
    if !(sw_v.len() == 1 || sw_v.len() == n) || zwv.len() != sw_v.len() {
        return Err(err(op, "weight scale and zero point must be per tensor or per output column"));
    }
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        for c in 0..n {
            let zwc = zwv[if zwv.len() == 1 { 0 } else { c }];
            let mut acc: i64 = 0;
            for kk in 0..k {
                acc += (av[r * k + kk] - zav[0]) * (wv[kk * n + c] - zwc);
            }
            let swc = sw_v[if sw_v.len() == 1 { 0 } else { c }];
            out[r * n + c] = acc as f32 * (sa_v[if sa_v.len() == 1 { 0 } else { r }] * swc);
        }
    }
    let mut shape = a.shape.clone();
    *shape.last_mut().unwrap() = n;
    let y = Tensor::from_f32(DType::F32, shape, out);
    match (get(6), get(7)) {
        (Some(sy), zy) => {
            if sy.numel() != 1 || zy.is_some_and(|z| z.numel() != 1) {
                return Err(err(op, "output scale and zero point must be per tensor"));
            }
            let r = OpRef {
                node: op.node,
                domain: Domain::Onnx,
                op: "QuantizeLinear",
                opset: 21,
                attrs: &Attrs::default(),
            };
            eval_op(&r, &[Some(&y), Some(sy), zy], 1).map(|mut v| v.remove(0))
        }
        (None, Some(_)) => Err(err(op, "an output zero point without an output scale")),
        (None, None) => Ok(y),
    }
}

/// The `first_pass_columns` attribute of a `QGemm{passes}` over `n` columns (0 when absent): how
/// many of the last columns take the first pass's product only — a weight's residual pass side by
/// side with the weight it refines, so one call reads both.
pub fn first_pass_columns(attrs: &Attrs, passes: usize, n: usize) -> Result<usize, String> {
    match attrs.int("first_pass_columns").map_err(|e| e.to_string())? {
        None | Some(0) => Ok(0),
        Some(c) if passes >= 2 && c > 0 && c as usize <= n => Ok(c as usize),
        Some(c) => Err(format!("first_pass_columns {c} wants 2 or more passes and at most the {n} columns")),
    }
}

/// The `passes` attribute of a `QuantizeRows` (1 or 2, default 1) or a `QGemm` (none, or 1
/// or more: the activation's leading pass axis).
pub fn activation_passes(attrs: &Attrs) -> Result<Option<usize>, String> {
    match attrs.int("passes").map_err(|e| e.to_string())? {
        None => Ok(None),
        Some(p) if p >= 1 => Ok(Some(p as usize)),
        Some(p) => Err(format!("passes must be at least 1, got {p}")),
    }
}

/// `QuantizeRows`: codes and row scales of x, in one pass or two stacked on a leading axis.
fn quantize_rows_op(op: &OpRef, x: &Tensor, gamma: Option<&Tensor>) -> Result<Vec<Tensor>, EvalError> {
    let d = match x.shape.last() {
        Some(&d) if d > 0 && x.dtype.is_float() => d,
        _ => return Err(err(op, format!("x must be a float tensor [.., K > 0], got {} {:?}", x.dtype, x.shape))),
    };
    let passes = activation_passes(op.attrs).map_err(|m| err(op, m))?.unwrap_or(1);
    if passes > 2 {
        return Err(err(op, format!("QuantizeRows takes 1 or 2 passes, got {passes}")));
    }
    let xs = x.to_f32_vec();
    let (codes, scales) = match gamma {
        Some(g) if g.shape == [d] && g.dtype.is_float() => {
            crate::norm_codes::quantize_product_rows(&xs, &g.to_f32_vec(), passes)
        }
        Some(g) => return Err(err(op, format!("γ must be float [{d}], got {} {:?}", g.dtype, g.shape))),
        None => {
            let (mut codes, mut scales) = quantize_rows(&xs, d);
            if passes == 2 {
                let (rc, rs) = quantize_rows_residual(&xs, d, &codes, &scales);
                codes.extend(rc);
                scales.extend(rs);
            }
            (codes, scales)
        }
    };
    Ok(stacked_codes(&x.shape, passes, codes, scales))
}

/// `QuantizeSwiGlu`: codes and row scales of the integer gate's exact values
/// ([`crate::integer_gate`]), in one pass or two stacked on a leading axis.
fn quantize_swiglu(op: &OpRef, g: &Tensor, u: &Tensor) -> Result<Vec<Tensor>, EvalError> {
    let d = match g.shape.last() {
        Some(&d) if d > 0 && g.dtype.is_float() && u.dtype.is_float() && u.shape == g.shape => d,
        _ => {
            let (gs, us) = (format!("{} {:?}", g.dtype, g.shape), format!("{} {:?}", u.dtype, u.shape));
            return Err(err(
                op,
                format!("gate and up must be float tensors [.., K > 0] of one shape, got {gs} and {us}"),
            ));
        }
    };
    let passes = activation_passes(op.attrs).map_err(|m| err(op, m))?.unwrap_or(1);
    if passes > 2 {
        return Err(err(op, format!("QuantizeSwiGlu takes 1 or 2 passes, got {passes}")));
    }
    let (codes, scales) = crate::integer_gate::quantize_gate_rows(&g.to_f32_vec(), &u.to_f32_vec(), d, passes);
    Ok(stacked_codes(&g.shape, passes, codes, scales))
}

/// Codes and row scales of rows shaped `shape`, the passes stacked on a leading axis when 2.
fn stacked_codes(shape: &[usize], passes: usize, codes: Vec<i8>, scales: Vec<f32>) -> Vec<Tensor> {
    let (mut code_shape, mut scale_shape) = (shape.to_vec(), shape.to_vec());
    *scale_shape.last_mut().unwrap() = 1;
    if passes == 2 {
        code_shape.insert(0, 2);
        scale_shape.insert(0, 2);
    }
    vec![
        Tensor::from_i64(DType::I8, code_shape, codes.into_iter().map(i64::from).collect()),
        Tensor::from_f32(DType::F32, scale_shape, scales),
    ]
}

/// `InverseRms`: r = 1/√(ss/d + ε) per row of x's last axis, shape [.., 1].
fn inverse_rms(op: &OpRef, x: &Tensor, eps: f32) -> Result<Tensor, EvalError> {
    let d = match x.shape.last() {
        Some(&d) if d > 0 && x.dtype.is_float() => d,
        _ => return Err(err(op, format!("x must be a float tensor [.., d > 0], got {} {:?}", x.dtype, x.shape))),
    };
    use crate::pinned_norm::{aligned_sum_squares, inverse_root, sum_squares, ALIGNED_MAX_D};
    let squares: fn(&[f32]) -> f32 = match op.attrs.str("squares").map_err(|e| err(op, e.to_string()))? {
        None | Some("f32") => sum_squares,
        Some("aligned") if d <= ALIGNED_MAX_D => aligned_sum_squares,
        Some("aligned") => {
            return Err(err(op, format!("aligned squares take rows of at most {ALIGNED_MAX_D}, not {d}")))
        }
        Some(other) => return Err(err(op, format!("squares is \"f32\" or \"aligned\", not {other:?}"))),
    };
    let xs = x.to_f32_vec();
    let r = xs.chunks(d).map(|row| inverse_root(squares(row), d, eps));
    let mut shape = x.shape.clone();
    *shape.last_mut().unwrap() = 1;
    Ok(Tensor::from_f32(x.dtype, shape, r.collect()))
}

/// The row scale of `QuantizeRows` for a row's maximum `max` = max|x|: the smallest power of two
/// at least `max / 127` (that quotient rounded to f32) and at least 2⁻¹²⁶, the smallest normal
/// f32; 1 when `max` is 0 or not finite. Read off the quotient's bits: its exponent when its
/// mantissa is zero, else the next exponent up.
///
/// A power of two costs the codes at most one bit against `max / 127` itself (the SmolLM2 KL of
/// the xdna program against float, `tests/xdna_numerics.rs`: 7.93e-3 prefill, 2.13e-3 decode,
/// against 8.21e-3 and 2.09e-3 with `max / 127`), and makes every step after it exact: `x / s` is `x` with a smaller
/// exponent (its integer part the code, rounded half to even), and the residual `x − code·s` is
/// representable, so a core without floating-point hardware computes the codes with integer
/// operations on the bits and gets the program's result.
pub fn quantize_rows_scale(max: f32) -> f32 {
    if !(max > 0.0 && max.is_finite()) {
        return 1.0;
    }
    let bits = (max / 127.0).to_bits();
    match (bits & 0x7f80_0000, bits & 0x007f_ffff) {
        (0, _) => f32::MIN_POSITIVE,
        (exponent, 0) => f32::from_bits(exponent),
        (exponent, _) => f32::from_bits(exponent + 0x0080_0000),
    }
}

/// `QuantizeRows` on rows of `d` values: per row s = [`quantize_rows_scale`] of max|x| (1 for a
/// row of zeros, so its codes are 0), codes = x/s rounded half to even, within ±127 because
/// |x| ≤ max|x| ≤ 127·s (up to the quotient's rounding, which the clamp takes). Returns (codes,
/// one scale per row).
pub fn quantize_rows(x: &[f32], d: usize) -> (Vec<i8>, Vec<f32>) {
    let mut codes = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / d.max(1));
    for row in x.chunks(d) {
        let max = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let s = quantize_rows_scale(max);
        scales.push(s);
        codes.extend(row.iter().map(|v| (v / s).round_ties_even().clamp(-127.0, 127.0) as i8));
    }
    (codes, scales)
}

/// The second pass of a two-pass `QuantizeRows`: [`quantize_rows`] of the residual
/// r = x − codes·s, each product and difference rounded to f32 as a kernel computes them.
pub fn quantize_rows_residual(x: &[f32], d: usize, codes: &[i8], scales: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let r: Vec<f32> = x
        .chunks(d)
        .zip(codes.chunks(d))
        .zip(scales)
        .flat_map(|((row, c), &s)| row.iter().zip(c).map(move |(v, &c)| v - f32::from(c) * s))
        .collect();
    quantize_rows(&r, d)
}

/// The weights of a `WGemm` (MatMulNBits layout), decoded for code-level access: codes uint8
/// [N, blocks, block·bits/8] packed along K low bits first, scales [N·blocks], zero points packed
/// uint8 ([N, ⌈blocks·bits/8⌉]) or float ([N·blocks]), by default 2^(bits−1).
pub struct NBitsWeights {
    pub k: usize,
    pub n: usize,
    pub bits: usize,
    pub block: usize,
    pub blocks: usize,
    codes: Vec<i64>,
    scales: Vec<f64>,
    zeros: Zeros,
}

/// Why a WGemm's attributes and weights are not a MatMulNBits layout.
#[derive(Debug, thiserror::Error)]
pub enum NBitsError {
    #[error(transparent)]
    Attr(#[from] AttrError),
    #[error("attribute {0} must be a positive integer")]
    NotPositive(&'static str),
    #[error("bits {bits} with block_size {block} is not a MatMulNBits layout")]
    Layout { bits: usize, block: usize },
    #[error("weights must be uint8 codes, got {0}")]
    CodesDtype(DType),
    #[error("weights must hold N·blocks·{blob} = {bytes} bytes, got {shape:?}")]
    CodesShape { blob: usize, bytes: usize, shape: Vec<usize> },
    #[error("scales must hold N·blocks = {expected} values, got {got}")]
    ScalesLen { expected: usize, got: usize },
    #[error("zero points must be uint8 or float, got {0}")]
    ZeroPointsDtype(DType),
    #[error("zero points of shape {0:?} fit neither layout")]
    ZeroPointsShape(Vec<usize>),
}

enum Zeros {
    Default,
    Packed(Vec<i64>, usize),
    Float(Vec<f64>),
}

impl NBitsWeights {
    /// Decodes the weights of a WGemm with attributes `attrs` (K, N, bits, block_size).
    pub fn new(
        attrs: &Attrs,
        w: &Tensor,
        scales: &Tensor,
        zero_points: Option<&Tensor>,
    ) -> Result<NBitsWeights, NBitsError> {
        let attr = |name: &'static str| -> Result<usize, NBitsError> {
            match attrs.int(name)? {
                Some(v) if v > 0 => Ok(v as usize),
                _ => Err(NBitsError::NotPositive(name)),
            }
        };
        let (k, n, bits, block) = (attr("K")?, attr("N")?, attr("bits")?, attr("block_size")?);
        if !matches!(bits, 2 | 4 | 8) || (block * bits) % 8 != 0 {
            return Err(NBitsError::Layout { bits, block });
        }
        let blocks = k.div_ceil(block);
        let blob = block * bits / 8;
        let codes = w.as_i64().ok_or(NBitsError::CodesDtype(w.dtype))?.to_vec();
        if codes.len() != n * blocks * blob {
            return Err(NBitsError::CodesShape { blob, bytes: n * blocks * blob, shape: w.shape.clone() });
        }
        let scales = scales.to_f64_vec();
        if scales.len() != n * blocks {
            return Err(NBitsError::ScalesLen { expected: n * blocks, got: scales.len() });
        }
        let row_bytes = (blocks * bits).div_ceil(8);
        let zeros = match zero_points {
            None => Zeros::Default,
            Some(z) if z.dtype.is_float() && z.numel() == n * blocks => Zeros::Float(z.to_f64_vec()),
            Some(z) if z.numel() == n * row_bytes => {
                Zeros::Packed(z.as_i64().ok_or(NBitsError::ZeroPointsDtype(z.dtype))?.to_vec(), row_bytes)
            }
            Some(z) => return Err(NBitsError::ZeroPointsShape(z.shape.clone())),
        };
        Ok(NBitsWeights { k, n, bits, block, blocks, codes, scales, zeros })
    }

    fn unpack(&self, bytes: &[i64], index: usize) -> i64 {
        let bit = index * self.bits;
        (bytes[bit / 8] >> (bit % 8)) & ((1 << self.bits) - 1)
    }

    /// The code of W[col, kk].
    pub fn code(&self, col: usize, kk: usize) -> f64 {
        let blob = self.block * self.bits / 8;
        let (b, within) = (kk / self.block, kk % self.block);
        self.unpack(&self.codes[(col * self.blocks + b) * blob..][..blob], within) as f64
    }

    /// The zero point of block `b` of column `col`.
    pub fn zero(&self, col: usize, b: usize) -> f64 {
        match &self.zeros {
            Zeros::Default => (1u32 << (self.bits - 1)) as f64,
            Zeros::Float(v) => v[col * self.blocks + b],
            Zeros::Packed(v, row) => self.unpack(&v[col * row..][..*row], b) as f64,
        }
    }

    /// The scale of block `b` of column `col`.
    pub fn scale(&self, col: usize, b: usize) -> f64 {
        self.scales[col * self.blocks + b]
    }

    /// W dequantised, row-major [N, K]: (code − zero)·scale, in f64.
    pub fn dequantized(&self) -> Vec<f64> {
        let mut w = Vec::with_capacity(self.n * self.k);
        for col in 0..self.n {
            for kk in 0..self.k {
                let b = kk / self.block;
                w.push((self.code(col, kk) - self.zero(col, b)) * self.scale(col, b));
            }
        }
        w
    }
}

/// ONNX `Gelu` with `approximate = "tanh"`.
fn gelu_tanh(op: &OpRef, x: &Tensor) -> Result<Vec<Tensor>, EvalError> {
    let mut a = Attrs::default();
    a.set("approximate", Attr::Str("tanh".into()));
    onnx(op, "Gelu", Domain::Onnx, &a, &[Some(x)], 1)
}

/// Causal grouped-query attention in BNSH layout.
///
/// q: [B, Hq, S, D]; k, v: [B, Hkv, S, D] (this step's keys and values); past_k, past_v:
/// [B, Hkv, P, D] or absent (P = 0); mask: [B, P+S] integers, 1 = attend, or absent. Query i
/// (absolute position P+i) attends to key t when t ≤ P+i, P+i − t < window (when the `window`
/// attribute is given and positive: a sliding window of that many positions, the query's own
/// included) and mask[b, t] ≠ 0, with weights
/// softmax(q·k_t · scale) over those t (f64 accumulation); sinks: [Hq] or absent, a logit per
/// query head that joins the softmax's denominator and weights no value (gpt-oss's attention
/// sinks); a query with no key to attend to outputs zeros. Query head h reads kv head h / (Hq/Hkv). Outputs y [B, Hq, S, D] and the
/// presents concat(past, new) along the sequence axis.
pub fn attention(op: &OpRef, inputs: &[Option<&Tensor>], num_outputs: usize) -> Result<Vec<Tensor>, EvalError> {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let (Some(q), Some(k), Some(v)) = (get(0), get(1), get(2)) else {
        return Err(err(op, "Attention needs q, k and v"));
    };
    if q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
        return Err(err(op, "q, k and v must be [batch, heads, sequence, head_dim]"));
    }
    let (b, hq, s, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let hkv = k.shape[1];
    if hkv == 0 || hq % hkv != 0 || k.shape != v.shape || k.shape[0] != b || k.shape[2] != s || k.shape[3] != d {
        return Err(err(op, format!("incompatible q {:?}, k {:?}, v {:?}", q.shape, k.shape, v.shape)));
    }
    let concat = |past: Option<&Tensor>, new: &Tensor| -> Result<Tensor, EvalError> {
        match past {
            None => Ok(new.clone()),
            Some(p) => {
                let mut a = Attrs::default();
                a.set("axis", Attr::Int(2));
                onnx(op, "Concat", Domain::Onnx, &a, &[Some(p), Some(new)], 1).map(|mut r| r.remove(0))
            }
        }
    };
    let pk = concat(get(3), k)?;
    let pv = concat(get(4), v)?;
    let total = pk.shape[2];
    let past = total - s;
    let scale = op.attrs.float_or("scale", 1.0 / (d as f32).sqrt()).map_err(|e| err(op, e.to_string()))? as f64;
    let window = attention_window(op)?;
    let mask = get(5).map(|m| m.to_f64_vec());
    let sinks = get(6).map(|t| t.to_f64_vec());
    if sinks.as_ref().is_some_and(|t| t.len() != hq) {
        return Err(err(op, format!("sinks must hold one logit per query head ({hq})")));
    }
    if let Some(m) = &mask {
        if m.len() != b * total {
            return Err(err(op, format!("mask has {} elements, expected [{b}, {total}]", m.len())));
        }
    }
    let (qv, kv, vv) = (q.to_f32_vec(), pk.to_f32_vec(), pv.to_f32_vec());
    let mut out = vec![0f32; qv.len()];
    let group = hq / hkv;
    let mut scores = vec![0f64; total];
    for bi in 0..b {
        for h in 0..hq {
            let kv_rows = (bi * hkv + h / group) * total * d;
            let (keys, values) = (&kv[kv_rows..][..total * d], &vv[kv_rows..][..total * d]);
            for i in 0..s {
                let visible = |t: usize| {
                    t <= past + i && past + i - t < window && mask.as_ref().is_none_or(|m| m[bi * total + t] != 0.0)
                };
                let at = ((bi * hq + h) * s + i) * d;
                let sink = sinks.as_ref().map(|t| t[h]);
                attend_row(&qv[at..][..d], (keys, values), (scale, sink), visible, &mut scores, &mut out[at..][..d]);
            }
        }
    }
    let y = Tensor::from_f32(q.dtype, q.shape.clone(), out);
    let mut r = vec![y, pk, pv];
    r.truncate(num_outputs.max(1));
    Ok(r)
}

/// Attention's `window` attribute: the positions a query sees, its own included (`usize::MAX`
/// when absent or 0).
fn attention_window(op: &OpRef) -> Result<usize, EvalError> {
    match op.attrs.int("window").map_err(|e| err(op, e.to_string()))? {
        Some(w) if w < 0 => Err(err(op, format!("window {w} is negative"))),
        Some(w) if w > 0 => Ok(w as usize),
        _ => Ok(usize::MAX),
    }
}

/// Adds to `orow` one query row's attention: softmax(q·k_t · scale) over the `visible` keys t
/// (f64 accumulation, the `sink` logit joining the denominator) weighting the values' rows. A row
/// with no visible key stays zero. `scores` is scratch space, one entry per key.
fn attend_row(
    qrow: &[f32],
    (keys, values): (&[f32], &[f32]),
    (scale, sink): (f64, Option<f64>),
    visible: impl Fn(usize) -> bool,
    scores: &mut [f64],
    orow: &mut [f32],
) {
    let d = qrow.len();
    let mut max = f64::NEG_INFINITY;
    let mut any = false;
    for (t, sc) in scores.iter_mut().enumerate() {
        if !visible(t) {
            *sc = f64::NEG_INFINITY;
            continue;
        }
        let krow = &keys[t * d..][..d];
        let dot: f64 = qrow.iter().zip(krow).map(|(a, b)| *a as f64 * *b as f64).sum();
        *sc = dot * scale;
        max = max.max(*sc);
        any = true;
    }
    if !any {
        return;
    }
    let max = sink.map_or(max, |s| max.max(s));
    let denom: f64 = scores.iter().map(|&x| if x.is_finite() { (x - max).exp() } else { 0.0 }).sum::<f64>()
        + sink.map_or(0.0, |s| (s - max).exp());
    for (t, &sc) in scores.iter().enumerate() {
        if !sc.is_finite() {
            continue;
        }
        let p = (sc - max).exp() / denom;
        let vrow = &values[t * d..][..d];
        for (o, &x) in orow.iter_mut().zip(vrow) {
            *o += (p * x as f64) as f32;
        }
    }
}

/// DeltaNet: the gated delta rule (see the table above), as com.microsoft `LinearAttention` with
/// `update_rule = "gated_delta"` computes it (in f64, token by token, rounded once). `scale` must
/// be given, finite and non-zero: the rule that builds the op resolves LinearAttention's
/// `scale = 0` default (1/√d_k) and folds a constant factor on the queries into it.
pub fn delta_net(op: &OpRef, inputs: &[Option<&Tensor>], num_outputs: usize) -> Result<Vec<Tensor>, EvalError> {
    let attrs = op.attrs;
    let get = |name: &str| {
        attrs.int(name).map_err(|e| err(op, e.to_string()))?.ok_or_else(|| err(op, format!("{name} is required")))
    };
    let (q_heads, kv_heads) = (get("q_heads")?, get("kv_heads")?);
    let scale = match attrs.float("scale").map_err(|e| err(op, e.to_string()))? {
        Some(s) if s != 0.0 && s.is_finite() => s,
        other => return Err(err(op, format!("scale must be given, finite and non-zero, got {other:?}"))),
    };
    if inputs.get(4).copied().flatten().is_none() || inputs.get(5).copied().flatten().is_none() {
        return Err(err(op, "decay (4) and beta (5) are required"));
    }
    let mut la = Attrs::default();
    la.set("q_num_heads", Attr::Int(q_heads));
    la.set("kv_num_heads", Attr::Int(kv_heads));
    la.set("scale", Attr::Float(scale));
    la.set("update_rule", Attr::Str("gated_delta".into()));
    let normed = match attrs.float("qk_l2norm_eps").map_err(|e| err(op, e.to_string()))? {
        Some(eps) => Some(l2_normed_qk(op, inputs, q_heads, eps as f64)?),
        None => None,
    };
    let mut args = inputs.to_vec();
    if let Some((q, k)) = &normed {
        (args[0], args[1]) = (Some(q), Some(k));
    }
    let mut out = onnx(op, "LinearAttention", Domain::Microsoft, &la, &args, 2)?;
    out.truncate(num_outputs.max(1));
    Ok(out)
}

/// DeltaNet's q and k with each head's d_k values (d_k = q's width / q_heads) divided by
/// √(Σx² + ε), a head of zeros (with ε = 0) staying zeros; each value computed in f64 and rounded
/// to the tensor's type once, so ε = 0 gives `LpNormalization{p=2}`'s values bit for bit.
fn l2_normed_qk(op: &OpRef, inputs: &[Option<&Tensor>], q_heads: i64, eps: f64) -> Result<(Tensor, Tensor), EvalError> {
    let (Some(q), Some(k)) = (inputs.first().copied().flatten(), inputs.get(1).copied().flatten()) else {
        return Err(err(op, "q (0) and k (1) are required"));
    };
    let dk = q.shape.last().copied().unwrap_or(0) / q_heads.max(1) as usize;
    let norm = |t: &Tensor, what: &str| {
        if dk == 0 || !eps.is_finite() || eps < 0.0 || t.shape.last().is_none_or(|w| w % dk != 0) {
            return Err(err(op, format!("{what} {:?} has no heads of {dk} to normalise (ε {eps})", t.shape)));
        }
        let mut v = t.to_f64_vec();
        for head in v.chunks_mut(dk) {
            let r = (head.iter().map(|x| x * x).sum::<f64>() + eps).sqrt();
            head.iter_mut().for_each(|x| *x = if r == 0.0 { 0.0 } else { *x / r });
        }
        Ok(crate::eval::float_tensor(t.dtype, t.shape.clone(), v))
    };
    Ok((norm(q, "q")?, norm(k, "k")?))
}

/// CausalConv: com.microsoft `CausalConvWithState` with its defaults and `activation` `none` or
/// `silu` (see the table above).
pub fn causal_conv(op: &OpRef, inputs: &[Option<&Tensor>], num_outputs: usize) -> Result<Vec<Tensor>, EvalError> {
    let activation = op.attrs.str("activation").map_err(|e| err(op, e.to_string()))?.unwrap_or("none");
    if !matches!(activation, "none" | "silu") {
        return Err(err(op, format!("activation {activation:?} is not one of none, silu")));
    }
    let mut conv = Attrs::default();
    conv.set("activation", Attr::Str(activation.into()));
    let mut out = onnx(op, "CausalConvWithState", Domain::Microsoft, &conv, inputs, 2)?;
    out.truncate(num_outputs.max(1));
    Ok(out)
}

/// Moe: float experts as com.microsoft `MoE` computes them (inputs x, router, fc1, fc1_bias,
/// fc2, fc2_bias), coded experts (fc1_scales given) as `QMoE` does with its first eight inputs;
/// the attributes are theirs. Coded experts must say `normalize_routing_weights = 1`: QMoE
/// renormalises the k weights whatever its attribute says, and the op states it. A shared
/// expert's output (input 8) is added gated by the sigmoid of its logits (input 9), as
/// com.microsoft `GatedAdd` of `Sigmoid` computes it.
pub fn moe(op: &OpRef, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, EvalError> {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let routed = routed_experts(op, &inputs[..8.min(inputs.len())])?;
    match (get(8), get(9)) {
        (None, None) => Ok(routed),
        (Some(shared), Some(logits)) => {
            let gate = onnx(op, "Sigmoid", Domain::Onnx, &Attrs::default(), &[Some(logits)], 1)?;
            let plain = Attrs::default();
            onnx(op, "GatedAdd", Domain::Microsoft, &plain, &[Some(&routed[0]), Some(shared), Some(&gate[0])], 1)
        }
        _ => Err(err(op, "shared (8) and shared_gate (9) are given together or not at all")),
    }
}

/// Moe without a shared expert: MoE or QMoE of the first eight inputs.
fn routed_experts(op: &OpRef, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, EvalError> {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let normalize = op.attrs.int_or("normalize_routing_weights", 0).map_err(|e| err(op, e.to_string()))?;
    match (get(3), get(6)) {
        (None, None) => {
            onnx(op, "MoE", Domain::Microsoft, op.attrs, &[get(0), get(1), get(2), get(4), get(5), get(7)], 1)
        }
        (Some(_), Some(_)) if normalize == 1 => onnx(op, "QMoE", Domain::Microsoft, op.attrs, inputs, 1),
        (Some(_), Some(_)) => {
            Err(err(op, "coded experts are always renormalised: normalize_routing_weights must be 1"))
        }
        _ => Err(err(op, "fc1_scales (3) and fc2_scales (6) are given together or not at all")),
    }
}

/// Output types of an op from its input types (`None` for absent inputs); empty when the op's
/// types cannot be inferred from types alone (the e-class then takes them from its members).
pub fn infer_types(domain: Domain, op: &str, attrs: &Attrs, inputs: &[Option<TypeInfo>]) -> Vec<TypeInfo> {
    let t = |i: usize| inputs.get(i).cloned().flatten();
    let one = |ty: Option<TypeInfo>| ty.into_iter().collect::<Vec<_>>();
    match (domain, op) {
        (Domain::Npuc, "RmsNorm" | "RmsNormRowScaled" | "Silu" | "Rope") => one(t(0)),
        (Domain::Npuc, "L2NormRowScaled" | "GatedRmsNormRowScaled") => one(t(0)),
        (Domain::Npuc, "SwiGlu" | "GeluGate") => one(broadcast2(t(0), t(1))),
        (Domain::Npuc, "GeluTanh") => one(t(0)),
        (Domain::Npuc, "SkipRmsNorm" | "SkipRmsNormRowScaled") => {
            let s = broadcast2(t(0), t(1));
            s.map(|s| vec![s.clone(), s]).unwrap_or_default()
        }
        (Domain::Npuc, "WGemm" | "WGemmRowScaled") => one(t(0).map(|mut a| {
            if let (Some(last), Ok(Some(n))) = (a.shape.last_mut(), attrs.int("N")) {
                *last = Dim::known(n);
            }
            a
        })),
        (Domain::Npuc, "QGemm") => {
            let (Some(a), Some(w)) = (t(0), t(3)) else { return vec![] };
            let stacked = matches!(activation_passes(attrs), Ok(Some(_)));
            let mut shape = if stacked { a.shape.iter().skip(1).cloned().collect() } else { a.shape.clone() };
            if let (Some(last), Some(n)) = (shape.last_mut(), w.shape.get(1)) {
                *last = n.clone();
            }
            // Requantised outputs take the zero point's type (uint8 without one, as QuantizeLinear).
            let dtype = match (t(6), t(7)) {
                (_, Some(z)) => z.dtype,
                (Some(_), None) => DType::U8,
                (None, None) => DType::F32,
            };
            vec![TypeInfo { dtype, shape }]
        }
        (Domain::Npuc, "QuantizeRows" | "QuantizeSwiGlu") => {
            let Some(x) = t(0) else { return vec![] };
            let mut scale_shape = x.shape.clone();
            if let Some(last) = scale_shape.last_mut() {
                *last = Dim::known(1);
            }
            let mut code_shape = x.shape;
            if matches!(activation_passes(attrs), Ok(Some(2))) {
                code_shape.insert(0, Dim::known(2));
                scale_shape.insert(0, Dim::known(2));
            }
            vec![TypeInfo { dtype: DType::I8, shape: code_shape }, TypeInfo { dtype: DType::F32, shape: scale_shape }]
        }
        (Domain::Npuc, "InverseRms") => one(t(0).map(|mut x| {
            if let Some(last) = x.shape.last_mut() {
                *last = Dim::known(1);
            }
            x
        })),
        (Domain::Npuc, "Attention") => {
            let (Some(q), Some(k)) = (t(0), t(1)) else { return vec![] };
            let total = match t(3) {
                Some(p) if p.shape.len() == 4 && k.shape.len() == 4 => p.shape[2].add(&k.shape[2]),
                _ => k.shape.get(2).cloned(),
            };
            let Some(total) = total else { return vec![q] };
            let mut present = k.shape.clone();
            if present.len() == 4 {
                present[2] = total;
            }
            let kv = TypeInfo { dtype: k.dtype, shape: present };
            vec![q, kv.clone(), kv]
        }
        (Domain::Npuc, "DeltaNet") => delta_net_types(attrs, t(0), t(2), t(3)),
        (Domain::Npuc, "CausalConv") => t(0).into_iter().chain(t(3)).collect(),
        (Domain::Npuc, "Moe") => one(t(0)),
        (Domain::Onnx, "Add" | "Sub" | "Mul" | "Div" | "Pow") => one(broadcast2(t(0), t(1))),
        (
            Domain::Onnx,
            "Neg" | "Sqrt" | "Reciprocal" | "Exp" | "Sigmoid" | "Tanh" | "Softmax" | "Identity" | "Relu" | "Gelu"
            | "Softplus",
        ) => one(t(0)),
        _ => vec![],
    }
}

/// DeltaNet's output `[B, T, max(H_q, H_kv)·d_v]` in q's dtype and present state in the past
/// state's type; empty when the sizes are not known.
fn delta_net_types(attrs: &Attrs, q: Option<TypeInfo>, v: Option<TypeInfo>, past: Option<TypeInfo>) -> Vec<TypeInfo> {
    let heads = |name: &str| attrs.int(name).ok().flatten().filter(|&h| h > 0);
    let (Some(q), Some(v), Some(past), Some(qh), Some(kvh)) = (q, v, past, heads("q_heads"), heads("kv_heads")) else {
        return vec![];
    };
    let Some(dv) = v.shape.last().and_then(Dim::as_known).filter(|w| w % kvh == 0).map(|w| w / kvh) else {
        return vec![];
    };
    let mut shape = q.shape.clone();
    match shape.last_mut() {
        Some(last) => *last = Dim::known(qh.max(kvh) * dv),
        None => return vec![],
    }
    vec![TypeInfo { dtype: q.dtype, shape }, past]
}

/// Numpy broadcasting of two types when their dims agree or are 1; `None` otherwise.
fn broadcast2(a: Option<TypeInfo>, b: Option<TypeInfo>) -> Option<TypeInfo> {
    let (a, b) = (a?, b?);
    let rank = a.shape.len().max(b.shape.len());
    let mut shape = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = (i + a.shape.len()).checked_sub(rank).map(|j| a.shape[j].clone()).unwrap_or(Dim::known(1));
        let db = (i + b.shape.len()).checked_sub(rank).map(|j| b.shape[j].clone()).unwrap_or(Dim::known(1));
        shape.push(if da == db || db.as_known() == Some(1) {
            da
        } else if da.as_known() == Some(1) {
            db
        } else {
            return None;
        });
    }
    Some(TypeInfo { dtype: a.dtype, shape })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op<'a>(name: &'a str, attrs: &'a Attrs) -> OpRef<'a> {
        OpRef { node: "n", domain: Domain::Npuc, op: name, opset: 1, attrs }
    }

    #[test]
    fn rope_rotate_half_matches_the_formula() {
        // x = [1, 2, 3, 4], rotate_half(x) = [-3, -4, 1, 2].
        let x = Tensor::from_f32(DType::F32, vec![1, 4], vec![1., 2., 3., 4.]);
        let cos = Tensor::from_f32(DType::F32, vec![1, 4], vec![0.5; 4]);
        let sin = Tensor::from_f32(DType::F32, vec![1, 4], vec![2.0; 4]);
        let a = Attrs::default();
        let y = eval(&op("Rope", &a), &[Some(&x), Some(&cos), Some(&sin)], 1).unwrap();
        assert_eq!(y[0].as_f32().unwrap(), &[0.5 - 6., 1. - 8., 1.5 + 2., 2. + 4.]);
    }

    #[test]
    fn qgemm_is_exact_integer_arithmetic_with_zero_points() {
        // a = [[3, 5]] (za = 1), w = [[2], [7]] (zw = 3): (2)(-1) + (4)(4) = 14; × 0.5 × 0.25.
        let a = Tensor::from_i64(DType::U8, vec![1, 2], vec![3, 5]);
        let w = Tensor::from_i64(DType::U8, vec![2, 1], vec![2, 7]);
        let sa = Tensor::scalar_f32(0.5);
        let sw = Tensor::scalar_f32(0.25);
        let za = Tensor::from_i64(DType::U8, vec![], vec![1]);
        let zw = Tensor::from_i64(DType::U8, vec![], vec![3]);
        let at = Attrs::default();
        let y = eval(&op("QGemm", &at), &[Some(&a), Some(&sa), Some(&za), Some(&w), Some(&sw), Some(&zw)], 1).unwrap();
        assert_eq!(y[0].as_f32().unwrap(), &[14.0 * 0.125]);
    }

    fn passes(p: i64) -> Attrs {
        let mut a = Attrs::default();
        a.set("passes", Attr::Int(p));
        a
    }

    #[test]
    fn quantize_rows_in_two_passes_stacks_the_residual_to_about_15_bits() {
        // A row whose one large channel leaves the others a code or two in one pass.
        let row = [100.0f32, 0.37, -0.52, 0.011, 0.0, -0.29];
        let x = Tensor::from_f32(DType::F32, vec![1, row.len()], row.to_vec());
        let r = eval(&op("QuantizeRows", &passes(2)), &[Some(&x)], 2).unwrap();
        assert_eq!(
            (r[0].dtype, r[0].shape.as_slice(), r[1].shape.as_slice()),
            (DType::I8, &[2, 1, 6][..], &[2, 1, 1][..])
        );
        let (c, rc) = r[0].as_i64().unwrap().split_at(row.len());
        let (s, rs) = (r[1].as_f32().unwrap()[0], r[1].as_f32().unwrap()[1]);
        // The second pass's scale is at most half a first-pass step over 127.
        assert!(rs > 0.0 && rs <= s / 2.0 / 127.0 * 1.0001, "{rs} vs {s}");
        for (i, &v) in row.iter().enumerate() {
            let (one, two) = (c[i] as f32 * s, c[i] as f32 * s + rc[i] as f32 * rs);
            assert!((v - two).abs() <= rs / 2.0 * 1.0001, "{i}: {v} ≈ {two}");
            assert!((v - one).abs() <= s / 2.0 * 1.0001);
        }
        // The first pass is the one-pass form.
        let first = eval(&op("QuantizeRows", &Attrs::default()), &[Some(&x)], 2).unwrap();
        assert_eq!(first[0].as_i64().unwrap(), c);
        assert_eq!(first[1].as_f32().unwrap(), &[s]);
    }

    #[test]
    fn qgemm_of_stacked_passes_sums_each_passes_products_in_order() {
        // Two rows, two passes, K = 2, w = [[1, 2], [3, −1]] per column scales [1, 0.5].
        // Pass 0 codes [[1, 1], [2, 0]] scales [0.5, 1]; pass 1 codes [[−1, 4], [0, 1]] scales
        // [0.25, 0.125]. Row 0: pass 0 acc (4, 1) → (2, 0.25); pass 1 acc (11, −6) → (2.75, −0.75).
        let a = Tensor::from_i64(DType::I8, vec![2, 2, 2], vec![1, 1, 2, 0, -1, 4, 0, 1]);
        let sa = Tensor::from_f32(DType::F32, vec![2, 2, 1], vec![0.5, 1.0, 0.25, 0.125]);
        let w = Tensor::from_i64(DType::I8, vec![2, 2], vec![1, 2, 3, -1]);
        let sw = Tensor::from_f32(DType::F32, vec![2], vec![1.0, 0.5]);
        let (za, zw) = (Tensor::from_i64(DType::I8, vec![], vec![0]), Tensor::from_i64(DType::I8, vec![2], vec![0, 0]));
        let run = |p: i64| {
            let ins = [Some(&a), Some(&sa), Some(&za), Some(&w), Some(&sw), Some(&zw)];
            eval(&op("QGemm", &passes(p)), &ins, 1).unwrap().remove(0)
        };
        // Row 1: pass 0 acc (2, 4) → (2, 2); pass 1 acc (3, −1) → (0.375, −0.0625).
        let both = run(2);
        assert_eq!(both.shape, [2, 2]);
        assert_eq!(both.as_f32().unwrap(), &[2.0 + 2.75, 0.25 - 0.75, 2.0 + 0.375, 2.0 - 0.0625]);
        // One pass reads the first pass only.
        assert_eq!(run(1).as_f32().unwrap(), &[2.0, 0.25, 2.0, 2.0]);
        // The last column takes the first pass only: the residual pass of the first column's
        // weight, side by side with it.
        let mut attrs = passes(2);
        attrs.set("first_pass_columns", Attr::Int(1));
        let ins = [Some(&a), Some(&sa), Some(&za), Some(&w), Some(&sw), Some(&zw)];
        let folded = eval(&op("QGemm", &attrs), &ins, 1).unwrap().remove(0);
        assert_eq!(folded.as_f32().unwrap(), &[2.0 + 2.75, 0.25, 2.0 + 0.375, 2.0]);
        attrs.set("first_pass_columns", Attr::Int(3));
        assert!(eval(&op("QGemm", &attrs), &ins, 1).unwrap_err().msg.contains("at most the 2 columns"));
        // More passes than the activation holds is refused.
        let ins = [Some(&a), Some(&sa), Some(&za), Some(&w), Some(&sw), Some(&zw)];
        assert!(eval(&op("QGemm", &passes(3)), &ins, 1).unwrap_err().msg.contains("3 passes"));
    }

    #[test]
    fn quantize_rows_scales_each_row_by_a_power_of_two_and_qgemm_takes_row_scales() {
        // Row 0: max 2.5 → 2.5/127 ≈ 0.0197 → s = 2⁻⁵; 1.265625/s = 40.5 rounds half to even
        // (40), −2.5/s = −80. Row 1: zeros → s = 1, codes 0.
        let x = Tensor::from_f32(DType::F32, vec![2, 2], vec![1.265625, -2.5, 0.0, 0.0]);
        let at = Attrs::default();
        let r = eval(&op("QuantizeRows", &at), &[Some(&x)], 2).unwrap();
        assert_eq!(r[0].dtype, DType::I8);
        assert_eq!(r[0].as_i64().unwrap(), &[40, -80, 0, 0]);
        assert_eq!(r[1].shape, [2, 1]);
        let s = r[1].as_f32().unwrap();
        assert_eq!(s, &[0.03125, 1.0]);
        // × w = [[1], [1]] per tensor: row 0 → (40 − 80)·s₀, row 1 → 0.
        let w = Tensor::from_i64(DType::I8, vec![2, 1], vec![1, 1]);
        let (z, one) = (Tensor::from_i64(DType::I8, vec![], vec![0]), Tensor::scalar_f32(1.0));
        let y =
            eval(&op("QGemm", &at), &[Some(&r[0]), Some(&r[1]), Some(&z), Some(&w), Some(&one), Some(&z)], 1).unwrap();
        assert_eq!(y[0].as_f32().unwrap(), &[-40.0 * s[0], 0.0]);
        // A per-row scale must have one value per row.
        let bad = Tensor::from_f32(DType::F32, vec![3, 1], vec![1.0; 3]);
        let e = eval(&op("QGemm", &at), &[Some(&r[0]), Some(&bad), Some(&z), Some(&w), Some(&one), Some(&z)], 1);
        assert!(e.unwrap_err().msg.contains("per row"));
    }

    #[test]
    fn the_row_scale_is_the_power_of_two_at_or_above_max_over_127() {
        // 127 / 127 is 1, a power of two itself; 128 / 127 is just above, so 2; a subnormal
        // quotient takes the smallest normal; zero and non-finite maxima take 1.
        assert_eq!(quantize_rows_scale(127.0), 1.0);
        assert_eq!(quantize_rows_scale(128.0), 2.0);
        assert_eq!(quantize_rows_scale(1.0e-40), f32::MIN_POSITIVE);
        for max in [0.0, f32::INFINITY, f32::NAN] {
            assert_eq!(quantize_rows_scale(max), 1.0, "{max}");
        }
        for max in [1.0e-30f32, 3.7e-3, 0.5, 2.54, 99.0, 1.0e30, f32::MAX] {
            let (s, q) = (quantize_rows_scale(max), max / 127.0);
            assert_eq!(s.to_bits() & 0x007f_ffff, 0, "{max}: {s} is a power of two");
            assert!(s >= q && s < 2.0 * q, "{max}: {s} against {q}");
        }
    }

    #[test]
    fn attention_is_causal_over_past_and_new_tokens() {
        // One head, D = 1, past of one token; the second new query sees all three keys.
        let q = Tensor::from_f32(DType::F32, vec![1, 1, 2, 1], vec![0., 0.]);
        let k = Tensor::from_f32(DType::F32, vec![1, 1, 2, 1], vec![1., 1.]);
        let v = Tensor::from_f32(DType::F32, vec![1, 1, 2, 1], vec![3., 6.]);
        let pk = Tensor::from_f32(DType::F32, vec![1, 1, 1, 1], vec![1.]);
        let pv = Tensor::from_f32(DType::F32, vec![1, 1, 1, 1], vec![0.]);
        let a = Attrs::default();
        let y = attention(&op("Attention", &a), &[Some(&q), Some(&k), Some(&v), Some(&pk), Some(&pv)], 3).unwrap();
        // Zero scores: uniform weights. Query 0 sees {0, 3} → 1.5; query 1 sees {0, 3, 6} → 3.
        assert_eq!(y[0].as_f32().unwrap(), &[1.5, 3.0]);
        assert_eq!(y[1].shape, vec![1, 1, 3, 1]);
    }

    #[test]
    fn a_sliding_window_hides_keys_older_than_it() {
        // Past values 0, 10, 20; new 30, 40; zero scores, so each query averages what it sees.
        let q = Tensor::from_f32(DType::F32, vec![1, 1, 2, 1], vec![0., 0.]);
        let k = Tensor::from_f32(DType::F32, vec![1, 1, 2, 1], vec![1., 1.]);
        let v = Tensor::from_f32(DType::F32, vec![1, 1, 2, 1], vec![30., 40.]);
        let pk = Tensor::from_f32(DType::F32, vec![1, 1, 3, 1], vec![1.; 3]);
        let pv = Tensor::from_f32(DType::F32, vec![1, 1, 3, 1], vec![0., 10., 20.]);
        let inputs = [Some(&q), Some(&k), Some(&v), Some(&pk), Some(&pv)];
        let mut a = Attrs::default();
        a.set("window", Attr::Int(2));
        // Query 0 (position 3) sees positions 2, 3; query 1 (position 4) sees 3, 4.
        let y = attention(&op("Attention", &a), &inputs, 1).unwrap();
        assert_eq!(y[0].as_f32().unwrap(), &[25.0, 35.0]);
        // A window longer than the sequence hides nothing: the causal means of 0..=30 and 0..=40.
        a.set("window", Attr::Int(9));
        let y = attention(&op("Attention", &a), &inputs, 1).unwrap();
        assert_eq!(y[0].as_f32().unwrap(), &[15.0, 20.0]);
        a.set("window", Attr::Int(-1));
        assert!(attention(&op("Attention", &a), &inputs, 1).unwrap_err().msg.contains("negative"));
    }
    #[test]
    fn a_sink_joins_the_denominator_and_weights_no_value() {
        // Two heads over one kv head, zero scores over two keys; head 0's sink is ln 2 (weight 2
        // against 1 + 1), head 1 has a sink of −∞ in effect (a very low logit).
        let q = Tensor::from_f32(DType::F32, vec![1, 2, 1, 1], vec![0., 0.]);
        let k = Tensor::from_f32(DType::F32, vec![1, 1, 1, 1], vec![1.]);
        let v = Tensor::from_f32(DType::F32, vec![1, 1, 1, 1], vec![8.]);
        let pk = Tensor::from_f32(DType::F32, vec![1, 1, 1, 1], vec![1.]);
        let pv = Tensor::from_f32(DType::F32, vec![1, 1, 1, 1], vec![4.]);
        let sinks = Tensor::from_f32(DType::F32, vec![2], vec![2f32.ln(), -1e4]);
        let inputs = [Some(&q), Some(&k), Some(&v), Some(&pk), Some(&pv), None, Some(&sinks)];
        let y = attention(&op("Attention", &Attrs::default()), &inputs, 1).unwrap();
        // (4 + 8) / (1 + 1 + 2) = 3; without the sink the mean 6.
        let got = y[0].as_f32().unwrap();
        assert!((got[0] - 3.0).abs() < 1e-6 && (got[1] - 6.0).abs() < 1e-6, "{got:?}");
        let short = Tensor::from_f32(DType::F32, vec![1], vec![0.]);
        let inputs = [Some(&q), Some(&k), Some(&v), Some(&pk), Some(&pv), None, Some(&short)];
        assert!(attention(&op("Attention", &Attrs::default()), &inputs, 1).unwrap_err().msg.contains("sinks"));
    }

    fn delta_net_attrs(scale: Option<f32>) -> Attrs {
        let mut a = Attrs::default();
        a.set("q_heads", Attr::Int(1));
        a.set("kv_heads", Attr::Int(1));
        if let Some(s) = scale {
            a.set("scale", Attr::Float(s));
        }
        a
    }

    #[test]
    fn delta_net_from_a_zero_state_is_the_scaled_delta_outer_product() {
        // One token, S₀ = 0: S₁ = k ⊗ β(v − S₀ᵀk) = β·k vᵀ, y = scale·S₁ᵀq = scale·β·(k·q)·v;
        // k·q = 2·0.5 + 0.25·(−1).
        let row = |v: Vec<f32>| Tensor::from_f32(DType::F32, vec![1, 1, v.len()], v);
        let (q, k, v) = (row(vec![0.5, -1.0]), row(vec![2.0, 0.25]), row(vec![3.0, -4.0, 1.5]));
        let (decay, beta) = (row(vec![-0.7]), row(vec![0.6]));
        let a = delta_net_attrs(Some(0.125));
        let out =
            eval(&op("DeltaNet", &a), &[Some(&q), Some(&k), Some(&v), None, Some(&decay), Some(&beta)], 2).unwrap();
        let kq = 2.0 * 0.5 - 0.25;
        let want: Vec<f32> = [3.0f32, -4.0, 1.5].iter().map(|x| 0.125 * 0.6 * kq * x).collect();
        let got = out[0].as_f32().unwrap();
        assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-6), "{got:?} against {want:?}");
        assert_eq!(out[1].shape, [1, 1, 2, 3]);
    }

    #[test]
    fn delta_net_refuses_a_missing_scale_or_gate_and_causal_conv_other_activations() {
        let t = Tensor::from_f32(DType::F32, vec![1, 1, 2], vec![1.0, 2.0]);
        let g = Tensor::from_f32(DType::F32, vec![1, 1, 1], vec![0.0]);
        let no_scale = delta_net_attrs(None);
        let e = eval(&op("DeltaNet", &no_scale), &[Some(&t), Some(&t), Some(&t), None, Some(&g), Some(&g)], 2);
        assert!(e.unwrap_err().msg.contains("scale must be given"));
        let a = delta_net_attrs(Some(1.0));
        let e = eval(&op("DeltaNet", &a), &[Some(&t), Some(&t), Some(&t), None, None, Some(&g)], 2);
        assert!(e.unwrap_err().msg.contains("decay (4) and beta (5) are required"));
        let mut relu = Attrs::default();
        relu.set("activation", Attr::Str("relu".into()));
        let w = Tensor::from_f32(DType::F32, vec![2, 1, 2], vec![1.0; 4]);
        let x = Tensor::from_f32(DType::F32, vec![1, 2, 1], vec![1.0, 2.0]);
        let e = eval(&op("CausalConv", &relu), &[Some(&x), Some(&w), None, None], 2);
        assert!(e.unwrap_err().msg.contains("activation \"relu\""));
    }

    #[test]
    fn moe_states_that_coded_experts_are_renormalised() {
        let t = Tensor::from_f32(DType::F32, vec![1, 2], vec![1.0, 2.0]);
        let mut a = Attrs::default();
        a.set("k", Attr::Int(1));
        let inputs = [Some(&t), Some(&t), Some(&t), Some(&t), None, Some(&t), Some(&t), None];
        let e = eval(&op("Moe", &a), &inputs, 1).unwrap_err();
        assert!(e.msg.contains("normalize_routing_weights must be 1"), "{}", e.msg);
        let half = [Some(&t), Some(&t), Some(&t), Some(&t), None, Some(&t), None, None];
        let e = eval(&op("Moe", &a), &half, 1).unwrap_err();
        assert!(e.msg.contains("together or not at all"), "{}", e.msg);
    }

    #[test]
    fn moe_adds_the_shared_expert_gated_by_the_sigmoid_of_its_logits() {
        // Two float experts on 2 channels, identity activation: expert 0 doubles x, expert 1
        // triples it. Row 0 routes to expert 0, row 1 to expert 1 (k = 1, weight 1).
        let x = Tensor::from_f32(DType::F32, vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let router = Tensor::from_f32(DType::F32, vec![2, 2], vec![5.0, 0.0, 0.0, 5.0]);
        let eye = [1.0, 0.0, 0.0, 1.0];
        let fc1 = Tensor::from_f32(DType::F32, vec![2, 2, 2], [eye, eye].concat());
        let fc2 = Tensor::from_f32(DType::F32, vec![2, 2, 2], [eye.map(|v| 2.0 * v), eye.map(|v| 3.0 * v)].concat());
        let shared = Tensor::from_f32(DType::F32, vec![2, 2], vec![1.0, 1.0, 8.0, -8.0]);
        // σ(0) = 0.5; σ(ln 3) = 0.75.
        let gate = Tensor::from_f32(DType::F32, vec![2, 1], vec![0.0, 3f32.ln()]);
        let mut a = Attrs::default();
        a.set("k", Attr::Int(1));
        a.set("normalize_routing_weights", Attr::Int(1));
        a.set("activation_type", Attr::Str("identity".into()));
        let routed = [Some(&x), Some(&router), Some(&fc1), None, None, Some(&fc2), None, None];
        let with_shared: Vec<_> = routed.iter().copied().chain([Some(&shared), Some(&gate)]).collect();
        let y = eval(&op("Moe", &a), &with_shared, 1).unwrap();
        let want = [2.0 + 0.5, 4.0 + 0.5, 9.0 + 6.0, 12.0 - 6.0];
        for (g, w) in y[0].as_f32().unwrap().iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{:?} against {want:?}", y[0].as_f32().unwrap());
        }
        let plain = eval(&op("Moe", &a), &routed, 1).unwrap();
        assert_eq!(plain[0].as_f32().unwrap(), &[2.0, 4.0, 9.0, 12.0]);
        let half: Vec<_> = routed.iter().copied().chain([Some(&shared), None]).collect();
        let e = eval(&op("Moe", &a), &half, 1).unwrap_err();
        assert!(e.msg.contains("shared (8) and shared_gate (9)"), "{}", e.msg);
    }
}

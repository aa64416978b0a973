//! Mixture of experts: onnxruntime's MoE (float experts) and QMoE (int4/int8 experts), as the
//! onnxruntime-genai builder emits them for gpt-oss, Qwen3.5-MoE and LFM2-MoE.
//!
//! Each token row (2-D `[tokens, hidden]` or 3-D `[batch, sequence, hidden]` input) is routed
//! independently: the softmax of its router logits over all experts, the `k` largest (ties to
//! the lower expert index), their probabilities as mixing weights — divided by their sum when
//! `normalize_routing_weights` is set, and always for QMoE, whose CPU kernel renormalises the
//! top k whatever the attribute says (measured against onnxruntime 1.32; MoE's honours it). Each
//! chosen expert computes `fc2 · act(fc1 · x + b1) + b2`, and the results are summed with the
//! weights. Activations: `relu`, `gelu` (the tanh approximation, as onnxruntime's CPU kernels
//! compute it), `silu`, `identity`, and `swiglu` on fc1's fused gate/up rows (`swiglu_fusion` 1:
//! interleaved `[g0, l0, g1, l1, ...]`; 2: `[g | l]`): `G · sigmoid(α·G) · (L + β)` with
//! `G = min(g, limit)`, `L = clamp(l, −limit, limit)`. Everything accumulates in f64 and the
//! output is rounded once to the input's dtype.
//!
//! QMoE dequantises its experts as MatMulNBits does: codes packed along K low bits first,
//! `(q − zero_point) · scale` per row (no `block_size`) or per `block_size` run of K, zero points
//! packed like the codes (default 2^(bits−1)), each weight rounded to f32. Blocked 8-bit experts,
//! and blocked 4-bit ones at `accuracy_level` 4, read each GEMM input (the token row, the
//! activated intermediate row) quantised to int8 per block first, as onnxruntime's CPU kernel
//! computes them (with the experts as initializers, which it prepacks; the builder's form): the
//! quantisation MatMulNBits' level 4 uses. The CUDA-only forms
//! (separate fc3 experts, sparse mixer, fp4/fp8 formats, prepacked layouts, mixed widths) are
//! refused by name.

use super::layout::checked_numel;
use super::{float_tensor, int_values, require_float, Ctx, Res};
use crate::dtype::DType;
use crate::tensor::Tensor;

/// What each expert applies between its two projections.
#[derive(Clone, Copy)]
enum Activation {
    Relu,
    Gelu,
    Silu,
    Identity,
    SwiGlu { interleaved: bool, alpha: f64, beta: f64, limit: f64 },
}

impl Activation {
    /// How many fc1 rows each intermediate unit takes.
    fn fusion(self) -> usize {
        if matches!(self, Activation::SwiGlu { .. }) {
            2
        } else {
            1
        }
    }

    /// The intermediate activations from fc1's output `h` (`fusion · inter` values).
    fn apply(self, h: &[f64], out: &mut [f64]) {
        let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
        let inter = out.len();
        for (i, o) in out.iter_mut().enumerate() {
            *o = match self {
                Activation::Relu => h[i].max(0.0),
                Activation::Gelu => {
                    let x = h[i];
                    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
                }
                Activation::Silu => h[i] * sigmoid(h[i]),
                Activation::Identity => h[i],
                Activation::SwiGlu { interleaved, alpha, beta, limit } => {
                    let (g, l) = if interleaved { (h[2 * i], h[2 * i + 1]) } else { (h[i], h[inter + i]) };
                    let (g, l) = (g.min(limit), l.clamp(-limit, limit));
                    g * sigmoid(alpha * g) * (l + beta)
                }
            };
        }
    }
}

/// The activation and routing attributes MoE and QMoE share.
fn read_activation(cx: &Ctx) -> Res<Activation> {
    for name in ["use_sparse_mixer", "swiglu_limit_after_activation"] {
        if cx.attrs().int_or(name, 0)? != 0 {
            bail!("{name} is not supported (onnxruntime implements it on CUDA only)");
        }
    }
    let fusion = cx.attrs().int_or("swiglu_fusion", 0)?;
    Ok(match cx.attrs().str("activation_type")?.unwrap_or("relu") {
        "relu" => Activation::Relu,
        "gelu" => Activation::Gelu,
        "silu" => Activation::Silu,
        "identity" => Activation::Identity,
        "swiglu" if fusion == 1 || fusion == 2 => Activation::SwiGlu {
            interleaved: fusion == 1,
            alpha: cx.attrs().float_or("activation_alpha", 1.0)? as f64,
            beta: cx.attrs().float_or("activation_beta", 0.0)? as f64,
            limit: cx.attrs().float("swiglu_limit")?.map_or(f64::INFINITY, f64::from),
        },
        "swiglu" => bail!("swiglu_fusion {fusion} is not supported: swiglu needs fused gate/up rows (1 or 2)"),
        a => bail!("activation_type {a:?} is not one of relu, gelu, silu, identity, swiglu"),
    })
}

/// The experts' float weights: fc1 `[E, fusion·inter, hidden]`, fc2 `[E, hidden, inter]`.
struct Experts {
    count: usize,
    hidden: usize,
    inter: usize,
    fc1: Vec<f64>,
    b1: Option<Vec<f64>>,
    fc2: Vec<f64>,
    b2: Option<Vec<f64>>,
}

/// The token rows: `[tokens, hidden]` or `[batch, sequence, hidden]`, with one router row each.
fn token_rows(x: &Tensor, router: &Tensor) -> Res<(usize, usize, usize)> {
    require_float(x, "input")?;
    require_float(router, "router_probs")?;
    if !(2..=3).contains(&x.rank()) || x.shape[x.rank() - 1] == 0 {
        bail!("input must be [tokens, hidden] or [batch, sequence, hidden], got {:?}", x.shape);
    }
    let hidden = x.shape[x.rank() - 1];
    let rows = x.numel() / hidden;
    if router.rank() != 2 || router.shape[0] != rows || router.shape[1] == 0 {
        bail!("router_probs must be [{rows}, experts] (one row per token), got {:?}", router.shape);
    }
    Ok((rows, hidden, router.shape[1]))
}

/// A bias `[E, n]`, when given.
fn bias(t: Option<&Tensor>, experts: usize, n: usize, what: &str) -> Res<Option<Vec<f64>>> {
    let Some(t) = t else { return Ok(None) };
    require_float(t, what)?;
    if t.shape != [experts, n] {
        bail!("{what} must be [{experts}, {n}], got {:?}", t.shape);
    }
    Ok(Some(t.to_f64_vec()))
}

/// The k experts of one router row and their mixing weights.
fn route(logits: &[f64], k: usize, normalize: bool) -> Vec<(usize, f64)> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let total: f64 = exp.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| exp[b].total_cmp(&exp[a]).then(a.cmp(&b)));
    let chosen: Vec<(usize, f64)> = order[..k].iter().map(|&e| (e, exp[e] / total)).collect();
    let sum: f64 = chosen.iter().map(|c| c.1).sum();
    chosen.into_iter().map(|(e, w)| (e, if normalize { w / sum } else { w })).collect()
}

/// How the experts compute: their activation, top k, whether the k weights are renormalised, and
/// the block each GEMM input is quantised to int8 in first (QMoE's int8 kernels), if any.
#[derive(Clone, Copy)]
struct Mixing {
    act: Activation,
    k: usize,
    normalize: bool,
    int8_block: Option<usize>,
}

impl Mixing {
    /// A GEMM's input as the experts read it: as computed, or rounded to f32 and quantised to
    /// int8 per block as onnxruntime's int8 kernels do.
    fn gemm_input(&self, v: &[f64]) -> Vec<f64> {
        match self.int8_block {
            Some(block) => {
                let rounded: Vec<f32> = v.iter().map(|&x| x as f32).collect();
                super::quant::int8_blocks(&rounded, v.len(), block)
            }
            None => v.to_vec(),
        }
    }
}

/// Routes every row and sums its experts' outputs.
fn mix(x: &[f64], logits: &[f64], ex: &Experts, m: Mixing) -> Vec<f64> {
    let (h, n1, inter) = (ex.hidden, m.act.fusion() * ex.inter, ex.inter);
    let mut out = vec![0.0; x.len()];
    let (mut up, mut mid) = (vec![0.0; n1], vec![0.0; inter]);
    for (r, row) in x.chunks(h).enumerate() {
        let row = m.gemm_input(row);
        for (e, weight) in route(&logits[r * ex.count..(r + 1) * ex.count], m.k, m.normalize) {
            for (n, u) in up.iter_mut().enumerate() {
                let w = &ex.fc1[(e * n1 + n) * h..][..h];
                *u =
                    w.iter().zip(&row).map(|(a, b)| a * b).sum::<f64>() + ex.b1.as_ref().map_or(0.0, |b| b[e * n1 + n]);
            }
            m.act.apply(&up, &mut mid);
            let mid = m.gemm_input(&mid);
            for (o, y) in out[r * h..(r + 1) * h].iter_mut().enumerate() {
                let w = &ex.fc2[(e * h + o) * inter..][..inter];
                let down =
                    w.iter().zip(&mid).map(|(a, b)| a * b).sum::<f64>() + ex.b2.as_ref().map_or(0.0, |b| b[e * h + o]);
                *y += weight * down;
            }
        }
    }
    out
}

/// The top-k attribute, checked against the expert count.
fn top_k(cx: &Ctx, experts: usize) -> Res<usize> {
    let k = cx.attrs().int_or("k", 1)?;
    if k < 1 || k as usize > experts {
        bail!("k = {k} must be between 1 and the {experts} experts");
    }
    Ok(k as usize)
}

/// MoE: float experts, fc1 `[E, fusion·inter, hidden]`, fc2 `[E, hidden, inter]`.
pub(super) fn moe(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, router) = (cx.input(0, "input")?, cx.input(1, "router_probs")?);
    let (fc1, fc2) = (cx.input(2, "fc1_experts_weights")?, cx.input(4, "fc2_experts_weights")?);
    if cx.opt(6).is_some() || cx.opt(7).is_some() {
        bail!("separate fc3 experts are not supported (onnxruntime's CPU kernel has none either)");
    }
    let act = read_activation(cx)?;
    let (_, hidden, count) = token_rows(x, router)?;
    require_float(fc1, "fc1_experts_weights")?;
    require_float(fc2, "fc2_experts_weights")?;
    let f = act.fusion();
    if fc1.rank() != 3 || fc1.shape[0] != count || fc1.shape[2] != hidden || fc1.shape[1] % f != 0 {
        bail!("fc1_experts_weights must be [{count}, {f} * inter, {hidden}], got {:?}", fc1.shape);
    }
    let inter = fc1.shape[1] / f;
    if fc2.shape != [count, hidden, inter] {
        bail!("fc2_experts_weights must be [{count}, {hidden}, {inter}], got {:?}", fc2.shape);
    }
    let experts = Experts {
        count,
        hidden,
        inter,
        fc1: fc1.to_f64_vec(),
        b1: bias(cx.opt(3), count, f * inter, "fc1_experts_bias")?,
        fc2: fc2.to_f64_vec(),
        b2: bias(cx.opt(5), count, hidden, "fc2_experts_bias")?,
    };
    let normalize = cx.attrs().int_or("normalize_routing_weights", 0)? != 0;
    let mixing = Mixing { act, k: top_k(cx, count)?, normalize, int8_block: None };
    let y = mix(&x.to_f64_vec(), &router.to_f64_vec(), &experts, mixing);
    Ok(vec![float_tensor(x.dtype, x.shape.clone(), y)])
}

/// One quantised projection's storage: `[E, n, k·bits/8]` codes, scales and zero points.
struct Quantized<'t> {
    codes: &'t Tensor,
    scales: Option<&'t Tensor>,
    zero_points: Option<&'t Tensor>,
    what: &'static str,
}

/// The QMoE attributes that select formats or layouts other than raw int4/int8.
fn qmoe_bits(cx: &Ctx) -> Res<usize> {
    let bits = cx.attrs().int_or("expert_weight_bits", 4)?;
    if bits != 4 && bits != 8 {
        bail!("expert_weight_bits {bits} is not supported (4 or 8; 2 and 3 are CUDA-only)");
    }
    for name in ["fc1_expert_weight_bits", "fc2_expert_weight_bits", "fc3_expert_weight_bits"] {
        if cx.attrs().int(name)?.is_some_and(|b| b != bits) {
            bail!("{name} differs from expert_weight_bits {bits}: mixed widths are CUDA-only");
        }
    }
    if let Some(q) = cx.attrs().str("quant_type")?.filter(|&q| q != "int") {
        bail!("quant_type {q:?} is not supported (only \"int\")");
    }
    let prepacked = cx.attrs().int_or("weights_prepacked", -1)?;
    if prepacked == 1 {
        bail!("weights_prepacked = 1 (an execution provider's own layout) is not supported");
    }
    Ok(bits as usize)
}

/// Dequantises one projection to `[E, n, k]` f64 values.
fn dequantize(q: &Quantized, experts: usize, n: usize, k: usize, bits: usize, block: Option<usize>) -> Res<Vec<f64>> {
    let what = q.what;
    if q.codes.dtype != DType::U8 || q.codes.shape != [experts, n, k * bits / 8] || !(k * bits).is_multiple_of(8) {
        bail!(
            "{what} weights must be uint8 [{experts}, {n}, {}], got {} {:?}",
            k * bits / 8,
            q.codes.dtype,
            q.codes.shape
        );
    }
    let blocks = block.map_or(1, |b| k / b);
    let block_len = block.unwrap_or(k);
    let Some(scales) = q.scales else { bail!("{what} scales are required") };
    require_float(scales, "scales")?;
    let scale_shape = if block.is_some() { vec![experts, n, blocks] } else { vec![experts, n] };
    if scales.shape != scale_shape {
        bail!("{what} scales must be {scale_shape:?}, got {:?}", scales.shape);
    }
    let zp = zero_points(q, experts, n, blocks, bits, block.is_some())?;
    let (codes, s) = (int_values(q.codes, "weights")?, scales.to_f32_vec());
    let row_bytes = k * bits / 8;
    let mut w = Vec::with_capacity(experts * n * k);
    for row in 0..experts * n {
        for kk in 0..k {
            let bit = kk * bits;
            let code = (codes[row * row_bytes + bit / 8] >> (bit % 8)) & ((1 << bits) - 1);
            let blk = row * blocks + kk / block_len;
            w.push(f64::from((code as f32 - zp(row, kk / block_len)) * s[blk]));
        }
    }
    Ok(w)
}

/// The zero point of (row, block), from packed uint8 zero points or the default 2^(bits−1).
fn zero_points<'a>(
    q: &'a Quantized,
    experts: usize,
    n: usize,
    blocks: usize,
    bits: usize,
    blocked: bool,
) -> Res<Box<dyn Fn(usize, usize) -> f32 + 'a>> {
    let Some(z) = q.zero_points else { return Ok(Box::new(move |_, _| (1 << (bits - 1)) as f32)) };
    let shape =
        if blocked { vec![experts, n, (blocks * bits).div_ceil(8)] } else { vec![experts, (n * bits).div_ceil(8)] };
    if z.dtype != DType::U8 || z.shape != shape {
        bail!("{} zero points must be uint8 {shape:?}, got {} {:?}", q.what, z.dtype, z.shape);
    }
    let codes = int_values(z, "zero points")?;
    let row_bytes = *shape.last().unwrap_or(&1);
    Ok(Box::new(move |row, blk| {
        // Per-channel zero points are packed along the rows of each expert, blocked ones along
        // the blocks of each row.
        let (base, index) = if blocked { (row * row_bytes, blk) } else { ((row / n) * row_bytes, row % n) };
        let bit = index * bits;
        ((codes[base + bit / 8] >> (bit % 8)) & ((1 << bits) - 1)) as f32
    }))
}

/// The `block_size` attribute: `None` for per-row scales.
fn qmoe_block(cx: &Ctx, hidden: usize, inter: usize) -> Res<Option<usize>> {
    match cx.attrs().int("block_size")? {
        None | Some(0) => Ok(None),
        Some(b)
            if b >= 16
                && b.count_ones() == 1
                && hidden.is_multiple_of(b as usize)
                && inter.is_multiple_of(b as usize) =>
        {
            Ok(Some(b as usize))
        }
        Some(b) => bail!("block_size {b} must be a power of two >= 16 dividing hidden {hidden} and inter {inter}"),
    }
}

/// QMoE: int4/int8 experts, fc1 `[E, fusion·inter, hidden·bits/8]`, fc2 `[E, hidden, inter·bits/8]`.
pub(super) fn qmoe(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, router) = (cx.input(0, "input")?, cx.input(1, "router_probs")?);
    let (fc1, fc2) = (cx.input(2, "fc1_experts_weights")?, cx.input(5, "fc2_experts_weights")?);
    if cx.opt(8).is_some() || cx.opt(9).is_some() || cx.opt(10).is_some() || cx.opt(13).is_some() {
        bail!("separate fc3 experts are not supported (onnxruntime's CPU kernel has none either)");
    }
    let (act, bits) = (read_activation(cx)?, qmoe_bits(cx)?);
    let (_, hidden, count) = token_rows(x, router)?;
    let f = act.fusion();
    if fc1.rank() != 3 || fc2.rank() != 3 || fc1.shape[1] % f != 0 || fc2.shape[0] != count {
        bail!(
            "fc1 {:?} and fc2 {:?} must be [E, {f} * inter, K * {bits} / 8] and [E, hidden, inter * {bits} / 8]",
            fc1.shape,
            fc2.shape
        );
    }
    let inter = fc1.shape[1] / f;
    let block = qmoe_block(cx, hidden, inter)?;
    checked_numel(&[count, f * inter + hidden, hidden.max(inter)])?;
    let q1 = Quantized { codes: fc1, scales: cx.opt(3), zero_points: cx.opt(11), what: "fc1" };
    let q2 = Quantized { codes: fc2, scales: cx.opt(6), zero_points: cx.opt(12), what: "fc2" };
    let experts = Experts {
        count,
        hidden,
        inter,
        fc1: dequantize(&q1, count, f * inter, hidden, bits, block)?,
        b1: bias(cx.opt(4), count, f * inter, "fc1_experts_bias")?,
        fc2: dequantize(&q2, count, hidden, inter, bits, block)?,
        b2: bias(cx.opt(7), count, hidden, "fc2_experts_bias")?,
    };
    // onnxruntime's CPU kernel runs blocked 8-bit experts, and blocked 4-bit ones at accuracy
    // level 4, with int8 activations.
    let int8 = block.is_some() && (bits == 8 || cx.attrs().int_or("accuracy_level", 0)? == 4);
    let mixing = Mixing { act, k: top_k(cx, count)?, normalize: true, int8_block: block.filter(|_| int8) };
    let y = mix(&x.to_f64_vec(), &router.to_f64_vec(), &experts, mixing);
    Ok(vec![float_tensor(x.dtype, x.shape.clone(), y)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;
    use crate::dtype::DType;
    use crate::tensor::Tensor;

    /// Two experts that scale the token by 1 and by 3 (identity activation, one unit each).
    fn scaling_experts() -> (Tensor, Tensor) {
        (f32t(&[2, 1, 1], &[1.0, 3.0]), f32t(&[2, 1, 1], &[1.0, 1.0]))
    }

    #[test]
    fn routing_weights_are_the_softmax_of_all_experts_renormalised_on_request() {
        let (x, logits) = (f32t(&[1, 1], &[2.0]), f32t(&[1, 2], &[0.0, 2.0f32.ln()]));
        let (fc1, fc2) = scaling_experts();
        let run = |k: i64, normalize: i64| {
            let a = [
                ("k", Attr::Int(k)),
                ("normalize_routing_weights", Attr::Int(normalize)),
                ("activation_type", Attr::Str("identity".into())),
            ];
            f32s(&run_ms("MoE", &a, &[Some(&x), Some(&logits), Some(&fc1), None, Some(&fc2)], 1).unwrap()[0])
        };
        // Softmax [1/3, 2/3]: top 1 is the second expert (6), weighted 2/3 or renormalised to 1.
        assert_close(&run(1, 0), &[4.0], 1e-6);
        assert_close(&run(1, 1), &[6.0], 1e-6);
        assert_close(&run(2, 0), &[2.0 / 3.0 + 4.0], 1e-6);
    }

    #[test]
    fn malformed_moe_is_an_error_naming_the_problem() {
        let (x, logits) = (f32t(&[2, 1], &[1.0, 2.0]), f32t(&[2, 2], &[0.0; 4]));
        let (fc1, fc2) = scaling_experts();
        let moe = |a: &[(&str, Attr)], inputs: &[Option<&Tensor>]| err_msg(run_ms("MoE", a, inputs, 1));
        let ok = [Some(&x), Some(&logits), Some(&fc1), None, Some(&fc2)];
        assert!(moe(&[("k", Attr::Int(3))], &ok).contains("k = 3 must be between 1 and the 2 experts"));
        assert!(moe(&[("use_sparse_mixer", Attr::Int(1))], &ok).contains("use_sparse_mixer"));
        let swiglu0 = [("activation_type", Attr::Str("swiglu".into())), ("swiglu_fusion", Attr::Int(0))];
        assert!(moe(&swiglu0, &ok).contains("swiglu_fusion 0 is not supported"));
        let one_row = f32t(&[1, 2], &[0.0; 2]);
        assert!(moe(&[], &[Some(&x), Some(&one_row), Some(&fc1), None, Some(&fc2)])
            .contains("router_probs must be [2, experts]"));
        let fc3 = [Some(&x), Some(&logits), Some(&fc1), None, Some(&fc2), None, Some(&fc1)];
        assert!(moe(&[], &fc3).contains("fc3"));
        assert!(moe(&[], &[Some(&x), Some(&logits), Some(&fc2), None, Some(&x)])
            .contains("fc2_experts_weights must be [2, 1, 1]"));
    }

    #[test]
    fn malformed_qmoe_is_an_error_naming_the_problem() {
        let (x, logits) = (f32t(&[1, 32], &[0.5; 32]), f32t(&[1, 2], &[0.0; 2]));
        let codes = |n: usize, k: usize| typed(DType::U8, &[2, n, k], &vec![0x88; 2 * n * k]);
        let (w1, w2) = (codes(32, 16), codes(32, 16));
        let (s1, s2) = (f32t(&[2, 32], &[0.1; 64]), f32t(&[2, 32], &[0.1; 64]));
        let qmoe = |a: &[(&str, Attr)], inputs: &[Option<&Tensor>]| err_msg(run_ms("QMoE", a, inputs, 1));
        let ok = [Some(&x), Some(&logits), Some(&w1), Some(&s1), None, Some(&w2), Some(&s2)];
        assert!(run_ms("QMoE", &[], &ok, 1).is_ok());
        assert!(qmoe(&[("expert_weight_bits", Attr::Int(2))], &ok).contains("expert_weight_bits 2 is not supported"));
        assert!(qmoe(&[("quant_type", Attr::Str("fp4".into()))], &ok).contains("quant_type \"fp4\""));
        assert!(qmoe(&[("block_size", Attr::Int(24))], &ok).contains("block_size 24 must be a power of two"));
        assert!(qmoe(&[("weights_prepacked", Attr::Int(1))], &ok).contains("weights_prepacked = 1"));
        let block_scales = [Some(&x), Some(&logits), Some(&w1), Some(&s1), None, Some(&w2), Some(&s2)];
        assert!(qmoe(&[("block_size", Attr::Int(16))], &block_scales).contains("fc1 scales must be [2, 32, 2]"));
        let floats = f32t(&[2, 32, 16], &[0.0; 1024]);
        let float_codes = [Some(&x), Some(&logits), Some(&floats), Some(&s1), None, Some(&w2), Some(&s2)];
        assert!(qmoe(&[], &float_codes).contains("fc1 weights must be uint8 [2, 32, 16]"));
        let zp = typed(DType::U8, &[2, 3], &[0x88; 6]);
        let with_zp = [
            Some(&x),
            Some(&logits),
            Some(&w1),
            Some(&s1),
            None,
            Some(&w2),
            Some(&s2),
            None,
            None,
            None,
            None,
            Some(&zp),
        ];
        assert!(qmoe(&[], &with_zp).contains("fc1 zero points must be uint8 [2, 16]"));
    }
}

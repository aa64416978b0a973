//! MoE (f32 experts) and QMoE (int4/int8 experts as the builder writes them: blocked scales, no
//! zero points), and npuc's Moe (QMoE's layout, float experts without scales), their experts
//! read in place from the bundle: code experts as one WGemm weight per projection (packed at
//! compile time, or at load from an older bundle) when each expert's rows are whole panels. The evaluator's semantics
//! (`ir::eval::moe`): softmax routing, top k, the k weights renormalised when asked (always for
//! QMoE), and QMoE's int8 GEMM inputs for blocked 8-bit experts and blocked 4-bit ones at
//! `accuracy_level` 4. The CUDA-only forms and explicit zero points are refused by name. npuc's
//! Moe may carry a shared expert's output and gate logits (inputs 8 and 9), added after the routed
//! experts.

use super::{input, output, Builder};
use crate::bundle::Dtype;
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::weights::weight_name;
use crate::exec::plan::{ExpertActivation, ExpertWeights, Loc, MoeExperts, MoeMixing, Op, WGemmStore};
use crate::exec::program::NodeInfo;
use crate::kernels::wgemm::{pack_wgemm, MatMulNBits, NBitsZeroPoints, PANEL};

fn activation(node: &NodeInfo) -> Result<ExpertActivation, ExecError> {
    let fail = node_fail(node);
    for name in ["use_sparse_mixer", "swiglu_limit_after_activation"] {
        if node.attr_i64(name).unwrap_or(0) != 0 {
            return Err(fail(format!("{name} is not supported (CUDA only)")));
        }
    }
    let fusion = node.attr_i64("swiglu_fusion").unwrap_or(0);
    Ok(match node.attr_str("activation_type").unwrap_or("relu") {
        "relu" => ExpertActivation::Relu,
        "gelu" => ExpertActivation::Gelu,
        "silu" => ExpertActivation::Silu,
        "identity" => ExpertActivation::Identity,
        "swiglu" if fusion == 1 || fusion == 2 => ExpertActivation::SwiGlu {
            interleaved: fusion == 1,
            alpha: node.attr_f32("activation_alpha").unwrap_or(1.0),
            beta: node.attr_f32("activation_beta").unwrap_or(0.0),
            limit: node.attr_f32("swiglu_limit").unwrap_or(f32::INFINITY),
        },
        a => return Err(fail(format!("activation_type {a:?} with swiglu_fusion {fusion} is not supported"))),
    })
}

/// An f32 weight input read in place, of `len` values.
fn f32_weight<'b>(b: &Builder<'_, 'b>, node: &NodeInfo, slot: usize, len: usize) -> Result<&'b [f32], ExecError> {
    let v = input(node, slot)?;
    match b.locs[v] {
        Loc::Weight(i) if b.views[i].dtype == Dtype::F32 && b.weights[i].len() == len => Ok(b.weights[i]),
        _ => {
            Err(node_fail(node)(format!("input {slot} (`{}`) is not an f32 weight of {len} values", b.values[v].name)))
        }
    }
}

fn optional_weight<'b>(
    b: &Builder<'_, 'b>,
    node: &NodeInfo,
    slot: usize,
    len: usize,
) -> Result<Option<&'b [f32]>, ExecError> {
    node.input(slot).map(|_| f32_weight(b, node, slot, len)).transpose()
}

/// The routing inputs and sizes: token rows of `hidden`, router rows of `experts`.
fn routing(b: &Builder<'_, '_>, node: &NodeInfo) -> Result<(usize, usize, usize, usize), ExecError> {
    let (x, router) = (b.f32_input(node, 0)?, b.f32_input(node, 1)?);
    let last = |v: usize| b.dims(v).last().copied().flatten();
    match (last(x), last(router)) {
        (Some(h), Some(e)) if h > 0 && e > 0 => Ok((x, router, h, e)),
        _ => Err(node_fail(node)("input and router_probs need fixed hidden and expert sizes".to_string())),
    }
}

fn top_k(node: &NodeInfo, experts: usize) -> Result<usize, ExecError> {
    match node.attr_i64("k").unwrap_or(1) {
        k if k >= 1 && k as usize <= experts => Ok(k as usize),
        k => Err(node_fail(node)(format!("k = {k} must be between 1 and the {experts} experts"))),
    }
}

fn push_moe<'b>(
    b: &mut Builder<'_, 'b>,
    n: usize,
    node: &NodeInfo,
    experts: MoeExperts<'b>,
    mixing: MoeMixing,
) -> Result<(), ExecError> {
    let (x, router, _, _) = routing(b, node)?;
    let shared = shared_expert(b, node)?;
    let out = output(node, 0)?;
    b.fresh(out);
    b.moe.push(experts);
    b.push(n, Op::Moe { x, router, experts: b.moe.len() - 1, mixing, shared, out });
    Ok(())
}

/// npuc's Moe with a shared expert: its output rows (input 8) and their gate logits (input 9).
fn shared_expert(b: &Builder<'_, '_>, node: &NodeInfo) -> Result<Option<(usize, usize)>, ExecError> {
    if node.op != "npuc::Moe" {
        return Ok(None);
    }
    match (node.input(8), node.input(9)) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Ok(Some((b.f32_input(node, 8)?, b.f32_input(node, 9)?))),
        _ => Err(node_fail(node)("shared (8) and shared_gate (9) are given together or not at all".to_string())),
    }
}

pub(super) fn moe(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    if node.input(6).is_some() || node.input(7).is_some() {
        return Err(node_fail(node)("separate fc3 experts are not supported".to_string()));
    }
    float_experts(b, n, node, FloatSlots { fc1: 2, b1: 3, fc2: 4, b2: 5 })
}

/// npuc's Moe: QMoE's layout, float experts when it has no scales (inputs 3 and 6).
pub(super) fn fused_moe(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    match (node.input(3), node.input(6)) {
        (Some(_), Some(_)) => qmoe(b, n, node),
        (None, None) => float_experts(b, n, node, FloatSlots { fc1: 2, b1: 4, fc2: 5, b2: 7 }),
        _ => Err(node_fail(node)("fc1_scales and fc2_scales are given together or not at all".to_string())),
    }
}

/// Where a node holds its float experts and biases.
struct FloatSlots {
    fc1: usize,
    b1: usize,
    fc2: usize,
    b2: usize,
}

fn float_experts(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo, slots: FloatSlots) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let act = activation(node)?;
    let (_, _, hidden, count) = routing(b, node)?;
    let fc1 = input(node, slots.fc1)?;
    let f = act.fusion();
    let rows1 = match b.dims(fc1)[..] {
        [Some(e), Some(r), Some(h)] if e == count && h == hidden && r % f == 0 && r > 0 => r,
        _ => return Err(fail(format!("fc1_experts_weights is not [{count}, {f}·inter, {hidden}]"))),
    };
    let inter = rows1 / f;
    let experts = MoeExperts {
        count,
        hidden,
        inter,
        fc1: ExpertWeights::F32(f32_weight(b, node, slots.fc1, count * rows1 * hidden)?),
        b1: optional_weight(b, node, slots.b1, count * rows1)?,
        fc2: ExpertWeights::F32(f32_weight(b, node, slots.fc2, count * hidden * inter)?),
        b2: optional_weight(b, node, slots.b2, count * hidden)?,
    };
    let normalize = node.attr_i64("normalize_routing_weights").unwrap_or(0) != 0;
    let mixing = MoeMixing { act, k: top_k(node, count)?, normalize, int8_block: None };
    push_moe(b, n, node, experts, mixing)
}

/// One QMoE projection: its codes `[E, n, k·bits/8]` with blocked scales `[E, n, k/block]`.
#[derive(Clone, Copy)]
struct Projection {
    codes: usize,
    scales: usize,
    count: usize,
    rows: usize,
    k: usize,
    bits: usize,
    block: usize,
}

/// A QMoE projection as the WGemm kernels read it — packed at compile time (read in place), or
/// packed here when each expert is whole panels — else its codes and scales read in place.
fn codes<'b>(b: &mut Builder<'_, 'b>, node: &NodeInfo, p: Projection) -> Result<ExpertWeights<'b>, ExecError> {
    let fail = node_fail(node);
    let (program, layouts) = (b.cx.program, b.cx.layouts);
    if let Some(layout) = weight_name(program, node, p.codes).and_then(|s| layouts.wgemm.get(s)) {
        let fits = (layout.k, layout.n, layout.bits, layout.block_size) == (p.k, p.count * p.rows, p.bits, p.block)
            && p.rows.is_multiple_of(PANEL)
            && layout.zero_points.is_none()
            && weight_name(program, node, p.scales) == Some(layout.scales.as_str());
        if !fits {
            return Err(fail(format!(
                "packed experts `{}` (K={} N={} {}-bit, blocks of {}, scales `{}`) are not the node's {} experts of {}×{} in blocks of {}",
                layout.source, layout.k, layout.n, layout.bits, layout.block_size, layout.scales, p.count, p.rows, p.k, p.block
            )));
        }
        let store = b.mapped_wgemm(layout)?;
        return Ok(ExpertWeights::Packed { store, bytes: b.packed[store].weights().bytes() });
    }
    let v = input(node, p.codes)?;
    let bytes = match b.locs[v] {
        Loc::Weight(i)
            if b.views[i].dtype == Dtype::U8 && b.views[i].bytes.len() == p.count * p.rows * p.k * p.bits / 8 =>
        {
            b.views[i].bytes
        }
        _ => {
            return Err(fail(format!(
                "input {} is not u8 codes [{}, {}, {}]",
                p.codes,
                p.count,
                p.rows,
                p.k * p.bits / 8
            )))
        }
    };
    let scales = f32_weight(b, node, p.scales, p.count * p.rows * (p.k / p.block))?;
    if p.rows.is_multiple_of(PANEL) && p.block.is_multiple_of(16) {
        let src = MatMulNBits {
            k: p.k,
            n: p.count * p.rows,
            bits: p.bits,
            block_size: p.block,
            b: bytes,
            scales,
            zero_points: NBitsZeroPoints::Default,
        };
        b.packed.push(WGemmStore::PackedAtLoad(pack_wgemm(&src).map_err(|e| fail(e.to_string()))?));
        let store = b.packed.len() - 1;
        return Ok(ExpertWeights::Packed { store, bytes: b.packed[store].weights().bytes() });
    }
    Ok(ExpertWeights::Codes { codes: bytes, scales, bits: p.bits, block: p.block })
}

pub(super) fn qmoe(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    // QMoE's inputs 8 to 13; npuc's Moe (`fused_moe`) has its shared expert at 8 and 9.
    let first = if node.op == "npuc::Moe" { 10 } else { 8 };
    if (first..14).any(|s| node.input(s).is_some()) {
        return Err(fail("fc3 experts and explicit zero points are not supported".to_string()));
    }
    let bits = node.attr_i64("expert_weight_bits").unwrap_or(4) as usize;
    if !(bits == 4 || bits == 8) || node.attr_str("quant_type").is_some_and(|q| q != "int") {
        return Err(fail(format!("{bits}-bit experts are not supported (int4 and int8 are)")));
    }
    let act = activation(node)?;
    let (_, _, hidden, count) = routing(b, node)?;
    let f = act.fusion();
    let rows1 = match b.dims(input(node, 2)?)[..] {
        [Some(e), Some(r), Some(kb)] if e == count && kb * 8 == hidden * bits && r % f == 0 && r > 0 => r,
        _ => return Err(fail(format!("fc1 codes are not [{count}, {f}·inter, {}]", hidden * bits / 8))),
    };
    let inter = rows1 / f;
    let block = match node.attr_i64("block_size").unwrap_or(0) {
        0 => None,
        bs if bs >= 16 && (bs as usize).is_power_of_two() && hidden % bs as usize == 0 && inter % bs as usize == 0 => {
            Some(bs as usize)
        }
        bs => return Err(fail(format!("block_size {bs} must be a power of two >= 16 dividing {hidden} and {inter}"))),
    };
    let fc1 = Projection { codes: 2, scales: 3, count, rows: rows1, k: hidden, bits, block: block.unwrap_or(hidden) };
    let fc2 = Projection { codes: 5, scales: 6, count, rows: hidden, k: inter, bits, block: block.unwrap_or(inter) };
    let experts = MoeExperts {
        count,
        hidden,
        inter,
        fc1: codes(b, node, fc1)?,
        b1: optional_weight(b, node, 4, count * rows1)?,
        fc2: codes(b, node, fc2)?,
        b2: optional_weight(b, node, 7, count * hidden)?,
    };
    let int8 = block.is_some() && (bits == 8 || node.attr_i64("accuracy_level").unwrap_or(0) == 4);
    let mixing = MoeMixing { act, k: top_k(node, count)?, normalize: true, int8_block: block.filter(|_| int8) };
    push_moe(b, n, node, experts, mixing)
}

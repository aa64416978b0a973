//! Rule family `weight-only`: matrix products with weight-only quantised weights become
//! `npuc::WGemm`, whose weights stay packed codes and are never expanded to float.
//!
//! Identity: `WGemm{K,N,bits,block_size}(a, w, scales[, zero_points])` is MatMulNBits over the
//! same operands (see `ir::fused`). Spellings recognised:
//! - com.microsoft `MatMulNBits(a, B, scales[, zero_points])`, written by onnxruntime-genai's
//!   builder (4-bit projections and lm_head; block 32 symmetric by default, block 128 with zero
//!   points on request). K, N, bits and block_size
//!   carry over, and `accuracy_level` when it is 4: onnxruntime then quantises the activations to
//!   int8 per block before the product (see `ir::eval` MatMulNBits), which is what the file asks
//!   to compute; other levels only pick a float kernel and are dropped.
//! - packed projections. Output column n of MatMulNBits reads only row n of B, scales and zero
//!   points, so a product over N = n₀ + n₁ + … rows equals the products over row slices, side by
//!   side. The builder packs Q/K/V: for most models the packed product is GroupQueryAttention's
//!   packed query; for Qwen3 a `Split` along the last axis cuts it before the q/k norms. For
//!   both the e-graph also gets the per-projection form: one WGemm per part over `Slice` views of
//!   B, scales and zero points (a Slice of a weight with constant bounds: the bounds describe the
//!   view, no bytes are copied). For a Split, output i of the Split is WGemm i; for packed QKV the
//!   packed product is `Concat(WGemm_q, WGemm_k, WGemm_v)` along the last axis, cut at
//!   num_heads·D and kv_num_heads·D (D = N / (num_heads + 2·kv_num_heads)) read from the
//!   GroupQueryAttention that consumes it.
//!   The cost model decides. The host model (`saturate::HostCost`: a fused op costs 1, another op
//!   2; the costliest path decides, the tree sum breaks ties) splits a Split's packed product and
//!   keeps packed Q/K/V packed. Per-projection WGemms over weight Slices put 1 on the activation's
//!   path (the Slices hang off weights, beside it) against 3 for WGemm + Split, and the Split, a
//!   copy of the activations, disappears; one packed WGemm (1) beats a Concat of three (3), whose
//!   Concat would be such a copy. So Qwen3's split q|k|v becomes three WGemms over views of the
//!   packed weight, and the other builders' q|k|v stays one WGemm feeding GroupQueryAttention.
//! - blocked DequantizeLinear of 4-bit (or 8-bit) codes (ai.onnx opset 21: [K, N] int4/uint4
//!   codes, `axis=0`, `block_size=b`, scales and zero points [K/b, N]) feeding a MatMul's weight
//!   side, as Quark and onnxruntime's 4-bit quantiser in QDQ mode write it (no corpus entry does):
//!   WGemm{bits, block_size=b} over the codes in MatMulNBits' layout, built lazily from the codes by
//!   compile-time ops (Transpose to [N, K], Cast to int32, offset signed codes by 2^(bits−1),
//!   Reshape to [N, K/b, b/2, 2], weigh the pair (1, 16), ReduceSum the pair, Cast to uint8), the
//!   transposed scales, and the transposed zero points as floats offset alike (signed codes without
//!   zero points need none: MatMulNBits' default 2^(bits−1) is the offset; unsigned ones get a
//!   zero). No constant is materialised in the e-graph: the repacked codes are computed once by
//!   whichever later pass folds compile-time subgraphs. Under the host cost model the repacking
//!   lies beside the activation's path, so the WGemm wins wherever that path is the longer one:
//!   inside a model, everywhere but in a product that reads a graph input directly.
//! - GatherBlockQuantized: genai's embedding is already a quantised gather, reading the lm_head's
//!   packed codes (through a Reshape) and scales; it is left as is, and keeps sharing them with
//!   the lm_head's WGemm.
//!
//! Declined, with the reason recorded: MatMulNBits with g_idx or a bias, or with bits other than 4
//! and 8; blocked DequantizeLinear whose codes are computed at run time, whose blocks run along N,
//! or whose K is not a whole number of blocks; 4-bit codes quantised per tensor or per column.

use crate::apply::{no_match, Computed, Decline, Fold, Folded};
use crate::cond::var;
use crate::egraph_ops::{
    add_const, add_typed, attrs, dtype, i64s, is_absent, is_compile_time_expr, known_shape, node_attrs,
    nodes_with_children, onnx, rank, union,
};
use crate::Rewrite;
use egg::{rewrite, Id, Subst, Symbol, Var};
use ir::egraph::{EGraph, ENode, Head, TypeInfo};
use ir::{Attr, Attrs, DType, Dim, Domain, Tensor};

/// The family's rules.
#[rustfmt::skip]
pub fn rules() -> Vec<Rewrite> {
    vec![
        // MatMulNBits(a, B, s) = WGemm{K,N,bits,block_size}(a, B, s)
        rewrite!("weight-only-matmulnbits";
            "(com.microsoft::MatMulNBits ?a ?w ?s)" => { ToWGemm::new(&[]) }),
        // MatMulNBits(a, B, s, z) = WGemm{K,N,bits,block_size}(a, B, s, z)
        rewrite!("weight-only-matmulnbits-zero-points";
            "(com.microsoft::MatMulNBits ?a ?w ?s ?z)" => { ToWGemm::new(&["?z"]) }),
        // MatMulNBits(a, B, s, z, g_idx) = WGemm{…}(a, B, s, z) when g_idx is omitted
        rewrite!("weight-only-matmulnbits-g-idx";
            "(com.microsoft::MatMulNBits ?a ?w ?s ?z ?g)" => { ToWGemm::new(&["?z", "?g"]) }),
        // MatMulNBits(a, B, s, z, g_idx, bias) = WGemm{…}(a, B, s, z) when g_idx and bias are omitted
        rewrite!("weight-only-matmulnbits-bias";
            "(com.microsoft::MatMulNBits ?a ?w ?s ?z ?g ?bias)" => { ToWGemm::new(&["?z", "?g", "?bias"]) }),
        // Split(MatMulNBits(a, B, …), sizes) along N: output i = WGemm(a, B[rows i], s[rows i], z[rows i])
        rewrite!("weight-only-split-packed";
            "(Split ?packed ?sizes)" => { Computed::new(SplitPacked { sizes: Some(var("?sizes")) }) }),
        // the same for a Split into equal parts
        rewrite!("weight-only-split-packed-equal";
            "(Split ?packed)" => { Computed::new(SplitPacked { sizes: None }) }),
        // GroupQueryAttention(MatMulNBits(a, B, …) packed q|k|v, …): the packed product = Concat(q, k, v WGemms)
        rewrite!("weight-only-split-packed-qkv";
            "(com.microsoft::GroupQueryAttention ?qkv _ _ ?pk ?pv ?seqlens ?total ?cos ?sin)" => { Computed::new(SplitPackedQkv) }),
        // the same without GroupQueryAttention's rotary caches
        rewrite!("weight-only-split-packed-qkv-no-rotary";
            "(com.microsoft::GroupQueryAttention ?qkv _ _ ?pk ?pv ?seqlens ?total)" => { Computed::new(SplitPackedQkv) }),
        // MatMul(a, DQ(w, s, z){axis=0, block_size=b}) = WGemm{bits, block_size=b}(a, pack(wᵀ), sᵀ, zᵀ)
        rewrite!("weight-only-blocked-dequantize";
            "(MatMul ?a (DequantizeLinear ?w ?s ?z))" => { Computed::new(FromBlockedDequantize { zero_point: true }) }),
        // MatMul(a, DQ(w, s){axis=0, block_size=b}) = WGemm{bits, block_size=b}(a, pack(wᵀ), sᵀ[, 0])
        rewrite!("weight-only-blocked-dequantize-symmetric";
            "(MatMul ?a (DequantizeLinear ?w ?s))" => { Computed::new(FromBlockedDequantize { zero_point: false }) }),
    ]
}

/// Adds `n`, giving its class the type `dtype[shape]` when inference has none for it.
fn add_shaped(egraph: &mut EGraph, n: ENode, dtype: DType, shape: &[usize]) -> Id {
    add_typed(egraph, n, TypeInfo { dtype, shape: shape.iter().map(|&d| Dim::known(d as i64)).collect() })
}

/// A weight-only product WGemm can take: MatMulNBits' operands and attributes.
#[derive(Clone)]
struct Packed {
    a: Id,
    w: Id,
    scales: Id,
    zero_points: Option<Id>,
    k: usize,
    n: usize,
    bits: i64,
    block: i64,
    /// MatMulNBits' `accuracy_level`: 4 makes the activations int8 per block.
    accuracy_level: i64,
}

/// Why a weight-only product does not fold into a WGemm: the decline reason its rule records.
#[derive(Debug, thiserror::Error)]
enum NotWGemm {
    #[error("MatMulNBits with g_idx (act-order): WGemm's blocks are contiguous along K")]
    ActOrder,
    #[error("MatMulNBits with a bias input: not folded into WGemm")]
    Bias,
    #[error("{0}-bit MatMulNBits: WGemm takes 4- and 8-bit codes")]
    Bits(i64),
    #[error("MatMulNBits without K, N and block_size")]
    MissingSizes,
    #[error("MatMulNBits over a non-float activation")]
    NonFloatActivation,
    #[error("MatMulNBits with K={k}, N={n}")]
    BadSizes { k: i64, n: i64 },
    #[error("Split of a packed product along axis {0}, not along its N axis")]
    SplitAxis(i64),
    #[error("the Split's outputs do not partition the {0} packed columns")]
    SplitParts(usize),
    #[error("4-bit weight codes quantised per tensor or per column: WGemm folds DequantizeLinear blocked along K")]
    NotBlocked,
    #[error("the weight codes are computed at run time: WGemm needs compile-time codes")]
    RunTimeCodes,
    #[error("the blocked weight is not a [K, N] matrix of known shape")]
    NotAMatrix,
    #[error("blocks of {block} run along N (axis {axis}); MatMulNBits blocks run along K")]
    BlocksAlongN { block: usize, axis: i64 },
    #[error("K = {k} is not a whole number of {block}-wide blocks of {bits}-bit codes")]
    PartialBlock { k: usize, block: usize, bits: i64 },
    #[error("the scales or the activations are not f32")]
    NotF32,
    #[error("the DequantizeLinear has a non-f32 output_dtype")]
    OutputDtype,
    #[error("scales or zero points are not [{blocks}, {n}]")]
    GridShape { blocks: usize, n: usize },
}

impl From<NotWGemm> for Decline {
    fn from(e: NotWGemm) -> Decline {
        Decline(Some(e.to_string()))
    }
}

/// The WGemm operands of a MatMulNBits node, or why it cannot be one.
fn wgemm_operands(egraph: &EGraph, mnb: &ENode) -> Result<Packed, NotWGemm> {
    let attrs = mnb.head.attrs().cloned().unwrap_or_default();
    let c = &mnb.children;
    let present = |i: usize| c.get(i).copied().filter(|&id| !is_absent(egraph, id));
    if present(4).is_some() {
        return Err(NotWGemm::ActOrder);
    }
    if present(5).is_some() {
        return Err(NotWGemm::Bias);
    }
    let bits = attrs.int_or("bits", 4).unwrap_or(0);
    if !matches!(bits, 4 | 8) {
        return Err(NotWGemm::Bits(bits));
    }
    let (Ok(Some(k)), Ok(Some(n)), Ok(Some(block))) = (attrs.int("K"), attrs.int("N"), attrs.int("block_size")) else {
        return Err(NotWGemm::MissingSizes);
    };
    if !dtype(egraph, c[0]).is_some_and(|d| d.is_float()) {
        return Err(NotWGemm::NonFloatActivation);
    }
    let (Ok(k), Ok(n)) = (usize::try_from(k), usize::try_from(n)) else {
        return Err(NotWGemm::BadSizes { k, n });
    };
    let accuracy_level = attrs.int_or("accuracy_level", 0).unwrap_or(0);
    Ok(Packed { a: c[0], w: c[1], scales: c[2], zero_points: present(3), k, n, bits, block, accuracy_level })
}

/// The WGemm over `p`.
fn wgemm(egraph: &mut EGraph, p: &Packed) -> Id {
    let pairs = [
        ("K", Attr::Int(p.k as i64)),
        ("N", Attr::Int(p.n as i64)),
        ("bits", Attr::Int(p.bits)),
        ("block_size", Attr::Int(p.block)),
    ];
    let children = [p.a, p.w, p.scales].into_iter().chain(p.zero_points).collect();
    if p.accuracy_level == 4 {
        let mut with_level = pairs.to_vec();
        with_level.push(("accuracy_level", Attr::Int(4)));
        return egraph.add(ENode::op(Domain::Npuc, "WGemm", attrs(&with_level), children));
    }
    egraph.add(ENode::op(Domain::Npuc, "WGemm", attrs(&pairs), children))
}

/// Folds a MatMulNBits node into a WGemm; `rest` names the pattern variables after `?s`.
struct ToWGemm {
    vars: Vec<Var>,
}

impl ToWGemm {
    fn new(rest: &[&str]) -> Computed<ToWGemm> {
        Computed::new(ToWGemm { vars: ["?a", "?w", "?s"].iter().chain(rest).map(|v| var(v)).collect() })
    }
}

impl Fold for ToWGemm {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let children: Vec<Id> = self.vars.iter().map(|&v| egraph.find(subst[v])).collect();
        let mnb = nodes_with_children(egraph, eclass, "MatMulNBits", &children).next().ok_or_else(no_match)?;
        let p = wgemm_operands(egraph, mnb)?;
        let id = wgemm(egraph, &p);
        Ok(union(egraph, eclass, id, rule))
    }
}

/// The MatMulNBits product of `class` WGemm can take, if there is one.
fn packed_product(egraph: &EGraph, class: Id) -> Option<Packed> {
    egraph[class]
        .nodes
        .iter()
        .filter(|n| n.head.op() == Some("MatMulNBits"))
        .find_map(|n| wgemm_operands(egraph, n).ok())
}

/// A view of rows [lo, hi) of a per-column operand of a product with `n` columns: a Slice of axis
/// 0 of an [N, …] tensor, or of the flat range of an [N·r] one.
fn row_view(egraph: &mut EGraph, t: Id, n: usize, lo: usize, hi: usize) -> Option<Id> {
    let shape = known_shape(egraph, t)?;
    let dtype = dtype(egraph, t)?;
    let (start, end, out) = match shape[..] {
        [first, ref rest @ ..] if first == n && !rest.is_empty() => {
            (lo, hi, std::iter::once(hi - lo).chain(rest.iter().copied()).collect::<Vec<_>>())
        }
        [len] if n > 0 && len % n == 0 => {
            let r = len / n;
            (lo * r, hi * r, vec![(hi - lo) * r])
        }
        _ => return None,
    };
    let (s, e, axes) = (i64s(egraph, &[start as i64]), i64s(egraph, &[end as i64]), i64s(egraph, &[0]));
    Some(add_shaped(egraph, onnx("Slice", Attrs::default(), vec![t, s, e, axes]), dtype, &out))
}

/// WGemms over consecutive row ranges of `p` of the given sizes.
fn parts(egraph: &mut EGraph, p: &Packed, sizes: &[usize]) -> Option<Vec<Id>> {
    let mut out = Vec::with_capacity(sizes.len());
    let mut lo = 0;
    for &size in sizes {
        let hi = lo + size;
        let w = row_view(egraph, p.w, p.n, lo, hi)?;
        let scales = row_view(egraph, p.scales, p.n, lo, hi)?;
        let zero_points = match p.zero_points {
            Some(z) => Some(row_view(egraph, z, p.n, lo, hi)?),
            None => None,
        };
        out.push(wgemm(egraph, &Packed { w, scales, zero_points, n: size, ..p.clone() }));
        lo = hi;
    }
    Some(out)
}

/// The column counts a Split (attributes `attrs`, outputs typed in class `split`) cuts packed
/// product `p` of class `packed` into, read from the outputs' types (the sizes input is often an
/// initializer, whose value the e-graph does not hold), or why it cannot be cut.
fn split_sizes(egraph: &EGraph, split: Id, packed: Id, p: &Packed, attrs: &Attrs) -> Result<Vec<usize>, NotWGemm> {
    let rank = rank(egraph, packed).unwrap_or(0);
    let axis = attrs.int_or("axis", 0).unwrap_or(0);
    if rank == 0 || (axis != -1 && axis != rank as i64 - 1) {
        return Err(NotWGemm::SplitAxis(axis));
    }
    let sizes: Option<Vec<usize>> = egraph[split]
        .data
        .types
        .iter()
        .map(|t| t.shape.get(rank - 1).and_then(|d| d.as_known()).and_then(|d| usize::try_from(d).ok()))
        .collect();
    match sizes {
        Some(sizes) if !sizes.is_empty() && sizes.iter().sum::<usize>() == p.n && !sizes.contains(&0) => Ok(sizes),
        _ => Err(NotWGemm::SplitParts(p.n)),
    }
}

/// Gives each output of a Split of a packed product its own WGemm over row views.
struct SplitPacked {
    sizes: Option<Var>,
}

impl Fold for SplitPacked {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let packed = subst[var("?packed")];
        let p = packed_product(egraph, packed).ok_or_else(no_match)?;
        let children: Vec<Id> = std::iter::once(packed).chain(self.sizes.map(|v| subst[v])).collect();
        let attrs = node_attrs(egraph, eclass, Domain::Onnx, "Split", &children).ok_or_else(no_match)?;
        let sizes = split_sizes(egraph, eclass, packed, &p, &attrs)?;
        let wgemms = parts(egraph, &p, &sizes).ok_or("packed operands are not laid out one row per column")?;
        let mut changed = vec![];
        for (i, part) in wgemms.into_iter().enumerate() {
            let out = egraph.add(ENode { head: Head::Proj(i), children: vec![eclass] });
            changed.extend(union(egraph, out, part, rule));
        }
        Ok(changed)
    }
}

/// Writes the packed Q/K/V product GroupQueryAttention reads as a Concat of per-projection WGemms.
struct SplitPackedQkv;

impl Fold for SplitPackedQkv {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let qkv = subst[var("?qkv")];
        let p = packed_product(egraph, qkv).ok_or_else(no_match)?;
        let gqa = egraph[eclass]
            .nodes
            .iter()
            .find(|n| n.head.op() == Some("GroupQueryAttention") && egraph.find(n.children[0]) == egraph.find(qkv));
        let gqa_attrs = gqa.and_then(|n| n.head.attrs()).ok_or_else(no_match)?;
        let (Ok(Some(q_heads)), Ok(Some(kv_heads))) = (gqa_attrs.int("num_heads"), gqa_attrs.int("kv_num_heads"))
        else {
            return Err(no_match());
        };
        let heads = (q_heads + 2 * kv_heads) as usize;
        if heads == 0 || p.n % heads != 0 {
            return Err(format!("{} packed columns are not {heads} heads", p.n).into());
        }
        let d = p.n / heads;
        let sizes = [q_heads as usize * d, kv_heads as usize * d, kv_heads as usize * d];
        let wgemms = parts(egraph, &p, &sizes).ok_or("packed operands are not laid out one row per column")?;
        let concat = egraph.add(onnx("Concat", attrs(&[("axis", Attr::Int(-1))]), wgemms));
        Ok(union(egraph, qkv, concat, rule))
    }
}

/// Folds `MatMul(a, DequantizeLinear(w, s[, z]))` with 4- or 8-bit codes blocked along K into a
/// WGemm over the codes repacked lazily into MatMulNBits' layout.
struct FromBlockedDequantize {
    zero_point: bool,
}

/// The blocked weight a MatMul reads: codes [K, N], scales and zero points [K/b, N], block b.
struct Blocked {
    codes: Id,
    scales: Id,
    zero_points: Option<Id>,
    k: usize,
    n: usize,
    bits: i64,
    block: usize,
    signed: bool,
}

/// The blocked weight of `DequantizeLinear(w, s[, z])` with attributes `attrs`; `Ok(None)` when
/// it is no candidate (8-bit codes without blocks are the qdq family's), `Err` with the reason
/// when it is one that cannot fold.
fn blocked_weight(
    egraph: &EGraph,
    a: Id,
    w: Id,
    s: Id,
    z: Option<Id>,
    attrs: &Attrs,
) -> Result<Option<Blocked>, NotWGemm> {
    let Some(codes) = dtype(egraph, w) else { return Ok(None) };
    let (bits, signed) = match codes {
        DType::I4 => (4, true),
        DType::U4 => (4, false),
        DType::I8 => (8, true),
        DType::U8 => (8, false),
        _ => return Ok(None),
    };
    let block = attrs.int_or("block_size", 0).unwrap_or(0);
    if block <= 0 {
        return match bits {
            4 => Err(NotWGemm::NotBlocked),
            _ => Ok(None),
        };
    }
    if !is_compile_time_expr(egraph, w) {
        return Err(NotWGemm::RunTimeCodes);
    }
    let Some([k, n]) = known_shape(egraph, w).and_then(|s| <[usize; 2]>::try_from(s).ok()) else {
        return Err(NotWGemm::NotAMatrix);
    };
    let axis = attrs.int_or("axis", 1).unwrap_or(1);
    let axis = if axis < 0 { axis + 2 } else { axis };
    let block = block as usize;
    if axis != 0 {
        return Err(NotWGemm::BlocksAlongN { block, axis });
    }
    if !k.is_multiple_of(block) || !(block * bits as usize).is_multiple_of(8) {
        return Err(NotWGemm::PartialBlock { k, block, bits });
    }
    if dtype(egraph, s) != Some(DType::F32) || dtype(egraph, a) != Some(DType::F32) {
        return Err(NotWGemm::NotF32);
    }
    if !matches!(attrs.int("output_dtype"), Ok(None | Some(0 | 1))) {
        return Err(NotWGemm::OutputDtype);
    }
    let grid = [k / block, n];
    if known_shape(egraph, s).as_deref() != Some(&grid[..])
        || z.is_some_and(|z| known_shape(egraph, z).as_deref() != Some(&grid[..]))
    {
        return Err(NotWGemm::GridShape { blocks: k / block, n });
    }
    Ok(Some(Blocked { codes: w, scales: s, zero_points: z, k, n, bits, block, signed }))
}

/// The MatMulNBits operands of a blocked weight, as compile-time expressions over its codes,
/// scales and zero points.
fn repack(egraph: &mut EGraph, b: &Blocked, a: Id) -> Packed {
    let (k, n, blocks) = (b.k, b.n, b.k / b.block);
    let codes_type = dtype(egraph, b.codes).unwrap_or(DType::I4);
    let transpose = [("perm", Attr::Ints(vec![1, 0]))];
    let cast = |to: DType| [("to", Attr::Int(to.onnx_code() as i64))];
    let offset = 1i64 << (b.bits - 1);
    let t = add_shaped(egraph, onnx("Transpose", attrs(&transpose), vec![b.codes]), codes_type, &[n, k]);
    let mut c = add_shaped(egraph, onnx("Cast", attrs(&cast(DType::I32)), vec![t]), DType::I32, &[n, k]);
    if b.signed {
        let o = add_const(egraph, Tensor::from_i64(DType::I32, vec![], vec![offset]));
        c = add_shaped(egraph, onnx("Add", Attrs::default(), vec![c, o]), DType::I32, &[n, k]);
    }
    let packed = if b.bits == 4 {
        // Element 2i of a block in the low nibble, 2i+1 in the high one: q₂ᵢ + 16·q₂ᵢ₊₁.
        let pairs = [n, blocks, b.block / 2, 2];
        let shape = i64s(egraph, &pairs.map(|d| d as i64));
        let r = add_shaped(egraph, onnx("Reshape", Attrs::default(), vec![c, shape]), DType::I32, &pairs);
        let weights = add_const(egraph, Tensor::from_i64(DType::I32, vec![2], vec![1, 16]));
        let m = add_shaped(egraph, onnx("Mul", Attrs::default(), vec![r, weights]), DType::I32, &pairs);
        let last = i64s(egraph, &[-1]);
        let bytes = [n, blocks, b.block / 2];
        let s = add_shaped(
            egraph,
            onnx("ReduceSum", attrs(&[("keepdims", Attr::Int(0))]), vec![m, last]),
            DType::I32,
            &bytes,
        );
        add_shaped(egraph, onnx("Cast", attrs(&cast(DType::U8)), vec![s]), DType::U8, &bytes)
    } else {
        let bytes = [n, blocks, b.block];
        let shape = i64s(egraph, &bytes.map(|d| d as i64));
        let r = add_shaped(egraph, onnx("Reshape", Attrs::default(), vec![c, shape]), DType::I32, &bytes);
        add_shaped(egraph, onnx("Cast", attrs(&cast(DType::U8)), vec![r]), DType::U8, &bytes)
    };
    let scales = add_shaped(egraph, onnx("Transpose", attrs(&transpose), vec![b.scales]), DType::F32, &[n, blocks]);
    let zero_points = match b.zero_points {
        Some(z) => {
            let t = add_shaped(egraph, onnx("Transpose", attrs(&transpose), vec![z]), codes_type, &[n, blocks]);
            let f = add_shaped(egraph, onnx("Cast", attrs(&cast(DType::F32)), vec![t]), DType::F32, &[n, blocks]);
            if b.signed {
                let o = add_const(egraph, Tensor::scalar_f32(offset as f32));
                Some(add_shaped(egraph, onnx("Add", Attrs::default(), vec![f, o]), DType::F32, &[n, blocks]))
            } else {
                Some(f)
            }
        }
        // MatMulNBits' default zero point 2^(bits−1) is exactly the offset given to signed codes.
        None if b.signed => None,
        None => {
            let shape = i64s(egraph, &[n as i64, blocks as i64]);
            let zero = [("value", Attr::Tensor(Tensor::from_f32(DType::F32, vec![1], vec![0.0])))];
            Some(add_shaped(egraph, onnx("ConstantOfShape", attrs(&zero), vec![shape]), DType::F32, &[n, blocks]))
        }
    };
    Packed { a, w: packed, scales, zero_points, k, n, bits: b.bits, block: b.block as i64, accuracy_level: 0 }
}

impl Fold for FromBlockedDequantize {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let (a, w, s) = (subst[var("?a")], subst[var("?w")], subst[var("?s")]);
        let z = self.zero_point.then(|| subst[var("?z")]);
        let dq_children: Vec<Id> = [w, s].into_iter().chain(z).collect();
        let attrs = egraph[eclass].nodes.iter().filter(|n| n.head.op() == Some("MatMul")).find_map(|n| {
            (egraph.find(n.children[0]) == egraph.find(a))
                .then(|| node_attrs(egraph, n.children[1], Domain::Onnx, "DequantizeLinear", &dq_children))
                .flatten()
        });
        let b = blocked_weight(egraph, a, w, s, z, &attrs.ok_or_else(no_match)?)?.ok_or_else(no_match)?;
        let p = repack(egraph, &b, a);
        let id = wgemm(egraph, &p);
        Ok(union(egraph, eclass, id, rule))
    }
}

//! Rule family `rope`: rotary position embeddings into `npuc::Rope{interleaved}(x, cos, sin)`.
//!
//! Identity (the exact semantics are `ir::fused`'s): for full-width tables `cos`, `sin` that
//! broadcast to `x` and end in x's last axis (width D, even),
//! - rotate-half: `x·cos + concat(−x[D/2:], x[:D/2])·sin = Rope{interleaved=0}(x, cos, sin)`;
//! - interleaved: `x·cos + interleave(−x[1::2], x[0::2])·sin = Rope{interleaved=1}(x, cos, sin)`,
//!   where `interleave(a, b)[2i] = a[i]`, `[2i+1] = b[i]`.
//!
//! The rules never look at how cos and sin are made (gathered from a cache by position_ids and
//! unsqueezed, computed in-graph from Range/Sin/Cos, constants): only that they broadcast to x
//! over its full width. A candidate whose tables do not is declined with the shapes.
//!
//! Exporter spellings recognised:
//! - torch / optimum `rotate_half` (Llama, Qwen3, SmolLM2 as optimum and torch dynamo export
//!   them, and the QDQ graphs made from those, where the rotation stays float): `Add(Mul(x, cos), Mul(Concat{axis=-1}(Neg(Slice(x, D/2,
//!   ≥D)), Slice(x, 0, D/2)), sin))` with explicit axes and unit steps; both Add operand orders.
//! - torch GPT-J style `rotate_every_two` (`stack((−x[1::2], x[::2]), −1).flatten(−2)`): the two
//!   step-2 Slices, each Unsqueezed on a new last axis, Concat{axis=-1}, Reshape back to x's
//!   shape; both Add operand orders.
//! - ai.onnx RotaryEmbedding (opset 23, torch dynamo's fused export: 3-D `[B, S, H·D]` input with `num_heads`, or 4-D
//!   `[B, H, S, D]`; caches `[max_pos, D/2]` indexed by position_ids, or `[B, S, D/2]` without
//!   them) and com.microsoft RotaryEmbedding (position_ids `[B, S]` or one start offset).
//!
//! Decision on the fused RotaryEmbedding ops: they take half-width caches and look rows up by
//! position inside the op; `Rope` keeps its one semantics (full-width tables already at the
//! tokens' positions) and the lookup is lowered to ordinary ops next to it: `Gather(cache,
//! positions)` for the rows, `Concat(rows, rows)` to full width (each entry twice when
//! interleaved), a unit heads axis so the table broadcasts over the heads. A 3-D input is viewed
//! as `[B, S, H, D]` (through the Reshape it was made from when there is one) and reshaped back.
//! The lookup is a per-token gather of D/2 values that a host or a DMA descriptor does; one Rope
//! semantics keeps one kernel, and every step is exact. Declined: partial rotation
//! (`rotary_embedding_dim` below the head size: Rope rotates the full width), packed batching,
//! and inputs whose head size is not known at compile time.
//!
//! The RoPE inside com.microsoft GroupQueryAttention (`do_rotary=1`) is lowered by the
//! `attention` family with the same table lookup ([`crate::egraph_ops::cache_rows`],
//! [`crate::egraph_ops::full_width`]).

use crate::apply::{no_match, Computed, Decline, Fold, Folded};
use crate::cond::var;
use crate::egraph_ops::{
    add_typed, cache_rows, cast, dim_value, full_width, heads_view, i64_scalar, int_values, node_attrs, onnx, reshape,
    rope, type_of, union, unsqueeze,
};
use crate::Rewrite;
use egg::{rewrite as rw, Id, Subst, Symbol, Var};
use ir::egraph::{EGraph, TypeInfo};
use ir::{Attrs, DType, Dim, Domain};

/// The family's rules.
pub fn rules() -> Vec<Rewrite> {
    #[rustfmt::skip]
    let rules = vec![
        // x·cos + concat(−x[D/2:], x[:D/2])·sin  →  Rope{interleaved=0}(x, cos, sin)
        rw!("rope-rotate-half";
            "(Add (Mul ?x ?cos) (Mul (Concat{axis=-1} (Neg (Slice ?x ?hs ?he ?ha ?hp)) (Slice ?x ?ls ?le ?la ?lp)) ?sin))"
            => { Computed::guarded("(npuc::Rope{interleaved=0} ?x ?cos ?sin)", tables_fit("?x", "?cos", "?sin")) }
            if halves_of_last_axis("?x", ["?ls", "?le", "?la", "?lp"], ["?hs", "?he", "?ha", "?hp"])),
        // concat(−x[D/2:], x[:D/2])·sin + x·cos  →  Rope{interleaved=0}(x, cos, sin)
        rw!("rope-rotate-half-swapped";
            "(Add (Mul (Concat{axis=-1} (Neg (Slice ?x ?hs ?he ?ha ?hp)) (Slice ?x ?ls ?le ?la ?lp)) ?sin) (Mul ?x ?cos))"
            => { Computed::guarded("(npuc::Rope{interleaved=0} ?x ?cos ?sin)", tables_fit("?x", "?cos", "?sin")) }
            if halves_of_last_axis("?x", ["?ls", "?le", "?la", "?lp"], ["?hs", "?he", "?ha", "?hp"])),
        // x·cos + interleave(−x[1::2], x[0::2])·sin  →  Rope{interleaved=1}(x, cos, sin)
        rw!("rope-interleaved";
            "(Add (Mul ?x ?cos) (Mul (Reshape (Concat{axis=-1} (Unsqueeze (Neg (Slice ?x ?os ?oe ?oa ?op)) ?ou) (Unsqueeze (Slice ?x ?es ?ee ?ea ?ep) ?eu)) ?shape) ?sin))"
            => { Computed::guarded("(npuc::Rope{interleaved=1} ?x ?cos ?sin)", tables_fit("?x", "?cos", "?sin")) }
            if strided_pairs_of_last_axis("?x", ["?es", "?ee", "?ea", "?ep", "?eu"], ["?os", "?oe", "?oa", "?op", "?ou"])),
        // interleave(−x[1::2], x[0::2])·sin + x·cos  →  Rope{interleaved=1}(x, cos, sin)
        rw!("rope-interleaved-swapped";
            "(Add (Mul (Reshape (Concat{axis=-1} (Unsqueeze (Neg (Slice ?x ?os ?oe ?oa ?op)) ?ou) (Unsqueeze (Slice ?x ?es ?ee ?ea ?ep) ?eu)) ?shape) ?sin) (Mul ?x ?cos))"
            => { Computed::guarded("(npuc::Rope{interleaved=1} ?x ?cos ?sin)", tables_fit("?x", "?cos", "?sin")) }
            if strided_pairs_of_last_axis("?x", ["?es", "?ee", "?ea", "?ep", "?eu"], ["?os", "?oe", "?oa", "?op", "?ou"])),
        // RotaryEmbedding(x, cos_cache, sin_cache, position_ids)  →  Rope(x, full(cos_cache[pos]), full(sin_cache[pos]))
        rw!("rope-onnx-rotary-embedding";
            "(RotaryEmbedding ?x ?cos ?sin ?pos)"
            => { LowerRotaryEmbedding::new(Spelling::Onnx) }),
        // RotaryEmbedding(x, cos_rows, sin_rows)  →  Rope(x, full(cos_rows), full(sin_rows))
        rw!("rope-onnx-rotary-embedding-rows";
            "(RotaryEmbedding ?x ?cos ?sin)"
            => { LowerRotaryEmbedding::new(Spelling::OnnxRows) }),
        // com.microsoft::RotaryEmbedding(x, position_ids, cos_cache, sin_cache)  →  Rope(x, full(cos_cache[pos]), full(sin_cache[pos]))
        rw!("rope-contrib-rotary-embedding";
            "(com.microsoft::RotaryEmbedding ?x ?pos ?cos ?sin)"
            => { LowerRotaryEmbedding::new(Spelling::Contrib) }),
    ];
    rules
}

/// `[start, end, axes, steps]` pattern variables of a Slice.
type SliceVars<'a> = [&'a str; 4];

/// Pattern variables by name.
fn vars<const N: usize>(names: [&str; N]) -> [Var; N] {
    names.map(var)
}

/// The last-axis width of `x` when known, even and positive.
fn even_width(egraph: &EGraph, x: Id) -> Option<(i64, usize)> {
    let t = egraph[x].data.ty()?;
    let d = t.shape.last()?.as_known()?;
    (d > 0 && d % 2 == 0).then_some((d, t.shape.len()))
}

/// A Slice's constant `[start]`, `[end]`, `[axis]`, `[step]`, with the axis normalised to `rank`.
fn slice_params(egraph: &EGraph, subst: &Subst, vars: &[Var], rank: usize) -> Option<(i64, i64, i64, i64)> {
    let one = |v: Var| match int_values(egraph, subst[v]).as_deref() {
        Some([x]) => Some(*x),
        _ => None,
    };
    let axis = one(vars[2])?;
    let axis = if axis < 0 { axis + rank as i64 } else { axis };
    Some((one(vars[0])?, one(vars[1])?, axis, one(vars[3])?))
}

/// `?x`'s last axis (width D) is cut by the `low` Slice into `[0, D/2)` and by the `high` Slice
/// into `[D/2, D)` (an end at or past D), both with step 1.
fn halves_of_last_axis(x: &str, low: SliceVars, high: SliceVars) -> impl Fn(&mut EGraph, Id, &Subst) -> bool {
    let (xv, low, high) = (var(x), vars(low), vars(high));
    move |egraph, _, subst| {
        let Some((d, rank)) = even_width(egraph, subst[xv]) else { return false };
        let last = rank as i64 - 1;
        let lo = slice_params(egraph, subst, &low, rank);
        let hi = slice_params(egraph, subst, &high, rank);
        matches!(lo, Some((0, e, a, 1)) if e == d / 2 && a == last)
            && matches!(hi, Some((s, e, a, 1)) if s == d / 2 && e >= d && a == last)
    }
}

/// `?x`'s last axis is split by step-2 Slices into its even (`even`: start 0) and odd (`odd`:
/// start 1) entries, each then Unsqueezed on a new last axis (the fifth variable of each list).
fn strided_pairs_of_last_axis(x: &str, even: [&str; 5], odd: [&str; 5]) -> impl Fn(&mut EGraph, Id, &Subst) -> bool {
    let (xv, even, odd) = (var(x), vars(even), vars(odd));
    move |egraph, _, subst| {
        let Some((d, rank)) = even_width(egraph, subst[xv]) else { return false };
        let last = rank as i64 - 1;
        let new_last =
            |v: Var| matches!(int_values(egraph, subst[v]).as_deref(), Some([a]) if *a == -1 || *a == rank as i64);
        let ev = slice_params(egraph, subst, &even[..4], rank);
        let od = slice_params(egraph, subst, &odd[..4], rank);
        matches!(ev, Some((0, e, a, 2)) if e >= d && a == last)
            && matches!(od, Some((1, e, a, 2)) if e >= d && a == last)
            && new_last(even[4])
            && new_last(odd[4])
    }
}

/// Why `cos`/`sin` of these types are not full-width tables broadcasting to `x`, if they are not.
fn tables_misfit(x: &TypeInfo, tables: [Option<&TypeInfo>; 2]) -> Option<String> {
    for t in tables {
        let Some(t) = t else { return Some("the cos/sin tables have no known type".into()) };
        let fits = t.dtype == x.dtype
            && t.shape.len() <= x.shape.len()
            && t.shape.last() == x.shape.last()
            && t.shape.iter().rev().zip(x.shape.iter().rev()).all(|(a, b)| a == b || a.as_known() == Some(1));
        if !fits {
            return Some(format!(
                "cos/sin {}{} do not broadcast to x {}{} over its full last axis",
                t.dtype,
                ir::dim::shape_to_string(&t.shape),
                x.dtype,
                ir::dim::shape_to_string(&x.shape)
            ));
        }
    }
    None
}

/// `?cos` and `?sin` are full-width tables that broadcast to `?x` (Rope's contract); why not
/// otherwise.
fn tables_fit(x: &str, cos: &str, sin: &str) -> impl Fn(&EGraph, Id, &Subst) -> Result<(), Decline> {
    let (x, cos, sin) = (var(x), var(cos), var(sin));
    move |egraph, _, subst| {
        let xt = egraph[subst[x]].data.ty().ok_or_else(no_match)?;
        match tables_misfit(xt, [egraph[subst[cos]].data.ty(), egraph[subst[sin]].data.ty()]) {
            None => Ok(()),
            Some(reason) => Err(reason.into()),
        }
    }
}

/// Which RotaryEmbedding a [`LowerRotaryEmbedding`] reads.
#[derive(Clone, Copy, PartialEq)]
enum Spelling {
    /// ai.onnx, with position_ids: caches `[max_pos, D/2]`.
    Onnx,
    /// ai.onnx without position_ids: the caches are the rows `[B, S, D/2]`.
    OnnxRows,
    /// com.microsoft: position_ids `[B, S]` or one start offset, caches `[max_pos, D/2]`.
    Contrib,
}

/// Lowers a RotaryEmbedding op to the row lookup plus `Rope` (see the module header).
struct LowerRotaryEmbedding {
    spelling: Spelling,
}

/// A matched RotaryEmbedding Rope can take: its operands, the input's type and layout.
struct Rotary {
    x: Id,
    cos: Id,
    sin: Id,
    pos: Option<Id>,
    xt: TypeInfo,
    /// Half the head size: the width of the tables' rows.
    half: i64,
    /// The heads of a 3-D `[B, S, H·D]` input; `None` for a 4-D `[B, H, S, D]` one.
    heads: Option<i64>,
    head: i64,
    interleaved: bool,
}

impl Rotary {
    /// The input's sequence axis.
    fn seq_axis(&self) -> usize {
        if self.heads.is_some() {
            1
        } else {
            2
        }
    }
}

impl Fold for LowerRotaryEmbedding {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let op = self.matched(egraph, eclass, subst)?;
        let (cos_rows, sin_rows) = (self.table_rows(egraph, &op, op.cos)?, self.table_rows(egraph, &op, op.sin)?);
        let (Some(mut tc), Some(mut ts)) =
            (full_width(egraph, cos_rows, op.interleaved), full_width(egraph, sin_rows, op.interleaved))
        else {
            return Err(no_match());
        };
        // A unit heads axis: [B, S, D] → [B, S, 1, D] for the [B, S, H, D] view, [B, 1, S, D] for
        // BNSH; [S, D] → [S, 1, D] for the view and as is for BNSH.
        let table_rank = type_of(egraph, tc).map(|t| t.shape.len()).ok_or_else(no_match)?;
        let heads_axis = match (op.heads.is_some(), table_rank) {
            (true, 3) => Some(2),
            (true, _) | (false, 3) => Some(1),
            (false, _) => None,
        };
        if let Some(axis) = heads_axis {
            tc = unsqueeze(egraph, tc, axis).ok_or_else(no_match)?;
            ts = unsqueeze(egraph, ts, axis).ok_or_else(no_match)?;
        }
        let y = match op.heads {
            Some(h) => {
                let x4 = heads_view(egraph, op.x, h, op.head).ok_or_else(no_match)?;
                let r = rope(egraph, x4, tc, ts, op.interleaved);
                let width = op.xt.shape[2].as_known().unwrap_or(h * op.head);
                reshape(egraph, r, &[0, 0, width]).ok_or_else(no_match)?
            }
            None => rope(egraph, op.x, tc, ts, op.interleaved),
        };
        Ok(union(egraph, eclass, y, rule))
    }
}

impl LowerRotaryEmbedding {
    fn new(spelling: Spelling) -> Computed<Self> {
        Computed::new(LowerRotaryEmbedding { spelling })
    }

    /// The matched op, when Rope can take it.
    fn matched(&self, egraph: &EGraph, eclass: Id, subst: &Subst) -> Result<Rotary, Decline> {
        let (x, cos, sin) = (subst[var("?x")], subst[var("?cos")], subst[var("?sin")]);
        let pos = subst.get(var("?pos")).copied();
        let (domain, children) = match self.spelling {
            Spelling::Onnx => (Domain::Onnx, vec![x, cos, sin, pos.ok_or_else(no_match)?]),
            Spelling::OnnxRows => (Domain::Onnx, vec![x, cos, sin]),
            Spelling::Contrib => (Domain::Microsoft, vec![x, pos.ok_or_else(no_match)?, cos, sin]),
        };
        let attrs = node_attrs(egraph, eclass, domain, "RotaryEmbedding", &children).ok_or_else(no_match)?;
        let int = |name: &str| attrs.int_or(name, 0).map_err(|e| Decline::from(e.to_string()));
        let interleaved = int("interleaved")? != 0;
        if int("is_packed_batching")? != 0 {
            return Err("packed batching has no Rope form".into());
        }
        let xt = type_of(egraph, x).ok_or_else(no_match)?;
        if !xt.dtype.is_float() {
            return Err(no_match());
        }
        let cache = type_of(egraph, cos).ok_or_else(no_match)?;
        let half = cache.shape.last().and_then(Dim::as_known).ok_or("the cos cache width is not known")?;
        let num_heads = int("num_heads")?;
        let (heads, head) = match xt.shape.len() {
            3 => {
                let width = xt.shape[2].as_known().ok_or("the hidden size is not known")?;
                let heads = match num_heads {
                    n if n > 0 => n,
                    _ if self.spelling == Spelling::Contrib && half > 0 => width / (2 * half),
                    _ => return Err("a 3-D input needs num_heads".into()),
                };
                if heads <= 0 || width % heads != 0 {
                    return Err(format!("hidden size {width} does not split into {heads} heads").into());
                }
                (Some(heads), width / heads)
            }
            4 => (None, xt.shape[3].as_known().ok_or("the head size is not known")?),
            n => return Err(format!("input of rank {n} is neither [B, S, H·D] nor [B, H, S, D]").into()),
        };
        let rotary = int("rotary_embedding_dim")?;
        if 2 * half != head || (rotary != 0 && rotary != head) {
            let rotated = if rotary != 0 { rotary } else { 2 * half };
            return Err(format!("rotates {rotated} of the head's {head} features: Rope rotates the full width").into());
        }
        Ok(Rotary { x, cos, sin, pos, xt, half, heads, head, interleaved })
    }

    /// The token rows of `table`: `[B, S, D/2]`, or `[S, D/2]` for a start offset.
    fn table_rows(&self, egraph: &mut EGraph, op: &Rotary, table: Id) -> Result<Id, Decline> {
        let (batch, seq) = (op.xt.shape[0].clone(), op.xt.shape[op.seq_axis()].clone());
        if self.spelling == Spelling::OnnxRows {
            let t = type_of(egraph, table).ok_or_else(no_match)?;
            if t.shape != [batch, seq, Dim::known(op.half)] {
                let got = ir::dim::shape_to_string(&t.shape);
                return Err(format!("without position_ids the tables must be [B, S, D/2], got {got}").into());
            }
            return Ok(table);
        }
        let pos = op.pos.ok_or_else(no_match)?;
        let pt = type_of(egraph, pos).ok_or_else(no_match)?;
        if !pt.dtype.is_int() {
            return Err(format!("position_ids are {}", pt.dtype).into());
        }
        let positions = if pt.shape == [batch, seq.clone()] {
            pos
        } else if self.spelling == Spelling::Contrib
            && pt.shape.iter().all(|d| d.as_known() == Some(1))
            && pt.shape.len() <= 1
        {
            offset_positions(egraph, op, pos, pt.dtype, seq)
        } else {
            let shape = ir::dim::shape_to_string(&pt.shape);
            return Err(format!("position_ids {shape} are neither [B, S] nor one offset").into());
        };
        cache_rows(egraph, table, positions).ok_or_else(no_match)
    }
}

/// The positions `offset + 0 .. offset + S` of one start offset `pos` (of integer type `dtype`).
fn offset_positions(egraph: &mut EGraph, op: &Rotary, pos: Id, dtype: DType, seq: Dim) -> Id {
    let len = dim_value(egraph, op.x, op.seq_axis());
    let zero = i64_scalar(egraph, 0);
    let one = i64_scalar(egraph, 1);
    let range = add_typed(
        egraph,
        onnx("Range", Attrs::default(), vec![zero, len, one]),
        TypeInfo { dtype: DType::I64, shape: vec![seq.clone()] },
    );
    let offset = if dtype == DType::I64 { pos } else { cast(egraph, pos, DType::I64) };
    add_typed(
        egraph,
        onnx("Add", Attrs::default(), vec![range, offset]),
        TypeInfo { dtype: DType::I64, shape: vec![seq] },
    )
}

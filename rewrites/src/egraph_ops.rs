//! Lookups in the e-graph and additions to it that more than one rule family makes: the matched
//! node of a class and its attributes, what the analysis knows of a class (type, known shape,
//! constant value), unions on behalf of a rule, and builders of the ops a fold adds (layout ops
//! typed by the fold, constants, and the RoPE table lookup that `rope` and `attention` both lower
//! to).
//!
//! A family imports these from here, never from another family; what only one family needs stays
//! in its own file.

use egg::Id;
use ir::egraph::{EGraph, ENode, Head, TypeInfo};
use ir::{Attr, Attrs, DType, Dim, Domain, Tensor};

// ---- nodes of a class ----

/// True when `node` is `domain::op`.
pub fn is_op(node: &ENode, domain: Domain, op: &str) -> bool {
    matches!(&node.head, Head::Op { domain: d, op: o, .. } if *d == domain && *o == op)
}

/// The first node of `class` that is `domain::op`, whatever its children.
pub fn node_of<'a>(egraph: &'a EGraph, class: Id, domain: Domain, op: &str) -> Option<&'a ENode> {
    egraph[class].nodes.iter().find(|n| is_op(n, domain, op))
}

/// The nodes of `class` that are op `op` (of any domain) with exactly `children`, compared as
/// classes: the node a pattern matched, found again from its substitution.
pub fn nodes_with_children<'a: 'q, 'q>(
    egraph: &'a EGraph,
    class: Id,
    op: &'q str,
    children: &'q [Id],
) -> impl Iterator<Item = &'a ENode> + 'q {
    egraph[class].nodes.iter().filter(move |n| {
        n.head.op() == Some(op)
            && n.children.len() == children.len()
            && n.children.iter().zip(children).all(|(&a, &b)| egraph.find(a) == egraph.find(b))
    })
}

/// The attributes of the `domain::op` node of `class` whose children are `children`.
pub fn node_attrs(egraph: &EGraph, class: Id, domain: Domain, op: &str, children: &[Id]) -> Option<Attrs> {
    nodes_with_children(egraph, class, op, children)
        .find(|n| is_op(n, domain, op))
        .and_then(|n| n.head.attrs().cloned())
}

/// The attribute `name` of a node as an int.
pub fn int_attr(node: &ENode, name: &str) -> Option<i64> {
    node.head.attrs().and_then(|a| a.int(name).ok().flatten())
}

/// True when `id` is the absent-input leaf.
pub fn is_absent(egraph: &EGraph, id: Id) -> bool {
    egraph[id].nodes.iter().any(|n| n.head == Head::Absent)
}

// ---- what the analysis knows ----

/// Dtype and shape of a class.
pub fn type_of(egraph: &EGraph, id: Id) -> Option<TypeInfo> {
    egraph[id].data.ty().cloned()
}

/// The dims of a class's type.
pub fn dims(egraph: &EGraph, id: Id) -> Option<Vec<Dim>> {
    type_of(egraph, id).map(|t| t.shape)
}

/// Known shape of a class's value.
pub fn known_shape(egraph: &EGraph, id: Id) -> Option<Vec<usize>> {
    egraph[id].data.ty()?.shape.iter().map(|d| d.as_known().and_then(|k| usize::try_from(k).ok())).collect()
}

/// Rank of the class's value, when known.
pub fn rank(egraph: &EGraph, id: Id) -> Option<usize> {
    egraph[id].data.ty().map(|t| t.shape.len())
}

/// Dtype of the class's value, when known.
pub fn dtype(egraph: &EGraph, id: Id) -> Option<DType> {
    egraph[id].data.ty().map(|t| t.dtype)
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

/// True when the class is the integer constant `want` (any shape holding exactly those values).
pub fn is_int(egraph: &EGraph, id: Id, want: &[i64]) -> bool {
    int_values(egraph, id).as_deref() == Some(want)
}

/// True when the class holds a weight leaf (an initializer of the model).
pub fn holds_weight(egraph: &EGraph, id: Id) -> bool {
    egraph[id].nodes.iter().any(|n| matches!(n.head, Head::Weight(_)))
}

/// True when the class is a weight or a small constant: data known at compile time.
pub fn is_compile_time(egraph: &EGraph, id: Id) -> bool {
    holds_weight(egraph, id) || egraph[id].data.constant.is_some()
}

/// True when the class's value depends on compile-time data only: a weight, a constant, or a
/// Transpose, Reshape, Slice, Cast or QuantizeLinear of such values (looked through four levels),
/// as in the codes `QuantizeLinear(Transpose(weight), s, z)` a quantiser writes for a tied lm_head.
pub fn is_compile_time_expr(egraph: &EGraph, id: Id) -> bool {
    compile_time_within(egraph, id, 4)
}

fn compile_time_within(egraph: &EGraph, id: Id, depth: usize) -> bool {
    if is_compile_time(egraph, id) || is_absent(egraph, id) {
        return true;
    }
    depth > 0
        && egraph[id].nodes.iter().any(|n| {
            matches!(n.head.op(), Some("Transpose" | "Reshape" | "Slice" | "Cast" | "QuantizeLinear"))
                && n.children.iter().all(|&c| compile_time_within(egraph, c, depth - 1))
        })
}

// ---- unions ----

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

// ---- builders ----

/// An ai.onnx node.
pub fn onnx(op: &'static str, attrs: Attrs, children: Vec<Id>) -> ENode {
    ENode::op(Domain::Onnx, op, attrs, children)
}

/// Attributes from `(name, value)` pairs.
pub fn attrs(pairs: &[(&str, Attr)]) -> Attrs {
    let mut a = Attrs::default();
    for (k, v) in pairs {
        a.set(k, v.clone());
    }
    a
}

/// Adds `node` and gives its class `ty` when type inference had nothing to say about it (the
/// layout ops a rewrite creates are typed by the rewrite, which knows their shapes).
pub fn add_typed(egraph: &mut EGraph, node: ENode, ty: TypeInfo) -> Id {
    let id = egraph.add(node);
    if egraph[id].data.types.is_empty() {
        egraph[id].data.types = vec![ty];
    }
    id
}

/// A constant leaf.
pub fn add_const(egraph: &mut EGraph, t: Tensor) -> Id {
    let c = egraph.analysis.intern(t);
    egraph.add(ENode::leaf(Head::Const(c)))
}

/// A constant int64 vector.
pub fn i64s(egraph: &mut EGraph, values: &[i64]) -> Id {
    add_const(egraph, Tensor::from_i64(DType::I64, vec![values.len()], values.to_vec()))
}

/// A constant int64 scalar.
pub fn i64_scalar(egraph: &mut EGraph, v: i64) -> Id {
    add_const(egraph, Tensor::scalar_i64(v))
}

/// `Cast(x)` to `to`.
pub fn cast(egraph: &mut EGraph, x: Id, to: DType) -> Id {
    let shape = type_of(egraph, x).map(|t| t.shape).unwrap_or_default();
    add_typed(
        egraph,
        onnx("Cast", attrs(&[("to", Attr::Int(to.onnx_code() as i64))]), vec![x]),
        TypeInfo { dtype: to, shape },
    )
}

/// The int64 scalar holding dim `axis` of `x`: `Gather(Shape(x), axis)`.
pub fn dim_value(egraph: &mut EGraph, x: Id, axis: usize) -> Id {
    let rank = type_of(egraph, x).map(|t| t.shape.len()).unwrap_or(0);
    let shape = add_typed(
        egraph,
        onnx("Shape", Attrs::default(), vec![x]),
        TypeInfo { dtype: DType::I64, shape: vec![Dim::known(rank as i64)] },
    );
    let index = i64_scalar(egraph, axis as i64);
    add_typed(
        egraph,
        onnx("Gather", attrs(&[("axis", Attr::Int(0))]), vec![shape, index]),
        TypeInfo { dtype: DType::I64, shape: vec![] },
    )
}

/// `Reshape(x, target)` (0 copies the input's dim, as ONNX says); `None` when the output shape
/// cannot be worked out from x's type.
pub fn reshape(egraph: &mut EGraph, x: Id, target: &[i64]) -> Option<Id> {
    let t = type_of(egraph, x)?;
    let shape: Vec<Dim> = target
        .iter()
        .enumerate()
        .map(|(i, &d)| match d {
            0 => t.shape.get(i).cloned(),
            d if d > 0 => Some(Dim::known(d)),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let c = i64s(egraph, target);
    Some(add_typed(egraph, onnx("Reshape", Attrs::default(), vec![x, c]), TypeInfo { dtype: t.dtype, shape }))
}

/// `Transpose(x, perm)`.
pub fn transpose(egraph: &mut EGraph, x: Id, perm: &[usize]) -> Option<Id> {
    let t = type_of(egraph, x)?;
    if t.shape.len() != perm.len() {
        return None;
    }
    let shape = perm.iter().map(|&p| t.shape[p].clone()).collect();
    let perm: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
    Some(add_typed(
        egraph,
        onnx("Transpose", attrs(&[("perm", Attr::Ints(perm))]), vec![x]),
        TypeInfo { dtype: t.dtype, shape },
    ))
}

/// `Unsqueeze(x, [axis])` with a non-negative axis.
pub fn unsqueeze(egraph: &mut EGraph, x: Id, axis: usize) -> Option<Id> {
    let t = type_of(egraph, x)?;
    if axis > t.shape.len() {
        return None;
    }
    let mut shape = t.shape.clone();
    shape.insert(axis, Dim::known(1));
    let axes = i64s(egraph, &[axis as i64]);
    Some(add_typed(egraph, onnx("Unsqueeze", Attrs::default(), vec![x, axes]), TypeInfo { dtype: t.dtype, shape }))
}

/// `x` `[B, S, heads·head]` viewed as `[B, S, heads, head]`: the value of that shape a Reshape in
/// x's class was made from when there is one (a view of a view is the value itself), otherwise a
/// new `Reshape(x, [0, 0, heads, head])`.
pub fn heads_view(egraph: &mut EGraph, x: Id, heads: i64, head: i64) -> Option<Id> {
    let t = type_of(egraph, x)?;
    if t.shape.len() != 3 {
        return None;
    }
    let want = vec![t.shape[0].clone(), t.shape[1].clone(), Dim::known(heads), Dim::known(head)];
    let found = egraph[x].nodes.iter().find_map(|n| match n.head.op() {
        Some("Reshape") if matches!(n.head, Head::Op { domain: Domain::Onnx, .. }) => {
            let src = n.children[0];
            egraph[src].data.ty().filter(|s| s.shape == want && s.dtype == t.dtype).map(|_| src)
        }
        _ => None,
    });
    match found {
        Some(src) => Some(src),
        None => reshape(egraph, x, &[0, 0, heads, head]),
    }
}

// ---- RoPE, as `rope` and `attention` (GroupQueryAttention's do_rotary) lower it ----

/// `Rope{interleaved}(x, cos, sin)`.
pub fn rope(egraph: &mut EGraph, x: Id, cos: Id, sin: Id, interleaved: bool) -> Id {
    let a = attrs(&[("interleaved", Attr::Int(interleaved as i64))]);
    egraph.add(ENode::op(Domain::Npuc, "Rope", a, vec![x, cos, sin]))
}

/// Rows `positions` of a `[max_pos, D/2]` cache: `Gather(cache, positions)`, shape
/// `positions.shape ++ [D/2]`.
pub fn cache_rows(egraph: &mut EGraph, cache: Id, positions: Id) -> Option<Id> {
    let (c, p) = (type_of(egraph, cache)?, type_of(egraph, positions)?);
    if c.shape.len() != 2 {
        return None;
    }
    let mut shape = p.shape.clone();
    shape.push(c.shape[1].clone());
    Some(add_typed(
        egraph,
        onnx("Gather", attrs(&[("axis", Attr::Int(0))]), vec![cache, positions]),
        TypeInfo { dtype: c.dtype, shape },
    ))
}

/// The full-width table `[.., D]` of half-width rows `[.., D/2]`: `Concat(rows, rows)` for
/// rotate-half, every entry twice (`Reshape(Concat(Unsqueeze(rows), Unsqueeze(rows)))`) for
/// interleaved pairs.
pub fn full_width(egraph: &mut EGraph, rows: Id, interleaved: bool) -> Option<Id> {
    let t = type_of(egraph, rows)?;
    let half = t.shape.last()?.as_known()?;
    let mut shape = t.shape.clone();
    *shape.last_mut()? = Dim::known(2 * half);
    let concat_last = attrs(&[("axis", Attr::Int(-1))]);
    if !interleaved {
        return Some(add_typed(
            egraph,
            onnx("Concat", concat_last, vec![rows, rows]),
            TypeInfo { dtype: t.dtype, shape },
        ));
    }
    let column = unsqueeze(egraph, rows, t.shape.len())?;
    let mut pairs = t.shape.clone();
    pairs.push(Dim::known(2));
    let pairs =
        add_typed(egraph, onnx("Concat", concat_last, vec![column, column]), TypeInfo { dtype: t.dtype, shape: pairs });
    let mut target = vec![0i64; t.shape.len()];
    *target.last_mut()? = 2 * half;
    reshape(egraph, pairs, &target)
}

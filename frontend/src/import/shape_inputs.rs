//! Shape inputs that are symbolic but equal to a constant: Reshape and Expand targets (0 = copy
//! the input's dim, -1 = infer, 1 = keep) where that is exact, and Slice bounds that are the
//! sliced dim's own size (`i64::MAX`). The constants replace the inputs in the IR graph, so the
//! shape arithmetic feeding them can die.

use super::{name_of, Analysis};
use crate::infer::{reshape_shape, Ctx, Info, Known, NodeCtx};
use crate::proto;
use ir::{Attr, Attrs, DType, Dim, Domain, Tensor};
use std::collections::HashMap;

/// The constant replacements, by (node, input index): Reshape/Expand targets first, then Slice
/// bounds, as inference left the context. A Reshape with allowzero=1 whose target is replaced
/// reads it with allowzero=0.
pub(super) fn overrides(
    a: &Analysis,
    node_attrs: &mut [Option<Attrs>],
    ctx: &mut Ctx,
) -> HashMap<(usize, usize), Tensor> {
    let mut overrides: HashMap<(usize, usize), Tensor> = HashMap::new();
    // Reshape targets are checked by re-running the inference, which may unify sizes that the
    // Slice bounds below then see; so all targets go first.
    for &i in &a.order {
        if let Some(t) = target_override(a, i, &mut node_attrs[i], ctx) {
            overrides.insert((i, 1), t);
        }
    }
    for &i in &a.order {
        let n = &a.g.node[i];
        if a.specs[i].spec.name != "Slice" || a.infos[n.output[0].as_str()].as_const().is_some() {
            continue;
        }
        for (k, t) in slice_overrides(n, &a.infos, ctx) {
            overrides.insert((i, k), t);
        }
    }
    overrides
}

/// The constant target of a Reshape or Expand (node `i`) whose output is not constant and
/// whose target is known as symbolic dims.
fn target_override(a: &Analysis, i: usize, attrs: &mut Option<Attrs>, ctx: &mut Ctx) -> Option<Tensor> {
    let n = &a.g.node[i];
    let op = a.specs[i].spec.name;
    if !(op == "Reshape" || op == "Expand") || a.infos[n.output[0].as_str()].as_const().is_some() {
        return None;
    }
    let target = a.infos.get(n.input[1].as_str())?;
    if !matches!(target.known, Known::Dims { .. }) {
        return None;
    }
    let x = &a.infos[n.input[0].as_str()];
    let y = &a.infos[n.output[0].as_str()];
    if op == "Expand" {
        return expand_constant(&x.shape, &y.shape, &target.as_dims().unwrap().0);
    }
    let allowzero = attrs.as_ref().and_then(|at| at.int("allowzero").ok().flatten()).unwrap_or(0) != 0;
    let t = reshape_constant(&x.shape, &y.shape, allowzero, ctx, &name_of(n, i));
    // allowzero=1 (torch.export) with a target holding no literal 0: the constant target
    // copies dims with 0, which allowzero=0 reads as the copy it is.
    if t.is_some() && allowzero {
        if let Some(at) = attrs.as_mut() {
            at.set("allowzero", Attr::Int(0));
        }
    }
    t
}

/// A constant Reshape target equivalent to the symbolic one: known dims as numbers, dims equal
/// to the input's at the same position as 0, at most one other as -1.
fn reshape_constant(x: &[Dim], y: &[Dim], allowzero: bool, ctx: &mut Ctx, node: &str) -> Option<Tensor> {
    // With allowzero=1 a literal 0 in the target is a zero-sized dim, which no constant target
    // read with allowzero=0 (as the caller rewrites it) can say.
    if allowzero && y.iter().any(|d| d.as_known() == Some(0)) {
        return None;
    }
    let mut out = Vec::with_capacity(y.len());
    let mut inferred = false;
    for (i, d) in y.iter().enumerate() {
        match d.as_known() {
            Some(0) => return None,
            Some(k) => out.push(k),
            None if x.get(i) == Some(d) => out.push(0),
            None if !inferred => {
                inferred = true;
                out.push(-1);
            }
            None => return None,
        }
    }
    // Check the replacement reproduces the inferred shape exactly.
    let target: Vec<Dim> = out.iter().map(|&k| Dim::known(k)).collect();
    let nc_attrs = Attrs::default();
    let nc = NodeCtx { name: node, domain: Domain::Onnx, op: "Reshape", opset: 21, attrs: &nc_attrs, num_outputs: 1 };
    let check = reshape_shape(&nc, ctx, x, &target, false).ok()?;
    (check == y).then(|| Tensor::from_i64(DType::I64, vec![out.len()], out))
}

/// Constant `starts`/`ends` (inputs 1 and 2) for a Slice whose bounds are symbolic sizes that
/// inference resolved (see `infer::constant_slice_bounds`).
fn slice_overrides(n: &proto::NodeProto, infos: &HashMap<&str, Info>, ctx: &Ctx) -> Vec<(usize, Tensor)> {
    let x = &infos[n.input[0].as_str()];
    let bounds = |k: usize| n.input.get(k).filter(|s| !s.is_empty()).and_then(|s| infos.get(s.as_str()));
    let rank = x.shape.len() as i64;
    let count = bounds(1).and_then(|b| b.as_dims()).map_or(0, |(d, _)| d.len());
    let axes: Vec<usize> = match bounds(3) {
        Some(a) => match a.as_const().and_then(|t| t.as_i64()) {
            Some(v) => v.iter().map(|&a| if a < 0 { (a + rank) as usize } else { a as usize }).collect(),
            None => return vec![],
        },
        None => (0..count).collect(),
    };
    let mut out = vec![];
    for k in [1, 2] {
        let Some(Known::Dims { dims, .. }) = bounds(k).map(|b| &b.known) else { continue };
        if let Ok(v) = crate::infer::constant_slice_bounds(ctx, dims, &x.shape, &axes) {
            out.push((k, Tensor::from_i64(DType::I64, vec![v.len()], v)));
        }
    }
    out
}

/// A constant Expand target equivalent to the symbolic one: symbolic dims the input already has
/// become 1.
fn expand_constant(x: &[Dim], y: &[Dim], target: &[Dim]) -> Option<Tensor> {
    let mut out = Vec::with_capacity(target.len());
    for (i, t) in target.iter().enumerate() {
        match t.as_known() {
            Some(k) => out.push(k),
            None => {
                let yi = y.len() - target.len() + i;
                let xi = (yi + x.len()).checked_sub(y.len())?;
                if x.get(xi) == Some(&y[yi]) {
                    out.push(1);
                } else {
                    return None;
                }
            }
        }
    }
    Some(Tensor::from_i64(DType::I64, vec![out.len()], out))
}

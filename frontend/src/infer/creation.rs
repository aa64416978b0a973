//! Ops that create a tensor from scalars or a shape: Range (`⌈(limit − start) / delta⌉`
//! elements) and ConstantOfShape (the shape input's values, the `value` attribute's dtype).

use super::node::{one, req, same_dtype, In, NodeCtx};
use super::value::{Ctx, Info};
use crate::error::ErrorKind;
use ir::{DType, Dim};

/// Range: start, limit and delta of one dtype; the length is `limit − start` for a unit delta
/// on symbolic dims, computed for known ones, and a fresh size otherwise.
pub(super) fn range(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (s, l, d) = (req(n, inputs, 0)?, req(n, inputs, 1)?, req(n, inputs, 2)?);
    let dt = same_dtype(n, &[s, l, d])?;
    let len = match (range_len(s, l, d), s.as_const(), l.as_const(), d.as_const()) {
        (Some(len), _, _, _) => len,
        (None, Some(a), Some(b), Some(c)) if dt.is_float() => {
            let (a, b, c) = (a.to_f64_vec()[0], b.to_f64_vec()[0], c.to_f64_vec()[0]);
            Dim::known(((b - a) / c).ceil().max(0.0) as i64)
        }
        _ => ctx.fresh("range"),
    };
    one(dt, vec![len])
}

/// Range's length from integer start, limit and delta known as dims.
fn range_len(s: &Info, l: &Info, d: &Info) -> Option<Dim> {
    let (Some((s, _)), Some((l, _)), Some((d, _))) = (s.as_dims(), l.as_dims(), d.as_dims()) else { return None };
    if s.len() != 1 || l.len() != 1 || d.len() != 1 {
        return None;
    }
    match d[0].as_known() {
        Some(1) => l[0].sub(&s[0]),
        Some(k) if k != 0 => match (s[0].as_known(), l[0].as_known()) {
            (Some(a), Some(b)) => Some(Dim::known(((b - a) as f64 / k as f64).ceil().max(0.0) as i64)),
            _ => None,
        },
        _ => None,
    }
}

/// ConstantOfShape: the shape input's values as dims (fresh sizes when unknown), the dtype of
/// the `value` attribute (float32 without one).
pub(super) fn constant_of_shape(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let s = req(n, inputs, 0)?;
    let (dims, _) = s.as_dims().unwrap_or_else(|| {
        let len = s.shape.first().and_then(|d| d.as_known()).unwrap_or(0);
        ((0..len).map(|_| ctx.fresh("cos")).collect(), false)
    });
    let dt = match n.attrs.tensor("value").map_err(|e| n.bad(e.to_string()))? {
        Some(t) => t.dtype,
        None => DType::F32,
    };
    one(dt, dims)
}

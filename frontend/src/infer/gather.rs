//! Indexing: Gather (the indices' shape replaces the axis), GatherElements (the indices'
//! shape), GatherND (the indices' batch of slices). The scatters keep their data's shape and
//! are dispatched to `like_first_input`.

use super::node::{norm_axis, one, req, In, NodeCtx};
use super::value::{Ctx, Info};
use crate::error::ErrorKind;

/// Gather: `data[:axis] + indices + data[axis+1:]`, with integer indices.
pub(super) fn gather(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (x, idx) = (req(n, inputs, 0)?, req(n, inputs, 1)?);
    if !idx.dtype.is_int() {
        return Err(n.dtype_err(format!("indices are {}", idx.dtype)));
    }
    let r = x.shape.len();
    let axis = norm_axis(n, n.attr_int("axis", 0)?, r)?;
    let mut out = x.shape[..axis].to_vec();
    out.extend(idx.shape.iter().cloned());
    out.extend(x.shape[axis + 1..].iter().cloned());
    one(x.dtype, out)
}

/// GatherElements: the data's dtype, the indices' shape.
pub(super) fn gather_elements(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    one(req(n, inputs, 0)?.dtype, req(n, inputs, 1)?.shape.clone())
}

/// GatherND: `indices[:-1] + data[batch_dims + indices[-1]:]`; the index depth
/// `indices[-1]` must be known.
pub(super) fn gather_nd(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (x, idx) = (req(n, inputs, 0)?, req(n, inputs, 1)?);
    let b = n.attr_int("batch_dims", 0)? as usize;
    let last =
        idx.shape.last().and_then(|d| d.as_known()).ok_or_else(|| n.shape_err("GatherND needs a known index depth"))?
            as usize;
    let mut out = idx.shape[..idx.shape.len() - 1].to_vec();
    out.extend(x.shape.get(b + last..).unwrap_or(&[]).iter().cloned());
    one(x.dtype, out)
}

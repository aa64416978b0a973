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

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use ir::DType::*;

    #[test]
    fn gather_puts_the_indices_shape_in_place_of_its_axis() {
        // Output rank q + r − 1: data[:axis] + indices + data[axis + 1:].
        let (table, ids) = (value(F16, &["49152", "576"]), value(I64, &["batch", "seq"]));
        assert_eq!(TestNode::new("embed", "Gather").types(&[&table, &ids]), ["f16[batch,seq,576]"]);
        let last = TestNode::new("last", "Gather").int("axis", -1);
        assert_eq!(last.types(&[&value(F32, &["batch", "seq", "8"]), &value(I64, &[])]), ["f32[batch,seq]"]);
        let err = TestNode::new("embed", "Gather").refusal(&[&table, &value(F32, &["batch", "seq"])]);
        assert_eq!(err, "node `embed` (Gather): dtype mismatch: indices are f32");
        let err = TestNode::new("embed", "Gather").int("axis", 2).refusal(&[&table, &ids]);
        assert_eq!(err, "node `embed` (Gather): shape mismatch: axis 2 is out of range for rank 2");
    }

    #[test]
    fn gather_elements_has_the_indices_shape() {
        let (data, idx) = (value(F32, &["n", "4"]), value(I64, &["n", "2"]));
        assert_eq!(TestNode::new("ge", "GatherElements").int("axis", 1).types(&[&data, &idx]), ["f32[n,2]"]);
    }

    #[test]
    fn gather_nd_gives_the_indices_batch_of_slices() {
        // indices[:-1] + data[batch_dims + indices[-1]:]
        let nd = TestNode::new("gnd", "GatherND");
        assert_eq!(nd.types(&[&value(F32, &["2", "3", "4"]), &value(I64, &["5", "2"])]), ["f32[5,4]"]);
        let batched = TestNode::new("gnd", "GatherND").int("batch_dims", 1);
        assert_eq!(batched.types(&[&value(F32, &["b", "3", "4"]), &value(I64, &["b", "2", "1"])]), ["f32[b,2,4]"]);
        let err = nd.refusal(&[&value(F32, &["2", "3"]), &value(I64, &["5", "depth"])]);
        assert_eq!(err, "node `gnd` (GatherND): shape mismatch: GatherND needs a known index depth");
    }
}

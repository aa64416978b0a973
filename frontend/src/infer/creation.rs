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

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use crate::infer::Info;
    use ir::DType::*;
    use ir::{Attr, Tensor};

    #[test]
    fn range_over_sizes_with_a_unit_step_has_limit_minus_start_elements() {
        // Position ids: Range(past, past + seq, 1) has seq elements.
        let pos = TestNode::new("pos", "Range");
        assert_eq!(pos.types(&[&size(sym("past")), &size(sum("past", "seq")), &int(1)]), ["i64[seq]"]);
        // Another step on a symbolic bound: a size of its own.
        let out = pos.run(&[&int(0), &size(sym("seq")), &int(2)]).unwrap();
        assert!(out[0].shape[0].as_symbol().is_some_and(|s| s.starts_with("range")), "{}", typed(&out[0]));
    }

    #[test]
    fn range_over_constants_has_ceil_of_the_span_over_the_step_elements() {
        // ⌈(10 − 1) / 3⌉ = 3: 1, 4, 7.
        let out = TestNode::new("r", "Range").run(&[&int(1), &int(10), &int(3)]).unwrap();
        assert_eq!(out[0].as_const().and_then(|t| t.as_i64()), Some(&[1, 4, 7][..]));
        // ⌈(1 − 0) / 0.25⌉ = 4.
        let f = |v: f32| Info::constant(Tensor::scalar_f32(v));
        assert_eq!(TestNode::new("r", "Range").types(&[&f(0.0), &f(1.0), &f(0.25)]), ["f32[4]"]);
        let err = TestNode::new("r", "Range").refusal(&[&int(0), &value(I32, &[]), &int(1)]);
        assert_eq!(err, "node `r` (Range): dtype mismatch: inputs are i64 and i32");
    }

    #[test]
    fn constant_of_shape_has_the_shape_inputs_values_and_the_value_attributes_dtype() {
        let shape = sizes(&[sym("batch"), sym("seq")]);
        let one = Attr::Tensor(Tensor::from_i64(I64, vec![1], vec![1]));
        assert_eq!(TestNode::new("ones", "ConstantOfShape").attr("value", one).types(&[&shape]), ["i64[batch,seq]"]);
        assert_eq!(TestNode::new("zeros", "ConstantOfShape").types(&[&shape]), ["f32[batch,seq]"]);
        let out = TestNode::new("zeros", "ConstantOfShape").run(&[&value(I64, &["2"])]).unwrap();
        assert!(out[0].shape.iter().all(|d| d.as_symbol().is_some()) && out[0].shape.len() == 2);
    }
}

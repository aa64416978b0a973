//! Products: MatMul (numpy matmul: 1-D operands promoted and their dim dropped, batch dims
//! broadcast), MatMulInteger, Gemm (2-D, optional transposes) and Einsum.

use super::node::{broadcast, one, req, same_dtype, In, NodeCtx};
use super::value::{Ctx, Info};
use crate::error::ErrorKind;
use ir::{DType, Dim};

/// MatMul: both operands of one dtype.
pub(super) fn matmul(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (a, b) = (req(n, inputs, 0)?, req(n, inputs, 1)?);
    let dt = same_dtype(n, &[a, b])?;
    one(dt, matmul_shape(n, ctx, &a.shape, &b.shape)?)
}

/// MatMulInteger: 8-bit operands (of either signedness), an int32 product.
pub(super) fn matmul_integer(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (a, b) = (req(n, inputs, 0)?, req(n, inputs, 1)?);
    one(DType::I32, matmul_shape(n, ctx, &a.shape, &b.shape)?)
}

/// Gemm: `[M, K] × [K, N]` after the `transA`/`transB` transposes.
pub(super) fn gemm(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (a, b) = (req(n, inputs, 0)?, req(n, inputs, 1)?);
    let dt = same_dtype(n, &[a, b])?;
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return Err(n.shape_err("Gemm operands must be 2-D"));
    }
    let ta = n.attr_int("transA", 0)? != 0;
    let tb = n.attr_int("transB", 0)? != 0;
    let (m, k1) = if ta { (&a.shape[1], &a.shape[0]) } else { (&a.shape[0], &a.shape[1]) };
    let (k2, nn) = if tb { (&b.shape[1], &b.shape[0]) } else { (&b.shape[0], &b.shape[1]) };
    if k1 != k2 && k1.is_known() && k2.is_known() {
        return Err(n.shape_err(format!("inner dimensions differ: {k1} vs {k2}")));
    }
    one(dt, vec![m.clone(), nn.clone()])
}

/// Einsum: the output dims are the sizes of the output labels (see `ir::eval::parse_einsum`);
/// a letter's sizes must agree, ellipsis dims broadcast.
pub(super) fn einsum(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let ins: Vec<&Info> = inputs.iter().flatten().copied().collect();
    let dt = same_dtype(n, &ins)?;
    let equation = n.attrs.str("equation").map_err(|e| n.bad(e.to_string()))?;
    let equation = equation.ok_or_else(|| n.bad("attribute `equation` is required"))?;
    let ranks: Vec<usize> = ins.iter().map(|i| i.shape.len()).collect();
    let spec = ir::eval::parse_einsum(equation, &ranks).map_err(|e| n.bad(e.to_string()))?;
    let mut sizes: Vec<Option<Dim>> = vec![None; spec.labels];
    for (labels, info) in spec.operands.iter().zip(&ins) {
        for (&l, d) in labels.iter().zip(&info.shape) {
            let d = ctx.normalize(d);
            let broadcast = l < spec.broadcast;
            sizes[l] = Some(match sizes[l].take() {
                None => d,
                Some(m) if m == d => m,
                Some(m) if broadcast && m.as_known() == Some(1) => d,
                Some(m) if broadcast && d.as_known() == Some(1) => m,
                Some(m) if m.is_known() && d.is_known() => {
                    return Err(n.shape_err(format!("a label of `{equation}` has sizes {m} and {d}")))
                }
                Some(m) => ctx.unify(&m, &d),
            });
        }
    }
    let out = spec.output.iter().map(|&l| sizes[l].clone().unwrap_or(Dim::known(1))).collect();
    one(dt, out)
}

/// Numpy matmul shapes: the inner dims must agree (two symbolic ones are unified), a 1-D operand
/// is promoted to a matrix and its dim dropped from the result, batch dims broadcast.
fn matmul_shape(n: &NodeCtx, ctx: &mut Ctx, a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, ErrorKind> {
    if a.is_empty() || b.is_empty() {
        return Err(n.shape_err("MatMul operands must have rank ≥ 1"));
    }
    let (a2, a_vec) = if a.len() == 1 { (vec![Dim::known(1), a[0].clone()], true) } else { (a.to_vec(), false) };
    let (b2, b_vec) = if b.len() == 1 { (vec![b[0].clone(), Dim::known(1)], true) } else { (b.to_vec(), false) };
    let ka = ctx.normalize(&a2[a2.len() - 1]);
    let kb = ctx.normalize(&b2[b2.len() - 2]);
    if ka != kb {
        if ka.is_known() && kb.is_known() {
            return Err(n.shape_err(format!(
                "inner dimensions differ: {} × {}",
                ir::dim::shape_to_string(a),
                ir::dim::shape_to_string(b)
            )));
        }
        ctx.unify(&ka, &kb);
    }
    let batch = broadcast(n, ctx, &[&a2[..a2.len() - 2], &b2[..b2.len() - 2]])?;
    let mut out = batch;
    if !a_vec {
        out.push(a2[a2.len() - 2].clone());
    }
    if !b_vec {
        out.push(b2[b2.len() - 1].clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use crate::infer::Ctx;
    use ir::DType::*;

    #[test]
    fn matmul_broadcasts_batch_dims() {
        let (q, k) = (value(F32, &["batch", "1", "seq", "64"]), value(F32, &["heads", "64", "total"]));
        assert_eq!(TestNode::new("qk", "MatMul").types(&[&q, &k]), ["f32[batch,heads,seq,total]"]);
    }

    #[test]
    fn matmul_drops_the_dims_of_vector_operands() {
        // A 1-D first operand is a row (1 prepended), a 1-D second a column (1 appended); both
        // added dims are removed from the product.
        let mm = TestNode::new("mv", "MatMul");
        assert_eq!(mm.types(&[&value(F32, &["3"]), &value(F32, &["n", "3", "4"])]), ["f32[n,4]"]);
        assert_eq!(mm.types(&[&value(F32, &["n", "2", "3"]), &value(F32, &["3"])]), ["f32[n,2]"]);
        assert_eq!(mm.types(&[&value(F32, &["3"]), &value(F32, &["3"])]), ["f32[]"]);
    }

    #[test]
    fn matmul_unifies_symbolic_inner_dims_and_refuses_known_ones_that_differ() {
        let mut ctx = Ctx::default();
        let (a, b) = (value(F32, &["n", "hidden"]), value(F32, &["d_model", "5"]));
        let out = TestNode::new("proj", "MatMul").infer(&mut ctx, &[Some(&a), Some(&b)]).unwrap();
        assert_eq!(typed(&out[0]), "f32[n,5]");
        assert_eq!(ctx.substitutions, [("hidden".to_string(), sym("d_model"))]);
        let mm = TestNode::new("proj", "MatMul");
        let err = mm.refusal(&[&value(F32, &["2", "3"]), &value(F32, &["4", "5"])]);
        assert_eq!(err, "node `proj` (MatMul): shape mismatch: inner dimensions differ: [2,3] × [4,5]");
        let err = mm.refusal(&[&value(F32, &["2", "3"]), &value(F16, &["3", "5"])]);
        assert_eq!(err, "node `proj` (MatMul): dtype mismatch: inputs are f32 and f16");
    }

    #[test]
    fn matmul_integer_products_are_int32() {
        let (a, b) = (value(U8, &["n", "3"]), value(I8, &["3", "4"]));
        assert_eq!(TestNode::new("qmm", "MatMulInteger").types(&[&a, &b]), ["i32[n,4]"]);
    }

    #[test]
    fn gemm_reads_its_operands_through_trans_a_and_trans_b() {
        // With transA, A is [K, M]; with transB, B is [N, K]; Y is [M, N].
        let (a, b) = (value(F32, &["3", "m"]), value(F32, &["n", "3"]));
        let gemm = TestNode::new("fc", "Gemm").int("transA", 1).int("transB", 1);
        assert_eq!(gemm.types(&[&a, &b, &value(F32, &["n"])]), ["f32[m,n]"]);
        let fc = TestNode::new("fc", "Gemm");
        let err = fc.refusal(&[&value(F32, &["2", "3"]), &value(F32, &["4", "5"])]);
        assert_eq!(err, "node `fc` (Gemm): shape mismatch: inner dimensions differ: 3 vs 4");
        let err = fc.refusal(&[&value(F32, &["1", "2", "3"]), &value(F32, &["3", "5"])]);
        assert_eq!(err, "node `fc` (Gemm): shape mismatch: Gemm operands must be 2-D");
    }

    #[test]
    fn einsum_output_dims_come_from_the_labels() {
        let (a, b) = (value(F32, &["n", "2", "3"]), value(F32, &["n", "3", "4"]));
        let bmm = TestNode::new("bmm", "Einsum").attr("equation", ir::Attr::Str("bij,bjk->bik".into()));
        assert_eq!(bmm.types(&[&a, &b]), ["f32[n,2,4]"]);
        let err = bmm.refusal(&[&a, &value(F32, &["n", "5", "4"])]);
        assert_eq!(err, "node `bmm` (Einsum): shape mismatch: a label of `bij,bjk->bik` has sizes 3 and 5");
        // Ellipsis dims broadcast: n against 1.
        let ell = TestNode::new("ell", "Einsum").attr("equation", ir::Attr::Str("...ij,...jk->...ik".into()));
        assert_eq!(ell.types(&[&a, &value(F32, &["1", "3", "4"])]), ["f32[n,2,4]"]);
    }
}

//! Quantisation: QuantizeLinear (the zero point's dtype, else `output_dtype`, else uint8),
//! DequantizeLinear (the scale's dtype), DynamicQuantizeLinear, and com.microsoft's 4-bit
//! MatMulNBits and GatherBlockQuantized.

use super::node::{attr_dtype, norm_axis, one, opt, req, In, NodeCtx};
use super::value::{Ctx, Info};
use crate::error::ErrorKind;
use ir::{DType, Dim};

/// QuantizeLinear: the input's shape, the zero point's dtype (else `output_dtype`, else uint8).
pub(super) fn quantize(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    let dt = match (opt(inputs, 2), attr_dtype(n, "output_dtype")?) {
        (Some(zp), _) => zp.dtype,
        (None, Some(d)) => d,
        (None, None) => DType::U8,
    };
    one(dt, x.shape.clone())
}

/// DequantizeLinear: the input's shape, the scale's dtype; a zero point has the input's dtype.
pub(super) fn dequantize(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (x, scale) = (req(n, inputs, 0)?, req(n, inputs, 1)?);
    if let Some(zp) = opt(inputs, 2) {
        if zp.dtype != x.dtype {
            return Err(n.dtype_err(format!("input is {} but zero point is {}", x.dtype, zp.dtype)));
        }
    }
    one(scale.dtype, x.shape.clone())
}

/// DynamicQuantizeLinear: uint8 codes of the input's shape, a float32 scale and a uint8 zero
/// point, both scalars.
pub(super) fn dynamic_quantize(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    Ok(vec![Info::new(DType::U8, x.shape.clone()), Info::new(DType::F32, vec![]), Info::new(DType::U8, vec![])])
}

/// MatMulNBits: `A[..., K]` times the packed `[K, N]` weight is `[..., N]`, of A's dtype.
pub(super) fn matmul_nbits(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let a = req(n, inputs, 0)?;
    let k = n.attr_int("K", -1)?;
    let nn = n.attr_int("N", -1)?;
    if k <= 0 || nn <= 0 {
        return Err(n.bad("MatMulNBits needs positive K and N attributes"));
    }
    let last = a.shape.last().ok_or_else(|| n.shape_err("input A is a scalar"))?;
    if last.as_known().is_some_and(|d| d != k) {
        return Err(n.shape_err(format!("A's last dim is {last} but K = {k}")));
    }
    let mut out = a.shape.clone();
    *out.last_mut().unwrap() = Dim::known(nn);
    one(a.dtype, out)
}

/// GatherBlockQuantized: Gather on the data's logical shape (a uint8 last dim holds `8 / bits`
/// values per byte), of the scales' dtype.
pub(super) fn gather_block_quantized(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (data, idx, scales) = (req(n, inputs, 0)?, req(n, inputs, 1)?, req(n, inputs, 2)?);
    let axis = norm_axis(n, n.attr_int("gather_axis", 0)?, data.shape.len())?;
    let mut logical = data.shape.clone();
    if data.dtype == DType::U8 {
        let bits = n.attr_int("bits", 4)?;
        let per_byte = 8 / bits.clamp(1, 8);
        let last = logical.len() - 1;
        logical[last] = logical[last].mul(&Dim::known(per_byte)).ok_or_else(|| n.shape_err("overflow"))?;
    }
    let mut out = logical[..axis].to_vec();
    out.extend(idx.shape.iter().cloned());
    out.extend(logical[axis + 1..].iter().cloned());
    one(scales.dtype, out)
}

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use ir::DType::*;

    #[test]
    fn quantize_has_the_zero_points_dtype_else_output_dtype_else_u8() {
        let (x, scale) = (value(F32, &["n", "64"]), value(F32, &[]));
        let q = TestNode::new("q", "QuantizeLinear");
        assert_eq!(q.types(&[&x, &scale, &value(I8, &[])]), ["i8[n,64]"]);
        assert_eq!(q.types(&[&x, &scale]), ["u8[n,64]"]);
        // output_dtype is a TensorProto.DataType code: 3 is INT8.
        assert_eq!(TestNode::new("q", "QuantizeLinear").int("output_dtype", 3).types(&[&x, &scale]), ["i8[n,64]"]);
    }

    #[test]
    fn dequantize_has_the_scales_dtype_and_a_zero_point_of_the_inputs_dtype() {
        let (x, scale) = (value(I8, &["64", "32"]), value(F16, &["32"]));
        let dq = TestNode::new("dq", "DequantizeLinear").int("axis", 1);
        assert_eq!(dq.types(&[&x, &scale, &value(I8, &["32"])]), ["f16[64,32]"]);
        let err = dq.refusal(&[&value(U8, &["64", "32"]), &scale, &value(I8, &["32"])]);
        assert_eq!(err, "node `dq` (DequantizeLinear): dtype mismatch: input is u8 but zero point is i8");
    }

    #[test]
    fn dynamic_quantize_gives_u8_codes_and_scalar_parameters() {
        let dq = TestNode::new("dyn", "DynamicQuantizeLinear").outputs(3);
        assert_eq!(dq.types(&[&value(F32, &["n", "8"])]), ["u8[n,8]", "f32[]", "u8[]"]);
    }

    #[test]
    fn matmul_nbits_replaces_the_last_dim_k_by_n() {
        let a = value(F16, &["batch", "seq", "576"]);
        let (b, scales) = (value(U8, &["1536", "18", "16"]), value(F16, &["1536", "18"]));
        let proj = TestNode::contrib("q_proj", "MatMulNBits").int("K", 576).int("N", 1536).int("block_size", 32);
        assert_eq!(proj.types(&[&a, &b, &scales]), ["f16[batch,seq,1536]"]);
        let err = proj.refusal(&[&value(F16, &["batch", "seq", "512"]), &b, &scales]);
        assert_eq!(err, "node `q_proj` (MatMulNBits): shape mismatch: A's last dim is 512 but K = 576");
        let err = TestNode::contrib("q_proj", "MatMulNBits").refusal(&[&a, &b, &scales]);
        assert_eq!(err, "node `q_proj` (MatMulNBits): MatMulNBits needs positive K and N attributes");
    }

    #[test]
    fn gather_block_quantized_gathers_the_unpacked_rows_in_the_scales_dtype() {
        // uint8 data holds two 4-bit values a byte: 288 bytes are 576 values.
        let (data, ids) = (value(U8, &["49152", "288"]), value(I64, &["batch", "seq"]));
        let scales = value(F16, &["49152", "18"]);
        let embed = TestNode::contrib("embed", "GatherBlockQuantized").int("block_size", 32);
        assert_eq!(embed.types(&[&data, &ids, &scales]), ["f16[batch,seq,576]"]);
        let int4 = value(I4, &["49152", "576"]);
        assert_eq!(embed.types(&[&int4, &ids, &scales]), ["f16[batch,seq,576]"]);
    }
}

//! Normalisations over the trailing axes: LayerNormalization, SimplifiedLayerNormalization and
//! RMSNormalization from `axis` on, com.microsoft's SkipSimplifiedLayerNormalization over the
//! last axis after adding the skip input.

use super::node::{broadcast, norm_axis, req, same_dtype, In, NodeCtx};
use super::value::{Ctx, Info};
use crate::error::ErrorKind;
use ir::{DType, Dim};

/// The normalised input keeps its shape; the optional statistics outputs (mean, inverse
/// standard deviation) are float32 with the normalised axes kept as 1.
pub(super) fn layer_norm(n: &NodeCtx, _ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let x = req(n, inputs, 0)?;
    let axis = norm_axis(n, n.attr_int("axis", -1)?, x.shape.len())?;
    let mut stat = x.shape[..axis].to_vec();
    stat.extend(std::iter::repeat_n(Dim::known(1), x.shape.len() - axis));
    let mut outs = vec![Info::new(x.dtype, x.shape.clone())];
    for _ in 1..n.num_outputs {
        outs.push(Info::new(DType::F32, stat.clone()));
    }
    Ok(outs)
}

/// SkipSimplifiedLayerNormalization: input and skip of one dtype, broadcast; outputs 1 and 2
/// are float32 statistics over the last axis, output 3 the sum input + skip.
pub(super) fn skip_simplified(n: &NodeCtx, ctx: &mut Ctx, inputs: In) -> Result<Vec<Info>, ErrorKind> {
    let (x, skip) = (req(n, inputs, 0)?, req(n, inputs, 1)?);
    same_dtype(n, &[x, skip])?;
    let shape = broadcast(n, ctx, &[&x.shape, &skip.shape])?;
    let mut stat = shape[..shape.len() - 1].to_vec();
    stat.push(Dim::known(1));
    let mut outs = vec![Info::new(x.dtype, shape.clone())];
    for i in 1..n.num_outputs {
        outs.push(if i == 3 { Info::new(x.dtype, shape.clone()) } else { Info::new(DType::F32, stat.clone()) });
    }
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use crate::infer::testing::*;
    use ir::DType::*;

    #[test]
    fn layer_norm_statistics_are_f32_with_the_normalised_axes_kept_as_1() {
        let x = value(F16, &["batch", "seq", "64"]);
        let ln = TestNode::new("ln", "LayerNormalization").outputs(3);
        let (scale, bias) = (value(F16, &["64"]), value(F16, &["64"]));
        assert_eq!(ln.types(&[&x, &scale, &bias]), ["f16[batch,seq,64]", "f32[batch,seq,1]", "f32[batch,seq,1]"]);
        let from_1 = TestNode::new("ln", "LayerNormalization").int("axis", 1).outputs(2);
        assert_eq!(from_1.types(&[&x, &value(F16, &["seq", "64"])]), ["f16[batch,seq,64]", "f32[batch,1,1]"]);
        let err = TestNode::new("ln", "LayerNormalization").int("axis", -4).refusal(&[&x, &scale]);
        assert_eq!(err, "node `ln` (LayerNormalization): shape mismatch: axis -4 is out of range for rank 3");
    }

    #[test]
    fn rms_norms_keep_the_input_type() {
        let (x, scale) = (value(F16, &["batch", "seq", "64"]), value(F16, &["64"]));
        assert_eq!(TestNode::new("rms", "RMSNormalization").types(&[&x, &scale]), ["f16[batch,seq,64]"]);
        let simplified = TestNode::new("rms", "SimplifiedLayerNormalization").outputs(2);
        assert_eq!(simplified.types(&[&x, &scale]), ["f16[batch,seq,64]", "f32[batch,seq,1]"]);
    }

    #[test]
    fn skip_simplified_layer_norm_adds_the_skip_and_returns_the_sum_as_output_3() {
        // Outputs: output, mean, inv_std_var (float, [batch, sequence, 1]), input_skip_bias_sum.
        let (x, gamma) = (value(F16, &["batch", "seq", "64"]), value(F16, &["64"]));
        let node = TestNode::contrib("skip_ln", "SkipSimplifiedLayerNormalization").outputs(4);
        let want = ["f16[batch,seq,64]", "f32[batch,seq,1]", "f32[batch,seq,1]", "f16[batch,seq,64]"];
        assert_eq!(node.types(&[&x, &x, &gamma]), want);
        let err = node.refusal(&[&x, &value(F32, &["batch", "seq", "64"]), &gamma]);
        assert_eq!(err, "node `skip_ln` (SkipSimplifiedLayerNormalization): dtype mismatch: inputs are f16 and f32");
    }
}

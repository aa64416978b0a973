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

//! Lowerings of a mixture-of-experts router written as plain ONNX ops (LFM2-MoE as the builder
//! writes it: sigmoid scores plus an expert bias, `TopK`, `GatherElements`, the chosen scores'
//! logarithms scattered over a `ConstantOfShape` for the MoE's softmax, and the row's score sum):
//! the router runs in the segment, and the MoE it feeds is a host step (see `partition`).
//! Shapes are static in a token block, so `Shape` is a constant.

use crate::lower::Lower;
use crate::ops::form;
use crate::xml::{Et, Port};
use crate::LowerError;
use ir::graph::ValueDef;
use ir::Node;

impl Lower<'_> {
    /// The f32 values of constant input `i`.
    fn const_floats(&self, n: &Node, i: usize) -> Option<Vec<f32>> {
        match &self.g.value(n.inputs.get(i).copied().flatten()?).def {
            ValueDef::Const(t) => Some(t.to_f32_vec()),
            ValueDef::Weight(w) => Some(self.g.weights.get(*w).to_tensor().ok()?.to_f32_vec()),
            _ => None,
        }
    }

    /// The axis attribute of `n`, counted from the front of a rank-`rank` input.
    fn axis(n: &Node, rank: usize) -> Result<usize, LowerError> {
        let a = n.attrs.int_or("axis", 0)?;
        let axis = if a < 0 { a + rank as i64 } else { a };
        usize::try_from(axis).ok().filter(|&a| a < rank).ok_or_else(|| LowerError::Form(format!("axis {a}")))
    }

    /// Shape: the input's static shape, as an i64 constant.
    pub(crate) fn shape_of(&mut self, n: &Node) -> Result<Port, LowerError> {
        let x = self.input(n, 0)?;
        let dims: Vec<i64> = x.shape.iter().map(|&d| d as i64).collect();
        Ok(self.net.const_i64(self.bin, &dims, &[dims.len()]))
    }

    /// ConstantOfShape of a static shape: a constant filled with the `value` attribute (0 when
    /// absent).
    pub(crate) fn constant_of_shape(&mut self, n: &Node) -> Result<Port, LowerError> {
        let value = match n.attrs.tensor("value")? {
            Some(t) => *t.to_f32_vec().first().ok_or_else(|| form("ConstantOfShape of an empty value"))?,
            None => 0.0,
        };
        let shape = self.shape(n.outputs[0])?;
        let count = shape.iter().product();
        Ok(self.net.const_f32(self.bin, &vec![value; count], &shape))
    }

    /// Reciprocal as `1 / x`.
    pub(crate) fn reciprocal(&mut self, n: &Node) -> Result<Port, LowerError> {
        let x = self.input(n, 0)?;
        let one = self.scalar(1.0);
        Ok(self.net.binary("Divide", &one, &x)?)
    }

    /// Clip with constant bounds (absent ones unbounded) as `Clamp`.
    pub(crate) fn clip(&mut self, n: &Node) -> Result<Port, LowerError> {
        let x = self.input(n, 0)?;
        let bound = |s: &Self, i: usize, none: f32| match n.inputs.get(i).copied().flatten() {
            None => Ok(none),
            Some(_) => s.const_floats(n, i).and_then(|v| v.first().copied()).ok_or(LowerError::NotConstant("bound")),
        };
        let (min, max) = (bound(self, 1, f32::MIN)?, bound(self, 2, f32::MAX)?);
        let data = vec![("min", format!("{min:e}")), ("max", format!("{max:e}"))];
        Ok(self.net.layer("Clamp", "opset1", data, &[&x], &[(x.et, x.shape.clone())]).remove(0))
    }

    /// ReduceSum over the last axis, keeping it.
    pub(crate) fn reduce_sum(&mut self, n: &Node) -> Result<Port, LowerError> {
        let x = self.input(n, 0)?;
        let rank = x.shape.len() as i64;
        let axes = self.const_ints(n.inputs.get(1).copied().flatten()).ok_or(LowerError::NotConstant("axes"))?;
        if n.attrs.int_or("keepdims", 1)? != 1 || !(axes == [-1] || axes == [rank - 1]) {
            return Err(form("ReduceSum other than over the last axis, kept"));
        }
        Ok(self.net.reduce_last(self.bin, "ReduceSum", &x))
    }

    /// TopK with a constant k: values and i64 indices, sorted by value, ties to the lower index.
    pub(crate) fn top_k(&mut self, n: &Node) -> Result<Vec<Port>, LowerError> {
        let x = self.input(n, 0)?;
        let k = self.const_ints(n.inputs.get(1).copied().flatten()).ok_or(LowerError::NotConstant("k"))?;
        let [k] = k[..] else { return Err(form("TopK with more than one k")) };
        let axis = Self::axis(n, x.shape.len())?;
        if n.attrs.int_or("sorted", 1)? != 1 || k < 1 || k as usize > x.shape[axis] {
            return Err(LowerError::Form(format!("TopK of {k} along an axis of {}, unsorted", x.shape[axis])));
        }
        let mode = if n.attrs.int_or("largest", 1)? == 1 { "max" } else { "min" };
        let kp = self.net.const_i64(self.bin, &[k], &[]);
        let mut shape = x.shape.clone();
        shape[axis] = k as usize;
        let data = vec![
            ("axis", axis.to_string()),
            ("mode", mode.into()),
            ("sort", "value".into()),
            ("index_element_type", "i64".into()),
            ("stable", "true".into()),
        ];
        Ok(self.net.layer("TopK", "opset11", data, &[&x, &kp], &[(x.et, shape.clone()), (Et::I64, shape)]))
    }

    /// GatherElements along its axis.
    pub(crate) fn gather_elements(&mut self, n: &Node) -> Result<Port, LowerError> {
        let (x, idx) = (self.input(n, 0)?, self.input(n, 1)?);
        let axis = Self::axis(n, x.shape.len())?;
        let data = vec![("axis", axis.to_string())];
        Ok(self.net.layer("GatherElements", "opset6", data, &[&x, &idx], &[(x.et, idx.shape.clone())]).remove(0))
    }

    /// ScatterElements (no reduction) as `ScatterElementsUpdate`.
    pub(crate) fn scatter_elements(&mut self, n: &Node) -> Result<Port, LowerError> {
        if n.attrs.str("reduction")?.is_some_and(|r| r != "none") {
            return Err(form("ScatterElements with a reduction"));
        }
        let (x, idx, updates) = (self.input(n, 0)?, self.input(n, 1)?, self.input(n, 2)?);
        let axis = Self::axis(n, x.shape.len())?;
        let a = self.net.const_i64(self.bin, &[axis as i64], &[]);
        let out = [(x.et, x.shape.clone())];
        Ok(self.net.layer("ScatterElementsUpdate", "opset3", vec![], &[&x, &idx, &updates, &a], &out).remove(0))
    }
}

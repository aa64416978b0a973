//! Lowering one segment of the program into an OpenVINO network for one token block size.

use crate::partition::Segment;
use crate::rope::RopeTables;
use crate::xml::{Bin, Et, Net, Port};
use crate::{qdq, IntelError, LowerError};
use bundle::intel::{InputType, Role, SegmentInput, SegmentOutput};
use ir::graph::{Graph, ValueDef, ValueId};
use ir::{DType, Domain, Node};
use std::collections::{BTreeMap, HashMap, HashSet};

pub(crate) struct Lower<'a> {
    pub g: &'a Graph,
    pub bin: &'a mut Bin,
    pub net: Net,
    pub vals: HashMap<ValueId, Port>,
    pub t: usize,
    pub width: usize,
    /// The host-fed RoPE table each Rope cos/sin input reads.
    pub rope_names: &'a HashMap<ValueId, String>,
    /// f32 weights that hold f16 values, stored as f16.
    pub f16_weights: &'a HashSet<ir::WeightId>,
    /// Quantised values, represented by their dequantised ports (see [`qdq`]).
    pub quantized: HashMap<ValueId, qdq::QParams>,
}

impl<'a> Lower<'a> {
    /// A lowering into the network `name` for blocks of `t` tokens.
    pub(crate) fn new(
        g: &'a Graph,
        bin: &'a mut Bin,
        rope: &'a RopeTables,
        f16_weights: &'a HashSet<ir::WeightId>,
        name: &str,
        t: usize,
    ) -> Lower<'a> {
        Lower {
            g,
            bin,
            net: Net::new(name),
            vals: HashMap::new(),
            t,
            width: rope.width,
            rope_names: &rope.names,
            f16_weights,
            quantized: HashMap::new(),
        }
    }

    pub(crate) fn shape(&self, v: ValueId) -> Result<Vec<usize>, IntelError> {
        let t = self.t as i64;
        let dims = |name: &str| match name {
            "batch_size" | "batch" => Some(1),
            "sequence_length" => Some(t),
            _ => None,
        };
        let val = self.g.value(v);
        val.shape.iter().map(|d| d.eval(&dims).map(|x| x as usize)).collect::<Option<Vec<_>>>().ok_or_else(|| {
            IntelError::Shape {
                value: val.name.clone(),
                msg: format!("shape {:?} is not static in a token block", val.shape),
            }
        })
    }

    /// Lowers one segment: returns its inputs and outputs in the network's order, each with its
    /// shape for this block size.
    pub(crate) fn segment(&mut self, seg: &Segment) -> Result<(Vec<SegmentInput>, Vec<SegmentOutput>), IntelError> {
        let inputs = self.parameters(seg)?;
        for &ni in &seg.nodes {
            self.node(self.g.node(ni))?;
        }
        let mut outputs = Vec::new();
        for &o in &seg.outputs {
            let p = self.vals[&o].clone();
            let name = self.g.value(o).name.clone();
            self.net.result(&p, &name);
            outputs.push(SegmentOutput { name, shape: BTreeMap::from([(self.t, p.shape.clone())]) });
        }
        Ok((inputs, outputs))
    }

    /// The network's parameters for the segment's inputs: one per input, except that the inputs
    /// reading one RoPE table share its parameter (`[1, 1, T, width]`, reshaped as each reads it).
    fn parameters(&mut self, seg: &Segment) -> Result<Vec<SegmentInput>, IntelError> {
        let mut inputs = Vec::new();
        let mut rope: HashMap<String, Port> = HashMap::new();
        for &v in &seg.inputs {
            let val = self.g.value(v);
            // An M-RoPE cache is read as the rows of the block's positions.
            let mut shape = match val.def {
                ValueDef::Weight(_) => vec![1, 1, self.t, self.width],
                _ => self.shape(v)?,
            };
            if seg.last_row_only {
                if let Some(s) = shape.iter_mut().rev().nth(1) {
                    *s = 1;
                }
            }
            let (role, name) = if let Some(table) = self.rope_names.get(&v) {
                (Role::Rope, table.clone())
            } else if matches!(val.def, ValueDef::Input) {
                (Role::Input, val.name.clone())
            } else {
                (Role::Value, val.name.clone())
            };
            let (et, dtype) = match val.dtype {
                DType::F32 => (Et::F32, InputType::F32),
                DType::I64 => (Et::I64, InputType::I64),
                other => {
                    return Err(IntelError::Shape {
                        value: val.name.clone(),
                        msg: format!("segment input of type {other}"),
                    })
                }
            };
            let port = if role == Role::Rope {
                let p = match rope.get(&name) {
                    Some(p) => p.clone(),
                    None => {
                        let canonical = vec![1, 1, self.t, self.width];
                        let p = self.net.parameter(&name, Et::F32, &canonical);
                        let shape = BTreeMap::from([(self.t, canonical)]);
                        inputs.push(SegmentInput { name: name.clone(), role, dtype: InputType::F32, shape });
                        rope.insert(name, p.clone());
                        p
                    }
                };
                if p.shape != shape {
                    self.net.reshape(self.bin, &p, &shape)
                } else {
                    p
                }
            } else {
                let p = self.net.parameter(&name, et, &shape);
                inputs.push(SegmentInput { name, role, dtype, shape: BTreeMap::from([(self.t, shape)]) });
                p
            };
            self.vals.insert(v, port);
        }
        Ok(inputs)
    }

    /// The port of a value: lowered already, or a constant.
    pub(crate) fn port(&mut self, v: ValueId) -> Result<Port, IntelError> {
        if let Some(p) = self.vals.get(&v) {
            return Ok(p.clone());
        }
        let val = self.g.value(v);
        let p = match &val.def {
            ValueDef::Weight(id) if self.f16_weights.contains(id) => {
                let g = self.g;
                let w = g.weights.get(*id);
                let r = self.bin.keyed(&format!("f16w:{}", w.name), || {
                    w.bytes
                        .chunks_exact(4)
                        .flat_map(|c| half::f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes())
                        .collect()
                });
                let c = self.net.constant(Et::F16, &w.shape, r);
                self.net.convert(&c, Et::F32)
            }
            ValueDef::Weight(w) => {
                let w = self.g.weights.get(*w);
                let et = match w.dtype {
                    DType::F32 => Et::F32,
                    DType::F16 => Et::F16,
                    DType::I64 => Et::I64,
                    DType::I32 => Et::I32,
                    DType::I8 => Et::I8,
                    DType::U8 => Et::U8,
                    other => {
                        return Err(IntelError::Shape { value: w.name.clone(), msg: format!("weight of type {other}") })
                    }
                };
                let bytes = w.bytes.clone();
                let r = self.bin.keyed(&format!("raw:{}", w.name), || bytes.to_vec());
                self.net.constant(et, &w.shape, r)
            }
            ValueDef::Const(t) => match t.dtype {
                DType::F32 | DType::F64 | DType::F16 => self.net.const_f32(self.bin, &t.to_f32_vec(), &t.shape),
                DType::I64 | DType::I32 => self.net.const_i64(self.bin, t.as_i64().unwrap_or(&[]), &t.shape),
                other => {
                    return Err(IntelError::Shape { value: val.name.clone(), msg: format!("constant of type {other}") })
                }
            },
            ValueDef::Node { node, .. } if self.g.compile_time_nodes()[node.0 as usize] => {
                self.node(self.g.node(*node))?;
                return Ok(self.vals[&v].clone());
            }
            _ => {
                return Err(IntelError::Shape {
                    value: val.name.clone(),
                    msg: "is read before it is computed in its segment".into(),
                })
            }
        };
        self.vals.insert(v, p.clone());
        Ok(p)
    }

    pub(crate) fn const_ints(&self, v: Option<ValueId>) -> Option<Vec<i64>> {
        match &self.g.value(v?).def {
            ValueDef::Const(t) => t.as_i64().map(|s| s.to_vec()),
            ValueDef::Weight(w) => self.g.weights.get(*w).to_tensor().ok()?.as_i64().map(|s| s.to_vec()),
            _ => None,
        }
    }

    pub(crate) fn node(&mut self, n: &Node) -> Result<(), IntelError> {
        let fail = |msg: String| IntelError::Unsupported { node: n.name.clone(), msg };
        // Codes are read by what dequantises them, or passed on by what only moves elements.
        let codes_in = n.inputs.iter().flatten().find(|v| self.quantized.contains_key(v)).copied();
        let passes_codes = qdq::moves_elements(n) && n.inputs[0].is_some_and(|v| self.quantized.contains_key(&v));
        if let Some(c) = codes_in {
            let reads_codes = matches!((n.domain, n.op), (Domain::Onnx, "DequantizeLinear") | (Domain::Npuc, "QGemm"));
            if !reads_codes && !passes_codes {
                return Err(fail(format!(
                    "{}::{} reads the quantised codes `{}` (only DequantizeLinear, QGemm and ops that move elements may)",
                    n.domain,
                    n.op,
                    self.g.value(c).name
                )));
            }
        }
        let r = self.lower_op(n).map_err(|e| IntelError::Lowering { node: n.name.clone(), error: Box::new(e) })?;
        if passes_codes {
            let q = self.quantized[&n.inputs[0].unwrap()];
            for &o in &n.outputs {
                self.quantized.insert(o, q);
            }
        }
        for (o, p) in n.outputs.iter().zip(r) {
            let want = self.shape(*o)?;
            let got_rows = if want.len() >= 2 && p.shape.len() == want.len() { p.shape[want.len() - 2] } else { 0 };
            // The lm_head segment runs on one row whatever the block.
            if p.shape != want && !(got_rows == 1 && p.shape.last() == want.last()) {
                return Err(IntelError::Unsupported {
                    node: n.name.clone(),
                    msg: format!("lowered to shape {:?}, the program says {:?}", p.shape, want),
                });
            }
            self.vals.insert(*o, p);
        }
        Ok(())
    }

    /// The ports of `n`'s outputs, by the lowering of its op.
    fn lower_op(&mut self, n: &Node) -> Result<Vec<Port>, LowerError> {
        let one = |p: Port| vec![p];
        Ok(match (n.domain, n.op) {
            (Domain::Onnx, "Reshape" | "Unsqueeze" | "Squeeze" | "Flatten" | "Identity") => one(self.reshape(n)?),
            (Domain::Onnx, "Transpose") => one(self.transpose(n)?),
            (Domain::Onnx, "Slice") => one(self.slice(n)?),
            (Domain::Onnx, "Concat") => one(self.concat(n)?),
            (Domain::Onnx, "Gather") => one(self.gather(n)?),
            (Domain::Microsoft, "GatherBlockQuantized") => one(self.gather_block_quantized(n)?),
            (Domain::Onnx, "Add" | "Sub" | "Mul" | "Div" | "Pow") => one(self.elementwise(n)?),
            (Domain::Onnx, "Sqrt" | "Neg" | "Sigmoid" | "Exp" | "Tanh" | "Abs" | "Log") => one(self.unary(n)?),
            (Domain::Onnx, "MatMul") => {
                let (a, b) = (self.input(n, 0)?, self.input(n, 1)?);
                one(self.net.matmul(&a, &b, false)?)
            }
            (Domain::Npuc, op @ ("RmsNorm" | "RmsNormRowScaled")) => {
                let eps = n.attrs.float_or("epsilon", 1e-5)?;
                let (x, g) = (self.input(n, 0)?, self.input(n, 1)?);
                one(self.rms_norm(&x, &g, eps, op == "RmsNormRowScaled")?)
            }
            (Domain::Npuc, "SkipRmsNorm" | "SkipRmsNormRowScaled") => self.skip_rms_norm(n)?,
            (Domain::Npuc, "Rope") => one(self.rope(n)?),
            (Domain::Npuc, "Silu") => {
                let x = self.input(n, 0)?;
                let sg = self.net.unary("Sigmoid", &x);
                one(self.net.binary("Multiply", &x, &sg)?)
            }
            (Domain::Npuc, "SwiGlu") => one(self.swiglu(n)?),
            (Domain::Npuc, "GeluTanh") => {
                let x = self.input(n, 0)?;
                one(self.gelu_tanh(&x)?)
            }
            (Domain::Npuc, "GeluGate") => {
                let (g, u) = (self.input(n, 0)?, self.input(n, 1)?);
                let gelu = self.gelu_tanh(&g)?;
                one(self.net.binary("Multiply", &gelu, &u)?)
            }
            (Domain::Npuc, "WGemm" | "WGemmRowScaled") => one(self.wgemm(n)?),
            (Domain::Onnx, "QuantizeLinear") => one(self.quantize_linear(n)?),
            (Domain::Onnx, "DequantizeLinear") => one(self.dequantize_linear(n)?),
            (Domain::Npuc, "QGemm") => one(self.qgemm(n)?),
            (Domain::Onnx, "LpNormalization") => one(self.l2_norm(n, false)?),
            (Domain::Npuc, "L2NormRowScaled") => one(self.l2_norm(n, true)?),
            (Domain::Microsoft, "LinearAttentionGate") => self.linear_attention_gate(n)?,
            (Domain::Microsoft, "GatedRMSNorm") => one(self.gated_rms_norm(n, false)?),
            (Domain::Npuc, "GatedRmsNormRowScaled") => one(self.gated_rms_norm(n, true)?),
            (Domain::Microsoft, "GatedAdd") => one(self.gated_add(n)?),
            (Domain::Microsoft, "MRotaryEmbedding") => one(self.m_rope(n)?),
            (Domain::Onnx, "Shape") => one(self.shape_of(n)?),
            (Domain::Onnx, "ConstantOfShape") => one(self.constant_of_shape(n)?),
            (Domain::Onnx, "Reciprocal") => one(self.reciprocal(n)?),
            (Domain::Onnx, "Clip") => one(self.clip(n)?),
            (Domain::Onnx, "ReduceSum") => one(self.reduce_sum(n)?),
            (Domain::Onnx, "TopK") => self.top_k(n)?,
            (Domain::Onnx, "GatherElements") => one(self.gather_elements(n)?),
            (Domain::Onnx, "ScatterElements") => one(self.scatter_elements(n)?),
            (d, op) => return Err(LowerError::Form(format!("{d}::{op} has no OpenVINO lowering"))),
        })
    }

    /// The port of `n`'s input `i`, which must be present.
    pub(crate) fn input(&mut self, n: &Node, i: usize) -> Result<Port, LowerError> {
        let v = n.inputs.get(i).copied().flatten().ok_or(LowerError::MissingInput(i))?;
        Ok(self.port(v)?)
    }
}

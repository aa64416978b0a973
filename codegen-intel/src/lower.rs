//! Lowering one segment of the program into an OpenVINO network for one token block size.

use crate::partition::Segment;
use crate::rope::RopeTables;
use crate::xml::{Bin, Et, Net, Port};
use crate::{qdq, IntelError};
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
            let mut shape = self.shape(v)?;
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
        let r = self.node_inner(n).map_err(fail)?;
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

    fn node_inner(&mut self, n: &Node) -> Result<Vec<Port>, String> {
        let input = |i: usize| n.inputs.get(i).copied().flatten().ok_or_else(|| format!("input {i} is missing"));
        let eps = n.attrs.float_or("epsilon", 1e-5).map_err(|e| e.to_string())?;
        let out_shape = |s: &Self, i: usize| s.shape(n.outputs[i]).map_err(|e| e.to_string());
        let one = |p: Port| Ok(vec![p]);
        match (n.domain, n.op) {
            (Domain::Onnx, "Reshape" | "Unsqueeze" | "Squeeze" | "Flatten" | "Identity") => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let mut shape = out_shape(self, 0)?;
                if shape.iter().product::<usize>() != x.shape.iter().product::<usize>() {
                    // Only in the one-row lm_head segment: keep the row count of the input.
                    let rows = x.shape.iter().rev().skip(1).product::<usize>();
                    let l = shape.len();
                    shape[..l - 1].iter_mut().for_each(|d| *d = 1);
                    if l >= 2 {
                        shape[l - 2] = rows;
                    }
                }
                one(self.net.reshape(self.bin, &x, &shape))
            }
            (Domain::Onnx, "Transpose") => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let perm: Vec<usize> = match n.attrs.ints("perm").map_err(|e| e.to_string())? {
                    Some(p) => p.iter().map(|&d| d as usize).collect(),
                    None => (0..x.shape.len()).rev().collect(),
                };
                one(self.net.transpose(self.bin, &x, &perm))
            }
            (Domain::Onnx, "Slice") => {
                let mut x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let starts = self.const_ints(n.inputs.get(1).copied().flatten()).ok_or("non-constant starts")?;
                let ends = self.const_ints(n.inputs.get(2).copied().flatten()).ok_or("non-constant ends")?;
                let rank = x.shape.len() as i64;
                let axes = match n.inputs.get(3).copied().flatten() {
                    Some(a) => self.const_ints(Some(a)).ok_or("non-constant axes")?,
                    None => (0..starts.len() as i64).collect(),
                };
                if let Some(st) = n.inputs.get(4).copied().flatten() {
                    if self.const_ints(Some(st)).ok_or("non-constant steps")?.iter().any(|&s| s != 1) {
                        return Err("Slice with a step other than 1".into());
                    }
                }
                for ((&s, &e), &a) in starts.iter().zip(&ends).zip(&axes) {
                    let axis = if a < 0 { a + rank } else { a } as usize;
                    let dim = x.shape[axis] as i64;
                    let norm = |v: i64| (if v < 0 { v + dim } else { v }).clamp(0, dim) as usize;
                    let (b, e) = (norm(s), norm(e).max(norm(s)));
                    x = self.net.slice(self.bin, &x, axis, b, e);
                }
                one(x)
            }
            (Domain::Onnx, "Concat") => {
                let mut ports = Vec::new();
                for v in n.inputs.iter().flatten() {
                    ports.push(self.port(*v).map_err(|e| e.to_string())?);
                }
                let rank = ports[0].shape.len() as i64;
                let a = n.attrs.int_or("axis", 0).map_err(|e| e.to_string())?;
                let refs: Vec<&Port> = ports.iter().collect();
                one(self.net.concat(&refs, if a < 0 { a + rank } else { a } as usize))
            }
            (Domain::Onnx, "Gather") => {
                if n.attrs.int_or("axis", 0).map_err(|e| e.to_string())? != 0 {
                    return Err("Gather on an axis other than 0".into());
                }
                let data = self.port(input(0)?).map_err(|e| e.to_string())?;
                let idx = self.port(input(1)?).map_err(|e| e.to_string())?;
                one(self.net.gather0(self.bin, &data, &idx))
            }
            (Domain::Microsoft, "GatherBlockQuantized") => self.gather_block_quantized(n).map(|p| vec![p]),
            (Domain::Onnx, op @ ("Add" | "Sub" | "Mul" | "Div" | "Pow")) => {
                let a = self.port(input(0)?).map_err(|e| e.to_string())?;
                let b = self.port(input(1)?).map_err(|e| e.to_string())?;
                let ty = match op {
                    "Add" => "Add",
                    "Sub" => "Subtract",
                    "Mul" => "Multiply",
                    "Div" => "Divide",
                    _ => "Power",
                };
                one(self.net.binary(ty, &a, &b)?)
            }
            (Domain::Onnx, op @ ("Sqrt" | "Neg" | "Sigmoid" | "Exp" | "Tanh" | "Abs")) => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                one(self.net.unary(if op == "Neg" { "Negative" } else { op }, &x))
            }
            (Domain::Onnx, "MatMul") => {
                let a = self.port(input(0)?).map_err(|e| e.to_string())?;
                let b = self.port(input(1)?).map_err(|e| e.to_string())?;
                one(self.net.matmul(&a, &b, false)?)
            }
            (Domain::Npuc, op @ ("RmsNorm" | "RmsNormRowScaled")) => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let g = self.port(input(1)?).map_err(|e| e.to_string())?;
                one(self.rms_norm(&x, &g, eps, op == "RmsNormRowScaled")?)
            }
            (Domain::Npuc, op @ ("SkipRmsNorm" | "SkipRmsNormRowScaled")) => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let skip = self.port(input(1)?).map_err(|e| e.to_string())?;
                let g = self.port(input(2)?).map_err(|e| e.to_string())?;
                let mut s = self.net.binary("Add", &x, &skip)?;
                if let Some(b) = n.inputs.get(3).copied().flatten() {
                    let b = self.port(b).map_err(|e| e.to_string())?;
                    s = self.net.binary("Add", &s, &b)?;
                }
                let y = self.rms_norm(&s, &g, eps, op == "SkipRmsNormRowScaled")?;
                Ok(vec![y, s])
            }
            (Domain::Npuc, "Rope") => {
                let interleaved = n.attrs.int_or("interleaved", 0).map_err(|e| e.to_string())? != 0;
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let c = self.port(input(1)?).map_err(|e| e.to_string())?;
                let s = self.port(input(2)?).map_err(|e| e.to_string())?;
                let axis = x.shape.len() - 1;
                let d = x.shape[axis];
                if d % 2 != 0 {
                    return Err(format!("rotary width {d} is odd"));
                }
                let rot = if interleaved {
                    // Pairs (2i, 2i+1) → (−x[2i+1], x[2i]): view [.., d/2, 2], swap and negate, back.
                    let mut pairs = x.shape.clone();
                    pairs[axis] = d / 2;
                    pairs.push(2);
                    let xp = self.net.reshape(self.bin, &x, &pairs);
                    let even = self.net.slice(self.bin, &xp, axis + 1, 0, 1);
                    let odd = self.net.slice(self.bin, &xp, axis + 1, 1, 2);
                    let nodd = self.net.unary("Negative", &odd);
                    let swapped = self.net.concat(&[&nodd, &even], axis + 1);
                    self.net.reshape(self.bin, &swapped, &x.shape)
                } else {
                    let x1 = self.net.slice(self.bin, &x, axis, 0, d / 2);
                    let x2 = self.net.slice(self.bin, &x, axis, d / 2, d);
                    let nx2 = self.net.unary("Negative", &x2);
                    self.net.concat(&[&nx2, &x1], axis)
                };
                let xc = self.net.binary("Multiply", &x, &c)?;
                let rs = self.net.binary("Multiply", &rot, &s)?;
                one(self.net.binary("Add", &xc, &rs)?)
            }
            (Domain::Npuc, "Silu") => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                let sg = self.net.unary("Sigmoid", &x);
                one(self.net.binary("Multiply", &x, &sg)?)
            }
            (Domain::Npuc, "SwiGlu") => {
                let g = self.port(input(0)?).map_err(|e| e.to_string())?;
                let u = self.port(input(1)?).map_err(|e| e.to_string())?;
                let sg = self.net.unary("Sigmoid", &g);
                let silu = self.net.binary("Multiply", &g, &sg)?;
                one(self.net.binary("Multiply", &silu, &u)?)
            }
            (Domain::Npuc, "GeluTanh") => {
                let x = self.port(input(0)?).map_err(|e| e.to_string())?;
                one(self.gelu_tanh(&x)?)
            }
            (Domain::Npuc, "GeluGate") => {
                let g = self.port(input(0)?).map_err(|e| e.to_string())?;
                let u = self.port(input(1)?).map_err(|e| e.to_string())?;
                let gelu = self.gelu_tanh(&g)?;
                one(self.net.binary("Multiply", &gelu, &u)?)
            }
            (Domain::Npuc, op @ ("WGemm" | "WGemmRowScaled")) => {
                let a = self.port(input(0)?).map_err(|e| e.to_string())?;
                let w = self.wgemm_weight(n)?;
                let y = if op == "WGemmRowScaled" {
                    let c = self.row_scale(&a)?;
                    let u = self.net.binary("Divide", &a, &c)?;
                    let y = self.net.matmul(&u, &w, true)?;
                    self.net.binary("Multiply", &y, &c)?
                } else {
                    let mut y = self.net.matmul(&a, &w, true)?;
                    if let Some(b) = n.inputs.get(4).copied().flatten() {
                        let b = self.port(b).map_err(|e| e.to_string())?;
                        y = self.net.binary("Add", &y, &b)?;
                    }
                    y
                };
                one(y)
            }
            (Domain::Onnx, "QuantizeLinear") => one(self.quantize_linear(n)?),
            (Domain::Onnx, "DequantizeLinear") => one(self.dequantize_linear(n)?),
            (Domain::Npuc, "QGemm") => one(self.qgemm(n)?),
            (d, op) => Err(format!("{d}::{op} has no OpenVINO lowering")),
        }
    }
}

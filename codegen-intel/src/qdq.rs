//! QDQ (A8W8) programs in OpenVINO IR.
//!
//! - An activation quantised by `QuantizeLinear` (per tensor, u8 or i8) becomes `FakeQuantize`
//!   with the range of its codes, `[(q_min − z)·s, (q_max − z)·s]` in `q_max − q_min + 1` levels:
//!   the form OpenVINO's low-precision transformations, and the NPU compiler, run in int8.
//! - Int8 weight codes (`[K, N]` in the program) are `Const i8|u8 [N, K]` → `Convert f32` →
//!   `Subtract` the zero points (when any is not 0) → `Multiply` the scales (per tensor or per
//!   output channel, `[N, 1]`): OpenVINO's int8 weight form; asymmetric int8 weights stay as they
//!   are (only int4 must be symmetric on the NPU).
//! - `npuc::QGemm` is `MatMul(transpose_b)` of the two, followed by the FakeQuantize of its
//!   output quantisation when it has one.
//!
//! A quantised value of the program (u8/i8 codes) is represented in the IR by its dequantised f32
//! value `(q − z)·s`. [`QParams`] records `s` and `z` for each such value, so that whatever reads
//! the codes reads them with the parameters they were made with: a `DequantizeLinear` with the
//! same parameters is the identity, a `QGemm` reads the port as its dequantised operand, and ops
//! that only move elements (Reshape, Transpose, Slice, Gather, ...) pass the parameters on. Any
//! other reader of codes is an error naming the node.
//!
//! Numerics: the host computes a QGemm in integers and rounds once to its output codes; the IR
//! computes the dot products of the dequantised values in f32 (OpenVINO's CPU plugin in int8 after
//! its transformations) and rounds in FakeQuantize, so an output code can differ by one step where
//! the exact value lies within f32 rounding of a tie.

use crate::lower::Lower;
use crate::ops::form;
use crate::symmetric::evaluate_constant;
use crate::xml::{Et, Port};
use crate::LowerError;
use ir::graph::{ValueDef, ValueId};
use ir::{DType, Node};

/// The quantisation of a value represented by its dequantised port: per tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct QParams {
    pub scale: f32,
    pub zero: i64,
    pub lo: i64,
    pub hi: i64,
}

/// Ops that only move elements: per-tensor codes pass through them with their parameters.
pub(crate) fn moves_elements(n: &Node) -> bool {
    n.domain == ir::Domain::Onnx
        && matches!(
            n.op,
            "Reshape" | "Unsqueeze" | "Squeeze" | "Flatten" | "Identity" | "Transpose" | "Slice" | "Gather"
        )
}

/// The code range of an 8-bit type.
fn code_range(dtype: DType) -> Result<(i64, i64), LowerError> {
    match dtype {
        DType::U8 => Ok((0, 255)),
        DType::I8 => Ok((-128, 127)),
        other => Err(LowerError::Form(format!("quantisation to {other} (only u8 and i8 have an OpenVINO lowering)"))),
    }
}

impl Lower<'_> {
    /// Per-tensor parameters from a scale and an optional zero point known at compile time.
    fn qparams(&self, scale: Option<ValueId>, zero: Option<ValueId>, dtype: DType) -> Result<QParams, LowerError> {
        let (lo, hi) = code_range(dtype)?;
        let s = evaluate_constant(self.g, scale.ok_or_else(|| form("no scale"))?)?.to_f32_vec();
        let z = match zero {
            Some(z) => evaluate_constant(self.g, z)?
                .as_i64()
                .map(|z| z.to_vec())
                .ok_or_else(|| form("a zero point that is not integer"))?,
            None => vec![0],
        };
        if s.len() != 1 || z.len() != 1 {
            return Err(LowerError::Form(format!(
                "activation quantisation with {} scales and {} zero points (only per-tensor has an OpenVINO lowering)",
                s.len(),
                z.len()
            )));
        }
        if !(s[0].is_finite() && s[0] > 0.0) {
            return Err(LowerError::Form(format!("quantisation scale {}", s[0])));
        }
        Ok(QParams { scale: s[0], zero: z[0], lo, hi })
    }

    /// Checks that `codes` are read with the scale and zero point they were made with (`verb` says
    /// how the reader reads them, for the error).
    fn read_codes(&self, codes: ValueId, s: Option<ValueId>, z: Option<ValueId>, verb: &str) -> Result<(), LowerError> {
        let name = &self.g.value(codes).name;
        let have = self.quantized.get(&codes).copied().ok_or_else(|| {
            LowerError::Form(format!("{verb} codes `{name}` that no per-tensor QuantizeLinear of the segment made"))
        })?;
        let want = self.qparams(s, z, self.g.value(codes).dtype)?;
        if want != have {
            return Err(LowerError::Form(format!(
                "{verb} `{name}` with scale {} and zero point {}, but its codes were made with scale {} and zero point {}",
                want.scale, want.zero, have.scale, have.zero
            )));
        }
        Ok(())
    }

    fn fake_quantize(&mut self, x: &Port, q: &QParams) -> Port {
        let low = self.scalar((q.lo - q.zero) as f32 * q.scale);
        let high = self.scalar((q.hi - q.zero) as f32 * q.scale);
        self.net.fake_quantize(x, &low, &high, (q.hi - q.lo + 1) as usize)
    }

    /// `QuantizeLinear` of an activation: its FakeQuantize, which stands for the codes.
    pub(crate) fn quantize_linear(&mut self, n: &Node) -> Result<Port, LowerError> {
        let x = self.port(n.inputs[0].ok_or_else(|| form("no input"))?)?;
        let out = n.outputs[0];
        let q = self.qparams(
            n.inputs.get(1).copied().flatten(),
            n.inputs.get(2).copied().flatten(),
            self.g.value(out).dtype,
        )?;
        let y = self.fake_quantize(&x, &q);
        self.quantized.insert(out, q);
        Ok(y)
    }

    /// `DequantizeLinear`: the identity on codes this lowering represents dequantised, or the
    /// decompression of weight codes.
    pub(crate) fn dequantize_linear(&mut self, n: &Node) -> Result<Port, LowerError> {
        let codes = n.inputs[0].ok_or_else(|| form("no input"))?;
        let (s, z) = (n.inputs.get(1).copied().flatten(), n.inputs.get(2).copied().flatten());
        if self.quantized.contains_key(&codes) {
            self.read_codes(codes, s, z, "dequantises")?;
            return Ok(self.port(codes)?);
        }
        if !matches!(self.g.value(codes).def, ValueDef::Weight(_) | ValueDef::Const(_))
            && !matches!(self.g.value(codes).def, ValueDef::Node { node, .. } if self.g.compile_time_nodes()[node.0 as usize])
        {
            return Err(LowerError::Form(format!(
                "dequantises `{}`, codes that no QuantizeLinear of the segment made",
                self.g.value(codes).name
            )));
        }
        // Weight codes: Convert, Subtract, Multiply, with per-axis parameters broadcast on `axis`.
        let t = evaluate_constant(self.g, codes)?;
        let shape = t.shape.clone();
        let rank = shape.len() as i64;
        let axis = n.attrs.int_or("axis", 1)?;
        let axis = if axis < 0 { axis + rank } else { axis };
        let sv = evaluate_constant(self.g, s.ok_or_else(|| form("no scale"))?)?.to_f32_vec();
        let zv = match z {
            Some(z) => evaluate_constant(self.g, z)?.to_f32_vec(),
            None => vec![0.0],
        };
        let param_shape = |len: usize| -> Result<Vec<usize>, LowerError> {
            if len == 1 {
                return Ok(vec![]);
            }
            if axis < 0 || axis >= rank || shape[axis as usize] != len {
                return Err(LowerError::Form(format!("{len} per-axis parameters on axis {axis} of {shape:?}")));
            }
            Ok((0..rank as usize).map(|d| if d == axis as usize { len } else { 1 }).collect())
        };
        let et = match t.dtype {
            DType::U8 => Et::U8,
            DType::I8 => Et::I8,
            other => return Err(LowerError::Form(format!("dequantising {other} codes"))),
        };
        let bytes: Vec<u8> =
            t.as_i64().ok_or_else(|| form("codes that are not integers"))?.iter().map(|&v| v as u8).collect();
        let r = self.bin.content(bytes);
        let c = self.net.constant(et, &shape, r);
        let mut y = self.net.convert(&c, Et::F32);
        if zv.iter().any(|&v| v != 0.0) {
            let zs = param_shape(zv.len())?;
            let zc = self.net.const_f32(self.bin, &zv, &zs);
            y = self.net.binary("Subtract", &y, &zc)?;
        }
        let ss = param_shape(sv.len())?;
        let sc = self.net.const_f32(self.bin, &sv, &ss);
        Ok(self.net.binary("Multiply", &y, &sc)?)
    }

    /// `npuc::QGemm(a, sa, za, w, sw, zw[, sy, zy])` with `a` quantised in the segment and `w`
    /// int8 codes `[K, N]` known at compile time.
    pub(crate) fn qgemm(&mut self, n: &Node) -> Result<Port, LowerError> {
        let input = |i: usize| n.inputs.get(i).copied().flatten();
        let a = input(0).ok_or_else(|| form("no activation"))?;
        self.read_codes(a, input(1), input(2), "reads")?;
        let x = self.port(a)?;
        let w = self.qgemm_weight(n)?;
        let y = self.net.matmul(&x, &w, true)?;
        match input(6) {
            Some(sy) => {
                let out = n.outputs[0];
                let q = self.qparams(Some(sy), input(7), self.g.value(out).dtype)?;
                let y = self.fake_quantize(&y, &q);
                self.quantized.insert(out, q);
                Ok(y)
            }
            None => Ok(y),
        }
    }

    /// The QGemm's weight `[N, K]` in f32: codes, zero points subtracted, scales multiplied.
    fn qgemm_weight(&mut self, n: &Node) -> Result<Port, LowerError> {
        let g = self.g;
        let wv = n.inputs[3].ok_or_else(|| form("no weight"))?;
        let wval = g.value(wv);
        let [k, nn] = wval
            .shape
            .iter()
            .map(|d| d.as_known())
            .collect::<Option<Vec<_>>>()
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| {
                LowerError::Form(format!("weight `{}` of shape {:?} (a QGemm weight is [K, N])", wval.name, wval.shape))
            })?;
        let (k, nn) = (k as usize, nn as usize);
        let et = match wval.dtype {
            DType::U8 => Et::U8,
            DType::I8 => Et::I8,
            other => return Err(LowerError::Form(format!("weight `{}` of type {other}", wval.name))),
        };
        let key = format!("qgemm-nk:{}", wval.name);
        let r = match self.bin.get(&key) {
            Some(r) => r,
            None => {
                // [K, N] codes from the model (raw bytes) or from a computation on weights.
                let kn: Vec<u8> = match &wval.def {
                    ValueDef::Weight(id) => g.weights.get(*id).bytes.to_vec(),
                    _ => evaluate_constant(g, wv)?
                        .as_i64()
                        .ok_or_else(|| form("weight codes that are not integers"))?
                        .iter()
                        .map(|&v| v as u8)
                        .collect(),
                };
                if kn.len() != k * nn {
                    return Err(LowerError::Form(format!(
                        "weight `{}` holds {} codes, not {k}×{nn}",
                        wval.name,
                        kn.len()
                    )));
                }
                let mut nk = vec![0u8; k * nn];
                for (kk, row) in kn.chunks_exact(nn).enumerate() {
                    for (c, &b) in row.iter().enumerate() {
                        nk[c * k + kk] = b;
                    }
                }
                self.bin.keyed(&key, || nk)
            }
        };
        let codes = self.net.constant(et, &[nn, k], r);
        let mut w = self.net.convert(&codes, Et::F32);
        let per = |len: usize, what: &str| -> Result<Vec<usize>, LowerError> {
            match len {
                1 => Ok(vec![]),
                l if l == nn => Ok(vec![nn, 1]),
                l => Err(LowerError::Form(format!("{l} weight {what}s for {nn} output channels"))),
            }
        };
        if let Some(z) = n.inputs.get(5).copied().flatten() {
            let zv = evaluate_constant(g, z)?.to_f32_vec();
            if zv.iter().any(|&v| v != 0.0) {
                let shape = per(zv.len(), "zero point")?;
                let zc = self.net.const_f32(self.bin, &zv, &shape);
                w = self.net.binary("Subtract", &w, &zc)?;
            }
        }
        let sv = evaluate_constant(g, n.inputs[4].ok_or_else(|| form("no weight scale"))?)?.to_f32_vec();
        let shape = per(sv.len(), "scale")?;
        let sc = self.net.const_f32(self.bin, &sv, &shape);
        Ok(self.net.binary("Multiply", &w, &sc)?)
    }
}

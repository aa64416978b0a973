//! Decompositions of the fused ops into OpenVINO's public opset, and the weights they read.

use crate::lower::Lower;
use crate::partition::producer;
use crate::symmetric;
use crate::xml::{Et, Port};
use crate::LowerError;
use ir::{DType, Node};

/// A form of an op the lowering does not take.
pub(crate) fn form(msg: &str) -> LowerError {
    LowerError::Form(msg.to_string())
}

/// `a` on an axis of a rank-`rank` tensor, counted from the end when negative.
fn axis_of(a: i64, rank: usize) -> usize {
    if a < 0 {
        (a + rank as i64) as usize
    } else {
        a as usize
    }
}

impl Lower<'_> {
    /// Reshape, Unsqueeze, Squeeze, Flatten and Identity: a Reshape to the output's shape.
    pub(crate) fn reshape(&mut self, n: &Node) -> Result<Port, LowerError> {
        let x = self.input(n, 0)?;
        let mut shape = self.shape(n.outputs[0])?;
        if shape.iter().product::<usize>() != x.shape.iter().product::<usize>() {
            // Only in the one-row lm_head segment: keep the row count of the input.
            let rows = x.shape.iter().rev().skip(1).product::<usize>();
            let l = shape.len();
            shape[..l - 1].iter_mut().for_each(|d| *d = 1);
            if l >= 2 {
                shape[l - 2] = rows;
            }
        }
        Ok(self.net.reshape(self.bin, &x, &shape))
    }

    pub(crate) fn transpose(&mut self, n: &Node) -> Result<Port, LowerError> {
        let x = self.input(n, 0)?;
        let perm: Vec<usize> = match n.attrs.ints("perm")? {
            Some(p) => p.iter().map(|&d| d as usize).collect(),
            None => (0..x.shape.len()).rev().collect(),
        };
        Ok(self.net.transpose(self.bin, &x, &perm))
    }

    /// A Slice with constant starts, ends and axes and steps of 1, one axis at a time.
    pub(crate) fn slice(&mut self, n: &Node) -> Result<Port, LowerError> {
        let mut x = self.input(n, 0)?;
        let constant = |s: &Self, i: usize, what: &'static str| {
            s.const_ints(n.inputs.get(i).copied().flatten()).ok_or(LowerError::NotConstant(what))
        };
        let starts = constant(self, 1, "starts")?;
        let ends = constant(self, 2, "ends")?;
        let rank = x.shape.len();
        let axes = match n.inputs.get(3).copied().flatten() {
            Some(_) => constant(self, 3, "axes")?,
            None => (0..starts.len() as i64).collect(),
        };
        if n.inputs.get(4).copied().flatten().is_some() && constant(self, 4, "steps")?.iter().any(|&s| s != 1) {
            return Err(form("Slice with a step other than 1"));
        }
        for ((&s, &e), &a) in starts.iter().zip(&ends).zip(&axes) {
            let axis = axis_of(a, rank);
            let dim = x.shape[axis] as i64;
            let norm = |v: i64| (if v < 0 { v + dim } else { v }).clamp(0, dim) as usize;
            let (b, e) = (norm(s), norm(e).max(norm(s)));
            x = self.net.slice(self.bin, &x, axis, b, e);
        }
        Ok(x)
    }

    pub(crate) fn concat(&mut self, n: &Node) -> Result<Port, LowerError> {
        let mut ports = Vec::new();
        for v in n.inputs.iter().flatten() {
            ports.push(self.port(*v)?);
        }
        let rank = ports[0].shape.len();
        let a = n.attrs.int_or("axis", 0)?;
        let refs: Vec<&Port> = ports.iter().collect();
        Ok(self.net.concat(&refs, axis_of(a, rank)))
    }

    /// Gather along axis 0.
    pub(crate) fn gather(&mut self, n: &Node) -> Result<Port, LowerError> {
        if n.attrs.int_or("axis", 0)? != 0 {
            return Err(form("Gather on an axis other than 0"));
        }
        let data = self.input(n, 0)?;
        let idx = self.input(n, 1)?;
        Ok(self.net.gather0(self.bin, &data, &idx))
    }

    /// Add, Sub, Mul, Div and Pow, broadcast as numpy does.
    pub(crate) fn elementwise(&mut self, n: &Node) -> Result<Port, LowerError> {
        let a = self.input(n, 0)?;
        let b = self.input(n, 1)?;
        let ty = match n.op {
            "Add" => "Add",
            "Sub" => "Subtract",
            "Mul" => "Multiply",
            "Div" => "Divide",
            _ => "Power",
        };
        Ok(self.net.binary(ty, &a, &b)?)
    }

    pub(crate) fn unary(&mut self, n: &Node) -> Result<Port, LowerError> {
        let x = self.input(n, 0)?;
        Ok(self.net.unary(if n.op == "Neg" { "Negative" } else { n.op }, &x))
    }

    /// SkipRmsNorm and its row-scaled form: the norm of `x + skip (+ bias)`, and that sum.
    pub(crate) fn skip_rms_norm(&mut self, n: &Node) -> Result<Vec<Port>, LowerError> {
        let eps = n.attrs.float_or("epsilon", 1e-5)?;
        let x = self.input(n, 0)?;
        let skip = self.input(n, 1)?;
        let g = self.input(n, 2)?;
        let mut s = self.net.binary("Add", &x, &skip)?;
        if let Some(b) = n.inputs.get(3).copied().flatten() {
            let b = self.port(b)?;
            s = self.net.binary("Add", &s, &b)?;
        }
        let y = self.rms_norm(&s, &g, eps, n.op == "SkipRmsNormRowScaled")?;
        Ok(vec![y, s])
    }

    /// `x·cos + rotate(x)·sin`, rotating halves, or pairs when interleaved.
    pub(crate) fn rope(&mut self, n: &Node) -> Result<Port, LowerError> {
        let interleaved = n.attrs.int_or("interleaved", 0)? != 0;
        let x = self.input(n, 0)?;
        let c = self.input(n, 1)?;
        let s = self.input(n, 2)?;
        let axis = x.shape.len() - 1;
        let d = x.shape[axis];
        if d % 2 != 0 {
            return Err(LowerError::Form(format!("rotary width {d} is odd")));
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
        Ok(self.net.binary("Add", &xc, &rs)?)
    }

    /// `silu(g)·u`.
    pub(crate) fn swiglu(&mut self, n: &Node) -> Result<Port, LowerError> {
        let g = self.input(n, 0)?;
        let u = self.input(n, 1)?;
        let sg = self.net.unary("Sigmoid", &g);
        let silu = self.net.binary("Multiply", &g, &sg)?;
        Ok(self.net.binary("Multiply", &silu, &u)?)
    }

    /// A weight-only GEMM over its decompressed weight (see [`Lower::wgemm_weight`]); the
    /// row-scaled form divides the activation by its row scale and multiplies the product back.
    pub(crate) fn wgemm(&mut self, n: &Node) -> Result<Port, LowerError> {
        let a = self.input(n, 0)?;
        let w = self.wgemm_weight(n)?;
        if n.op == "WGemmRowScaled" {
            let c = self.row_scale(&a)?;
            let u = self.net.binary("Divide", &a, &c)?;
            let y = self.net.matmul(&u, &w, true)?;
            return Ok(self.net.binary("Multiply", &y, &c)?);
        }
        let mut y = self.net.matmul(&a, &w, true)?;
        if let Some(b) = n.inputs.get(4).copied().flatten() {
            let b = self.port(b)?;
            y = self.net.binary("Add", &y, &b)?;
        }
        Ok(y)
    }

    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` in public ops.
    pub(crate) fn gelu_tanh(&mut self, x: &Port) -> Result<Port, LowerError> {
        let (c, k, one, half) = (self.scalar(0.797_884_6), self.scalar(0.044715), self.scalar(1.0), self.scalar(0.5));
        let x2 = self.net.binary("Multiply", x, x)?;
        let x3 = self.net.binary("Multiply", &x2, x)?;
        let kx3 = self.net.binary("Multiply", &k, &x3)?;
        let inner = self.net.binary("Add", x, &kx3)?;
        let scaled = self.net.binary("Multiply", &c, &inner)?;
        let t = self.net.unary("Tanh", &scaled);
        let onept = self.net.binary("Add", &one, &t)?;
        let xt = self.net.binary("Multiply", x, &onept)?;
        Ok(self.net.binary("Multiply", &half, &xt)?)
    }

    pub(crate) fn scalar(&mut self, v: f32) -> Port {
        self.net.const_f32(self.bin, &[v], &[])
    }

    /// c = 2^⌊log₂ max|x|⌋ per row (last axis), as `row_scale` defines it (tiny rows use 2⁻¹²⁶).
    pub(crate) fn row_scale(&mut self, x: &Port) -> Result<Port, LowerError> {
        let abs = self.net.unary("Abs", x);
        let max = self.net.reduce_last(self.bin, "ReduceMax", &abs);
        let tiny = self.scalar(f32::MIN_POSITIVE);
        let max = self.net.binary("Maximum", &max, &tiny)?;
        let log = self.net.unary("Log", &max);
        let ln2 = self.scalar(std::f32::consts::LN_2);
        let l2 = self.net.binary("Divide", &log, &ln2)?;
        let e = self.net.unary("Floor", &l2);
        let two = self.scalar(2.0);
        Ok(self.net.binary("Power", &two, &e)?)
    }

    /// x / √(mean(x²) + eps) · γ, or the row-scaled form: u = x/c, m = mean(u²), e = (√eps/c)²,
    /// y = u / max(√(m + e), 2⁻¹⁴) · γ.
    pub(crate) fn rms_norm(&mut self, x: &Port, gamma: &Port, eps: f32, row_scaled: bool) -> Result<Port, LowerError> {
        let two = self.scalar(2.0);
        let (u, e) = if row_scaled {
            let c = self.row_scale(x)?;
            let u = self.net.binary("Divide", x, &c)?;
            let root = self.scalar(eps.sqrt());
            let t = self.net.binary("Divide", &root, &c)?;
            let e = self.net.binary("Multiply", &t, &t)?;
            (u, e)
        } else {
            (x.clone(), self.scalar(eps))
        };
        let sq = self.net.binary("Power", &u, &two)?;
        let m = self.net.reduce_last(self.bin, "ReduceMean", &sq);
        let me = self.net.binary("Add", &m, &e)?;
        let mut r = self.net.unary("Sqrt", &me);
        if row_scaled {
            // Only a row of zeros has a root below 1/√D; its ε may flush on the device.
            let floor = self.scalar(ir::fused::ROOT_FLOOR as f32);
            r = self.net.binary("Maximum", &r, &floor)?;
        }
        let y = self.net.binary("Divide", &u, &r)?;
        Ok(self.net.binary("Multiply", &y, gamma)?)
    }

    /// The symmetric weight of a WGemm as `i4`/`i8` [N, G, group] → f16 → × f16 scale [N, G, 1] →
    /// [N, K] → f32.
    pub(crate) fn wgemm_weight(&mut self, n: &Node) -> Result<Port, LowerError> {
        let attr = |k: &str| n.attrs.int(k).ok().flatten().unwrap_or(0).max(0) as usize;
        let (k, nn, bits, block) = (attr("K"), attr("N"), attr("bits"), attr("block_size"));
        if n.inputs.get(3).copied().flatten().is_some() {
            return Err(form("zero points remain after symmetrisation"));
        }
        let (Some(wv), Some(sv)) = (n.inputs[1], n.inputs[2]) else { return Err(form("missing weights")) };
        let (Some(wid), Some(sid)) = (symmetric::weight_of(self.g, wv), symmetric::weight_of(self.g, sv)) else {
            return Err(form("weights must be model weights"));
        };
        let groups = k.div_ceil(block);
        let w = self.g.weights.get(wid);
        let s = self.g.weights.get(sid);
        let wbytes = w.bytes.clone();
        let (et, flip) = if bits == 4 { (Et::I4, 0x88u8) } else { (Et::I8, 0x80u8) };
        let wr = self.bin.keyed(&format!("sym:{}", w.name), || wbytes.iter().map(|b| b ^ flip).collect());
        let codes = self.net.constant(et, &[nn, groups, block], wr);
        let sdata = s.to_tensor()?.to_f32_vec();
        let sr = self.bin.keyed(&format!("f16:{}", s.name), || {
            sdata.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect()
        });
        let scale = self.net.constant(Et::F16, &[nn, groups, 1], sr);
        let wf = self.net.convert(&codes, Et::F16);
        let ws = self.net.binary("Multiply", &wf, &scale)?;
        let mut w2 = self.net.reshape(self.bin, &ws, &[nn, groups * block]);
        if groups * block != k {
            w2 = self.net.slice(self.bin, &w2, 1, 0, k);
        }
        Ok(self.net.convert(&w2, Et::F32))
    }

    /// A quantised embedding: Gather of the symmetric codes and of the f16 scales, multiplied.
    pub(crate) fn gather_block_quantized(&mut self, n: &Node) -> Result<Port, LowerError> {
        let bits = n.attrs.int_or("bits", 4)?;
        let block = n.attrs.int_or("block_size", 128)? as usize;
        if n.attrs.int_or("gather_axis", 0)? != 0 || n.attrs.int_or("quantize_axis", 1)? != 1 {
            return Err(form("GatherBlockQuantized other than gather_axis 0, quantize_axis 1"));
        }
        if n.inputs.get(3).copied().flatten().is_some() {
            return Err(form("GatherBlockQuantized with zero points"));
        }
        // The data may be a Reshape of the weight (a tied lm_head's [N, G, group] codes).
        let mut data = n.inputs[0].ok_or_else(|| form("no data"))?;
        if let Some(p) = producer(self.g, data) {
            let pn = self.g.node(p);
            if pn.op == "Reshape" {
                data = pn.inputs[0].ok_or_else(|| form("no data"))?;
            }
        }
        let wid = symmetric::weight_of(self.g, data).ok_or_else(|| form("embedding codes must be a model weight"))?;
        let sid = symmetric::weight_of(self.g, n.inputs[2].ok_or_else(|| form("no scales"))?)
            .ok_or_else(|| form("scales must be a model weight"))?;
        let w = self.g.weights.get(wid);
        let s = self.g.weights.get(sid);
        let rows = w.shape[0];
        let width: usize = w.shape[1..].iter().product::<usize>() * if bits == 4 { 2 } else { 1 };
        let groups = width.div_ceil(block);
        if groups * block != width || w.dtype != DType::U8 || !(bits == 4 || bits == 8) {
            return Err(LowerError::Form(format!(
                "embedding `{}` of {} {:?} with {bits}-bit blocks of {block}",
                w.name, w.dtype, w.shape
            )));
        }
        let (et, flip) = if bits == 4 { (Et::I4, 0x88u8) } else { (Et::I8, 0x80u8) };
        let wbytes = w.bytes.clone();
        let wr = self.bin.keyed(&format!("sym:{}", w.name), || wbytes.iter().map(|b| b ^ flip).collect());
        let codes = self.net.constant(et, &[rows, groups, block], wr);
        let sdata = s.to_tensor()?.to_f32_vec();
        let sr = self.bin.keyed(&format!("f16:{}", s.name), || {
            sdata.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect()
        });
        let scale = self.net.constant(Et::F16, &[rows, groups, 1], sr);
        let idx = self.port(n.inputs[1].ok_or_else(|| form("no indices"))?)?;
        let gc = self.net.gather0(self.bin, &codes, &idx);
        let gs = self.net.gather0(self.bin, &scale, &idx);
        let cf = self.net.convert(&gc, Et::F32);
        let sf = self.net.convert(&gs, Et::F32);
        let v = self.net.binary("Multiply", &cf, &sf)?;
        let mut shape = idx.shape.clone();
        shape.push(width);
        Ok(self.net.reshape(self.bin, &v, &shape))
    }
}

//! Decompositions of the fused ops into OpenVINO's public opset, and the weights they read.

use crate::lower::Lower;
use crate::partition::producer;
use crate::symmetric;
use crate::xml::{Et, Port};
use ir::{DType, Node};

impl Lower<'_> {
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` in public ops.
    pub(crate) fn gelu_tanh(&mut self, x: &Port) -> Result<Port, String> {
        let (c, k, one, half) = (self.scalar(0.797_884_6), self.scalar(0.044715), self.scalar(1.0), self.scalar(0.5));
        let x2 = self.net.binary("Multiply", x, x)?;
        let x3 = self.net.binary("Multiply", &x2, x)?;
        let kx3 = self.net.binary("Multiply", &k, &x3)?;
        let inner = self.net.binary("Add", x, &kx3)?;
        let scaled = self.net.binary("Multiply", &c, &inner)?;
        let t = self.net.unary("Tanh", &scaled);
        let onept = self.net.binary("Add", &one, &t)?;
        let xt = self.net.binary("Multiply", x, &onept)?;
        self.net.binary("Multiply", &half, &xt)
    }

    pub(crate) fn scalar(&mut self, v: f32) -> Port {
        self.net.const_f32(self.bin, &[v], &[])
    }

    /// c = 2^⌊log₂ max|x|⌋ per row (last axis), as `row_scale` defines it (tiny rows use 2⁻¹²⁶).
    pub(crate) fn row_scale(&mut self, x: &Port) -> Result<Port, String> {
        let abs = self.net.unary("Abs", x);
        let max = self.net.reduce_last(self.bin, "ReduceMax", &abs);
        let tiny = self.scalar(f32::MIN_POSITIVE);
        let max = self.net.binary("Maximum", &max, &tiny)?;
        let log = self.net.unary("Log", &max);
        let ln2 = self.scalar(std::f32::consts::LN_2);
        let l2 = self.net.binary("Divide", &log, &ln2)?;
        let e = self.net.unary("Floor", &l2);
        let two = self.scalar(2.0);
        self.net.binary("Power", &two, &e)
    }

    /// x / √(mean(x²) + eps) · γ, or the row-scaled form: u = x/c, m = mean(u²), e = (√eps/c)².
    pub(crate) fn rms_norm(&mut self, x: &Port, gamma: &Port, eps: f32, row_scaled: bool) -> Result<Port, String> {
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
        let r = self.net.unary("Sqrt", &me);
        let y = self.net.binary("Divide", &u, &r)?;
        self.net.binary("Multiply", &y, gamma)
    }

    /// The symmetric weight of a WGemm as `i4`/`i8` [N, G, group] → f16 → × f16 scale [N, G, 1] →
    /// [N, K] → f32.
    pub(crate) fn wgemm_weight(&mut self, n: &Node) -> Result<Port, String> {
        let attr = |k: &str| n.attrs.int(k).ok().flatten().unwrap_or(0).max(0) as usize;
        let (k, nn, bits, block) = (attr("K"), attr("N"), attr("bits"), attr("block_size"));
        if n.inputs.get(3).copied().flatten().is_some() {
            return Err("zero points remain after symmetrisation".into());
        }
        let (Some(wv), Some(sv)) = (n.inputs[1], n.inputs[2]) else { return Err("missing weights".into()) };
        let (Some(wid), Some(sid)) = (symmetric::weight_of(self.g, wv), symmetric::weight_of(self.g, sv)) else {
            return Err("weights must be model weights".into());
        };
        let groups = k.div_ceil(block);
        let w = self.g.weights.get(wid);
        let s = self.g.weights.get(sid);
        let wbytes = w.bytes.clone();
        let (et, flip) = if bits == 4 { (Et::I4, 0x88u8) } else { (Et::I8, 0x80u8) };
        let wr = self.bin.keyed(&format!("sym:{}", w.name), || wbytes.iter().map(|b| b ^ flip).collect());
        let codes = self.net.constant(et, &[nn, groups, block], wr);
        let sdata = s.to_tensor().map_err(|e| e.to_string())?.to_f32_vec();
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
    pub(crate) fn gather_block_quantized(&mut self, n: &Node) -> Result<Port, String> {
        let bits = n.attrs.int_or("bits", 4).map_err(|e| e.to_string())?;
        let block = n.attrs.int_or("block_size", 128).map_err(|e| e.to_string())? as usize;
        if n.attrs.int_or("gather_axis", 0).map_err(|e| e.to_string())? != 0
            || n.attrs.int_or("quantize_axis", 1).map_err(|e| e.to_string())? != 1
        {
            return Err("GatherBlockQuantized other than gather_axis 0, quantize_axis 1".into());
        }
        if n.inputs.get(3).copied().flatten().is_some() {
            return Err("GatherBlockQuantized with zero points".into());
        }
        // The data may be a Reshape of the weight (a tied lm_head's [N, G, group] codes).
        let mut data = n.inputs[0].ok_or("no data")?;
        if let Some(p) = producer(self.g, data) {
            let pn = self.g.node(p);
            if pn.op == "Reshape" {
                data = pn.inputs[0].ok_or("no data")?;
            }
        }
        let wid = symmetric::weight_of(self.g, data).ok_or("embedding codes must be a model weight")?;
        let sid =
            symmetric::weight_of(self.g, n.inputs[2].ok_or("no scales")?).ok_or("scales must be a model weight")?;
        let w = self.g.weights.get(wid);
        let s = self.g.weights.get(sid);
        let rows = w.shape[0];
        let width: usize = w.shape[1..].iter().product::<usize>() * if bits == 4 { 2 } else { 1 };
        let groups = width.div_ceil(block);
        if groups * block != width || w.dtype != DType::U8 || !(bits == 4 || bits == 8) {
            return Err(format!(
                "embedding `{}` of {} {:?} with {bits}-bit blocks of {block}",
                w.name, w.dtype, w.shape
            ));
        }
        let (et, flip) = if bits == 4 { (Et::I4, 0x88u8) } else { (Et::I8, 0x80u8) };
        let wbytes = w.bytes.clone();
        let wr = self.bin.keyed(&format!("sym:{}", w.name), || wbytes.iter().map(|b| b ^ flip).collect());
        let codes = self.net.constant(et, &[rows, groups, block], wr);
        let sdata = s.to_tensor().map_err(|e| e.to_string())?.to_f32_vec();
        let sr = self.bin.keyed(&format!("f16:{}", s.name), || {
            sdata.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect()
        });
        let scale = self.net.constant(Et::F16, &[rows, groups, 1], sr);
        let idx = self.port(n.inputs[1].ok_or("no indices")?).map_err(|e| e.to_string())?;
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

//! OpenVINO IR v11 text: a network of layers with static port shapes, and the shared weights file
//! every `Const` is a view of.

use std::collections::HashMap;
use std::fmt::Write;

/// A layer whose inputs' shapes do not fit it.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{op}: {a:?} and {b:?} do not broadcast")]
    Broadcast { op: &'static str, a: Vec<usize>, b: Vec<usize> },
    #[error("MatMul of a scalar")]
    MatMulOfScalar,
    #[error("MatMul {a:?} × {b:?} (transpose_b={transpose_b})")]
    MatMul { a: Vec<usize>, b: Vec<usize>, transpose_b: bool },
}

/// Element types the IR uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Et {
    F32,
    F16,
    I64,
    I32,
    I8,
    U8,
    I4,
}

impl Et {
    pub fn name(self) -> &'static str {
        match self {
            Et::F32 => "f32",
            Et::F16 => "f16",
            Et::I64 => "i64",
            Et::I32 => "i32",
            Et::I8 => "i8",
            Et::U8 => "u8",
            Et::I4 => "i4",
        }
    }

    fn precision(self) -> &'static str {
        match self {
            Et::F32 => "FP32",
            Et::F16 => "FP16",
            Et::I64 => "I64",
            Et::I32 => "I32",
            Et::I8 => "I8",
            Et::U8 => "U8",
            Et::I4 => "I4",
        }
    }
}

/// One output of a layer, with its static type.
#[derive(Clone, Debug)]
pub struct Port {
    layer: usize,
    port: usize,
    pub et: Et,
    pub shape: Vec<usize>,
}

struct PortDesc {
    et: Et,
    shape: Vec<usize>,
    names: Vec<String>,
}

struct Layer {
    name: String,
    ty: &'static str,
    version: &'static str,
    data: Vec<(&'static str, String)>,
    inputs: Vec<PortDesc>,
    outputs: Vec<PortDesc>,
}

/// The shared weights file: every byte range is appended once; weights are keyed by the caller
/// (so each block size's network finds the same offset), small constants by content.
#[derive(Default)]
pub struct Bin {
    pub bytes: Vec<u8>,
    by_key: HashMap<String, (usize, usize)>,
    by_content: HashMap<Vec<u8>, (usize, usize)>,
}

impl Bin {
    /// The (offset, size) of the bytes stored under `key`, computing and appending them on first use
    /// (64-byte aligned).
    pub fn keyed(&mut self, key: &str, make: impl FnOnce() -> Vec<u8>) -> (usize, usize) {
        if let Some(&r) = self.by_key.get(key) {
            return r;
        }
        let data = make();
        while !self.bytes.len().is_multiple_of(64) {
            self.bytes.push(0);
        }
        let r = (self.bytes.len(), data.len());
        self.bytes.extend_from_slice(&data);
        self.by_key.insert(key.to_string(), r);
        r
    }

    /// The (offset, size) stored under `key`, if any.
    pub fn get(&self, key: &str) -> Option<(usize, usize)> {
        self.by_key.get(key).copied()
    }

    /// The (offset, size) of these bytes, stored once whatever asks for them.
    pub fn content(&mut self, data: Vec<u8>) -> (usize, usize) {
        if let Some(&r) = self.by_content.get(&data) {
            return r;
        }
        while !self.bytes.len().is_multiple_of(8) {
            self.bytes.push(0);
        }
        let r = (self.bytes.len(), data.len());
        self.bytes.extend_from_slice(&data);
        self.by_content.insert(data, r);
        r
    }
}

/// A network under construction.
pub struct Net {
    name: String,
    layers: Vec<Layer>,
    edges: Vec<(usize, usize, usize, usize)>,
}

pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        out.push(if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        });
    }
    Some(out)
}

impl Net {
    pub fn new(name: &str) -> Net {
        Net { name: name.to_string(), layers: Vec::new(), edges: Vec::new() }
    }

    /// Adds a layer reading `inputs` and producing outputs of these types.
    pub fn layer(
        &mut self,
        ty: &'static str,
        version: &'static str,
        data: Vec<(&'static str, String)>,
        inputs: &[&Port],
        outputs: &[(Et, Vec<usize>)],
    ) -> Vec<Port> {
        let id = self.layers.len();
        for (i, p) in inputs.iter().enumerate() {
            self.edges.push((p.layer, p.port, id, i));
        }
        let n_in = inputs.len();
        self.layers.push(Layer {
            name: format!("{}_{id}", ty.to_lowercase()),
            ty,
            version,
            data,
            inputs: inputs.iter().map(|p| PortDesc { et: p.et, shape: p.shape.clone(), names: vec![] }).collect(),
            outputs: outputs.iter().map(|(et, s)| PortDesc { et: *et, shape: s.clone(), names: vec![] }).collect(),
        });
        outputs
            .iter()
            .enumerate()
            .map(|(i, (et, s))| Port { layer: id, port: n_in + i, et: *et, shape: s.clone() })
            .collect()
    }

    fn one(
        &mut self,
        ty: &'static str,
        version: &'static str,
        data: Vec<(&'static str, String)>,
        inputs: &[&Port],
        et: Et,
        shape: Vec<usize>,
    ) -> Port {
        self.layer(ty, version, data, inputs, &[(et, shape)]).remove(0)
    }

    /// Gives the tensor produced at `port` a name (inputs and outputs of a segment carry names).
    pub fn name_tensor(&mut self, port: &Port, name: &str) {
        let l = &mut self.layers[port.layer];
        let i = port.port - l.inputs.len();
        if !l.outputs[i].names.iter().any(|n| n == name) {
            l.outputs[i].names.push(name.to_string());
        }
    }

    pub fn parameter(&mut self, name: &str, et: Et, shape: &[usize]) -> Port {
        let data = vec![("shape", dims(shape)), ("element_type", et.name().to_string())];
        let p = self.one("Parameter", "opset1", data, &[], et, shape.to_vec());
        self.layers[p.layer].name = name.to_string();
        self.name_tensor(&p, name);
        p
    }

    pub fn result(&mut self, port: &Port, name: &str) {
        self.name_tensor(port, name);
        let id = self.layers.len();
        self.edges.push((port.layer, port.port, id, 0));
        self.layers.push(Layer {
            name: format!("{name}/result"),
            ty: "Result",
            version: "opset1",
            data: vec![],
            inputs: vec![PortDesc { et: port.et, shape: port.shape.clone(), names: vec![] }],
            outputs: vec![],
        });
    }

    /// A constant viewing `size` bytes at `offset` of the weights file.
    pub fn constant(&mut self, et: Et, shape: &[usize], (offset, size): (usize, usize)) -> Port {
        let data = vec![
            ("element_type", et.name().to_string()),
            ("shape", dims(shape)),
            ("offset", offset.to_string()),
            ("size", size.to_string()),
        ];
        self.one("Const", "opset1", data, &[], et, shape.to_vec())
    }

    pub fn const_i64(&mut self, bin: &mut Bin, values: &[i64], shape: &[usize]) -> Port {
        let r = bin.content(values.iter().flat_map(|v| v.to_le_bytes()).collect());
        self.constant(Et::I64, shape, r)
    }

    pub fn const_f32(&mut self, bin: &mut Bin, values: &[f32], shape: &[usize]) -> Port {
        let r = bin.content(values.iter().flat_map(|v| v.to_le_bytes()).collect());
        self.constant(Et::F32, shape, r)
    }

    pub fn unary(&mut self, ty: &'static str, x: &Port) -> Port {
        self.one(ty, "opset1", vec![], &[x], x.et, x.shape.clone())
    }

    pub fn binary(&mut self, ty: &'static str, a: &Port, b: &Port) -> Result<Port, NetError> {
        let shape = broadcast(&a.shape, &b.shape).ok_or_else(|| NetError::Broadcast {
            op: ty,
            a: a.shape.clone(),
            b: b.shape.clone(),
        })?;
        Ok(self.one(ty, "opset1", vec![("auto_broadcast", "numpy".into())], &[a, b], a.et, shape))
    }

    /// A reduction over the last axis, keeping it.
    pub fn reduce_last(&mut self, bin: &mut Bin, ty: &'static str, x: &Port) -> Port {
        let axes = self.const_i64(bin, &[x.shape.len() as i64 - 1], &[1]);
        let mut shape = x.shape.clone();
        if let Some(l) = shape.last_mut() {
            *l = 1;
        }
        self.one(ty, "opset1", vec![("keep_dims", "true".into())], &[x, &axes], x.et, shape)
    }

    pub fn convert(&mut self, x: &Port, et: Et) -> Port {
        self.one("Convert", "opset1", vec![("destination_type", et.name().into())], &[x], et, x.shape.clone())
    }

    pub fn reshape(&mut self, bin: &mut Bin, x: &Port, shape: &[usize]) -> Port {
        let target: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let t = self.const_i64(bin, &target, &[shape.len()]);
        self.one("Reshape", "opset1", vec![("special_zero", "false".into())], &[x, &t], x.et, shape.to_vec())
    }

    pub fn transpose(&mut self, bin: &mut Bin, x: &Port, perm: &[usize]) -> Port {
        let p: Vec<i64> = perm.iter().map(|&d| d as i64).collect();
        let t = self.const_i64(bin, &p, &[perm.len()]);
        let shape = perm.iter().map(|&i| x.shape[i]).collect();
        self.one("Transpose", "opset1", vec![], &[x, &t], x.et, shape)
    }

    /// `x[.., start..stop, ..]` along `axis` (step 1).
    pub fn slice(&mut self, bin: &mut Bin, x: &Port, axis: usize, start: usize, stop: usize) -> Port {
        let b = self.const_i64(bin, &[start as i64], &[1]);
        let e = self.const_i64(bin, &[stop as i64], &[1]);
        let s = self.const_i64(bin, &[1], &[1]);
        let a = self.const_i64(bin, &[axis as i64], &[1]);
        let mut shape = x.shape.clone();
        shape[axis] = stop - start;
        self.one("Slice", "opset8", vec![], &[x, &b, &e, &s, &a], x.et, shape)
    }

    pub fn concat(&mut self, xs: &[&Port], axis: usize) -> Port {
        let mut shape = xs[0].shape.clone();
        shape[axis] = xs.iter().map(|p| p.shape[axis]).sum();
        self.one("Concat", "opset1", vec![("axis", axis.to_string())], xs, xs[0].et, shape)
    }

    /// Gather along axis 0.
    pub fn gather0(&mut self, bin: &mut Bin, data: &Port, idx: &Port) -> Port {
        let axis = self.const_i64(bin, &[0], &[]);
        let mut shape = idx.shape.clone();
        shape.extend_from_slice(&data.shape[1..]);
        self.one("Gather", "opset8", vec![("batch_dims", "0".into())], &[data, idx, &axis], data.et, shape)
    }

    pub fn matmul(&mut self, a: &Port, b: &Port, transpose_b: bool) -> Result<Port, NetError> {
        let k = *a.shape.last().ok_or(NetError::MatMulOfScalar)?;
        let (bk, n) = if transpose_b { (b.shape[1], b.shape[0]) } else { (b.shape[0], b.shape[1]) };
        if b.shape.len() != 2 || bk != k {
            return Err(NetError::MatMul { a: a.shape.clone(), b: b.shape.clone(), transpose_b });
        }
        let mut shape = a.shape.clone();
        *shape.last_mut().unwrap() = n;
        let data = vec![("transpose_a", "false".into()), ("transpose_b", transpose_b.to_string())];
        Ok(self.one("MatMul", "opset1", data, &[a, b], a.et, shape))
    }

    /// `FakeQuantize` with the same input and output range (`levels` steps between `low` and
    /// `high`): what OpenVINO reads as a quantised activation.
    pub fn fake_quantize(&mut self, x: &Port, low: &Port, high: &Port, levels: usize) -> Port {
        let data = vec![("levels", levels.to_string()), ("auto_broadcast", "numpy".into())];
        self.one("FakeQuantize", "opset1", data, &[x, low, high, low, high], x.et, x.shape.clone())
    }

    /// The IR v11 text.
    pub fn to_xml(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "<?xml version=\"1.0\"?>\n<net name=\"{}\" version=\"11\">\n\t<layers>", esc(&self.name));
        for (id, l) in self.layers.iter().enumerate() {
            let _ = writeln!(
                s,
                "\t\t<layer id=\"{id}\" name=\"{}\" type=\"{}\" version=\"{}\">",
                esc(&l.name),
                l.ty,
                l.version
            );
            if !l.data.is_empty() {
                let attrs: String = l.data.iter().map(|(k, v)| format!(" {k}=\"{}\"", esc(v))).collect();
                let _ = writeln!(s, "\t\t\t<data{attrs}/>");
            }
            let port = |s: &mut String, i: usize, p: &PortDesc, with_precision: bool| {
                let precision =
                    if with_precision { format!(" precision=\"{}\"", p.et.precision()) } else { String::new() };
                let names =
                    if p.names.is_empty() { String::new() } else { format!(" names=\"{}\"", esc(&p.names.join(","))) };
                let _ = write!(s, "\t\t\t\t<port id=\"{i}\"{precision}{names}>");
                for d in &p.shape {
                    let _ = write!(s, "<dim>{d}</dim>");
                }
                s.push_str("</port>\n");
            };
            if !l.inputs.is_empty() {
                s.push_str("\t\t\t<input>\n");
                for (i, p) in l.inputs.iter().enumerate() {
                    port(&mut s, i, p, true);
                }
                s.push_str("\t\t\t</input>\n");
            }
            if !l.outputs.is_empty() {
                s.push_str("\t\t\t<output>\n");
                for (i, p) in l.outputs.iter().enumerate() {
                    port(&mut s, l.inputs.len() + i, p, true);
                }
                s.push_str("\t\t\t</output>\n");
            }
            s.push_str("\t\t</layer>\n");
        }
        s.push_str("\t</layers>\n\t<edges>\n");
        for (fl, fp, tl, tp) in &self.edges {
            let _ =
                writeln!(s, "\t\t<edge from-layer=\"{fl}\" from-port=\"{fp}\" to-layer=\"{tl}\" to-port=\"{tp}\"/>");
        }
        s.push_str("\t</edges>\n</net>\n");
        s
    }
}

fn dims(shape: &[usize]) -> String {
    shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

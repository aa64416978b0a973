//! The static expert network of a mixture of experts ([`bundle::intel::ExpertSegment`]): one
//! expert's projections with its weights as run-time inputs, so the host binds the experts the
//! router selected instead of the network gathering them (the Intel-NPU notes measured binding a
//! selected expert at 1.7 ms against 18–135 ms for an in-graph gather). One network per token
//! block size; the host gathers each expert's routed rows into the smallest block that holds them.

use crate::xml::{Bin, Et, Net, NetError, Port};
use crate::IntelError;
use bundle::intel::{self, ExpertActivation, ExpertCodes, ExpertSegment, EXPERT_INPUTS, EXPERT_OUTPUT, EXPERT_SCALES};
use std::collections::BTreeMap;

/// The expert networks of MoE host step `index` for each of `blocks`: the plan entry and the
/// networks as `(file name, IR text)`.
pub(crate) fn expert_segment(
    index: usize,
    m: &intel::Moe,
    blocks: &[usize],
    bin: &mut Bin,
) -> Result<(ExpertSegment, Vec<(String, String)>), IntelError> {
    let mut files = BTreeMap::new();
    let mut xml = Vec::new();
    for &t in blocks {
        let name = format!("expert{index:02}_t{t}");
        let net = expert_network(&name, m, t, bin)
            .map_err(|e| IntelError::Unsupported { node: m.node.clone(), msg: format!("expert network: {e}") })?;
        let file = format!("{name}.xml");
        xml.push((file.clone(), net.to_xml()));
        files.insert(t, file);
    }
    Ok((ExpertSegment { files }, xml))
}

/// `y = fc2 · act(fc1 · x + b1) + b2` over a block of `t` rows, every weight a parameter.
fn expert_network(name: &str, m: &intel::Moe, t: usize, bin: &mut Bin) -> Result<Net, NetError> {
    let (h, inter) = (m.hidden, m.inter);
    let n1 = m.activation.fusion() * inter;
    let mut net = Net::new(name);
    let [x_name, fc1_name, b1_name, fc2_name, b2_name] = EXPERT_INPUTS;
    let x = net.parameter(x_name, Et::F32, &[1, t, h]);
    let fc1 = weight(&mut net, bin, m.codes.as_ref(), (fc1_name, EXPERT_SCALES[0]), (n1, h))?;
    let b1 = m.b1.map(|_| net.parameter(b1_name, Et::F32, &[n1]));
    let fc2 = weight(&mut net, bin, m.codes.as_ref(), (fc2_name, EXPERT_SCALES[1]), (h, inter))?;
    let b2 = m.b2.map(|_| net.parameter(b2_name, Et::F32, &[h]));
    let mut up = net.matmul(&x, &fc1, true)?;
    if let Some(b1) = &b1 {
        up = net.binary("Add", &up, b1)?;
    }
    let mid = activation(&mut net, bin, m.activation, &up, (t, inter))?;
    let mut y = net.matmul(&mid, &fc2, true)?;
    if let Some(b2) = &b2 {
        y = net.binary("Add", &y, b2)?;
    }
    net.result(&y, EXPERT_OUTPUT);
    Ok(net)
}

/// A projection's `[n, k]` f32 weight: a parameter, or over codes the signed codes `[n, G,
/// block]` and their scales `[n, G, 1]` as parameters, decompressed as a weight-only GEMM's are.
fn weight(
    net: &mut Net,
    bin: &mut Bin,
    codes: Option<&ExpertCodes>,
    (name, scales_name): (&str, &str),
    (n, k): (usize, usize),
) -> Result<Port, NetError> {
    let Some(c) = codes else { return Ok(net.parameter(name, Et::F32, &[n, k])) };
    let block = c.block_of(k);
    let et = if c.bits == 4 { Et::I4 } else { Et::I8 };
    let q = net.parameter(name, et, &[n, k / block, block]);
    let s = net.parameter(scales_name, Et::F32, &[n, k / block, 1]);
    let qf = net.convert(&q, Et::F32);
    let w = net.binary("Multiply", &qf, &s)?;
    Ok(net.reshape(bin, &w, &[n, k]))
}

fn scalar(net: &mut Net, bin: &mut Bin, v: f32) -> Port {
    net.const_f32(bin, &[v], &[])
}

fn clamp(net: &mut Net, x: &Port, min: f32, max: f32) -> Port {
    let data = vec![("min", format!("{min:e}")), ("max", format!("{max:e}"))];
    net.layer("Clamp", "opset1", data, &[x], &[(x.et, x.shape.clone())]).remove(0)
}

/// The activation between the projections, as the host executor applies it.
fn activation(
    net: &mut Net,
    bin: &mut Bin,
    act: ExpertActivation,
    up: &Port,
    (t, inter): (usize, usize),
) -> Result<Port, NetError> {
    Ok(match act {
        ExpertActivation::Identity => up.clone(),
        ExpertActivation::Relu => {
            let zero = scalar(net, bin, 0.0);
            net.binary("Maximum", up, &zero)?
        }
        ExpertActivation::Silu => {
            let s = net.unary("Sigmoid", up);
            net.binary("Multiply", up, &s)?
        }
        ExpertActivation::Gelu => {
            let (c, k, one, half) = (
                scalar(net, bin, 0.797_884_6),
                scalar(net, bin, 0.044715),
                scalar(net, bin, 1.0),
                scalar(net, bin, 0.5),
            );
            let x2 = net.binary("Multiply", up, up)?;
            let x3 = net.binary("Multiply", &x2, up)?;
            let kx3 = net.binary("Multiply", &k, &x3)?;
            let inner = net.binary("Add", up, &kx3)?;
            let scaled = net.binary("Multiply", &c, &inner)?;
            let th = net.unary("Tanh", &scaled);
            let onept = net.binary("Add", &one, &th)?;
            let xt = net.binary("Multiply", up, &onept)?;
            net.binary("Multiply", &half, &xt)?
        }
        ExpertActivation::SwiGlu { interleaved, alpha, beta, limit } => {
            let (g, l) = if interleaved {
                let pairs = net.reshape(bin, up, &[1, t, inter, 2]);
                let g = net.slice(bin, &pairs, 3, 0, 1);
                let l = net.slice(bin, &pairs, 3, 1, 2);
                (net.reshape(bin, &g, &[1, t, inter]), net.reshape(bin, &l, &[1, t, inter]))
            } else {
                (net.slice(bin, up, 2, 0, inter), net.slice(bin, up, 2, inter, 2 * inter))
            };
            let (g, l) = match limit {
                Some(limit) => (clamp(net, &g, f32::MIN, limit), clamp(net, &l, -limit, limit)),
                None => (g, l),
            };
            let a = scalar(net, bin, alpha);
            let ag = net.binary("Multiply", &g, &a)?;
            let s = net.unary("Sigmoid", &ag);
            let gs = net.binary("Multiply", &g, &s)?;
            let b = scalar(net, bin, beta);
            let lb = net.binary("Add", &l, &b)?;
            net.binary("Multiply", &gs, &lb)?
        }
    })
}

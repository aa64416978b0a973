//! The host steps of a hybrid plan ([`intel::HostStep`]): the nodes the host computes between
//! segments besides attention, with the host executor's semantics (`exec::run::recurrent`,
//! `exec::run::moe`).
//!
//! - **CausalConvWithState** and **LinearAttention** (the gated delta rule, a prefill's rows in
//!   chunks of [`exec::DEFAULT_DELTA_CHUNK`]): the host executor's own kernels. The state is the
//!   session's, one per layer, zeroed with the sequence and updated in place by each step's real
//!   rows — it never leaves the host, so no state tensor is copied between segments.
//! - **MoE** with f32 experts: each real row is routed on the host (softmax over the router
//!   logits, the top k, ties to the lower expert, renormalised when asked). Each routed expert
//!   then runs the plan's static expert network ([`intel::ExpertSegment`]) with its own weights
//!   bound as the network's inputs — OpenVINO tensors made once at open, one set per expert, so
//!   selecting an expert copies no weight — over its rows gathered into the smallest block that
//!   holds them; the host adds each row's outputs with its routing weights. Without an expert
//!   network in the plan, or after [`OvSession::set_host_experts`], the host computes the
//!   experts itself, each over all its rows with its weights read once per step.
//!
//! Inputs are segment outputs, `block` rows of which the first `rows` are real; outputs are fresh
//! OpenVINO tensors of the block's shape, padded rows zero, that the next segment is bound to.

use super::{fresh_tensor, ov, OvError, OvSession};
use crate::bundle::intel::{
    self, ByteRange, ExpertActivation, HostStep, PlanError, EXPERT_INPUTS, EXPERT_OUTPUT, EXPERT_SCALES,
};
use crate::exec::{self, DeltaScratch, LinearHeads, LinearInputs};
use openvino::{DeviceType, ElementType, InferRequest, Tensor};
use std::collections::HashMap;

/// One host step with its weights (f32, read from the weights file at open) and its state.
pub(super) struct HostRun {
    pub step: HostStep,
    weights: Vec<Vec<f32>>,
    state: Vec<f32>,
    /// A mixture of experts with an expert network: each expert's weights as the network's
    /// inputs, by [`EXPERT_INPUTS`] name.
    experts: Vec<Vec<(&'static str, Tensor)>>,
    /// A delta rule's scratch.
    scratch: DeltaScratch,
}

/// The bytes at `range` of the weights file (`at` names the plan member).
fn bytes<'w>(weights: &'w [u8], range: ByteRange, at: &str) -> Result<&'w [u8], OvError> {
    let span = usize::try_from(range.offset).ok().zip(usize::try_from(range.size).ok());
    let found = span.and_then(|(o, s)| weights.get(o..o.checked_add(s)?)).ok_or_else(|| {
        let msg = format!("bytes {}..+{} are beyond the {}-byte weights file", range.offset, range.size, weights.len());
        PlanError::at(at, msg)
    })?;
    Ok(found)
}

/// The f32 values at `range` of the weights file.
fn floats(weights: &[u8], range: ByteRange, at: &str) -> Result<Vec<f32>, OvError> {
    Ok(bytes(weights, range, at)?.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
}

/// Attention `i`'s sinks from the weights file, one per query head.
pub(super) fn attention_sinks(i: usize, a: &intel::Attention, weights: &[u8]) -> Result<Option<Vec<f32>>, OvError> {
    let Some(range) = a.sinks else { return Ok(None) };
    let sinks = floats(weights, range, &format!("attention[{i}].sinks"))?;
    if sinks.len() != a.q_heads {
        let msg = format!("{} sinks for {} query heads", sinks.len(), a.q_heads);
        return Err(PlanError::at(format!("attention[{i}].sinks"), msg).into());
    }
    Ok(Some(sinks))
}

/// `rows` rows of `k` values from their codes (`k·bits/8` bytes a row, low bits first) and
/// scales (one per block), as the host executor dequantises QMoE's experts.
fn dequantize(codes: &[u8], scales: &[f32], (bits, block): (usize, usize), (rows, k): (usize, usize)) -> Vec<f32> {
    let (row_bytes, blocks, zero) = (k * bits / 8, k / block, (1u32 << (bits - 1)) as f32);
    let mut out = Vec::with_capacity(rows * k);
    for r in 0..rows {
        let row = &codes[r * row_bytes..][..row_bytes];
        out.extend((0..k).map(|kk| {
            let bit = kk * bits;
            let code = (u32::from(row[bit / 8]) >> (bit % 8)) & ((1 << bits) - 1);
            (code as f32 - zero) * scales[r * blocks + kk / block]
        }));
    }
    out
}

/// A mixture's projections as loaded: f32 values (dequantised codes too) for the host, and the
/// codes with their scales for the expert networks.
struct ExpertStore {
    /// fc1, b1, fc2, b2 as f32 (an absent bias empty).
    floats: Vec<Vec<f32>>,
    /// fc1's and fc2's codes and scales (QMoE).
    codes: Option<[(Vec<u8>, Vec<f32>); 2]>,
}

fn load_experts(i: usize, m: &intel::Moe, weights: &[u8]) -> Result<ExpertStore, OvError> {
    let at = |what: &str| format!("host[{i}].{what}");
    let bias = |r: Option<ByteRange>, what: &str| r.map(|r| floats(weights, r, &at(what))).transpose();
    let (b1, b2) = (bias(m.b1, "b1")?.unwrap_or_default(), bias(m.b2, "b2")?.unwrap_or_default());
    let n1 = m.activation.fusion() * m.inter;
    let Some(c) = m.codes else {
        let (fc1, fc2) = (floats(weights, m.fc1, &at("fc1"))?, floats(weights, m.fc2, &at("fc2"))?);
        return Ok(ExpertStore { floats: vec![fc1, b1, fc2, b2], codes: None });
    };
    let fc1 = (bytes(weights, m.fc1, &at("fc1"))?.to_vec(), floats(weights, c.fc1_scales, &at("codes.fc1_scales"))?);
    let fc2 = (bytes(weights, m.fc2, &at("fc2"))?.to_vec(), floats(weights, c.fc2_scales, &at("codes.fc2_scales"))?);
    let shape1 = (m.experts * n1, m.hidden);
    let shape2 = (m.experts * m.hidden, m.inter);
    let sizes_fit = |(codes, scales): &(Vec<u8>, Vec<f32>), (rows, k): (usize, usize)| {
        codes.len() == rows * k * c.bits / 8 && scales.len() == rows * (k / c.block_of(k))
    };
    if !sizes_fit(&fc1, shape1) || !sizes_fit(&fc2, shape2) {
        return Err(PlanError::at(at("codes"), "codes or scales do not fit the experts' shapes").into());
    }
    let deq1 = dequantize(&fc1.0, &fc1.1, (c.bits, c.block_of(m.hidden)), shape1);
    let deq2 = dequantize(&fc2.0, &fc2.1, (c.bits, c.block_of(m.inter)), shape2);
    Ok(ExpertStore { floats: vec![deq1, b1, deq2, b2], codes: Some([fc1, fc2]) })
}

impl HostRun {
    /// Step `i` of the plan with its weights from `weights` (the weights file) and a zero state.
    pub(super) fn new(i: usize, step: &HostStep, weights: &[u8]) -> Result<HostRun, OvError> {
        let (loaded, experts) = match step {
            HostStep::CausalConv(c) => {
                let weight = floats(weights, c.weight, &format!("host[{i}].weight"))?;
                let bias = c.bias.map(|b| floats(weights, b, &format!("host[{i}].bias"))).transpose()?;
                (vec![weight, bias.unwrap_or_default()], Vec::new())
            }
            HostStep::DeltaRule(_) => (Vec::new(), Vec::new()),
            HostStep::Moe(m) => {
                let store = load_experts(i, m, weights)?;
                let experts = if m.segment.is_some() { expert_tensors(m, &store)? } else { Vec::new() };
                (store.floats, experts)
            }
        };
        let state = vec![0.0; step.state_floats()];
        Ok(HostRun { step: step.clone(), weights: loaded, state, experts, scratch: DeltaScratch::default() })
    }

    /// Zeroes the state (a new sequence).
    pub(super) fn reset(&mut self) {
        self.state.fill(0.0);
    }

    pub(super) fn has_state(&self) -> bool {
        !self.state.is_empty()
    }

    /// Runs the step on the block's `rows` real rows of `block`, writing its output into `values`.
    pub(super) fn run(
        &mut self,
        rows: usize,
        block: usize,
        values: &mut HashMap<String, Tensor>,
    ) -> Result<(), OvError> {
        let node = self.step.node().to_string();
        let fail = |msg: String| OvError::Run(format!("host step `{node}`: {msg}"));
        let read = |name: &str, width: usize| -> Result<Vec<f32>, OvError> {
            let t = values.get(name).ok_or_else(|| fail(format!("no value {name}")))?;
            let data = t.get_data::<f32>().map_err(|e| fail(e.to_string()))?;
            if data.len() != block * width {
                return Err(fail(format!("{name} holds {} values, not {block} rows of {width}", data.len())));
            }
            Ok(data.to_vec())
        };
        let (out_name, out_shape, y) = match &self.step {
            HostStep::CausalConv(c) => {
                let x = read(&c.x, c.channels)?;
                let mut y = vec![0.0; c.channels * block];
                causal_conv(c, (&self.weights[0], &self.weights[1]), &mut self.state, (&x, rows, block), &mut y);
                (c.y.clone(), vec![1, c.channels, block], y)
            }
            HostStep::DeltaRule(d) => {
                let out_heads = d.q_heads.max(d.kv_heads);
                let (mut q, mut k) = (read(&d.q, d.q_heads * d.dk)?, read(&d.k, d.k_heads * d.dk)?);
                if let Some(eps) = d.qk_l2norm_eps {
                    crate::exec::l2_normalize_rows(&mut q, d.dk, eps);
                    crate::exec::l2_normalize_rows(&mut k, d.dk, eps);
                }
                let v = read(&d.v, d.kv_heads * d.dv)?;
                let decay = d.decay.as_deref().map(|n| read(n, d.kv_heads)).transpose()?;
                let beta = d.beta.as_deref().map(|n| read(n, d.kv_heads)).transpose()?;
                let mut y = vec![0.0; block * out_heads * d.dv];
                let h = LinearHeads {
                    q_heads: d.q_heads,
                    k_heads: d.k_heads,
                    kv_heads: d.kv_heads,
                    dk: d.dk,
                    dv: d.dv,
                    decay_per_key: false,
                    beta_shared: false,
                };
                let per_head = rows * d.kv_heads;
                let (decay, beta) = (decay.as_ref().map(|g| &g[..per_head]), beta.as_ref().map(|b| &b[..per_head]));
                let (q, k, v) =
                    (&q[..rows * d.q_heads * d.dk], &k[..rows * d.k_heads * d.dk], &v[..rows * d.kv_heads * d.dv]);
                let x = LinearInputs { h, q, k, v, decay, beta, tokens: rows };
                let chunk = (exec::DEFAULT_DELTA_CHUNK, None);
                exec::delta_rule_rows(&x, &mut self.state, chunk, &mut self.scratch, d.scale, &mut y);
                (d.y.clone(), vec![1, block, out_heads * d.dv], y)
            }
            HostStep::Moe(m) => {
                let x = read(&m.x, m.hidden)?;
                let router = read(&m.router, m.experts)?;
                let mut y = vec![0.0; block * m.hidden];
                moe(m, &self.weights, (&x[..rows * m.hidden], &router[..rows * m.experts]), &mut y);
                (m.y.clone(), vec![1, block, m.hidden], y)
            }
        };
        let mut tensor = fresh_tensor(&node, ElementType::F32, &out_shape)?;
        tensor.get_data_mut::<f32>().map_err(|e| fail(e.to_string()))?.copy_from_slice(&y);
        values.insert(out_name, tensor);
        Ok(())
    }
}

/// Each expert's weights as OpenVINO tensors, by input name: its rows of fc1, b1, fc2 and b2 (an
/// absent bias left out), over codes the signed codes and their scales.
fn expert_tensors(m: &intel::Moe, store: &ExpertStore) -> Result<Vec<Vec<(&'static str, Tensor)>>, OvError> {
    let n1 = m.activation.fusion() * m.inter;
    let f32_tensor = |shape: &[usize], values: &[f32], name: &str| -> Result<Tensor, OvError> {
        let mut t = fresh_tensor(&m.node, ElementType::F32, shape)?;
        t.get_data_mut::<f32>().map_err(ov(&m.node, name))?.copy_from_slice(values);
        Ok(t)
    };
    let mut experts = Vec::with_capacity(m.experts);
    for e in 0..m.experts {
        let mut tensors = Vec::new();
        for (p, (rows, k)) in [(0, (n1, m.hidden)), (2, (m.hidden, m.inter))] {
            let name = EXPERT_INPUTS[1 + p];
            let count = rows * k;
            let tensor = match (&store.codes, m.codes) {
                (Some(codes), Some(c)) => {
                    let (codes, scales) = &codes[p / 2];
                    let block = c.block_of(k);
                    let (et, flip, row_bytes) =
                        if c.bits == 4 { (ElementType::I4, 0x88u8, count / 2) } else { (ElementType::I8, 0x80, count) };
                    let mut t = fresh_tensor(&m.node, et, &[rows, k / block, block])?;
                    let src = &codes[e * row_bytes..][..row_bytes];
                    let dst = t.get_raw_data_mut().map_err(ov(&m.node, name))?;
                    dst.iter_mut().zip(src).for_each(|(d, &s)| *d = s ^ flip);
                    let groups = rows * (k / block);
                    let s = f32_tensor(&[rows, k / block, 1], &scales[e * groups..][..groups], name)?;
                    tensors.push((EXPERT_SCALES[p / 2], s));
                    t
                }
                _ => f32_tensor(&[rows, k], &store.floats[p][e * count..][..count], name)?,
            };
            tensors.push((name, tensor));
            let bias = &store.floats[p + 1];
            if !bias.is_empty() {
                tensors.push((EXPERT_INPUTS[2 + p], f32_tensor(&[rows], &bias[e * rows..][..rows], name)?));
            }
        }
        experts.push(tensors);
    }
    Ok(experts)
}

impl OvSession {
    /// Host computes the experts of every mixture of experts even where the plan has an expert
    /// network (the first form of the target; for comparison).
    pub fn set_host_experts(&mut self, host: bool) {
        self.host_experts = host;
    }

    /// Expert networks run so far (one per routed expert and block of its rows).
    pub fn expert_runs(&self) -> u64 {
        self.expert_runs
    }

    /// The first node whose recurrent state the host keeps (a hybrid decoder), if any: such a
    /// sequence cannot be truncated (see [`OvSession::truncate`]).
    pub fn recurrent_node(&self) -> Option<&str> {
        self.host.iter().find(|h| h.has_state()).map(|h| h.step.node())
    }

    /// Runs host step `h` on the block (see the module documentation).
    pub(super) fn run_host(
        &mut self,
        h: usize,
        rows: usize,
        block: usize,
        values: &mut HashMap<String, Tensor>,
    ) -> Result<(), OvError> {
        match &self.host[h].step {
            HostStep::Moe(m) if m.segment.is_some() && !self.host_experts => {
                let m = m.clone();
                self.run_bound_experts(h, &m, (rows, block), values)
            }
            _ => self.host[h].run(rows, block, values),
        }
    }

    /// Routes the block's rows on the host and runs each routed expert's network with its weights
    /// bound, its rows gathered into the smallest block that holds them (the largest, repeatedly,
    /// for more).
    fn run_bound_experts(
        &mut self,
        h: usize,
        m: &intel::Moe,
        (rows, block): (usize, usize),
        values: &mut HashMap<String, Tensor>,
    ) -> Result<(), OvError> {
        let fail = |msg: String| OvError::Run(format!("host step `{}`: {msg}", m.node));
        let read = |name: &str, width: usize| -> Result<Vec<f32>, OvError> {
            let t = values.get(name).ok_or_else(|| fail(format!("no value {name}")))?;
            let data = t.get_data::<f32>().map_err(|e| fail(e.to_string()))?;
            if data.len() != block * width {
                return Err(fail(format!("{name} holds {} values, not {block} rows of {width}", data.len())));
            }
            Ok(data[..rows * width].to_vec())
        };
        let (x, router) = (read(&m.x, m.hidden)?, read(&m.router, m.experts)?);
        let mut routes: Vec<Vec<(usize, f32)>> = vec![Vec::new(); m.experts];
        for (t, logits) in router.chunks(m.experts).enumerate() {
            for (e, w) in route(logits, m.k, m.normalize) {
                routes[e].push((t, w));
            }
        }
        let mut y = vec![0.0; block * m.hidden];
        for (e, routed) in routes.iter().enumerate() {
            let largest = *self.blocks.last().unwrap_or(&1);
            for chunk in routed.chunks(largest) {
                let t = self.blocks.iter().copied().find(|&b| b >= chunk.len()).unwrap_or(largest);
                self.run_expert(h, (e, t), chunk, &x, &mut y)?;
            }
        }
        let mut tensor = fresh_tensor(&m.node, ElementType::F32, &[1, block, m.hidden])?;
        tensor.get_data_mut::<f32>().map_err(|e| fail(e.to_string()))?.copy_from_slice(&y);
        values.insert(m.y.clone(), tensor);
        Ok(())
    }

    /// Expert `e`'s network of block `t` over the rows `routed` (row, weight) of `x`, added into
    /// `y` with their weights.
    fn run_expert(
        &mut self,
        h: usize,
        (e, t): (usize, usize),
        routed: &[(usize, f32)],
        x: &[f32],
        y: &mut [f32],
    ) -> Result<(), OvError> {
        let HostStep::Moe(m) = &self.host[h].step else { unreachable!("an expert network belongs to a MoE") };
        let (node, hidden) = (m.node.clone(), m.hidden);
        let mut gathered = fresh_tensor(&node, ElementType::F32, &[1, t, hidden])?;
        let rows = gathered.get_data_mut::<f32>().map_err(ov(&node, "x"))?;
        for (i, &(row, _)) in routed.iter().enumerate() {
            rows[i * hidden..][..hidden].copy_from_slice(&x[row * hidden..][..hidden]);
        }
        self.expert_request(h, t)?;
        let request = self.expert_requests.get_mut(&(h, t)).expect("compiled above");
        request.set_tensor(EXPERT_INPUTS[0], &gathered).map_err(ov(&node, "binding x"))?;
        for (name, weight) in &self.host[h].experts[e] {
            request.set_tensor(name, weight).map_err(ov(&node, &format!("binding expert {e}'s {name}")))?;
        }
        request.infer().map_err(ov(&node, "infer"))?;
        let out = request.get_tensor(EXPERT_OUTPUT).map_err(ov(&node, "reading y"))?;
        let out = out.get_data::<f32>().map_err(ov(&node, "reading y"))?;
        for (i, &(row, w)) in routed.iter().enumerate() {
            y[row * hidden..][..hidden].iter_mut().zip(&out[i * hidden..][..hidden]).for_each(|(o, d)| *o += w * d);
        }
        self.expert_runs += 1;
        Ok(())
    }

    /// Compiles MoE host step `h`'s expert network of block `t` on first use.
    pub(super) fn expert_request(&mut self, h: usize, t: usize) -> Result<(), OvError> {
        if self.expert_requests.contains_key(&(h, t)) {
            return Ok(());
        }
        let HostStep::Moe(m) = &self.host[h].step else { unreachable!("an expert network belongs to a MoE") };
        let file = m.segment.as_ref().and_then(|s| s.files.get(&t)).ok_or_else(|| OvError::Segment {
            segment: m.node.clone(),
            msg: format!("no expert network for block size {t}"),
        })?;
        let xml = self.dir.join(file);
        let model = self
            .core
            .read_model_from_file(&xml.display().to_string(), &self.weights)
            .map_err(ov(&m.node, "read_model"))?;
        let mut compiled = self
            .core
            .compile_model(&model, DeviceType::Other(self.device.clone().into()))
            .map_err(ov(&m.node, "compile_model"))?;
        let request: InferRequest = compiled.create_infer_request().map_err(ov(&m.node, "create_infer_request"))?;
        self.expert_requests.insert((h, t), request);
        Ok(())
    }
}

/// The depthwise causal convolution of the real `rows` of `x` (`[channels, block]`) over the state
/// (the last `taps − 1` inputs of each channel), which then holds the last inputs of this step.
fn causal_conv(
    c: &intel::CausalConv,
    (weight, bias): (&[f32], &[f32]),
    state: &mut [f32],
    (x, rows, block): (&[f32], usize, usize),
    y: &mut [f32],
) {
    let (taps, s) = (c.taps, c.taps - 1);
    for ch in 0..c.channels {
        let (x, w, p) = (&x[ch * block..][..rows], &weight[ch * taps..][..taps], &mut state[ch * s..][..s]);
        let b = bias.get(ch).copied().unwrap_or(0.0);
        exec::conv_channel(x, (w, b), p, c.silu, &mut y[ch * block..][..rows]);
    }
}

/// The top `k` experts of one router row and their weights, as the host executor routes them.
fn route(logits: &[f32], k: usize, normalize: bool) -> Vec<(usize, f32)> {
    let (mut probs, mut chosen) = (Vec::new(), Vec::with_capacity(k));
    crate::exec::route_experts(logits, k, normalize, &mut probs, |e, w| chosen.push((e, w)));
    chosen
}

/// The expert activation, as the host executor computes it.
fn activate(act: ExpertActivation, h: &[f32], out: &mut [f32]) {
    use crate::exec::ExpertActivation as Host;
    let host = match act {
        ExpertActivation::Relu => Host::Relu,
        ExpertActivation::Gelu => Host::Gelu,
        ExpertActivation::Silu => Host::Silu,
        ExpertActivation::Identity => Host::Identity,
        ExpertActivation::SwiGlu { interleaved, alpha, beta, limit } => {
            Host::SwiGlu { interleaved, alpha, beta, limit: limit.unwrap_or(f32::INFINITY) }
        }
    };
    crate::exec::expert_activate(host, h, out);
}

/// `out[r] = W[e·n + r] · x + bias[e·n + r]` for the `n` rows of expert `e`'s `[n, k]` projection.
fn project(w: &[f32], bias: &[f32], (e, n, k): (usize, usize, usize), x: &[f32], out: &mut [f32]) {
    for (r, o) in out[..n].iter_mut().enumerate() {
        let row = &w[(e * n + r) * k..][..k];
        *o = row.iter().zip(x).map(|(a, b)| a * b).sum::<f32>() + bias.get(e * n + r).copied().unwrap_or(0.0);
    }
}

/// The mixture of experts over the real rows of `x` and `router`, into `y`.
fn moe(m: &intel::Moe, weights: &[Vec<f32>], (x, router): (&[f32], &[f32]), y: &mut [f32]) {
    let (h, inter) = (m.hidden, m.inter);
    let n1 = m.activation.fusion() * inter;
    let mut routes: Vec<Vec<(usize, f32)>> = vec![Vec::new(); m.experts];
    for (t, logits) in router.chunks(m.experts).enumerate() {
        for (e, w) in route(logits, m.k, m.normalize) {
            routes[e].push((t, w));
        }
    }
    let (mut up, mut mid, mut down) = (vec![0.0; n1], vec![0.0; inter], vec![0.0; h]);
    for (e, tokens) in routes.iter().enumerate() {
        for &(t, w) in tokens {
            let xt = &x[t * h..][..h];
            project(&weights[0], &weights[1], (e, n1, h), xt, &mut up);
            activate(m.activation, &up, &mut mid);
            project(&weights[2], &weights[3], (e, h, inter), &mid, &mut down);
            y[t * h..][..h].iter_mut().zip(&down).for_each(|(o, d)| *o += w * d);
        }
    }
}

//! The plan entries of the nodes the host computes between segments in hybrid decoders
//! ([`bundle::intel::HostStep`]): CausalConvWithState and LinearAttention (and the fused
//! CausalConv and DeltaNet, the same steps), whose states live on the host per sequence, and MoE
//! and QMoE (and the fused Moe, in QMoE's layout), which the host routes (see `experts` for where
//! the experts run). Their weights go into the weights file (f32, QMoE's codes as they are); forms the
//! host step does not compute are refused naming the node.

use crate::partition::host_node;
use crate::xml::Bin;
use crate::IntelError;
use bundle::intel::{self, ByteRange, ExpertActivation, HostStep};
use ir::graph::{Graph, NodeId, ValueDef, ValueId};
use ir::{Attrs, Domain, Node};

/// True for a Moe that adds a shared expert (inputs 8 and 9).
fn has_shared_expert(n: &Node) -> bool {
    let given = |i: usize| n.inputs.get(i).copied().flatten().is_some();
    n.domain == Domain::Npuc && n.op == "Moe" && given(8) && given(9)
}

/// `g` with each Moe's shared expert term taken back out of the op as the exporter wrote it:
/// the Moe routes into a new value, then `GatedAdd(routed, shared, Sigmoid(gate logits))` gives
/// its output. The host step routes the experts; the shared expert's output and gate are the
/// device's, and so is their sum, in the segment after the step.
pub(crate) fn shared_experts_on_device(mut g: Graph) -> Graph {
    // From the last, so the indices still to visit stay where they are.
    let moes: Vec<usize> = (0..g.nodes.len()).filter(|&i| has_shared_expert(&g.nodes[i])).collect();
    for at in moes.into_iter().rev() {
        let (Some(shared), Some(logits)) = (g.nodes[at].inputs[8], g.nodes[at].inputs[9]) else {
            unreachable!("a shared expert")
        };
        let out = g.nodes[at].outputs[0];
        let routed = fresh_value(&mut g, out, "routed", ValueDef::Node { node: NodeId(at as u32), output: 0 });
        let gate = fresh_value(&mut g, logits, "gate", ValueDef::Input);
        let node = &mut g.nodes[at];
        node.inputs.truncate(8);
        node.outputs[0] = routed;
        let name = node.name.clone();
        let plain = |op: &'static str, domain, opset, inputs: Vec<ValueId>, output| Node {
            name: format!("{name}/shared_expert/{op}"),
            domain,
            op,
            opset,
            attrs: Attrs::default(),
            inputs: inputs.into_iter().map(Some).collect(),
            outputs: vec![output],
        };
        let term = [
            plain("Sigmoid", Domain::Onnx, 13, vec![logits], gate),
            plain("GatedAdd", Domain::Microsoft, 1, vec![routed, shared, gate], out),
        ];
        g.insert_nodes(at + 1, term.into());
    }
    g
}

/// A new value of `like`'s type named after it, defined by `def`.
fn fresh_value(g: &mut Graph, like: ValueId, suffix: &str, def: ValueDef) -> ValueId {
    let v = g.value(like);
    let (name, dtype, shape) = (format!("{}/{suffix}", v.name), v.dtype, v.shape.clone());
    g.add_value(name, dtype, shape, def)
}

/// The plan entry of host node `id` (see the module doc).
pub(crate) fn host_step(g: &Graph, id: NodeId, bin: &mut Bin) -> Result<HostStep, IntelError> {
    let n = g.node(id);
    debug_assert!(host_node(n));
    let mut h = Host { g, n, bin };
    if n.op == "Moe" && n.inputs.iter().skip(8).any(Option::is_some) {
        return Err(h.fail("a shared expert's output without its gate logits (inputs 8 and 9)".into()));
    }
    match n.op {
        "CausalConvWithState" | "CausalConv" => h.causal_conv(),
        "LinearAttention" => h.delta_rule(),
        "DeltaNet" => h.delta_net(),
        "MoE" => h.moe((2, 3, 4, 5)),
        "Moe" if h.value(3).is_none() && h.value(6).is_none() => h.moe((2, 4, 5, 7)),
        _ => h.qmoe(),
    }
}

struct Host<'a> {
    g: &'a Graph,
    n: &'a Node,
    bin: &'a mut Bin,
}

impl Host<'_> {
    fn fail(&self, msg: String) -> IntelError {
        IntelError::Unsupported { node: self.n.name.clone(), msg }
    }

    fn value(&self, slot: usize) -> Option<ValueId> {
        self.n.inputs.get(slot).copied().flatten()
    }

    fn name(&self, slot: usize) -> Result<String, IntelError> {
        let v = self.value(slot).ok_or_else(|| self.fail(format!("input {slot} is missing")))?;
        Ok(self.g.value(v).name.clone())
    }

    fn output(&self) -> String {
        self.g.value(self.n.outputs[0]).name.clone()
    }

    /// The last dimension of input `slot`, which must be fixed.
    fn width(&self, slot: usize) -> Result<usize, IntelError> {
        let v = self.value(slot).ok_or_else(|| self.fail(format!("input {slot} is missing")))?;
        let val = self.g.value(v);
        let last = val.shape.last().and_then(|d| d.as_known());
        last.map(|d| d as usize).ok_or_else(|| self.fail(format!("`{}` needs a fixed last dimension", val.name)))
    }

    /// Weight input `slot` of `len` values, stored as f32 in the weights file.
    fn weight(&mut self, slot: usize, len: usize) -> Result<ByteRange, IntelError> {
        let v = self.value(slot).ok_or_else(|| self.fail(format!("input {slot} is missing")))?;
        let ValueDef::Weight(id) = self.g.value(v).def else {
            return Err(self.fail(format!("input {slot} (`{}`) is not a weight", self.g.value(v).name)));
        };
        let w = self.g.weights.get(id);
        let values = w.to_tensor().map_err(|e| self.fail(e.to_string()))?.to_f32_vec();
        if values.len() != len {
            return Err(self.fail(format!("weight `{}` holds {} values, not {len}", w.name, values.len())));
        }
        let (offset, size) =
            self.bin.keyed(&format!("host:{}", w.name), || values.iter().flat_map(|v| v.to_le_bytes()).collect());
        Ok(ByteRange { offset: offset as u64, size: size as u64 })
    }

    fn optional_weight(&mut self, slot: usize, len: usize) -> Result<Option<ByteRange>, IntelError> {
        self.value(slot).map(|_| self.weight(slot, len)).transpose()
    }

    /// Attributes that must keep their default.
    fn defaults(&self, defaults: &[(&str, i64)]) -> Result<(), IntelError> {
        for &(name, default) in defaults {
            if let Some(v) = self.n.attrs.int(name).ok().flatten().filter(|&v| v != default) {
                return Err(self.fail(format!("{name} = {v} is not supported (only {default})")));
            }
        }
        Ok(())
    }

    fn causal_conv(&mut self) -> Result<HostStep, IntelError> {
        let defaults =
            [("ndim", 1), ("state_window", 0), ("dilation", 1), ("channels_last", 0), ("input_channel_offset", 0)];
        self.defaults(&defaults)?;
        let silu = match self.n.attrs.str("activation").ok().flatten().unwrap_or("none") {
            "none" => false,
            "silu" | "swish" => true,
            a => return Err(self.fail(format!("activation {a:?} is not one of none, silu, swish"))),
        };
        let wv = self.value(1).ok_or_else(|| self.fail("no weight".into()))?;
        let (channels, taps) = match self.g.value(wv).shape.iter().map(|d| d.as_known()).collect::<Vec<_>>()[..] {
            [Some(c), Some(1), Some(k)] if c > 0 && k > 0 => (c as usize, k as usize),
            ref s => return Err(self.fail(format!("weight of shape {s:?} is not [channels, 1, taps]"))),
        };
        let x = self.value(0).ok_or_else(|| self.fail("no input".into()))?;
        if self.g.value(x).shape.get(1).and_then(|d| d.as_known()) != Some(channels as i64) {
            return Err(self.fail(format!("input is not [batch, {channels}, tokens]")));
        }
        Ok(HostStep::CausalConv(intel::CausalConv {
            node: self.n.name.clone(),
            x: self.name(0)?,
            y: self.output(),
            channels,
            taps,
            silu,
            weight: self.weight(1, channels * taps)?,
            bias: self.optional_weight(2, channels)?,
        }))
    }

    fn delta_rule(&mut self) -> Result<HostStep, IntelError> {
        self.defaults(&[("state_window", 0)])?;
        let rule = self.n.attrs.str("update_rule").ok().flatten().unwrap_or("gated_delta");
        let (gated, delta) = match rule {
            "linear" => (false, false),
            "gated" => (true, false),
            "delta" => (false, true),
            "gated_delta" => (true, true),
            r => return Err(self.fail(format!("update_rule {r:?} is not one of linear, gated, delta, gated_delta"))),
        };
        if (gated && self.value(4).is_none()) || (delta && self.value(5).is_none()) {
            return Err(self.fail(format!("update_rule {rule} needs its decay and beta inputs")));
        }
        let scale = self.n.attrs.float("scale").ok().flatten().unwrap_or(0.0);
        self.recurrence(("q_num_heads", "kv_num_heads"), scale, (gated, delta), None)
    }

    /// DeltaNet: the gated delta rule with its explicit scale, q and k normalised per head first
    /// when it has a `qk_l2norm_eps`.
    fn delta_net(&mut self) -> Result<HostStep, IntelError> {
        let eps = self.n.attrs.float("qk_l2norm_eps").ok().flatten();
        if eps.is_some_and(|e| !e.is_finite() || e < 0.0) {
            return Err(self.fail(format!("qk_l2norm_eps must be finite and ≥ 0, got {eps:?}")));
        }
        match self.n.attrs.float("scale").ok().flatten() {
            Some(s) if s != 0.0 && s.is_finite() => self.recurrence(("q_heads", "kv_heads"), s, (true, true), eps),
            s => Err(self.fail(format!("scale must be given, finite and non-zero, got {s:?}"))),
        }
    }

    /// The delta-rule step of a LinearAttention or DeltaNet node whose head counts are the
    /// attributes `heads`, with `scale` (0 for 1/√d_k), the gate terms it uses and the ε of its
    /// per-head q/k L2 norm, if it has one.
    fn recurrence(
        &mut self,
        heads: (&str, &str),
        scale: f32,
        (gated, delta): (bool, bool),
        qk_l2norm_eps: Option<f32>,
    ) -> Result<HostStep, IntelError> {
        let attr = |name: &str| self.n.attrs.int(name).ok().flatten().filter(|&h| h > 0).map(|h| h as usize);
        let (Some(q_heads), Some(kv_heads)) = (attr(heads.0), attr(heads.1)) else {
            return Err(self.fail(format!("{} and {} must be positive", heads.0, heads.1)));
        };
        let (qw, kw, vw) = (self.width(0)?, self.width(1)?, self.width(2)?);
        let (dk, dv) = (qw / q_heads, vw / kv_heads);
        let k_heads = kw.checked_div(dk).unwrap_or(0);
        let grouped = if q_heads >= kv_heads {
            q_heads % kv_heads == 0 && k_heads == kv_heads
        } else {
            kv_heads % q_heads == 0 && k_heads > 0 && kv_heads % k_heads == 0
        };
        if dk == 0 || dv == 0 || qw != q_heads * dk || vw != kv_heads * dv || kw != k_heads * dk || !grouped {
            return Err(self.fail(format!("widths q {qw}, k {kw}, v {vw} do not fit {q_heads} and {kv_heads} heads")));
        }
        for (slot, what, used) in [(4, "decay", gated), (5, "beta", delta)] {
            if used && self.width(slot)? != kv_heads {
                let msg =
                    format!("a {what} of width {} (the host step takes one per head, {kv_heads})", self.width(slot)?);
                return Err(self.fail(msg));
            }
        }
        let scale = if scale == 0.0 { 1.0 / (dk as f32).sqrt() } else { scale };
        let optional = |slot: usize, used: bool| if used { self.name(slot).map(Some) } else { Ok(None) };
        Ok(HostStep::DeltaRule(intel::DeltaRule {
            node: self.n.name.clone(),
            q: self.name(0)?,
            k: self.name(1)?,
            v: self.name(2)?,
            decay: optional(4, gated)?,
            beta: optional(5, delta)?,
            y: self.output(),
            q_heads,
            k_heads,
            kv_heads,
            dk,
            dv,
            scale,
            qk_l2norm_eps,
        }))
    }

    fn activation(&self) -> Result<ExpertActivation, IntelError> {
        for name in ["use_sparse_mixer", "swiglu_limit_after_activation"] {
            if self.n.attrs.int(name).ok().flatten().unwrap_or(0) != 0 {
                return Err(self.fail(format!("{name} is not supported (CUDA only)")));
            }
        }
        let fusion = self.n.attrs.int("swiglu_fusion").ok().flatten().unwrap_or(0);
        let float = |name: &str| self.n.attrs.float(name).ok().flatten();
        Ok(match self.n.attrs.str("activation_type").ok().flatten().unwrap_or("relu") {
            "relu" => ExpertActivation::Relu,
            "gelu" => ExpertActivation::Gelu,
            "silu" => ExpertActivation::Silu,
            "identity" => ExpertActivation::Identity,
            "swiglu" if fusion == 1 || fusion == 2 => ExpertActivation::SwiGlu {
                interleaved: fusion == 1,
                alpha: float("activation_alpha").unwrap_or(1.0),
                beta: float("activation_beta").unwrap_or(0.0),
                limit: float("swiglu_limit").filter(|l| l.is_finite()),
            },
            a => return Err(self.fail(format!("activation_type {a:?} with swiglu_fusion {fusion} is not supported"))),
        })
    }

    /// Input `slot` as the raw bytes of a u8 weight of `len` bytes, stored as they are.
    fn codes(&mut self, slot: usize, len: usize) -> Result<ByteRange, IntelError> {
        let v = self.value(slot).ok_or_else(|| self.fail(format!("input {slot} is missing")))?;
        let id = match self.g.value(v).def {
            ValueDef::Weight(id) if self.g.weights.get(id).dtype == ir::DType::U8 => id,
            _ => return Err(self.fail(format!("input {slot} (`{}`) is not a u8 weight", self.g.value(v).name))),
        };
        let w = self.g.weights.get(id);
        if w.bytes.len() != len {
            return Err(self.fail(format!("codes `{}` hold {} bytes, not {len}", w.name, w.bytes.len())));
        }
        let bytes = w.bytes.clone();
        let (offset, size) = self.bin.keyed(&format!("host:{}", w.name), || bytes.to_vec());
        Ok(ByteRange { offset: offset as u64, size: size as u64 })
    }

    /// QMoE with 4- or 8-bit experts and float activations (the inputs' int8 blocks of
    /// `accuracy_level` 4 and of blocked 8-bit experts are refused).
    fn qmoe(&mut self) -> Result<HostStep, IntelError> {
        if (8..14).any(|s| self.value(s).is_some()) {
            return Err(self.fail("fc3 experts and explicit zero points are not supported".into()));
        }
        let bits = self.n.attrs.int("expert_weight_bits").ok().flatten().unwrap_or(4) as usize;
        if !(bits == 4 || bits == 8) || self.n.attrs.str("quant_type").ok().flatten().is_some_and(|q| q != "int") {
            return Err(self.fail(format!("{bits}-bit experts are not supported (int4 and int8 are)")));
        }
        let activation = self.activation()?;
        let (hidden, experts) = (self.width(0)?, self.width(1)?);
        let fc1 = self.value(2).ok_or_else(|| self.fail("no fc1 experts".into()))?;
        let dims: Vec<Option<i64>> = self.g.value(fc1).shape.iter().map(|d| d.as_known()).collect();
        let f = activation.fusion();
        let rows1 = match dims[..] {
            [Some(e), Some(r), Some(kb)] if e as usize == experts && kb as usize * 8 == hidden * bits && r > 0 => {
                r as usize
            }
            _ => {
                return Err(
                    self.fail(format!("fc1 codes of shape {dims:?} are not [{experts}, rows, {hidden}·{bits}/8]"))
                )
            }
        };
        if rows1 % f != 0 {
            return Err(self.fail(format!("fc1's {rows1} rows are not {f}·inter")));
        }
        let inter = rows1 / f;
        let block = match self.n.attrs.int("block_size").ok().flatten().unwrap_or(0) {
            0 => None,
            b if b >= 16 && (b as usize).is_power_of_two() && hidden % b as usize == 0 && inter % b as usize == 0 => {
                Some(b as usize)
            }
            b => {
                return Err(
                    self.fail(format!("block_size {b} must be a power of two >= 16 dividing {hidden} and {inter}"))
                )
            }
        };
        if block.is_some() && (bits == 8 || self.n.attrs.int("accuracy_level").ok().flatten() == Some(4)) {
            let msg = "int8 activation blocks (accuracy_level 4, or blocked 8-bit experts) are not computed by the Intel plan's experts";
            return Err(self.fail(msg.into()));
        }
        let mut step = self.moe_common(activation, (hidden, experts, inter))?;
        step.fc1 = self.codes(2, experts * rows1 * hidden * bits / 8)?;
        step.fc2 = self.codes(5, experts * hidden * inter * bits / 8)?;
        step.b1 = self.optional_weight(4, experts * rows1)?;
        step.b2 = self.optional_weight(7, experts * hidden)?;
        let scales = |k: usize| experts * k / block.unwrap_or(k);
        step.codes = Some(intel::ExpertCodes {
            bits,
            block,
            fc1_scales: self.weight(3, rows1 * scales(hidden))?,
            fc2_scales: self.weight(6, hidden * scales(inter))?,
        });
        Ok(HostStep::Moe(step))
    }

    /// A Moe entry without weights yet: names, sizes, k and the routing.
    fn moe_common(
        &self,
        activation: ExpertActivation,
        (hidden, experts, inter): (usize, usize, usize),
    ) -> Result<intel::Moe, IntelError> {
        let k = match self.n.attrs.int("k").ok().flatten().unwrap_or(1) {
            k if k >= 1 && k as usize <= experts.min(16) => k as usize,
            k => return Err(self.fail(format!("k = {k} must be between 1 and the {experts} experts (at most 16)"))),
        };
        let none = ByteRange { offset: 0, size: 0 };
        Ok(intel::Moe {
            node: self.n.name.clone(),
            x: self.name(0)?,
            router: self.name(1)?,
            y: self.output(),
            experts,
            hidden,
            inter,
            k,
            // QMoE always renormalises the k weights.
            normalize: self.n.op == "QMoE"
                || self.n.attrs.int("normalize_routing_weights").ok().flatten().unwrap_or(0) != 0,
            activation,
            fc1: none,
            b1: None,
            fc2: none,
            b2: None,
            segment: None,
            codes: None,
        })
    }

    /// MoE, or Moe with float experts: fc1, its bias, fc2 and its bias at `slots`.
    fn moe(&mut self, (fc1_slot, b1, fc2, b2): (usize, usize, usize, usize)) -> Result<HostStep, IntelError> {
        if self.n.op == "MoE" && (self.value(6).is_some() || self.value(7).is_some()) {
            return Err(self.fail("separate fc3 experts are not supported".into()));
        }
        let activation = self.activation()?;
        let (hidden, experts) = (self.width(0)?, self.width(1)?);
        let f = activation.fusion();
        let fc1 = self.value(fc1_slot).ok_or_else(|| self.fail("no fc1 experts".into()))?;
        let dims: Vec<Option<i64>> = self.g.value(fc1).shape.iter().map(|d| d.as_known()).collect();
        let rows1 = match dims[..] {
            [Some(e), Some(r), Some(h)] if e as usize == experts && h as usize == hidden && r > 0 => r as usize,
            _ => return Err(self.fail(format!("fc1 experts of shape {dims:?} are not [{experts}, rows, {hidden}]"))),
        };
        if rows1 % f != 0 {
            return Err(self.fail(format!("fc1's {rows1} rows are not {f}·inter")));
        }
        let inter = rows1 / f;
        let mut step = self.moe_common(activation, (hidden, experts, inter))?;
        step.fc1 = self.weight(fc1_slot, experts * rows1 * hidden)?;
        step.b1 = self.optional_weight(b1, experts * rows1)?;
        step.fc2 = self.weight(fc2, experts * hidden * inter)?;
        step.b2 = self.optional_weight(b2, experts * hidden)?;
        Ok(HostStep::Moe(step))
    }
}

//! Rule family `causal-conv`: the short causal depthwise convolution of hybrid decoders with its
//! carried inputs, `y[c, t] = act(Σⱼ w[c, j]·x̃[c, t + j] + bias[c])` over the past state followed
//! by the block (x̃), into `npuc::CausalConv{activation}(x, w, bias, past_state)` with the source
//! node's outputs (y, present_state).
//!
//! Exporter patterns recognised:
//! - onnxruntime-genai's builder: `com.microsoft::CausalConvWithState` in Qwen3.5's Gated DeltaNet
//!   layers (with a bias and `activation="silu"`) and LFM2's short convolutions (no bias,
//!   `activation="none"`, the gating products around it left as they are).
//! - the opset-27 ai.onnx `CausalConvWithState`, the same op.
//!
//! `swish` is SiLU's other name and folds to `silu`. A SiLU the graph applies after an
//! `activation="none"` convolution is not taken into the op: the e-graph would then hold two
//! convolutions writing one present state, and extraction could keep both.
//!
//! Declined, with the reason recorded: activations other than none/silu/swish, and any attribute
//! off its default (`ndim` other than 1, `dilation`, `channels_last`, `input_channel_offset`, a
//! per-token `state_window`): no runtime npuc targets computes those forms.

use crate::apply::{no_match, Computed, Fold, Folded};
use crate::cond::var;
use crate::egraph_ops::{attrs, nodes_with_children, union};
use crate::Rewrite;
use egg::{rewrite as rw, Id, Subst, Symbol, Var};
use ir::egraph::{EGraph, ENode, Head};
use ir::{Attr, Domain};

/// The family's rules.
#[rustfmt::skip]
pub fn rules() -> Vec<Rewrite> {
    vec![
        // com.microsoft CausalConvWithState(x, w, bias, s) = CausalConv(x, w, bias, s)
        rw!("causal-conv-with-state-ms"; "(com.microsoft::CausalConvWithState ?x ?w ?bias ?s)" => { ConvOp::new() }),
        // ai.onnx CausalConvWithState(x, w, bias, s) = CausalConv(x, w, bias, s)
        rw!("causal-conv-with-state";    "(CausalConvWithState ?x ?w ?bias ?s)"                => { ConvOp::new() }),
    ]
}

/// Attributes CausalConv has only at their default, with it.
const DEFAULTS: [(&str, i64); 5] =
    [("ndim", 1), ("dilation", 1), ("channels_last", 0), ("input_channel_offset", 0), ("state_window", 0)];

/// CausalConvWithState (either domain) of the four inputs: `CausalConv{activation}` when its
/// attributes are the defaults and its activation none or SiLU.
struct ConvOp {
    inputs: [Var; 4],
}

impl ConvOp {
    fn new() -> Computed<Self> {
        Computed::new(ConvOp { inputs: ["?x", "?w", "?bias", "?s"].map(var) })
    }
}

impl Fold for ConvOp {
    fn fold(&self, egraph: &mut EGraph, eclass: Id, subst: &Subst, rule: Symbol) -> Folded {
        let inputs = self.inputs.map(|v| subst[v]);
        let node = nodes_with_children(egraph, eclass, "CausalConvWithState", &inputs).next().ok_or_else(no_match)?;
        let a = node.head.attrs().cloned().unwrap_or_default();
        for (name, default) in DEFAULTS {
            if let Some(v) = a.int(name).ok().flatten().filter(|&v| v != default) {
                return Err(format!("{name} = {v} is not folded: CausalConv has only {name} = {default}").into());
            }
        }
        let activation = match a.str("activation").ok().flatten().unwrap_or("none") {
            "none" => "none",
            "silu" | "swish" => "silu",
            other => return Err(format!("activation {other:?} is not folded: CausalConv applies none or silu").into()),
        };
        let conv_attrs = attrs(&[("activation", Attr::Str(activation.into()))]);
        let conv = egraph.add(ENode::op(Domain::Npuc, "CausalConv", conv_attrs, inputs.to_vec()));
        if egraph[eclass].data.types.len() == 1 {
            let y = egraph.add(ENode { head: Head::Proj(0), children: vec![conv] });
            return Ok(union(egraph, eclass, y, rule));
        }
        Ok(union(egraph, eclass, conv, rule))
    }
}

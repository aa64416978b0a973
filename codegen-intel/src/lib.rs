//! Code generation for Intel NPUs: weightless OpenVINO IR v11 segments cut at attention, static
//! token-block shapes, symmetric int4/int8 decompression subgraphs, and one shared weights file.
//!
//! [`compile`] takes the program the `intel-npu` pipeline extracted and produces:
//!
//! - **Segments.** The program is cut at every `npuc::Attention` (and, in hybrid decoders, at the
//!   nodes below): segment `i` runs from the end of
//!   attention `i−1` up to attention `i` and outputs that attention's q and new k/v (BNSH, after
//!   RoPE) and whatever later segments read (the residual stream). The host computes attention over
//!   its paged KV cache and feeds the result to segment `i+1`. The `lm_head` GEMM that produces the
//!   logits is its own segment, run on the last token row only.
//! - **Hybrid decoders** (Qwen3.5, LFM2 and their MoE forms). The program is also cut at each
//!   `CausalConv` and `DeltaNet` node (or `CausalConvWithState` and `LinearAttention` where the
//!   rules declined them) and at each `MoE` node: the host computes them between
//!   segments as it computes attention (plan `host`, schedule `{"host": i}`, see `host`). The
//!   recurrent layers run on the host because their state is carried from step to step and
//!   read-modify-written token by token (the delta rule's state is `heads × dk × dv`): on the
//!   host it lives per sequence beside the KV pages and is updated in place, where a device
//!   segment would need it as an input and an output every step, and a static network cannot
//!   express the delta rule's sequential scan over a block without unrolling it. What sits
//!   between them — projections, the q/k L2 norm, the decay gate, GatedRMSNorm, the shared
//!   expert and its GatedAdd, text-only M-RoPE (cos/sin rows fed like RoPE tables), a router
//!   written as plain ops (LFM2-MoE) — stays in the segments. A mixture of experts is cut after
//!   its router logits: the host routes (top k) and runs, per routed expert, a static expert
//!   network whose weights are its inputs (`experts`), binding the selected expert's weights;
//!   the plan carries every host step's weights in `weights.bin` (f32, or QMoE's codes and
//!   scales, bound as signed i4/i8 codes the expert network decompresses). QMoE with int8
//!   activation blocks is refused naming the node. Attention sinks (gpt-oss) go to the host's
//!   attention with the plan's attention entry (`sinks`).
//! - **Static shapes.** One network per token block size (`blocks`, default 1 and 64) per segment;
//!   batch is 1. Every network of every block size reads the same constants at the same offsets of
//!   one weights file (`weights.bin`): the `.xml` files hold no weight bytes.
//! - **Verify blocks.** Speculative decoding scores a pending token and its drafts in one step and
//!   needs every row's logits: for each verify block size (`verify_blocks`, default 2 and 4) every
//!   segment gets a network too, the lm_head's over all rows. Two more small networks per segment,
//!   no weight bytes (they view the same `weights.bin`), and a runtime compiles them only when it
//!   speculates.
//! - **RoPE tables.** cos/sin are segment inputs of role `rope` (`rope_cos`, `rope_sin`, and
//!   `rope_cos_1`, ... when layers rotate with different tables, as Gemma 3's local and global
//!   layers do; `[1, 1, T, head_dim]` f32): the program's own cos/sin computation is evaluated
//!   here for positions `0..rope_positions` and stored in the weights file (`rope.tables` of the
//!   plan); the host gathers the rows of the block's positions.
//! - **Public opset only.** RmsNorm, SkipRmsNorm, Rope, SwiGlu, GeluGate are decomposed (OpenVINO re-fuses
//!   them; interleaved RoPE swaps its pairs through a `[.., d/2, 2]` view); the row-scaled forms
//!   of the `fp16-rescale` family are decomposed with their rescaling (c = 2^⌊log₂ max|x|⌋ per
//!   row); a weight-only GEMM is `Const i4/i8 [N, G, group]` → `Convert f16` → `Multiply` by
//!   `Const f16 [N, G, 1]` → `Reshape [N, K]` → `Convert f32` → `MatMul (transpose_b)`, the
//!   decompression pattern OpenVINO keeps compressed.
//! - **QDQ (A8W8) programs.** `QuantizeLinear` of an activation is `FakeQuantize`, a QGemm's
//!   int8 weights are `Const i8|u8 [N, K]` → `Convert` → `Subtract` → `Multiply`, and the QGemm a
//!   MatMul of the two followed by its output's FakeQuantize (see [`qdq`]); the lm_head segment is
//!   the last `QuantizeLinear → QGemm → DequantizeLinear`.
//! - **Float models.** Their projections are compressed ([`float::compress`]: symmetric int4 by
//!   default, int8 or f16 on request) in the program both the IR and the host executor run.
//! - **Symmetric weights, one model for both backends.** [`symmetric::symmetrize`] re-quantises
//!   asymmetric weights symmetrically (or refuses them) and rounds scales to f16, reporting the error
//!   per weight; the same transformed program, with the row-scaled ops in their plain f32 forms
//!   ([`symmetric::host_forms`]), is the bundle's host program, so the host executor and OpenVINO
//!   run the very same weight values.
//! - **Plan.** [`IntelIr::plan`] (`npuc-intel/1`, [`bundle::intel::Plan`]) lists the segments with their files,
//!   inputs and outputs per block size, the attentions between them, the schedule, and the RoPE
//!   tables' location in the weights file.

mod error;
mod experts;
pub mod float;
mod host;
mod hybrid;
mod lower;
mod ops;
mod partition;
mod plan;
mod qdq;
mod rope;
mod router;
pub mod symmetric;
pub mod xml;

pub use error::{ConstantError, IntelError, LowerError};

use bundle::intel::{self, Plan};
use ir::graph::Graph;
use symmetric::{Asymmetric, WeightError};
use xml::Bin;

/// Compile options.
#[derive(Clone, Debug)]
pub struct Options {
    /// Token block sizes, one network per segment each.
    pub blocks: Vec<usize>,
    /// Verify block sizes (each at least 2), one network per segment each, the lm_head's over
    /// every row; empty for none.
    pub verify_blocks: Vec<usize>,
    pub asymmetric: Asymmetric,
    /// Positions the RoPE tables cover (the longest context the bundle can run on this target).
    pub rope_positions: usize,
    /// How float projection weights are stored (see [`float::compress`]).
    pub weights: float::FloatWeights,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            blocks: vec![1, 64],
            verify_blocks: vec![2, 4],
            asymmetric: Asymmetric::Requantize,
            rope_positions: 4096,
            weights: float::FloatWeights::Int4,
        }
    }
}

/// What [`compile`] produces.
pub struct IntelIr {
    /// `(file name, IR text)`, e.g. `("seg00_t1.xml", ...)`.
    pub xml: Vec<(String, String)>,
    /// The shared weights file.
    pub weights: Vec<u8>,
    /// The `npuc-intel/1` plan.
    pub plan: Plan,
    /// The cost of making the weights symmetric, per weight.
    pub requantized: Vec<WeightError>,
    /// The program the host executor runs: symmetric weights, plain (not row-scaled) forms.
    pub host_program: Graph,
    /// The program the IR was written from (symmetric weights, row-scaled forms, float
    /// activations into every WGemm).
    pub device_program: Graph,
}

pub use bundle::intel::{PLAN_FILE, WEIGHTS_FILE};

/// Symmetrises the weights and writes the IR segments of `program` (see the crate doc).
pub fn compile(program: &Graph, o: &Options) -> Result<IntelIr, IntelError> {
    if o.blocks.is_empty() || o.blocks.contains(&0) {
        return Err(IntelError::Structure(format!("invalid token block sizes {:?}", o.blocks)));
    }
    if o.verify_blocks.iter().any(|&b| b < 2) {
        let msg = format!("invalid verify block sizes {:?}: a verify block holds at least 2 rows", o.verify_blocks);
        return Err(IntelError::Structure(msg));
    }
    let (device, mut requantized) = symmetric::symmetrize(program, o.asymmetric)?;
    let (device, f16_weights, compressed) = float::compress(&device, o.weights)?;
    let device = host::shared_experts_on_device(symmetric::float_activations(device));
    requantized.extend(compressed);
    let parts = partition::partition(&device)?;
    let tables = rope::rope_tables(&device, &parts, o.rope_positions)?;
    let mut bin = Bin::default();
    let rope = plan::rope(&tables, &mut bin);
    let ascending = |b: &[usize]| {
        let mut b = b.to_vec();
        b.sort_unstable();
        b.dedup();
        b
    };
    let (blocks, verify_blocks) = (ascending(&o.blocks), ascending(&o.verify_blocks));
    let mut lowering = plan::Lowering { g: &device, bin: &mut bin, rope: &tables, f16_weights: &f16_weights };
    let (mut xml, mut segments) = (Vec::new(), Vec::new());
    for (index, seg) in parts.segments.iter().enumerate() {
        let (entry, networks) = lowering.segment(index, seg, &blocks, &verify_blocks)?;
        segments.push(entry);
        xml.extend(networks);
    }
    let attention = parts.attentions.iter().enumerate().map(|(layer, &a)| plan::attention(&device, layer, a, &mut bin));
    let attention = attention.collect::<Result<_, _>>()?;
    let mut host: Vec<intel::HostStep> =
        parts.host.iter().map(|&n| host::host_step(&device, n, &mut bin)).collect::<Result<_, _>>()?;
    for (i, step) in host.iter_mut().enumerate() {
        if let intel::HostStep::Moe(m) = step {
            let (segment, networks) = experts::expert_segment(i, m, &blocks, &mut bin)?;
            m.segment = Some(segment);
            xml.extend(networks);
        }
    }
    let plan = Plan {
        format: intel::Format,
        weights_file: WEIGHTS_FILE.to_string(),
        weights_bytes: bin.bytes.len() as u64,
        blocks,
        verify_blocks,
        logits: device.value(device.outputs[0]).name.clone(),
        rope,
        segments,
        attention,
        host,
        schedule: plan::schedule(&parts),
    };
    let host_program = symmetric::host_forms(&device);
    Ok(IntelIr { xml, weights: bin.bytes, plan, requantized, host_program, device_program: device })
}

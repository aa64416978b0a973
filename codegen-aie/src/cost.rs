//! What the array takes for a model's projections, from the plan: a cost model to compare
//! designs and devices before a device runs them, and to set beside published rates.
//!
//! - **Prefill** of `P` tokens: every projection's call of `P` rows (one row for a projection the
//!   executor computes for the last row only, the lm_head; each times the activation passes
//!   stacked in the call, [`GemmSite::passes`]) is routed as the runtime routes it
//!   ([`Plan::calls`]: GEMV blocks over the GEMV chunks below the threshold, else M-blocks of
//!   each M-block chunk's rows, a residual pass's chunk taking the first pass's); each
//!   array call costs its design's predicted cycles ([`crate::tiling::Tiling::total_cycles`]:
//!   the larger of the MACs at the device's rate and the busiest DMA channel, plus the fill) at
//!   the device's clock, plus [`DISPATCH_SECONDS`] to submit it.
//! - **Decode**: one token is every projection's call of one row, as the runtime makes it: a
//!   chained projection ([`crate::chain`]) one call of its qgemv design per column chunk (the
//!   quantisation, the GEMV and the passes' sum in the design's cycles), every other one a block
//!   of the GEMV designs ([`crate::gemv`]) per GEMV chunk (per stacked pass): the design's
//!   predicted cycles (its weight streams, at most one 32-bit word per cycle each, reading whole
//!   [`crate::gemv::SHIM_BURST_BYTES`] bursts, against its cores' MACs) at the clock, plus
//!   [`DISPATCH_SECONDS`] per call (an array program — an MLP, or the layer after attention —
//!   counts as its designs' calls: the reconfiguration between its phases is assumed to cost
//!   what a dispatch does until a device measures it). Beside it the floor: every int8 weight streamed once per
//!   token through every shim channel ([`Device::shim_bytes_per_second`]), which no design can
//!   beat.
//!
//! Host work — attention over the paged cache, the unchained projections' norms and
//! quantisation, the residual adds, the embedding, sampling — is not counted: the rates bound
//! what the array's share allows. The clock, the burst and the dispatch cost are
//! assumptions ([`Device::clock_hz`]), not measurements.

use serde::Serialize;

use crate::gemm::GemmSite;
use crate::plan::Plan;
use crate::Device;

/// Submitting one design call (instruction stream and buffer sync through the driver): an
/// assumption of the cost model.
pub const DISPATCH_SECONDS: f64 = 20e-6;

/// The cost model's numbers for one plan.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Prediction {
    pub prompt_tokens: usize,
    /// Array calls of the prefill (M-blocks × column chunks of every projection).
    pub prefill_calls: usize,
    /// The prefill calls' predicted cycles over the clock.
    pub prefill_array_seconds: f64,
    pub prefill_dispatch_seconds: f64,
    /// Prompt tokens per second the array's share of the prefill allows (0 when no call reaches
    /// the array).
    pub prefill_tok_s: f64,
    /// int8 weight bytes of every projection: what one decode token reads.
    pub decode_weight_bytes: u64,
    /// Decode tokens per second at most, with every weight streamed in once per token.
    pub decode_tok_s_bound: f64,
    /// Array calls of one decode token (a chained projection's chunks, the others' GEMV blocks
    /// × column chunks).
    pub decode_calls: usize,
    /// Projections a decode token runs chained.
    pub decode_chains: usize,
    /// The decode calls' predicted cycles over the clock.
    pub decode_array_seconds: f64,
    pub decode_dispatch_seconds: f64,
    /// Decode tokens per second the array's share allows (0 when no call reaches the array).
    pub decode_tok_s: f64,
}

/// Array calls and their predicted cycles when every projection is called with `rows_of` rows,
/// routed and given designs as the runtime does.
fn array_calls(plan: &Plan, rows_of: &dyn Fn(&GemmSite) -> usize) -> (usize, u64) {
    let (mut calls, mut cycles) = (0usize, 0u64);
    for g in &plan.gemms {
        for call in plan.calls(g, rows_of(&g.site)).unwrap_or_default() {
            cycles += plan.designs[call.design].tiling.total_cycles;
            calls += 1;
        }
    }
    (calls, cycles)
}

/// Array calls and their predicted cycles of one decode token: each chained projection's chunks
/// on its qgemv designs, every other projection's one-row call (per stacked pass) routed as the
/// runtime routes it.
fn decode_calls(plan: &Plan) -> (usize, u64) {
    let chained = |g: &GemmSite| plan.chains.iter().any(|c| c.site.qgemm == g.node);
    let (mut calls, mut cycles) = array_calls(plan, &|s| if chained(s) { 0 } else { s.passes });
    for chunk in plan.chains.iter().flat_map(|c| &c.chunks) {
        cycles += plan.designs[&chunk.design].tiling.total_cycles;
        calls += 1;
    }
    (calls, cycles)
}

/// Tokens per second of `tokens` tokens whose calls take `seconds`; 0 without calls.
fn rate(tokens: usize, calls: usize, seconds: f64) -> f64 {
    if calls == 0 {
        0.0
    } else {
        tokens as f64 / seconds
    }
}

/// The prediction for a prefill of `prompt_tokens` and for decoding; `last_row_only` says which
/// projections the executor computes for the last row only.
pub fn predict(plan: &Plan, prompt_tokens: usize, last_row_only: &dyn Fn(&GemmSite) -> bool) -> Prediction {
    let device: Device = plan.options.device;
    let clock = device.clock_hz();
    let (calls, cycles) = array_calls(plan, &|s| s.passes * if last_row_only(s) { 1 } else { prompt_tokens });
    let (array, dispatch) = (cycles as f64 / clock, calls as f64 * DISPATCH_SECONDS);
    let (decode_calls, decode_cycles) = decode_calls(plan);
    let (decode_array, decode_dispatch) = (decode_cycles as f64 / clock, decode_calls as f64 * DISPATCH_SECONDS);
    let bytes: u64 = plan.gemms.iter().map(|g| (g.site.k * g.site.n) as u64).sum();
    Prediction {
        prompt_tokens,
        prefill_calls: calls,
        prefill_array_seconds: array,
        prefill_dispatch_seconds: dispatch,
        prefill_tok_s: rate(prompt_tokens, calls, array + dispatch),
        decode_weight_bytes: bytes,
        decode_tok_s_bound: device.shim_bytes_per_second() / bytes as f64,
        decode_calls,
        decode_chains: plan.chains.len(),
        decode_array_seconds: decode_array,
        decode_dispatch_seconds: decode_dispatch,
        decode_tok_s: rate(1, decode_calls, decode_array + decode_dispatch),
    }
}

//! What the array takes for a model's projections, from the plan: a cost model to compare
//! designs and devices before a device runs them, and to set beside published rates.
//!
//! - **Prefill** of `P` tokens: every projection's call of `P` rows (one row for a projection the
//!   executor computes for the last row only, the lm_head) is routed as the runtime routes it
//!   ([`plan::route`]: on the host below the threshold, else M-blocks × column chunks); each
//!   array call costs its design's predicted cycles ([`crate::tiling::Tiling::total_cycles`]:
//!   the larger of the MACs at the device's rate and the busiest DMA channel, plus the fill) at
//!   the device's clock, plus [`DISPATCH_SECONDS`] to submit it.
//! - **Decode**: calls under the host threshold run on the host today, so the model gives the
//!   array's floor instead: a decode token reads every projection's int8 weights once, and they
//!   enter the array through the shim DMA channels ([`Device::shim_bytes_per_second`]).
//!
//! Host work — attention over the paged cache, norms, the embedding, sampling — is not counted:
//! the rates bound what the array's share allows. The clock and the dispatch cost are
//! assumptions ([`Device::clock_hz`]), not measurements.

use serde::Serialize;

use crate::gemm::GemmSite;
use crate::plan::{self, Plan};
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
}

/// The prediction for a prefill of `prompt_tokens` and for decoding; `last_row_only` says which
/// projections the executor computes for the last row only.
pub fn predict(plan: &Plan, prompt_tokens: usize, last_row_only: &dyn Fn(&GemmSite) -> bool) -> Prediction {
    let device: Device = plan.options.device;
    let (mut calls, mut cycles) = (0usize, 0u64);
    for g in &plan.gemms {
        let rows = if last_row_only(&g.site) { 1 } else { prompt_tokens };
        for (block_rows, _) in plan::route(plan, rows).unwrap_or_default() {
            for chunk in &g.chunks {
                let name = if block_rows == plan.decode_rows { &chunk.decode_design } else { &chunk.prefill_design };
                cycles += plan.designs[name].tiling.total_cycles;
                calls += 1;
            }
        }
    }
    let array = cycles as f64 / device.clock_hz();
    let dispatch = calls as f64 * DISPATCH_SECONDS;
    let bytes: u64 = plan.gemms.iter().map(|g| (g.site.k * g.site.n) as u64).sum();
    Prediction {
        prompt_tokens,
        prefill_calls: calls,
        prefill_array_seconds: array,
        prefill_dispatch_seconds: dispatch,
        prefill_tok_s: if calls == 0 { 0.0 } else { prompt_tokens as f64 / (array + dispatch) },
        decode_weight_bytes: bytes,
        decode_tok_s_bound: device.shim_bytes_per_second() / bytes as f64,
    }
}

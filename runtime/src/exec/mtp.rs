//! Drafting with a multi-token-prediction head: the second program an MTP bundle carries
//! (`bundle::DrafterKind::Mtp`), run by an executor of its own over the same mapped weights.
//!
//! The head's row t reads the decoder's final hidden state at position t and the token at t + 1,
//! at position t, and scores the token at t + 2. Its KV cache (one layer) therefore holds a row
//! for every decoder position whose next token is known: after the decoder has run positions
//! 0..n and the token at n is chosen, the head runs rows m..n−1 it has not run yet (the tokens
//! at m+1..n, the decoder's hidden states at m..n−1), and its last row drafts the token at n + 1.
//! A longer draft runs the head on its own guess, its `hidden_states_out` standing in for the
//! decoder's hidden state; those rows leave the head's cache afterwards (truncation, no copy),
//! because the decoder's own hidden states replace them once it has verified the block.
//!
//! [`Executor::step_sequence_hidden`] runs a step of a program that takes hidden states;
//! [`Executor::hidden_rows`] gives the rows a step computed of a program that returns them, once
//! [`Executor::set_hidden_output`] asks for them (the drafting loop does).

use super::error::{value_err, ExecError};
use super::plan::Loc;
use super::run::numel;
use super::speculate::Drafter;
use super::{ExecOptions, Executor};
use crate::bundle::Bundle;
use crate::kvcache::SeqId;

impl<'b> Executor<'b> {
    /// Loads `bundle`'s drafter program with its own KV cache (`options` as for the decoder).
    pub fn new_drafter(bundle: &'b Bundle, options: ExecOptions) -> Result<Executor<'b>, ExecError> {
        let drafter = bundle.drafter().ok_or_else(|| {
            value_err(
                "drafter",
                "the bundle carries no drafter program (compile a model that has mtp.onnx beside it, for --target cpu, without --no-drafter)",
            )
        })?;
        Executor::load(bundle, &drafter.program, options)
    }

    /// Width of the hidden states the program takes per row (an MTP head), if it takes them.
    pub fn hidden_input_width(&self) -> Option<usize> {
        self.plan.hidden_in.map(|v| self.row_width(v))
    }

    /// Width of the hidden states the program returns per row, if it returns them.
    pub fn hidden_output_width(&self) -> Option<usize> {
        self.plan.hidden_out.map(|v| self.row_width(v))
    }

    fn row_width(&self, v: usize) -> usize {
        self.plan.program.values[v].shape.last().and_then(|d| d.as_const()).unwrap_or(0)
    }

    /// [`Executor::step_sequence`] of a program that takes hidden states: `hidden` holds
    /// `tokens.len()` rows of [`Executor::hidden_input_width`] floats, row i beside token i.
    pub fn step_sequence_hidden(&mut self, seq: SeqId, tokens: &[u32], hidden: &[f32]) -> Result<&[f32], ExecError> {
        self.hidden_input.clear();
        self.hidden_input.extend_from_slice(hidden);
        let ran = self.step_sequence(seq, tokens).map(|_| ());
        self.hidden_input.clear();
        ran?;
        Ok(self.logits(false))
    }

    /// Makes steps compute the hidden states output (off by default where ops only it reads
    /// would cost time: a Qwen3.5 decoder from builder 0.18 feeds its lm_head before the last
    /// MLP, which only the hidden states need). A drafting loop turns it on.
    pub fn set_hidden_output(&mut self, on: bool) {
        self.hidden_output = on;
    }

    /// The hidden states every row of the last step computed, `[rows, width]`; `None` for a
    /// program without a hidden states output, or whose steps skip it
    /// ([`Executor::set_hidden_output`]). Valid until the next step.
    pub fn hidden_rows(&self) -> Option<&[f32]> {
        let v = self.plan.hidden_out?;
        if (0..self.plan.ops.len()).any(|i| self.skips_op(i)) {
            return None;
        }
        let Loc::Buf(b) = self.plan.locs[v] else { return None };
        Some(&self.bufs[b][..numel(&self.shapes[v])])
    }

    /// Copies the step's hidden states into their buffer (buffer 0), checking their size.
    pub(super) fn bind_hidden_input(&mut self, tokens: usize) -> Result<(), ExecError> {
        let Some(v) = self.plan.hidden_in else {
            return match self.hidden_input.is_empty() {
                true => Ok(()),
                false => Err(value_err("hidden_states", "given to a program that takes none")),
            };
        };
        let want = tokens * self.row_width(v);
        if self.hidden_input.len() != want {
            return Err(value_err(
                &self.plan.program.values[v].name,
                format!("{} floats given for {tokens} rows of {}", self.hidden_input.len(), self.row_width(v)),
            ));
        }
        if self.bufs[0].len() < want {
            self.bufs[0].resize(want, 0.0);
        }
        self.bufs[0][..want].copy_from_slice(&self.hidden_input);
        Ok(())
    }
}

/// Drafts with a bundle's MTP head (see the module doc): greedy argmax of the head's logits,
/// `draft_len` tokens at most, the head fed its own hidden states past the first.
pub struct MtpDrafter<'b> {
    head: Executor<'b>,
    draft_len: usize,
    /// The decoder's hidden states of the positions the head has not run yet, `[rows, width]`.
    queued: Vec<f32>,
    /// Decoder positions the head has run rows for.
    rows: usize,
    width: usize,
    /// Hidden states of the head's last row, for a longer draft.
    carried: Vec<f32>,
    error: Option<ExecError>,
}

impl<'b> MtpDrafter<'b> {
    /// The drafter over `head` (an executor of a program that takes hidden states, such as
    /// [`Executor::new_drafter`] loads), drafting up to `draft_len` tokens.
    pub fn new(head: Executor<'b>, draft_len: usize) -> Result<MtpDrafter<'b>, ExecError> {
        let width = head.hidden_input_width().ok_or_else(|| {
            value_err("hidden_states", "the drafter program takes no hidden states: it is not an MTP head")
        })?;
        if head.hidden_output_width().is_some_and(|w| w != width) {
            return Err(value_err("hidden_states_out", "differs in width from the head's hidden_states input"));
        }
        Ok(MtpDrafter { head, draft_len, queued: Vec::new(), rows: 0, width, carried: Vec::new(), error: None })
    }

    /// The head's executor (its cache, counters).
    pub fn head(&self) -> &Executor<'b> {
        &self.head
    }

    /// The error that stopped drafting, if one did (drafting then stops: the decoder's output is
    /// unaffected, every step verifies no draft).
    pub fn take_error(&mut self) -> Option<ExecError> {
        self.error.take()
    }
}

impl Drafter for MtpDrafter<'_> {
    fn draft(&mut self, history: &[u32]) -> Vec<u32> {
        if self.error.is_some() || self.draft_len == 0 {
            return Vec::new();
        }
        match self.run(history) {
            Ok(drafts) => drafts,
            Err(e) => {
                self.error = Some(e);
                Vec::new()
            }
        }
    }

    fn max_draft(&self) -> usize {
        self.draft_len
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn keep_hidden(&mut self, hidden: &[f32], rows: usize) {
        match hidden.get(..rows * self.width) {
            Some(kept) => self.queued.extend_from_slice(kept),
            None => {
                let got = hidden.len();
                self.error =
                    Some(value_err("hidden_states", format!("{got} floats for {rows} rows of {}", self.width)));
            }
        }
    }
}

impl MtpDrafter<'_> {
    /// Runs the head's rows up to the decoder's last position (`history` ends with the token
    /// chosen after it), then its own guesses; leaves only the decoder-fed rows in its cache.
    fn run(&mut self, history: &[u32]) -> Result<Vec<u32>, ExecError> {
        let decoded = history.len().saturating_sub(1);
        let pending_rows = decoded.saturating_sub(self.rows);
        if pending_rows == 0 || self.queued.len() != pending_rows * self.width {
            return Err(value_err(
                "hidden_states",
                format!("{} floats queued for the head's {pending_rows} new rows of {}", self.queued.len(), self.width),
            ));
        }
        let seq = self.head.default_sequence();
        let tokens = &history[self.rows + 1..];
        let mut next = super::argmax(self.head.step_sequence_hidden(seq, tokens, &self.queued)?);
        self.queued.clear();
        self.rows = decoded;
        let mut drafts = vec![next];
        while drafts.len() < self.draft_len {
            self.carry_last_row()?;
            next = super::argmax(self.head.step_sequence_hidden(seq, &[next], &self.carried)?);
            drafts.push(next);
        }
        self.head.truncate_sequence(seq, self.rows)?;
        Ok(drafts)
    }

    fn carry_last_row(&mut self) -> Result<(), ExecError> {
        let rows = self.head.hidden_rows().ok_or_else(|| {
            value_err("hidden_states_out", "the head returns no hidden states, so it drafts one token at a time")
        })?;
        self.carried.clear();
        self.carried.extend_from_slice(&rows[rows.len() - self.width..]);
        Ok(())
    }
}

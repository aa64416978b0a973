//! Rewinding a stateful sequence: the recurrent state after each row of a verify step.
//!
//! A hybrid decoder's sequence holds its recurrent state (conv and delta-rule states) for the
//! position after its last token only. A verify step ([`Executor::step_sequence_rows`]) of such a
//! program keeps the state after each of its rows, as the recurrent ops compute them — no row is
//! recomputed. Truncating the sequence to a position inside the block (the pending token and the
//! drafts kept) or forking it there puts that row's state back; any other rewind is refused
//! ([`ExecError::RecurrentState`]). The rows are kept until the sequence's next step.

use super::error::ExecError;
use super::plan::StateSlot;
use super::Executor;
use crate::kvcache::SeqId;

/// The states after each row of the last verify step of `seq` (none kept when `seq` is `None`).
#[derive(Debug, Default)]
pub(super) struct RowStates {
    seq: Option<SeqId>,
    /// Tokens the sequence held before the block.
    base: usize,
    rows: usize,
    /// Floats of one sequence's state.
    width: usize,
    /// `rows × width`: the state after row `r` at `r × width`.
    floats: Vec<f32>,
}

impl RowStates {
    /// Starts keeping the states of a block of `rows` tokens of `seq` after its first `base`.
    pub(super) fn start(&mut self, seq: SeqId, base: usize, rows: usize, width: usize) {
        *self = RowStates { seq: Some(seq), base, rows, width, floats: std::mem::take(&mut self.floats) };
        self.floats.resize(rows * width, 0.0);
    }

    /// Forgets the rows kept (before any step, and when the state they rewind is gone).
    pub(super) fn clear(&mut self) {
        self.seq = None;
    }

    /// Forgets the rows kept if they are `seq`'s.
    pub(super) fn clear_for(&mut self, seq: SeqId) {
        if self.seq == Some(seq) {
            self.seq = None;
        }
    }

    /// Whether the step keeps its rows' states.
    pub(super) fn recording(&self) -> bool {
        self.seq.is_some()
    }

    /// Slot `slot` of the state after row `row`, to write while the step runs; `None` when the
    /// step keeps no rows.
    pub(super) fn slot_mut(&mut self, row: usize, slot: StateSlot) -> Option<&mut [f32]> {
        self.seq?;
        Some(&mut self.floats[row * self.width + slot.offset..][..slot.len])
    }

    /// The state of `seq` holding its first `tokens` tokens, when a kept row is that state.
    fn state_at(&self, seq: SeqId, tokens: usize) -> Option<&[f32]> {
        let row = tokens.checked_sub(self.base + 1).filter(|&r| r < self.rows && self.seq == Some(seq))?;
        Some(&self.floats[row * self.width..][..self.width])
    }
}

impl Executor<'_> {
    /// The recurrent state `seq` holds (empty for a program without recurrent layers).
    pub fn sequence_state(&self, seq: SeqId) -> Option<&[f32]> {
        self.states.iter().find(|(s, _)| *s == seq).map(|(_, st)| st.as_slice())
    }

    /// Puts back the state of `seq` after its first `tokens` tokens, from the rows of its last
    /// verify step; refuses (`action` names what was asked) when no kept row is that state.
    pub(super) fn rewind_state(&mut self, seq: SeqId, tokens: usize, action: &'static str) -> Result<(), ExecError> {
        let Some(kept) = self.row_states.state_at(seq, tokens) else {
            return Err(ExecError::RecurrentState { seq, action });
        };
        let (_, state) = self.states.iter_mut().find(|(s, _)| *s == seq).expect("every live sequence has a state");
        state.copy_from_slice(kept);
        self.row_states.clear();
        Ok(())
    }

    /// The state a fork of `parent`'s first `tokens` tokens starts from: the parent's own when
    /// `tokens` is all it holds, else a kept row's.
    pub(super) fn state_for_fork(&self, parent: SeqId, tokens: usize, held: usize) -> Result<Vec<f32>, ExecError> {
        let own = self.sequence_state(parent).unwrap_or_default();
        if tokens == held || !self.has_recurrent_state() {
            return Ok(own.to_vec());
        }
        match self.row_states.state_at(parent, tokens) {
            Some(kept) => Ok(kept.to_vec()),
            None => Err(ExecError::RecurrentState { seq: parent, action: "forking a prefix" }),
        }
    }
}

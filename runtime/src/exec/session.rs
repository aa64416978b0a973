//! The sequence API: the sequences of the executor's KV pool (the default one, new ones, forks
//! sharing a prefix's pages) and [`Executor::step`], which runs tokens of one sequence and
//! returns the logits of the last.
//!
//! A program with recurrent layers (CausalConvWithState, LinearAttention) keeps each sequence's
//! state beside its KV pages: allocated zeroed with the sequence (and by `reset`), updated in
//! place by every step, copied by a fork, released with it. The state holds the position after
//! the sequence's last token only; a verify step keeps the state after each of its rows, so
//! truncating to (or forking at) a position inside the last verify block puts that row's state
//! back — speculative decoding's rollback — and any other rewind is refused
//! ([`ExecError::RecurrentState`]; see `rollback`).

use super::error::ExecError;
use super::plan::{Loc, Op};
use super::program::StepDims;
use super::run::numel;
use super::Executor;
use crate::kvcache::{KvError, SeqId};

impl Executor<'_> {
    /// Tokens the default sequence holds.
    pub fn position(&self) -> usize {
        self.held_by(self.seq).unwrap_or(0)
    }

    /// Tokens `seq` holds.
    pub fn sequence_position(&self, seq: SeqId) -> Result<usize, ExecError> {
        self.held_by(seq).ok_or(ExecError::Kv(KvError::UnknownSequence { seq }))
    }

    fn held_by(&self, seq: SeqId) -> Option<usize> {
        self.held.iter().find(|(s, _)| *s == seq).map(|&(_, n)| n)
    }

    /// The sequence [`Executor::step`] runs.
    pub fn default_sequence(&self) -> SeqId {
        self.seq
    }

    /// A new empty sequence in the same KV pool.
    pub fn new_sequence(&mut self) -> SeqId {
        let seq = self.cache.create_sequence();
        self.held.push((seq, 0));
        self.states.push((seq, vec![0.0; self.plan.state_floats]));
        seq
    }

    /// A new sequence holding the first `tokens` tokens of `parent` by sharing its pages (no
    /// copy; a page written later while still shared is copied then, see [`KvCache`](crate::kvcache::KvCache)).
    pub fn fork_sequence(&mut self, parent: SeqId, tokens: usize) -> Result<SeqId, ExecError> {
        let held = self.sequence_position(parent)?;
        if tokens > held {
            return Err(ExecError::Kv(KvError::PrefixBeyondHeld {
                seq: parent,
                layer: 0,
                rows: tokens,
                held_rows: held,
            }));
        }
        let state = self.state_for_fork(parent, tokens, held)?;
        let seq = self.cache.fork_prefix(parent, tokens)?;
        self.held.push((seq, tokens));
        self.states.push((seq, state));
        Ok(seq)
    }

    /// Keeps the first `tokens` tokens of `seq` and forgets the rest: the cache truncates the
    /// sequence's page tables (no copy) and the next step runs at position `tokens`. Rejected
    /// speculative tokens leave this way. A sequence with recurrent state can only be truncated
    /// inside its last verify block (see `rollback`).
    pub fn truncate_sequence(&mut self, seq: SeqId, tokens: usize) -> Result<(), ExecError> {
        let held = self.sequence_position(seq)?;
        if tokens > held {
            return Err(ExecError::Kv(KvError::TruncateBeyondHeld { seq, layer: 0, rows: tokens, held_rows: held }));
        }
        if tokens != held && self.has_recurrent_state() {
            self.rewind_state(seq, tokens, "truncating")?;
        }
        self.cache.truncate(seq, tokens)?;
        if let Some(entry) = self.held.iter_mut().find(|(s, _)| *s == seq) {
            entry.1 = tokens;
        }
        Ok(())
    }

    /// Drops a sequence other than the default one, returning the pages only it held.
    pub fn drop_sequence(&mut self, seq: SeqId) -> Result<(), ExecError> {
        if seq == self.seq {
            return self.reset();
        }
        self.cache.drop_sequence(seq)?;
        self.held.retain(|(s, _)| *s != seq);
        self.states.retain(|(s, _)| *s != seq);
        self.row_states.clear_for(seq);
        Ok(())
    }

    /// Forgets the sequence: the cache is emptied and the next step is at position 0. Also the
    /// way to go on after a step that failed.
    pub fn reset(&mut self) -> Result<(), ExecError> {
        self.cache.drop_sequence(self.seq)?;
        self.held.retain(|(s, _)| *s != self.seq);
        self.states.retain(|(s, _)| *s != self.seq);
        self.row_states.clear_for(self.seq);
        self.seq = self.cache.create_sequence();
        self.held.push((self.seq, 0));
        self.states.push((self.seq, vec![0.0; self.plan.state_floats]));
        Ok(())
    }

    /// Whether the program keeps recurrent state per sequence (a hybrid decoder): its sequences
    /// hold the state after their last token only, so they can be truncated or forked at an
    /// earlier position only inside their last verify block.
    pub fn has_recurrent_state(&self) -> bool {
        self.plan.state_floats > 0
    }

    /// Bytes of recurrent state one sequence holds (0 for a pure decoder).
    pub fn state_bytes_per_sequence(&self) -> usize {
        4 * self.plan.state_floats
    }

    /// Bytes of recurrent state the live sequences hold.
    pub fn state_bytes_held(&self) -> usize {
        self.states.len() * self.state_bytes_per_sequence()
    }

    /// Runs `tokens` at the next positions and returns the logits of the last one. A failed step
    /// may leave part of the cache written: [`Executor::reset`] before going on.
    pub fn step(&mut self, tokens: &[u32]) -> Result<&[f32], ExecError> {
        self.step_sequence(self.seq, tokens)
    }

    /// [`Executor::step`] for sequence `seq`. A failed step may leave part of that sequence's
    /// cache written (drop it, or reset the default one); other sequences are untouched.
    /// Tokens beyond [`ExecOptions::prefill_chunk`] run as several steps of that many rows
    /// (not when the step's hidden states are read or given: those are per row of one step).
    pub fn step_sequence(&mut self, seq: SeqId, tokens: &[u32]) -> Result<&[f32], ExecError> {
        let chunk = self.prefill_chunk;
        let chunked = chunk > 0 && !self.hidden_output && self.plan.hidden_in.is_none();
        let (head, last) = match chunked && tokens.len() > chunk {
            true => tokens.split_at((tokens.len() - 1) / chunk * chunk),
            false => (&tokens[..0], tokens),
        };
        for rows in head.chunks(chunk.max(1)) {
            self.run_step(seq, rows)?;
        }
        self.run_step(seq, last)?;
        Ok(self.logits(false))
    }

    /// Runs `tokens` of `seq` and returns the logits of every one of them, `[tokens, vocab]`
    /// (row `i` scores the token after `tokens[..=i]`): the verify step of speculative decoding.
    /// The rows equal what single steps give, the lm_head computing each.
    pub fn step_sequence_rows(&mut self, seq: SeqId, tokens: &[u32]) -> Result<&[f32], ExecError> {
        self.every_row_logits = true;
        let ran = self.run_step(seq, tokens);
        self.every_row_logits = false;
        ran?;
        Ok(self.logits(true))
    }

    fn run_step(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(), ExecError> {
        let held_index =
            self.held.iter().position(|(s, _)| *s == seq).ok_or(ExecError::Kv(KvError::UnknownSequence { seq }))?;
        let position = self.held[held_index].1;
        if tokens.is_empty() {
            return Err(ExecError::EmptyStep);
        }
        if position + tokens.len() > self.max_context {
            return Err(ExecError::ContextFull { tokens: tokens.len(), position, max_context: self.max_context });
        }
        self.bind_hidden_input(tokens.len())?;
        let dims = StepDims { seq: tokens.len(), past: position };
        self.row_states.clear();
        if self.every_row_logits && self.has_recurrent_state() {
            self.row_states.start(seq, position, tokens.len(), self.plan.state_floats);
        }
        self.current = seq;
        self.ids.clear();
        self.ids.extend(tokens.iter().map(|&t| i64::from(t)));
        self.positions.clear();
        self.positions.extend((position..position + tokens.len()).map(|p| p as i64));
        self.prepare(dims);
        self.start_chains(tokens.len());
        for i in 0..self.plan.ops.len() {
            let chained = self.chained(i);
            if self.skips_op(i) || chained.is_some_and(|(_, last)| !last) {
                continue;
            }
            let started = self.profile.is_some().then(std::time::Instant::now);
            let ran = match chained {
                Some((id, _)) => self.run_chain(id),
                None => self.run_op(i),
            };
            if let Err(e) = ran {
                self.row_states.clear();
                return Err(e);
            }
            if let (Some(p), Some(t)) = (self.profile.as_mut(), started) {
                p.op(i, tokens.len(), t.elapsed());
            }
        }
        if let Some(p) = self.profile.as_mut() {
            p.step(tokens.len());
        }
        self.held[held_index].1 += tokens.len();
        Ok(())
    }

    /// The step's logits: the last row's, or every row's (when the step computed them all).
    pub(super) fn logits(&self, every_row: bool) -> &[f32] {
        let logits = self.plan.logits;
        let width = self.vocab();
        let Loc::Buf(b) = self.plan.locs[logits] else { unreachable!("the logits are computed into a buffer") };
        let rows_held = if self.last_row_only(logits) && !every_row { 1 } else { numel(&self.shapes[logits]) / width };
        match every_row {
            true => &self.bufs[b][..rows_held * width],
            false => &self.bufs[b][(rows_held - 1) * width..rows_held * width],
        }
    }

    fn last_row_only(&self, v: usize) -> bool {
        self.plan.ops.iter().any(|(_, op)| {
            matches!(op, Op::MatMul { out, last_row_only: true, .. } | Op::WGemm { out, last_row_only: true, .. } if *out == v)
        })
    }
}

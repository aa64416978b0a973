//! The generation loops: one sequence ([`Executor::generate`]) or several prompts as interleaved
//! sequences of one KV pool ([`Executor::generate_many`]), with their timings.

use std::time::Instant;

use super::error::ExecError;
use super::Executor;
use crate::kvcache::SeqId;
use crate::sample::Sampler;

/// Timings of one [`Executor::generate_greedy`] call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    /// Tokens generated (the stop token included when one ended generation).
    pub generated_tokens: usize,
    /// Prefill and the first token's logits.
    pub prefill_ms: f64,
    /// Every decode step after the first generated token.
    pub decode_ms: f64,
}

impl GenerateStats {
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_ms)
    }

    /// Decode steps (generated tokens after the first) per second.
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_ms)
    }
}

fn rate(tokens: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        tokens as f64 * 1000.0 / ms
    } else {
        0.0
    }
}

/// One sequence of [`Executor::generate_many`].
#[derive(Debug, Default)]
pub struct SequenceOutput {
    /// Tokens generated (the stop token included when one ended generation).
    pub tokens: Vec<u32>,
    /// `prefill_ms` is this sequence's prefill; `decode_ms` the sum of its own decode steps.
    pub stats: GenerateStats,
    /// Prompt tokens whose KV pages were shared with an earlier sequence instead of computed.
    pub shared_prefix_tokens: usize,
    /// Why the sequence stopped early, if it did.
    pub error: Option<ExecError>,
}

/// The index of the largest logit (the first of equal ones; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

impl Executor<'_> {
    /// Greedy decoding: [`Executor::generate`] with a greedy [`Sampler`].
    pub fn generate_greedy(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
        on_token: impl FnMut(u32),
    ) -> Result<(Vec<u32>, GenerateStats), ExecError> {
        self.generate(prompt, max_new, stop, &mut Sampler::greedy(), on_token)
    }

    /// Prefills `prompt` on the default sequence, then appends the token `sampler` chooses until
    /// one of `stop` is generated (it is included) or `max_new` tokens are. `on_token` sees each
    /// token as it is chosen. Starts from the current position (call [`Executor::reset`] for a
    /// new sequence).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
        sampler: &mut Sampler,
        mut on_token: impl FnMut(u32),
    ) -> Result<(Vec<u32>, GenerateStats), ExecError> {
        let mut stats = GenerateStats { prompt_tokens: prompt.len(), ..GenerateStats::default() };
        let mut generated = Vec::with_capacity(max_new);
        if max_new == 0 {
            return Ok((generated, stats));
        }
        let start = Instant::now();
        let mut next = sampler.sample(self.step(prompt)?);
        stats.prefill_ms = start.elapsed().as_secs_f64() * 1000.0;
        let decode_start = Instant::now();
        loop {
            generated.push(next);
            on_token(next);
            if generated.len() >= max_new || stop.contains(&next) {
                break;
            }
            next = sampler.sample(self.step(&[next])?);
        }
        stats.decode_ms = decode_start.elapsed().as_secs_f64() * 1000.0;
        stats.generated_tokens = generated.len();
        Ok((generated, stats))
    }

    /// Generates for several prompts as concurrent sequences of one KV pool: every prompt is
    /// prefilled in turn, then the live sequences take one decode step each, round after round,
    /// until each has met a stop token or `max_new` tokens. Prompt `i` samples with
    /// `samplers[i]`, and `on_token(i, token)` sees its tokens as they are chosen.
    ///
    /// A prompt that begins like an earlier one shares that one's pages for the whole pages of
    /// the common prefix (leaving at least its last token to run), so its prefill runs only the
    /// rest and no page is copied: the earlier prompt's prefill stops at that point to fork it
    /// (`share_plan`), so a hybrid decoder's fork copies the recurrent state there, its only
    /// copy. A sequence whose step fails (an exhausted pool, a full
    /// context) ends with that error and its pages are released; the others go on. Sequences
    /// are dropped at the end; the default sequence is not touched.
    pub fn generate_many(
        &mut self,
        prompts: &[Vec<u32>],
        max_new: usize,
        stop: &[u32],
        samplers: &mut [Sampler],
        mut on_token: impl FnMut(usize, u32),
    ) -> Vec<SequenceOutput> {
        assert_eq!(prompts.len(), samplers.len(), "one sampler per prompt");
        let page_rows = self.cache.config().page_rows;
        let mut outs: Vec<SequenceOutput> = prompts
            .iter()
            .map(|p| SequenceOutput {
                stats: GenerateStats { prompt_tokens: p.len(), ..GenerateStats::default() },
                ..SequenceOutput::default()
            })
            .collect();
        let mut seqs: Vec<Option<SeqId>> = vec![None; prompts.len()];
        let mut next = vec![0u32; prompts.len()];
        if max_new == 0 {
            return outs;
        }
        let plan = share_plan(prompts, page_rows);
        let mut forks: Vec<Option<SeqId>> = vec![None; prompts.len()];
        for (i, prompt) in prompts.iter().enumerate() {
            let start = Instant::now();
            let result = self.prefill_sharing((i, prompt), &plan, &mut forks, &mut seqs[i], &mut samplers[i]);
            outs[i].stats.prefill_ms = start.elapsed().as_secs_f64() * 1000.0;
            match result {
                Ok((shared, token)) => (outs[i].shared_prefix_tokens, next[i]) = (shared, token),
                Err(e) => self.end_with_error(&mut seqs[i], &mut outs[i], e),
            }
        }
        while seqs.iter().any(Option::is_some) {
            for i in 0..prompts.len() {
                let Some(seq) = seqs[i] else { continue };
                let token = next[i];
                outs[i].tokens.push(token);
                on_token(i, token);
                if outs[i].tokens.len() >= max_new || stop.contains(&token) {
                    outs[i].stats.generated_tokens = outs[i].tokens.len();
                    let _ = self.drop_sequence(seq);
                    seqs[i] = None;
                    continue;
                }
                let start = Instant::now();
                let result = self.step_sequence(seq, &[token]).map(|logits| samplers[i].sample(logits));
                outs[i].stats.decode_ms += start.elapsed().as_secs_f64() * 1000.0;
                match result {
                    Ok(t) => next[i] = t,
                    Err(e) => self.end_with_error(&mut seqs[i], &mut outs[i], e),
                }
            }
        }
        outs
    }

    /// Prefills prompt `i` on its sequence (put in `seq`): the fork `forks[i]` an earlier
    /// prompt's prefill made for it, else a new one. On the way it forks the later prompts that
    /// `plan` says share its prefix, at their fork points, so each fork copies the sequence's
    /// recurrent state at that point (if any) and shares its pages. Returns the tokens shared and
    /// the first token sampled.
    fn prefill_sharing(
        &mut self,
        (i, prompt): (usize, &[u32]),
        plan: &[Option<(usize, usize)>],
        forks: &mut [Option<SeqId>],
        seq: &mut Option<SeqId>,
        sampler: &mut Sampler,
    ) -> Result<(usize, u32), ExecError> {
        let (own, shared) = match forks[i].take() {
            Some(fork) => (fork, plan[i].map_or(0, |(_, rows)| rows)),
            None => (self.new_sequence(), 0),
        };
        *seq = Some(own);
        let mut points: Vec<(usize, usize)> =
            (i + 1..plan.len()).filter_map(|c| plan[c].filter(|&(j, _)| j == i).map(|(_, rows)| (rows, c))).collect();
        points.sort_unstable();
        let mut at = shared;
        for (rows, child) in points {
            if rows > at {
                self.step_sequence(own, &prompt[at..rows])?;
                at = rows;
            }
            forks[child] = Some(self.fork_sequence(own, rows)?);
        }
        let logits = self.step_sequence(own, &prompt[at..])?;
        Ok((shared, sampler.sample(logits)))
    }

    fn end_with_error(&mut self, seq: &mut Option<SeqId>, out: &mut SequenceOutput, error: ExecError) {
        if let Some(s) = seq.take() {
            let _ = self.drop_sequence(s);
        }
        out.stats.generated_tokens = out.tokens.len();
        out.error = Some(error);
    }
}

/// For each prompt, the earlier prompt whose prefill forks a sequence for it and the tokens that
/// fork holds: the longest common prefix in whole pages, leaving the prompt's last token to run,
/// and beyond what that earlier prompt itself shared, so that its prefill passes the fork point
/// (an earlier sharer of the same pages holds them too and is chosen instead).
fn share_plan(prompts: &[Vec<u32>], page_rows: usize) -> Vec<Option<(usize, usize)>> {
    let mut plan: Vec<Option<(usize, usize)>> = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.iter().enumerate() {
        let best = (0..i)
            .filter_map(|j| {
                let common = prompts[j].iter().zip(prompt).take_while(|(a, b)| a == b).count();
                let rows = common.min(prompt.len().saturating_sub(1)) / page_rows * page_rows;
                let own_shared = plan[j].map_or(0, |(_, r)| r);
                (rows > own_shared).then_some((j, rows))
            })
            .max_by_key(|&(j, rows)| (rows, std::cmp::Reverse(j)));
        plan.push(best);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prompt 1 shares 2 pages of prompt 0; prompt 2 shares 3 pages of prompt 1 (1 beyond the
    /// 2 prompt 1 took from prompt 0, which holds only 2 of them); prompt 3 shares only prompt 0's first 2 pages, which prompt 0
    /// (the earliest holder) forks; prompt 4 shares nothing; a prompt equal to a page keeps its
    /// last token to run.
    #[test]
    fn the_share_plan_forks_where_a_prefill_passes() {
        let page = 4;
        let base: Vec<u32> = (0..20).collect();
        let with = |n: usize, tail: u32| [&base[..n], &[100 + tail, 200][..]].concat();
        let one = [&base[..9], &[101, 200, 300, 301, 302, 303][..]].concat();
        let two = [&one[..], &[400][..]].concat();
        let prompts = [with(20, 0), one, two, with(8, 3), vec![7, 7, 7, 7, 7], base[..4].to_vec()];
        let plan = share_plan(&prompts, page);
        assert_eq!(plan, [None, Some((0, 8)), Some((1, 12)), Some((0, 8)), None, None]);
    }

    #[test]
    fn argmax_takes_the_first_of_equal_logits() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
    }
}

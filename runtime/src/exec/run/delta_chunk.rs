//! The delta rule over a chunk of tokens at once: a prefill's LinearAttention without a pass over
//! the state per token.
//!
//! Token by token, state head `S` (`dk × dv`) is decayed by `e^{g_t}`, corrected by
//! `u_t = β_t (v_t − (e^{g_t} S)ᵀ k_t)` and updated `S ← e^{g_t} S + k_t u_tᵀ`; output `t` is
//! `scale · S_tᵀ q_t`. With `G_t` the decay summed over the chunk up to `t` and `S₀` the state
//! before it, unrolling gives
//!
//! - `u_t = β_t (v_t − e^{G_t} S₀ᵀ k_t − Σ_{s<t} e^{G_t−G_s} (k_s·k_t) u_s)`: a triangular system,
//!   solved by forward substitution;
//! - `o_t = scale · (e^{G_t} S₀ᵀ q_t + Σ_{s≤t} e^{G_t−G_s} (k_s·q_t) u_s)`;
//! - `S_C = e^{G_C} S₀ + Σ_s e^{G_C−G_s} k_s u_sᵀ`, one pass over the state per chunk.
//!
//! Without β the update is the plain outer product (`u_t = v_t`); without decay `G = 0`. Every
//! `G_t − G_s` with `s ≤ t` is a sum of log decays, ≤ 0 for a decaying gate, so no exponential
//! grows. The sums run in another order than the recurrence's, so results agree with it to
//! rounding (`tests` below: 2e-6 of the largest output over 3 chunk sizes). Decay per key
//! dimension stays token by token.

/// One state head's tokens of one chunk, gathered contiguous, and the solve's scratch.
#[derive(Debug, Default)]
pub(crate) struct DeltaChunk {
    rows: usize,
    dk: usize,
    dv: usize,
    /// `rows × dk` keys.
    pub k: Vec<f32>,
    /// `rows × dv`: the values, then (after [`DeltaChunk::solve`]) the corrections `u`.
    pub u: Vec<f32>,
    /// The log decay of each token, then (after `solve`) summed over the chunk; 0 without decay.
    pub g: Vec<f32>,
    /// The betas; `None` for the plain outer-product update.
    pub beta: Option<Vec<f32>>,
    /// `dv` scratch: `S₀ᵀ x` for one row.
    proj: Vec<f32>,
}

impl DeltaChunk {
    /// Sizes the chunk for `rows` tokens (contents left to the caller to fill).
    pub fn start(&mut self, rows: usize, (dk, dv): (usize, usize), with_beta: bool) {
        (self.rows, self.dk, self.dv) = (rows, dk, dv);
        self.k.resize(rows * dk, 0.0);
        self.u.resize(rows * dv, 0.0);
        self.g.clear();
        self.g.resize(rows, 0.0);
        match (with_beta, &mut self.beta) {
            (true, Some(b)) => b.resize(rows, 0.0),
            (true, None) => self.beta = Some(vec![0.0; rows]),
            (false, _) => self.beta = None,
        }
        self.proj.resize(dv, 0.0);
    }

    /// Turns the values into the corrections `u`, from the state `s0` before the chunk.
    pub fn solve(&mut self, s0: &[f32]) {
        let (dk, dv) = (self.dk, self.dv);
        for t in 1..self.rows {
            self.g[t] += self.g[t - 1];
        }
        let Some(beta) = &self.beta else { return };
        for (t, &rate) in beta.iter().enumerate().take(self.rows) {
            let (done, rest) = self.u.split_at_mut(t * dv);
            let ut = &mut rest[..dv];
            let kt = &self.k[t * dk..][..dk];
            project(s0, kt, dv, &mut self.proj);
            let decay = self.g[t].exp();
            ut.iter_mut().zip(&self.proj).for_each(|(u, p)| *u -= decay * p);
            for s in 0..t {
                let w = (self.g[t] - self.g[s]).exp() * dot(kt, &self.k[s * dk..][..dk]);
                ut.iter_mut().zip(&done[s * dv..][..dv]).for_each(|(u, &us)| *u -= w * us);
            }
            ut.iter_mut().for_each(|u| *u *= rate);
        }
    }

    /// Output row `t` for query `q` (`dk`) into `out` (`dv`), from the state `s0` before the
    /// chunk (after [`DeltaChunk::solve`]).
    pub fn output(&mut self, s0: &[f32], t: usize, q: &[f32], scale: f32, out: &mut [f32]) {
        let (dk, dv) = (self.dk, self.dv);
        project(s0, q, dv, &mut self.proj);
        let decay = self.g[t].exp();
        out.iter_mut().zip(&self.proj).for_each(|(o, p)| *o = decay * p);
        for s in 0..=t {
            let w = (self.g[t] - self.g[s]).exp() * dot(q, &self.k[s * dk..][..dk]);
            out.iter_mut().zip(&self.u[s * dv..][..dv]).for_each(|(o, &us)| *o += w * us);
        }
        out.iter_mut().for_each(|o| *o *= scale);
    }

    /// The state after the chunk, in place of the state `s` before it.
    pub fn update_state(&self, s: &mut [f32]) {
        let (dk, dv) = (self.dk, self.dv);
        let last = self.g[self.rows - 1];
        let end_decay = last.exp();
        s.iter_mut().for_each(|e| *e *= end_decay);
        for t in 0..self.rows {
            let w = (last - self.g[t]).exp();
            let (kt, ut) = (&self.k[t * dk..][..dk], &self.u[t * dv..][..dv]);
            for (i, &ki) in kt.iter().enumerate() {
                let f = w * ki;
                s[i * dv..][..dv].iter_mut().zip(ut).for_each(|(e, &u)| *e += f * u);
            }
        }
    }
}

/// `out = sᵀ x` for a `dk × dv` state `s` and `x` of `dk`.
fn project(s: &[f32], x: &[f32], dv: usize, out: &mut [f32]) {
    out[..dv].fill(0.0);
    for (i, &xi) in x.iter().enumerate() {
        out[..dv].iter_mut().zip(&s[i * dv..][..dv]).for_each(|(o, &e)| *o += xi * e);
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator of values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 23) as f32) - 1.0
            })
            .collect()
    }

    /// The recurrence token by token: outputs `[rows, dv]` and the final state.
    fn recurrence(
        s: &mut [f32],
        (k, v, q): (&[f32], &[f32], &[f32]),
        gates: (&[f32], Option<&[f32]>),
        dk: usize,
    ) -> Vec<f32> {
        let (rows, dv) = (gates.0.len(), v.len() / gates.0.len());
        let mut out = vec![0.0; rows * dv];
        for t in 0..rows {
            let f = gates.0[t].exp();
            s.iter_mut().for_each(|e| *e *= f);
            let (kt, mut u) = (&k[t * dk..][..dk], v[t * dv..][..dv].to_vec());
            if let Some(beta) = gates.1 {
                let mut proj = vec![0.0; dv];
                project(s, kt, dv, &mut proj);
                u.iter_mut().zip(&proj).for_each(|(u, p)| *u = beta[t] * (*u - p));
            }
            for (i, &ki) in kt.iter().enumerate() {
                s[i * dv..][..dv].iter_mut().zip(&u).for_each(|(e, &ui)| *e += ki * ui);
            }
            project(s, &q[t * dk..][..dk], dv, &mut out[t * dv..][..dv]);
        }
        out
    }

    /// The chunked form's outputs and final state over `rows` tokens in chunks of `chunk`.
    fn chunked(
        s0: &[f32],
        (k, v, q): (&[f32], &[f32], &[f32]),
        (g, b): (&[f32], Option<&[f32]>),
        (dk, dv): (usize, usize),
        chunk: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let rows = g.len();
        let (mut state, mut got, mut c) = (s0.to_vec(), vec![0.0; rows * dv], DeltaChunk::default());
        for start in (0..rows).step_by(chunk) {
            let n = chunk.min(rows - start);
            c.start(n, (dk, dv), b.is_some());
            c.k.copy_from_slice(&k[start * dk..][..n * dk]);
            c.u.copy_from_slice(&v[start * dv..][..n * dv]);
            c.g.copy_from_slice(&g[start..start + n]);
            if let (Some(cb), Some(b)) = (&mut c.beta, b) {
                cb.copy_from_slice(&b[start..start + n]);
            }
            c.solve(&state);
            for t in 0..n {
                c.output(&state, t, &q[(start + t) * dk..][..dk], 1.0, &mut got[(start + t) * dv..][..dv]);
            }
            c.update_state(&mut state);
        }
        (got, state)
    }

    /// The largest |a − b| relative to the largest |b|; NaN if a has a NaN.
    fn worst(a: &[f32], b: &[f32]) -> f32 {
        let top = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, |m, d| if d.is_nan() { d } else { m.max(d) }) / top
    }

    /// Chunks of 1, 5 and 16 over 21 tokens give the recurrence's outputs and state, with and
    /// without beta and decay.
    #[test]
    fn chunks_give_the_recurrence() {
        let (rows, dk, dv) = (21, 8, 6);
        let (k, v, q) = (values(rows * dk, 1), values(rows * dv, 2), values(rows * dk, 3));
        let decay: Vec<f32> = values(rows, 4).iter().map(|x| -0.3 * (x + 1.0)).collect();
        let beta: Vec<f32> = values(rows, 5).iter().map(|x| 0.5 * (x + 1.0)).collect();
        let s0 = values(dk * dv, 6);
        for (g, b) in [(&decay[..], Some(&beta[..])), (&vec![0.0; rows][..], Some(&beta[..])), (&decay[..], None)] {
            let mut want_state = s0.clone();
            let want = recurrence(&mut want_state, (&k, &v, &q), (g, b), dk);
            for chunk in [1, 5, 16] {
                let (got, state) = chunked(&s0, (&k, &v, &q), (g, b), (dk, dv), chunk);
                assert!(worst(&got, &want) < 2e-6, "chunk {chunk}: outputs off by {}", worst(&got, &want));
                assert!(
                    worst(&state, &want_state) < 2e-6,
                    "chunk {chunk}: state off by {}",
                    worst(&state, &want_state)
                );
            }
        }
    }

    /// Strong decay over a long chunk (64 tokens of log decay −2 to −6: the summed decay G
    /// reaches about −256): e^G underflows f32 to zero from the 25th token or so, so
    /// e^{G_t}/e^{G_s} would be 0/0. The chunk takes e^{G_t − G_s} instead, and gives the
    /// recurrence's outputs and state.
    #[test]
    fn strong_decay_over_a_long_chunk_gives_the_recurrence() {
        let (rows, dk, dv) = (64, 8, 6);
        let (k, v, q) = (values(rows * dk, 11), values(rows * dv, 12), values(rows * dk, 13));
        let decay: Vec<f32> = values(rows, 14).iter().map(|x| -4.0 + 2.0 * x).collect();
        let beta: Vec<f32> = values(rows, 15).iter().map(|x| 0.5 * (x + 1.0)).collect();
        let summed: Vec<f32> = decay
            .iter()
            .scan(0.0, |g, d| {
                *g += d;
                Some(*g)
            })
            .collect();
        let ratio = summed[rows - 1].exp() / summed[rows - 2].exp();
        assert!(ratio.is_nan(), "e^G_t / e^G_s of this chunk is {ratio}, not 0/0: the decay is not strong enough");
        let s0 = values(dk * dv, 16);
        let mut want_state = s0.clone();
        let want = recurrence(&mut want_state, (&k, &v, &q), (&decay, Some(&beta)), dk);
        let (got, state) = chunked(&s0, (&k, &v, &q), (&decay, Some(&beta)), (dk, dv), 64);
        assert!(worst(&got, &want) < 2e-6, "outputs off by {}", worst(&got, &want));
        assert!(worst(&state, &want_state) < 2e-6, "state off by {}", worst(&state, &want_state));
    }
}

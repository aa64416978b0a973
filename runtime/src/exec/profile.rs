//! Where a step's time goes: each op's wall time, summed by op kind (its plan op's name: `MatMul`,
//! `QGemm`, `Attend`, ...), apart for steps of several rows (a prompt's prefill, a verify step)
//! and of one row (decode). Two clock reads an op while it is on ([`super::Executor::start_profile`]),
//! nothing when it is off.

use std::collections::BTreeMap;
use std::time::Duration;

/// Steps of several rows, then of one.
const PHASES: [&str; 2] = ["prefill", "decode"];

/// What a profile records as the steps run.
#[derive(Debug)]
pub(super) struct Recorder {
    /// Each plan op's kind.
    kinds: Vec<String>,
    /// Per phase, per plan op: calls and time.
    ops: [Vec<(u64, Duration)>; 2],
    /// Per phase: steps and rows.
    steps: [(u64, u64); 2],
}

impl Recorder {
    pub(super) fn new(kinds: Vec<String>) -> Recorder {
        let ops = [vec![(0, Duration::ZERO); kinds.len()], vec![(0, Duration::ZERO); kinds.len()]];
        Recorder { kinds, ops, steps: [(0, 0); 2] }
    }

    fn phase(rows: usize) -> usize {
        usize::from(rows == 1)
    }

    pub(super) fn op(&mut self, index: usize, rows: usize, took: Duration) {
        let slot = &mut self.ops[Self::phase(rows)][index];
        slot.0 += 1;
        slot.1 += took;
    }

    pub(super) fn step(&mut self, rows: usize) {
        let s = &mut self.steps[Self::phase(rows)];
        s.0 += 1;
        s.1 += rows as u64;
    }

    pub(super) fn finish(self) -> OpProfile {
        let phases = [0, 1].map(|p| {
            let mut by_kind: BTreeMap<&str, (u64, Duration)> = BTreeMap::new();
            for (kind, &(calls, took)) in self.kinds.iter().zip(&self.ops[p]) {
                let e = by_kind.entry(kind).or_default();
                e.0 += calls;
                e.1 += took;
            }
            let mut ops: Vec<OpTime> = by_kind
                .into_iter()
                .filter(|(_, (calls, _))| *calls > 0)
                .map(|(kind, (calls, took))| OpTime { kind: kind.to_string(), calls, seconds: took.as_secs_f64() })
                .collect();
            ops.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(a.kind.cmp(&b.kind)));
            let (steps, rows) = self.steps[p];
            PhaseProfile { phase: PHASES[p], steps, rows, ops }
        });
        OpProfile { phases }
    }
}

/// One op kind's share of a phase: its calls and their time.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    pub kind: String,
    pub calls: u64,
    pub seconds: f64,
}

/// A phase's steps, their rows, and its op kinds, the longest first.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseProfile {
    pub phase: &'static str,
    pub steps: u64,
    pub rows: u64,
    pub ops: Vec<OpTime>,
}

impl PhaseProfile {
    /// The time of every op of the phase.
    pub fn seconds(&self) -> f64 {
        self.ops.iter().map(|o| o.seconds).sum()
    }
}

/// The time of the steps since [`super::Executor::start_profile`], by phase and op kind.
#[derive(Clone, Debug, PartialEq)]
pub struct OpProfile {
    /// Prefill (steps of several rows), then decode.
    pub phases: [PhaseProfile; 2],
}

/// An op's kind: its name in the plan (`Op`'s variant), from its debug form.
pub(super) fn kind_of(op: &impl std::fmt::Debug) -> String {
    format!("{op:?}").chars().take_while(|c| c.is_ascii_alphanumeric()).collect()
}

//! The host executor: runs a bundle's program (`npuc-program/1`) one step at a time over a
//! paged KV cache.
//!
//! [`Executor::new`] decodes the program and builds its plan (see `plan.rs`): every value gets a
//! place — a buffer, a weight read in place from the bundle's map, a constant, the step's token
//! ids or positions, a small integer buffer, or the KV cache — and every node that computes
//! something becomes one op. Ops the executor does not run are refused at load, naming the op and
//! the node. Reshape, Unsqueeze, Squeeze, Flatten and Identity are aliases (no copy); a 2-D weight
//! transposed only to feed MatMuls (a tied lm_head reading the embedding table) is read in place
//! in the `[N, K]` layout. Buffers are shared by values whose lifetimes do not overlap and grow to
//! the largest step seen; decoding one token after another allocates nothing.
//!
//! Quantised programs (form 2): `npuc::WGemm` (MatMulNBits semantics) runs the kernels' WGemm.
//! The compiler stores its weights packed ([`packed`]); the executor reads them in place from the
//! map — no copy, nothing packed at load. A WGemm whose weights the bundle holds only in the
//! MatMulNBits layout (bundles written before packing) is packed with `pack_wgemm` at load, a
//! copy [`Executor::wgemm_bytes_packed_at_load`] reports. The precision is
//! [`WGemmPrecision::Exact`] unless [`Executor::set_wgemm_precision`] says otherwise.
//! `com.microsoft::GatherBlockQuantized` (rows along axis 0, quantised along the last axis) reads
//! its table in place: with `embed_nbits` in the MatMulNBits layout, or, for a table tied to a
//! packed lm_head (SmolLM2's 8-bit storage), with `embed_packed` from the packed form, so the table
//! is held once.
//!
//! A8W8 programs (QDQ form 3): `QuantizeLinear` of activations (per-tensor scale and zero point)
//! writes u8 or i8 codes into code buffers, `npuc::QGemm` multiplies them by weights the compiler
//! packed ([`packed`]; read in place, with per-tensor or per-column weight scales; the output
//! requantised or f32 — weights the bundle holds as `[K, N]` codes, or codes the program computes,
//! are packed at load, a copy [`Executor::qgemm_bytes_packed_at_load`] reports), and `DequantizeLinear` brings codes back to f32 — each exactly as the reference
//! evaluator computes it. A `QuantizeLinear` of a weight (a tied lm_head quantised by the
//! program) is folded at load.
//!
//! Several sequences share the cache's pool ([`Executor::new_sequence`],
//! [`Executor::fork_sequence`], [`Executor::step_sequence`]); [`Executor::generate_many`] runs
//! several prompts as interleaved sequences, sharing the pages of common prefixes. Tokens are
//! chosen by a [`Sampler`] (greedy by default).
//!
//! Shape and position arithmetic left in the program (Shape, integer Gather, Add, Sub, Mul,
//! Range, Concat of i64 tensors) is evaluated exactly at every step into small i64 buffers, from
//! the step's concrete shapes; f32 Slice and Concat copy. The GroupQueryAttention lowering's
//! positions (`Range(past, past + seq)` gathering the cos/sin caches) therefore come from the
//! program's own ops, with `past` the cache's length.
//!
//! Attention nodes are bound to the cache: the step's K and V are appended to the node's layer
//! (Attention nodes are layers in program order), its queries attend over the pages, and the
//! node's past inputs, present outputs and attention mask are never tensors (a Shape of a past
//! input reads its shape only). Positions (`position_ids`) are the cache's length onwards.
//! Symbolic sizes are `batch_size = 1`, `sequence_length = S` (the step's tokens),
//! `past_sequence_length = P` (the tokens held).
//!
//! [`Executor::step`] runs S tokens (a prefill block, or one token when decoding) and returns
//! the logits of the last position; when the logits come from a MatMul or a WGemm, only that row
//! is computed.

mod error;
pub mod packed;
mod plan;
mod program;

use std::time::Instant;

pub use crate::kernels::layout::MAX_TRANSPOSE_RANK;
pub use error::ExecError;
pub use program::PROGRAM_FORMAT;

use crate::bundle::Bundle;
use crate::kernels::qgemm::{self, AScale, QActivations, QGemmScratch, QGemmWeights, QOutput};
use crate::kernels::swiglu::GateActivation;
use crate::kernels::wgemm::{self, WGemmPrecision, WGemmScratch};
use crate::kernels::{embed, gemm, layout, norm, quantize, rope, swiglu, Isa, ThreadPool};
use crate::kernels::{split_range, SyncPtr};
use crate::kvcache::{AttendScratch, KvCache, KvCacheConfig, KvError, KvStorage, SeqId};
use crate::sample::Sampler;
use error::node_err;
use plan::{IntKind, Loc, NBitsTable, Op, Plan, WGemmStore};
use program::{Program, StepDims};
use std::sync::Mutex;

/// Context the executor reserves KV pages for unless told otherwise.
pub const DEFAULT_MAX_CONTEXT: usize = 2048;

#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// Threads of the kernels' pool, the caller included.
    pub threads: usize,
    /// Tokens the KV cache holds at most (prompt and generated).
    pub max_context: usize,
    /// The kernels' instruction-set path; the best this CPU has when `None`.
    pub isa: Option<Isa>,
    /// How the KV cache stores K and V rows.
    pub kv_storage: KvStorage,
    /// Sequences of `max_context` tokens the KV pool has pages for.
    pub sequences: usize,
    /// Pages in the KV pool (one page: `page_rows` rows of one layer and KV head), instead of
    /// what `sequences` × `max_context` needs.
    pub kv_pages: Option<usize>,
}

/// A [`View`] of an executor's buffers, borrowing only the fields it reads, so the others
/// (code buffers, scratch, a buffer taken out for writing) stay free to change.
macro_rules! view {
    ($e:expr) => {
        View {
            plan: &$e.plan,
            bufs: &$e.bufs,
            shapes: &$e.shapes,
            ids: &$e.ids,
            positions: &$e.positions,
            ibufs: &$e.ibufs,
        }
    };
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            threads: 1,
            max_context: DEFAULT_MAX_CONTEXT,
            isa: None,
            kv_storage: KvStorage::F32,
            sequences: 1,
            kv_pages: None,
        }
    }
}

/// A loaded program and a KV cache holding its sequences: a default one (used by
/// [`Executor::step`] and [`Executor::generate`]) and any created with
/// [`Executor::new_sequence`] or [`Executor::fork_sequence`].
pub struct Executor<'b> {
    plan: Plan<'b>,
    isa: Isa,
    pool: ThreadPool,
    cache: KvCache,
    /// The default sequence.
    seq: SeqId,
    /// The sequence the current step runs for.
    current: SeqId,
    /// Tokens held by each live sequence.
    held: Vec<(SeqId, usize)>,
    max_context: usize,
    /// Concrete shape of every value for the current step.
    shapes: Vec<Vec<usize>>,
    bufs: Vec<Vec<f32>>,
    /// SkipRmsNorm's residual sum when the program does not keep it.
    sum_scratch: Vec<f32>,
    ids: Vec<i64>,
    positions: Vec<i64>,
    gather_ids: Vec<u32>,
    /// Small integer tensors (shape and position arithmetic).
    ibufs: Vec<Vec<i64>>,
    wgemm_precision: WGemmPrecision,
    wgemm_scratch: WGemmScratch,
    /// Quantised activations (u8 codes, or i8 codes as bytes).
    qbufs: Vec<Vec<u8>>,
    qgemm_scratch: QGemmScratch,
    /// Where QGemm products are computed when not here (see [`GemmOffload`]).
    offload: Option<Box<dyn GemmOffload>>,
    offloaded_calls: u64,
    /// One attention scratch per worker of a prefill block's attention (grown once).
    attend_scratches: Vec<Mutex<AttendScratch>>,
}

/// Int8 GEMMs computed elsewhere: an NPU's array. The executor offers every `QGemm` call with its
/// activation codes `[m, K]` as they are; the offload returns the products P = Σₖ a_s·w_s of the
/// signed activation codes ([`qgemm::signed_codes`]) and the weights' signed codes
/// ([`QGemmWeights::codes_kn`]), or `None` to leave the call on the host (deciding that first, so a
/// call it leaves costs no copy). The host then applies the kernels' own epilogue
/// ([`qgemm::qgemm_from_products`]), so an exact P gives bit-identical outputs.
pub trait GemmOffload: Send {
    fn products(
        &mut self,
        node: &str,
        a: QActivations<'_>,
        m: usize,
        w: QGemmWeights<'_>,
    ) -> Result<Option<Vec<i32>>, String>;
}

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

impl<'b> Executor<'b> {
    /// Loads `bundle`'s program (see the module documentation for what is refused) and creates
    /// a KV cache for `options.max_context` tokens.
    pub fn new(bundle: &'b Bundle, options: ExecOptions) -> Result<Executor<'b>, ExecError> {
        let program = Program::from_json(bundle.program())?;
        let plan = Plan::load(program, |name| bundle.tensor(name))?;
        let a = plan.attention;
        let max_context = options.max_context.max(1);
        let config =
            KvCacheConfig::new(a.layers, a.q_heads, a.kv_heads, a.head_dim, 1).with_storage(options.kv_storage);
        let pages = options.kv_pages.unwrap_or_else(|| {
            options.sequences.max(1) * a.layers * a.kv_heads * max_context.div_ceil(config.page_rows)
        });
        let mut cache = KvCache::new(KvCacheConfig { pages, ..config }.with_reserved_rows(max_context))?;
        let seq = cache.create_sequence();
        let isa = options.isa.unwrap_or_else(Isa::detect);
        Ok(Executor {
            shapes: vec![Vec::new(); plan.program.values.len()],
            bufs: vec![Vec::new(); plan.buffers],
            ibufs: vec![Vec::new(); plan.i64_buffers],
            wgemm_precision: WGemmPrecision::Exact,
            wgemm_scratch: WGemmScratch::default(),
            qbufs: vec![Vec::new(); plan.q_buffers],
            qgemm_scratch: QGemmScratch::default(),
            offload: None,
            offloaded_calls: 0,
            attend_scratches: Vec::new(),
            plan,
            isa: isa.check(),
            pool: ThreadPool::new(options.threads),
            cache,
            seq,
            current: seq,
            held: vec![(seq, 0)],
            max_context,
            sum_scratch: Vec::new(),
            ids: Vec::new(),
            positions: Vec::new(),
            gather_ids: Vec::new(),
        })
    }

    /// How WGemm nodes multiply activations by their codes; [`WGemmPrecision::Exact`] (the
    /// default) agrees with ONNX Runtime's MatMulNBits up to f32 rounding.
    pub fn set_wgemm_precision(&mut self, precision: WGemmPrecision) {
        self.wgemm_precision = precision;
    }

    pub fn wgemm_precision(&self) -> WGemmPrecision {
        self.wgemm_precision
    }

    /// Tokens the default sequence holds.
    pub fn position(&self) -> usize {
        self.held_by(self.seq).unwrap_or(0)
    }

    /// Tokens `seq` holds.
    pub fn sequence_position(&self, seq: SeqId) -> Result<usize, ExecError> {
        self.held_by(seq).ok_or(ExecError::Kv(crate::kvcache::KvError::UnknownSequence { seq }))
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
        seq
    }

    /// A new sequence holding the first `tokens` tokens of `parent` by sharing its pages (no
    /// copy; a page written later while still shared is copied then, see [`KvCache`]).
    pub fn fork_sequence(&mut self, parent: SeqId, tokens: usize) -> Result<SeqId, ExecError> {
        let held = self.sequence_position(parent)?;
        if tokens > held {
            return Err(ExecError::Kv(crate::kvcache::KvError::PrefixBeyondHeld {
                seq: parent,
                layer: 0,
                rows: tokens,
                held_rows: held,
            }));
        }
        let seq = self.cache.fork_prefix(parent, tokens)?;
        self.held.push((seq, tokens));
        Ok(seq)
    }

    /// Drops a sequence other than the default one, returning the pages only it held.
    pub fn drop_sequence(&mut self, seq: SeqId) -> Result<(), ExecError> {
        if seq == self.seq {
            return self.reset();
        }
        self.cache.drop_sequence(seq)?;
        self.held.retain(|(s, _)| *s != seq);
        Ok(())
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Bytes of GEMM weights one decode step reads (every WGemm, QGemm and weight MatMul once):
    /// what bounds decoding when memory bandwidth is the limit.
    pub fn gemm_weight_bytes_per_token(&self) -> usize {
        self.plan
            .ops
            .iter()
            .map(|(_, op)| match op {
                Op::WGemm { packed, .. } => self.plan.packed[*packed].weights().bytes(),
                Op::QGemm { packed, .. } => self.plan.qpacked[*packed].weights().bytes(),
                Op::MatMul { k, n, .. } => 4 * k * n,
                _ => 0,
            })
            .sum()
    }

    /// Installs an offload for QGemm products (see [`GemmOffload`]).
    pub fn set_offload(&mut self, offload: Box<dyn GemmOffload>) {
        self.offload = Some(offload);
    }

    /// QGemm calls whose products the offload computed.
    pub fn offloaded_calls(&self) -> u64 {
        self.offloaded_calls
    }

    /// Bytes of QGemm weight codes and column sums packed at load; 0 when the bundle holds every
    /// QGemm's weights packed (codes a program computes, such as a tied lm_head it quantises, are
    /// always packed at load).
    pub fn qgemm_bytes_packed_at_load(&self) -> usize {
        self.plan.qpacked.iter().map(|store| store.bytes_packed_at_load()).sum()
    }

    /// Bytes of WGemm weights packed at load (a copy of MatMulNBits-layout weights the executor
    /// holds); 0 when the bundle holds every WGemm weight packed.
    pub fn wgemm_bytes_packed_at_load(&self) -> usize {
        self.plan
            .packed
            .iter()
            .map(|store| match store {
                WGemmStore::PackedAtLoad(p) => p.weights().bytes(),
                WGemmStore::Mapped(_) => 0,
            })
            .sum()
    }

    /// Width of the logits row.
    pub fn vocab(&self) -> usize {
        self.plan.program.values[self.plan.logits].shape.last().and_then(|d| d.as_const()).unwrap_or(0)
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Forgets the sequence: the cache is emptied and the next step is at position 0. Also the
    /// way to go on after a step that failed.
    pub fn reset(&mut self) -> Result<(), ExecError> {
        self.cache.drop_sequence(self.seq)?;
        self.held.retain(|(s, _)| *s != self.seq);
        self.seq = self.cache.create_sequence();
        self.held.push((self.seq, 0));
        Ok(())
    }

    /// Runs `tokens` at the next positions and returns the logits of the last one. A failed step
    /// may leave part of the cache written: [`Executor::reset`] before going on.
    pub fn step(&mut self, tokens: &[u32]) -> Result<&[f32], ExecError> {
        self.step_sequence(self.seq, tokens)
    }

    /// [`Executor::step`] for sequence `seq`. A failed step may leave part of that sequence's
    /// cache written (drop it, or reset the default one); other sequences are untouched.
    pub fn step_sequence(&mut self, seq: SeqId, tokens: &[u32]) -> Result<&[f32], ExecError> {
        let held_index = self
            .held
            .iter()
            .position(|(s, _)| *s == seq)
            .ok_or(ExecError::Kv(crate::kvcache::KvError::UnknownSequence { seq }))?;
        let position = self.held[held_index].1;
        if tokens.is_empty() {
            return Err(ExecError::EmptyStep);
        }
        if position + tokens.len() > self.max_context {
            return Err(ExecError::ContextFull { tokens: tokens.len(), position, max_context: self.max_context });
        }
        let dims = StepDims { seq: tokens.len(), past: position };
        self.current = seq;
        self.ids.clear();
        self.ids.extend(tokens.iter().map(|&t| i64::from(t)));
        self.positions.clear();
        self.positions.extend((position..position + tokens.len()).map(|p| p as i64));
        self.prepare(dims);
        for i in 0..self.plan.ops.len() {
            self.run_op(i)?;
        }
        self.held[held_index].1 += tokens.len();
        let logits = self.plan.logits;
        let width = self.vocab();
        let Loc::Buf(b) = self.plan.locs[logits] else { unreachable!("the logits are computed into a buffer") };
        let rows_held = if self.last_row_only(logits) { 1 } else { numel(&self.shapes[logits]) / width };
        Ok(&self.bufs[b][(rows_held - 1) * width..rows_held * width])
    }

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
    /// rest and nothing is copied. A sequence whose step fails (an exhausted pool, a full
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
        for (i, prompt) in prompts.iter().enumerate() {
            // The earlier live sequence with the longest common prefix, in whole pages.
            let source = (0..i)
                .filter_map(|j| {
                    let common = prompts[j].iter().zip(prompt).take_while(|(a, b)| a == b).count();
                    let rows = common.min(prompt.len().saturating_sub(1)) / page_rows * page_rows;
                    seqs[j].filter(|_| rows > 0).map(|s| (rows, s))
                })
                .max_by_key(|&(rows, _)| rows);
            let start = Instant::now();
            let result = (|| {
                let (seq, shared) = match source {
                    Some((rows, parent)) => (self.fork_sequence(parent, rows)?, rows),
                    None => (self.new_sequence(), 0),
                };
                seqs[i] = Some(seq);
                outs[i].shared_prefix_tokens = shared;
                let logits = self.step_sequence(seq, &prompt[shared..])?;
                Ok(samplers[i].sample(logits))
            })();
            outs[i].stats.prefill_ms = start.elapsed().as_secs_f64() * 1000.0;
            match result {
                Ok(token) => next[i] = token,
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

    fn end_with_error(&mut self, seq: &mut Option<SeqId>, out: &mut SequenceOutput, error: ExecError) {
        if let Some(s) = seq.take() {
            let _ = self.drop_sequence(s);
        }
        out.stats.generated_tokens = out.tokens.len();
        out.error = Some(error);
    }

    fn last_row_only(&self, v: usize) -> bool {
        self.plan.ops.iter().any(|(_, op)| {
            matches!(op, Op::MatMul { out, last_row_only: true, .. } | Op::WGemm { out, last_row_only: true, .. } if *out == v)
        })
    }

    /// Evaluates every value's shape for the step and grows the buffers to fit.
    fn prepare(&mut self, dims: StepDims) {
        for (v, info) in self.plan.program.values.iter().enumerate() {
            let shape = &mut self.shapes[v];
            shape.clear();
            shape.extend(info.shape.iter().map(|d| d.eval(dims)));
        }
        for (_, op) in &self.plan.ops {
            let (outputs, rows_one): (&[usize], bool) = match op {
                Op::MatMul { out, last_row_only, .. } | Op::WGemm { out, last_row_only, .. } => {
                    (std::slice::from_ref(out), *last_row_only)
                }
                Op::Int { .. } => continue,
                Op::QuantizeRows { x, k, codes, scales } => {
                    let Loc::QBuf(b) = self.plan.locs[*codes] else { unreachable!("codes live in code buffers") };
                    let n = numel(&self.shapes[*x]);
                    if self.qbufs[b].len() < n {
                        self.qbufs[b].resize(n, 0);
                    }
                    grow(&mut self.bufs, self.plan.locs[*scales], n / k);
                    continue;
                }
                Op::Quantize { out, .. } | Op::QGemm { out, requant: Some(_), .. } => {
                    let Loc::QBuf(b) = self.plan.locs[*out] else { unreachable!("codes live in code buffers") };
                    let n = numel(&self.shapes[*out]);
                    if self.qbufs[b].len() < n {
                        self.qbufs[b].resize(n, 0);
                    }
                    continue;
                }
                Op::Dequantize { out, .. } | Op::QGemm { out, requant: None, .. } => (std::slice::from_ref(out), false),
                Op::GatherNBits { out, .. } | Op::Slice { out, .. } | Op::Concat { out, .. } => {
                    (std::slice::from_ref(out), false)
                }
                Op::Gather { out, .. }
                | Op::GatherColumns { out, .. }
                | Op::Transpose { out, .. }
                | Op::RmsNorm { out, .. }
                | Op::Rope { out, .. }
                | Op::Gate { out, .. }
                | Op::BinaryF32 { out, .. }
                | Op::Attention { out, .. } => (std::slice::from_ref(out), false),
                Op::SkipRmsNorm { x, y, sum, .. } => {
                    grow(&mut self.bufs, self.plan.locs[*y], numel(&self.shapes[*y]));
                    match sum {
                        Some(s) => grow(&mut self.bufs, self.plan.locs[*s], numel(&self.shapes[*s])),
                        None => {
                            let n = numel(&self.shapes[*x]);
                            if self.sum_scratch.len() < n {
                                self.sum_scratch.resize(n, 0.0);
                            }
                        }
                    }
                    continue;
                }
            };
            for &o in outputs {
                let n = if rows_one { self.shapes[o].last().copied().unwrap_or(1) } else { numel(&self.shapes[o]) };
                grow(&mut self.bufs, self.plan.locs[o], n);
            }
        }
    }

    fn run_op(&mut self, index: usize) -> Result<(), ExecError> {
        let (first, second) = match &self.plan.ops[index].1 {
            Op::Int { out, .. } => {
                let Loc::I64Buf(b) = self.plan.locs[*out] else { unreachable!("integer ops write i64 buffers") };
                let mut y = std::mem::take(&mut self.ibufs[b]);
                let result = self.compute_int(index, &mut y);
                self.ibufs[b] = y;
                return result;
            }
            Op::Quantize { .. } | Op::QuantizeRows { .. } | Op::Dequantize { .. } | Op::QGemm { .. } => {
                return self.run_quantised(index)
            }
            Op::WGemm { out, .. } | Op::GatherNBits { out, .. } | Op::Slice { out, .. } | Op::Concat { out, .. } => {
                (*out, None)
            }
            Op::Gather { out, .. }
            | Op::GatherColumns { out, .. }
            | Op::MatMul { out, .. }
            | Op::Transpose { out, .. }
            | Op::RmsNorm { out, .. }
            | Op::Rope { out, .. }
            | Op::Gate { out, .. }
            | Op::BinaryF32 { out, .. }
            | Op::Attention { out, .. } => (*out, None),
            Op::SkipRmsNorm { y, sum, .. } => (*y, Some(*sum)),
        };
        // Outputs are taken out of the buffer list while the op runs; no input shares their
        // buffers (see `assign_buffers`).
        let mut y = take(&mut self.bufs, self.plan.locs[first]);
        let mut y2 = match second {
            Some(Some(s)) => take(&mut self.bufs, self.plan.locs[s]),
            Some(None) => std::mem::take(&mut self.sum_scratch),
            None => Vec::new(),
        };
        let result = self.compute(index, &mut y, &mut y2);
        put(&mut self.bufs, self.plan.locs[first], y);
        match second {
            Some(Some(s)) => put(&mut self.bufs, self.plan.locs[s], y2),
            Some(None) => self.sum_scratch = y2,
            None => {}
        }
        result
    }

    fn compute(&mut self, index: usize, y: &mut [f32], y2: &mut [f32]) -> Result<(), ExecError> {
        let (node_index, op) = &self.plan.ops[index];
        let node = &self.plan.program.nodes[*node_index];
        let fail = |problem: String| node_err(&node.name, &node.op, problem);
        let isa = self.isa;
        let view = view!(self);
        match op {
            Op::Int { .. } => unreachable!("run by compute_int"),
            Op::Quantize { .. } | Op::QuantizeRows { .. } | Op::Dequantize { .. } | Op::QGemm { .. } => {
                unreachable!("run by run_quantised")
            }
            Op::WGemm { a, packed, bias, k, n, last_row_only, int8_activations, .. } => {
                let weights = self.plan.packed[*packed].weights();
                let mut x = view.f32(*a);
                if !x.len().is_multiple_of(*k) {
                    return Err(fail(format!("the activation holds {} values, not rows of {k}", x.len())));
                }
                let mut m = x.len() / k;
                if *last_row_only && m > 1 {
                    x = &x[(m - 1) * k..];
                    m = 1;
                }
                let b = bias.map(|b| view.f32(b));
                if b.is_some_and(|b| b.len() != *n) {
                    return Err(fail(format!("the bias is not {n} values")));
                }
                wgemm::wgemm(
                    isa,
                    &self.pool,
                    &weights,
                    x,
                    m,
                    b,
                    &mut y[..m * n],
                    if *int8_activations { WGemmPrecision::Int8Activations } else { self.wgemm_precision },
                    &mut self.wgemm_scratch,
                );
            }
            Op::GatherNBits { table, ids, out } => {
                let table = &self.plan.nbits_tables[*table];
                let (rows, width) = (table.rows(), table.width());
                row_ids(view.i64(*ids), rows, &mut self.gather_ids).map_err(&fail)?;
                let n = numel(&self.shapes[*out]);
                if n != self.gather_ids.len() * width {
                    return Err(fail(format!("{} ids of {width} values do not fill {n}", self.gather_ids.len())));
                }
                match table {
                    NBitsTable::Source(t) => embed::embed_nbits(t, &self.gather_ids, &mut y[..n])?,
                    NBitsTable::Packed(w) => embed::embed_packed(w, &self.gather_ids, &mut y[..n])?,
                }
            }
            Op::Slice { x, starts, ends, axes, steps, out } => {
                let input = view.f32(*x);
                let (st, en) = (view.i64(*starts), view.i64(*ends));
                let ax = axes.map(|a| view.i64(a));
                let sp = steps.map(|s| view.i64(s));
                let n = numel(&self.shapes[*out]);
                layout::slice(input, &self.shapes[*x], st, en, ax, sp, &mut y[..n]).map_err(&fail)?;
            }
            Op::Concat { inputs, axis, out } => {
                let out_shape = &self.shapes[*out];
                let n = numel(out_shape);
                let input = |i: usize| (view.f32(inputs[i]), &self.shapes[inputs[i]][..]);
                layout::concat(inputs.len(), input, *axis, out_shape, &mut y[..n]).map_err(&fail)?;
            }
            Op::Gather { data, ids, out } => {
                let table = view.f32(*data);
                let rows = self.shapes[*data].first().copied().unwrap_or(0);
                let width = table.len().checked_div(rows).unwrap_or(0);
                row_ids(view.i64(*ids), rows, &mut self.gather_ids).map_err(&fail)?;
                let n = numel(&self.shapes[*out]);
                embed::embed_f32(table, width, &self.gather_ids, &mut y[..n])?;
            }
            Op::GatherColumns { table, layout, k, n, ids, out } => {
                row_ids(view.i64(*ids), *n, &mut self.gather_ids).map_err(&fail)?;
                let len = numel(&self.shapes[*out]);
                let w = self.plan.weights[*table];
                embed::embed_columns(w, *layout, *k, *n, &self.gather_ids, &mut y[..len])?;
            }
            Op::MatMul { a, w, panels, layout, k, n, last_row_only, .. } => {
                let weights = match panels {
                    Some(i) => self.plan.weights[*i],
                    None => {
                        let (Loc::Weight(i) | Loc::WeightT(i)) = self.plan.locs[*w] else {
                            unreachable!("checked at load")
                        };
                        self.plan.weights[i]
                    }
                };
                let mut x = view.f32(*a);
                if !x.len().is_multiple_of(*k) {
                    return Err(fail(format!("the activation holds {} values, not rows of {k}", x.len())));
                }
                let mut m = x.len() / k;
                if *last_row_only && m > 1 {
                    x = &x[(m - 1) * k..];
                    m = 1;
                }
                gemm::gemm_f32(isa, &self.pool, x, m, *k, weights, *n, *layout, None, &mut y[..m * n]);
            }
            Op::Transpose { x, perm, .. } => {
                let input = view.f32(*x);
                layout::transpose(input, &self.shapes[*x], perm, &mut y[..input.len()]);
            }
            Op::RmsNorm { x, gamma, eps, .. } => {
                let (input, g) = (view.f32(*x), view.f32(*gamma));
                check_rows(&fail, input.len(), g.len(), "γ")?;
                norm::rms_norm(isa, input, g, *eps, &mut y[..input.len()]);
            }
            Op::SkipRmsNorm { x, skip, gamma, bias, eps, .. } => {
                let (input, skip_in, g) = (view.f32(*x), view.f32(*skip), view.f32(*gamma));
                let bias_in = bias.map(|b| view.f32(b));
                check_rows(&fail, input.len(), g.len(), "γ")?;
                if skip_in.is_empty()
                    || !input.len().is_multiple_of(skip_in.len())
                    || !skip_in.len().is_multiple_of(g.len())
                {
                    return Err(fail(format!(
                        "skip of {} values does not repeat over x of {}",
                        skip_in.len(),
                        input.len()
                    )));
                }
                if bias_in.is_some_and(|b| b.len() != g.len()) {
                    return Err(fail(format!("bias is not {} values", g.len())));
                }
                let n = input.len();
                norm::skip_rms_norm(isa, input, skip_in, g, bias_in, *eps, &mut y[..n], &mut y2[..n]);
            }
            Op::Rope { x, cos, sin, interleaved, .. } => {
                let (input, c, s) = (view.f32(*x), view.f32(*cos), view.f32(*sin));
                let (d, rows_per_cos_row) =
                    rope_broadcast(&self.shapes[*x], &self.shapes[*cos], c.len()).map_err(&fail)?;
                if s.len() != c.len() || self.shapes[*sin] != self.shapes[*cos] {
                    return Err(fail("cos and sin differ in shape".to_string()));
                }
                let n = input.len();
                y[..n].copy_from_slice(input);
                rope::rope_in_place(isa, &mut y[..n], d, c, s, rows_per_cos_row, *interleaved);
            }
            Op::Gate { gate, up, act, .. } => {
                let (g, u) = (view.f32(*gate), view.f32(*up));
                if g.len() != u.len() {
                    return Err(fail(format!("gate of {} values and up of {}", g.len(), u.len())));
                }
                match act {
                    GateActivation::Silu => swiglu::swiglu(isa, g, u, &mut y[..g.len()]),
                    GateActivation::GeluTanh => swiglu::gelu_gate(g, u, &mut y[..g.len()]),
                }
            }
            Op::BinaryF32 { a, b, mul, .. } => {
                let (x, z) = (view.f32(*a), view.f32(*b));
                let (big, small) = if x.len() >= z.len() { (x, z) } else { (z, x) };
                if small.is_empty() || big.len() % small.len() != 0 {
                    return Err(fail(format!(
                        "combines {} values with {}: neither repeats over the other",
                        small.len(),
                        big.len()
                    )));
                }
                for (row, out) in big.chunks(small.len()).zip(y[..big.len()].chunks_mut(small.len())) {
                    for ((o, p), q) in out.iter_mut().zip(row).zip(small) {
                        *o = if *mul { p * q } else { p + q };
                    }
                }
            }
            Op::Attention { q, k, v, layer, scoring, .. } => {
                let (queries, keys, values) = (view.f32(*q), view.f32(*k), view.f32(*v));
                self.cache.append(self.current, *layer, keys, values)?;
                let a = self.plan.attention;
                let tokens = queries.len() / (a.q_heads * a.head_dim).max(1);
                let workers = self.pool.threads().min(a.kv_heads);
                if tokens < PARALLEL_ATTENTION_ROWS || workers < 2 {
                    self.cache.attend(self.current, *layer, queries, *scoring, &mut y[..queries.len()])?;
                } else {
                    while self.attend_scratches.len() < workers {
                        self.attend_scratches.push(Mutex::new(self.cache.new_scratch()));
                    }
                    let (cache, seq, scratches) = (&self.cache, self.current, &self.attend_scratches);
                    attend_in_parallel(&self.pool, workers, a.kv_heads, &mut y[..queries.len()], &|heads, out, t| {
                        let mut scratch = scratches[t].lock().unwrap_or_else(|e| e.into_inner());
                        cache.attend_heads(seq, *layer, queries, *scoring, heads, out, &mut scratch)
                    })?;
                }
            }
        }
        Ok(())
    }
}

impl Executor<'_> {
    /// Runs QuantizeLinear, DequantizeLinear and QGemm: codes in [`Executor::qbufs`].
    fn run_quantised(&mut self, index: usize) -> Result<(), ExecError> {
        let (node_index, op) = &self.plan.ops[index];
        let node = &self.plan.program.nodes[*node_index];
        let fail = |problem: String| node_err(&node.name, &node.op, problem);
        let locs = &self.plan.locs;
        let qbuf = |v: usize| match locs[v] {
            Loc::QBuf(b) => b,
            other => unreachable!("codes at {other:?} (checked at load)"),
        };
        match op {
            Op::Quantize { x, scale, zero_point, signed, out } => {
                let b = qbuf(*out);
                let mut y = std::mem::take(&mut self.qbufs[b]);
                let view = view!(self);
                let input = view.f32(*x);
                quantize::quantize_linear(input, *scale, *zero_point, *signed, &mut y[..input.len()]);
                self.qbufs[b] = y;
            }
            Op::QuantizeRows { x, k, codes, scales } => {
                let b = qbuf(*codes);
                let mut y = std::mem::take(&mut self.qbufs[b]);
                let Loc::Buf(sb) = locs[*scales] else { unreachable!("scales live in buffers") };
                let mut row_scales = std::mem::take(&mut self.bufs[sb]);
                let view = view!(self);
                let input = view.f32(*x);
                quantize::quantize_rows(input, *k, &mut y, &mut row_scales);
                self.bufs[sb] = row_scales;
                self.qbufs[b] = y;
            }
            Op::Dequantize { x, scale, zero_point, signed, out } => {
                let codes = &self.qbufs[qbuf(*x)][..numel(&self.shapes[*x])];
                let Loc::Buf(b) = locs[*out] else { unreachable!("outputs live in buffers") };
                quantize::dequantize_linear(codes, *scale, *zero_point, *signed, &mut self.bufs[b][..codes.len()]);
            }
            Op::QGemm { a, a_signed, a_row_scales, a_scale, a_zero_point, packed, k, n, requant, out } => {
                let (k, n) = (*k, *n);
                let codes_len = numel(&self.shapes[*a]);
                if !codes_len.is_multiple_of(k) {
                    return Err(fail(format!("the activation holds {codes_len} codes, not rows of {k}")));
                }
                let m = codes_len / k;
                let weights = self.plan.qpacked[*packed].weights();
                // Per-row scales are read from their buffer, taken out while the output is written.
                let rows = a_row_scales.map(|v| {
                    let Loc::Buf(b) = locs[v] else { unreachable!("scales live in buffers") };
                    (b, std::mem::take(&mut self.bufs[b]))
                });
                let a_sc = match &rows {
                    Some((_, r)) => AScale::Rows(&r[..m]),
                    None => AScale::Tensor(*a_scale),
                };
                let products = match self.offload.as_mut() {
                    Some(off) => {
                        let codes = &self.qbufs[qbuf(*a)][..codes_len];
                        let acts = if *a_signed { QActivations::I8(as_i8(codes)) } else { QActivations::U8(codes) };
                        off.products(&node.name, acts, m, weights).map_err(&fail)?
                    }
                    None => None,
                };
                self.offloaded_calls += u64::from(products.is_some());
                // The kernel, or its epilogue on the offload's products.
                let (isa, pool, scratch) = (self.isa, &self.pool, &mut self.qgemm_scratch);
                let a_zero = *a_zero_point;
                let mut gemm = |acts: QActivations, dst: QOutput| match &products {
                    Some(p) => qgemm::qgemm_from_products(weights, acts, m, a_sc, a_zero, p, dst),
                    None => {
                        qgemm::qgemm_scaled(isa, pool, weights, acts, m, a_sc, a_zero, dst, scratch);
                        Ok(())
                    }
                };
                let result = match requant {
                    Some((scale, zero_point, signed)) => {
                        let b = qbuf(*out);
                        let mut y = std::mem::take(&mut self.qbufs[b]);
                        let codes = &self.qbufs[qbuf(*a)][..codes_len];
                        let acts = if *a_signed { QActivations::I8(as_i8(codes)) } else { QActivations::U8(codes) };
                        let (scale, zero_point) = (*scale, *zero_point);
                        let dst = if *signed {
                            QOutput::I8 { y: as_i8_mut(&mut y[..m * n]), scale, zero_point }
                        } else {
                            QOutput::U8 { y: &mut y[..m * n], scale, zero_point }
                        };
                        let r = gemm(acts, dst);
                        self.qbufs[b] = y;
                        r
                    }
                    None => {
                        let codes = &self.qbufs[qbuf(*a)][..codes_len];
                        let acts = if *a_signed { QActivations::I8(as_i8(codes)) } else { QActivations::U8(codes) };
                        let Loc::Buf(b) = locs[*out] else { unreachable!("outputs live in buffers") };
                        gemm(acts, QOutput::F32(&mut self.bufs[b][..m * n]))
                    }
                };
                if let Some((b, r)) = rows {
                    self.bufs[b] = r;
                }
                result.map_err(|e| fail(e.to_string()))?;
            }
            _ => unreachable!("quantised ops only"),
        }
        Ok(())
    }

    /// Evaluates an integer op exactly into `y`.
    fn compute_int(&self, index: usize, y: &mut Vec<i64>) -> Result<(), ExecError> {
        let (node_index, op) = &self.plan.ops[index];
        let node = &self.plan.program.nodes[*node_index];
        let fail = |problem: String| node_err(&node.name, &node.op, problem);
        let Op::Int { kind, inputs, .. } = op else { unreachable!("an integer op") };
        let view = view!(self);
        let scalar = |slot: usize| -> Result<i64, ExecError> {
            match view.i64(inputs[slot]) {
                [v] => Ok(*v),
                other => Err(fail(format!("input {slot} holds {} values, not one", other.len()))),
            }
        };
        y.clear();
        match kind {
            IntKind::Shape { start, end } => {
                let shape = &self.shapes[inputs[0]];
                let rank = shape.len() as i64;
                let clamp = |i: i64| (if i < 0 { i + rank } else { i }).clamp(0, rank) as usize;
                let (s, e) = (clamp(*start), clamp(end.unwrap_or(rank)));
                y.extend(shape[s..e.max(s)].iter().map(|&d| d as i64));
            }
            IntKind::Gather => {
                let (data, ids) = (view.i64(inputs[0]), view.i64(inputs[1]));
                let rows = self.shapes[inputs[0]].first().copied().unwrap_or(0);
                let width = data.len().checked_div(rows).unwrap_or(0);
                for &i in ids {
                    let row = if i < 0 { i + rows as i64 } else { i };
                    if row < 0 || row as usize >= rows {
                        return Err(fail(format!("index {i} is outside {rows} rows")));
                    }
                    y.extend_from_slice(&data[row as usize * width..(row as usize + 1) * width]);
                }
            }
            IntKind::Add | IntKind::Sub | IntKind::Mul => {
                let (a, b) = (view.i64(inputs[0]), view.i64(inputs[1]));
                let f = |x: i64, y: i64| match kind {
                    IntKind::Add => x.wrapping_add(y),
                    IntKind::Sub => x.wrapping_sub(y),
                    _ => x.wrapping_mul(y),
                };
                // Scalars broadcast; otherwise the shapes must agree.
                match (a.len(), b.len()) {
                    (1, _) => y.extend(b.iter().map(|&v| f(a[0], v))),
                    (_, 1) => y.extend(a.iter().map(|&v| f(v, b[0]))),
                    (x, z) if x == z && self.shapes[inputs[0]] == self.shapes[inputs[1]] => {
                        y.extend(a.iter().zip(b).map(|(&u, &v)| f(u, v)))
                    }
                    _ => {
                        return Err(fail(format!(
                            "shapes {:?} and {:?} do not broadcast the ways the executor does",
                            self.shapes[inputs[0]], self.shapes[inputs[1]]
                        )))
                    }
                }
            }
            IntKind::Range => {
                let (start, limit, delta) = (scalar(0)?, scalar(1)?, scalar(2)?);
                if delta == 0 {
                    return Err(fail("delta is 0".to_string()));
                }
                let count = ((limit - start) as f64 / delta as f64).ceil().max(0.0) as i64;
                y.extend((0..count).map(|i| start + i * delta));
            }
            IntKind::Concat => {
                for &i in inputs {
                    y.extend_from_slice(view.i64(i));
                }
            }
        }
        let out = op_out(op);
        let want = numel(&self.shapes[out]);
        if y.len() != want {
            return Err(fail(format!("computed {} values; the program says {:?}", y.len(), self.shapes[out])));
        }
        Ok(())
    }
}

fn op_out(op: &Op) -> usize {
    match op {
        Op::Int { out, .. } => *out,
        _ => unreachable!("used for integer ops"),
    }
}

/// Read access to the values of the current step.
struct View<'a, 'b> {
    plan: &'a Plan<'b>,
    bufs: &'a [Vec<f32>],
    shapes: &'a [Vec<usize>],
    ids: &'a [i64],
    positions: &'a [i64],
    ibufs: &'a [Vec<i64>],
}

impl<'a> View<'a, '_> {
    fn f32(&self, v: usize) -> &'a [f32] {
        let n = numel(&self.shapes[v]);
        match self.plan.locs[v] {
            Loc::Buf(b) => &self.bufs[b][..n],
            Loc::Weight(i) => self.plan.weights[i],
            Loc::ConstF32(i) => &self.plan.consts_f32[i],
            other => unreachable!("value {v} at {other:?} is not f32 (checked at load)"),
        }
    }

    fn i64(&self, v: usize) -> &'a [i64] {
        match self.plan.locs[v] {
            Loc::Ids => self.ids,
            Loc::Positions => self.positions,
            Loc::ConstI64(i) => &self.plan.consts_i64[i],
            Loc::I64Buf(i) => &self.ibufs[i],
            other => unreachable!("value {v} at {other:?} is not i64 (checked at load)"),
        }
    }
}

/// `ids` as table rows of `rows` (negative ids count from the end), into `out`.
fn row_ids(ids: &[i64], rows: usize, out: &mut Vec<u32>) -> Result<(), String> {
    out.clear();
    for &i in ids {
        let row = if i < 0 { i + rows as i64 } else { i };
        out.push(u32::try_from(row).map_err(|_| format!("index {i} is outside {rows} rows"))?);
    }
    Ok(())
}

/// Query rows from which a block's attention is split over the pool's threads by KV head
/// (decoding attends one row, serially and without allocating).
const PARALLEL_ATTENTION_ROWS: usize = 8;

/// Attention for some KV heads into their part of the output, by one worker (its index).
type AttendHeads<'a> = dyn Fn(std::ops::Range<usize>, &mut [f32], usize) -> Result<(), KvError> + Sync + 'a;

/// Runs `attend(heads, out_of_those_heads, worker)` for `workers` disjoint ranges of the
/// `kv_heads` KV heads on the pool; `out` is `[q_heads, S, D]`, each range's query heads a
/// contiguous part of it. The first error is returned.
fn attend_in_parallel(
    pool: &ThreadPool,
    workers: usize,
    kv_heads: usize,
    out: &mut [f32],
    attend: &AttendHeads,
) -> Result<(), ExecError> {
    let per_head = out.len() / kv_heads;
    let base = SyncPtr(out.as_mut_ptr());
    let error: Mutex<Option<KvError>> = Mutex::new(None);
    pool.run(workers, &|t| {
        let heads = split_range(kv_heads, workers, t);
        // SAFETY: the ranges of KV heads are disjoint, so are their parts of `out`; `run` returns
        // after every task has finished.
        let part =
            unsafe { std::slice::from_raw_parts_mut(base.get().add(heads.start * per_head), heads.len() * per_head) };
        if let Err(e) = attend(heads, part, t) {
            error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
        }
    });
    match error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn grow(bufs: &mut [Vec<f32>], loc: Loc, n: usize) {
    if let Loc::Buf(b) = loc {
        if bufs[b].len() < n {
            bufs[b].resize(n, 0.0);
        }
    }
}

fn take(bufs: &mut [Vec<f32>], loc: Loc) -> Vec<f32> {
    let Loc::Buf(b) = loc else { unreachable!("outputs live in buffers") };
    std::mem::take(&mut bufs[b])
}

fn put(bufs: &mut [Vec<f32>], loc: Loc, buf: Vec<f32>) {
    let Loc::Buf(b) = loc else { unreachable!("outputs live in buffers") };
    bufs[b] = buf;
}

fn check_rows(fail: &impl Fn(String) -> ExecError, len: usize, width: usize, what: &str) -> Result<(), ExecError> {
    if width == 0 || !len.is_multiple_of(width) {
        return Err(fail(format!("{what} of {width} values does not match rows of the input ({len} values)")));
    }
    Ok(())
}

/// Rope's broadcast of cos/sin over x as the kernel takes it: the rotary width and how many
/// consecutive rows of x share one cos row. The cos axes other than 1 must be one run of axes
/// equal to x's; the axes of x before the run repeat the table.
fn rope_broadcast(x: &[usize], cos: &[usize], cos_len: usize) -> Result<(usize, usize), String> {
    let (r, rc) = (x.len(), cos.len());
    let d = x.last().copied().unwrap_or(0);
    if rc == 0 || rc > r || cos[rc - 1] != d {
        return Err(format!("cos {cos:?} does not broadcast to x {x:?} over the full width"));
    }
    let cos_dim = |i: usize| if i + rc >= r { cos[i + rc - r] } else { 1 };
    let spread: Vec<usize> = (0..r - 1).filter(|&i| cos_dim(i) != 1).collect();
    let (Some(&first), Some(&last)) = (spread.first(), spread.last()) else {
        return Ok((d, 1));
    };
    if (first..=last).any(|i| cos_dim(i) != x[i]) {
        return Err(format!("cos {cos:?} does not broadcast to x {x:?} as one run of axes"));
    }
    let cos_rows: usize = (first..=last).map(|i| x[i]).product();
    if cos_rows * d != cos_len {
        return Err(format!("cos holds {cos_len} values, not {cos_rows} rows of {d}"));
    }
    Ok((d, x[last + 1..r - 1].iter().product()))
}

fn as_i8(bytes: &[u8]) -> &[i8] {
    // SAFETY: u8 and i8 have the same size and alignment, and every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<i8>(), bytes.len()) }
}

fn as_i8_mut(bytes: &mut [u8]) -> &mut [i8] {
    // SAFETY: as in `as_i8`; the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<i8>(), bytes.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_tables_broadcast_over_heads() {
        // x [1, 9, 5, 64] (BNSH) with cos [1, 1, 5, 64]: rows cycle through the 5 positions.
        assert_eq!(rope_broadcast(&[1, 9, 5, 64], &[1, 1, 5, 64], 5 * 64), Ok((64, 1)));
        // x [1, 5, 9, 64] (BSNH) with cos [1, 5, 1, 64]: 9 consecutive rows share one.
        assert_eq!(rope_broadcast(&[1, 5, 9, 64], &[1, 5, 1, 64], 5 * 64), Ok((64, 9)));
        assert!(rope_broadcast(&[1, 9, 5, 64], &[1, 1, 5, 32], 5 * 32).is_err());
    }

    #[test]
    fn argmax_takes_the_first_of_equal_logits() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
    }
}

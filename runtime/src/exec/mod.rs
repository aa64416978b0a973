//! The host executor: runs a bundle's program (`npuc-program/1`) one step at a time over a
//! paged KV cache.
//!
//! [`Executor::new`] decodes the program and builds its plan (see `plan`): every value gets a
//! place — a buffer, a weight read in place from the bundle's map, a constant, the step's token
//! ids or positions, a small integer buffer, or the KV cache — and every node that computes
//! something becomes one op. Ops the executor does not run are refused at load, naming the op and
//! the node. Reshape, Unsqueeze, Squeeze, Flatten and Identity are aliases (no copy); a 2-D weight
//! transposed only to feed MatMuls (a tied lm_head reading the embedding table) is read in place
//! in the `[N, K]` layout. Buffers are shared by values whose lifetimes do not overlap and grow to
//! the largest step seen; decoding one token after another allocates nothing.
//!
//! Weight-only programs (the builder's int4): `npuc::WGemm` (MatMulNBits semantics) runs the kernels' WGemm.
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
//! A8W8 programs (QDQ graphs): `QuantizeLinear` of activations (per-tensor scale and zero point)
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
//! chosen by a [`Sampler`](crate::sample::Sampler) (greedy by default).
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
//! Hybrid decoders (Qwen3.5, LFM2 and their MoE forms): CausalConvWithState and LinearAttention
//! nodes have their past/present states bound to a state slot of the sequence (`Loc::State`),
//! held beside its KV pages, zeroed when the sequence is created, updated in place by each step and
//! released with it; a stateful sequence is truncated or forked at an earlier position only inside
//! its last verify block, whose rows' states the step kept (see `rollback`). MoE and QMoE route
//! each token to its top k experts and compute only those, the step's tokens grouped per expert
//! ([`Executor::moe_expert_passes`] counts them).
//!
//! [`Executor::step`] runs S tokens (a prefill block, or one token when decoding) and returns
//! the logits of the last position; when the logits come from a MatMul or a WGemm, only that row
//! is computed.
//!
//! # Layout
//!
//! - `plan`: loading a program into a plan — where every value lives, the buffers shared by
//!   liveness — with one lowering per op in a table (`plan::lower`: float, quantised and integer
//!   ops in their own modules).
//! - `session`: the sequence API and [`Executor::step`].
//! - `generate`: the generation loops and their statistics.
//! - `run`: one step's interpreters — shapes and buffers for the step, then each op by its group
//!   (`run::float`, `run::quantised`, `run::integer`, `run::recurrent`, `run::moe`,
//!   `run::router`) on the kernels of [`crate::kernels`].
//! - `program`: the program's JSON decoded; [`packed`]: the packed-weight conventions.

mod chain;
mod error;
mod generate;
mod mtp;
pub mod packed;
mod plan;
mod profile;
mod program;
mod rollback;
mod run;
mod session;
mod speculate;

pub use crate::kernels::layout::MAX_TRANSPOSE_RANK;
pub use chain::OffloadChain;
pub use error::ExecError;
pub use generate::{argmax, GenerateStats, SequenceOutput};
pub use mtp::MtpDrafter;
pub use profile::{OpProfile, OpTime, PhaseProfile};
pub use program::PROGRAM_FORMAT;
pub use speculate::{generate_speculative, Drafter, PromptLookup, SpeculationStats, VerifyBackend};

use crate::bundle::Bundle;
use crate::kernels::qgemm::{QActivations, QGemmScratch, QGemmWeights};
use crate::kernels::wgemm::{WGemmPrecision, WGemmScratch};
use crate::kernels::{Isa, ThreadPool};
use crate::kvcache::{AttendScratch, KvCache, KvCacheConfig, KvStorage, SeqId};
// The OpenVINO host steps share these with the executor.
#[cfg(feature = "openvino")]
pub(crate) use plan::{ExpertActivation, LinearHeads};
use plan::{Op, Plan, WGemmStore};
use program::Program;
#[cfg(feature = "openvino")]
pub(crate) use run::{conv_channel, delta_rule_rows, expert_activate, l2_normalize_rows, route_experts};
#[cfg(feature = "openvino")]
pub(crate) use run::{DeltaScratch, LinearInputs};
use std::sync::Mutex;

/// Tokens of a delta-rule chunk unless told otherwise.
pub const DEFAULT_DELTA_CHUNK: usize = 64;

/// Context the executor reserves KV pages for unless told otherwise.
pub const DEFAULT_MAX_CONTEXT: usize = 2048;

/// Rows a step over a long prompt runs at once unless told otherwise: the activations of a
/// step grow with its rows, so a 40,960-token prompt in one step would hold gigabytes of them.
pub const DEFAULT_PREFILL_CHUNK: usize = 1024;

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
    /// Rows of one page; [`crate::kvcache::DEFAULT_PAGE_ROWS`] when `None`. Prefix sharing and
    /// truncation keep or share whole pages.
    pub kv_page_rows: Option<usize>,
    /// Tokens a LinearAttention step takes at once in the chunked form of the delta rule
    /// (`run::delta_chunk`); 0 or 1 runs token by token. A verify step's rows and decay per key
    /// dimension always run token by token.
    pub delta_chunk: usize,
    /// Rows a [`Executor::step`] over more tokens runs at once: a long prompt becomes steps of
    /// this many rows, each attending to the cache the earlier ones wrote, so the activations
    /// stay bounded whatever the prompt's length. 0 runs any prompt in one step.
    pub prefill_chunk: usize,
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
            kv_page_rows: None,
            delta_chunk: DEFAULT_DELTA_CHUNK,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
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
    /// A QGemm of stacked passes: every pass's products, before they are summed.
    pass_products: Vec<f32>,
    /// Where QGemm products are computed when not here (see [`GemmOffload`]).
    offload: Option<Box<dyn GemmOffload>>,
    offloaded_calls: u64,
    /// The offload's chains of nodes, each one call (see `chain`).
    chains: chain::Chains,
    /// One attention scratch per worker of a prefill block's attention (grown once).
    attend_scratches: Vec<Mutex<AttendScratch>>,
    /// The step computes the logits of every row, not only the last (a verify step).
    every_row_logits: bool,
    /// Each live sequence's recurrent state ([`Plan::states`] slots; empty vectors for a program
    /// without recurrent layers).
    states: Vec<(SeqId, Vec<f32>)>,
    /// Tokens of a prefill's delta-rule chunk ([`ExecOptions::delta_chunk`]).
    delta_chunk: usize,
    /// Rows of a step over a long prompt ([`ExecOptions::prefill_chunk`]).
    prefill_chunk: usize,
    delta_scratch: run::DeltaScratch,
    /// The states after each row of the last verify step (`rollback`).
    row_states: rollback::RowStates,
    /// DeltaNet's L2-normalised q and k (`qk_l2norm_eps`): values of no program buffer.
    qk_scratch: (Vec<f32>, Vec<f32>),
    moe_scratch: run::MoeScratch,
    /// Experts the MoE ops computed (each over all the tokens routed to it in one call).
    moe_expert_passes: u64,
    moe_expert_bytes: u64,
    /// The hidden states the next step of an MTP head reads, `[tokens, width]` (see `mtp`).
    hidden_input: Vec<f32>,
    /// Whether steps compute the hidden states output when only it needs the ops (see `mtp`).
    hidden_output: bool,
    /// Each op's time, while a profile records ([`Executor::start_profile`]).
    profile: Option<Box<profile::Recorder>>,
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
    ) -> Result<Option<Vec<i32>>, OffloadError>;

    /// Runs of nodes the offload computes as one call each (see [`OffloadChain`]); none unless
    /// it says so.
    fn chains(&self) -> Vec<OffloadChain> {
        vec![]
    }

    /// Computes chain `index` of [`GemmOffload::chains`] for `rows` rows: `inputs` the f32
    /// values it names, `w` its QGemms' weights; returns its outputs, the first `[rows, n]`.
    fn run_chain(
        &mut self,
        index: usize,
        inputs: &[&[f32]],
        rows: usize,
        w: &[QGemmWeights<'_>],
    ) -> Result<Vec<Vec<f32>>, OffloadError> {
        let _ = (inputs, rows, w);
        Err(format!("this offload computes no chain (asked for chain {index})").into())
    }
}

/// Why an offload failed (the device's own error type, kept whole for `source()`).
pub type OffloadError = Box<dyn std::error::Error + Send + Sync>;

impl<'b> Executor<'b> {
    /// Loads `bundle`'s program (see the module documentation for what is refused) and creates
    /// a KV cache for `options.max_context` tokens.
    pub fn new(bundle: &'b Bundle, options: ExecOptions) -> Result<Executor<'b>, ExecError> {
        Executor::load(bundle, bundle.program(), options)
    }

    /// [`Executor::new`] for `program`, one of `bundle`'s (its decoder's or its drafter's).
    fn load(bundle: &'b Bundle, program: &bundle::Program, options: ExecOptions) -> Result<Executor<'b>, ExecError> {
        let program = Program::from_format(program)?;
        let plan = Plan::load(program, |name| bundle.tensor(name))?;
        let a = plan.attention;
        let max_context = options.max_context.max(1);
        let isa = options.isa.unwrap_or_else(Isa::detect).check();
        let config = KvCacheConfig::new(a.layers, a.q_heads, a.kv_heads, a.head_dim, 1)
            .with_storage(options.kv_storage)
            .with_isa(isa);
        let rows = options.kv_page_rows.unwrap_or(config.page_rows);
        let config = config.with_page_rows(rows);
        let pages = options.kv_pages.unwrap_or_else(|| {
            options.sequences.max(1) * a.layers * a.kv_heads * max_context.div_ceil(config.page_rows)
        });
        let mut cache = KvCache::new(KvCacheConfig { pages, ..config }.with_reserved_rows(max_context))?;
        let seq = cache.create_sequence();
        Ok(Executor {
            shapes: vec![Vec::new(); plan.program.values.len()],
            bufs: vec![Vec::new(); plan.buffers],
            ibufs: vec![Vec::new(); plan.i64_buffers],
            wgemm_precision: WGemmPrecision::Exact,
            wgemm_scratch: WGemmScratch::default(),
            qbufs: vec![Vec::new(); plan.q_buffers],
            qgemm_scratch: QGemmScratch::default(),
            pass_products: Vec::new(),
            offload: None,
            offloaded_calls: 0,
            chains: chain::Chains::default(),
            attend_scratches: Vec::new(),
            every_row_logits: false,
            states: vec![(seq, vec![0.0; plan.state_floats])],
            delta_chunk: options.delta_chunk,
            prefill_chunk: options.prefill_chunk,
            delta_scratch: run::DeltaScratch::default(),
            row_states: rollback::RowStates::default(),
            qk_scratch: (Vec::new(), Vec::new()),
            moe_scratch: run::MoeScratch::default(),
            moe_expert_passes: 0,
            moe_expert_bytes: 0,
            hidden_input: Vec::new(),
            hidden_output: false,
            profile: None,
            plan,
            isa,
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

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Bytes of GEMM weights one decode step reads (every WGemm, QGemm and weight MatMul once):
    /// what bounds decoding when memory bandwidth is the limit.
    pub fn gemm_weight_bytes_per_token(&self) -> usize {
        self.ops_run()
            .map(|op| match op {
                Op::WGemm { packed, .. } => self.plan.packed[*packed].weights().bytes(),
                Op::QGemm { packed, .. } => self.plan.qpacked[*packed].weights().bytes(),
                Op::MatMul { k, n, .. } => 4 * k * n,
                _ => 0,
            })
            .sum()
    }

    /// Experts the MoE and QMoE ops have computed so far, each over all the tokens routed to it
    /// in one call (its weights read once): a decode step adds at most `k` per MoE node.
    pub fn moe_expert_passes(&self) -> u64 {
        self.moe_expert_passes
    }

    /// Bytes of expert weights the MoE and QMoE ops have read so far (each computed expert's
    /// weights once per call).
    pub fn moe_expert_bytes_read(&self) -> u64 {
        self.moe_expert_bytes
    }

    /// Bytes of expert weights one decode token reads (the routed `k` experts of every MoE
    /// node: the model's active experts) and bytes of all experts; (0, 0) without MoE.
    pub fn moe_bytes_per_token(&self) -> (usize, usize) {
        let moe_nodes = self.ops_run().filter_map(|op| match op {
            Op::Moe { experts, mixing, .. } => Some((&self.plan.moe[*experts], mixing.k)),
            _ => None,
        });
        moe_nodes.fold((0, 0), |(active, all), (ex, k)| {
            (active + k.min(ex.count) * ex.expert_bytes(), all + ex.count * ex.expert_bytes())
        })
    }

    /// The ops a step runs (all but those only the hidden states need, unless asked for).
    fn ops_run(&self) -> impl Iterator<Item = &Op> {
        (0..self.plan.ops.len()).filter(|&i| !self.skips_op(i)).map(|i| &self.plan.ops[i].1)
    }

    /// Whether a step skips op `i`: only the hidden states read it and no drafter asked for them.
    fn skips_op(&self, i: usize) -> bool {
        self.plan.hidden_only[i] && !self.hidden_output
    }

    /// Installs an offload for QGemm products and the chains it computes (see
    /// [`GemmOffload`]); refused, leaving none installed, when a chain does not resolve
    /// against the program.
    pub fn set_offload(&mut self, offload: Box<dyn GemmOffload>) -> Result<(), ExecError> {
        self.offload = None;
        self.resolve_chains(&offload.chains())?;
        self.offload = Some(offload);
        Ok(())
    }

    /// Starts recording each op's time in the steps from here on (anew if one was recording).
    pub fn start_profile(&mut self) {
        let kinds = self.plan.ops.iter().map(|(_, op)| profile::kind_of(op)).collect();
        self.profile = Some(Box::new(profile::Recorder::new(kinds)));
    }

    /// The time of the steps since [`Executor::start_profile`], by phase and op kind; recording
    /// stops.
    pub fn take_profile(&mut self) -> Option<OpProfile> {
        self.profile.take().map(|p| p.finish())
    }

    /// QGemm calls whose products the offload computed.
    pub fn offloaded_calls(&self) -> u64 {
        self.offloaded_calls
    }

    /// Chains the offload computed as one call each.
    pub fn offloaded_chains(&self) -> u64 {
        self.chains.calls
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
}

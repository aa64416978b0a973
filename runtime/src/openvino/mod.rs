//! The `openvino` backend: runs an intel-npu bundle's IR segments (`intel/plan.json`, written by
//! `codegen-intel`) through the OpenVINO runtime, with attention over the host's paged KV cache
//! between segments and greedy sampling, exactly as the host executor decodes.
//!
//! Hybrid decoders' plans also have host steps (`host`): recurrent layers whose states the session
//! keeps, one per layer for its one sequence, updated in place by every step's real rows (never
//! copied, never a tensor), and mixtures of experts the host routes and whose routed experts run
//! as a static expert network with the expert's weights bound as its inputs. A sequence with a
//! recurrent state cannot be truncated (its state holds only the last position), so speculative
//! decoding on OpenVINO is refused for it ([`OvError::RecurrentTruncate`]).
//!
//! OpenVINO's C library is linked at run time (`openvino_sys::library::load_from`): the PyPI wheel
//! ships it as `openvino/libs/libopenvino_c.so.<version>`, with no unversioned name, so
//! [`find_library`] takes `NPUC_OPENVINO_LIB` (a file or a folder) when it is set, else looks in the site-packages of
//! `$VIRTUAL_ENV` and of a `.venv` in the working directory or above the executable. A build of
//! npuc therefore needs no OpenVINO; a run says what it looked for when none is found.
//!
//! Each segment is compiled for a block size on first use (cache dir set; on CPU with precision
//! hint f32, no dynamic quantisation of activations and no low-precision (int8) transformations,
//! so it computes what the host computes). A
//! step of S tokens runs blocks of the largest size ≤ S, and the remainder in the smallest block
//! that holds it, padded: segments are row-wise, padded rows are never appended to the cache and
//! their outputs are dropped.
//!
//! A verify step ([`OvSession::step_rows`], speculative decoding's) runs its tokens in the
//! smallest verify block that holds them (`verify_blocks` of the plan), the lm_head's network of
//! that block computing every row's logits; [`OvSession::truncate`] gives rejected rows back by
//! truncating the KV cache's page tables (no copy). A bundle compiled without verify blocks, or a
//! verify step longer than the largest, is refused ([`OvError::NoVerifyBlock`]).
//!
//! Values flow between segments as OpenVINO tensors: a segment's outputs are the request's own
//! tensors, and the next segment's inputs are bound to them as they are (`set_tensor`, no copy);
//! attention's output is written by the host into a tensor that is bound the same way. Only token
//! ids, RoPE rows and the last row a last-row segment (the lm_head) reads are written into fresh
//! tensors; [`OvSession::input_traffic`] counts both.

mod host;

use crate::bundle::intel::{self, Plan, PlanError, Role, Step};
use crate::bundle::Bundle;
use crate::kvcache::{KvCache, KvCacheConfig, Scoring, SeqId};
use host::HostRun;
use openvino::{Core, DeviceType, ElementType, InferRequest, RwPropertyKey, Shape, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum OvError {
    #[error("OpenVINO's C library was not found: looked for {looked_for}; install the `openvino` wheel (pip install openvino) or set NPUC_OPENVINO_LIB to libopenvino_c.so.<version> or its folder")]
    LibraryNotFound { looked_for: String },
    #[error("loading {path}: {msg}")]
    Library { path: String, msg: String },
    #[error("device {device} is not available: OpenVINO reports {available:?}")]
    NoDevice { device: String, available: Vec<String> },
    #[error("the bundle has no OpenVINO IR ({0}): compile it with --target intel-npu")]
    NoIr(String),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("segment {segment}: {msg}")]
    Segment { segment: String, msg: String },
    #[error("a verify step of {rows} tokens: the bundle's verify blocks are {verify_blocks:?} (compile with --verify-blocks to hold it)")]
    NoVerifyBlock { rows: usize, verify_blocks: Vec<usize> },
    #[error("truncating to {tokens} tokens a sequence that holds {held}")]
    TruncateBeyondHeld { tokens: usize, held: usize },
    #[error("truncating to {tokens} tokens a sequence that holds {held}: the recurrent state of node `{node}` holds only the last position (speculative decoding on OpenVINO is not supported for hybrid decoders)")]
    RecurrentTruncate { node: String, tokens: usize, held: usize },
    #[error("{0}")]
    Run(String),
}

fn ov<E: std::fmt::Display>(segment: &str, what: &str) -> impl Fn(E) -> OvError {
    let (segment, what) = (segment.to_string(), what.to_string());
    move |e| OvError::Segment { segment: segment.clone(), msg: format!("{what}: {e}") }
}

/// Where OpenVINO's C library is, by the rules of the module documentation.
pub fn find_library() -> Result<PathBuf, OvError> {
    let mut looked = Vec::new();
    if let Some(p) = std::env::var_os("NPUC_OPENVINO_LIB").map(PathBuf::from) {
        if p.is_file() {
            return Ok(p);
        }
        if let Some(f) = versioned_in(&p) {
            return Ok(f);
        }
        // A library named explicitly and missing is an error, not a reason to look elsewhere.
        return Err(OvError::LibraryNotFound { looked_for: format!("NPUC_OPENVINO_LIB={}", p.display()) });
    } else {
        looked.push("NPUC_OPENVINO_LIB (unset)".into());
    }
    let mut venvs: Vec<PathBuf> = std::env::var_os("VIRTUAL_ENV").map(PathBuf::from).into_iter().collect();
    let mut roots: Vec<PathBuf> = std::env::current_dir().ok().into_iter().collect();
    if let Ok(exe) = std::env::current_exe() {
        roots.push(exe);
    }
    for r in roots {
        for a in r.ancestors() {
            venvs.push(a.join(".venv"));
        }
    }
    for v in venvs {
        let Ok(entries) = std::fs::read_dir(v.join("lib")) else { continue };
        for e in entries.flatten() {
            let libs = e.path().join("site-packages/openvino/libs");
            if let Some(f) = versioned_in(&libs) {
                return Ok(f);
            }
            looked.push(libs.display().to_string());
        }
        if looked.len() > 12 {
            break;
        }
    }
    Err(OvError::LibraryNotFound { looked_for: format!("libopenvino_c.so[.<version>] in {}", looked.join(", ")) })
}

/// `libopenvino_c.so` or `libopenvino_c.so.<version>` in `dir`.
fn versioned_in(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libopenvino_c.so")))
        .collect();
    found.sort();
    found.pop()
}

/// Options of [`OvSession::open`].
#[derive(Clone, Debug)]
pub struct OvOptions {
    /// `CPU` or `NPU` (any OpenVINO device name).
    pub device: String,
    /// Compiled-model cache folder (default: `intel/cache` next to the bundle is not writable in
    /// general, so the system temp dir's `npuc-openvino-cache`).
    pub cache_dir: Option<PathBuf>,
    /// Most tokens the session holds.
    pub max_context: usize,
    /// CPU inference threads (0: OpenVINO's default).
    pub threads: usize,
}

/// What binding the segments' inputs moved (see [`OvSession::input_traffic`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InputTraffic {
    /// Bytes written into fresh input tensors: token ids, RoPE rows, the last row of a value a
    /// last-row segment (the lm_head) reads.
    pub copied_bytes: u64,
    /// Bytes of values bound as the tensors that produced them (a segment's output, attention's
    /// output), with no copy.
    pub bound_bytes: u64,
}

/// A bundle's IR on one OpenVINO device with the host's paged KV cache for one sequence.
pub struct OvSession {
    core: Core,
    device: String,
    dir: PathBuf,
    weights: String,
    segments: Vec<intel::Segment>,
    attentions: Vec<intel::Attention>,
    /// Each attention's sinks (gpt-oss), one per query head.
    sinks: Vec<Option<Vec<f32>>>,
    /// The plan's host steps (recurrent layers with their states, mixtures of experts).
    host: Vec<HostRun>,
    /// Compiled expert networks by (host step, block size).
    expert_requests: HashMap<(usize, usize), InferRequest>,
    /// The host computes the experts even where the plan has expert networks.
    host_experts: bool,
    expert_runs: u64,
    schedule: Vec<Step>,
    blocks: Vec<usize>,
    verify_blocks: Vec<usize>,
    requests: HashMap<(usize, usize), InferRequest>,
    /// The host-fed RoPE tables by input name (`[positions, width]` each).
    rope_tables: HashMap<String, Vec<f32>>,
    rope_width: usize,
    rope_positions: usize,
    logits_name: String,
    /// Width of a row of logits.
    vocab: usize,
    /// The logits of the last step, for [`crate::exec::VerifyBackend`].
    last_logits: Vec<f32>,
    cache: KvCache,
    seq: SeqId,
    position: usize,
    max_context: usize,
    traffic: InputTraffic,
}

/// Loads OpenVINO's C library, checks that `o.device` is available and sets the device's
/// properties (see the module documentation).
fn open_core(o: &OvOptions) -> Result<Core, OvError> {
    let lib = find_library()?;
    openvino_sys::library::load_from(&lib).map_err(|msg| OvError::Library { path: lib.display().to_string(), msg })?;
    let mut core = Core::new().map_err(|e| OvError::Library { path: lib.display().to_string(), msg: e.to_string() })?;
    let available: Vec<String> = core
        .available_devices()
        .map_err(|e| OvError::Run(format!("listing devices: {e}")))?
        .iter()
        .map(|d| d.as_ref().to_string())
        .collect();
    if !available.iter().any(|d| d == &o.device || d.starts_with(&format!("{}.", o.device))) {
        return Err(OvError::NoDevice { device: o.device.clone(), available });
    }
    let device = DeviceType::Other(o.device.clone().into());
    let cache_dir = o.cache_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("npuc-openvino-cache"));
    let mut set = |k: RwPropertyKey, v: &str| {
        core.set_property(&device, &k, v)
            .map_err(|e| OvError::Run(format!("setting {} on {}: {e}", k.as_ref(), o.device)))
    };
    set(RwPropertyKey::CacheDir, &cache_dir.display().to_string())?;
    if o.device == "CPU" {
        // The CPU device defaults to bf16 where the CPU has it, quantises activations to
        // int8 for GEMMs with compressed weights, and runs a QDQ program's FakeQuantize →
        // MatMul in int8, whose u8×i8 kernel on AVX2 without VNNI adds pairs of products in
        // saturating 16 bits (off by 30 of 94 on extreme codes, tools/ov_int8_saturation.py):
        // all off, so CPU computes what the host does — the NPU's int8 sums are exact.
        set(RwPropertyKey::HintInferencePrecision, "f32")?;
        set(RwPropertyKey::Other("DYNAMIC_QUANTIZATION_GROUP_SIZE".into()), "0")?;
        set(RwPropertyKey::Other("LP_TRANSFORMS_MODE".into()), "NO")?;
        if o.threads > 0 {
            set(RwPropertyKey::InferenceNumThreads, &o.threads.to_string())?;
        }
    } else if o.device.starts_with("NPU") {
        // Weightless cache blobs: the NPU plugin keeps the compiled network and reads the
        // weights from the bundle's weights.bin again at import. (The CPU plugin keeps them in
        // its blobs whatever the mode — 190 MB of blobs for SmolLM2's 99.5 MB — and loads an
        // OPTIMIZE_SIZE cache about 2x slower: tools/ov_cache_modes.py; CPU keeps the default.)
        set(RwPropertyKey::Other("CACHE_MODE".into()), "OPTIMIZE_SIZE")?;
    }
    Ok(core)
}

/// The RoPE tables the plan places in the weights file, by input name.
fn read_rope_tables(rope: &intel::Rope, weights: &[u8]) -> Result<HashMap<String, Vec<f32>>, OvError> {
    let mut tables = HashMap::new();
    for (name, at) in &rope.tables {
        let range = usize::try_from(at.offset).ok().zip(usize::try_from(at.size).ok());
        let bytes =
            range.and_then(|(offset, size)| weights.get(offset..offset.checked_add(size)?)).ok_or_else(|| {
                let message =
                    format!("bytes {}..+{} are beyond the {}-byte weights file", at.offset, at.size, weights.len());
                PlanError::at(format!("rope.tables.{name}"), message)
            })?;
        let values = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        tables.insert(name.clone(), values);
    }
    Ok(tables)
}

/// The paged KV cache for `max_context` tokens of the plan's attentions (every layer has the first
/// one's heads), and its one sequence.
fn new_cache(attentions: &[intel::Attention], max_context: usize) -> Result<(KvCache, SeqId), OvError> {
    let first = attentions.first().ok_or_else(|| PlanError::at("attention", "no attention (one per layer)"))?;
    let (layers, q_heads, kv_heads, head_dim) = (attentions.len(), first.q_heads, first.kv_heads, first.head_dim);
    let page_rows = 16;
    let pages = layers * kv_heads * max_context.div_ceil(page_rows) + layers * kv_heads;
    let config = KvCacheConfig::new(layers, q_heads, kv_heads, head_dim, pages).with_page_rows(page_rows);
    let mut cache = KvCache::new(config).map_err(|e| OvError::Run(e.to_string()))?;
    let seq = cache.create_sequence();
    Ok((cache, seq))
}

/// A fresh tensor of `shape` for an input of `segment`.
fn fresh_tensor(segment: &str, element: ElementType, shape: &[usize]) -> Result<Tensor, OvError> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let shape = Shape::new(&dims).map_err(ov(segment, "shape"))?;
    Tensor::new(element, &shape).map_err(ov(segment, "tensor"))
}

impl OvSession {
    /// Loads OpenVINO, checks the device and reads the bundle's plan; segments compile on first use.
    pub fn open(bundle: &Bundle, o: &OvOptions) -> Result<OvSession, OvError> {
        let plan_path =
            bundle.file_path(intel::PLAN_PATH).ok_or_else(|| OvError::NoIr(format!("no {}", intel::PLAN_PATH)))?;
        let bytes = std::fs::read(&plan_path).map_err(|e| OvError::NoIr(e.to_string()))?;
        let plan = Plan::decode(&bytes)?;
        let dir = plan_path.parent().unwrap().to_path_buf();
        let weights_name = format!("{}/{}", intel::DIR, plan.weights_file);
        let weights_path =
            bundle.file_path(&weights_name).ok_or_else(|| OvError::NoIr(format!("no {weights_name}")))?;
        let core = open_core(o)?;
        let weights =
            std::fs::read(&weights_path).map_err(|e| OvError::NoIr(format!("{}: {e}", weights_path.display())))?;
        let rope_tables = read_rope_tables(&plan.rope, &weights)?;
        let host = plan.host.iter().enumerate().map(|(i, h)| HostRun::new(i, h, &weights)).collect::<Result<_, _>>()?;
        let sinks = plan.attention.iter().enumerate().map(|(i, a)| host::attention_sinks(i, a, &weights));
        let sinks = sinks.collect::<Result<_, _>>()?;
        let max_context = o.max_context.min(plan.rope.positions).max(1);
        let (cache, seq) = new_cache(&plan.attention, max_context)?;
        let mut blocks = plan.blocks;
        blocks.sort_unstable();
        let mut verify_blocks = plan.verify_blocks;
        verify_blocks.sort_unstable();
        let vocab = logits_width(&plan.segments, &plan.logits)?;
        Ok(OvSession {
            core,
            device: o.device.clone(),
            dir,
            weights: weights_path.display().to_string(),
            segments: plan.segments,
            attentions: plan.attention,
            sinks,
            host,
            expert_requests: HashMap::new(),
            host_experts: false,
            expert_runs: 0,
            schedule: plan.schedule,
            blocks,
            verify_blocks,
            requests: HashMap::new(),
            rope_tables,
            rope_width: plan.rope.width,
            rope_positions: plan.rope.positions,
            logits_name: plan.logits,
            vocab,
            last_logits: Vec::new(),
            cache,
            seq,
            position: 0,
            max_context,
            traffic: InputTraffic::default(),
        })
    }

    /// Compiles every segment for every block size now (they otherwise compile on first use), and
    /// with `verify` for every verify block size too, and the expert networks; returns how many
    /// networks that is.
    pub fn compile_all(&mut self, verify: bool) -> Result<usize, OvError> {
        let mut n = 0;
        for i in 0..self.segments.len() {
            let seg = &self.segments[i];
            let plain = |t: usize| if seg.last_row_only { t == 1 } else { self.blocks.contains(&t) };
            let sizes: Vec<usize> = seg
                .files
                .keys()
                .copied()
                .filter(|&t| plain(t) || (verify && self.verify_blocks.contains(&t)))
                .collect();
            for t in sizes {
                self.request(i, t)?;
                n += 1;
            }
        }
        for h in 0..self.host.len() {
            let bound = matches!(&self.host[h].step, intel::HostStep::Moe(m) if m.segment.is_some());
            let blocks = if bound && !self.host_experts { self.blocks.clone() } else { Vec::new() };
            for t in blocks {
                self.expert_request(h, t)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// The verify block sizes the bundle has networks for, ascending (empty for none).
    pub fn verify_blocks(&self) -> &[usize] {
        &self.verify_blocks
    }

    /// Width of a row of logits.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Most tokens the session holds.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Keeps the first `tokens` tokens of the sequence and forgets the rest: the KV cache
    /// truncates its page tables (no copy) and the next step runs at position `tokens`. Rejected
    /// speculative rows leave this way.
    pub fn truncate(&mut self, tokens: usize) -> Result<(), OvError> {
        if tokens > self.position {
            return Err(OvError::TruncateBeyondHeld { tokens, held: self.position });
        }
        if let Some(h) = self.host.iter().find(|h| h.has_state()).filter(|_| tokens < self.position) {
            return Err(OvError::RecurrentTruncate { node: h.step.node().to_string(), tokens, held: self.position });
        }
        self.cache.truncate(self.seq, tokens).map_err(|e| OvError::Run(e.to_string()))?;
        self.position = tokens;
        Ok(())
    }

    /// Forgets the sequence: the cache is emptied and the next step is at position 0 (the compiled
    /// segments stay).
    pub fn reset(&mut self) -> Result<(), OvError> {
        self.cache.drop_sequence(self.seq).map_err(|e| OvError::Run(e.to_string()))?;
        self.seq = self.cache.create_sequence();
        self.host.iter_mut().for_each(HostRun::reset);
        self.position = 0;
        Ok(())
    }

    /// Tokens the sequence holds.
    pub fn position(&self) -> usize {
        self.position
    }

    /// What binding inputs has moved since the session opened: values flow from segment to
    /// segment as OpenVINO tensors, bound in place; only token ids, RoPE rows and last-row slices
    /// are written into fresh tensors.
    pub fn input_traffic(&self) -> InputTraffic {
        self.traffic
    }

    /// The device the segments run on.
    pub fn device(&self) -> &str {
        &self.device
    }

    fn request(&mut self, segment: usize, block: usize) -> Result<&mut InferRequest, OvError> {
        if !self.requests.contains_key(&(segment, block)) {
            let s = &self.segments[segment];
            let file = s.files.get(&block).ok_or_else(|| OvError::Segment {
                segment: s.name.clone(),
                msg: format!("no network for block size {block}"),
            })?;
            let xml = self.dir.join(file);
            let model = self
                .core
                .read_model_from_file(&xml.display().to_string(), &self.weights)
                .map_err(ov(&s.name, "read_model"))?;
            let mut compiled = self
                .core
                .compile_model(&model, DeviceType::Other(self.device.clone().into()))
                .map_err(ov(&s.name, "compile_model"))?;
            let request = compiled.create_infer_request().map_err(ov(&s.name, "create_infer_request"))?;
            self.requests.insert((segment, block), request);
        }
        Ok(self.requests.get_mut(&(segment, block)).unwrap())
    }

    /// Runs `tokens` through the model at the current position and returns the logits of the last
    /// one.
    pub fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>, OvError> {
        self.check_room(tokens.len())?;
        let mut logits = Vec::new();
        let mut done = 0;
        while done < tokens.len() {
            let left = tokens.len() - done;
            let largest = *self.blocks.last().unwrap_or(&1);
            let block =
                if left >= largest { largest } else { *self.blocks.iter().find(|&&b| b >= left).unwrap_or(&largest) };
            let rows = left.min(block);
            logits = self.run_block(&tokens[done..done + rows], block, Rows::Last)?;
            done += rows;
        }
        Ok(logits)
    }

    /// Runs `tokens` at the current position as one verify block and returns the logits of every
    /// one of them, `[tokens, vocab]` (row `i` scores the token after `tokens[..=i]`): one token
    /// is a step; more run in the smallest verify block that holds them, padded.
    pub fn step_rows(&mut self, tokens: &[u32]) -> Result<Vec<f32>, OvError> {
        if tokens.len() == 1 {
            return self.step(tokens);
        }
        self.check_room(tokens.len())?;
        let block = self.verify_blocks.iter().copied().find(|&b| b >= tokens.len());
        let block = block
            .ok_or_else(|| OvError::NoVerifyBlock { rows: tokens.len(), verify_blocks: self.verify_blocks.clone() })?;
        self.run_block(tokens, block, Rows::All)
    }

    /// Refuses an empty step and one past the session's context.
    fn check_room(&self, tokens: usize) -> Result<(), OvError> {
        if tokens == 0 {
            return Err(OvError::Run("a step needs at least one token".into()));
        }
        if self.position + tokens > self.max_context {
            return Err(OvError::Run(format!(
                "{tokens} tokens at position {} exceed the session's context of {} (RoPE tables cover {})",
                self.position, self.max_context, self.rope_positions
            )));
        }
        Ok(())
    }

    /// Runs one block of `block` rows, `tokens` of them real; the logits of the rows `rows` asks.
    fn run_block(&mut self, tokens: &[u32], block: usize, rows_out: Rows) -> Result<Vec<f32>, OvError> {
        let rows = tokens.len();
        // Every value between segments is an OpenVINO tensor: a segment's output as the request
        // holds it, or attention's output written by the host straight into one.
        let mut values: HashMap<String, Tensor> = HashMap::new();
        let mut logits = Vec::new();
        for si in 0..self.schedule.len() {
            match self.schedule[si] {
                Step::Segment(i) => {
                    if let Some(l) = self.run_segment(i, tokens, (block, rows_out), &mut values)? {
                        logits = l;
                    }
                }
                Step::Attention(a) => self.attend(a, rows, block, &mut values)?,
                Step::Host(h) => self.run_host(h, rows, block, &mut values)?,
            }
        }
        self.position += rows;
        if logits.is_empty() {
            return Err(OvError::Run(format!("no segment produced the logits `{}`", self.logits_name)));
        }
        Ok(logits)
    }

    /// Runs segment `i` on the block: binds its inputs, infers, and keeps its outputs in `values`.
    /// Returns the logits' rows `rows_out` asks when the segment produces them.
    fn run_segment(
        &mut self,
        i: usize,
        tokens: &[u32],
        (block, rows_out): (usize, Rows),
        values: &mut HashMap<String, Tensor>,
    ) -> Result<Option<Vec<f32>>, OvError> {
        let last_row = self.segments[i].last_row_only && rows_out == Rows::Last;
        let t = if last_row { 1 } else { block };
        let made = self.fresh_inputs(i, tokens, (block, last_row), values)?;
        let seg = &self.segments[i];
        let name = seg.name.clone();
        let inputs: Vec<String> = seg.inputs.iter().map(|io| io.name.clone()).collect();
        let outputs: Vec<(String, usize)> = seg
            .outputs
            .iter()
            .map(|o| (o.name.clone(), o.shape.get(&t).and_then(|s| s.last().copied()).unwrap_or(0)))
            .collect();
        let logits_name = self.logits_name.clone();
        let request = self.request(i, t)?;
        let mut made = made.into_iter().peekable();
        for (slot, input) in inputs.iter().enumerate() {
            let bound = match made.peek() {
                Some((s, _)) if *s == slot => {
                    let (_, tensor) = made.next().expect("peeked");
                    request.set_tensor(input, &tensor).map_err(ov(&name, &format!("binding {input}")))?;
                    continue;
                }
                _ => &values[input],
            };
            request.set_tensor(input, bound).map_err(ov(&name, &format!("binding {input}")))?;
        }
        request.infer().map_err(ov(&name, "infer"))?;
        let mut logits = None;
        for (n, width) in outputs {
            let tensor = request.get_tensor(&n).map_err(ov(&name, &format!("reading {n}")))?;
            if n == logits_name {
                let data = tensor.get_data::<f32>().map_err(ov(&name, &format!("reading {n}")))?;
                let width = if width == 0 { data.len() } else { width };
                logits = Some(match rows_out {
                    Rows::Last => data[data.len() - width..].to_vec(),
                    Rows::All => data[..tokens.len() * width].to_vec(),
                });
            }
            values.insert(n, tensor);
        }
        Ok(logits)
    }

    /// The tensors written for segment `i`'s inputs, by input slot: token ids, RoPE rows, and when
    /// it runs on the last row the last row of each value. A value of a segment run on the whole
    /// block is bound as the tensor that holds it and has no entry. Counts what it copies and binds.
    fn fresh_inputs(
        &mut self,
        i: usize,
        tokens: &[u32],
        (block, last_row): (usize, bool),
        values: &HashMap<String, Tensor>,
    ) -> Result<Vec<(usize, Tensor)>, OvError> {
        let seg = &self.segments[i];
        let t = if last_row { 1 } else { block };
        let rows = tokens.len();
        let mut made = Vec::new();
        let (mut copied, mut bound) = (0u64, 0u64);
        for (slot, io) in seg.inputs.iter().enumerate() {
            let shape = io.shape.get(&t).ok_or_else(|| OvError::Segment {
                segment: seg.name.clone(),
                msg: format!("input {} has no shape for block {t}", io.name),
            })?;
            let count: usize = shape.iter().product();
            let tensor = match io.role {
                Role::Input => {
                    let tokens = if last_row { &tokens[rows - 1..] } else { tokens };
                    copied += 8 * count as u64;
                    token_tensor(&seg.name, shape, tokens)?
                }
                Role::Rope => {
                    let table = self.rope_tables.get(&io.name).ok_or_else(|| OvError::Segment {
                        segment: seg.name.clone(),
                        msg: format!("no RoPE table {}", io.name),
                    })?;
                    let first = if last_row { rows - 1 } else { 0 };
                    let positions = self.position + first..self.position + rows;
                    copied += 4 * count as u64;
                    rope_tensor(&seg.name, shape, table, self.rope_width, positions)?
                }
                Role::Value => {
                    let value = values.get(&io.name).ok_or_else(|| OvError::Segment {
                        segment: seg.name.clone(),
                        msg: format!("input {} is computed by nothing before it", io.name),
                    })?;
                    if !last_row {
                        check_bound(&seg.name, &io.name, value, shape)?;
                        bound += 4 * count as u64;
                        continue;
                    }
                    copied += 4 * count as u64;
                    last_row_tensor(&seg.name, &io.name, value, shape, block, rows)?
                }
            };
            made.push((slot, tensor));
        }
        self.traffic.copied_bytes += copied;
        self.traffic.bound_bytes += bound;
        Ok(made)
    }

    /// Appends the block's real rows of k/v to the cache and attends with its q; the output takes
    /// the q layout `[1, heads, block, head_dim]` with padded rows zero, in an OpenVINO tensor that
    /// the next segment is bound to.
    fn attend(
        &mut self,
        a: usize,
        rows: usize,
        block: usize,
        values: &mut HashMap<String, Tensor>,
    ) -> Result<(), OvError> {
        let at = &self.attentions[a];
        let d = at.head_dim;
        let run = |e: String| OvError::Run(format!("attention {}: {e}", at.layer));
        let take = |name: &str, heads: usize| -> Result<Vec<f32>, OvError> {
            let v = values.get(name).ok_or_else(|| run(format!("no value {name}")))?;
            let v = v.get_data::<f32>().map_err(|e| run(e.to_string()))?;
            if v.len() != heads * block * d {
                return Err(run(format!("{name} holds {} values, expected [1, {heads}, {block}, {d}]", v.len())));
            }
            let mut out = Vec::with_capacity(heads * rows * d);
            for h in 0..heads {
                out.extend_from_slice(&v[(h * block) * d..(h * block + rows) * d]);
            }
            Ok(out)
        };
        let q = take(&at.q, at.q_heads)?;
        let k = take(&at.k, at.kv_heads)?;
        let v = take(&at.v, at.kv_heads)?;
        let (layer, q_heads, y_name) = (at.layer, at.q_heads, at.y.clone());
        let sinks = self.sinks[a].as_deref();
        let scoring = Scoring { scale: at.scale, window: at.window, sinks };
        self.cache.append(self.seq, layer, &k, &v).map_err(|e| OvError::Run(e.to_string()))?;
        let shape = Shape::new(&[1, q_heads as i64, block as i64, d as i64]).map_err(|e| run(e.to_string()))?;
        let mut y = Tensor::new(ElementType::F32, &shape).map_err(|e| run(e.to_string()))?;
        let out = y.get_data_mut::<f32>().map_err(|e| run(e.to_string()))?;
        let mut heads_out = vec![0f32; q_heads * rows * d];
        self.cache.attend(self.seq, layer, &q, scoring, &mut heads_out).map_err(|e| OvError::Run(e.to_string()))?;
        for h in 0..q_heads {
            out[h * block * d..(h * block + rows) * d].copy_from_slice(&heads_out[h * rows * d..(h + 1) * rows * d]);
        }
        values.insert(y_name, y);
        Ok(())
    }

    /// Greedy decoding: the prompt in blocks, then one token at a time until `max_new` tokens or a
    /// stop token (included). Calls `on_token` as each token is chosen.
    pub fn generate_greedy(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
        mut on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, OvError> {
        let mut out = Vec::new();
        if max_new == 0 {
            return Ok(out);
        }
        let mut logits = self.step(prompt)?;
        loop {
            let next = crate::exec::argmax(&logits);
            out.push(next);
            on_token(next);
            if out.len() >= max_new || stop.contains(&next) {
                return Ok(out);
            }
            logits = self.step(&[next])?;
        }
    }
}

/// Which rows of a block's logits a run returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rows {
    /// The last real row (a step).
    Last,
    /// Every real row (a verify step).
    All,
}

/// The width of a row of the logits: the last dimension of the output `logits` of a segment.
fn logits_width(segments: &[intel::Segment], logits: &str) -> Result<usize, OvError> {
    let output = segments.iter().flat_map(|s| &s.outputs).find(|o| o.name == logits);
    let width = output.and_then(|o| o.shape.values().next()).and_then(|s| s.last().copied());
    width.ok_or_else(|| OvError::Plan(PlanError::at("logits", format!("no segment outputs `{logits}`"))))
}

/// The token ids of a segment input of `shape`.
fn token_tensor(segment: &str, shape: &[usize], tokens: &[u32]) -> Result<Tensor, OvError> {
    let mut tensor = fresh_tensor(segment, ElementType::I64, shape)?;
    let ids = tensor.get_data_mut::<i64>().map_err(ov(segment, "tensor"))?;
    for (d, &tok) in ids.iter_mut().zip(tokens) {
        *d = i64::from(tok);
    }
    Ok(tensor)
}

/// The rows of `table` (`width` values each) at `positions`, in a segment input of `shape`.
fn rope_tensor(
    segment: &str,
    shape: &[usize],
    table: &[f32],
    width: usize,
    positions: std::ops::Range<usize>,
) -> Result<Tensor, OvError> {
    let mut tensor = fresh_tensor(segment, ElementType::F32, shape)?;
    let dst = tensor.get_data_mut::<f32>().map_err(ov(segment, "tensor"))?;
    for (r, p) in positions.enumerate() {
        dst[r * width..(r + 1) * width].copy_from_slice(&table[p * width..(p + 1) * width]);
    }
    Ok(tensor)
}

/// Checks that `value` fits the segment input of `shape` it is bound to as it is (the tensor the
/// previous step wrote).
fn check_bound(segment: &str, input: &str, value: &Tensor, shape: &[usize]) -> Result<(), OvError> {
    let data = value.get_data::<f32>().map_err(ov(segment, "tensor"))?;
    let count: usize = shape.iter().product();
    if data.len() != count {
        return Err(OvError::Segment {
            segment: segment.to_string(),
            msg: format!("input {input} holds {} values, the network wants {shape:?}", data.len()),
        });
    }
    Ok(())
}

/// The last real row (of `rows`) of a block-sized `value`: the one copy a last-row segment (the
/// lm_head) needs.
fn last_row_tensor(
    segment: &str,
    input: &str,
    value: &Tensor,
    shape: &[usize],
    block: usize,
    rows: usize,
) -> Result<Tensor, OvError> {
    let data = value.get_data::<f32>().map_err(ov(segment, "tensor"))?;
    let count: usize = shape.iter().product();
    if data.len() != count * block {
        return Err(OvError::Segment {
            segment: segment.to_string(),
            msg: format!("input {input} holds {} values, not {block} rows of {count}", data.len()),
        });
    }
    let mut tensor = fresh_tensor(segment, ElementType::F32, shape)?;
    tensor
        .get_data_mut::<f32>()
        .map_err(ov(segment, "tensor"))?
        .copy_from_slice(&data[(rows - 1) * count..rows * count]);
    Ok(tensor)
}

impl crate::exec::VerifyBackend for OvSession {
    type Error = OvError;

    fn step_last(&mut self, tokens: &[u32]) -> Result<&[f32], OvError> {
        self.last_logits = self.step(tokens)?;
        Ok(&self.last_logits)
    }

    fn step_every_row(&mut self, tokens: &[u32]) -> Result<&[f32], OvError> {
        self.last_logits = self.step_rows(tokens)?;
        Ok(&self.last_logits)
    }

    fn truncate(&mut self, tokens: usize) -> Result<(), OvError> {
        OvSession::truncate(self, tokens)
    }

    fn position(&self) -> usize {
        self.position
    }

    fn max_context(&self) -> usize {
        self.max_context
    }

    fn vocab(&self) -> usize {
        self.vocab
    }

    /// The largest verify block (a step of one row without any).
    fn max_verify_rows(&self) -> usize {
        self.verify_blocks.last().copied().unwrap_or(1)
    }
}

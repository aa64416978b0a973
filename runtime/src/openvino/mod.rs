//! The `openvino` backend: runs an intel-npu bundle's IR segments (`intel/plan.json`, written by
//! `codegen-intel`) through the OpenVINO runtime, with attention over the host's paged KV cache
//! between segments and greedy sampling, exactly as the host executor decodes.
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
//! Values flow between segments as OpenVINO tensors: a segment's outputs are the request's own
//! tensors, and the next segment's inputs are bound to them as they are (`set_tensor`, no copy);
//! attention's output is written by the host into a tensor that is bound the same way. Only token
//! ids, RoPE rows and the last row a last-row segment (the lm_head) reads are written into fresh
//! tensors; [`OvSession::input_traffic`] counts both.

use crate::bundle::Bundle;
use crate::kvcache::{KvCache, KvCacheConfig, Scoring, SeqId};
use openvino::{Core, DeviceType, ElementType, InferRequest, RwPropertyKey, Shape, Tensor};
use serde_json::Value;
use std::collections::HashMap;
use std::num::NonZeroUsize;
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
    #[error("intel/plan.json: {0}")]
    Plan(String),
    #[error("segment {segment}: {msg}")]
    Segment { segment: String, msg: String },
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

struct Io {
    name: String,
    role: String,
    /// Shape per block size.
    shapes: HashMap<usize, Vec<usize>>,
}

struct SegmentPlan {
    name: String,
    files: HashMap<usize, String>,
    last_row_only: bool,
    inputs: Vec<Io>,
    outputs: Vec<Io>,
}

struct AttentionPlan {
    layer: usize,
    q: String,
    k: String,
    v: String,
    y: String,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
    /// A sliding window (keys a query sees, its own included); none when absent.
    window: Option<NonZeroUsize>,
}

enum Step {
    Segment(usize),
    Attention(usize),
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
    segments: Vec<SegmentPlan>,
    attentions: Vec<AttentionPlan>,
    schedule: Vec<Step>,
    blocks: Vec<usize>,
    requests: HashMap<(usize, usize), InferRequest>,
    /// The host-fed RoPE tables by input name (`[positions, width]` each).
    rope_tables: HashMap<String, Vec<f32>>,
    rope_width: usize,
    rope_positions: usize,
    logits_name: String,
    cache: KvCache,
    seq: SeqId,
    position: usize,
    max_context: usize,
    traffic: InputTraffic,
}

fn usize_of(v: &Value, what: &str) -> Result<usize, OvError> {
    v.as_u64().map(|x| x as usize).ok_or_else(|| OvError::Plan(format!("{what} is not a count: {v}")))
}

fn str_of(v: &Value, what: &str) -> Result<String, OvError> {
    v.as_str().map(str::to_string).ok_or_else(|| OvError::Plan(format!("{what} is not a string: {v}")))
}

fn io_list(v: &Value, what: &str) -> Result<Vec<Io>, OvError> {
    let mut out = Vec::new();
    for (i, x) in v.as_array().ok_or_else(|| OvError::Plan(format!("{what} is not a list")))?.iter().enumerate() {
        let mut shapes = HashMap::new();
        for (t, s) in x["shape"].as_object().ok_or_else(|| OvError::Plan(format!("{what}[{i}].shape")))? {
            let t: usize = t.parse().map_err(|_| OvError::Plan(format!("{what}[{i}]: block `{t}`")))?;
            let dims = s.as_array().ok_or_else(|| OvError::Plan(format!("{what}[{i}].shape.{t}")))?;
            shapes.insert(t, dims.iter().map(|d| usize_of(d, what)).collect::<Result<_, _>>()?);
        }
        out.push(Io {
            name: str_of(&x["name"], what)?,
            role: x["role"].as_str().unwrap_or("value").to_string(),
            shapes,
        });
    }
    Ok(out)
}

impl OvSession {
    /// Loads OpenVINO, checks the device and reads the bundle's plan; segments compile on first use.
    pub fn open(bundle: &Bundle, o: &OvOptions) -> Result<OvSession, OvError> {
        let plan_path =
            bundle.file_path("intel/plan.json").ok_or_else(|| OvError::NoIr("no intel/plan.json".into()))?;
        let plan: Value = serde_json::from_slice(&std::fs::read(&plan_path).map_err(|e| OvError::NoIr(e.to_string()))?)
            .map_err(|e| OvError::Plan(e.to_string()))?;
        if plan["format"] != "npuc-intel/1" {
            return Err(OvError::Plan(format!("format {} is not npuc-intel/1", plan["format"])));
        }
        let dir = plan_path.parent().unwrap().to_path_buf();
        let weights_name = str_of(&plan["weights_file"], "weights_file")?;
        let weights_path = bundle
            .file_path(&format!("intel/{weights_name}"))
            .ok_or_else(|| OvError::NoIr(format!("no intel/{weights_name}")))?;
        let lib = find_library()?;
        openvino_sys::library::load_from(&lib)
            .map_err(|msg| OvError::Library { path: lib.display().to_string(), msg })?;
        let mut core =
            Core::new().map_err(|e| OvError::Library { path: lib.display().to_string(), msg: e.to_string() })?;
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
        let set = |core: &mut Core, k: RwPropertyKey, v: &str| {
            core.set_property(&device, &k, v)
                .map_err(|e| OvError::Run(format!("setting {} on {}: {e}", k.as_ref(), o.device)))
        };
        set(&mut core, RwPropertyKey::CacheDir, &cache_dir.display().to_string())?;
        if o.device == "CPU" {
            // The CPU device defaults to bf16 where the CPU has it, quantises activations to
            // int8 for GEMMs with compressed weights, and runs a QDQ program's FakeQuantize →
            // MatMul in int8, whose u8×i8 kernel on AVX2 without VNNI adds pairs of products in
            // saturating 16 bits (off by 30 of 94 on extreme codes, tools/ov_int8_saturation.py):
            // all off, so CPU computes what the host does — the NPU's int8 sums are exact.
            set(&mut core, RwPropertyKey::HintInferencePrecision, "f32")?;
            set(&mut core, RwPropertyKey::Other("DYNAMIC_QUANTIZATION_GROUP_SIZE".into()), "0")?;
            set(&mut core, RwPropertyKey::Other("LP_TRANSFORMS_MODE".into()), "NO")?;
            if o.threads > 0 {
                set(&mut core, RwPropertyKey::InferenceNumThreads, &o.threads.to_string())?;
            }
        } else if o.device.starts_with("NPU") {
            // Weightless cache blobs: the NPU plugin keeps the compiled network and reads the
            // weights from the bundle's weights.bin again at import. (The CPU plugin keeps them in
            // its blobs whatever the mode — 190 MB of blobs for SmolLM2's 99.5 MB — and loads an
            // OPTIMIZE_SIZE cache about 2x slower: tools/ov_cache_modes.py; CPU keeps the default.)
            set(&mut core, RwPropertyKey::Other("CACHE_MODE".into()), "OPTIMIZE_SIZE")?;
        }
        let mut segments = Vec::new();
        for (i, s) in plan["segments"].as_array().ok_or_else(|| OvError::Plan("no segments".into()))?.iter().enumerate()
        {
            let mut files = HashMap::new();
            for (t, f) in s["files"].as_object().ok_or_else(|| OvError::Plan(format!("segments[{i}].files")))? {
                files.insert(t.parse().map_err(|_| OvError::Plan(format!("block `{t}`")))?, str_of(f, "file")?);
            }
            segments.push(SegmentPlan {
                name: str_of(&s["name"], "name")?,
                files,
                last_row_only: s["last_row_only"].as_bool().unwrap_or(false),
                inputs: io_list(&s["inputs"], "inputs")?,
                outputs: io_list(&s["outputs"], "outputs")?,
            });
        }
        let mut attentions = Vec::new();
        for a in plan["attention"].as_array().ok_or_else(|| OvError::Plan("no attention list".into()))? {
            attentions.push(AttentionPlan {
                layer: usize_of(&a["layer"], "layer")?,
                q: str_of(&a["q"], "q")?,
                k: str_of(&a["k"], "k")?,
                v: str_of(&a["v"], "v")?,
                y: str_of(&a["y"], "y")?,
                q_heads: usize_of(&a["q_heads"], "q_heads")?,
                kv_heads: usize_of(&a["kv_heads"], "kv_heads")?,
                head_dim: usize_of(&a["head_dim"], "head_dim")?,
                scale: a["scale"].as_f64().unwrap_or(0.0) as f32,
                window: a["window"].as_u64().and_then(|w| NonZeroUsize::new(w as usize)),
            });
        }
        let schedule = plan["schedule"]
            .as_array()
            .ok_or_else(|| OvError::Plan("no schedule".into()))?
            .iter()
            .map(|s| match (s.get("segment"), s.get("attention")) {
                (Some(i), _) => usize_of(i, "segment").map(Step::Segment),
                (_, Some(i)) => usize_of(i, "attention").map(Step::Attention),
                _ => Err(OvError::Plan(format!("schedule entry {s}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let first = attentions.first().ok_or_else(|| OvError::Plan("no attention".into()))?;
        let (layers, q_heads, kv_heads, head_dim) = (attentions.len(), first.q_heads, first.kv_heads, first.head_dim);
        let weights =
            std::fs::read(&weights_path).map_err(|e| OvError::NoIr(format!("{}: {e}", weights_path.display())))?;
        let mut rope_tables = HashMap::new();
        let tables = plan["rope"]["tables"].as_object().ok_or_else(|| OvError::Plan("no rope.tables".into()))?;
        for (name, at) in tables {
            let (off, size) = (usize_of(&at["offset"], "rope")?, usize_of(&at["size"], "rope")?);
            let bytes = off
                .checked_add(size)
                .and_then(|end| weights.get(off..end))
                .ok_or_else(|| OvError::Plan(format!("rope table {name} beyond the weights file")))?;
            let values = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            rope_tables.insert(name.clone(), values);
        }
        let rope_positions = usize_of(&plan["rope"]["positions"], "rope.positions")?;
        let max_context = o.max_context.min(rope_positions).max(1);
        let page_rows = 16;
        let pages = layers * kv_heads * max_context.div_ceil(page_rows) + layers * kv_heads;
        let config = KvCacheConfig::new(layers, q_heads, kv_heads, head_dim, pages).with_page_rows(page_rows);
        let mut cache = KvCache::new(config).map_err(|e| OvError::Run(e.to_string()))?;
        let seq = cache.create_sequence();
        let mut blocks: Vec<usize> = plan["blocks"]
            .as_array()
            .map(|b| b.iter().filter_map(|x| x.as_u64()).map(|x| x as usize).collect())
            .unwrap_or_default();
        blocks.sort_unstable();
        Ok(OvSession {
            core,
            device: o.device.clone(),
            dir,
            weights: weights_path.display().to_string(),
            segments,
            attentions,
            schedule,
            blocks,
            requests: HashMap::new(),
            rope_tables,
            rope_width: usize_of(&plan["rope"]["width"], "rope.width")?,
            rope_positions,
            logits_name: str_of(&plan["logits"], "logits")?,
            cache,
            seq,
            position: 0,
            max_context,
            traffic: InputTraffic::default(),
        })
    }

    /// Compiles every segment for every block size now (they otherwise compile on first use), and
    /// returns how many networks that is.
    pub fn compile_all(&mut self) -> Result<usize, OvError> {
        let mut n = 0;
        for i in 0..self.segments.len() {
            let blocks: Vec<usize> = self.segments[i].files.keys().copied().collect();
            for b in blocks {
                self.request(i, b)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Forgets the sequence: the cache is emptied and the next step is at position 0 (the compiled
    /// segments stay).
    pub fn reset(&mut self) -> Result<(), OvError> {
        self.cache.drop_sequence(self.seq).map_err(|e| OvError::Run(e.to_string()))?;
        self.seq = self.cache.create_sequence();
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
        if tokens.is_empty() {
            return Err(OvError::Run("a step needs at least one token".into()));
        }
        if self.position + tokens.len() > self.max_context {
            return Err(OvError::Run(format!(
                "{} tokens at position {} exceed the session's context of {} (RoPE tables cover {})",
                tokens.len(),
                self.position,
                self.max_context,
                self.rope_positions
            )));
        }
        let mut logits = Vec::new();
        let mut done = 0;
        while done < tokens.len() {
            let left = tokens.len() - done;
            let largest = *self.blocks.last().unwrap_or(&1);
            let block =
                if left >= largest { largest } else { *self.blocks.iter().find(|&&b| b >= left).unwrap_or(&largest) };
            let rows = left.min(block);
            logits = self.run_block(&tokens[done..done + rows], block)?;
            done += rows;
        }
        Ok(logits)
    }

    fn run_block(&mut self, tokens: &[u32], block: usize) -> Result<Vec<f32>, OvError> {
        let rows = tokens.len();
        // Every value between segments is an OpenVINO tensor: a segment's output as the request
        // holds it, or attention's output written by the host straight into one.
        let mut values: HashMap<String, Tensor> = HashMap::new();
        let w = self.rope_width;
        let mut logits = Vec::new();
        for si in 0..self.schedule.len() {
            match self.schedule[si] {
                Step::Segment(i) => {
                    let last_row = self.segments[i].last_row_only;
                    let t = if last_row { 1 } else { block };
                    let mut made: Vec<(usize, Tensor)> = Vec::new();
                    let (mut copied, mut bound) = (0u64, 0u64);
                    let seg = &self.segments[i];
                    for (slot, io) in seg.inputs.iter().enumerate() {
                        let shape = io.shapes.get(&t).ok_or_else(|| OvError::Segment {
                            segment: seg.name.clone(),
                            msg: format!("input {} has no shape for block {t}", io.name),
                        })?;
                        let count: usize = shape.iter().product();
                        let fresh = |element: ElementType| -> Result<Tensor, OvError> {
                            let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                            let shape_ov = Shape::new(&dims).map_err(ov(&seg.name, "shape"))?;
                            Tensor::new(element, &shape_ov).map_err(ov(&seg.name, "tensor"))
                        };
                        let tensor = match io.role.as_str() {
                            "input" => {
                                let mut tensor = fresh(ElementType::I64)?;
                                let ids = tensor.get_data_mut::<i64>().map_err(ov(&seg.name, "tensor"))?;
                                let tokens = if last_row { &tokens[rows - 1..] } else { tokens };
                                for (d, &tok) in ids.iter_mut().zip(tokens) {
                                    *d = i64::from(tok);
                                }
                                copied += 8 * count as u64;
                                tensor
                            }
                            "rope" => {
                                let table = self.rope_tables.get(&io.name).ok_or_else(|| OvError::Segment {
                                    segment: seg.name.clone(),
                                    msg: format!("no RoPE table {}", io.name),
                                })?;
                                let mut tensor = fresh(ElementType::F32)?;
                                let dst = tensor.get_data_mut::<f32>().map_err(ov(&seg.name, "tensor"))?;
                                let first = if last_row { rows - 1 } else { 0 };
                                for (r, row) in (first..rows).enumerate() {
                                    let p = (self.position + row) * w;
                                    dst[r * w..(r + 1) * w].copy_from_slice(&table[p..p + w]);
                                }
                                copied += 4 * count as u64;
                                tensor
                            }
                            _ => {
                                let value = values.get(&io.name).ok_or_else(|| OvError::Segment {
                                    segment: seg.name.clone(),
                                    msg: format!("input {} is computed by nothing before it", io.name),
                                })?;
                                let data = value.get_data::<f32>().map_err(ov(&seg.name, "tensor"))?;
                                if !last_row {
                                    if data.len() != count {
                                        return Err(OvError::Segment {
                                            segment: seg.name.clone(),
                                            msg: format!(
                                                "input {} holds {} values, the network wants {shape:?}",
                                                io.name,
                                                data.len()
                                            ),
                                        });
                                    }
                                    // Bound as it is: the tensor the previous step wrote.
                                    bound += 4 * count as u64;
                                    continue;
                                }
                                // The last row of a block-sized value: the one copy a last-row
                                // segment (the lm_head) needs.
                                if data.len() != count * block {
                                    return Err(OvError::Segment {
                                        segment: seg.name.clone(),
                                        msg: format!(
                                            "input {} holds {} values, not {block} rows of {count}",
                                            io.name,
                                            data.len()
                                        ),
                                    });
                                }
                                let mut tensor = fresh(ElementType::F32)?;
                                tensor
                                    .get_data_mut::<f32>()
                                    .map_err(ov(&seg.name, "tensor"))?
                                    .copy_from_slice(&data[(rows - 1) * count..rows * count]);
                                copied += 4 * count as u64;
                                tensor
                            }
                        };
                        made.push((slot, tensor));
                    }
                    let name = seg.name.clone();
                    let inputs: Vec<String> = seg.inputs.iter().map(|io| io.name.clone()).collect();
                    let outputs: Vec<(String, usize)> = seg
                        .outputs
                        .iter()
                        .map(|o| (o.name.clone(), o.shapes.get(&t).and_then(|s| s.last().copied()).unwrap_or(0)))
                        .collect();
                    self.traffic.copied_bytes += copied;
                    self.traffic.bound_bytes += bound;
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
                    for (n, width) in outputs {
                        let tensor = request.get_tensor(&n).map_err(ov(&name, &format!("reading {n}")))?;
                        if n == logits_name {
                            let data = tensor.get_data::<f32>().map_err(ov(&name, &format!("reading {n}")))?;
                            let width = if width == 0 { data.len() } else { width };
                            logits = data[data.len() - width..].to_vec();
                        }
                        values.insert(n, tensor);
                    }
                }
                Step::Attention(a) => self.attend(a, rows, block, &mut values)?,
            }
        }
        self.position += rows;
        if logits.is_empty() {
            return Err(OvError::Run(format!("no segment produced the logits `{}`", self.logits_name)));
        }
        Ok(logits)
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
        let scoring = Scoring { scale: at.scale, window: at.window };
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

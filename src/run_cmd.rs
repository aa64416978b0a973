//! `npuc run`: open a bundle, tokenise the prompts with its tokenizer.json, decode on the host
//! executor (greedy, or sampled with a seed) and stream the text as tokens arrive. Several
//! prompts run as concurrent sequences of one KV pool and are printed when all are done.

use anyhow::{anyhow, Context, Result};
use runtime::bundle::{Bundle, CHAT_TEMPLATE_FILE, TOKENIZER_FILE};
use runtime::exec::{Drafter, ExecOptions, Executor, GenerateStats, MtpDrafter, PromptLookup, SpeculationStats};
use runtime::kvcache::{KvStorage, PoolStats};
use runtime::sample::{Sampler, SamplingParams};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

pub struct Options {
    pub bundle: PathBuf,
    pub prompts: Vec<String>,
    /// Prompts given as token ids (`--prompt-ids 1,2,3`), run after the text prompts.
    pub prompt_ids: Vec<String>,
    pub ignore_eos: bool,
    pub prompts_file: Option<PathBuf>,
    pub chat: bool,
    pub stats: bool,
    pub max_tokens: usize,
    pub threads: usize,
    pub sampling: SamplingParams,
    pub kv_storage: KvStorage,
    pub delta_chunk: usize,
    pub prefill_chunk: usize,
    pub json: bool,
    pub backend: crate::run_openvino::BackendArgs,
    pub speculate: SpeculateArgs,
}

/// The speculative decoding options of `npuc run`.
#[derive(clap::Args, Clone, Debug)]
pub struct SpeculateArgs {
    /// Draft tokens and verify several in one step (one pass over the weights): `lookup` drafts
    /// what followed the text's last n-gram earlier in the prompt or the output. Greedy output is
    /// token for token that of decoding without it; sampled output (--temperature > 0) has the
    /// same distribution (a draft is kept with the probability sampling gives it, else replaced
    /// by a draw without it), though not the same tokens for a seed. On --backend openvino (greedy)
    /// the verify steps run in the bundle's static verify blocks (`npuc compile --verify-blocks`).
    /// `mtp` drafts with the multi-token-prediction head the bundle carries (compiled from the
    /// mtp.onnx beside a Qwen3.5-style model), on the host backend.
    #[arg(long, value_parser = ["lookup", "mtp"])]
    pub speculate: Option<String>,
    /// With --speculate: tokens drafted per verify step at most (on --backend openvino also at
    /// most the bundle's largest verify block − 1: 3 for the default blocks 2,4).
    #[arg(long, default_value_t = 4)]
    pub draft_len: usize,
    /// With --speculate lookup: the longest n-gram matched (shorter ones are tried down to
    /// --min-ngram).
    #[arg(long, default_value_t = 3)]
    pub ngram: usize,
    /// With --speculate lookup: the shortest n-gram matched (1 drafts after any repeated token).
    #[arg(long, default_value_t = 1)]
    pub min_ngram: usize,
}

/// The drafter `--speculate` asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Speculation {
    Lookup(PromptLookup),
    /// The bundle's MTP head, drafting up to this many tokens.
    Mtp(usize),
}

impl Speculation {
    /// The prompt-lookup drafter, if that is the one asked for.
    pub(crate) fn lookup(self) -> Option<PromptLookup> {
        match self {
            Speculation::Lookup(l) => Some(l),
            Speculation::Mtp(_) => None,
        }
    }
}

impl SpeculateArgs {
    /// The drafter, when speculation is asked for and possible with `o`'s other options.
    fn drafter(&self, o: &Options, prompts: usize) -> Result<Option<Speculation>> {
        anyhow::ensure!(prompts == 1 || self.speculate.is_none(), "--speculate runs one prompt at a time");
        anyhow::ensure!(
            o.backend.backend != "xrt" || self.speculate.is_none(),
            "--speculate runs on the host and openvino backends"
        );
        self.speculation(&o.backend.backend)
    }

    /// The drafter `--speculate` names, on `backend`.
    pub(crate) fn speculation(&self, backend: &str) -> Result<Option<Speculation>> {
        if self.speculate.as_deref() == Some("mtp") {
            anyhow::ensure!(backend == "host", "--speculate mtp runs on the host backend");
            anyhow::ensure!(self.draft_len > 0, "--draft-len must be positive");
            return Ok(Some(Speculation::Mtp(self.draft_len)));
        }
        Ok(self.lookup()?.map(Speculation::Lookup))
    }

    /// The prompt-lookup drafter, when `--speculate lookup` is given.
    pub(crate) fn lookup(&self) -> Result<Option<PromptLookup>> {
        if self.speculate.is_none() {
            return Ok(None);
        }
        anyhow::ensure!(
            self.speculate.as_deref() == Some("lookup"),
            "--speculate {} is not available here (lookup is)",
            self.speculate.as_deref().unwrap_or_default()
        );
        anyhow::ensure!(self.draft_len > 0 && self.ngram > 0, "--draft-len and --ngram must be positive");
        anyhow::ensure!(
            (1..=self.ngram).contains(&self.min_ngram),
            "--min-ngram must be between 1 and --ngram ({})",
            self.ngram
        );
        Ok(Some(PromptLookup::new(self.ngram, self.min_ngram, self.draft_len)))
    }
}

/// `--kv-dtype`: f32, f16 or int8.
pub fn parse_kv_dtype(s: &str) -> Result<KvStorage, String> {
    match s {
        "f32" => Ok(KvStorage::F32),
        "f16" => Ok(KvStorage::F16),
        "int8" => Ok(KvStorage::Int8),
        other => Err(format!("`{other}` is not a KV storage type (f32, f16 or int8)")),
    }
}

fn kv_json(pool: &PoolStats) -> serde_json::Value {
    json!({
        "appended_bytes": pool.traffic.appended_bytes,
        "copied_bytes": pool.traffic.copied_bytes,
        "attention_read_bytes": pool.traffic.attention_read_bytes,
        "truncated_bytes": pool.traffic.truncated_bytes,
        "pages_in_use": pool.pages_in_use,
        "pages_total": pool.pages_total,
        "page_bytes": pool.page_bytes,
    })
}

/// The recurrent state the sequences hold beside the KV cache (zero for a pure decoder).
fn state_json(executor: &Executor) -> serde_json::Value {
    json!({
        "bytes_per_sequence": executor.state_bytes_per_sequence(),
        "bytes_held": executor.state_bytes_held(),
    })
}

fn state_line(executor: &Executor) -> String {
    format!(
        "recurrent state: {} bytes per sequence, {} bytes held",
        executor.state_bytes_per_sequence(),
        executor.state_bytes_held()
    )
}

fn rates_line(stats: &GenerateStats) -> String {
    format!(
        "prefill {} tokens: {:.1} tok/s (first token after {:.1} ms); decode {} tokens: {:.1} tok/s",
        stats.prompt_tokens,
        stats.prefill_tok_s(),
        stats.prefill_ms,
        stats.generated_tokens.saturating_sub(1),
        stats.decode_tok_s()
    )
}

pub fn run(o: Options) -> Result<ExitCode> {
    let started = std::time::Instant::now();
    let bundle = Bundle::open(&o.bundle, None).with_context(|| format!("opening {}", o.bundle.display()))?;
    let open_ms = started.elapsed().as_secs_f64() * 1e3;
    // The NPU is opened and the bundle's device artifacts read before any prompt work.
    let offload = if o.backend.backend == "xrt" { Some(crate::xdna_run::xrt_offload(&bundle)?) } else { None };
    let text = Text::open(&bundle, &o)?;
    let prompt_ids = prompt_token_ids(&o, &bundle, &text)?;
    let model = bundle.model();
    let mut stop: Vec<u32> = model.stop_token_ids.clone();
    stop.extend(model.eos_token_id);
    if o.ignore_eos {
        stop.clear();
    }
    let drafter = o.speculate.drafter(&o, prompt_ids.len())?;
    if o.backend.backend == "openvino" {
        return run_openvino(&o, &bundle, &text, &prompt_ids, &stop, drafter.and_then(Speculation::lookup));
    }
    let longest = prompt_ids.iter().map(Vec::len).max().unwrap_or(0);
    let options = ExecOptions {
        threads: o.threads,
        max_context: longest + o.max_tokens,
        kv_storage: o.kv_storage,
        sequences: prompt_ids.len(),
        delta_chunk: o.delta_chunk,
        prefill_chunk: o.prefill_chunk,
        ..ExecOptions::default()
    };
    let load_started = std::time::Instant::now();
    let mut mtp = match drafter {
        Some(Speculation::Mtp(draft_len)) => Some(mtp_drafter(&o.bundle, &bundle, options.clone(), draft_len)?),
        _ => None,
    };
    let mut executor =
        Executor::new(&bundle, options).with_context(|| format!("loading the program of {}", o.bundle.display()))?;
    if let Some(offload) = offload {
        executor.set_offload(offload).with_context(|| format!("offloading {}'s projections", o.bundle.display()))?;
    }
    let load_ms = load_started.elapsed().as_secs_f64() * 1e3;
    // Sequence i samples with seed + i, so that equal prompts still differ when sampling.
    let mut samplers = (0..prompt_ids.len() as u64)
        .map(|i| Sampler::new(SamplingParams { seed: o.sampling.seed.wrapping_add(i), ..o.sampling }))
        .collect::<Result<Vec<_>, _>>()?;
    if prompt_ids.len() > 1 {
        return run_many(&o, &text, &mut executor, &prompt_ids, &stop, &mut samplers);
    }
    let prompt_ids = &prompt_ids[0];
    let mut lookup = drafter.and_then(Speculation::lookup);
    let drafter: Option<&mut dyn Drafter> = match (&mut lookup, &mut mtp) {
        (Some(l), _) => Some(l),
        (_, Some(m)) => Some(m),
        _ => None,
    };
    let decoding = Decoding { sampler: &mut samplers[0], drafter };
    let (tokens, stats, spec) = generate_streaming(&o, &text, &mut executor, prompt_ids, &stop, decoding)?;
    if let Some(e) = mtp.as_mut().and_then(MtpDrafter::take_error) {
        return Err(anyhow!(e).context("the MTP drafter failed (the text above is plain decoding's from then on)"));
    }
    let generation = Generation { prompt_tokens: prompt_ids.len(), tokens: &tokens, stats: &stats, spec };
    report_one(&o, &text.decode(&tokens)?, generation, &executor, Timings { open_ms, load_ms })?;
    Ok(ExitCode::SUCCESS)
}

/// One prompt on an intel-npu bundle's IR through OpenVINO.
fn run_openvino(
    o: &Options,
    bundle: &Bundle,
    text: &Text,
    prompt_ids: &[Vec<u32>],
    stop: &[u32],
    drafter: Option<PromptLookup>,
) -> Result<ExitCode> {
    anyhow::ensure!(prompt_ids.len() == 1, "--backend openvino runs one prompt at a time");
    anyhow::ensure!(o.sampling.temperature == 0.0, "--backend openvino decodes greedily (--temperature 0)");
    let request = crate::run_openvino::Request {
        bundle,
        text,
        prompt_ids: &prompt_ids[0],
        stop,
        max_tokens: o.max_tokens,
        threads: o.threads,
        json: o.json,
        drafter,
    };
    crate::run_openvino::run(&o.backend, request)
}

/// The bundle's MTP head as a drafter, on an executor of its own.
pub(crate) fn mtp_drafter<'b>(
    path: &std::path::Path,
    bundle: &'b Bundle,
    options: ExecOptions,
    draft_len: usize,
) -> Result<MtpDrafter<'b>> {
    let head = Executor::new_drafter(bundle, options)
        .with_context(|| format!("loading the MTP head of {} (--speculate mtp)", path.display()))?;
    Ok(MtpDrafter::new(head, draft_len)?)
}

/// How one prompt is decoded: token by token, or with drafts verified several at a time.
struct Decoding<'s> {
    sampler: &'s mut Sampler,
    drafter: Option<&'s mut dyn Drafter>,
}

/// Generates for one prompt, printing the text as it grows (unless `--json`).
fn generate_streaming(
    o: &Options,
    text: &Text,
    executor: &mut Executor,
    prompt_ids: &[u32],
    stop: &[u32],
    decoding: Decoding,
) -> Result<(Vec<u32>, GenerateStats, Option<SpeculationStats>)> {
    let mut generated: Vec<u32> = Vec::new();
    let mut shown_chars = 0usize;
    let mut stdout = std::io::stdout().lock();
    let mut stream_error: Option<anyhow::Error> = None;
    let on_token = |token| {
        generated.push(token);
        if o.json || stream_error.is_some() {
            return;
        }
        // Decoding everything generated so far and printing what is new keeps characters that
        // span several tokens whole.
        match text.decode(&generated) {
            Ok(text) => {
                if let Some(new) = text.get(shown_chars..) {
                    let _ = stdout.write_all(new.as_bytes()).and_then(|_| stdout.flush());
                    shown_chars = text.len();
                }
            }
            Err(e) => stream_error = Some(e),
        }
    };
    let (tokens, stats, spec) = match decoding.drafter {
        Some(d) => {
            let (tokens, stats, spec) =
                executor.generate_speculative(prompt_ids, o.max_tokens, stop, d, decoding.sampler, on_token)?;
            (tokens, stats, Some(spec))
        }
        None => {
            let (tokens, stats) = executor.generate(prompt_ids, o.max_tokens, stop, decoding.sampler, on_token)?;
            (tokens, stats, None)
        }
    };
    if !o.json {
        let _ = writeln!(std::io::stdout());
    }
    match stream_error {
        Some(e) => Err(e),
        None => Ok((tokens, stats, spec)),
    }
}

/// What one prompt's generation gave.
struct Generation<'g> {
    prompt_tokens: usize,
    tokens: &'g [u32],
    stats: &'g GenerateStats,
    spec: Option<SpeculationStats>,
}

/// Speculation's counters: verify steps, drafts, acceptance, and tokens per pass over the
/// weights (each decode step and each verify step reads every weight once).
pub(crate) fn speculation_json(spec: &SpeculationStats, generated: usize) -> serde_json::Value {
    json!({
        "verify_steps": spec.verify_steps,
        "drafted": spec.drafted,
        "accepted": spec.accepted,
        "acceptance": spec.acceptance(),
        "tokens_per_weight_pass": tokens_per_pass(spec, generated),
    })
}

/// Decoded tokens (those after the prefill's) per verify step.
pub(crate) fn tokens_per_pass(spec: &SpeculationStats, generated: usize) -> f64 {
    generated.saturating_sub(1) as f64 / spec.verify_steps.max(1) as f64
}

/// Speculation's counters in the text summary.
pub(crate) fn speculation_line(spec: &SpeculationStats, generated: usize) -> String {
    format!(
        "speculation: {} verify steps, {} of {} drafts accepted ({:.0} %), {:.2} tokens per pass over the weights",
        spec.verify_steps,
        spec.accepted,
        spec.drafted,
        100.0 * spec.acceptance(),
        tokens_per_pass(spec, generated)
    )
}

/// How long opening the bundle and loading its program took.
#[derive(Clone, Copy)]
struct Timings {
    open_ms: f64,
    load_ms: f64,
}

/// The summary of one prompt's generation: JSON, or rates (and `--stats`) on stderr.
fn report_one(
    o: &Options,
    text: &str,
    g: Generation,
    executor: &Executor,
    Timings { open_ms, load_ms }: Timings,
) -> Result<()> {
    let pool = executor.cache().pool_stats();
    if o.json {
        let mut summary = json!({
            "prompt_tokens": g.prompt_tokens,
            "tokens": g.tokens,
            "text": text,
            "ttft_ms": g.stats.prefill_ms,
            "prefill_tok_s": g.stats.prefill_tok_s(),
            "decode_tok_s": g.stats.decode_tok_s(),
        });
        if let Some(spec) = &g.spec {
            summary["speculation"] = speculation_json(spec, g.tokens.len());
        }
        if o.stats {
            summary["kv"] = kv_json(&pool);
            summary["open_ms"] = json!(open_ms);
            summary["load_ms"] = json!(load_ms);
            summary["wgemm_bytes_packed_at_load"] = json!(executor.wgemm_bytes_packed_at_load());
            summary["qgemm_bytes_packed_at_load"] = json!(executor.qgemm_bytes_packed_at_load());
            summary["state"] = state_json(executor);
        }
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    eprintln!("{}", rates_line(g.stats));
    if let Some(spec) = &g.spec {
        eprintln!("{}", speculation_line(spec, g.tokens.len()));
    }
    if o.stats {
        eprintln!("kv cache: {pool}");
        eprintln!("{}", state_line(executor));
        eprintln!(
            "bundle opened and verified in {open_ms:.1} ms, program loaded in {load_ms:.1} ms; weights packed at load: WGemm {:.1} MB, QGemm {:.1} MB",
            executor.wgemm_bytes_packed_at_load() as f64 / 1e6,
            executor.qgemm_bytes_packed_at_load() as f64 / 1e6
        );
    }
    Ok(())
}

/// Several prompts as concurrent sequences: each one's text once all are done, or
/// `{"sequences": [...]}` with `--json`. Fails (after printing) when any sequence failed.
fn run_many(
    o: &Options,
    text_of: &Text,
    executor: &mut Executor,
    prompt_ids: &[Vec<u32>],
    stop: &[u32],
    samplers: &mut [Sampler],
) -> Result<ExitCode> {
    let outputs = executor.generate_many(prompt_ids, o.max_tokens, stop, samplers, |_, _| {});
    let pool = executor.cache().pool_stats();
    let mut failed = 0;
    let mut sequences = Vec::with_capacity(outputs.len());
    for (i, out) in outputs.iter().enumerate() {
        let text = text_of.decode(&out.tokens).with_context(|| format!("sequence {}", i + 1))?;
        failed += usize::from(out.error.is_some());
        if o.json {
            sequences.push(json!({
                "prompt_tokens": out.stats.prompt_tokens,
                "shared_prefix_tokens": out.shared_prefix_tokens,
                "tokens": out.tokens,
                "text": text,
                "ttft_ms": out.stats.prefill_ms,
                "prefill_tok_s": out.stats.prefill_tok_s(),
                "decode_tok_s": out.stats.decode_tok_s(),
                "error": out.error.as_ref().map(|e| e.to_string()),
            }));
        } else {
            println!("[{}] {text}", i + 1);
            eprintln!("[{}] {} (prefix of {} tokens shared)", i + 1, rates_line(&out.stats), out.shared_prefix_tokens);
            if let Some(e) = &out.error {
                eprintln!("[{}] error: {e}", i + 1);
            }
        }
    }
    if o.json {
        let mut summary = json!({ "sequences": sequences });
        if o.stats {
            summary["kv"] = kv_json(&pool);
            summary["state"] = state_json(executor);
        }
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else if o.stats {
        eprintln!("kv cache: {pool}");
        eprintln!("{}", state_line(executor));
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} sequences failed", outputs.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// The prompt as one user message through the bundle's chat template, with the generation prompt.
pub(crate) fn render_chat(bundle: &Bundle, prompt: &str) -> Result<String> {
    let bytes = bundle.read_file(CHAT_TEMPLATE_FILE).context("--chat needs the bundle's chat template")?;
    let template = String::from_utf8(bytes).map_err(|_| anyhow!("{CHAT_TEMPLATE_FILE} is not UTF-8"))?;
    let mut env = minijinja::Environment::new();
    env.add_template("chat", &template).map_err(|e| anyhow!("{CHAT_TEMPLATE_FILE}: {e}"))?;
    let messages = vec![minijinja::context! { role => "user", content => prompt }];
    env.get_template("chat")
        .and_then(|t| t.render(minijinja::context! { messages => messages, add_generation_prompt => true }))
        .map_err(|e| anyhow!("rendering {CHAT_TEMPLATE_FILE}: {e}"))
}

/// Turns generated ids into text: the bundle's tokenizer, or the ids themselves (space-separated)
/// for a bundle without one run with `--prompt-ids`.
pub struct Text {
    tokenizer: Option<tokenizers::Tokenizer>,
}

impl Text {
    /// The bundle's tokenizer; required unless every prompt is given as ids.
    fn open(bundle: &Bundle, o: &Options) -> Result<Text> {
        let needed = !o.prompts.is_empty() || o.prompts_file.is_some();
        let bytes = match bundle.read_file(TOKENIZER_FILE) {
            Ok(b) => b,
            Err(_) if !needed => return Ok(Text { tokenizer: None }),
            Err(e) => {
                return Err(anyhow!(e).context(format!(
                    "{} has no usable {TOKENIZER_FILE} (compile with --tokenizer, or give --prompt-ids)",
                    o.bundle.display()
                )))
            }
        };
        let tokenizer =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| anyhow!("reading {TOKENIZER_FILE}: {e}"))?;
        Ok(Text { tokenizer: Some(tokenizer) })
    }

    /// The bundle's tokenizer, which `path`'s text needs.
    pub(crate) fn required(bundle: &Bundle, path: &std::path::Path) -> Result<Text> {
        let bytes = bundle
            .read_file(TOKENIZER_FILE)
            .with_context(|| format!("{} is text: the bundle needs its {TOKENIZER_FILE}", path.display()))?;
        let tokenizer =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| anyhow!("reading {TOKENIZER_FILE}: {e}"))?;
        Ok(Text { tokenizer: Some(tokenizer) })
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.tokenizer {
            Some(t) => t.decode(ids, true).map_err(|e| anyhow!("decoding generated tokens: {e}")),
            None => Ok(ids.iter().map(|i| format!("{i} ")).collect()),
        }
    }

    /// `text` as ids, with the special tokens the tokenizer adds (a BOS, for some) unless the
    /// text is a rendered chat template, which spells its own.
    pub(crate) fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let t = self.tokenizer.as_ref().ok_or_else(|| anyhow!("the bundle has no tokenizer"))?;
        Ok(t.encode(text, add_special).map_err(|e| anyhow!("{e}"))?.get_ids().to_vec())
    }
}

/// The prompts as token ids: text prompts (through the chat template with `--chat`) tokenised,
/// then `--prompt-ids` lists.
fn prompt_token_ids(o: &Options, bundle: &Bundle, text: &Text) -> Result<Vec<Vec<u32>>> {
    let mut prompts = o.prompts.clone();
    if let Some(file) = &o.prompts_file {
        let body = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        prompts.extend(body.lines().filter(|l| !l.trim().is_empty()).map(str::to_string));
    }
    anyhow::ensure!(
        !prompts.is_empty() || !o.prompt_ids.is_empty(),
        "no prompt: give --prompt (repeatable), --prompts-file or --prompt-ids"
    );
    let mut out = Vec::with_capacity(prompts.len() + o.prompt_ids.len());
    for (i, prompt) in prompts.iter().enumerate() {
        let text_in = if o.chat { render_chat(bundle, prompt)? } else { prompt.clone() };
        let ids = text.encode(&text_in, !o.chat).with_context(|| format!("tokenising prompt {}", i + 1))?;
        anyhow::ensure!(!ids.is_empty(), "prompt {} is empty after tokenisation", i + 1);
        out.push(ids);
    }
    for list in &o.prompt_ids {
        out.push(parse_ids(list)?);
    }
    Ok(out)
}

/// `--prompt-ids 1,2,3`: a non-empty comma-separated list of token ids.
pub fn parse_ids(list: &str) -> Result<Vec<u32>> {
    let ids = list
        .split(',')
        .map(|t| {
            t.trim().parse::<u32>().map_err(|_| anyhow!("--prompt-ids `{list}`: `{}` is not a token id", t.trim()))
        })
        .collect::<Result<Vec<u32>>>()?;
    anyhow::ensure!(!ids.is_empty(), "--prompt-ids is empty");
    Ok(ids)
}

//! `npuc`: the command-line driver. Thin by design: argument parsing, progress and printing; the
//! work lives in the library crates.

mod bench_cmd;
mod compile;
mod explore;
mod inspect;
mod intel;
mod passes_cmd;
mod run_cmd;
mod run_openvino;
mod targets;
mod xdna;
mod xdna_run;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "npuc",
    version,
    about = "Compile ONNX decoder language models to fused NPU programs",
    long_about = "npuc reads the ONNX graphs real exporters produce (torch/optimum float graphs, \
onnxruntime-genai INT4 graphs, QDQ A8W8 graphs), folds their shape arithmetic, and lowers them \
to fused NPU programs.\n\nStart with `npuc inspect model.onnx` to see what npuc makes of a model."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what npuc makes of an ONNX model: opsets, ops before and after folding, GEMM shapes,
    /// weights by dtype, inputs and outputs with symbolic dims.
    #[command(long_about = "Import an ONNX model and report what the import found and did.\n\n\
Import checks the graph (vocabulary, arity, names, order, dtypes, shapes), resolves external data \
inside the model's folder, infers symbolic shapes and folds constants and shape arithmetic. \
The report lists every op outside npuc's vocabulary at once (and exits non-zero), otherwise \
opsets, node counts by domain::op before and after folding, the GEMM shapes with counts, \
weight bytes by dtype, and the graph's inputs and outputs with their symbolic dims.\n\n\
Examples:\n  npuc inspect model.onnx\n  npuc inspect model.onnx --json | jq .after.nodes\n  \
npuc inspect model.onnx --print   # the imported graph, one node per line")]
    Inspect {
        /// The model file (`.onnx`); external data is read from its folder.
        model: PathBuf,
        /// Print the report as JSON on stdout.
        #[arg(long)]
        json: bool,
        /// Also print the imported graph in npuc's text form.
        #[arg(long)]
        print: bool,
    },
    /// Compile a model for a target into a bundle directory (NAME.npub).
    #[command(long_about = "Import a model, run the target's pass pipeline, and write the bundle: \
manifest.json (format and compiler versions, target, model configuration read off the program, \
the program, every file with its size and BLAKE3 digest), weights.safetensors (every weight the program \
reads, once; 64-byte aligned), tokenizer.json and chat_template.jinja (from --tokenizer or the \
model's folder).\n\nExamples:\n  npuc compile model.onnx --target cpu -o model.npub\n  \
npuc compile model.onnx -o model.npub --tokenizer tokenizer.json --overwrite --json")]
    Compile {
        /// The model file (`.onnx`).
        model: PathBuf,
        /// The target the bundle runs on.
        #[arg(long, default_value = "cpu", value_parser = clap::builder::PossibleValuesParser::new(targets::possible_values()))]
        target: String,
        /// The bundle directory to write.
        #[arg(short, long)]
        output: PathBuf,
        /// tokenizer.json to include (default: the one next to the model, if any).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// Replace an existing bundle at the output path.
        #[arg(long)]
        overwrite: bool,
        /// Return only once the bundle is on the disk (fsync), so it survives a power loss right
        /// after the compile. Without it the kernel writes it out in its own time, and a bundle
        /// torn by a power loss is refused at load by its digests.
        #[arg(long)]
        sync: bool,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        intel: intel::IntelArgs,
        /// XDNA device for --target xdna: npu1 (Phoenix/Hawk Point) or npu2 (Strix).
        #[arg(long)]
        device: Option<String>,
        /// Leave out the MTP head found beside the model (mtp.onnx); `npuc run --speculate mtp`
        /// needs it.
        #[arg(long)]
        no_drafter: bool,
    },
    /// Run a target's pass pipeline and print the graph after every pass.
    #[command(long_about = "Import a model and run the pass pipeline of a target, printing the graph after \
every pass in npuc's text form (one node per line) and a one-line summary per pass: nodes before \
and after, time, and what the pass reports (e-graph sizes and stop reasons for `saturate`).\n\n\
Examples:\n  npuc passes model.onnx --target cpu --stop-after saturate\n  \
npuc passes model.onnx --target xdna --dump-dir out/   # writes out/00-canonicalize.ir, ...\n  \
npuc passes model.onnx --json | jq '.passes[] | {name, nodes_after}'")]
    Passes {
        /// The model file (`.onnx`).
        model: PathBuf,
        /// The target whose pipeline runs.
        #[arg(long, default_value = "cpu", value_parser = clap::builder::PossibleValuesParser::new(targets::possible_values()))]
        target: String,
        /// Stop after this pass.
        #[arg(long)]
        stop_after: Option<String>,
        /// Write the graph after each pass to DIR/NN-<pass>.ir instead of printing it.
        #[arg(long)]
        dump_dir: Option<PathBuf>,
        /// Print the per-pass summaries (and the rule report) as JSON, without the graphs.
        #[arg(long)]
        json: bool,
        /// Run the final program with the reference evaluator on a test case folder (input_N.pb,
        /// output_N.pb as ONNX's test data) and report each output's error against the expected one.
        #[arg(long, value_name = "CASE_DIR")]
        check: Option<PathBuf>,
        /// With --check: evaluate as an fp16 device would (fp16 storage and arithmetic, denormals
        /// flushed), to see where the program leaves fp16's range.
        #[arg(long, requires = "check")]
        fp16_sim: bool,
    },
    /// Watch rewrite rules fire on a model's e-graph, add your own, see what was not fused and why.
    #[command(long_about = "Build the e-graph of a model (or of one decoder layer), run rule families on it \
and report, per iteration, the e-graph size and how often each rule applied, and the stop reason.\n\n\
User rules (--rules FILE): one per line, `name: LHS => RHS [if COND[, COND...]]`, LHS and RHS egg \
patterns over npuc's ops (`(Mul ?x (Sigmoid ?x))`, `npuc::Silu`, `proj0`, `_` for an absent input). \
Conditions: is_scalar_const(?v, VALUE), is_scalar(?v), is_constant(?v), is_float(?v), \
is_last_axis(?axes, ?x). Lines starting with # are comments.\n\n\
Examples:\n  npuc explore model.onnx --family rmsnorm,silu-gate --layer 0\n  \
npuc explore model.onnx --why                 # every candidate group not fused, with the reason\n  \
npuc explore model.onnx --layer 0 --explain /model/layers.0/mlp/Mul_output_0\n  \
npuc explore model.onnx --layer 0 --dot layer0.dot")]
    Explore {
        /// The model file (`.onnx`).
        model: PathBuf,
        /// Comma-separated rule families to run (default: all).
        #[arg(long, value_delimiter = ',')]
        family: Vec<String>,
        /// A file of extra rules (see above).
        #[arg(long)]
        rules: Option<PathBuf>,
        /// Restrict to one decoder layer (nodes named `.../layers.N/...`).
        #[arg(long)]
        layer: Option<usize>,
        /// Show the rewrite chain that made the named value what the extracted program computes.
        #[arg(long)]
        explain: Option<String>,
        /// List every candidate group a rule declined, with the reason.
        #[arg(long)]
        why: bool,
        /// Write the saturated e-graph as Graphviz (and SVG next to it when `dot` is installed).
        #[arg(long)]
        dot: Option<PathBuf>,
        /// Write an HTML report: iterations, declined groups, the extracted program, and the
        /// e-graph drawing when graphviz is installed.
        #[arg(long)]
        html: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Measure prefill and decode rates of a bundle (host executor or OpenVINO; median/min/max).
    #[command(
        long_about = "Run a bundle with a synthetic prompt (or a text file's, --prompt-file), several times, and report \
prefill and decode tokens per second as median, min and max, and the greedy tokens of the last run \
(the same on every backend that computes the same numbers). With --speculate, every repetition runs \
plain and speculative greedy decoding back to back: both rates, their ratio, the drafts kept and the \
tokens per weight pass (the two must give the same tokens).\n\nExamples:\n  \
npuc bench model.npub --prompt-len 64 --gen-len 64 --threads 2\n  npuc bench model.npub --json\n  \
npuc bench model.npub --prompt-file passage.txt --chat --speculate lookup --draft-len 4\n  \
npuc bench intel.npub --backend openvino --device CPU --threads 2"
    )]
    Bench(bench_cmd::Options),
    /// Generate text with a bundle on the host executor: greedy or sampled, streamed as it comes.
    #[command(long_about = "Open a bundle (verifying it), tokenise the prompt with the bundle's \
tokenizer.json, prefill it, and decode on the host executor with a paged KV cache (greedy, or \
sampled with --temperature/--top-k/--top-p from --seed), printing the text as tokens arrive. \
Generation stops at the model's stop tokens or after --max-tokens tokens; a last line on stderr \
gives prefill and decode tokens per second. Several prompts (--prompt repeated, --prompts-file) \
run as concurrent sequences sharing one KV pool (and the pages of a common prefix); their texts \
are printed when all are done.\n\n\
Examples:\n  npuc run model.npub --prompt \"The capital of France is\"\n  \
npuc run model.npub --prompt \"Once upon a time\" --max-tokens 64 --threads 2 --json")]
    Run {
        /// The bundle directory (NAME.npub).
        bundle: PathBuf,
        /// The prompt text; repeat to run several prompts as concurrent sequences.
        #[arg(long, required_unless_present_any = ["prompts_file", "prompt_ids"])]
        prompt: Vec<String>,
        /// A prompt as comma-separated token ids (`--prompt-ids 1,17,250`), for models without a
        /// tokenizer and for comparisons with other runtimes; repeatable. Without a tokenizer the
        /// output is the generated ids.
        #[arg(long)]
        prompt_ids: Vec<String>,
        /// Generate --max-tokens tokens whatever they are (no stop at the end-of-sequence token).
        #[arg(long)]
        ignore_eos: bool,
        /// A file of prompts, one per non-empty line, run as concurrent sequences (after any
        /// --prompt).
        #[arg(long)]
        prompts_file: Option<PathBuf>,
        /// Treat the prompt as a user message and apply the bundle's chat template.
        #[arg(long)]
        chat: bool,
        /// After generating, print the KV cache's counters (bytes appended, copied, read; pages).
        #[arg(long)]
        stats: bool,
        /// Most tokens to generate.
        #[arg(long, default_value_t = 128)]
        max_tokens: usize,
        /// Threads of the kernels, the caller included.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Sampling temperature; 0 (the default) is greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Sample among the K most likely tokens only (0: all).
        #[arg(long, default_value_t = 0)]
        top_k: usize,
        /// Sample among the most likely tokens whose probability mass reaches P (1: all).
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        /// Seed of the sampler (prompt i of several uses seed + i); same seed, same tokens.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// How the KV cache stores K and V: f32, f16 or int8 (one scale per token and KV head).
        #[arg(long, default_value = "f32", value_parser = run_cmd::parse_kv_dtype)]
        kv_dtype: runtime::kvcache::KvStorage,
        /// Hybrid models: tokens a prefill's gated delta-rule layer takes at once (the chunked
        /// form: one pass over the state per chunk); 0 or 1 runs token by token.
        #[arg(long, default_value_t = runtime::exec::DEFAULT_DELTA_CHUNK)]
        delta_chunk: usize,
        /// Rows a prompt's prefill runs at once: longer prompts run as several steps, each
        /// attending to the cache the earlier ones wrote, so memory stays bounded; 0 runs the
        /// whole prompt in one step.
        #[arg(long, default_value_t = runtime::exec::DEFAULT_PREFILL_CHUNK)]
        prefill_chunk: usize,
        /// Print {tokens, text, ttft_ms, prefill_tok_s, decode_tok_s} as JSON instead of streaming
        /// ({"sequences": [...]} for several prompts).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        backend: run_openvino::BackendArgs,
        #[command(flatten)]
        speculate: run_cmd::SpeculateArgs,
    },
}

fn main() -> ExitCode {
    exit_code(dispatch(Cli::parse().command))
}

/// The exit code of a command, its error printed with its causes.
fn exit_code(result: anyhow::Result<ExitCode>) -> ExitCode {
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::FAILURE
    })
}

fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Inspect { model, json, print } => inspect::run(&model, json, print),
        Command::Compile { model, target, output, tokenizer, overwrite, sync, json, intel, device, no_drafter } => {
            let args = targets::TargetArgs { intel: Some(intel), device };
            let drafter = !no_drafter;
            compile::run(compile::Options { model, target, output, tokenizer, overwrite, sync, json, drafter, args })
        }
        Command::Passes { model, target, stop_after, dump_dir, json, check, fp16_sim } => {
            passes_cmd::run(passes_cmd::Options {
                model: &model,
                target: &target,
                stop_after: stop_after.as_deref(),
                dump_dir: dump_dir.as_deref(),
                json,
                check: check.as_deref(),
                fp16_sim,
            })
        }
        Command::Explore { model, family, rules, layer, explain, why, dot, html, json } => {
            explore::run(explore::Options { model, families: family, rules, layer, explain, why, dot, html, json })
        }
        Command::Bench(options) => bench_cmd::run(options),
        Command::Run {
            bundle,
            prompt,
            prompt_ids,
            ignore_eos,
            prompts_file,
            chat,
            stats,
            max_tokens,
            threads,
            temperature,
            top_k,
            top_p,
            seed,
            kv_dtype,
            delta_chunk,
            prefill_chunk,
            json,
            backend,
            speculate,
        } => run_cmd::run(run_cmd::Options {
            bundle,
            prompts: prompt,
            prompt_ids,
            ignore_eos,
            prompts_file,
            chat,
            stats,
            max_tokens,
            threads,
            sampling: runtime::sample::SamplingParams { temperature, top_k, top_p, seed },
            kv_storage: kv_dtype,
            delta_chunk,
            prefill_chunk,
            json,
            backend,
            speculate,
        }),
    }
}

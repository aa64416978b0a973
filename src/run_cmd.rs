//! `npuc run`: open a bundle, tokenise the prompt with its tokenizer.json, decode greedily on the
//! host executor and stream the text as tokens arrive.

use anyhow::{anyhow, Context, Result};
use runtime::bundle::{Bundle, CHAT_TEMPLATE_FILE, TOKENIZER_FILE};
use runtime::exec::{ExecOptions, Executor};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

pub struct Options {
    pub bundle: PathBuf,
    pub prompt: String,
    pub chat: bool,
    pub stats: bool,
    pub max_tokens: usize,
    pub threads: usize,
    pub json: bool,
}

pub fn run(o: Options) -> Result<ExitCode> {
    let bundle = Bundle::open(&o.bundle, None).with_context(|| format!("opening {}", o.bundle.display()))?;
    let tokenizer_bytes = bundle
        .read_file(TOKENIZER_FILE)
        .with_context(|| format!("{} has no usable {TOKENIZER_FILE}", o.bundle.display()))?;
    let tokenizer =
        tokenizers::Tokenizer::from_bytes(&tokenizer_bytes).map_err(|e| anyhow!("reading {TOKENIZER_FILE}: {e}"))?;
    let text_in = if o.chat { render_chat(&bundle, &o.prompt)? } else { o.prompt.clone() };
    let encoding = tokenizer.encode(text_in.as_str(), true).map_err(|e| anyhow!("tokenising the prompt: {e}"))?;
    let prompt_ids = encoding.get_ids().to_vec();
    if prompt_ids.is_empty() {
        anyhow::bail!("the prompt is empty after tokenisation");
    }
    let model = bundle.model();
    let mut stop: Vec<u32> = model.stop_token_ids.clone();
    stop.extend(model.eos_token_id);

    let options = ExecOptions { threads: o.threads, max_context: prompt_ids.len() + o.max_tokens, isa: None };
    let mut executor =
        Executor::new(&bundle, options).with_context(|| format!("loading the program of {}", o.bundle.display()))?;

    let mut generated: Vec<u32> = Vec::new();
    let mut shown_chars = 0usize;
    let mut stdout = std::io::stdout().lock();
    let mut stream_error: Option<anyhow::Error> = None;
    let (tokens, stats) = executor.generate_greedy(&prompt_ids, o.max_tokens, &stop, |token| {
        generated.push(token);
        if o.json || stream_error.is_some() {
            return;
        }
        // Decoding everything generated so far and printing what is new keeps characters that
        // span several tokens whole.
        match tokenizer.decode(&generated, true) {
            Ok(text) => {
                if let Some(new) = text.get(shown_chars..) {
                    let _ = stdout.write_all(new.as_bytes()).and_then(|_| stdout.flush());
                    shown_chars = text.len();
                }
            }
            Err(e) => stream_error = Some(anyhow!("decoding generated tokens: {e}")),
        }
    })?;
    if let Some(e) = stream_error {
        return Err(e);
    }
    let text = tokenizer.decode(&tokens, true).map_err(|e| anyhow!("decoding generated tokens: {e}"))?;
    let pool = executor.cache().pool_stats();
    if o.json {
        let mut summary = json!({
            "prompt_tokens": prompt_ids.len(),
            "tokens": tokens,
            "text": text,
            "ttft_ms": stats.prefill_ms,
            "prefill_tok_s": stats.prefill_tok_s(),
            "decode_tok_s": stats.decode_tok_s(),
        });
        if o.stats {
            summary["kv"] = json!({
                "appended_bytes": pool.traffic.appended_bytes,
                "copied_bytes": pool.traffic.copied_bytes,
                "attention_read_bytes": pool.traffic.attention_read_bytes,
                "pages_in_use": pool.pages_in_use,
                "pages_total": pool.pages_total,
                "page_bytes": pool.page_bytes,
            });
        }
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        let _ = writeln!(stdout);
        eprintln!(
            "prefill {} tokens: {:.1} tok/s (first token after {:.1} ms); decode {} tokens: {:.1} tok/s",
            stats.prompt_tokens,
            stats.prefill_tok_s(),
            stats.prefill_ms,
            stats.generated_tokens.saturating_sub(1),
            stats.decode_tok_s()
        );
        if o.stats {
            eprintln!("kv cache: {pool}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The prompt as one user message through the bundle's chat template, with the generation prompt.
fn render_chat(bundle: &Bundle, prompt: &str) -> Result<String> {
    let bytes = bundle.read_file(CHAT_TEMPLATE_FILE).context("--chat needs the bundle's chat template")?;
    let template = String::from_utf8(bytes).map_err(|_| anyhow!("{CHAT_TEMPLATE_FILE} is not UTF-8"))?;
    let mut env = minijinja::Environment::new();
    env.add_template("chat", &template).map_err(|e| anyhow!("{CHAT_TEMPLATE_FILE}: {e}"))?;
    let messages = vec![minijinja::context! { role => "user", content => prompt }];
    env.get_template("chat")
        .and_then(|t| t.render(minijinja::context! { messages => messages, add_generation_prompt => true }))
        .map_err(|e| anyhow!("rendering {CHAT_TEMPLATE_FILE}: {e}"))
}

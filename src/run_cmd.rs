//! `npuc run`: open a bundle, tokenise the prompt with its tokenizer.json, decode greedily on the
//! host executor and stream the text as tokens arrive.

use anyhow::{anyhow, Context, Result};
use runtime::bundle::{Bundle, TOKENIZER_FILE};
use runtime::exec::{ExecOptions, Executor};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

pub struct Options {
    pub bundle: PathBuf,
    pub prompt: String,
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
    let encoding = tokenizer.encode(o.prompt.as_str(), true).map_err(|e| anyhow!("tokenising the prompt: {e}"))?;
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
    if o.json {
        let summary = json!({
            "tokens": tokens,
            "text": text,
            "ttft_ms": stats.prefill_ms,
            "prefill_tok_s": stats.prefill_tok_s(),
            "decode_tok_s": stats.decode_tok_s(),
        });
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
    }
    Ok(ExitCode::SUCCESS)
}

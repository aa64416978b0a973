//! `npuc`: the command-line driver. Thin by design: argument parsing, progress and printing; the
//! work lives in the library crates.

mod inspect;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect { model, json, print } => inspect::run(&model, json, print),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

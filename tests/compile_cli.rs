//! `npuc compile`: the bundle it writes opens with the runtime's verifying loader, carries the
//! model's configuration, the program the pipeline produced, and every weight the program reads,
//! once and byte for byte.

mod common;

use runtime::bundle::Bundle;
use std::process::Command;

fn npuc(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_npuc")).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn compile(name: &str, dir: &std::path::Path) -> Bundle {
    let out = dir.join(format!("{name}.npub"));
    let model = common::fixture(name).join("model.onnx");
    let (ok, _, err) = npuc(&["compile", model.to_str().unwrap(), "--target", "cpu", "-o", out.to_str().unwrap()]);
    assert!(ok, "{err}");
    Bundle::open(&out, Some("cpu")).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn bundles_carry_config_program_and_weights() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["llama-optimum", "qwen3-builder-int4", "phi3-optimum", "smollm2-builder-int4"] {
        let b = compile(name, tmp.path());
        // What the bundle says of the model is what the checkpoint's config.json says.
        let m = common::config(name);
        let cfg = b.model();
        assert_eq!(
            (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate, cfg.vocab),
            (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.intermediate, m.vocab),
            "{name}"
        );
        assert_eq!(cfg.tied_embeddings, m.tied_embeddings, "{name}");
        assert!(
            (cfg.rms_eps - m.rms_eps).abs() < 1e-9 * m.rms_eps.max(1.0),
            "{name}: {} vs {}",
            cfg.rms_eps,
            m.rms_eps
        );

        // The program is the pipeline's output.
        let g = frontend::import_file(&common::fixture(name).join("model.onnx")).unwrap().graph;
        let t = passes::targets::target("cpu").unwrap();
        let compiled = passes::driver::run(&t.pipeline(), g, None, |_, _| {}).unwrap().graph;
        let program = b.program();
        assert_eq!(program.format, "npuc-program/1");
        assert_eq!(program.nodes.len(), compiled.nodes.len(), "{name}");

        // Every weight the program reads is stored once, with the model's bytes.
        let names: std::collections::BTreeSet<String> =
            program.weight_names().into_iter().map(str::to_string).collect();
        // WGemm and float MatMul weights are stored packed (runtime::exec::packed); the weights they
        // were packed from are named in the packed tensors' layout and not stored again.
        let mut packed_from = std::collections::BTreeSet::new();
        let mut packed_tensors = 0;
        for t in b.tensors().filter(|t| t.name.contains(".wgemm.") || t.name.ends_with(".gemm.panels")) {
            packed_tensors += 1;
            if let Some(layout) = t.metadata {
                for key in ["source", "scales", "zero_points"] {
                    packed_from.extend(layout[key].as_str().map(str::to_string));
                }
            }
        }
        // The panels hold the model's own weight in the f32 GEMM's packed layout.
        let weights_by_name: std::collections::HashMap<&str, &ir::Weight> =
            compiled.weights.iter().map(|(_, w)| (w.name.as_str(), w)).collect();
        for t in b.tensors().filter(|t| t.name.ends_with(".gemm.panels")) {
            let source = t.metadata.unwrap()["source"].as_str().unwrap().to_string();
            let w = weights_by_name[source.as_str()];
            let floats: Vec<f32> = w.bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            let want = runtime::kernels::gemm::pack_f32_panels(&floats, w.shape[0], w.shape[1]);
            let got: Vec<f32> = t.bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            assert!(got == want, "{name}: panels of {source}");
        }
        if name == "llama-optimum" {
            // 2 layers × q, k, v, o, gate, up, down; the tied lm_head reads the embedding transposed.
            assert_eq!(b.tensors().filter(|t| t.name.ends_with(".gemm.panels")).count(), 14, "{name}");
        }
        let stored = names.iter().filter(|n| b.tensor(n).is_some()).count();
        assert_eq!(b.tensors().count(), stored + packed_tensors, "{name}: one tensor per weight");
        for (_, w) in compiled.weights.iter().filter(|(_, w)| names.contains(&w.name)) {
            if b.tensor(&w.name).is_none() && packed_from.contains(&w.name) {
                continue;
            }
            let view = b.tensor(&w.name).unwrap_or_else(|| panic!("{name}: weight {} missing", w.name));
            assert_eq!(view.bytes, &w.bytes[..], "{name}: weight {}", w.name);
            assert_eq!(view.bytes.as_ptr() as usize % 64, 0, "{name}: {} not aligned", w.name);
        }
    }
}

#[test]
fn smollm2_bundle_has_its_tokenizer_and_stop_token() {
    let tmp = tempfile::tempdir().unwrap();
    let b = compile("smollm2-builder-int4", tmp.path());
    assert!(b.read_file("tokenizer.json").unwrap().len() > 1000);
    assert!(b.read_file("chat_template.jinja").is_ok());
    // <|im_end|> ends a chat turn in SmolLM2's tokenizer.
    assert_eq!(b.model().eos_token_id, Some(2));
}

#[test]
fn compile_refuses_to_overwrite_unless_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m.npub");
    let model = common::model("llama-optimum");
    let args = ["compile", model.to_str().unwrap(), "-o", out.to_str().unwrap()];
    assert!(npuc(&args).0);
    let (ok, _, err) = npuc(&args);
    assert!(!ok, "a second compile into the same bundle must be refused");
    assert!(err.contains("m.npub"), "{err}");
    let mut again = args.to_vec();
    again.push("--overwrite");
    let (ok, _, err) = npuc(&again);
    assert!(ok, "{err}");
    // A byte flipped in the weights is caught by the loader.
    let weights = out.join("weights.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&weights, bytes).unwrap();
    let err = Bundle::open(&out, Some("cpu")).err().expect("tampered bundle opened");
    assert!(err.to_string().contains("weights.safetensors"), "{err}");
}

/// Typed inside the model's folder, `npuc compile model.onnx` finds the external data beside it
/// (the parent of a bare file name is the empty path, which is the current folder).
#[test]
fn compile_works_from_inside_the_models_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("here.npub");
    let dir = common::fixture("smollm2-builder-int4");
    assert!(dir.join("model.onnx.data").is_file(), "the builder keeps SmolLM2's tensors in external data");
    let run = Command::new(env!("CARGO_BIN_EXE_npuc"))
        .current_dir(&dir)
        .args(["compile", "model.onnx", "--target", "cpu", "-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let b = Bundle::open(&out, Some("cpu")).unwrap();
    assert_eq!(b.model().layers, 30);
}

//! Bundles written by `BundleWriter` and opened by `Bundle::open`: the round trip of tensors of
//! every dtype (an empty one among them), files and program; the 64-byte alignment of every
//! tensor; and refusals, each naming the file (and tensor) — a flipped byte anywhere in any file,
//! a truncated file, a missing file, a newer format, another target, listed paths that leave the
//! directory, symlinks leading out, and weights headers with offsets past the end, overlapping
//! tensors or wrong byte lengths.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use bundle::{
    Bundle, BundleError, BundleWriter, Dtype, FileEntry, Manifest, ManifestHeader, ModelConfig, Program, Target,
    WriteOptions, ALIGNMENT_BYTES, FORMAT_VERSION, MANIFEST_FILE, TOKENIZER_FILE, WEIGHTS_FILE,
};
use serde_json::json;

fn model_config() -> ModelConfig {
    ModelConfig {
        layers: 2,
        hidden: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        intermediate: 128,
        vocab: 300,
        rms_eps: 1e-5,
        rope_theta: 100000.0,
        tied_embeddings: true,
        max_positions: 2048,
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        stop_token_ids: vec![2, 7],
    }
}

fn header(target: Target) -> ManifestHeader {
    ManifestHeader { compiler_version: "0.1.0-test".to_string(), target, model: model_config(), program: program() }
}

/// input_ids → Gather(embed) → hidden, in the program format.
fn program() -> Program {
    serde_json::from_value(json!({
        "format": "npuc-program/1",
        "values": [
            {"name": "input_ids", "dtype": "i64", "shape": ["batch_size", "sequence_length"], "def": "input"},
            {"name": "embed", "dtype": "f32", "shape": [300, 64], "def": {"weight": "embed"}},
            {"name": "hidden", "dtype": "f32", "shape": ["batch_size", "sequence_length", 64], "def": "node"}
        ],
        "nodes": [{"name": "gather", "op": "ai.onnx::Gather", "attrs": {"axis": 0}, "inputs": [1, 0], "outputs": [2]}],
        "inputs": [0],
        "outputs": [2]
    }))
    .expect("the documented program format")
}

struct ExpectedTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
    metadata: Option<serde_json::Value>,
}

/// Deterministic bytes that differ from tensor to tensor.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn sample_tensors() -> BTreeMap<String, ExpectedTensor> {
    let specs: [(&str, Dtype, &[usize], Option<serde_json::Value>); 9] = [
        ("embed", Dtype::F32, &[5, 3], None),
        ("layers.0.q_proj.packed", Dtype::U8, &[7], Some(json!({"layout": "int4-blocks", "block": 32, "k": 14}))),
        ("layers.0.q_proj.scales", Dtype::F16, &[3], None),
        ("layers.0.norm", Dtype::BF16, &[2, 2], None),
        ("layers.0.codes", Dtype::I8, &[9], Some(json!("panel-4x16"))),
        ("positions", Dtype::I32, &[4], None),
        ("empty", Dtype::F32, &[0, 4], Some(json!({"why": "zero rows"}))),
        ("scalar", Dtype::F32, &[], None),
        ("big", Dtype::F32, &[40, 33], None),
    ];
    specs
        .into_iter()
        .enumerate()
        .map(|(i, (name, dtype, shape, metadata))| {
            let len = dtype.size_bytes() * shape.iter().product::<usize>();
            let tensor = ExpectedTensor { dtype, shape: shape.to_vec(), bytes: pattern(len, i as u8 * 17), metadata };
            (name.to_string(), tensor)
        })
        .collect()
}

const TOKENIZER: &[u8] = br#"{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}}"#;
const CHAT_TEMPLATE: &[u8] = b"{% for m in messages %}{{ m.content }}{% endfor %}";
const DESIGN: &[u8] = b"module { aie.device(npu1) { } }\n";

/// Writes the sample bundle into `dir` (which must not exist or be empty).
fn write_sample(dir: &Path, target: Target) {
    let mut writer = BundleWriter::create(dir, header(target)).unwrap();
    for (name, tensor) in sample_tensors() {
        writer.add_tensor(&name, tensor.dtype, &tensor.shape, &tensor.bytes, tensor.metadata.as_ref()).unwrap();
    }
    writer.add_file(TOKENIZER_FILE, TOKENIZER).unwrap();
    let template_source = dir.parent().unwrap().join("template-source.jinja");
    fs::write(&template_source, CHAT_TEMPLATE).unwrap();
    writer.copy_file("chat_template.jinja", &template_source).unwrap();
    writer.add_file("xdna/gemm_64x128.mlir", DESIGN).unwrap();
    let summary = writer.finish().unwrap();
    assert_eq!(summary.tensors, sample_tensors().len());
    assert_eq!(summary.files.len(), 4);
}

/// A temporary folder holding the bundle `model.npub` (its siblings are "outside the bundle").
fn sample_bundle(target: Target) -> (tempfile::TempDir, PathBuf) {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("model.npub");
    write_sample(&dir, target);
    (temp, dir)
}

/// Every file of the bundle, manifest first, as relative paths.
fn bundle_files(dir: &Path) -> Vec<String> {
    let manifest = Bundle::open(dir, None).unwrap().manifest().clone();
    std::iter::once(MANIFEST_FILE.to_string()).chain(manifest.files.iter().map(|entry| entry.path.clone())).collect()
}

fn blake3_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Replaces `rel_path` with `bytes` and rewrites the manifest to list the new size and hash, so
/// only what the bytes themselves say is left to check.
fn replace_and_reseal(dir: &Path, rel_path: &str, bytes: &[u8]) {
    let mut manifest = Bundle::open_unverified(dir, None).map(|b| b.manifest().clone()).unwrap_or_else(|_| {
        // The weights may already be broken; the manifest alone is still valid.
        Manifest::decode(&fs::read(dir.join(MANIFEST_FILE)).unwrap()).unwrap()
    });
    fs::write(dir.join(rel_path), bytes).unwrap();
    let entry = manifest.files.iter_mut().find(|entry| entry.path == rel_path).unwrap();
    entry.size_bytes = bytes.len() as u64;
    entry.blake3 = blake3_hex(bytes);
    fs::write(dir.join(MANIFEST_FILE), manifest.encode()).unwrap();
}

fn write_manifest(dir: &Path, manifest: &Manifest) {
    fs::write(dir.join(MANIFEST_FILE), manifest.encode()).unwrap();
}

fn decoded_manifest(dir: &Path) -> Manifest {
    Manifest::decode(&fs::read(dir.join(MANIFEST_FILE)).unwrap()).unwrap()
}

#[test]
fn round_trip_returns_every_tensor_aligned_with_its_metadata() {
    let (_temp, dir) = sample_bundle(Target::Cpu);
    let bundle = Bundle::open(&dir, Some("cpu")).unwrap();
    let expected = sample_tensors();
    assert_eq!(bundle.tensors().count(), expected.len(), "alignment fillers must not be listed");
    for (name, tensor) in &expected {
        let view = bundle.tensor(name).unwrap_or_else(|| panic!("tensor {name} missing"));
        assert_eq!(view.name, name);
        assert_eq!(view.dtype, tensor.dtype, "{name}");
        assert_eq!(view.shape, tensor.shape.as_slice(), "{name}");
        assert_eq!(view.bytes, tensor.bytes.as_slice(), "{name}");
        assert_eq!(view.metadata, tensor.metadata.as_ref(), "{name}");
        assert_eq!(view.bytes.as_ptr() as usize % ALIGNMENT_BYTES, 0, "{name} is not 64-byte aligned");
    }
    assert!(bundle.tensor("missing").is_none());
    let names: Vec<&str> = bundle.tensors().map(|view| view.name).collect();
    assert_eq!(names, expected.keys().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn round_trip_keeps_manifest_fields_files_and_program() {
    let (_temp, dir) = sample_bundle(Target::Xdna);
    let bundle = Bundle::open(&dir, Some("xdna")).unwrap();
    let manifest = bundle.manifest();
    let expected_header = header(Target::Xdna);
    assert_eq!(manifest.format_version, FORMAT_VERSION);
    assert_eq!(manifest.compiler_version, expected_header.compiler_version);
    assert_eq!(bundle.target(), Target::Xdna);
    assert_eq!(bundle.model(), &model_config());
    assert_eq!(bundle.program(), &expected_header.program);

    let listed: Vec<&str> = manifest.files.iter().map(|entry| entry.path.as_str()).collect();
    assert_eq!(listed, ["chat_template.jinja", TOKENIZER_FILE, WEIGHTS_FILE, "xdna/gemm_64x128.mlir"]);
    for (path, bytes) in
        [(TOKENIZER_FILE, TOKENIZER), ("chat_template.jinja", CHAT_TEMPLATE), ("xdna/gemm_64x128.mlir", DESIGN)]
    {
        let entry = manifest.file(path).unwrap();
        assert_eq!(entry.size_bytes, bytes.len() as u64);
        assert_eq!(entry.blake3, blake3_hex(bytes));
        assert_eq!(bundle.read_file(path).unwrap(), bytes);
        assert_eq!(fs::read(bundle.file_path(path).unwrap()).unwrap(), bytes);
    }
    let weights = fs::read(dir.join(WEIGHTS_FILE)).unwrap();
    assert_eq!(manifest.file(WEIGHTS_FILE).unwrap().blake3, blake3_hex(&weights));
    assert!(bundle.file_path("not-listed.txt").is_none());
    assert!(matches!(bundle.read_file("not-listed.txt"), Err(BundleError::InvalidFile { .. })));
    assert!(!dir.join(".weights.data.partial").exists(), "the writer leaves no temporary file");
}

#[test]
fn weights_file_is_plain_safetensors_with_contiguous_entries() {
    // Other safetensors readers demand that entries tile the data section without gaps; the
    // alignment fillers keep it so.
    let (_temp, dir) = sample_bundle(Target::Cpu);
    let bytes = fs::read(dir.join(WEIGHTS_FILE)).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!((8 + header_len) % ALIGNMENT_BYTES, 0, "the data section starts aligned");
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let mut ranges: Vec<(u64, u64)> = header
        .iter()
        .filter(|(name, _)| name.as_str() != "__metadata__")
        .map(|(_, entry)| {
            let offsets = entry["data_offsets"].as_array().unwrap();
            (offsets[0].as_u64().unwrap(), offsets[1].as_u64().unwrap())
        })
        .collect();
    ranges.sort();
    let mut next = 0;
    for (begin, end) in ranges {
        assert_eq!(begin, next, "gap or overlap before offset {begin}");
        next = end;
    }
    assert_eq!(next as usize, bytes.len() - 8 - header_len, "entries cover the whole data section");
    let metadata = header["__metadata__"].as_object().unwrap();
    assert!(metadata.values().all(serde_json::Value::is_string), "__metadata__ holds strings only");
}

#[test]
fn bundle_without_tensors_or_files_round_trips() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("empty.npub");
    let summary = BundleWriter::create(&dir, header(Target::IntelNpu)).unwrap().finish().unwrap();
    assert_eq!(summary.tensors, 0);
    assert_eq!(summary.files.len(), 1);
    let bundle = Bundle::open(&dir, Some("intel-npu")).unwrap();
    assert_eq!(bundle.tensors().count(), 0);
}

#[test]
fn chunked_tensor_equals_whole_and_a_short_one_is_rolled_back() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("chunks.npub");
    let whole = pattern(3 * 1000 * 4, 5);
    let mut writer = BundleWriter::create(&dir, header(Target::Cpu)).unwrap();
    writer
        .add_tensor_with("chunked", Dtype::F32, &[3, 1000], None, |sink| {
            use std::io::Write;
            whole.chunks(777).try_for_each(|chunk| sink.write_all(chunk))
        })
        .unwrap();
    let short = writer.add_tensor_with("short", Dtype::F32, &[10], None, |sink| {
        use std::io::Write;
        sink.write_all(&[0u8; 12])
    });
    assert!(
        matches!(&short, Err(BundleError::InvalidTensor { tensor, problem }) if tensor == "short" && problem.contains("12 bytes written")),
        "{short:?}"
    );
    let long = writer.add_tensor_with("long", Dtype::U8, &[4], None, |sink| {
        use std::io::Write;
        sink.write_all(&[0u8; 5])
    });
    assert!(matches!(&long, Err(BundleError::InvalidTensor { tensor, .. }) if tensor == "long"), "{long:?}");
    writer.add_tensor("after", Dtype::I8, &[3], &[1, 2, 3], None).unwrap();
    writer.finish().unwrap();

    let bundle = Bundle::open(&dir, None).unwrap();
    assert_eq!(bundle.tensor("chunked").unwrap().bytes, whole.as_slice());
    assert_eq!(bundle.tensor("after").unwrap().bytes, &[1, 2, 3]);
    assert!(bundle.tensor("short").is_none() && bundle.tensor("long").is_none());
}

#[test]
fn writer_refuses_bad_tensors_and_paths() {
    let temp = tempfile::tempdir().unwrap();
    let mut writer = BundleWriter::create(temp.path().join("w.npub"), header(Target::Cpu)).unwrap();
    writer.add_tensor("a", Dtype::U8, &[2], &[1, 2], None).unwrap();

    let refused_tensor = |result: Result<(), BundleError>, name: &str, needle: &str| match result {
        Err(BundleError::InvalidTensor { tensor, problem }) => {
            assert_eq!(tensor, name);
            assert!(problem.contains(needle), "{problem}");
        }
        other => panic!("expected InvalidTensor for {name}, got {other:?}"),
    };
    refused_tensor(writer.add_tensor("a", Dtype::U8, &[2], &[1, 2], None), "a", "twice");
    refused_tensor(writer.add_tensor("b", Dtype::F16, &[3], &[0; 4], None), "b", "6 bytes");
    refused_tensor(writer.add_tensor("__pad__.9", Dtype::U8, &[1], &[0], None), "__pad__.9", "reserved");
    refused_tensor(writer.add_tensor("", Dtype::U8, &[1], &[0], None), "", "name");
    refused_tensor(writer.add_tensor("huge", Dtype::F32, &[usize::MAX, 2], &[], None), "huge", "overflows");

    for bad in ["../x", "/etc/passwd", "xdna/../../x", "a/./b", "a//b", "", "a\\b"] {
        let result = writer.add_file(bad, b"x");
        assert!(matches!(&result, Err(BundleError::PathEscape { file, .. }) if file == bad), "{bad:?}: {result:?}");
    }
    for reserved in [MANIFEST_FILE, WEIGHTS_FILE] {
        let result = writer.add_file(reserved, b"x");
        assert!(matches!(&result, Err(BundleError::InvalidFile { file, .. }) if file == reserved), "{result:?}");
    }
    writer.add_file("intel/seg0.xml", b"<net/>").unwrap();
    let twice = writer.add_file("intel/seg0.xml", b"<net/>");
    assert!(matches!(&twice, Err(BundleError::InvalidFile { problem, .. }) if problem.contains("twice")), "{twice:?}");
    assert!(!temp.path().join("x").exists(), "nothing was written outside the bundle");
    writer.finish().unwrap();
}

#[test]
fn writer_refuses_non_empty_directory_unless_overwriting_a_bundle() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("m.npub");
    write_sample(&dir, Target::Cpu);

    let again = BundleWriter::create(&dir, header(Target::Cpu));
    assert!(matches!(&again, Err(BundleError::DirectoryNotEmpty { dir: d }) if d == &dir), "{:?}", again.err());
    assert!(Bundle::open(&dir, None).is_ok(), "a refused writer leaves the bundle alone");

    let options = WriteOptions { overwrite: true, sync: true };
    let mut writer = BundleWriter::create_with(&dir, header(Target::Xdna), options).unwrap();
    writer.add_tensor("only", Dtype::U8, &[1], &[9], None).unwrap();
    writer.finish().unwrap();
    let bundle = Bundle::open(&dir, Some("xdna")).unwrap();
    assert_eq!(bundle.tensors().count(), 1);
    assert!(!dir.join(TOKENIZER_FILE).exists(), "overwriting removes the old bundle's files");

    let not_a_bundle = temp.path().join("documents");
    fs::create_dir(&not_a_bundle).unwrap();
    fs::write(not_a_bundle.join("notes.txt"), b"keep me").unwrap();
    let refused = BundleWriter::create_with(&not_a_bundle, header(Target::Cpu), options);
    assert!(matches!(&refused, Err(BundleError::NotABundle { .. })), "{:?}", refused.err());
    assert_eq!(fs::read(not_a_bundle.join("notes.txt")).unwrap(), b"keep me");
}

/// Every byte of the first 4 KiB (all of the manifest, the small files and the weights header),
/// then every 61st byte and the last.
fn flip_positions(len: usize) -> Vec<usize> {
    let mut positions: Vec<usize> = (0..len.min(4096)).chain((4096..len).step_by(61)).collect();
    if len > 4096 {
        positions.push(len - 1);
    }
    positions
}

/// Overwrites one byte in place (rewriting whole files is much slower on some file systems).
fn poke(path: &Path, position: usize, byte: u8) {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(position as u64)).unwrap();
    file.write_all(&[byte]).unwrap();
}

#[test]
fn flipping_any_byte_of_any_file_is_refused_naming_that_file() {
    let (_temp, dir) = sample_bundle(Target::Cpu);
    let files = bundle_files(&dir);
    assert_eq!(files.len(), 5);
    for file in &files {
        let path = dir.join(file);
        let original = fs::read(&path).unwrap();
        for position in flip_positions(original.len()) {
            for mask in [0x01u8, 0x80] {
                poke(&path, position, original[position] ^ mask);
                let error = Bundle::open(&dir, Some("cpu")).err().unwrap_or_else(|| {
                    panic!("{file}: byte {position} ^ {mask:#04x} was accepted");
                });
                assert_eq!(error.file(), Some(file.as_str()), "{file}: byte {position}: {error}");
                let expected_kind = match &error {
                    BundleError::HashMismatch { .. } => true,
                    // A flipped digit of `format_version` can name a newer format.
                    BundleError::MalformedManifest { .. } | BundleError::FormatTooNew { .. } => file == MANIFEST_FILE,
                    _ => false,
                };
                assert!(expected_kind, "{file}: byte {position} ^ {mask:#04x}: unexpected {error:?}");
            }
            poke(&path, position, original[position]);
        }
        assert_eq!(fs::read(&path).unwrap(), original);
    }
    Bundle::open(&dir, Some("cpu")).unwrap();
}

#[test]
fn flipped_weights_header_and_data_bytes_report_a_hash_mismatch() {
    let (_temp, dir) = sample_bundle(Target::Cpu);
    let path = dir.join(WEIGHTS_FILE);
    let original = fs::read(&path).unwrap();
    let expected = decoded_manifest(&dir).file(WEIGHTS_FILE).unwrap().blake3.clone();
    // One byte of the length prefix, one of the JSON header, the last byte of tensor data.
    for position in [0, 20, original.len() - 1] {
        let mut flipped = original.clone();
        flipped[position] ^= 0x10;
        fs::write(&path, &flipped).unwrap();
        match Bundle::open(&dir, None) {
            Err(BundleError::HashMismatch { file, expected: listed, actual }) => {
                assert_eq!(file, WEIGHTS_FILE);
                assert_eq!(listed, expected);
                assert_eq!(actual, blake3_hex(&flipped));
            }
            other => panic!("byte {position}: expected a hash mismatch, got {:?}", other.err()),
        }
    }
    fs::write(&path, &original).unwrap();
}

#[test]
fn truncated_files_are_refused_naming_the_file() {
    let (_temp, dir) = sample_bundle(Target::Cpu);
    for file in bundle_files(&dir) {
        let path = dir.join(&file);
        let original = fs::read(&path).unwrap();
        for kept_bytes in [original.len() - 1, original.len() / 2, 0] {
            fs::write(&path, &original[..kept_bytes]).unwrap();
            let error =
                Bundle::open(&dir, None).err().unwrap_or_else(|| panic!("{file} cut to {kept_bytes} was accepted"));
            assert_eq!(error.file(), Some(file.as_str()), "{error}");
            if file == MANIFEST_FILE {
                assert!(matches!(error, BundleError::MalformedManifest { .. }), "{error:?}");
            } else {
                match error {
                    BundleError::SizeMismatch { expected_bytes, actual_bytes, .. } => {
                        assert_eq!(expected_bytes, original.len() as u64);
                        assert_eq!(actual_bytes, kept_bytes as u64);
                    }
                    other => panic!("{file}: expected a size mismatch, got {other:?}"),
                }
            }
        }
        fs::write(&path, &original).unwrap();
    }
    Bundle::open(&dir, None).unwrap();
}

#[test]
fn unverified_open_skips_hashes_but_not_sizes() {
    let (_temp, dir) = sample_bundle(Target::Cpu);
    let path = dir.join(TOKENIZER_FILE);
    let mut bytes = fs::read(&path).unwrap();
    bytes[3] ^= 1;
    fs::write(&path, &bytes).unwrap();
    assert!(Bundle::open_unverified(&dir, None).is_ok());
    assert!(matches!(Bundle::open(&dir, None), Err(BundleError::HashMismatch { .. })));
    bytes.pop();
    fs::write(&path, &bytes).unwrap();
    let error = Bundle::open_unverified(&dir, None).err().unwrap();
    assert!(matches!(&error, BundleError::SizeMismatch { file, .. } if file == TOKENIZER_FILE), "{error:?}");
}

#[test]
fn missing_files_are_refused_naming_the_file() {
    let (_temp, dir) = sample_bundle(Target::Cpu);
    for file in bundle_files(&dir) {
        let path = dir.join(&file);
        let original = fs::read(&path).unwrap();
        fs::remove_file(&path).unwrap();
        let error = Bundle::open(&dir, None).err().unwrap();
        assert!(matches!(&error, BundleError::Missing { file: f } if f == &file), "{error:?}");
        assert_eq!(error.to_string(), format!("bundle file `{file}` is missing"));
        fs::write(&path, &original).unwrap();
    }
}

#[test]
fn newer_format_is_refused_with_both_versions() {
    let (_temp, dir) = sample_bundle(Target::Cpu);
    let text = fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap();
    let newer = text.replace(&format!("\"format_version\": {FORMAT_VERSION}"), "\"format_version\": 7");
    assert_ne!(newer, text);
    fs::write(dir.join(MANIFEST_FILE), newer).unwrap();
    let error = Bundle::open(&dir, Some("cpu")).err().unwrap();
    assert!(
        matches!(&error, BundleError::FormatTooNew { file, found: 7, supported } if file == MANIFEST_FILE && *supported == FORMAT_VERSION),
        "{error:?}"
    );
    assert!(
        error.to_string().contains(&format!("bundle format 7 is newer than this runtime's {FORMAT_VERSION}")),
        "{error}"
    );
}

#[test]
fn older_unknown_format_is_refused() {
    let (_temp, dir) = sample_bundle(Target::Cpu);
    let mut manifest = decoded_manifest(&dir);
    manifest.format_version = 0;
    write_manifest(&dir, &manifest);
    let error = Bundle::open(&dir, None).err().unwrap();
    assert!(matches!(&error, BundleError::MalformedManifest { path, .. } if path == "format_version"), "{error:?}");

    // Format 1 sealed its manifest with SHA-256 under another key: refused for its version, with
    // the remedy, not for a checksum this runtime cannot find.
    let current = fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap();
    let format_1 = current
        .replace(&format!("\"format_version\": {FORMAT_VERSION}"), "\"format_version\": 1")
        .replace("\"manifest_blake3\"", "\"manifest_sha256\"");
    fs::write(dir.join(MANIFEST_FILE), format_1).unwrap();
    let error = Bundle::open(&dir, None).err().unwrap();
    assert!(matches!(&error, BundleError::MalformedManifest { path, .. } if path == "format_version"), "{error:?}");
    assert!(error.to_string().contains("recompile the bundle"), "{error}");
}

#[test]
fn wrong_target_is_refused() {
    let (_temp, dir) = sample_bundle(Target::Xdna);
    let error = Bundle::open(&dir, Some("cpu")).err().unwrap();
    assert!(
        matches!(&error, BundleError::WrongTarget { expected, found } if expected == "cpu" && found == "xdna"),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "the bundle is compiled for target `xdna`, not `cpu`");
    assert!(Bundle::open(&dir, Some("intel-npu")).is_err());
    assert!(Bundle::open(&dir, Some("xdna")).is_ok());
    assert!(Bundle::open(&dir, None).is_ok(), "no expected target accepts any");
}

#[test]
fn manifest_errors_name_the_field() {
    let (_temp, dir) = sample_bundle(Target::Cpu);
    let manifest = decoded_manifest(&dir);
    let mut value = serde_json::to_value(&manifest).unwrap();
    value["model"]["layers"] = json!("thirty");
    // Reseal by hand: the same encoding the writer uses, checksum over every byte before it.
    let mut bytes = serde_json::to_vec_pretty(&value).unwrap();
    bytes.truncate(bytes.len() - 2);
    bytes.extend_from_slice(b",\n  \"manifest_blake3\": \"");
    let checksum = blake3_hex(&bytes);
    bytes.extend_from_slice(checksum.as_bytes());
    bytes.extend_from_slice(b"\"\n}\n");
    fs::write(dir.join(MANIFEST_FILE), &bytes).unwrap();
    let error = Bundle::open(&dir, None).err().unwrap();
    match &error {
        BundleError::MalformedManifest { file, path, message } => {
            assert_eq!(file, MANIFEST_FILE);
            assert_eq!(path, "model.layers");
            assert!(message.contains("invalid type"), "{message}");
        }
        other => panic!("expected a malformed manifest, got {other:?}"),
    }

    let mut unknown_target = serde_json::to_value(&manifest).unwrap();
    unknown_target["target"] = json!("gpu");
    let text = serde_json::to_string(&unknown_target).unwrap();
    fs::write(dir.join(MANIFEST_FILE), text).unwrap();
    let error = Bundle::open(&dir, None).err().unwrap();
    assert!(
        matches!(&error, BundleError::MalformedManifest { path, .. } if path == "manifest_blake3"),
        "an unsealed manifest is refused before its fields are read: {error:?}"
    );

    let mut bad_hash = manifest.clone();
    bad_hash.files[0].blake3 = "ABC".to_string();
    write_manifest(&dir, &bad_hash);
    let error = Bundle::open(&dir, None).err().unwrap();
    assert!(matches!(&error, BundleError::MalformedManifest { path, .. } if path == "files[0].blake3"), "{error:?}");

    let mut twice = manifest.clone();
    twice.files.push(twice.files[0].clone());
    write_manifest(&dir, &twice);
    assert!(matches!(Bundle::open(&dir, None), Err(BundleError::MalformedManifest { .. })));

    // The program is typed with the rest: a value index past the values is refused where it is.
    let mut dangling = manifest.clone();
    dangling.program.nodes[0].inputs[1] = Some(7);
    write_manifest(&dir, &dangling);
    let error = Bundle::open(&dir, None).err().unwrap();
    assert!(
        matches!(&error, BundleError::MalformedManifest { path, message, .. }
            if path == "program.nodes[0].inputs[1]" && message.contains("below 3")),
        "{error:?}"
    );

    let mut no_weights = manifest.clone();
    no_weights.files.retain(|entry| entry.path != WEIGHTS_FILE);
    write_manifest(&dir, &no_weights);
    let error = Bundle::open(&dir, None).err().unwrap();
    assert!(error.to_string().contains(WEIGHTS_FILE), "{error}");
}

#[test]
fn listed_paths_leaving_the_bundle_are_refused() {
    let (temp, dir) = sample_bundle(Target::Cpu);
    let outside = temp.path().join("x");
    fs::write(&outside, b"outside").unwrap();
    let manifest = decoded_manifest(&dir);
    let absolute = outside.to_str().unwrap().to_string();
    for (path, reason) in [
        ("../x", "`..`"),
        ("xdna/../../x", "`..`"),
        (absolute.as_str(), "absolute"),
        ("./tokenizer.json", "`.`"),
        ("xdna\\..\\..\\x", "backslash"),
    ] {
        let mut escaping = manifest.clone();
        escaping.files.push(FileEntry { path: path.to_string(), size_bytes: 7, blake3: blake3_hex(b"outside") });
        write_manifest(&dir, &escaping);
        match Bundle::open(&dir, None) {
            Err(error @ BundleError::PathEscape { .. }) => {
                assert_eq!(error.file(), Some(path));
                assert!(error.to_string().contains(reason), "{error}");
            }
            other => panic!("{path}: expected a path escape, got {:?}", other.err()),
        }
    }
}

#[cfg(unix)]
#[test]
fn symlinks_leading_out_of_the_bundle_are_refused() {
    let (temp, dir) = sample_bundle(Target::Cpu);

    // Same bytes, so only where the file lives is wrong.
    let outside_tokenizer = temp.path().join("tokenizer-elsewhere.json");
    fs::write(&outside_tokenizer, TOKENIZER).unwrap();
    fs::remove_file(dir.join(TOKENIZER_FILE)).unwrap();
    std::os::unix::fs::symlink(&outside_tokenizer, dir.join(TOKENIZER_FILE)).unwrap();
    let error = Bundle::open(&dir, None).err().unwrap();
    assert!(matches!(&error, BundleError::PathEscape { file, .. } if file == TOKENIZER_FILE), "{error:?}");
    assert!(error.to_string().contains("symlink"), "{error}");
    fs::remove_file(dir.join(TOKENIZER_FILE)).unwrap();
    fs::write(dir.join(TOKENIZER_FILE), TOKENIZER).unwrap();

    // A symlinked folder on the way.
    let outside_designs = temp.path().join("designs-elsewhere");
    fs::rename(dir.join("xdna"), &outside_designs).unwrap();
    std::os::unix::fs::symlink(&outside_designs, dir.join("xdna")).unwrap();
    let error = Bundle::open(&dir, None).err().unwrap();
    assert!(matches!(&error, BundleError::PathEscape { file, .. } if file == "xdna/gemm_64x128.mlir"), "{error:?}");
    fs::remove_file(dir.join("xdna")).unwrap();
    fs::rename(&outside_designs, dir.join("xdna")).unwrap();

    // A symlink that stays inside is fine, and so is a bundle reached through a symlink.
    fs::rename(dir.join(TOKENIZER_FILE), dir.join("xdna/tokenizer-real.json")).unwrap();
    std::os::unix::fs::symlink("xdna/tokenizer-real.json", dir.join(TOKENIZER_FILE)).unwrap();
    let linked_bundle = temp.path().join("linked.npub");
    std::os::unix::fs::symlink(&dir, &linked_bundle).unwrap();
    Bundle::open(&linked_bundle, None).unwrap();

    // A dangling symlink is a missing file.
    fs::remove_file(dir.join("xdna/tokenizer-real.json")).unwrap();
    let error = Bundle::open(&dir, None).err().unwrap();
    assert!(matches!(&error, BundleError::Missing { file } if file == TOKENIZER_FILE), "{error:?}");
}

#[test]
fn a_directory_where_a_file_is_listed_is_refused() {
    let (_temp, dir) = sample_bundle(Target::Cpu);
    fs::remove_file(dir.join(TOKENIZER_FILE)).unwrap();
    fs::create_dir(dir.join(TOKENIZER_FILE)).unwrap();
    let error = Bundle::open(&dir, None).err().unwrap();
    assert!(matches!(&error, BundleError::NotAFile { file } if file == TOKENIZER_FILE), "{error:?}");
}

/// A weights file with this header (padded so the data section starts aligned) and `data_len`
/// zero bytes of data.
fn crafted_weights(header: serde_json::Value, data_len: usize) -> Vec<u8> {
    let mut json = serde_json::to_vec(&header).unwrap();
    while !(8 + json.len()).is_multiple_of(ALIGNMENT_BYTES) {
        json.push(b' ');
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    bytes.resize(bytes.len() + data_len, 0);
    bytes
}

/// Installs crafted weights in a sample bundle and returns the error opening it gives.
fn open_with_weights(weights: &[u8]) -> BundleError {
    let (_temp, dir) = sample_bundle(Target::Cpu);
    replace_and_reseal(&dir, WEIGHTS_FILE, weights);
    Bundle::open(&dir, None).err().expect("crafted weights must be refused")
}

fn assert_tensor_refused(error: BundleError, name: &str, needle: &str) {
    match &error {
        BundleError::MalformedTensor { file, tensor, problem } => {
            assert_eq!(file, WEIGHTS_FILE);
            assert_eq!(tensor, name, "{error}");
            assert!(problem.contains(needle), "expected `{needle}` in: {problem}");
        }
        other => panic!("expected tensor `{name}` refused, got {other:?}"),
    }
}

#[test]
fn weights_header_with_offsets_past_the_end_is_refused_naming_the_tensor() {
    let header = json!({
        "ok": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]},
        "beyond": {"dtype": "F32", "shape": [16], "data_offsets": [64, 128]},
    });
    assert_tensor_refused(open_with_weights(&crafted_weights(header, 100)), "beyond", "past the end");
}

#[test]
fn weights_header_with_overlapping_tensors_is_refused_naming_the_tensor() {
    let header = json!({
        "first": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]},
        "second": {"dtype": "U8", "shape": [64], "data_offsets": [64, 128]},
    });
    let error = open_with_weights(&crafted_weights(header, 128));
    assert!(error.to_string().contains("`first`"), "{error}");
    assert_tensor_refused(error, "second", "overlaps");

    // Nested inside a longer tensor that is not the one just before it.
    let header = json!({
        "a_long": {"dtype": "U8", "shape": [256], "data_offsets": [0, 256]},
        "b_inner": {"dtype": "U8", "shape": [64], "data_offsets": [64, 128]},
        "c_later": {"dtype": "U8", "shape": [64], "data_offsets": [192, 256]},
    });
    assert_tensor_refused(open_with_weights(&crafted_weights(header, 256)), "b_inner", "overlaps");
}

#[test]
fn weights_header_with_wrong_byte_length_is_refused_naming_the_tensor() {
    let header = json!({"w": {"dtype": "F16", "shape": [4, 8], "data_offsets": [0, 128]}});
    assert_tensor_refused(open_with_weights(&crafted_weights(header, 128)), "w", "64 bytes");
}

#[test]
fn weights_header_other_checks() {
    let unaligned = json!({
        "a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
        "b": {"dtype": "U8", "shape": [3], "data_offsets": [3, 6]},
    });
    assert_tensor_refused(open_with_weights(&crafted_weights(unaligned, 6)), "b", "multiple of 64");

    let unknown_dtype = json!({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}});
    assert_tensor_refused(open_with_weights(&crafted_weights(unknown_dtype, 4)), "w", "unknown dtype");

    let reversed = json!({"w": {"dtype": "U8", "shape": [0], "data_offsets": [8, 4]}});
    assert_tensor_refused(open_with_weights(&crafted_weights(reversed, 8)), "w", "reversed");

    let overflow = json!({"w": {"dtype": "F32", "shape": [u64::MAX, 4], "data_offsets": [0, 4]}});
    assert_tensor_refused(open_with_weights(&crafted_weights(overflow, 4)), "w", "overflows");

    let extra_field = json!({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4], "stride": 1}});
    assert_tensor_refused(open_with_weights(&crafted_weights(extra_field, 4)), "w", "stride");

    let orphan_layout = json!({"__metadata__": {"layout.ghost": "{}"}});
    assert_tensor_refused(open_with_weights(&crafted_weights(orphan_layout, 0)), "ghost", "no entry");

    let bad_layout = json!({
        "__metadata__": {"layout.w": "{not json"},
        "w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
    });
    assert_tensor_refused(open_with_weights(&crafted_weights(bad_layout, 4)), "w", "not JSON");

    let mut too_long = crafted_weights(json!({}), 0);
    let file_len = too_long.len() as u64;
    too_long[..8].copy_from_slice(&file_len.to_le_bytes());
    let error = open_with_weights(&too_long);
    assert!(
        matches!(&error, BundleError::MalformedSafetensors { file, problem } if file == WEIGHTS_FILE && problem.contains("past the end of the file")),
        "{error:?}"
    );

    let mut huge = crafted_weights(json!({}), 0);
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let error = open_with_weights(&huge);
    assert!(
        matches!(&error, BundleError::MalformedSafetensors { problem, .. } if problem.contains("limit")),
        "{error:?}"
    );

    let error = open_with_weights(&[1, 0, 0]);
    assert!(
        matches!(&error, BundleError::MalformedSafetensors { problem, .. } if problem.contains("too short")),
        "{error:?}"
    );

    let mut not_json = crafted_weights(json!({}), 0);
    not_json[8] = b'[';
    let error = open_with_weights(&not_json);
    assert!(
        matches!(&error, BundleError::MalformedSafetensors { problem, .. } if problem.contains("JSON object")),
        "{error:?}"
    );
}

#[test]
fn crafted_weights_that_pass_every_check_open() {
    // The reseal helper itself is sound: a valid hand-made file (with a gap, which this reader
    // tolerates) is accepted.
    let header = json!({
        "__metadata__": {"layout.w": "{\"block\": 32}", "note": "hand-made"},
        "w": {"dtype": "I32", "shape": [2], "data_offsets": [64, 72]},
    });
    let (_temp, dir) = sample_bundle(Target::Cpu);
    replace_and_reseal(&dir, WEIGHTS_FILE, &crafted_weights(header, 72));
    let bundle = Bundle::open(&dir, None).unwrap();
    let view = bundle.tensor("w").unwrap();
    assert_eq!((view.dtype, view.shape, view.bytes.len()), (Dtype::I32, &[2usize][..], 8));
    assert_eq!(view.metadata, Some(&json!({"block": 32})));
}

/// A weights file with 64 MiB of data or more is written in place: the header goes into the
/// space reserved before the data (padded with spaces), the data is never copied, and the file
/// reads back and verifies as a compacted one does; a small one is compacted (no reserve).
#[test]
fn large_weights_are_written_in_place_behind_a_reserved_header() {
    let temp = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..(64usize << 20)).map(|i| (i % 251) as u8).collect();
    for (name, bytes, reserved) in [("large.npub", &big[..], true), ("small.npub", &big[..1000], false)] {
        let dir = temp.path().join(name);
        let mut writer = BundleWriter::create(&dir, header(Target::Cpu)).unwrap();
        writer.add_tensor("w", Dtype::U8, &[bytes.len()], bytes, None).unwrap();
        writer.add_tensor("b", Dtype::F32, &[2], &[0, 0, 128, 63, 0, 0, 0, 64], None).unwrap();
        writer.finish().unwrap();
        let file = fs::read(dir.join(WEIGHTS_FILE)).unwrap();
        let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
        assert_eq!(header_len + 8 == 256 << 10, reserved, "{name}: header of {header_len} bytes");
        assert!(file[8..8 + header_len].ends_with(b" "), "{name}: the header is padded with spaces");
        let bundle = Bundle::open(&dir, None).unwrap();
        assert_eq!(bundle.manifest().files.iter().find(|f| f.path == WEIGHTS_FILE).unwrap().blake3, blake3_hex(&file));
        assert!(bundle.tensor("w").unwrap().bytes == bytes, "{name}: tensor data");
        assert_eq!(bundle.tensor("b").unwrap().bytes, &[0, 0, 128, 63, 0, 0, 0, 64]);
        assert!(!dir.join(".weights.data.partial").exists(), "{name}: the partial file is left");
    }
}

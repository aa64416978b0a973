//! The bad-input corpus: every malformed model gets a specific error naming what is wrong, from
//! the library and from `npuc inspect` (non-zero exit, no panic, bounded memory), and nothing
//! outside the model's folder is read.
//!
//! The models are generated here, from the protobuf types, into a temporary folder; no binary
//! is committed.

use frontend::proto::{
    attribute_proto::AttributeType, tensor_proto::DataLocation, tensor_shape_proto, type_proto, AttributeProto,
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto, TensorShapeProto,
    TypeProto, ValueInfoProto,
};
use frontend::ErrorKind;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::Command;

const F32: i32 = 1;
const I64: i32 = 7;

fn vi(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| tensor_shape_proto::Dimension {
            value: Some(if d < 0 {
                tensor_shape_proto::dimension::Value::DimParam("n".into())
            } else {
                tensor_shape_proto::dimension::Value::DimValue(d)
            }),
            denotation: None,
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto { dim }),
            })),
            denotation: None,
        }),
    }
}

fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn f32_init(name: &str, dims: &[i64], raw: Vec<u8>) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(F32),
        raw_data: Some(raw.into()),
        ..Default::default()
    }
}

fn external(name: &str, dims: &[i64], location: &str, offset: Option<u64>, length: Option<u64>) -> TensorProto {
    let mut entries = vec![StringStringEntryProto { key: Some("location".into()), value: Some(location.into()) }];
    if let Some(o) = offset {
        entries.push(StringStringEntryProto { key: Some("offset".into()), value: Some(o.to_string()) });
    }
    if let Some(l) = length {
        entries.push(StringStringEntryProto { key: Some("length".into()), value: Some(l.to_string()) });
    }
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(F32),
        external_data: entries,
        data_location: Some(DataLocation::External as i32),
        ..Default::default()
    }
}

fn model(
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
) -> ModelProto {
    ModelProto {
        ir_version: Some(10),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(18) }],
        producer_name: Some("npuc-tests".into()),
        graph: Some(GraphProto {
            node: nodes,
            name: Some("g".into()),
            initializer: inits,
            input: inputs,
            output: outputs,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A valid model: y = x + w.
fn good_model() -> ModelProto {
    model(
        vec![node("add", "Add", &["x", "w"], &["y"])],
        vec![f32_init("w", &[2], vec![0; 8])],
        vec![vi("x", F32, &[-1, 2])],
        vec![vi("y", F32, &[-1, 2])],
    )
}

struct Case {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

/// Writes `bytes` as `model.onnx` inside a fresh folder `<tmp>/model/`, next to a `secret.bin`
/// in `<tmp>` that no model may read.
fn write(bytes: &[u8]) -> Case {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret.bin"), vec![7u8; 64]).unwrap();
    let mdir = dir.path().join("model");
    std::fs::create_dir(&mdir).unwrap();
    let path = mdir.join("model.onnx");
    std::fs::write(&path, bytes).unwrap();
    Case { _dir: dir, path }
}

fn write_model(m: &ModelProto) -> Case {
    write(&m.encode_to_vec())
}

fn import_err(path: &Path) -> frontend::Error {
    match frontend::import_file(path) {
        Ok(_) => panic!("{} imported without error", path.display()),
        Err(e) => e,
    }
}

/// Runs `npuc inspect` with a 2 GiB address-space limit; returns (exit code, stderr).
fn cli(path: &Path) -> (i32, String) {
    let exe = env!("CARGO_BIN_EXE_npuc");
    let out = Command::new("bash")
        .arg("-c")
        .arg("ulimit -v 2097152; exec \"$0\" inspect \"$1\"")
        .arg(exe)
        .arg(path)
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Asserts the CLI fails cleanly with a message containing every fragment.
fn assert_cli_refuses(path: &Path, fragments: &[&str]) {
    let (code, stderr) = cli(path);
    assert_ne!(code, 0, "npuc inspect accepted {}", path.display());
    assert!(!stderr.contains("panicked"), "npuc panicked: {stderr}");
    for f in fragments {
        assert!(stderr.contains(f), "stderr lacks `{f}`:\n{stderr}");
    }
}

#[test]
fn the_good_model_imports() {
    let c = write_model(&good_model());
    let g = frontend::import_file(&c.path).unwrap().graph;
    assert_eq!(g.nodes.len(), 1);
    let (code, stderr) = cli(&c.path);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn truncated_protobuf() {
    let bytes = good_model().encode_to_vec();
    let c = write(&bytes[..bytes.len() / 2]);
    assert!(matches!(import_err(&c.path).kind, ErrorKind::Decode(_)));
    assert_cli_refuses(&c.path, &["not an ONNX model", "model.onnx"]);
}

#[test]
fn random_bytes() {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let bytes: Vec<u8> = (0..65536)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let c = write(&bytes);
    let e = import_err(&c.path);
    assert!(matches!(e.kind, ErrorKind::Decode(_) | ErrorKind::NoGraph), "{e}");
    assert_cli_refuses(&c.path, &["model.onnx"]);
}

#[test]
fn cycle() {
    let m = model(
        vec![node("a", "Add", &["x", "b_out"], &["a_out"]), node("b", "Add", &["a_out", "x"], &["b_out"])],
        vec![],
        vec![vi("x", F32, &[2])],
        vec![vi("b_out", F32, &[2])],
    );
    let c = write_model(&m);
    match import_err(&c.path).kind {
        ErrorKind::Cycle(nodes) => assert!(nodes.contains("`a`") && nodes.contains("`b`"), "{nodes}"),
        other => panic!("expected a cycle error, got {other}"),
    }
    assert_cli_refuses(&c.path, &["cycle"]);
}

#[test]
fn undefined_input() {
    let m = model(
        vec![node("add", "Add", &["x", "nowhere"], &["y"])],
        vec![],
        vec![vi("x", F32, &[2])],
        vec![vi("y", F32, &[2])],
    );
    let c = write_model(&m);
    match import_err(&c.path).kind {
        ErrorKind::UndefinedInput { node, input } => assert_eq!((node.as_str(), input.as_str()), ("add", "nowhere")),
        other => panic!("expected an undefined input, got {other}"),
    }
    assert_cli_refuses(&c.path, &["`nowhere`", "`add`"]);
}

#[test]
fn duplicate_value_names() {
    let m = model(
        vec![node("a", "Add", &["x", "x"], &["y"]), node("b", "Mul", &["x", "x"], &["y"])],
        vec![],
        vec![vi("x", F32, &[2])],
        vec![vi("y", F32, &[2])],
    );
    let c = write_model(&m);
    assert!(matches!(import_err(&c.path).kind, ErrorKind::DuplicateName(ref n) if n == "y"));
    assert_cli_refuses(&c.path, &["`y`", "more than once"]);
}

#[test]
fn wrong_initializer_size() {
    let mut m = good_model();
    m.graph.as_mut().unwrap().initializer = vec![f32_init("w", &[2, 2], vec![0; 12])];
    let c = write_model(&m);
    match import_err(&c.path).kind {
        ErrorKind::Tensor { tensor, detail } => {
            assert_eq!(tensor, "w");
            assert!(detail.contains("12 bytes") && detail.contains("16"), "{detail}");
        }
        other => panic!("expected a tensor size error, got {other}"),
    }
    assert_cli_refuses(&c.path, &["`w`", "12 bytes"]);
}

#[test]
fn wrong_input_count() {
    let m = model(
        vec![node("add3", "Add", &["x", "x", "x"], &["y"])],
        vec![],
        vec![vi("x", F32, &[2])],
        vec![vi("y", F32, &[2])],
    );
    let c = write_model(&m);
    match import_err(&c.path).kind {
        ErrorKind::Arity { node, given, .. } => assert_eq!((node.as_str(), given), ("add3", 3)),
        other => panic!("expected an arity error, got {other}"),
    }
    assert_cli_refuses(&c.path, &["`add3`", "3 inputs"]);
}

#[test]
fn dtype_mismatch() {
    let m = model(
        vec![node("mix", "Add", &["x", "i"], &["y"])],
        vec![],
        vec![vi("x", F32, &[2]), vi("i", I64, &[2])],
        vec![vi("y", F32, &[2])],
    );
    let c = write_model(&m);
    match import_err(&c.path).kind {
        ErrorKind::Dtype { node, detail, .. } => {
            assert_eq!(node, "mix");
            assert!(detail.contains("f32") && detail.contains("i64"), "{detail}");
        }
        other => panic!("expected a dtype error, got {other}"),
    }
    assert_cli_refuses(&c.path, &["`mix`", "dtype"]);
}

#[test]
fn shape_mismatch() {
    let m = model(
        vec![node("mm", "MatMul", &["a", "b"], &["y"])],
        vec![],
        vec![vi("a", F32, &[2, 3]), vi("b", F32, &[4, 5])],
        vec![vi("y", F32, &[2, 5])],
    );
    let c = write_model(&m);
    match import_err(&c.path).kind {
        ErrorKind::Shape { node, detail, .. } => {
            assert_eq!(node, "mm");
            assert!(detail.contains("[2,3]") && detail.contains("[4,5]"), "{detail}");
        }
        other => panic!("expected a shape error, got {other}"),
    }
    assert_cli_refuses(&c.path, &["`mm`", "shape mismatch"]);
}

#[test]
fn graph_output_not_produced() {
    let mut m = good_model();
    m.graph.as_mut().unwrap().output.push(vi("ghost", F32, &[2]));
    let c = write_model(&m);
    assert!(matches!(import_err(&c.path).kind, ErrorKind::OutputNotProduced(ref n) if n == "ghost"));
    assert_cli_refuses(&c.path, &["`ghost`"]);
}

#[test]
fn unknown_op_names_node_op_domain_and_opset() {
    let m = model(
        vec![node("weird", "FooBar", &["x"], &["y"])],
        vec![],
        vec![vi("x", F32, &[2])],
        vec![vi("y", F32, &[2])],
    );
    let c = write_model(&m);
    match import_err(&c.path).kind {
        ErrorKind::UnknownOp { node, op, domain, opset } => {
            assert_eq!((node.as_str(), op.as_str(), domain.as_str(), opset), ("weird", "FooBar", "ai.onnx", 18));
        }
        other => panic!("expected an unknown op, got {other}"),
    }
    assert_cli_refuses(&c.path, &["`weird`", "ai.onnx::FooBar", "opset 18"]);
}

#[test]
fn unknown_domain_is_an_unknown_op() {
    let mut n = node("custom", "Thing", &["x"], &["y"]);
    n.domain = Some("com.example".into());
    let m = model(vec![n], vec![], vec![vi("x", F32, &[2])], vec![vi("y", F32, &[2])]);
    let c = write_model(&m);
    assert!(matches!(import_err(&c.path).kind, ErrorKind::UnknownOp { ref domain, .. } if domain == "com.example"));
    assert_cli_refuses(&c.path, &["com.example::Thing"]);
}

/// A model whose initializer `w` (f32[4]) is external data described by `t`.
fn with_external(t: TensorProto) -> ModelProto {
    model(vec![node("add", "Add", &["x", "w"], &["y"])], vec![t], vec![vi("x", F32, &[4])], vec![vi("y", F32, &[4])])
}

#[test]
fn external_data_resolves_inside_the_folder() {
    let c = write_model(&with_external(external("w", &[4], "w.bin", Some(4), Some(16))));
    std::fs::write(c.path.parent().unwrap().join("w.bin"), (0u8..20).collect::<Vec<_>>()).unwrap();
    let g = frontend::import_file(&c.path).unwrap().graph;
    let (_, w) = g.weights.iter().next().unwrap();
    assert_eq!(&w.bytes[..], &(4u8..20).collect::<Vec<_>>()[..]);
}

/// The checksum entry (SHA-1 of the whole file, as onnx.proto defines it) is verified when present.
#[test]
fn external_data_checksum_is_verified() {
    let bytes: Vec<u8> = (0u8..20).collect();
    // SHA-1 of the bytes 0..20, from Python's hashlib.
    let digest = "602c63d2f3d13ca3206cdf204cde24e7d8f4266c";
    for (checksum, ok) in [(digest.to_string(), true), (digest.to_uppercase(), true), ("0".repeat(40), false)] {
        let mut t = external("w", &[4], "w.bin", Some(4), Some(16));
        t.external_data.push(StringStringEntryProto { key: Some("checksum".into()), value: Some(checksum) });
        let c = write_model(&with_external(t));
        std::fs::write(c.path.parent().unwrap().join("w.bin"), &bytes).unwrap();
        match frontend::import_file(&c.path) {
            Ok(_) => assert!(ok),
            Err(e) => {
                assert!(!ok, "{e}");
                assert!(matches!(&e.kind, ErrorKind::ExternalData { detail, .. } if detail.contains(digest)), "{e}");
            }
        }
    }
}

#[test]
fn external_data_with_dotdot_is_refused() {
    let c = write_model(&with_external(external("w", &[4], "../secret.bin", None, Some(16))));
    match import_err(&c.path).kind {
        ErrorKind::ExternalData { tensor, file, detail } => {
            assert_eq!((tensor.as_str(), file.as_str()), ("w", "../secret.bin"));
            assert!(detail.contains(".."), "{detail}");
        }
        other => panic!("expected an external data error, got {other}"),
    }
    assert_cli_refuses(&c.path, &["`w`", "../secret.bin"]);
}

#[test]
fn external_data_with_absolute_path_is_refused() {
    let c = write_model(&with_external(external("w", &[4], "/etc/hostname", None, Some(16))));
    match import_err(&c.path).kind {
        ErrorKind::ExternalData { detail, .. } => assert!(detail.contains("absolute"), "{detail}"),
        other => panic!("expected an external data error, got {other}"),
    }
    assert_cli_refuses(&c.path, &["/etc/hostname", "absolute"]);
}

#[test]
fn external_data_symlink_leaving_the_folder_is_refused() {
    let c = write_model(&with_external(external("w", &[4], "link.bin", None, Some(16))));
    let mdir = c.path.parent().unwrap();
    std::os::unix::fs::symlink(mdir.parent().unwrap().join("secret.bin"), mdir.join("link.bin")).unwrap();
    match import_err(&c.path).kind {
        ErrorKind::ExternalData { file, detail, .. } => {
            assert_eq!(file, "link.bin");
            assert!(detail.contains("outside the model's folder"), "{detail}");
        }
        other => panic!("expected an external data error, got {other}"),
    }
    assert_cli_refuses(&c.path, &["link.bin", "outside"]);
}

#[test]
fn external_data_past_end_of_file_is_refused() {
    let c = write_model(&with_external(external("w", &[4], "w.bin", Some(8), Some(16))));
    std::fs::write(c.path.parent().unwrap().join("w.bin"), vec![0u8; 20]).unwrap();
    match import_err(&c.path).kind {
        ErrorKind::ExternalData { detail, .. } => assert!(detail.contains("past the end"), "{detail}"),
        other => panic!("expected an external data error, got {other}"),
    }
    assert_cli_refuses(&c.path, &["w.bin", "past the end"]);
}

#[test]
fn external_data_length_disagreeing_with_shape_is_refused() {
    let c = write_model(&with_external(external("w", &[4], "w.bin", None, Some(12))));
    std::fs::write(c.path.parent().unwrap().join("w.bin"), vec![0u8; 20]).unwrap();
    match import_err(&c.path).kind {
        ErrorKind::ExternalData { detail, .. } => assert!(detail.contains("needs 16 bytes"), "{detail}"),
        other => panic!("expected an external data error, got {other}"),
    }
}

#[test]
fn a_dim_of_2_pow_40_without_data_is_refused_without_allocating() {
    let mut m = good_model();
    m.graph.as_mut().unwrap().initializer = vec![f32_init("w", &[1 << 40], vec![])];
    let c = write_model(&m);
    match import_err(&c.path).kind {
        ErrorKind::Tensor { tensor, .. } => assert_eq!(tensor, "w"),
        other => panic!("expected a tensor error, got {other}"),
    }
    assert_cli_refuses(&c.path, &["`w`"]);
}

#[test]
fn an_overflowing_element_count_is_refused() {
    let mut m = good_model();
    m.graph.as_mut().unwrap().initializer = vec![f32_init("w", &[1 << 32, 1 << 32, 16], vec![])];
    let c = write_model(&m);
    match import_err(&c.path).kind {
        ErrorKind::Tensor { tensor, detail } => {
            assert_eq!(tensor, "w");
            assert!(detail.contains("2^40"), "{detail}");
        }
        other => panic!("expected a tensor error, got {other}"),
    }
    let mut m = good_model();
    m.graph.as_mut().unwrap().input = vec![vi("x", F32, &[1 << 40, 1 << 40])];
    let c = write_model(&m);
    assert!(matches!(import_err(&c.path).kind, ErrorKind::Type { ref value, .. } if value == "x"));
    assert_cli_refuses(&c.path, &["`x`", "2^40"]);
}

#[test]
fn a_huge_constant_of_shape_is_not_materialised() {
    // ConstantOfShape([2^20, 2^20]) is 2^40 elements: import must keep it symbolic (a node), not
    // fold it into memory.
    let shape = TensorProto {
        name: Some("s".into()),
        dims: vec![2],
        data_type: Some(I64),
        int64_data: vec![1 << 20, 1 << 20],
        ..Default::default()
    };
    let mut n = node("big", "ConstantOfShape", &["s"], &["y"]);
    n.attribute.push(AttributeProto {
        name: Some("value".into()),
        r#type: Some(AttributeType::Tensor as i32),
        t: Some(TensorProto { dims: vec![1], data_type: Some(F32), float_data: vec![1.0], ..Default::default() }),
        ..Default::default()
    });
    let m = model(vec![n], vec![shape], vec![], vec![vi("y", F32, &[1 << 20, 1 << 20])]);
    let c = write_model(&m);
    let g = frontend::import_file(&c.path).unwrap().graph;
    assert_eq!(g.nodes.len(), 1, "the 2^40-element constant must stay a node");
    let (code, stderr) = cli(&c.path);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn a_model_without_ir_version_or_from_a_newer_ir_is_refused() {
    let mut m = good_model();
    m.ir_version = None;
    let c = write_model(&m);
    assert!(matches!(import_err(&c.path).kind, ErrorKind::IrVersion(_)));
    assert_cli_refuses(&c.path, &["no ir_version", "IR versions 1 to 14", "model.onnx"]);
    m.ir_version = Some(15);
    let c = write_model(&m);
    assert_cli_refuses(&c.path, &["IR version 15", "IR versions 1 to 14", "model.onnx"]);
}

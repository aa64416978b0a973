//! `npuc compile --target xdna` with mlir-aie's `aiecc.py` on PATH runs, on every design, the
//! build command the plan records, and stores the instruction stream, xclbin and PDI it writes; a
//! design it fails on keeps aiecc's error in the plan and the compile still succeeds. A stand-in
//! `aiecc.py` plays the tool: it logs its arguments, takes npu1 designs only, and refuses a design
//! that declares a function without a body, as the real one would fail to link it with nothing but
//! the design.

mod common;

use runtime::bundle::Bundle;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const FAKE_AIECC: &str = r#"#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls"
for a in "$@"; do
  case "$a" in
    --xclbin-name=*) X="${a#--xclbin-name=}" ;;
    --npu-insts-name=*) I="${a#--npu-insts-name=}" ;;
    --pdi-name=*) P="${a#--pdi-name=}" ;;
    *.mlir) D="$a" ;;
  esac
done
grep -q "aie.device(npu1)" "$D" || { echo "not an npu1 design" >&2; exit 3; }
if grep -q "func.func private" "$D"; then
  echo "ld.lld: error: undefined symbol: $(grep -o 'func.func private @[a-z0-9_]*' "$D" | head -n 1)" >&2
  exit 1
fi
cp "$D" "$X" && printf 'insts' > "$I" && printf 'pdi of %s' "$D" > "$P"
"#;

/// Compiles with `tools` first on PATH; the bundle, its plan and what the compile printed.
fn compile(tools: &Path, device: &str, out: &Path) -> (Bundle, Value, String) {
    let model = common::model("llama-optimum");
    let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
    let res = Command::new(env!("CARGO_BIN_EXE_npuc"))
        .args(["compile", model.to_str().unwrap(), "--target", "xdna", "--device", device])
        .args(["-o", out.to_str().unwrap()])
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(res.status.success(), "{}", String::from_utf8_lossy(&res.stderr));
    let b = Bundle::open(out, Some("xdna")).unwrap();
    let plan: Value = serde_json::from_slice(&b.read_file("xdna/plan.json").unwrap()).unwrap();
    (b, plan, String::from_utf8_lossy(&res.stdout).into_owned())
}

fn fake_aiecc(dir: &Path) -> std::path::PathBuf {
    let tools = dir.join("bin");
    std::fs::create_dir(&tools).unwrap();
    let script = tools.join("aiecc.py");
    std::fs::write(&script, FAKE_AIECC).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    tools
}

#[test]
fn aiecc_on_path_builds_every_design_with_the_plans_command() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = fake_aiecc(tmp.path());
    let (b, plan, printed) = compile(&tools, "npu1", &tmp.path().join("a.npub"));
    let designs = plan["designs"].as_array().unwrap();
    assert!(!designs.is_empty());
    let calls = std::fs::read_to_string(tools.join("calls")).unwrap();
    for d in designs {
        assert!(d.get("aiecc_error").is_none(), "{d}");
        let xclbin = b.read_file(d["xclbin"].as_str().unwrap()).unwrap();
        assert_eq!(xclbin, b.read_file(d["pretty"].as_str().unwrap()).unwrap());
        assert_eq!(b.read_file(d["insts"].as_str().unwrap()).unwrap(), b"insts");
        let pdi = b.read_file(d["pdi"].as_str().unwrap()).unwrap();
        assert_eq!(String::from_utf8(pdi).unwrap(), format!("pdi of {}", d["pretty"].as_str().unwrap()));
        // What ran is the command the plan gives for building without npuc.
        let command = d["build"].as_str().unwrap().strip_prefix("aiecc.py ").unwrap();
        assert!(calls.lines().any(|l| l == command), "{command} not in {calls}");
        assert!(printed.lines().any(|l| l.trim() == d["build"].as_str().unwrap()), "{printed}");
    }
    assert!(
        plan["artifacts"].as_str().unwrap().contains(&format!("for {0} of {0} designs", designs.len())),
        "{}",
        plan["artifacts"]
    );
}

#[test]
fn designs_aiecc_fails_on_keep_its_error_and_the_compile_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = fake_aiecc(tmp.path());
    let (b, plan, _) = compile(&tools, "npu2", &tmp.path().join("a.npub"));
    let designs = plan["designs"].as_array().unwrap();
    for d in designs {
        let err = d["aiecc_error"].as_str().unwrap_or_else(|| panic!("{d}"));
        assert!(err.contains("not an npu1 design") && err.contains("exit status: 3"), "{err}");
        assert!(b.file_path(&format!("xdna/{}.xclbin", d["name"].as_str().unwrap())).is_none());
    }
    assert!(
        plan["artifacts"].as_str().unwrap().contains(&format!("for 0 of {} designs", designs.len())),
        "{}",
        plan["artifacts"]
    );
}

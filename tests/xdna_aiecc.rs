//! `npuc compile --target xdna` with mlir-aie's `aiecc` on PATH runs it on every design and
//! stores the instruction stream, xclbin and PDI it writes; a design it fails on keeps aiecc's error
//! in the plan and the compile still succeeds. A stand-in `aiecc` script plays the tool: it
//! checks it was given an npu1 design whose kernel object is in its folder, as the real one
//! would fail to link without it.

mod common;

use runtime::bundle::Bundle;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const FAKE_AIECC: &str = r#"#!/bin/sh
for a in "$@"; do
  case "$a" in
    --xclbin-name=*) X="${a#--xclbin-name=}" ;;
    --npu-insts-name=*) I="${a#--npu-insts-name=}" ;;
    *.mlir) D="$a" ;;
  esac
done
grep -q "aie.device(npu1)" "$D" || { echo "not an npu1 design" >&2; exit 3; }
obj=$(grep -o 'link_with = "[^"]*"' "$D" | head -n 1 | cut -d'"' -f2)
[ -f "$obj" ] || { echo "ld.lld: error: cannot open $obj" >&2; exit 1; }
cp "$D" "$X" && printf 'insts' > "$I"
# bootgen's PDI, which the xclbin wraps, stays in aiecc's project folder.
mkdir -p "$D.prj" && printf 'pdi of %s' "$D" > "$D.prj/design.pdi"
"#;

fn compile(tools: &Path, kernels: Option<&Path>, out: &Path) -> (Bundle, Value) {
    let model = common::model("llama-optimum");
    let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_npuc"));
    cmd.args(["compile", model.to_str().unwrap(), "--target", "xdna", "-o", out.to_str().unwrap()]).env("PATH", path);
    if let Some(k) = kernels {
        cmd.env("NPUC_AIE_KERNELS", k);
    }
    let res = cmd.output().unwrap();
    assert!(res.status.success(), "{}", String::from_utf8_lossy(&res.stderr));
    let b = Bundle::open(out, Some("xdna")).unwrap();
    let plan: Value = serde_json::from_slice(&b.read_file("xdna/plan.json").unwrap()).unwrap();
    (b, plan)
}

#[test]
fn aiecc_on_path_builds_every_design_and_its_failures_are_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = tmp.path().join("bin");
    std::fs::create_dir(&tools).unwrap();
    let script = tools.join("aiecc");
    std::fs::write(&script, FAKE_AIECC).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();

    // Without the kernel objects every design fails to link; the compile says so and goes on.
    let (b, plan) = compile(&tools, None, &tmp.path().join("a.npub"));
    let designs = plan["designs"].as_array().unwrap();
    assert!(!designs.is_empty());
    for d in designs {
        let err = d["aiecc_error"].as_str().unwrap_or_else(|| panic!("{d}"));
        assert!(err.contains("cannot open") && err.contains(d["kernel_object"].as_str().unwrap()), "{err}");
        assert!(b.file_path(&format!("xdna/{}.xclbin", d["name"].as_str().unwrap())).is_none());
    }
    assert!(
        plan["artifacts"].as_str().unwrap().contains(&format!("for 0 of {} designs", designs.len())),
        "{}",
        plan["artifacts"]
    );

    // With them, every design's artifacts are in the bundle, made from that design.
    let kernels = tmp.path().join("kernels");
    std::fs::create_dir(&kernels).unwrap();
    for d in designs {
        std::fs::write(kernels.join(d["kernel_object"].as_str().unwrap()), b"\x7fELF").unwrap();
    }
    let (b, plan) = compile(&tools, Some(&kernels), &tmp.path().join("b.npub"));
    let designs = plan["designs"].as_array().unwrap();
    for d in designs {
        assert!(d.get("aiecc_error").is_none(), "{d}");
        let xclbin = b.read_file(d["xclbin"].as_str().unwrap()).unwrap();
        assert_eq!(xclbin, b.read_file(d["pretty"].as_str().unwrap()).unwrap());
        assert_eq!(b.read_file(d["insts"].as_str().unwrap()).unwrap(), b"insts");
        assert_eq!(b.read_file(d["pdi"].as_str().unwrap()).unwrap(), b"pdi of design.mlir");
    }
    assert!(
        plan["artifacts"].as_str().unwrap().contains(&format!("for {0} of {0} designs", designs.len())),
        "{}",
        plan["artifacts"]
    );
}

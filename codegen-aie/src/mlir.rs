//! MLIR's own parser and verifier over a design's generic text: `mlir-opt` of LLVM/MLIR 22
//! (Debian's `mlir-22-tools`), run as a subprocess with unregistered dialects allowed.
//!
//! `mlir-opt` registers every upstream dialect, so `arith`, `scf` and `memref` operations and the
//! cores' `func.func` functions are verified as the real operations (types, attributes,
//! region terminators, SSA dominance), and the AIE dialects (`aie`, `aiex`) parse in their generic
//! form with MLIR checking the syntax, the types and the SSA names. One operation needs a hand:
//! `func.call` resolves its callee in the nearest symbol table, and MLIR stops that search at the
//! first unregistered operation with one region (`aie.core`: it might be a symbol table), so inside
//! a core no callee can be found without the AIE dialect. The text given to MLIR therefore spells
//! `func.call` as the unregistered `npuc_unresolved.call`, and [`verify_generic`] checks what the
//! callee lookup would: every call names a function the design defines, with its exact
//! `function_type`.
//!
//! The tool is `NPUC_MLIR_OPT` when set, else `mlir-opt-22` or `mlir-opt` on PATH, else
//! `/usr/lib/llvm-22/bin/mlir-opt`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where Debian's LLVM 22 puts its tools.
pub const LLVM_22_BIN: &str = "/usr/lib/llvm-22/bin";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MlirError {
    #[error("mlir-opt not found (looked at NPUC_MLIR_OPT, mlir-opt-22 and mlir-opt on PATH, {LLVM_22_BIN}/mlir-opt): install Debian's mlir-22-tools")]
    NoTool,
    #[error("running {tool}: {detail}")]
    Run { tool: String, detail: String },
    #[error("a kernel call MLIR cannot resolve without the AIE dialect is wrong: {0}")]
    BadCall(String),
    #[error("MLIR rejects the design: {0}")]
    Rejected(String),
}

/// The `mlir-opt` this module runs, or [`MlirError::NoTool`].
pub fn mlir_opt() -> Result<PathBuf, MlirError> {
    if let Some(tool) = std::env::var_os("NPUC_MLIR_OPT") {
        let tool = PathBuf::from(tool);
        return if tool.is_file() { Ok(tool) } else { Err(MlirError::NoTool) };
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .flat_map(|d| [d.join("mlir-opt-22"), d.join("mlir-opt")]);
    on_path.chain([Path::new(LLVM_22_BIN).join("mlir-opt")]).find(|p| p.is_file()).ok_or(MlirError::NoTool)
}

/// The version line `mlir-opt --version` prints (`... LLVM version 22.1.8`).
pub fn version() -> Result<String, MlirError> {
    let tool = mlir_opt()?;
    let out = Command::new(&tool)
        .arg("--version")
        .output()
        .map_err(|e| MlirError::Run { tool: tool.display().to_string(), detail: e.to_string() })?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("LLVM version"))
        .map(|l| l.trim().to_string())
        .ok_or_else(|| MlirError::Run { tool: tool.display().to_string(), detail: format!("no version in {text:?}") })
}

/// Parses the generic text of a design with MLIR and verifies it (see the module doc); the error
/// carries MLIR's first diagnostics, or the call that names no declared kernel.
pub fn verify_generic(text: &str) -> Result<(), MlirError> {
    check_calls(text)?;
    let spelled = text.replace("\"func.call\"(", "\"npuc_unresolved.call\"(");
    let tool = mlir_opt()?;
    let run_err = |detail: String| MlirError::Run { tool: tool.display().to_string(), detail };
    let mut child = Command::new(&tool)
        .args(["--allow-unregistered-dialect", "--verify-roundtrip", "-o", "/dev/null", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| run_err(e.to_string()))?;
    // A broken pipe here means mlir-opt stopped reading early; its exit status and stderr say why.
    let _ = child.stdin.take().expect("stdin was piped").write_all(spelled.as_bytes());
    let out = child.wait_with_output().map_err(|e| run_err(e.to_string()))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).take(3).collect();
    let said =
        if first.is_empty() { stderr.lines().take(3).collect::<Vec<_>>().join(" | ") } else { first.join(" | ") };
    Err(MlirError::Rejected(format!("{} ({})", said.trim(), out.status)))
}

/// Every `func.call` names a `func.func` of its `aie.device` (each device is a symbol table of
/// its own: an array program's designs may each define a function of one name) whose
/// `function_type` is the call's type.
fn check_calls(text: &str) -> Result<(), MlirError> {
    text.split("\"aie.device\"() ({").try_for_each(check_device_calls)
}

/// [`check_calls`] within one device's text.
fn check_device_calls(text: &str) -> Result<(), MlirError> {
    let mut declared = std::collections::HashMap::new();
    for line in text.lines().filter(|l| l.contains("function_type = ")) {
        let (Some(ty), Some(name)) = (attr(line, "function_type = "), attr(line, "sym_name = ")) else {
            return Err(MlirError::BadCall(format!("a declaration without type or name: {}", line.trim())));
        };
        declared.insert(name.trim_matches('"').to_string(), ty.to_string());
    }
    for line in text.lines().filter(|l| l.trim_start().starts_with("\"func.call\"(")) {
        let callee = attr(line, "callee = @").ok_or_else(|| MlirError::BadCall(line.trim().to_string()))?;
        let callee = callee.trim_end_matches('}');
        let ty = line.rsplit_once("} : ").map(|(_, t)| t.trim()).unwrap_or_default();
        match declared.get(callee) {
            None => {
                return Err(MlirError::BadCall(format!("`{callee}` is not declared in the design: {}", line.trim())))
            }
            Some(decl) if decl != ty => {
                return Err(MlirError::BadCall(format!("`{callee}` is declared {decl} but called as {ty}")))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The value of attribute `key` (including its `=` and the space after it) in an attribute
/// dictionary on `line`: up to the next `,` or `}` outside brackets and parentheses.
fn attr<'l>(line: &'l str, key: &str) -> Option<&'l str> {
    let start = line.find(key)? + key.len();
    let mut depth = 0i32;
    for (i, c) in line[start..].char_indices() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' if !line[start..][..i].ends_with('-') => depth -= 1,
            ',' | '}' if depth == 0 => return Some(line[start..start + i].trim()),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECL: &str = "    \"func.func\"() ({\n    }) {function_type = (memref<4x8xi32>) -> (), sym_name = \"zero_i32\", sym_visibility = \"private\"} : () -> ()\n";

    #[test]
    fn calls_must_name_a_declared_kernel_with_its_type() {
        let call = |ty: &str, name: &str| format!("{DECL}        \"func.call\"(%1) {{callee = @{name}}} : {ty}\n");
        assert_eq!(check_calls(&call("(memref<4x8xi32>) -> ()", "zero_i32")), Ok(()));
        let wrong_type = check_calls(&call("(memref<4x16xi32>) -> ()", "zero_i32")).unwrap_err();
        assert!(
            wrong_type.to_string().contains("declared (memref<4x8xi32>) -> () but called as (memref<4x16xi32>) -> ()"),
            "{wrong_type}"
        );
        let unknown = check_calls(&call("(memref<4x8xi32>) -> ()", "matmul_i8_i32")).unwrap_err();
        assert!(unknown.to_string().contains("`matmul_i8_i32` is not declared"), "{unknown}");
    }

    #[test]
    fn attribute_values_end_at_the_first_comma_outside_brackets() {
        let line = "}) {function_type = (memref<4x8xi8>, memref<8x8xi8>) -> (), sym_name = \"m\"} : () -> ()";
        assert_eq!(attr(line, "function_type = "), Some("(memref<4x8xi8>, memref<8x8xi8>) -> ()"));
        assert_eq!(attr(line, "sym_name = "), Some("\"m\""));
        assert_eq!(attr(line, "callee = @"), None);
    }
}

//! MLIR's own parser over a design's generic text (feature `mlir`, melior over LLVM/MLIR 22):
//! unregistered dialects are allowed, so `aie`, `aiex`, `func`, `arith` and `scf` operations parse
//! in their generic form and MLIR checks the syntax, the types, the SSA names and their dominance.

use melior::ir::operation::OperationLike;
use melior::ir::Module;
use melior::Context;

/// Parses `text` as an MLIR module and verifies it; the error carries MLIR's diagnostics.
pub fn parse_generic(text: &str) -> Result<(), String> {
    let context = Context::new();
    context.set_allow_unregistered_dialects(true);
    let module = Module::parse(&context, text).ok_or_else(|| "MLIR could not parse the design".to_string())?;
    if !module.as_operation().verify() {
        return Err("MLIR parsed the design but it does not verify".into());
    }
    Ok(())
}

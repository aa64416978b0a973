//! MLIR's own parser over a design's generic text (feature `mlir`, melior over LLVM/MLIR 22):
//! unregistered dialects are allowed, so `aie`, `aiex`, `func`, `arith` and `scf` operations parse
//! in their generic form and MLIR checks the syntax, the types, the SSA names and their dominance.
//! The upstream `arith` and `scf` dialects are loaded, so the core loops and constants are
//! verified as the real operations (`func` stays unregistered: its calls resolve their callees
//! in the enclosing symbol table, which is the `aie.device` only the AIE dialect knows).

use melior::dialect::DialectHandle;
use melior::ir::operation::OperationLike;
use melior::ir::Module;
use melior::Context;

/// Parses `text` as an MLIR module and verifies it; the error carries MLIR's diagnostics.
pub fn parse_generic(text: &str) -> Result<(), String> {
    let context = Context::new();
    context.set_allow_unregistered_dialects(true);
    DialectHandle::arith().load_dialect(&context);
    DialectHandle::scf().load_dialect(&context);
    let module = Module::parse(&context, text).ok_or_else(|| "MLIR could not parse the design".to_string())?;
    if !module.as_operation().verify() {
        return Err("MLIR parsed the design but it does not verify".into());
    }
    Ok(())
}

//! Rule family `silu-gate`: being written.

use crate::Rewrite;

/// The family's rules.
pub fn rules() -> Vec<Rewrite> {
    vec![]
}

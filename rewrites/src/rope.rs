//! Rule family `rope`: being written.

use crate::Rewrite;

/// The family's rules.
pub fn rules() -> Vec<Rewrite> {
    vec![]
}

//! Which definition of an ai.onnx op a model's opset selects, and whether npuc implements it.
//!
//! An op's definition changes at its since-versions (`data/onnx_since.txt`, written from onnx's
//! schemas by `tools/gen_onnx_since.py`); a since-version marked `*` changed the op's signature
//! (attributes or their defaults, inputs, outputs), the others only widened its types. The
//! evaluator and the rewrites implement the definitions of opsets 13 to 23; a definition with the
//! signature of one of those (a later or earlier version that only changed types) is the same
//! op, and any other is refused, naming the op and the version.

use std::collections::HashMap;
use std::sync::OnceLock;

/// The newest ai.onnx opset the table knows.
pub const MAX_OPSET: i64 = 28;

/// The opsets whose definitions npuc's evaluator and rewrites were written and tested against.
const IMPLEMENTED: std::ops::RangeInclusive<i64> = 13..=23;

const TABLE: &str = include_str!("../data/onnx_since.txt");

/// op → its since-versions in order, each with whether its signature changed there.
fn table() -> &'static HashMap<&'static str, Vec<(i64, bool)>> {
    static T: OnceLock<HashMap<&'static str, Vec<(i64, bool)>>> = OnceLock::new();
    T.get_or_init(|| {
        TABLE
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                let op = words.next()?;
                let versions = words
                    .filter_map(|w| {
                        let changed = w.ends_with('*');
                        w.trim_end_matches('*').parse().ok().map(|v| (v, changed))
                    })
                    .collect();
                Some((op, versions))
            })
            .collect()
    })
}

/// The signature class of the definition `op` has at `opset` (how many signature changes came
/// before it), and its since-version; `None` when the op did not exist yet.
fn definition(history: &[(i64, bool)], opset: i64) -> Option<(usize, i64)> {
    let at = history.iter().rposition(|&(v, _)| v <= opset)?;
    let class = history[..=at].iter().filter(|&&(_, changed)| changed).count();
    Some((class, history[at].0))
}

/// `Ok` when npuc implements `op` as `opset` defines it; otherwise the since-version of that
/// definition and the opsets npuc implements it for.
pub fn check(op: &str, opset: i64) -> Result<(), (i64, String)> {
    let Some(history) = table().get(op) else { return Ok(()) };
    let Some((class, since)) = definition(history, opset) else {
        return Err((0, format!("{op} does not exist at opset {opset}")));
    };
    let implemented: Vec<usize> = IMPLEMENTED.filter_map(|o| definition(history, o).map(|(c, _)| c)).collect();
    if implemented.contains(&class) {
        return Ok(());
    }
    let opsets: Vec<i64> =
        (1..=MAX_OPSET).filter(|&o| definition(history, o).is_some_and(|(c, _)| implemented.contains(&c))).collect();
    let span = match (opsets.first(), opsets.last()) {
        (Some(a), Some(b)) => format!("opsets {a} to {b}"),
        _ => "no opset".into(),
    };
    Err((since, span))
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn definitions_are_accepted_by_signature_and_refused_with_their_version() {
        // Softmax 13 changed the default axis (and with it the semantics): 11 is refused.
        assert_eq!(check("Softmax", 12), Err((11, "opsets 13 to 28".into())));
        assert_eq!(check("Softmax", 26), Ok(()));
        // Reshape 24 and 25 widened types only; Reshape 5 had the shape as an attribute.
        assert_eq!(check("Reshape", 25), Ok(()));
        assert!(check("Reshape", 4).is_err());
        // Add 7 introduced broadcasting, the signature 13 and 14 keep.
        assert_eq!(check("Add", 7), Ok(()));
        // Attention 24 changed its inputs.
        assert_eq!(check("Attention", 24).unwrap_err().0, 24);
        // Ops not in the table (contrib spellings) are not version-checked.
        assert_eq!(check("SimplifiedLayerNormalization", 1), Ok(()));
    }
}

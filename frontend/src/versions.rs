//! Which definition of an ai.onnx op a model's opset selects, and whether npuc implements it.
//!
//! An op's definition changes at its since-versions (`data/onnx_since.txt`, written from onnx's
//! schemas by `tools/gen_onnx_since.py`); a since-version marked `*` changed the op's signature
//! (attributes or their defaults, inputs, outputs), the others only widened its types. The
//! evaluator and the rewrites implement the definitions of opsets 13 to 23; a definition with the
//! signature of one of those (a later or earlier version that only changed types) is the same
//! op. A few other definitions are implemented too ([`ALSO_IMPLEMENTED`]: ones whose new
//! attributes or inputs keep the old meaning when absent, and older forms of ops no rewrite
//! matches, which the evaluator computes by opset); any other is refused, naming the op and the
//! version.

use std::collections::HashMap;
use std::sync::OnceLock;

/// The newest ai.onnx opset the table knows.
pub const MAX_OPSET: i64 = 28;

/// The opsets whose definitions npuc's evaluator and rewrites were written and tested against.
const IMPLEMENTED: std::ops::RangeInclusive<i64> = 13..=23;

/// Definitions outside opsets 13–23 that npuc implements, each named by its op and the
/// since-version of its signature.
#[rustfmt::skip]
const ALSO_IMPLEMENTED: &[(&str, i64)] = &[
    // Before 12, Constant takes a subset of 12's attributes (`value`, `sparse_value`), meaning the same.
    ("Constant", 1), ("Constant", 11),
    // 13 added `axis` for per-axis scales; 10 takes one scale, which 13 reads the same way.
    ("QuantizeLinear", 10), ("DequantizeLinear", 10),
    // 12 added `select_last_index`, whose default (0) is the earlier behaviour.
    ("ArgMax", 1), ("ArgMin", 1),
    // 24 added `round_mode`, which only governs casts to float8e8m0 (a type 24 added too).
    ("Cast", 24), ("CastLike", 24),
    // 24 added the optional `nonpad_kv_seqlen` input; the evaluator implements it.
    ("Attention", 24),
    // Before 13 these coerce the input to 2-D at `axis` (default 1); the evaluator does both. No
    // rewrite matches them (Softmax stays at 13+: the attention rewrites assume its axis).
    ("LogSoftmax", 1), ("Hardmax", 1),
    // Pad 1 (`paddings`), 2 (`pads` and `value` attributes); TopK 1 (`k` attribute), 10 (`k` input,
    // always the largest, sorted): the evaluator reads each by opset.
    ("Pad", 1), ("Pad", 2), ("TopK", 1), ("TopK", 10),
];

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
    let also = ALSO_IMPLEMENTED.iter().filter(|(o, _)| *o == op).map(|&(_, v)| v);
    let implemented: Vec<usize> =
        IMPLEMENTED.chain(also).filter_map(|o| definition(history, o).map(|(c, _)| c)).collect();
    if implemented.contains(&class) {
        return Ok(());
    }
    let opsets: Vec<i64> =
        (1..=MAX_OPSET).filter(|&o| definition(history, o).is_some_and(|(c, _)| implemented.contains(&c))).collect();
    Err((since, spans(&opsets)))
}

/// Ascending opsets as runs: "opsets 1 to 9, 12, 14 to 28".
fn spans(opsets: &[i64]) -> String {
    let mut runs: Vec<(i64, i64)> = Vec::new();
    for &o in opsets {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == o => *end = o,
            _ => runs.push((o, o)),
        }
    }
    if runs.is_empty() {
        return "no opset".into();
    }
    let text: Vec<String> =
        runs.iter().map(|(a, b)| if a == b { a.to_string() } else { format!("{a} to {b}") }).collect();
    let noun = if opsets.len() == 1 { "opset" } else { "opsets" };
    format!("{noun} {}", text.join(", "))
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
        // 24 only added an optional input npuc implements; 25 added sliding-window attributes.
        assert_eq!(check("Attention", 24), Ok(()));
        assert_eq!(check("Attention", 25), Err((25, "opsets 23 to 24".into())));
        // Cast 24 added `round_mode`, which only affects float8e8m0; 25 widened types.
        assert_eq!(check("Cast", 25), Ok(()));
        // Constant 11 (no value_* attributes yet) and LogSoftmax 11 (2-D coercion) are implemented.
        assert_eq!(check("Constant", 11), Ok(()));
        assert_eq!(check("LogSoftmax", 11), Ok(()));
        // QuantizeLinear 10 (one scale) reads as 13 does.
        assert_eq!(check("QuantizeLinear", 10), Ok(()));
        // Ops not in the table (contrib spellings) are not version-checked.
        assert_eq!(check("SimplifiedLayerNormalization", 1), Ok(()));
    }

    #[test]
    fn refusals_name_the_implemented_opsets_as_runs() {
        assert_eq!(super::spans(&[1, 2, 3, 7, 9, 10]), "opsets 1 to 3, 7, 9 to 10");
        assert_eq!(super::spans(&[23]), "opset 23");
        assert_eq!(super::spans(&[]), "no opset");
    }
}

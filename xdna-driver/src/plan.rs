//! What the compiler and the runtime agree on about an xdna bundle's host plan: where the bundle
//! keeps it, and which calls run on the array. `codegen-aie` writes the plan (its `plan::route`
//! is [`route_rows`] on the plan's numbers); the runtime's `xrt` backend reads those numbers back
//! and routes each call with the same function, so the two cannot disagree.
//!
//! A call with fewer rows than the threshold (decode) runs on the host. Larger calls are cut into
//! M-blocks: the prefill block while more than the smallest block is left, then the smallest
//! block the array takes (the design for `decode_rows`) for the rest.

/// Where a bundle keeps the plan.
pub const PLAN_FILE: &str = "xdna/plan.json";

/// Where a call of `rows` rows runs, from the numbers `xdna/plan.json` records: `None` on the
/// host, else the M-blocks `(design rows, rows used)` it is cut into.
pub fn route_rows(
    host_threshold_rows: usize,
    decode_rows: usize,
    prefill_rows: usize,
    rows: usize,
) -> Option<Vec<(usize, usize)>> {
    if rows < host_threshold_rows || decode_rows == 0 {
        return None;
    }
    let prefill = prefill_rows.max(decode_rows);
    let mut blocks = vec![];
    let mut left = rows;
    while left > 0 {
        let block = if left <= decode_rows { decode_rows } else { prefill };
        let used = left.min(block);
        blocks.push((block, used));
        left -= used;
    }
    Some(blocks)
}

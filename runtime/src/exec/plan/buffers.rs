//! Buffers shared by liveness.

use super::Loc;
use crate::exec::program::Program;

/// Gives every buffer-held value one of as few buffers as liveness allows: a buffer is reused
/// once every value stored in it has been read for the last time. The values `returned` (the
/// logits, hidden states) live to the end of the step; `input` (hidden states the caller gives,
/// storage root 0) from its start. Returns the number of buffers; `locs` then names buffers
/// instead of storage roots.
pub(super) fn assign_buffers(
    program: &Program,
    locs: &mut [Loc],
    roots: usize,
    returned: &[usize],
    input: Option<usize>,
) -> usize {
    const FOREVER: usize = usize::MAX;
    let mut last_use = vec![0usize; roots];
    let mut defined_at = vec![FOREVER; roots];
    for (n, node) in program.nodes.iter().enumerate() {
        for &v in &node.outputs {
            if let Loc::Buf(r) = locs[v] {
                defined_at[r] = defined_at[r].min(n);
                last_use[r] = last_use[r].max(n);
            }
        }
        for v in node.inputs.iter().flatten() {
            if let Loc::Buf(r) = locs[*v] {
                last_use[r] = last_use[r].max(n);
            }
        }
    }
    for &v in returned {
        if let Loc::Buf(r) = locs[v] {
            last_use[r] = FOREVER;
        }
    }
    let mut buffer_of = vec![usize::MAX; roots];
    let mut free: Vec<usize> = Vec::new();
    let mut buffers = 0;
    if let Some(Loc::Buf(r)) = input.map(|v| locs[v]) {
        buffer_of[r] = 0;
        buffers = 1;
    }
    for (n, node) in program.nodes.iter().enumerate() {
        for &v in &node.outputs {
            if let Loc::Buf(r) = locs[v] {
                if defined_at[r] == n && buffer_of[r] == usize::MAX {
                    buffer_of[r] = free.pop().unwrap_or_else(|| {
                        buffers += 1;
                        buffers - 1
                    });
                }
            }
        }
        // Released after this node's outputs took theirs, so no output shares an input's buffer.
        let mut released: Vec<usize> = node
            .inputs
            .iter()
            .flatten()
            .chain(&node.outputs)
            .filter_map(|&v| match locs[v] {
                Loc::Buf(r) if last_use[r] == n => Some(r),
                _ => None,
            })
            .collect();
        released.sort_unstable();
        released.dedup();
        free.extend(released.into_iter().map(|r| buffer_of[r]));
    }
    for loc in locs.iter_mut() {
        if let Loc::Buf(r) = loc {
            *loc = Loc::Buf(buffer_of[*r]);
        }
    }
    buffers
}

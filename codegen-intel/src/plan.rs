//! The `npuc-intel/1` plan ([`bundle::intel::Plan`]) of a compiled program: the segments lowered
//! for every block size, the attentions between them, the schedule and the RoPE tables.

use crate::lower::Lower;
use crate::partition::{Parts, Segment};
use crate::rope::RopeTables;
use crate::xml::Bin;
use crate::IntelError;
use bundle::intel;
use ir::graph::{Graph, NodeId};
use std::collections::{BTreeMap, HashSet};
use std::num::NonZeroUsize;

/// What the segments are lowered with: the program, the shared weights file, the RoPE tables and
/// the weights stored as f16.
pub(crate) struct Lowering<'a> {
    pub g: &'a Graph,
    pub bin: &'a mut Bin,
    pub rope: &'a RopeTables,
    pub f16_weights: &'a HashSet<ir::WeightId>,
}

impl Lowering<'_> {
    /// Lowers segment `index` for each block size (block 1 only for a last-row segment) and each
    /// verify block size (a last-row segment's over every row): its plan entry and its networks
    /// as `(file name, IR text)`.
    pub(crate) fn segment(
        &mut self,
        index: usize,
        seg: &Segment,
        blocks: &[usize],
        verify_blocks: &[usize],
    ) -> Result<(intel::Segment, Vec<(String, String)>), IntelError> {
        let mut sizes: Vec<usize> = if seg.last_row_only { vec![1] } else { blocks.to_vec() };
        sizes.extend(verify_blocks);
        sizes.sort_unstable();
        sizes.dedup();
        let every_row = Segment { last_row_only: false, ..seg.clone() };
        let mut entry = intel::Segment {
            name: seg.name.clone(),
            index,
            files: BTreeMap::new(),
            last_row_only: seg.last_row_only,
            inputs: vec![],
            outputs: vec![],
        };
        let mut xml = Vec::new();
        for (i, &t) in sizes.iter().enumerate() {
            let name = format!("{}_t{t}", seg.name);
            let mut lower = Lower::new(self.g, self.bin, self.rope, self.f16_weights, &name, t);
            let (inputs, outputs) = lower.segment(if t == 1 { seg } else { &every_row })?;
            let file = format!("{name}.xml");
            xml.push((file.clone(), lower.net.to_xml()));
            entry.files.insert(t, file);
            if i == 0 {
                (entry.inputs, entry.outputs) = (inputs, outputs);
                continue;
            }
            for (e, lowered) in entry.inputs.iter_mut().zip(inputs) {
                e.shape.extend(lowered.shape);
            }
            for (e, lowered) in entry.outputs.iter_mut().zip(outputs) {
                e.shape.extend(lowered.shape);
            }
        }
        Ok((entry, xml))
    }
}

/// Stores the RoPE tables in the weights file: the plan's `rope`.
pub(crate) fn rope(tables: &RopeTables, bin: &mut Bin) -> intel::Rope {
    let mut stored = BTreeMap::new();
    for (name, values) in &tables.tables {
        let (offset, size) = bin.keyed(name, || values.iter().flat_map(|v| v.to_le_bytes()).collect());
        stored.insert(name.clone(), intel::ByteRange { offset: offset as u64, size: size as u64 });
    }
    intel::Rope { positions: tables.positions, width: tables.width, tables: stored }
}

/// The plan's entry for attention node `a` of layer `layer`.
pub(crate) fn attention(g: &Graph, layer: usize, a: NodeId, bin: &mut Bin) -> Result<intel::Attention, IntelError> {
    let n = g.node(a);
    let missing =
        |what: &str| IntelError::Unsupported { node: n.name.clone(), msg: format!("attention without {what}") };
    let input = |i: usize, what: &str| {
        n.inputs.get(i).copied().flatten().map(|v| g.value(v).name.clone()).ok_or_else(|| missing(what))
    };
    let count = |key: &str| {
        let value = n.attrs.int(key).ok().flatten();
        value.and_then(|c| usize::try_from(c).ok()).ok_or_else(|| missing(&format!("a `{key}` count")))
    };
    let head_dim = n.inputs[0].and_then(|v| g.value(v).shape.last().and_then(|d| d.as_known())).unwrap_or(0);
    let scale = n.attrs.float("scale").ok().flatten().unwrap_or(1.0 / (head_dim as f32).sqrt());
    let window = n.attrs.int("window").ok().flatten().filter(|&w| w > 0);
    let q_heads = count("q_heads")?;
    let sinks = match n.inputs.get(6).copied().flatten() {
        None => None,
        Some(s) => Some(sinks(g, n, s, q_heads, bin)?),
    };
    Ok(intel::Attention {
        layer,
        node: n.name.clone(),
        q: input(0, "q")?,
        k: input(1, "k")?,
        v: input(2, "v")?,
        y: g.value(n.outputs[0]).name.clone(),
        q_heads,
        kv_heads: count("kv_heads")?,
        head_dim: head_dim as usize,
        scale,
        window: window.and_then(|w| NonZeroUsize::new(w as usize)),
        sinks,
    })
}

/// Attention `n`'s sinks `s` (a weight of one value per query head), stored as f32 in the
/// weights file.
fn sinks(
    g: &Graph,
    n: &ir::Node,
    s: ir::graph::ValueId,
    heads: usize,
    bin: &mut Bin,
) -> Result<intel::ByteRange, IntelError> {
    let fail = |msg: String| IntelError::Unsupported { node: n.name.clone(), msg };
    let ir::graph::ValueDef::Weight(w) = g.value(s).def else {
        return Err(fail(format!("attention sinks `{}` that are not a weight", g.value(s).name)));
    };
    let w = g.weights.get(w);
    let values = w.to_tensor().map_err(|e| fail(e.to_string()))?.to_f32_vec();
    if values.len() != heads {
        return Err(fail(format!("{} attention sinks for {heads} query heads", values.len())));
    }
    let (offset, size) =
        bin.keyed(&format!("host:{}", w.name), || values.iter().flat_map(|v| v.to_le_bytes()).collect());
    Ok(intel::ByteRange { offset: offset as u64, size: size as u64 })
}

/// Stage by stage: the segment of the stage (when it computes anything), then the attentions and
/// host steps of that stage in program order (a stage's cuts read only earlier stages' values);
/// the lm_head segment last.
pub(crate) fn schedule(parts: &Parts) -> Vec<intel::Step> {
    let attentions = parts.attention_stage.iter().zip(&parts.attentions).enumerate();
    let hosts = parts.host_stage.iter().zip(&parts.host).enumerate();
    let mut cuts: Vec<(usize, NodeId, intel::Step)> = attentions
        .map(|(i, (&s, &n))| (s, n, intel::Step::Attention(i)))
        .chain(hosts.map(|(i, (&s, &n))| (s, n, intel::Step::Host(i))))
        .collect();
    cuts.sort_by_key(|&(s, n, _)| (s, n.0));
    let last = parts.segments.iter().filter_map(|s| s.stage).chain(cuts.iter().map(|c| c.0)).max().unwrap_or(0);
    let mut schedule = Vec::new();
    for stage in 0..=last {
        if let Some(si) = parts.segments.iter().position(|s| s.stage == Some(stage)) {
            schedule.push(intel::Step::Segment(si));
        }
        schedule.extend(cuts.iter().filter(|c| c.0 == stage).map(|c| c.2));
    }
    if let Some(si) = parts.segments.iter().position(|s| s.stage.is_none()) {
        schedule.push(intel::Step::Segment(si));
    }
    schedule
}

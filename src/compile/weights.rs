//! The program's weights in the bundle: each stored once under its model name, in the model's
//! layout — except the weights the host kernels read packed, which are packed here by the kernels'
//! own functions and stored in their layout with a `bundle::packing` description:
//!
//! - `WGemm` weights by `pack_wgemm`; the MatMulNBits tensors they come from are left out when
//!   nothing else reads them (a tied embedding read by `GatherBlockQuantized` with the lm_head's
//!   very codes, scales and zero points reads the packed form);
//! - `Moe` code experts the same way, each projection `[E, rows, K]` as one WGemm weight of E·rows
//!   columns when `rows` is a whole number of panels (the executor runs each expert on its run of
//!   panels), the QMoE tensors left out likewise;
//! - the int8 codes of `QGemm` nodes by `pack_qgemm_codes` (codes and column sums), their `[K, N]`
//!   codes left out when only packed QGemms read them;
//! - the f32 weights of float MatMuls as the f32 GEMM's panels, the `[K, N]` weight left out when
//!   only such MatMuls read it.
//!
//! A target whose device streams the `[K, N]` int8 codes or f32 weights itself (`xdna`) keeps
//! them as they are ([`HostPacking::WGemmOnly`]); the host executor packs them at load when it
//! runs such a bundle. `runtime::exec::packed` documents the layouts.

use anyhow::{anyhow, bail, Context, Result};
use bundle::packing::{gemm_panels_name, qgemm_names, wgemm_names, GemmLayout, Packing, QGemmLayout, RawStorage};
use bundle::{BundleWriter, Dtype};
use ir::graph::{Graph, ValueDef};
use ir::{DType, ValueId, WeightId};
use runtime::exec::packed::{qgemm_tensor_bytes, tensor_bytes, wgemm_layout};
use runtime::kernels::gemm::{f32_panels_len, F32_PANEL};
use runtime::kernels::qgemm::{pack_qgemm_codes, QWeightCodes};
use runtime::kernels::wgemm::{pack_wgemm, MatMulNBits, NBitsZeroPoints, PackedWGemm, PANEL};
use std::collections::{BTreeSet, HashMap};
use std::io::Write;

/// Which weights are packed for the host kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPacking {
    /// WGemm, QGemm and float MatMul weights.
    All,
    /// WGemm weights only: QGemm codes and float MatMul weights stay `[K, N]` for a device.
    WGemmOnly,
}

/// How many weights a bundle stores, and how many of them packed per kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    pub tensors: usize,
    pub wgemm: usize,
    pub qgemm: usize,
    pub gemm: usize,
}

impl Stored {
    /// Weights stored as the model has them plus packed ones.
    pub fn total(&self) -> usize {
        self.tensors + self.wgemm + self.qgemm + self.gemm
    }
}

/// Stores every weight `g` reads, each once, packed as `packing` says. A name the bundle already
/// holds (a tensor a drafter program shares with the decoder's) is not stored again: the caller
/// names tensors so that one name is one content.
pub fn store(w: &mut BundleWriter, g: &Graph, packing: HostPacking) -> Result<Stored> {
    let packed = pack_wgemm_weights(g)?;
    let (qpacked, (gemm_panels, gemm_omitted)) = match packing {
        HostPacking::All => (pack_qgemm_weights(g)?, gemm_panel_weights(g)),
        HostPacking::WGemmOnly => (QPackedWeights::default(), Default::default()),
    };
    let omitted =
        |id: &WeightId| packed.omitted.contains(id) || qpacked.omitted.contains(id) || gemm_omitted.contains(id);
    let mut stored = BTreeSet::new();
    for v in &g.values {
        let ValueDef::Weight(id) = v.def else { continue };
        let wt = g.weights.get(id);
        if omitted(&id) || w.has_tensor(&wt.name) || !stored.insert(id) {
            continue;
        }
        let (dtype, shape, layout) = storage_of(wt.dtype, &wt.shape, wt.bytes.len());
        w.add_tensor(&wt.name, dtype, &shape, &wt.bytes, layout.as_ref())
            .with_context(|| format!("storing weight `{}`", wt.name))?;
    }
    let mut counts = Stored { tensors: stored.len(), ..Stored::default() };
    for entry in &packed.entries {
        counts.wgemm += usize::from(write_packed(w, g, entry)?);
    }
    for &id in &gemm_panels {
        counts.gemm += usize::from(write_gemm_panels(w, g, id)?);
    }
    for entry in &qpacked.entries {
        counts.qgemm += usize::from(write_qpacked(w, entry)?);
    }
    Ok(counts)
}

/// Writes one packed QGemm weight; false when the bundle already holds it.
fn write_qpacked(w: &mut BundleWriter, entry: &QPackedEntry) -> Result<bool> {
    let (codes_name, sums_name) = qgemm_names(&entry.layout.source);
    if w.has_tensor(&codes_name) {
        return Ok(false);
    }
    let [(codes_dtype, codes), (sums_dtype, sums)] = qgemm_tensor_bytes(&entry.codes, &entry.col_sums);
    let layout = entry.layout.to_metadata();
    w.add_tensor(&codes_name, codes_dtype, &[codes.len()], &codes, Some(&layout))
        .with_context(|| format!("storing packed weight `{codes_name}`"))?;
    w.add_tensor(&sums_name, sums_dtype, &[sums.len() / 4], &sums, None)
        .with_context(|| format!("storing packed weight `{sums_name}`"))?;
    Ok(true)
}

/// The f32 `[K, N]` weights of float MatMuls (read directly as the right operand), and those of
/// them nothing else reads but MatMuls and a Gather of their transpose (they are stored only as
/// panels; the executor gathers a tied embedding's rows from the lm_head's panels).
fn gemm_panel_weights(g: &Graph) -> (Vec<WeightId>, BTreeSet<WeightId>) {
    let mut panels: Vec<WeightId> = Vec::new();
    for node in g.nodes.iter().filter(|n| n.domain == ir::Domain::Onnx && n.op == "MatMul") {
        let Some(id) = weight_of(g, input(node, 1)) else { continue };
        let wt = g.weights.get(id);
        if wt.dtype == DType::F32 && wt.shape.len() == 2 && !panels.contains(&id) {
            panels.push(id);
        }
    }
    let mut other_readers: BTreeSet<WeightId> = g.outputs.iter().filter_map(|&o| weight_of(g, Some(o))).collect();
    for node in &g.nodes {
        for (slot, v) in node.inputs.iter().enumerate() {
            let Some(id) = weight_of(g, *v) else { continue };
            let read_as_panels = node.domain == ir::Domain::Onnx
                && ((node.op == "MatMul" && slot == 1) || (node.op == "Transpose" && gathered_transpose(g, node)));
            if !read_as_panels {
                other_readers.insert(id);
            }
        }
    }
    let omitted = panels.iter().copied().filter(|id| !other_readers.contains(id)).collect();
    (panels, omitted)
}

/// Whether `node` (a Transpose) swaps the two axes of a matrix and only Gathers along axis 0 read
/// it: an embedding table that is a `[hidden, vocab]` weight transposed.
fn gathered_transpose(g: &Graph, node: &ir::Node) -> bool {
    let Some(&out) = node.outputs.first() else { return false };
    let swaps = matches!(node.attrs.ints("perm"), Ok(Some([1, 0]))) && g.value(out).shape.len() == 2;
    let mut readers = g.nodes.iter().flat_map(|n| n.inputs.iter().enumerate().map(move |(slot, v)| (n, slot, *v)));
    swaps
        && !g.outputs.contains(&out)
        && readers.all(|(n, slot, v)| {
            v != Some(out)
                || (n.domain == ir::Domain::Onnx
                    && n.op == "Gather"
                    && slot == 0
                    && matches!(n.attrs.int("axis"), Ok(None | Some(0))))
        })
}

/// Stores the panels of the f32 weight `id`, one panel at a time (the packed weight is never
/// held whole in memory).
fn write_gemm_panels(w: &mut BundleWriter, g: &Graph, id: WeightId) -> Result<bool> {
    let wt = g.weights.get(id);
    let (k, n) = (wt.shape[0], wt.shape[1]);
    let name = gemm_panels_name(&wt.name);
    if w.has_tensor(&name) {
        return Ok(false);
    }
    let layout = GemmLayout { k, n, source: wt.name.clone() }.to_metadata();
    let bytes = &wt.bytes;
    w.add_tensor_with(&name, Dtype::F32, &[f32_panels_len(k, n)], Some(&layout), |sink| {
        let mut panel = vec![0u8; k * F32_PANEL * 4];
        for p in 0..n.div_ceil(F32_PANEL) {
            let cols = F32_PANEL.min(n - p * F32_PANEL);
            panel.fill(0);
            for kk in 0..k {
                let src = &bytes[(kk * n + p * F32_PANEL) * 4..][..cols * 4];
                panel[kk * F32_PANEL * 4..][..cols * 4].copy_from_slice(src);
            }
            sink.write_all(&panel)?;
        }
        Ok(())
    })
    .with_context(|| format!("storing packed weight `{name}`"))?;
    Ok(true)
}

/// One QGemm weight packed at compile time: its layout description, codes and column sums.
struct QPackedEntry {
    layout: QGemmLayout,
    codes: Vec<i8>,
    col_sums: Vec<i32>,
}

/// The QGemm weights of a program packed for the kernels, and the `[K, N]` codes nothing reads
/// but packed QGemms (they are not stored).
#[derive(Default)]
struct QPackedWeights {
    entries: Vec<QPackedEntry>,
    omitted: BTreeSet<WeightId>,
}

/// Packs the weight codes of every QGemm node that reads them directly from a 2-D u8 or i8
/// weight; codes the program computes (a weight quantised in the graph) are packed at load.
fn pack_qgemm_weights(g: &Graph) -> Result<QPackedWeights> {
    let mut entries = Vec::new();
    let mut packed: BTreeSet<WeightId> = BTreeSet::new();
    for node in g.nodes.iter().filter(|n| n.domain == ir::Domain::Npuc && n.op == "QGemm") {
        let Some(id) = weight_of(g, input(node, 3)) else { continue };
        let wt = g.weights.get(id);
        let unsigned = match wt.dtype {
            DType::U8 => true,
            DType::I8 => false,
            _ => continue,
        };
        let [k, n] = wt.shape[..] else { continue };
        if !packed.insert(id) {
            continue;
        }
        let codes = if unsigned {
            QWeightCodes::U8(&wt.bytes)
        } else {
            // SAFETY: i8 has the size and alignment of u8, and every bit pattern is valid.
            QWeightCodes::I8(unsafe { std::slice::from_raw_parts(wt.bytes.as_ptr().cast::<i8>(), wt.bytes.len()) })
        };
        let (codes, col_sums) = pack_qgemm_codes(k, n, codes)
            .with_context(|| format!("packing the weights of QGemm node `{}`", node.name))?;
        entries.push(QPackedEntry { layout: QGemmLayout { k, n, source: wt.name.clone(), unsigned }, codes, col_sums });
    }
    // A source is left out when every value naming it is read only as a packed QGemm's weight.
    let mut other_readers: BTreeSet<WeightId> = BTreeSet::new();
    for node in &g.nodes {
        for (slot, v) in node.inputs.iter().enumerate() {
            let Some(id) = weight_of(g, *v) else { continue };
            let is_packed_qgemm = node.domain == ir::Domain::Npuc && node.op == "QGemm" && slot == 3;
            if !is_packed_qgemm {
                other_readers.insert(id);
            }
        }
    }
    for &o in &g.outputs {
        other_readers.extend(weight_of(g, Some(o)));
    }
    let omitted = packed.difference(&other_readers).copied().collect();
    Ok(QPackedWeights { entries, omitted })
}

/// One WGemm weight packed at compile time: its codes, scales and zero-point weights and the
/// packed buffers.
struct PackedEntry {
    codes: WeightId,
    scales: WeightId,
    zero_points: Option<WeightId>,
    packed: PackedWGemm,
}

/// The WGemm weights of a program packed for the kernels, and the MatMulNBits weights nothing
/// reads any more but through their packed form (they are not stored).
struct PackedWeights {
    entries: Vec<PackedEntry>,
    omitted: BTreeSet<WeightId>,
}

fn weight_of(g: &Graph, v: Option<ValueId>) -> Option<WeightId> {
    match g.value(v?).def {
        ValueDef::Weight(w) => Some(w),
        _ => None,
    }
}

fn input(node: &ir::Node, slot: usize) -> Option<ValueId> {
    node.inputs.get(slot).copied().flatten()
}

const ALIAS_OPS: [&str; 5] = ["Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"];

/// The weight `v` is, through aliases (Reshape, Unsqueeze, ...).
fn weight_root(g: &Graph, mut v: ValueId) -> Option<WeightId> {
    loop {
        match g.value(v).def {
            ValueDef::Weight(w) => return Some(w),
            ValueDef::Node { node, .. } => {
                let n = g.node(node);
                if n.domain != ir::Domain::Onnx || !ALIAS_OPS.contains(&n.op) {
                    return None;
                }
                v = input(n, 0)?;
            }
            _ => return None,
        }
    }
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect()
}

/// Packs the weights of every WGemm node whose codes, scales and zero points are weights in the
/// dtypes the kernels take (u8 codes, f32 scales, u8 or f32 zero points, no `g_idx`); the others
/// keep the MatMulNBits layout and are packed by the executor at load.
fn pack_wgemm_weights(g: &Graph) -> Result<PackedWeights> {
    let mut entries: Vec<PackedEntry> = Vec::new();
    let mut by_codes: HashMap<WeightId, usize> = HashMap::new();
    for node in g.nodes.iter().filter(|n| n.domain == ir::Domain::Npuc && n.op == "WGemm") {
        let Some((codes, scales, zero_points)) = wgemm_sources(g, node) else { continue };
        if let Some(&i) = by_codes.get(&codes) {
            if (entries[i].scales, entries[i].zero_points) != (scales, zero_points) {
                bail!(
                    "WGemm node `{}` reads codes `{}` with other scales or zero points than another WGemm node; each packed weight has one set",
                    node.name,
                    g.weights.get(codes).name
                );
            }
            continue;
        }
        let Some(packed) = pack_wgemm_node(g, node, codes, scales, zero_points)? else { continue };
        by_codes.insert(codes, entries.len());
        entries.push(PackedEntry { codes, scales, zero_points, packed });
    }
    for node in g.nodes.iter().filter(|n| n.domain == ir::Domain::Npuc && n.op == "Moe") {
        for slots in MOE_PROJECTIONS {
            let Some((codes, scales)) = moe_sources(g, node, slots) else { continue };
            if let Some(&i) = by_codes.get(&codes) {
                if entries[i].scales != scales {
                    bail!(
                        "Moe node `{}` reads expert codes `{}` with other scales than another node; each packed weight has one set",
                        node.name,
                        g.weights.get(codes).name
                    );
                }
                continue;
            }
            let Some(packed) = pack_moe_projection(g, node, codes, scales)? else { continue };
            by_codes.insert(codes, entries.len());
            entries.push(PackedEntry { codes, scales, zero_points: None, packed });
        }
    }
    let omitted = only_packed_sources(g, &entries, &by_codes);
    Ok(PackedWeights { entries, omitted })
}

/// A WGemm node's codes, scales and zero-point weights, when each operand it has is a weight
/// and it reads no `g_idx`.
fn wgemm_sources(g: &Graph, node: &ir::Node) -> Option<(WeightId, WeightId, Option<WeightId>)> {
    let (codes, scales) = (weight_of(g, input(node, 1))?, weight_of(g, input(node, 2))?);
    let zero_points = weight_of(g, input(node, 3));
    if (input(node, 3).is_some() && zero_points.is_none()) || input(node, 4).is_some() {
        return None;
    }
    Some((codes, scales, zero_points))
}

/// One WGemm node's weights packed by the kernels' `pack_wgemm`, or `None` for dtypes the
/// kernels do not take.
fn pack_wgemm_node(
    g: &Graph,
    node: &ir::Node,
    codes: WeightId,
    scales: WeightId,
    zero_points: Option<WeightId>,
) -> Result<Option<PackedWGemm>> {
    let (b, s) = (g.weights.get(codes), g.weights.get(scales));
    if b.dtype != DType::U8 || s.dtype != DType::F32 {
        return Ok(None);
    }
    let attr = |key: &str| -> Result<usize> {
        node.attrs
            .int(key)
            .ok()
            .flatten()
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| anyhow!("WGemm node `{}`: attribute {key} is missing or negative", node.name))
    };
    let scale_values = f32_values(&s.bytes);
    let float_zero_points;
    let zp = match zero_points.map(|z| g.weights.get(z)) {
        None => NBitsZeroPoints::Default,
        Some(z) if z.dtype == DType::U8 => NBitsZeroPoints::Packed(&z.bytes),
        Some(z) if z.dtype == DType::F32 => {
            float_zero_points = f32_values(&z.bytes);
            NBitsZeroPoints::Float(&float_zero_points)
        }
        Some(_) => return Ok(None),
    };
    let src = MatMulNBits {
        k: attr("K")?,
        n: attr("N")?,
        bits: attr("bits")?,
        block_size: attr("block_size")?,
        b: &b.bytes,
        scales: &scale_values,
        zero_points: zp,
    };
    let packed = pack_wgemm(&src).with_context(|| format!("packing the weights of WGemm node `{}`", node.name))?;
    Ok(Some(packed))
}

/// The (codes, scales) input slots of a Moe node's fc1 and fc2 experts.
const MOE_PROJECTIONS: [(usize, usize); 2] = [(2, 3), (5, 6)];

/// A Moe projection's codes and scale weights, when it has both.
fn moe_sources(g: &Graph, node: &ir::Node, (codes, scales): (usize, usize)) -> Option<(WeightId, WeightId)> {
    Some((weight_of(g, input(node, codes))?, weight_of(g, input(node, scales))?))
}

/// One Moe projection's code experts `[E, rows, K·bits/8]` (scales `[E, rows, K/block]`, the
/// default zero point) packed as one WGemm weight of E·rows columns, or `None` when an expert's
/// rows are not whole panels (each expert must be a run of panels) or the dtypes or blocks are
/// not ones the kernels take.
fn pack_moe_projection(g: &Graph, node: &ir::Node, codes: WeightId, scales: WeightId) -> Result<Option<PackedWGemm>> {
    let (b, s) = (g.weights.get(codes), g.weights.get(scales));
    let int = |key: &str, default: i64| node.attrs.int(key).ok().flatten().unwrap_or(default);
    let bits = int("expert_weight_bits", 4);
    let (&[e, rows, row_bytes], 4 | 8) = (&b.shape[..], bits) else { return Ok(None) };
    let bits = bits as usize;
    let k = row_bytes * 8 / bits;
    let block = match int("block_size", 0) {
        0 => k,
        bs => usize::try_from(bs).unwrap_or(0),
    };
    if b.dtype != DType::U8
        || s.dtype != DType::F32
        || !rows.is_multiple_of(PANEL)
        || !block.is_multiple_of(16)
        || block == 0
        || !k.is_multiple_of(block)
    {
        return Ok(None);
    }
    let scale_values = f32_values(&s.bytes);
    let src = MatMulNBits {
        k,
        n: e * rows,
        bits,
        block_size: block,
        b: &b.bytes,
        scales: &scale_values,
        zero_points: NBitsZeroPoints::Default,
    };
    let packed =
        pack_wgemm(&src).with_context(|| format!("packing the experts `{}` of Moe node `{}`", b.name, node.name))?;
    Ok(Some(packed))
}

/// The weights of packed entries that nothing reads but through their packed form.
fn only_packed_sources(g: &Graph, entries: &[PackedEntry], by_codes: &HashMap<WeightId, usize>) -> BTreeSet<WeightId> {
    let mut consumers: HashMap<ValueId, Vec<(usize, usize)>> = HashMap::new();
    for (n, node) in g.nodes.iter().enumerate() {
        for (slot, v) in node.inputs.iter().enumerate() {
            if let Some(v) = v {
                consumers.entry(*v).or_default().push((n, slot));
            }
        }
    }
    let readers = Readers { g, consumers, entries, by_codes };
    let mut omitted = BTreeSet::new();
    for e in entries {
        let sources: Vec<WeightId> = [Some(e.codes), Some(e.scales), e.zero_points].into_iter().flatten().collect();
        let only_packed = sources.iter().all(|&w| {
            g.values
                .iter()
                .enumerate()
                .filter(|(_, v)| matches!(v.def, ValueDef::Weight(id) if id == w))
                .all(|(i, _)| readers.only_packed(ValueId(i as u32)))
        });
        if only_packed {
            omitted.extend(sources);
        }
    }
    omitted
}

/// Who reads each value, to tell whether a weight is read only through its packed form.
struct Readers<'a> {
    g: &'a Graph,
    consumers: HashMap<ValueId, Vec<(usize, usize)>>,
    entries: &'a [PackedEntry],
    by_codes: &'a HashMap<WeightId, usize>,
}

impl Readers<'_> {
    /// Whether every reader of `v` reads it through a packed entry: the entry's own WGemm, or a
    /// GatherBlockQuantized of the entry's very table (through aliases).
    fn only_packed(&self, v: ValueId) -> bool {
        let g = self.g;
        if g.outputs.contains(&v) {
            return false;
        }
        self.consumers.get(&v).into_iter().flatten().all(|&(n, slot)| {
            let node = &g.nodes[n];
            match (node.domain, node.op) {
                (ir::Domain::Onnx, op) if ALIAS_OPS.contains(&op) && slot == 0 => {
                    node.outputs.iter().all(|&o| self.only_packed(o))
                }
                (ir::Domain::Npuc, "WGemm") => {
                    (1..=3).contains(&slot)
                        && weight_of(g, input(node, 1)).is_some_and(|c| self.by_codes.contains_key(&c))
                }
                (ir::Domain::Npuc, "Moe") => MOE_PROJECTIONS.iter().any(|&(codes, scales)| {
                    (slot == codes || slot == scales)
                        && weight_of(g, input(node, codes)).is_some_and(|c| self.by_codes.contains_key(&c))
                }),
                (ir::Domain::Microsoft, "GatherBlockQuantized") => {
                    [0, 2, 3].contains(&slot) && tied_gather(g, node, self.entries, self.by_codes)
                }
                _ => false,
            }
        })
    }
}

/// Whether a GatherBlockQuantized node gathers rows of a packed entry's table: its data is the
/// entry's codes (through aliases), with the entry's scales, zero points, bits, block size and
/// shape, gathered along axis 0 and quantised along the last.
fn tied_gather(g: &Graph, node: &ir::Node, entries: &[PackedEntry], by_codes: &HashMap<WeightId, usize>) -> bool {
    let Some(e) = input(node, 0).and_then(|v| weight_root(g, v)).and_then(|w| by_codes.get(&w)).map(|&i| &entries[i])
    else {
        return false;
    };
    let int = |key: &str, default: i64| node.attrs.int(key).ok().flatten().unwrap_or(default);
    let (bits, block_size) = (int("bits", 4), int("block_size", 128));
    let shape: Vec<Option<i64>> =
        input(node, 0).map(|v| g.value(v).shape.iter().map(|d| d.as_known()).collect()).unwrap_or_default();
    let fits = match shape[..] {
        [Some(rows), Some(row_bytes)] => {
            rows as usize == e.packed.n && (row_bytes * 8 / bits.max(1)) as usize == e.packed.k
        }
        _ => false,
    };
    fits && int("gather_axis", 0) == 0
        && matches!(int("quantize_axis", 1), 1 | -1)
        && (bits as usize, block_size as usize) == (e.packed.bits, e.packed.block_size)
        && weight_of(g, input(node, 2)) == Some(e.scales)
        && weight_of(g, input(node, 3)) == e.zero_points
}

/// Stores a packed entry's buffers with their layout description.
fn write_packed(w: &mut BundleWriter, g: &Graph, e: &PackedEntry) -> Result<bool> {
    let source = &g.weights.get(e.codes).name;
    let names = wgemm_names(source);
    if w.has_tensor(&names.codes) {
        return Ok(false);
    }
    let layout = wgemm_layout(
        &e.packed,
        source,
        &g.weights.get(e.scales).name,
        e.zero_points.map(|z| g.weights.get(z).name.as_str()),
    )
    .to_metadata();
    let [codes, scales, zero_points] = tensor_bytes(&e.packed);
    let tensors =
        [(names.codes, codes, Some(&layout)), (names.scales, scales, None), (names.zero_points, zero_points, None)];
    for (name, buffer, layout) in tensors {
        if let Some((dtype, bytes)) = buffer {
            let shape = [bytes.len() / dtype.size_bytes()];
            w.add_tensor(&name, dtype, &shape, &bytes, layout)
                .with_context(|| format!("storing packed weight `{name}`"))?;
        }
    }
    Ok(true)
}

/// How a weight is stored: the bundle's dtype where there is one, else its raw bytes as U8 with the
/// model dtype and shape in the tensor's layout metadata.
fn storage_of(dtype: DType, shape: &[usize], bytes: usize) -> (Dtype, Vec<usize>, Option<serde_json::Value>) {
    let direct = match dtype {
        DType::F32 => Some(Dtype::F32),
        DType::F16 => Some(Dtype::F16),
        DType::BF16 => Some(Dtype::BF16),
        DType::U8 => Some(Dtype::U8),
        DType::I8 => Some(Dtype::I8),
        DType::I32 => Some(Dtype::I32),
        _ => None,
    };
    match direct {
        Some(d) => (d, shape.to_vec(), None),
        None => {
            let raw = RawStorage { dtype: dtype.name().to_string(), shape: shape.to_vec() };
            (Dtype::U8, vec![bytes], Some(serde_json::to_value(raw).expect("a storage description serialises")))
        }
    }
}

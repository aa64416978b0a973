//! `npuc compile`: import, run the target's pipeline, and write the bundle.
//!
//! The bundle's program is the pipeline's final graph as JSON (format `npuc-program/1`, below);
//! every weight it reads is stored once in `weights.safetensors` under its model name (a tied
//! embedding/lm_head is one tensor), in the model's own layout — except the weights of `WGemm`
//! nodes, which are packed here by the kernels' own `pack_wgemm` and stored in the kernels' layout
//! under the names and with the layout description `runtime::exec::packed` documents; the
//! MatMulNBits tensors they come from are left out when nothing else reads them (a tied embedding
//! read by `GatherBlockQuantized` with the lm_head's very codes, scales and zero points reads the
//! packed form). Likewise the int8 weight codes of `QGemm` nodes are packed by the kernels'
//! `pack_qgemm_codes` (codes and column sums; `runtime::exec::packed`), their `[K, N]` codes left
//! out when only packed QGemms read them (not for `xdna`, whose designs stream the `[K, N]` codes),
//! and the f32 weights of float MatMuls are stored as the f32 GEMM's panels, the `[K, N]` weight
//! left out when only such MatMuls read it.
//! The executor reads packed weights in place.
//!
//! Program JSON: `{"format": "npuc-program/1", "values": [{"name", "dtype", "shape": [dim, ...],
//! "def": "input" | "node" | {"weight": NAME} | {"const": {"dtype", "shape", "data"}}}], "nodes":
//! [{"name", "op": "domain::op", "attrs": {...}, "inputs": [value index | null], "outputs":
//! [value index]}], "inputs": [value index], "outputs": [value index]}`; a dim is a number or the
//! text of a symbolic dim (`past_sequence_length + sequence_length`).

use anyhow::{anyhow, bail, Context, Result};
use ir::graph::{Graph, ValueDef};
use ir::{Attr, DType, Data, Tensor, ValueId, WeightId};
use runtime::bundle::{BundleWriter, Dtype, ManifestHeader, ModelConfig, Target, WriteOptions};
use runtime::exec::packed::{
    gemm_layout_json, gemm_panels_name, layout_json, packed_names, qgemm_layout_json, qgemm_packed_names,
    qgemm_tensor_bytes, tensor_bytes, GemmLayout, QGemmLayout,
};
use runtime::kernels::gemm::{f32_panels_len, F32_PANEL};
use runtime::kernels::qgemm::{pack_qgemm_codes, QWeightCodes};
use runtime::kernels::wgemm::{pack_wgemm, MatMulNBits, NBitsZeroPoints, PackedWGemm};
use serde_json::{json, Map, Value};
use std::collections::{BTreeSet, HashMap};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub struct Options {
    pub model: PathBuf,
    pub target: String,
    pub output: PathBuf,
    pub tokenizer: Option<PathBuf>,
    pub overwrite: bool,
    pub json: bool,
    pub intel: crate::intel::IntelArgs,
    /// XDNA device (`--device`), for `--target xdna` only.
    pub device: Option<String>,
}

pub fn run(o: Options) -> Result<ExitCode> {
    let target: Target =
        o.target.parse().map_err(|_| anyhow!("unknown target `{}` (targets: cpu, xdna, intel-npu)", o.target))?;
    let pipeline_target = passes::targets::target(&o.target).ok_or_else(|| anyhow!("unknown target `{}`", o.target))?;
    let xdna_device = match (&o.device, target) {
        (_, Target::Xdna) => Some(crate::xdna::device(o.device.as_deref())?),
        (Some(d), _) => bail!("--device {d} applies to --target xdna only"),
        (None, _) => None,
    };
    let progress = (!o.json && std::io::stderr().is_terminal()).then(|| {
        let p = indicatif::ProgressBar::new_spinner();
        p.enable_steady_tick(std::time::Duration::from_millis(100));
        p
    });
    let step = |msg: String| {
        if let Some(p) = &progress {
            p.set_message(msg);
        } else if !o.json {
            eprintln!("{msg}");
        }
    };
    step(format!("importing {}", o.model.display()));
    let imported = frontend::import_file(&o.model).with_context(|| format!("importing {}", o.model.display()))?;
    let pipeline = pipeline_target.pipeline();
    let outcome = passes::driver::run(&pipeline, imported.graph, None, |r, _| {
        step(format!("{} done ({} → {} nodes)", r.name, r.nodes_before, r.nodes_after));
    })?;
    let mut g = outcome.graph;
    // intel-npu: the IR, and the host program it agrees with (symmetric weights).
    let intel = if o.target == "intel-npu" { Some(crate::intel::compile(&g, &o.intel)?) } else { None };
    if let Some(ir) = &intel {
        g = ir.host_program.clone();
    }
    let config = model_config(&g)?;
    let tokenizer = match &o.tokenizer {
        Some(t) => Some(t.clone()),
        None => o.model.parent().map(|d| d.join("tokenizer.json")).filter(|p| p.is_file()),
    };
    let mut config = config;
    if let Some(t) = &tokenizer {
        let (bos, eos) = special_tokens(t)?;
        config.bos_token_id = bos;
        config.eos_token_id = eos;
        config.stop_token_ids = eos.into_iter().collect();
    }
    step(format!("writing {}", o.output.display()));
    let header = ManifestHeader {
        compiler_version: env!("CARGO_PKG_VERSION").to_string(),
        target,
        model: config,
        program: program_json(&g),
    };
    let mut w = BundleWriter::create_with(&o.output, header, WriteOptions { overwrite: o.overwrite })
        .with_context(|| format!("creating {}", o.output.display()))?;
    let packed = pack_wgemm_weights(&g)?;
    // An xdna bundle keeps QGemm weights as the `[K, N]` int8 codes its designs stream to the
    // array; the host executor packs them at load when it runs the bundle itself.
    let qpacked = if xdna_device.is_some() {
        QPackedWeights { entries: Vec::new(), omitted: BTreeSet::new() }
    } else {
        pack_qgemm_weights(&g)?
    };
    // Likewise for float MatMul weights, which an xdna bundle's designs may stream.
    let (gemm_panels, gemm_omitted) =
        if xdna_device.is_some() { (Vec::new(), BTreeSet::new()) } else { gemm_panel_weights(&g) };
    let mut stored = BTreeSet::new();
    for v in &g.values {
        if let ValueDef::Weight(id) = v.def {
            if packed.omitted.contains(&id)
                || qpacked.omitted.contains(&id)
                || gemm_omitted.contains(&id)
                || !stored.insert(id)
            {
                continue;
            }
            let wt = g.weights.get(id);
            let (dtype, shape, layout) = storage_of(wt.dtype, &wt.shape, wt.bytes.len());
            w.add_tensor(&wt.name, dtype, &shape, &wt.bytes, layout.as_ref())
                .with_context(|| format!("storing weight `{}`", wt.name))?;
        }
    }
    for entry in &packed.entries {
        write_packed(&mut w, &g, entry)?;
    }
    for &id in &gemm_panels {
        write_gemm_panels(&mut w, &g, id)?;
    }
    for entry in &qpacked.entries {
        let (codes_name, sums_name) = qgemm_packed_names(&entry.layout.source);
        let [(codes_dtype, codes), (sums_dtype, sums)] = qgemm_tensor_bytes(&entry.codes, &entry.col_sums);
        let layout = qgemm_layout_json(&entry.layout);
        w.add_tensor(&codes_name, codes_dtype, &[codes.len()], &codes, Some(&layout))
            .with_context(|| format!("storing packed weight `{codes_name}`"))?;
        w.add_tensor(&sums_name, sums_dtype, &[sums.len() / 4], &sums, None)
            .with_context(|| format!("storing packed weight `{sums_name}`"))?;
    }
    if let Some(t) = &tokenizer {
        w.copy_file(runtime::bundle::TOKENIZER_FILE, t).with_context(|| format!("copying {}", t.display()))?;
        let template = t.with_file_name("chat_template.jinja");
        if template.is_file() {
            w.copy_file(runtime::bundle::CHAT_TEMPLATE_FILE, &template)?;
        }
    }
    if let Some(ir) = &intel {
        crate::intel::write(&mut w, ir)?;
    }
    let xdna = match xdna_device {
        Some(device) => Some(crate::xdna::add_to_bundle(&g, device, &mut w)?),
        None => None,
    };
    let summary = w.finish()?;
    if let Some(p) = &progress {
        p.finish_and_clear();
    }
    if o.json {
        let intel = intel.as_ref().map(crate::intel::summary);
        let mut out = json!({ "bundle": summary, "program_nodes": g.nodes.len(), "weights": stored.len() + packed.entries.len() + qpacked.entries.len() + gemm_panels.len(), "wgemm_packed": packed.entries.len(), "qgemm_packed": qpacked.entries.len(), "gemm_packed": gemm_panels.len(), "intel": intel });
        if let Some(x) = &xdna {
            out["xdna"] = x.clone();
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "wrote {} ({} target): {} program nodes, {} weights ({} WGemm, {} QGemm and {} MatMul weights packed), {} files, {} bytes",
            o.output.display(),
            o.target,
            g.nodes.len(),
            stored.len() + packed.entries.len() + qpacked.entries.len() + gemm_panels.len(),
            packed.entries.len(),
            qpacked.entries.len(),
            gemm_panels.len(),
            summary.files.len(),
            summary.total_bytes
        );
        if let Some(ir) = &intel {
            println!("{}", crate::intel::summary_line(ir));
        }
        for line in xdna.iter().flat_map(crate::xdna::summary_lines) {
            println!("{line}");
        }
        if tokenizer.is_none() {
            println!("no tokenizer.json next to the model and none given with --tokenizer: the bundle has none");
        }
    }
    Ok(ExitCode::SUCCESS)
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
fn write_gemm_panels(w: &mut BundleWriter, g: &Graph, id: WeightId) -> Result<()> {
    let wt = g.weights.get(id);
    let (k, n) = (wt.shape[0], wt.shape[1]);
    let name = gemm_panels_name(&wt.name);
    let layout = gemm_layout_json(&GemmLayout { k, n, source: wt.name.clone() });
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
    .with_context(|| format!("storing packed weight `{name}`"))
}

/// One QGemm weight packed at compile time: its layout description, codes and column sums.
struct QPackedEntry {
    layout: QGemmLayout,
    codes: Vec<i8>,
    col_sums: Vec<i32>,
}

/// The QGemm weights of a program packed for the kernels, and the `[K, N]` codes nothing reads
/// but packed QGemms (they are not stored).
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
        let (Some(codes), Some(scales)) = (weight_of(g, input(node, 1)), weight_of(g, input(node, 2))) else {
            continue;
        };
        let zero_points = weight_of(g, input(node, 3));
        if (input(node, 3).is_some() && zero_points.is_none()) || input(node, 4).is_some() {
            continue;
        }
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
        let (b, s) = (g.weights.get(codes), g.weights.get(scales));
        if b.dtype != DType::U8 || s.dtype != DType::F32 {
            continue;
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
            Some(_) => continue,
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
        by_codes.insert(codes, entries.len());
        entries.push(PackedEntry { codes, scales, zero_points, packed });
    }

    let mut consumers: HashMap<ValueId, Vec<(usize, usize)>> = HashMap::new();
    for (n, node) in g.nodes.iter().enumerate() {
        for (slot, v) in node.inputs.iter().enumerate() {
            if let Some(v) = v {
                consumers.entry(*v).or_default().push((n, slot));
            }
        }
    }
    // Whether every reader of `v` reads it through a packed entry: the entry's own WGemm, or a
    // GatherBlockQuantized of the entry's very table.
    fn read_only_packed(
        g: &Graph,
        consumers: &HashMap<ValueId, Vec<(usize, usize)>>,
        entries: &[PackedEntry],
        by_codes: &HashMap<WeightId, usize>,
        v: ValueId,
    ) -> bool {
        if g.outputs.contains(&v) {
            return false;
        }
        consumers.get(&v).into_iter().flatten().all(|&(n, slot)| {
            let node = &g.nodes[n];
            match (node.domain, node.op) {
                (ir::Domain::Onnx, op) if ALIAS_OPS.contains(&op) && slot == 0 => {
                    node.outputs.iter().all(|&o| read_only_packed(g, consumers, entries, by_codes, o))
                }
                (ir::Domain::Npuc, "WGemm") => {
                    (1..=3).contains(&slot) && weight_of(g, input(node, 1)).is_some_and(|c| by_codes.contains_key(&c))
                }
                (ir::Domain::Microsoft, "GatherBlockQuantized") => {
                    [0, 2, 3].contains(&slot) && tied_gather(g, node, entries, by_codes)
                }
                _ => false,
            }
        })
    }
    let mut omitted = BTreeSet::new();
    for e in &entries {
        let sources: Vec<WeightId> = [Some(e.codes), Some(e.scales), e.zero_points].into_iter().flatten().collect();
        let only_packed = sources.iter().all(|&w| {
            g.values
                .iter()
                .enumerate()
                .filter(|(_, v)| matches!(v.def, ValueDef::Weight(id) if id == w))
                .all(|(i, _)| read_only_packed(g, &consumers, &entries, &by_codes, ValueId(i as u32)))
        });
        if only_packed {
            omitted.extend(sources);
        }
    }
    Ok(PackedWeights { entries, omitted })
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
fn write_packed(w: &mut BundleWriter, g: &Graph, e: &PackedEntry) -> Result<()> {
    let source = &g.weights.get(e.codes).name;
    let names = packed_names(source);
    let layout = layout_json(
        &e.packed,
        source,
        &g.weights.get(e.scales).name,
        e.zero_points.map(|z| g.weights.get(z).name.as_str()),
    );
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
    Ok(())
}

/// How a weight is stored: the bundle's dtype where there is one, else its raw bytes as U8 with the
/// model dtype and shape in the tensor's layout metadata.
fn storage_of(dtype: DType, shape: &[usize], bytes: usize) -> (Dtype, Vec<usize>, Option<Value>) {
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
        None => (Dtype::U8, vec![bytes], Some(json!({ "dtype": dtype.name(), "shape": shape }))),
    }
}

fn dims_json(shape: &[ir::Dim]) -> Value {
    Value::Array(
        shape
            .iter()
            .map(|d| match d.as_known() {
                Some(k) => json!(k),
                None => json!(d.to_string()),
            })
            .collect(),
    )
}

fn tensor_json(t: &Tensor) -> Value {
    let data = match &t.data {
        Data::F32(v) => json!(v),
        Data::F64(v) => json!(v),
        Data::I64(v) => json!(v),
        Data::Str(v) => json!(v.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect::<Vec<_>>()),
    };
    json!({ "dtype": t.dtype.name(), "shape": t.shape, "data": data })
}

fn attr_json(a: &Attr) -> Value {
    match a {
        Attr::Int(v) => json!(v),
        Attr::Float(v) => json!(v),
        Attr::Str(v) => json!(v),
        Attr::Ints(v) => json!(v),
        Attr::Floats(v) => json!(v),
        Attr::Strs(v) => json!(v),
        Attr::Tensor(t) => json!({ "tensor": tensor_json(t) }),
    }
}

/// The program in the format the module documentation gives.
pub fn program_json(g: &Graph) -> Value {
    let values: Vec<Value> = g
        .values
        .iter()
        .map(|v| {
            let def = match &v.def {
                ValueDef::Input => json!("input"),
                ValueDef::Node { .. } => json!("node"),
                ValueDef::Weight(w) => json!({ "weight": g.weights.get(*w).name }),
                ValueDef::Const(t) => json!({ "const": tensor_json(t) }),
            };
            json!({ "name": v.name, "dtype": v.dtype.name(), "shape": dims_json(&v.shape), "def": def })
        })
        .collect();
    let nodes: Vec<Value> = g
        .nodes
        .iter()
        .map(|n| {
            let attrs: Map<String, Value> = n.attrs.0.iter().map(|(k, v)| (k.clone(), attr_json(v))).collect();
            json!({
                "name": n.name,
                "op": format!("{}::{}", n.domain, n.op),
                "attrs": attrs,
                "inputs": n.inputs.iter().map(|i| i.map(|v| v.0)).collect::<Vec<_>>(),
                "outputs": n.outputs.iter().map(|v| v.0).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "format": "npuc-program/1",
        "values": values,
        "nodes": nodes,
        "inputs": g.inputs.iter().map(|v| v.0).collect::<Vec<_>>(),
        "outputs": g.outputs.iter().map(|v| v.0).collect::<Vec<_>>(),
    })
}

/// The decoder's configuration, read off the compiled program: one Attention per layer gives the
/// layer count and head geometry, the embedding gather the vocabulary and width, the SwiGlu the
/// MLP width, the first norm epsilon. The rotary base is not recoverable from a program whose
/// cos/sin tables are weights, and is recorded as 0.
fn model_config(g: &Graph) -> Result<ModelConfig> {
    let attentions: Vec<&ir::Node> =
        g.nodes.iter().filter(|n| n.op == "Attention" && n.domain == ir::Domain::Npuc).collect();
    let Some(first) = attentions.first() else {
        bail!("the compiled program has no fused Attention: npuc compiles decoder models whose attention the rewrites recognise (see `npuc explore --why`)");
    };
    let int = |n: &ir::Node, k: &str| n.attrs.int(k).ok().flatten().unwrap_or(0).max(0) as usize;
    let heads = int(first, "q_heads");
    let kv_heads = int(first, "kv_heads");
    let q = g.value(first.inputs[0].ok_or_else(|| anyhow!("Attention without q"))?);
    let head_dim = q.shape.last().and_then(|d| d.as_known()).unwrap_or(0) as usize;
    let known = |v: &ir::Value, i: usize| v.shape.get(i).and_then(|d| d.as_known()).unwrap_or(0) as usize;
    let logits = g.value(g.outputs[0]);
    let vocab = logits.shape.last().and_then(|d| d.as_known()).unwrap_or(0) as usize;
    let hidden = g
        .nodes
        .iter()
        .find(|n| n.op.starts_with("RmsNorm") || n.op.starts_with("SkipRmsNorm"))
        .map(|n| known(g.value(n.outputs[0]), g.value(n.outputs[0]).shape.len().saturating_sub(1)))
        .unwrap_or(0);
    let intermediate = g
        .nodes
        .iter()
        .find(|n| n.op == "SwiGlu" || n.op == "GeluGate")
        .map(|n| known(g.value(n.outputs[0]), g.value(n.outputs[0]).shape.len().saturating_sub(1)))
        .unwrap_or(0);
    let rms_eps = g
        .nodes
        .iter()
        .find(|n| n.op.contains("RmsNorm"))
        .and_then(|n| n.attrs.float("epsilon").ok().flatten())
        .unwrap_or(0.0) as f64;
    // Tied: the embedding gather and the last GEMM read the same weight.
    let weights_of = |n: &ir::Node| -> Vec<ir::WeightId> {
        n.inputs
            .iter()
            .flatten()
            .filter_map(|&v| match &g.value(v).def {
                ValueDef::Weight(w) => Some(*w),
                ValueDef::Node { node, .. } => {
                    g.node(*node).inputs.iter().flatten().find_map(|&i| match g.value(i).def {
                        ValueDef::Weight(w) => Some(w),
                        _ => None,
                    })
                }
                _ => None,
            })
            .collect()
    };
    let embed = g.nodes.iter().find(|n| n.op == "Gather" || n.op == "GatherBlockQuantized");
    let head = g.nodes.iter().rev().find(|n| matches!(n.op, "MatMul" | "WGemm" | "QGemm"));
    let tied = match (embed, head) {
        (Some(e), Some(h)) => {
            let ew = weights_of(e);
            weights_of(h).iter().any(|w| ew.contains(w))
        }
        _ => false,
    };
    let max_positions = g
        .nodes
        .iter()
        .filter(|n| n.op == "Gather")
        .filter_map(|n| n.inputs[0])
        .map(|v| g.value(v))
        .filter(|v| {
            matches!(v.def, ValueDef::Weight(_)) && v.shape.last().and_then(|d| d.as_known()) == Some(head_dim as i64)
        })
        .map(|v| known(v, 0))
        .next()
        .unwrap_or(0);
    Ok(ModelConfig {
        layers: attentions.len(),
        hidden,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        vocab,
        rms_eps,
        rope_theta: 0.0,
        tied_embeddings: tied,
        max_positions,
        bos_token_id: None,
        eos_token_id: None,
        stop_token_ids: vec![],
    })
}

/// Beginning- and end-of-sequence ids from a tokenizer.json's special added tokens.
fn special_tokens(path: &Path) -> Result<(Option<u32>, Option<u32>)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let t: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let added = t["added_tokens"].as_array().cloned().unwrap_or_default();
    // The first name of the list the tokenizer has wins: chat models end turns with their
    // end-of-turn token even when they also define a document end.
    let find = |names: &[&str]| {
        names.iter().find_map(|name| {
            added.iter().find(|a| a["content"].as_str() == Some(name)).and_then(|a| a["id"].as_u64()).map(|i| i as u32)
        })
    };
    Ok((
        find(&["<|im_start|>", "<s>", "<|begin_of_text|>"]),
        find(&["<|im_end|>", "</s>", "<|endoftext|>", "<|eot_id|>"]),
    ))
}

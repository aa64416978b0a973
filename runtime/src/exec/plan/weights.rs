//! The weights a program reads: the packed layouts the bundle holds (WGemm weights, QGemm codes,
//! float MatMul panels), by the name of the weight they were packed from, and a place for every
//! weight and constant the program reads — f32 weights in place in the map, other weights as
//! views for the ops that take them, i64 weights and constants as constants.

use std::collections::{HashMap, HashSet};

use super::{Loc, Uses, ALIAS_OPS};
use crate::bundle::{Dtype, TensorView};
use crate::exec::error::{node_err, value_err, ExecError};
use crate::exec::packed::{
    gemm_panels_name, mapped_weights, qgemm_names, wgemm_names, GemmLayout, Packing, QGemmLayout, WGemmLayout,
};
use crate::exec::program::{ElemType, NodeInfo, Program, ValueDef, ValueInfo};
use crate::kernels::gemm::f32_panels_len;
use crate::kernels::wgemm::WGemmWeights;

/// Looks a weight of the bundle up by name.
pub(super) type WeightLookup<'w, 'b> = dyn Fn(&str) -> Option<TensorView<'b>> + 'w;

/// The packed forms the bundle holds, each by the name of the weight it was packed from, and the
/// names of the weights read only through them (which the bundle may lack).
pub(super) struct Layouts {
    pub wgemm: HashMap<String, WGemmLayout>,
    pub qgemm: HashMap<String, QGemmLayout>,
    pub gemm: HashMap<String, GemmLayout>,
    pub sources: HashSet<String>,
}

impl Layouts {
    pub(super) fn find(program: &Program, weight: &WeightLookup<'_, '_>) -> Result<Layouts, ExecError> {
        let mut layouts =
            Layouts { wgemm: HashMap::new(), qgemm: HashMap::new(), gemm: HashMap::new(), sources: HashSet::new() };
        layouts.find_wgemm(program, weight)?;
        layouts.find_qgemm(program, weight)?;
        layouts.find_gemm(program, weight)?;
        Ok(layouts)
    }

    /// WGemm weights the bundle holds packed, by the name of their codes weight (a WGemm's
    /// MatMulNBits codes, or a Moe projection's expert codes); the tensors they were packed from
    /// may be absent.
    fn find_wgemm(&mut self, program: &Program, weight: &WeightLookup<'_, '_>) -> Result<(), ExecError> {
        let codes_slots = |node: &NodeInfo| -> &'static [usize] {
            match node.op.as_str() {
                "npuc::WGemm" => &[1],
                "npuc::Moe" => &[2, 5],
                _ => &[],
            }
        };
        let sources = program.nodes.iter().flat_map(|n| codes_slots(n).iter().map(move |&slot| (n, slot)));
        for (node, slot) in sources {
            let Some(source) = weight_name(program, node, slot) else { continue };
            if self.wgemm.contains_key(source) {
                continue;
            }
            let Some(codes) = weight(&wgemm_names(source).codes) else { continue };
            let layout =
                WGemmLayout::from_metadata(codes.metadata).map_err(|e| value_err(codes.name, e.to_string()))?;
            if layout.source != source {
                return Err(value_err(codes.name, format!("is packed from `{}`, not `{source}`", layout.source)));
            }
            self.sources.extend([layout.source.clone(), layout.scales.clone()]);
            self.sources.extend(layout.zero_points.clone());
            self.wgemm.insert(source.to_string(), layout);
        }
        Ok(())
    }

    /// QGemm weight codes the bundle holds packed, by the name of the codes weight.
    fn find_qgemm(&mut self, program: &Program, weight: &WeightLookup<'_, '_>) -> Result<(), ExecError> {
        for node in program.nodes.iter().filter(|n| n.op == "npuc::QGemm") {
            let Some(source) = weight_name(program, node, 3) else { continue };
            let Some(codes) = weight(&qgemm_names(source).0) else { continue };
            let layout =
                QGemmLayout::from_metadata(codes.metadata).map_err(|e| value_err(codes.name, e.to_string()))?;
            if layout.source != source {
                return Err(value_err(codes.name, format!("is packed from `{}`, not `{source}`", layout.source)));
            }
            self.sources.insert(layout.source.clone());
            self.qgemm.insert(source.to_string(), layout);
        }
        Ok(())
    }

    /// Float MatMul weights the bundle holds as panels, by the name of the weight.
    fn find_gemm(&mut self, program: &Program, weight: &WeightLookup<'_, '_>) -> Result<(), ExecError> {
        for node in program.nodes.iter().filter(|n| n.op == "ai.onnx::MatMul") {
            let Some(source) = weight_name(program, node, 1) else { continue };
            let Some(panels) = weight(&gemm_panels_name(source)) else { continue };
            let layout =
                GemmLayout::from_metadata(panels.metadata).map_err(|e| value_err(panels.name, e.to_string()))?;
            if layout.source != source {
                return Err(value_err(panels.name, format!("is packed from `{}`, not `{source}`", layout.source)));
            }
            self.sources.insert(layout.source.clone());
            self.gemm.insert(source.to_string(), layout);
        }
        Ok(())
    }
}

/// The packed WGemm weights of `layout`, read in place.
pub(super) fn load_packed<'b>(
    weight: &WeightLookup<'_, 'b>,
    layout: &WGemmLayout,
) -> Result<WGemmWeights<'b>, ExecError> {
    let names = wgemm_names(&layout.source);
    let get = |name: &str| {
        weight(name).ok_or_else(|| value_err(&layout.source, format!("packed tensor `{name}` is not in the bundle")))
    };
    let zero_points = match layout.zero_points {
        Some(_) => Some(get(&names.zero_points)?),
        None => None,
    };
    mapped_weights(layout, get(&names.codes)?, get(&names.scales)?, zero_points)
        .map_err(|e| value_err(&layout.source, e.to_string()))
}

/// Where the weights and constants a program reads are, before any node is lowered.
pub(super) struct Stored<'b> {
    pub locs: Vec<Loc>,
    /// f32 weights read in place (empty for weights of other dtypes; see `views`).
    pub weights: Vec<&'b [f32]>,
    /// The bundle's view of each of `weights`.
    pub views: Vec<TensorView<'b>>,
    pub consts_f32: Vec<Vec<f32>>,
    pub consts_i64: Vec<Vec<i64>>,
}

/// Places every weight some node reads (each stored weight once, however many values name it)
/// and every constant; other values are [`Loc::Unused`] until their nodes are lowered.
pub(super) fn place<'b>(
    program: &Program,
    uses: &Uses,
    weight: &WeightLookup<'_, 'b>,
    packed_sources: &HashSet<String>,
) -> Result<Stored<'b>, ExecError> {
    let values = &program.values;
    let mut stored = Stored {
        locs: vec![Loc::Unused; values.len()],
        weights: Vec::new(),
        views: Vec::new(),
        consts_f32: Vec::new(),
        consts_i64: Vec::new(),
    };
    let mut weight_index: HashMap<String, usize> = HashMap::new();
    for (v, info) in values.iter().enumerate() {
        stored.locs[v] = match &info.def {
            ValueDef::Weight(name) => {
                if uses.consumers[v].is_empty() {
                    continue;
                }
                let view = match weight(name) {
                    Some(view) => view,
                    // Read only through its packed form (checked by the ops that read it).
                    None if packed_sources.contains(name) => continue,
                    None => return Err(value_err(&info.name, format!("weight `{name}` is not in the bundle"))),
                };
                stored.weight_loc(info, name, view, &mut weight_index)?
            }
            ValueDef::ConstF32(data) => {
                stored.consts_f32.push(data.clone());
                Loc::ConstF32(stored.consts_f32.len() - 1)
            }
            ValueDef::ConstI64(data) => {
                stored.consts_i64.push(data.clone());
                Loc::ConstI64(stored.consts_i64.len() - 1)
            }
            ValueDef::Input | ValueDef::Node => Loc::Unused,
        };
    }
    Ok(stored)
}

impl<'b> Stored<'b> {
    /// A weight read in place; its index.
    pub(super) fn add_weight(&mut self, floats: &'b [f32], view: TensorView<'b>) -> usize {
        self.weights.push(floats);
        self.views.push(view);
        self.weights.len() - 1
    }

    /// The place of value `info`, the stored weight `name`: i64 weights (shape operands stored as
    /// raw little-endian bytes) become small constants; other weights are read in place, once.
    fn weight_loc(
        &mut self,
        info: &ValueInfo,
        name: &str,
        view: TensorView<'b>,
        weight_index: &mut HashMap<String, usize>,
    ) -> Result<Loc, ExecError> {
        if info.dtype == "i64" {
            self.consts_i64.push(i64_weight(&info.name, view)?);
            return Ok(Loc::ConstI64(self.consts_i64.len() - 1));
        }
        let index = match weight_index.get(name) {
            Some(&i) => i,
            None => {
                // Only f32 weights are read as floats; others (u8 codes) are read by the ops that
                // take them, which check their dtype.
                let floats = if info.elem == Some(ElemType::F32) { f32_weight(&info.name, view)? } else { &[] };
                let index = self.add_weight(floats, view);
                weight_index.insert(name.to_string(), index);
                index
            }
        };
        Ok(Loc::Weight(index))
    }
}

/// The name of the weight `node` reads directly at `slot`.
pub(super) fn weight_name<'p>(program: &'p Program, node: &NodeInfo, slot: usize) -> Option<&'p str> {
    match &program.values[node.input(slot)?].def {
        ValueDef::Weight(name) => Some(name),
        _ => None,
    }
}

/// The weight `v` is, through aliases (Reshape, Unsqueeze, ...).
pub(super) fn weight_root<'p>(program: &'p Program, producer: &[Option<usize>], mut v: usize) -> Option<&'p str> {
    loop {
        match &program.values[v].def {
            ValueDef::Weight(name) => return Some(name),
            ValueDef::Node => {
                let node = &program.nodes[producer[v]?];
                if !ALIAS_OPS.contains(&node.op.as_str()) {
                    return None;
                }
                v = node.input(0)?;
            }
            _ => return None,
        }
    }
}

/// The u8 bytes of a weight read by `node` at `slot`.
pub(super) fn u8_weight<'b>(
    node: &NodeInfo,
    locs: &[Loc],
    views: &[TensorView<'b>],
    values: &[ValueInfo],
    slot: usize,
) -> Result<&'b [u8], ExecError> {
    let fail = |problem: String| node_err(&node.name, &node.op, problem);
    let v = node.input(slot).ok_or_else(|| fail(format!("input {slot} is missing")))?;
    match locs[v] {
        Loc::Weight(i) if views[i].dtype == Dtype::U8 && values[v].dtype == "u8" => Ok(views[i].bytes),
        _ => Err(fail(format!("input {slot} (`{}`) is not a u8 weight", values[v].name))),
    }
}

/// The f32 GEMM panels of `layout`'s weight (read for `value`), checked against its sizes.
pub(super) fn panels_view<'b>(
    weight: &WeightLookup<'_, 'b>,
    layout: &GemmLayout,
    value: &str,
) -> Result<(TensorView<'b>, &'b [f32]), ExecError> {
    let name = gemm_panels_name(&layout.source);
    let view = weight(&name)
        .ok_or_else(|| value_err(&layout.source, format!("packed tensor `{name}` is not in the bundle")))?;
    let panels = f32_weight(value, view)?;
    if panels.len() != f32_panels_len(layout.k, layout.n) {
        return Err(value_err(
            &name,
            format!("holds {} values, not the panels of {}×{}", panels.len(), layout.k, layout.n),
        ));
    }
    Ok((view, panels))
}

/// The f32 elements of a weight read by `node` at `slot`.
pub(super) fn f32_weight_input<'b>(
    node: &NodeInfo,
    locs: &[Loc],
    weights: &[&'b [f32]],
    values: &[ValueInfo],
    slot: usize,
) -> Result<&'b [f32], ExecError> {
    let fail = |problem: String| node_err(&node.name, &node.op, problem);
    let v = node.input(slot).ok_or_else(|| fail(format!("input {slot} is missing")))?;
    match locs[v] {
        Loc::Weight(i) if values[v].elem == Some(ElemType::F32) => Ok(weights[i]),
        _ => Err(fail(format!("input {slot} (`{}`) is not an f32 weight", values[v].name))),
    }
}

/// A stored i64 weight (raw little-endian bytes) as constants.
fn i64_weight(value: &str, view: TensorView<'_>) -> Result<Vec<i64>, ExecError> {
    if !matches!(view.dtype, Dtype::U8 | Dtype::I8) || !view.bytes.len().is_multiple_of(8) {
        return Err(value_err(value, format!("weight `{}` ({}) is not i64 bytes", view.name, view.dtype)));
    }
    Ok(view.bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect())
}

/// The f32 elements of a stored weight, read in place.
fn f32_weight<'b>(value: &str, view: TensorView<'b>) -> Result<&'b [f32], ExecError> {
    if view.dtype != Dtype::F32 {
        return Err(value_err(
            value,
            format!("weight `{}` is stored as {}; the host executor runs float programs", view.name, view.dtype),
        ));
    }
    if !cfg!(target_endian = "little") || view.bytes.as_ptr().align_offset(align_of::<f32>()) != 0 {
        return Err(value_err(value, format!("weight `{}` is not 4-byte aligned little-endian f32", view.name)));
    }
    // SAFETY: the bytes are aligned for f32 (checked), live as long as the bundle's map ('b), and
    // every bit pattern is a valid f32.
    Ok(unsafe { std::slice::from_raw_parts(view.bytes.as_ptr().cast::<f32>(), view.bytes.len() / 4) })
}

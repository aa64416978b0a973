//! ONNX model → [`ir::Graph`]: decode, check, order, infer, fold, and keep only the live
//! computation.

mod build;
mod checks;
mod shape_inputs;

use crate::error::{Error, ErrorKind};
use crate::infer::{infer_node, Ctx, Info, Known, NodeCtx};
use crate::proto::{self, attribute_proto::AttributeType, ModelProto};
use crate::tensors::{decode_tensor, ExternalFiles, MAX_TENSOR_ELEMENTS};
use bytes::Bytes;
use ir::graph::Graph;
use ir::op::OpSpec;
use ir::{Attr, Attrs, DType, Dim, Domain, Tensor, Weight, WeightId, WeightStore};
use prost::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// ai.onnx opset versions npuc imports; each op is then checked against the definitions npuc
/// implements (`crate::versions`).
pub const ONNX_OPSETS: std::ops::RangeInclusive<i64> = 1..=crate::versions::MAX_OPSET;
const ONNX_OPSETS_TEXT: &str = "ai.onnx opsets 1 to 28";

/// The newest ONNX IR version the frontend's protobuf types (onnx.proto of onnx 1.23) describe.
pub const IR_VERSION: i64 = 14;

/// Initializers with at most this many elements are also known by value to the folder.
const SMALL_WEIGHT_ELEMENTS: usize = 4096;

/// A decoded model file; tensor payloads are slices of the file's memory mapping.
pub struct OnnxModel {
    pub path: PathBuf,
    pub proto: ModelProto,
    pub file_bytes: u64,
}

/// What import did, for `npuc inspect`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ImportReport {
    pub ir_version: i64,
    pub producer: String,
    pub opsets: Vec<(String, i64)>,
    pub onnx_nodes: usize,
    pub onnx_census: Vec<(String, usize)>,
    /// ONNX nodes whose every output became a constant.
    pub folded_nodes: usize,
    /// ONNX nodes nothing live depends on (after folding and shape-input rewriting).
    pub dead_nodes: usize,
    pub ir_nodes: usize,
    pub ir_census: Vec<(String, usize)>,
    pub assumptions: Vec<String>,
}

pub struct Imported {
    pub graph: Graph,
    pub report: ImportReport,
}

/// Memory-maps and decodes a model file.
pub fn load(path: &Path) -> Result<OnnxModel, Error> {
    let file = std::fs::File::open(path).map_err(|e| ErrorKind::Io(e).at(path))?;
    let meta = file.metadata().map_err(|e| ErrorKind::Io(e).at(path))?;
    if !meta.is_file() {
        return Err(ErrorKind::Io(std::io::Error::other("not a regular file")).at(path));
    }
    let bytes = if meta.len() == 0 {
        Bytes::new()
    } else {
        // SAFETY: read-only mapping of a file npuc does not modify while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ErrorKind::Io(e).at(path))?;
        Bytes::from_owner(map)
    };
    let proto = ModelProto::decode(bytes).map_err(|e| ErrorKind::Decode(e.to_string()).at(path))?;
    Ok(OnnxModel { path: path.to_path_buf(), proto, file_bytes: meta.len() })
}

/// A node whose op is outside npuc's vocabulary.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct UnsupportedOp {
    pub node: String,
    pub domain: String,
    pub op: String,
    pub opset: i64,
}

/// Every node of the model whose op npuc does not import (import stops at the first; this lists
/// them all, for `npuc inspect`).
pub fn unsupported_ops(model: &OnnxModel) -> Vec<UnsupportedOp> {
    let Some(g) = model.proto.graph.as_ref() else { return vec![] };
    let opset_of = |d: &str| {
        model
            .proto
            .opset_import
            .iter()
            .find(|o| o.domain.as_deref().unwrap_or("") == d)
            .and_then(|o| o.version)
            .unwrap_or(0)
    };
    g.node
        .iter()
        .enumerate()
        .filter_map(|(i, n)| {
            let d = n.domain.as_deref().unwrap_or("");
            let op = n.op_type.as_deref().unwrap_or("");
            let known = Domain::parse(d).and_then(|dom| ir::op::lookup(dom, op)).is_some();
            (!known).then(|| UnsupportedOp {
                node: name_of(n, i),
                domain: if d.is_empty() { "ai.onnx".into() } else { d.into() },
                op: op.into(),
                opset: opset_of(d),
            })
        })
        .collect()
}

/// Loads and imports a model file.
pub fn import_file(path: &Path) -> Result<Imported, Error> {
    let model = load(path)?;
    import(&model)
}

pub fn import(model: &OnnxModel) -> Result<Imported, Error> {
    import_inner(model).map_err(|k| k.at(&model.path))
}

/// Where a value name comes from in the ONNX graph.
#[derive(Clone, Copy)]
enum Source {
    Input,
    Initializer,
    Node(usize),
}

/// A node's checked op: its definition, the opset it is read at, and how many inputs and
/// outputs it uses (up to the last named one).
#[derive(Clone, Copy)]
struct NodeSpec {
    spec: &'static OpSpec,
    opset: i64,
    n_in: usize,
    n_out: usize,
}

/// The checked, ordered and inferred model, by ONNX value name and node index.
struct Analysis<'g> {
    g: &'g proto::GraphProto,
    sources: HashMap<&'g str, Source>,
    specs: Vec<NodeSpec>,
    /// Node indices in topological order.
    order: Vec<usize>,
    infos: HashMap<&'g str, Info>,
    weight_ids: HashMap<&'g str, WeightId>,
    /// Outputs a node has but the model leaves unnamed (e.g. SkipSimplifiedLayerNormalization's
    /// mean), by (node, output index).
    unnamed_outputs: HashMap<(usize, usize), Info>,
}

/// Import in its order: the model's checks, inference and folding node by node, the sizes
/// named and unified, the shape inputs made constant, then the live nodes as the IR graph.
fn import_inner(model: &OnnxModel) -> Result<Imported, ErrorKind> {
    let m = &model.proto;
    let g = m.graph.as_ref().ok_or(ErrorKind::NoGraph)?;
    checks::check_header(m)?;
    let mut report = ImportReport::of_header(m);
    let opsets = checks::read_opsets(m, &mut report)?;
    let mut files = ExternalFiles::new(&model_dir(&model.path));
    let sources = checks::define_names(g)?;
    let specs = checks::check_nodes(g, &opsets)?;
    let order = checks::topological_order(g, &sources)?;
    checks::check_outputs_defined(g, &sources)?;

    let mut ctx = Ctx::default();
    let Initializers { store, weight_ids, mut infos } = read_initializers(g, &mut files)?;
    read_inputs(g, &mut infos, &mut ctx)?;
    let NodeFacts { attrs: mut node_attrs, unnamed_outputs } =
        infer_in_order(g, &order, &specs, &mut infos, &mut files, &mut ctx)?;
    name_sizes_by_role(g, &infos, &mut ctx);
    normalize_shapes(&mut infos, &ctx);
    checks::check_declared_outputs(g, &infos)?;
    let a = Analysis { g, sources, specs, order, infos, weight_ids, unnamed_outputs };

    let overrides = shape_inputs::overrides(&a, &mut node_attrs, &mut ctx);
    let live_nodes = build::live_nodes(&a, &overrides);
    report.count_onnx_nodes(g, &a.infos);
    let mut graph = build::ir_graph(&a, &live_nodes, &overrides, node_attrs);
    graph.weights = Arc::new(store);
    for (s, v) in &ctx.substitutions {
        graph.assumptions.push(format!("{s} = {v}"));
    }
    graph.assumptions.extend(ctx.assumptions.iter().cloned());
    graph.verify().map_err(|e| ErrorKind::BadNode { node: "(graph)".into(), op: "-".into(), detail: e.to_string() })?;
    report.count_ir_nodes(&graph, live_nodes.iter().filter(|&&l| l).count());
    Ok(Imported { graph, report })
}

impl ImportReport {
    /// The report's IR version and producer; the rest is filled in as import goes.
    fn of_header(m: &ModelProto) -> ImportReport {
        ImportReport {
            ir_version: m.ir_version.unwrap_or(0),
            producer: format!(
                "{} {}",
                m.producer_name.clone().unwrap_or_default(),
                m.producer_version.clone().unwrap_or_default()
            )
            .trim()
            .to_string(),
            ..Default::default()
        }
    }

    /// The ONNX node counts: all, by op, and those whose every output became a constant.
    fn count_onnx_nodes(&mut self, g: &proto::GraphProto, infos: &HashMap<&str, Info>) {
        self.onnx_nodes = g.node.len();
        self.onnx_census = census(g.node.iter().map(|n| {
            let d = n.domain.as_deref().unwrap_or("");
            format!("{}::{}", if d.is_empty() { "ai.onnx" } else { d }, n.op_type.as_deref().unwrap_or(""))
        }));
        self.folded_nodes = g
            .node
            .iter()
            .filter(|n| n.output.iter().filter(|o| !o.is_empty()).all(|o| infos[o.as_str()].as_const().is_some()))
            .count();
    }

    /// The dead ONNX nodes (neither folded nor among the `live_nodes`) and the IR graph's counts
    /// and assumptions.
    fn count_ir_nodes(&mut self, graph: &Graph, live_nodes: usize) {
        self.dead_nodes = self.onnx_nodes - self.folded_nodes - live_nodes;
        self.ir_nodes = graph.nodes.len();
        self.ir_census = graph.op_census();
        self.assumptions = graph.assumptions.clone();
    }
}

/// The folder external data is read from: the model's. A bare file name's parent is the empty
/// path: the model's folder is then the current one.
fn model_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Names of the graph's initializers (a graph input with one of these names is not an input).
fn initializer_names(g: &proto::GraphProto) -> HashSet<&str> {
    g.initializer.iter().map(|t| t.name.as_deref().unwrap_or("")).collect()
}

/// The initializers as weights, and what the folder knows of each.
struct Initializers<'g> {
    store: WeightStore,
    weight_ids: HashMap<&'g str, WeightId>,
    /// Dtype, shape, and the value of small ones.
    infos: HashMap<&'g str, Info>,
}

/// The initializers as weights (slices of the mapping) with their ids by name, and what the
/// folder knows of each: dtype, shape, and the value of small ones.
fn read_initializers<'g>(g: &'g proto::GraphProto, files: &mut ExternalFiles) -> Result<Initializers<'g>, ErrorKind> {
    let mut store = WeightStore::default();
    let mut infos: HashMap<&str, Info> = HashMap::new();
    let mut weight_ids = HashMap::new();
    for t in &g.initializer {
        let name = t.name.as_deref().unwrap_or("");
        let raw = decode_tensor(t, files)?;
        let shape: Vec<Dim> = raw.shape.iter().map(|&d| Dim::known(d as i64)).collect();
        let numel: usize = raw.shape.iter().product();
        let known = if numel <= SMALL_WEIGHT_ELEMENTS && raw.dtype != DType::Str {
            match Tensor::from_le_bytes(raw.dtype, raw.shape.clone(), &raw.bytes) {
                Ok(t) => Known::Const(t),
                Err(_) => Known::Nothing,
            }
        } else {
            Known::Nothing
        };
        infos.insert(name, Info { dtype: raw.dtype, shape, known });
        let id = store.add(Weight::new(name.to_string(), raw.dtype, raw.shape, raw.bytes));
        weight_ids.insert(name, id);
    }
    Ok(Initializers { store, weight_ids, infos })
}

/// The graph inputs' dtypes and shapes (initializers listed as inputs are weights, not inputs).
fn read_inputs<'g>(
    g: &'g proto::GraphProto,
    infos: &mut HashMap<&'g str, Info>,
    ctx: &mut Ctx,
) -> Result<(), ErrorKind> {
    let initializer_names = initializer_names(g);
    for v in &g.input {
        let name = v.name.as_deref().unwrap_or("");
        if initializer_names.contains(name) {
            continue;
        }
        let (dtype, shape) = value_type(v, ctx)?;
        infos.insert(name, Info::new(dtype, shape));
    }
    Ok(())
}

/// What inference keeps of each node besides its named outputs' infos.
struct NodeFacts {
    /// Each node's attributes, as imported (taken by the graph builder).
    attrs: Vec<Option<Attrs>>,
    /// Outputs a node has but the model leaves unnamed, by (node, output index).
    unnamed_outputs: HashMap<(usize, usize), Info>,
}

/// Infers every node's outputs in topological order, folding what is constant; returns each
/// node's attributes and the infos of outputs the model leaves unnamed.
fn infer_in_order<'g>(
    g: &'g proto::GraphProto,
    order: &[usize],
    specs: &[NodeSpec],
    infos: &mut HashMap<&'g str, Info>,
    files: &mut ExternalFiles,
    ctx: &mut Ctx,
) -> Result<NodeFacts, ErrorKind> {
    let mut node_attrs: Vec<Option<Attrs>> = vec![None; g.node.len()];
    let mut unnamed_outputs: HashMap<(usize, usize), Info> = HashMap::new();
    for &i in order {
        let n = &g.node[i];
        let name = name_of(n, i);
        let attrs = convert_attrs(n, &name, files)?;
        let outs = infer_outputs(n, &name, specs[i], &attrs, infos, ctx)?;
        for (k, (o, info)) in n.output.iter().zip(outs).enumerate() {
            if o.is_empty() {
                unnamed_outputs.insert((i, k), info);
            } else {
                infos.insert(o.as_str(), info);
            }
        }
        node_attrs[i] = Some(attrs);
    }
    Ok(NodeFacts { attrs: node_attrs, unnamed_outputs })
}

/// One node's output infos: a Constant's value, or what inference (and folding) gives.
fn infer_outputs(
    n: &proto::NodeProto,
    name: &str,
    NodeSpec { spec, opset, n_in, n_out }: NodeSpec,
    attrs: &Attrs,
    infos: &HashMap<&str, Info>,
    ctx: &mut Ctx,
) -> Result<Vec<Info>, ErrorKind> {
    if spec.name == "Constant" {
        return Ok(vec![Info::constant(constant_value(attrs, name)?)]);
    }
    let ins: Vec<Option<&Info>> =
        n.input[..n_in].iter().map(|s| if s.is_empty() { None } else { infos.get(s.as_str()) }).collect();
    let nc = NodeCtx { name, domain: spec.domain, op: spec.name, opset, attrs, num_outputs: n_out };
    infer_node(&nc, ctx, &ins)
}

/// Applies every substitution assumed so far to the shapes and shape values.
fn normalize_shapes(infos: &mut HashMap<&str, Info>, ctx: &Ctx) {
    for info in infos.values_mut() {
        info.shape = info.shape.iter().map(|d| ctx.normalize(d)).collect();
        if let Known::Dims { dims, .. } = &mut info.known {
            *dims = dims.iter().map(|d| ctx.normalize(d)).collect();
        }
    }
}

fn name_of(n: &proto::NodeProto, i: usize) -> String {
    match n.name.as_deref() {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => format!("{}#{i}", n.op_type.as_deref().unwrap_or("?")),
    }
}

fn census(items: impl Iterator<Item = String>) -> Vec<(String, usize)> {
    let mut m: BTreeMap<String, usize> = BTreeMap::new();
    for i in items {
        *m.entry(i).or_default() += 1;
    }
    m.into_iter().collect()
}

/// A graph input's dtype and shape; missing or unnamed dims get fresh symbols.
fn value_type(v: &proto::ValueInfoProto, ctx: &mut Ctx) -> Result<(DType, Vec<Dim>), ErrorKind> {
    let name = v.name.clone().unwrap_or_default();
    let terr = |detail: &str| ErrorKind::Type { value: name.clone(), detail: detail.into() };
    let Some(proto::type_proto::Value::TensorType(tt)) = v.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(terr("only tensor inputs are supported"));
    };
    let code = tt.elem_type.unwrap_or(0);
    let dtype = DType::from_onnx_code(code).ok_or_else(|| terr(&format!("unknown element type code {code}")))?;
    let shape_proto = tt.shape.as_ref().ok_or_else(|| terr("the input has no shape (unknown rank)"))?;
    let mut shape = Vec::new();
    let mut numel: u64 = 1;
    for (axis, d) in shape_proto.dim.iter().enumerate() {
        use proto::tensor_shape_proto::dimension::Value as V;
        let dim = match &d.value {
            Some(V::DimValue(k)) => {
                if *k < 0 {
                    return Err(terr(&format!("negative dimension {k}")));
                }
                numel = numel
                    .checked_mul(*k as u64)
                    .filter(|&n| n <= MAX_TENSOR_ELEMENTS)
                    .ok_or_else(|| terr("its shape has more than 2^40 elements"))?;
                Dim::known(*k)
            }
            Some(V::DimParam(p)) if !p.is_empty() => dim_param(p),
            _ => ctx_fresh(ctx, &name, axis),
        };
        shape.push(dim);
    }
    Ok((dtype, shape))
}

/// The names the runtime knows sizes by: the batch and the new tokens (`input_ids`' dims) and
/// the tokens a cache held before the step (dim 2 of `past_key_values.*`).
const SIZE_ROLES: [&str; 3] = ["batch_size", "sequence_length", "past_sequence_length"];

/// Gives the sizes a decoder's inputs play a role in the names of [`SIZE_ROLES`] when the
/// exporter named them otherwise (torch.export writes `s10`, `s70`, ...), as recorded
/// substitutions. A size already named by its role, or a role name the graph uses for another
/// size, is left alone. An `attention_mask` whose sizes are names of its own (the graph reads it
/// only through index arithmetic, so nothing tied them) becomes `[batch, past + new tokens]`.
fn name_sizes_by_role(g: &proto::GraphProto, infos: &HashMap<&str, Info>, ctx: &mut Ctx) {
    let names: Vec<&str> = g.input.iter().filter_map(|v| v.name.as_deref()).collect();
    let past = names.iter().copied().find(|n| n.starts_with("past_key_values"));
    let mut roles: Vec<(Dim, &str)> = Vec::new();
    if let Some(ids) = input_shape(infos, ctx, "input_ids").filter(|s| s.len() == 2) {
        roles.push((ids[0].clone(), SIZE_ROLES[0]));
        roles.push((ids[1].clone(), SIZE_ROLES[1]));
    }
    if let Some(p) = past.and_then(|p| input_shape(infos, ctx, p)).filter(|s| s.len() == 4) {
        roles.push((p[2].clone(), SIZE_ROLES[2]));
    }
    let taken = symbols_of(infos, ctx, names.iter().copied());
    for (dim, role) in roles {
        let Some(sym) = dim.as_symbol() else { continue };
        if sym != role && !taken.contains(role) {
            ctx.unify(&dim, &Dim::sym(role));
        }
    }
    let Some(mask) = input_shape(infos, ctx, "attention_mask").filter(|s| s.len() == 2) else { return };
    let others = symbols_of(infos, ctx, names.iter().copied().filter(|&n| n != "attention_mask"));
    let own = |d: &Dim| d.as_symbol().is_some_and(|s| !others.contains(s));
    let ids = input_shape(infos, ctx, "input_ids").filter(|s| s.len() == 2);
    let p = past.and_then(|p| input_shape(infos, ctx, p)).filter(|s| s.len() == 4);
    if let (Some(ids), Some(p)) = (ids, p) {
        if let (true, Some(total)) = (own(&mask[0]) && own(&mask[1]), p[2].add(&ids[1])) {
            ctx.unify(&mask[0], &ids[0]);
            ctx.unify(&mask[1], &total);
        }
    }
}

/// A graph input's shape with every substitution so far applied.
fn input_shape(infos: &HashMap<&str, Info>, ctx: &Ctx, name: &str) -> Option<Vec<Dim>> {
    infos.get(name).map(|i| i.shape.iter().map(|d| ctx.normalize(d)).collect())
}

/// Every symbol the shapes of the named inputs mention.
fn symbols_of<'a>(infos: &HashMap<&str, Info>, ctx: &Ctx, names: impl Iterator<Item = &'a str>) -> HashSet<String> {
    names
        .filter_map(|n| input_shape(infos, ctx, n))
        .flatten()
        .flat_map(|d| d.symbols().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// A `dim_param`: a size name, or a sum of products of names and integers as optimum declares
/// the attention mask's width (`past_sequence_length + sequence_length`), which must be the same
/// size as the sum of its parts. Anything else is one opaque name.
fn dim_param(text: &str) -> Dim {
    let term = |t: &str| -> Option<Dim> {
        t.split('*').try_fold(Dim::known(1), |acc, f| {
            let f = f.trim();
            let factor = match f.parse::<i64>() {
                Ok(k) => Dim::known(k),
                Err(_) if !f.is_empty() && f.chars().all(|c| c.is_alphanumeric() || c == '_') => Dim::sym(f),
                Err(_) => return None,
            };
            acc.mul(&factor)
        })
    };
    let parsed = text.split('+').try_fold(Dim::known(0), |acc, t| acc.add(&term(t)?));
    match parsed {
        Some(d) if text.contains(['+', '*']) => d,
        _ => Dim::sym(text),
    }
}

fn ctx_fresh(_ctx: &mut Ctx, input: &str, axis: usize) -> Dim {
    Dim::sym(&format!("{input}.{axis}"))
}

fn convert_attrs(n: &proto::NodeProto, node: &str, files: &mut ExternalFiles) -> Result<Attrs, ErrorKind> {
    let mut attrs = Attrs::default();
    for a in &n.attribute {
        let name = a.name.clone().unwrap_or_default();
        let bad = |detail: String| ErrorKind::BadNode {
            node: node.into(),
            op: n.op_type.clone().unwrap_or_default(),
            detail,
        };
        if a.ref_attr_name.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(bad(format!("attribute `{name}` refers to a function attribute")));
        }
        let ty = a.r#type.and_then(|t| AttributeType::try_from(t).ok()).unwrap_or(AttributeType::Undefined);
        let value = match ty {
            AttributeType::Float => Attr::Float(a.f.unwrap_or(0.0)),
            AttributeType::Int => Attr::Int(a.i.unwrap_or(0)),
            AttributeType::String => Attr::Str(String::from_utf8_lossy(a.s.as_deref().unwrap_or(&[])).into_owned()),
            AttributeType::Floats => Attr::Floats(a.floats.clone()),
            AttributeType::Ints => Attr::Ints(a.ints.clone()),
            AttributeType::Strings => {
                Attr::Strs(a.strings.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect())
            }
            AttributeType::Tensor => {
                let t = a.t.as_ref().ok_or_else(|| bad(format!("tensor attribute `{name}` has no tensor")))?;
                let raw = decode_tensor(t, files)?;
                let tensor = Tensor::from_le_bytes(raw.dtype, raw.shape, &raw.bytes)
                    .map_err(|e| bad(format!("attribute `{name}`: {e}")))?;
                Attr::Tensor(tensor)
            }
            other => return Err(bad(format!("attribute `{name}` has kind {other:?}, which npuc does not import"))),
        };
        attrs.set(&name, value);
    }
    Ok(attrs)
}

/// The tensor a `Constant` node defines.
fn constant_value(attrs: &Attrs, node: &str) -> Result<Tensor, ErrorKind> {
    let bad = |d: &str| ErrorKind::BadNode { node: node.into(), op: "Constant".into(), detail: d.into() };
    let mut found = attrs.0.iter().filter(|(k, _)| k.starts_with("value") || k.as_str() == "sparse_value");
    let (key, value) = found.next().ok_or_else(|| bad("no value attribute"))?;
    if found.next().is_some() {
        return Err(bad("more than one value attribute"));
    }
    Ok(match (key.as_str(), value) {
        ("value", Attr::Tensor(t)) => t.clone(),
        ("value_float", Attr::Float(f)) => Tensor::from_f32(DType::F32, vec![], vec![*f]),
        ("value_floats", Attr::Floats(f)) => Tensor::from_f32(DType::F32, vec![f.len()], f.clone()),
        ("value_int", Attr::Int(i)) => Tensor::from_i64(DType::I64, vec![], vec![*i]),
        ("value_ints", Attr::Ints(i)) => Tensor::from_i64(DType::I64, vec![i.len()], i.clone()),
        _ => return Err(bad(&format!("unsupported value attribute `{key}`"))),
    })
}

#[cfg(test)]
mod tests {
    use super::dim_param;
    use ir::Dim;

    #[test]
    fn dim_params_that_are_sums_become_polynomials() {
        let sum = Dim::sym("past_sequence_length").add(&Dim::sym("sequence_length")).unwrap();
        assert_eq!(dim_param("past_sequence_length + sequence_length"), sum);
        assert_eq!(dim_param("2*batch"), Dim::sym("batch").mul(&Dim::known(2)).unwrap());
        assert_eq!(dim_param("batch_size"), Dim::sym("batch_size"));
        assert_eq!(dim_param("a - b"), Dim::sym("a - b"));
        assert_eq!(dim_param("unk__3 +"), Dim::sym("unk__3 +"));
    }
}

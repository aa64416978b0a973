//! ONNX model → [`ir::Graph`]: decode, check, order, infer, fold, and keep only the live
//! computation.

use crate::error::{Error, ErrorKind};
use crate::infer::{infer_node, reshape_shape, Ctx, Info, Known, NodeCtx};
use crate::proto::{self, attribute_proto::AttributeType, ModelProto};
use crate::tensors::{decode_tensor, ExternalFiles, MAX_TENSOR_ELEMENTS};
use bytes::Bytes;
use ir::graph::{Graph, Node, NodeId, Value, ValueDef, ValueId};
use ir::{Attr, Attrs, DType, Dim, Domain, Tensor, Weight, WeightStore};
use prost::Message;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
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

fn import_inner(model: &OnnxModel) -> Result<Imported, ErrorKind> {
    let m = &model.proto;
    let g = m.graph.as_ref().ok_or(ErrorKind::NoGraph)?;
    match m.ir_version {
        None | Some(0) => return Err(ErrorKind::IrVersion("no ir_version".into())),
        Some(v) if !(1..=IR_VERSION).contains(&v) => return Err(ErrorKind::IrVersion(format!("IR version {v}"))),
        Some(_) => {}
    }
    if !m.functions.is_empty() {
        let names: Vec<String> = m.functions.iter().map(|f| f.name.clone().unwrap_or_default()).collect();
        return Err(ErrorKind::LocalFunctions(names.join(", ")));
    }
    let mut opsets: BTreeMap<Domain, i64> = BTreeMap::new();
    let mut report = ImportReport {
        ir_version: m.ir_version.unwrap_or(0),
        producer: format!(
            "{} {}",
            m.producer_name.clone().unwrap_or_default(),
            m.producer_version.clone().unwrap_or_default()
        )
        .trim()
        .to_string(),
        ..Default::default()
    };
    for o in &m.opset_import {
        let name = o.domain.clone().unwrap_or_default();
        let version = o.version.unwrap_or(0);
        report.opsets.push((if name.is_empty() { "ai.onnx".into() } else { name.clone() }, version));
        if let Some(d) = Domain::parse(&name) {
            if d == Domain::Onnx && !ONNX_OPSETS.contains(&version) {
                return Err(ErrorKind::Opset { domain: "ai.onnx".into(), version, supported: ONNX_OPSETS_TEXT });
            }
            opsets.insert(d, version);
        }
    }
    // A bare file name's parent is the empty path: the model's folder is then the current one.
    let dir = match model.path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut files = ExternalFiles::new(&dir);

    // Names: every value is defined once.
    let mut sources: HashMap<&str, Source> = HashMap::new();
    fn define<'a>(sources: &mut HashMap<&'a str, Source>, name: &'a str, s: Source) -> Result<(), ErrorKind> {
        if sources.insert(name, s).is_some() {
            return Err(ErrorKind::DuplicateName(name.to_string()));
        }
        Ok(())
    }
    for t in &g.initializer {
        define(&mut sources, t.name.as_deref().unwrap_or(""), Source::Initializer)?;
    }
    if !g.sparse_initializer.is_empty() {
        return Err(ErrorKind::Tensor {
            tensor: "(sparse initializer)".into(),
            detail: "sparse initializers are not supported".into(),
        });
    }
    let initializer_names: HashSet<&str> = g.initializer.iter().map(|t| t.name.as_deref().unwrap_or("")).collect();
    for v in &g.input {
        let name = v.name.as_deref().unwrap_or("");
        if !initializer_names.contains(name) {
            define(&mut sources, name, Source::Input)?;
        }
    }
    for (ni, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            define(&mut sources, o, Source::Node(ni))?;
        }
    }

    // Vocabulary and arity.
    let node_name = |i: usize| {
        let n = &g.node[i];
        match n.name.as_deref() {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => format!("{}#{i}", n.op_type.as_deref().unwrap_or("?")),
        }
    };
    let mut specs = Vec::with_capacity(g.node.len());
    for (i, n) in g.node.iter().enumerate() {
        let op = n.op_type.clone().unwrap_or_default();
        let dom_s = n.domain.clone().unwrap_or_default();
        let unknown = |opset: i64| ErrorKind::UnknownOp {
            node: node_name(i),
            op: op.clone(),
            domain: if dom_s.is_empty() { "ai.onnx".into() } else { dom_s.clone() },
            opset,
        };
        let domain = Domain::parse(&dom_s).ok_or_else(|| unknown(0))?;
        let opset = *opsets.get(&domain).ok_or_else(|| unknown(0))?;
        let spec = ir::op::lookup(domain, &op).ok_or_else(|| unknown(opset))?;
        if domain == Domain::Onnx {
            crate::versions::check(&op, opset).map_err(|(since, implemented)| ErrorKind::OpVersion {
                node: node_name(i),
                op: op.clone(),
                since,
                opset,
                implemented,
            })?;
        }
        let n_in = n.input.iter().rposition(|s| !s.is_empty()).map_or(0, |p| p + 1);
        let n_out = n.output.iter().rposition(|s| !s.is_empty()).map_or(0, |p| p + 1);
        let range = |lo: usize, hi: usize| {
            if hi == ir::op::MANY {
                format!("at least {lo}")
            } else if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo} to {hi}")
            }
        };
        if n_in < spec.min_inputs || n_in > spec.max_inputs {
            return Err(ErrorKind::Arity {
                node: node_name(i),
                op,
                what: "inputs",
                given: n_in,
                expected: range(spec.min_inputs, spec.max_inputs),
            });
        }
        if n_out < spec.min_outputs || n_out > spec.max_outputs {
            return Err(ErrorKind::Arity {
                node: node_name(i),
                op,
                what: "outputs",
                given: n_out,
                expected: range(spec.min_outputs, spec.max_outputs),
            });
        }
        specs.push((spec, opset, n_in, n_out));
    }

    // Undefined inputs, then a topological order (Kahn); leftovers are a cycle.
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); g.node.len()];
    let mut pending = vec![0usize; g.node.len()];
    for (i, n) in g.node.iter().enumerate() {
        for input in n.input.iter().filter(|s| !s.is_empty()) {
            match sources.get(input.as_str()) {
                None => return Err(ErrorKind::UndefinedInput { node: node_name(i), input: input.clone() }),
                Some(Source::Node(p)) => {
                    consumers[*p].push(i);
                    pending[i] += 1;
                }
                Some(_) => {}
            }
        }
    }
    let mut ready: VecDeque<usize> = (0..g.node.len()).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(g.node.len());
    while let Some(i) = ready.pop_front() {
        order.push(i);
        for &c in &consumers[i] {
            pending[c] -= 1;
            if pending[c] == 0 {
                ready.push_back(c);
            }
        }
    }
    if order.len() != g.node.len() {
        let stuck: Vec<String> =
            (0..g.node.len()).filter(|&i| pending[i] > 0).take(5).map(|i| format!("`{}`", node_name(i))).collect();
        return Err(ErrorKind::Cycle(stuck.join(", ")));
    }
    for o in &g.output {
        let name = o.name.as_deref().unwrap_or("");
        if !sources.contains_key(name) {
            return Err(ErrorKind::OutputNotProduced(name.to_string()));
        }
    }

    // Weights (slices of the mapping) and inputs.
    let mut store = WeightStore::default();
    let mut infos: HashMap<&str, Info> = HashMap::new();
    let mut weight_ids = HashMap::new();
    for t in &g.initializer {
        let name = t.name.as_deref().unwrap_or("");
        let raw = decode_tensor(t, &mut files)?;
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
    let mut ctx = Ctx::default();
    for v in &g.input {
        let name = v.name.as_deref().unwrap_or("");
        if initializer_names.contains(name) {
            continue;
        }
        let (dtype, shape) = value_type(v, &mut ctx)?;
        infos.insert(name, Info::new(dtype, shape));
    }

    // Inference and folding in topological order.
    let mut node_attrs: Vec<Option<Attrs>> = vec![None; g.node.len()];
    // Outputs a node has but the model leaves unnamed (e.g. SkipSimplifiedLayerNormalization's
    // mean), by (node, output index).
    let mut unnamed_outputs: HashMap<(usize, usize), Info> = HashMap::new();
    for &i in &order {
        let n = &g.node[i];
        let (spec, opset, n_in, n_out) = specs[i];
        let name = node_name(i);
        let attrs = convert_attrs(n, &name, &mut files)?;
        let outs = if spec.name == "Constant" {
            vec![Info::constant(constant_value(&attrs, &name)?)]
        } else {
            let ins: Vec<Option<&Info>> =
                n.input[..n_in].iter().map(|s| if s.is_empty() { None } else { infos.get(s.as_str()) }).collect();
            let nc =
                NodeCtx { name: &name, domain: spec.domain, op: spec.name, opset, attrs: &attrs, num_outputs: n_out };
            infer_node(&nc, &mut ctx, &ins)?
        };
        for (k, (o, info)) in n.output.iter().zip(outs).enumerate() {
            if o.is_empty() {
                unnamed_outputs.insert((i, k), info);
            } else {
                infos.insert(o.as_str(), info);
            }
        }
        node_attrs[i] = Some(attrs);
    }
    name_sizes_by_role(g, &infos, &mut ctx);
    let normalize_info = |info: &mut Info, ctx: &Ctx| {
        info.shape = info.shape.iter().map(|d| ctx.normalize(d)).collect();
        if let Known::Dims { dims, .. } = &mut info.known {
            *dims = dims.iter().map(|d| ctx.normalize(d)).collect();
        }
    };
    for info in infos.values_mut() {
        normalize_info(info, &ctx);
    }
    for o in &g.output {
        let name = o.name.as_deref().unwrap_or("");
        let info = &infos[name];
        if let Some(proto::type_proto::Value::TensorType(tt)) = o.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            if let Some(declared) = tt.elem_type.and_then(DType::from_onnx_code) {
                if declared != info.dtype {
                    return Err(ErrorKind::Type {
                        value: name.into(),
                        detail: format!("declared as {declared} but computed as {}", info.dtype),
                    });
                }
            }
        }
    }

    // Shape inputs of Reshape/Expand that are symbolic become constants (0 = copy, -1 = infer,
    // 1 = keep) where that is exact, so the shape arithmetic feeding them can die.
    let mut shape_overrides: HashMap<(usize, usize), Tensor> = HashMap::new();
    for &i in &order {
        let n = &g.node[i];
        let op = specs[i].0.name;
        if !(op == "Reshape" || op == "Expand") || infos[n.output[0].as_str()].as_const().is_some() {
            continue;
        }
        let Some(target) = infos.get(n.input[1].as_str()) else { continue };
        if !matches!(target.known, Known::Dims { .. }) {
            continue;
        }
        let x = &infos[n.input[0].as_str()];
        let y = &infos[n.output[0].as_str()];
        let replacement = if op == "Reshape" {
            let allowzero = node_attrs[i].as_ref().and_then(|a| a.int("allowzero").ok().flatten()).unwrap_or(0) != 0;
            let t = reshape_constant(&x.shape, &y.shape, allowzero, &mut ctx, &name_of(n, i));
            // allowzero=1 (torch.export) with a target holding no literal 0: the constant target
            // copies dims with 0, which allowzero=0 reads as the copy it is.
            if t.is_some() && allowzero {
                if let Some(a) = node_attrs[i].as_mut() {
                    a.set("allowzero", Attr::Int(0));
                }
            }
            t
        } else {
            expand_constant(&x.shape, &y.shape, &target.as_dims().unwrap().0)
        };
        if let Some(t) = replacement {
            shape_overrides.insert((i, 1), t);
        }
    }

    // Slice bounds that are symbolic sizes equal to the dim they slice become `i64::MAX`.
    for &i in &order {
        let n = &g.node[i];
        if specs[i].0.name != "Slice" || infos[n.output[0].as_str()].as_const().is_some() {
            continue;
        }
        for (k, t) in slice_overrides(n, &infos, &ctx) {
            shape_overrides.insert((i, k), t);
        }
    }

    // Liveness from the graph outputs.
    let mut live_nodes = vec![false; g.node.len()];
    let mut stack: Vec<&str> = g.output.iter().map(|o| o.name.as_deref().unwrap_or("")).collect();
    let mut seen: HashSet<&str> = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) || infos[v].as_const().is_some() && !matches!(sources[v], Source::Input) {
            continue;
        }
        if let Source::Node(ni) = sources[v] {
            if !live_nodes[ni] {
                live_nodes[ni] = true;
                for (k, input) in g.node[ni].input.iter().enumerate() {
                    if !input.is_empty() && !shape_overrides.contains_key(&(ni, k)) {
                        stack.push(input.as_str());
                    }
                }
            }
        }
    }
    let node_count = g.node.len();
    report.onnx_nodes = node_count;
    report.onnx_census = census(g.node.iter().map(|n| {
        let d = n.domain.as_deref().unwrap_or("");
        format!("{}::{}", if d.is_empty() { "ai.onnx" } else { d }, n.op_type.as_deref().unwrap_or(""))
    }));
    report.folded_nodes = g
        .node
        .iter()
        .filter(|n| n.output.iter().filter(|o| !o.is_empty()).all(|o| infos[o.as_str()].as_const().is_some()))
        .count();

    // Build the IR graph.
    let mut graph = Graph {
        name: g.name.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "main".into()),
        values: Vec::new(),
        nodes: Vec::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
        weights: Arc::new(WeightStore::default()),
        assumptions: Vec::new(),
    };
    let mut ids: HashMap<String, ValueId> = HashMap::new();
    let mut aliases: HashMap<&str, &str> = HashMap::new();
    let output_names: HashSet<&str> = g.output.iter().map(|o| o.name.as_deref().unwrap_or("")).collect();
    let leaf =
        |graph: &mut Graph, ids: &mut HashMap<String, ValueId>, name: &str, info: &Info, def: ValueDef| -> ValueId {
            if let Some(&id) = ids.get(name) {
                return id;
            }
            graph.values.push(Value { name: name.to_string(), dtype: info.dtype, shape: info.shape.clone(), def });
            let id = ValueId(graph.values.len() as u32 - 1);
            ids.insert(name.to_string(), id);
            id
        };
    for v in &g.input {
        let name = v.name.as_deref().unwrap_or("");
        if !initializer_names.contains(name) {
            let id = leaf(&mut graph, &mut ids, name, &infos[name], ValueDef::Input);
            graph.inputs.push(id);
        }
    }
    let resolve =
        |graph: &mut Graph, ids: &mut HashMap<String, ValueId>, aliases: &HashMap<&str, &str>, name: &str| -> ValueId {
            let mut name = name;
            while let Some(a) = aliases.get(name) {
                name = a;
            }
            if let Some(&id) = ids.get(name) {
                return id;
            }
            let info = &infos[name];
            let def = match (sources[name], &info.known) {
                (Source::Initializer, _) => ValueDef::Weight(weight_ids[name]),
                (_, Known::Const(t)) => ValueDef::Const(t.clone()),
                _ => unreachable!("non-constant value `{name}` used before its node was built"),
            };
            leaf(graph, ids, name, info, def)
        };
    for &i in &order {
        if !live_nodes[i] {
            continue;
        }
        let n = &g.node[i];
        let (spec, opset, n_in, n_out) = specs[i];
        // Identity, and a Cast to the dtype the value already has, are aliases, not computation.
        let same_dtype_cast = spec.name == "Cast"
            && infos.get(n.input[0].as_str()).map(|i| i.dtype) == infos.get(n.output[0].as_str()).map(|o| o.dtype);
        if (spec.name == "Identity" || same_dtype_cast) && !output_names.contains(n.output[0].as_str()) {
            aliases.insert(n.output[0].as_str(), n.input[0].as_str());
            continue;
        }
        let mut inputs = Vec::with_capacity(n_in);
        for (k, s) in n.input[..n_in].iter().enumerate() {
            if s.is_empty() {
                inputs.push(None);
            } else if let Some(t) = shape_overrides.get(&(i, k)) {
                let cname = format!("{}.shape", name_of(n, i));
                let info = Info::constant(t.clone());
                inputs.push(Some(leaf(&mut graph, &mut ids, &cname, &info, ValueDef::Const(t.clone()))));
            } else {
                inputs.push(Some(resolve(&mut graph, &mut ids, &aliases, s)));
            }
        }
        let node_id = NodeId(graph.nodes.len() as u32);
        let mut outputs = Vec::with_capacity(n_out);
        for (k, o) in n.output[..n_out].iter().enumerate() {
            let name = if o.is_empty() { format!("{}.unused{k}", name_of(n, i)) } else { o.clone() };
            let info = if o.is_empty() { unnamed_outputs.get(&(i, k)) } else { infos.get(o.as_str()) };
            let (dtype, shape) = info.map(|i| (i.dtype, i.shape.clone())).unwrap_or((DType::F32, vec![]));
            graph.values.push(Value {
                name: name.clone(),
                dtype,
                shape,
                def: ValueDef::Node { node: node_id, output: k },
            });
            let id = ValueId(graph.values.len() as u32 - 1);
            ids.insert(name, id);
            outputs.push(id);
        }
        graph.nodes.push(Node {
            name: name_of(n, i),
            domain: spec.domain,
            op: spec.name,
            opset,
            attrs: node_attrs[i].take().unwrap_or_default(),
            inputs,
            outputs,
        });
    }
    for o in &g.output {
        let name = o.name.as_deref().unwrap_or("");
        let id = resolve(&mut graph, &mut ids, &aliases, name);
        graph.outputs.push(id);
    }
    graph.weights = Arc::new(store);
    for (s, v) in &ctx.substitutions {
        graph.assumptions.push(format!("{s} = {v}"));
    }
    graph.assumptions.extend(ctx.assumptions.iter().cloned());
    graph.verify().map_err(|e| ErrorKind::BadNode { node: "(graph)".into(), op: "-".into(), detail: e.to_string() })?;

    report.dead_nodes = node_count - report.folded_nodes - live_nodes.iter().filter(|&&l| l).count();
    report.ir_nodes = graph.nodes.len();
    report.ir_census = graph.op_census();
    report.assumptions = graph.assumptions.clone();
    Ok(Imported { graph, report })
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

/// A constant Reshape target equivalent to the symbolic one: known dims as numbers, dims equal
/// to the input's at the same position as 0, at most one other as -1.
fn reshape_constant(x: &[Dim], y: &[Dim], allowzero: bool, ctx: &mut Ctx, node: &str) -> Option<Tensor> {
    // With allowzero=1 a literal 0 in the target is a zero-sized dim, which no constant target
    // read with allowzero=0 (as the caller rewrites it) can say.
    if allowzero && y.iter().any(|d| d.as_known() == Some(0)) {
        return None;
    }
    let mut out = Vec::with_capacity(y.len());
    let mut inferred = false;
    for (i, d) in y.iter().enumerate() {
        match d.as_known() {
            Some(0) => return None,
            Some(k) => out.push(k),
            None if x.get(i) == Some(d) => out.push(0),
            None if !inferred => {
                inferred = true;
                out.push(-1);
            }
            None => return None,
        }
    }
    // Check the replacement reproduces the inferred shape exactly.
    let target: Vec<Dim> = out.iter().map(|&k| Dim::known(k)).collect();
    let nc_attrs = Attrs::default();
    let nc = NodeCtx { name: node, domain: Domain::Onnx, op: "Reshape", opset: 21, attrs: &nc_attrs, num_outputs: 1 };
    let check = reshape_shape(&nc, ctx, x, &target, false).ok()?;
    (check == y).then(|| Tensor::from_i64(DType::I64, vec![out.len()], out))
}

/// Constant `starts`/`ends` (inputs 1 and 2) for a Slice whose bounds are symbolic sizes that
/// inference resolved (see `infer::constant_slice_bounds`).
fn slice_overrides(n: &proto::NodeProto, infos: &HashMap<&str, Info>, ctx: &Ctx) -> Vec<(usize, Tensor)> {
    let x = &infos[n.input[0].as_str()];
    let bounds = |k: usize| n.input.get(k).filter(|s| !s.is_empty()).and_then(|s| infos.get(s.as_str()));
    let rank = x.shape.len() as i64;
    let count = bounds(1).and_then(|b| b.as_dims()).map_or(0, |(d, _)| d.len());
    let axes: Vec<usize> = match bounds(3) {
        Some(a) => match a.as_const().and_then(|t| t.as_i64()) {
            Some(v) => v.iter().map(|&a| if a < 0 { (a + rank) as usize } else { a as usize }).collect(),
            None => return vec![],
        },
        None => (0..count).collect(),
    };
    let mut out = vec![];
    for k in [1, 2] {
        let Some(Known::Dims { dims, .. }) = bounds(k).map(|b| &b.known) else { continue };
        if let Ok(v) = crate::infer::constant_slice_bounds(ctx, dims, &x.shape, &axes) {
            out.push((k, Tensor::from_i64(DType::I64, vec![v.len()], v)));
        }
    }
    out
}

/// A constant Expand target equivalent to the symbolic one: symbolic dims the input already has
/// become 1.
fn expand_constant(x: &[Dim], y: &[Dim], target: &[Dim]) -> Option<Tensor> {
    let mut out = Vec::with_capacity(target.len());
    for (i, t) in target.iter().enumerate() {
        match t.as_known() {
            Some(k) => out.push(k),
            None => {
                let yi = y.len() - target.len() + i;
                let xi = (yi + x.len()).checked_sub(y.len())?;
                if x.get(xi) == Some(&y[yi]) {
                    out.push(1);
                } else {
                    return None;
                }
            }
        }
    }
    Some(Tensor::from_i64(DType::I64, vec![out.len()], out))
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

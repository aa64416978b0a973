//! The model's checks before any inference: IR version, opsets, value names, the vocabulary and
//! arity of every node, a topological order, and the declared types of the graph outputs.

use super::{initializer_names, name_of, ImportReport, NodeSpec, Source, IR_VERSION, ONNX_OPSETS, ONNX_OPSETS_TEXT};
use crate::error::ErrorKind;
use crate::infer::Info;
use crate::proto::{self, ModelProto};
use ir::{DType, Domain};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// The model's IR version is one the protobuf types describe, and it defines no local functions.
pub(super) fn check_header(m: &ModelProto) -> Result<(), ErrorKind> {
    match m.ir_version {
        None | Some(0) => return Err(ErrorKind::IrVersion("no ir_version".into())),
        Some(v) if !(1..=IR_VERSION).contains(&v) => return Err(ErrorKind::IrVersion(format!("IR version {v}"))),
        Some(_) => {}
    }
    if !m.functions.is_empty() {
        let names: Vec<String> = m.functions.iter().map(|f| f.name.clone().unwrap_or_default()).collect();
        return Err(ErrorKind::LocalFunctions(names.join(", ")));
    }
    Ok(())
}

/// The opset of each domain npuc knows, with every imported opset listed in the report; an
/// ai.onnx opset outside [`ONNX_OPSETS`] is refused.
pub(super) fn read_opsets(m: &ModelProto, report: &mut ImportReport) -> Result<BTreeMap<Domain, i64>, ErrorKind> {
    let mut opsets: BTreeMap<Domain, i64> = BTreeMap::new();
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
    Ok(opsets)
}

/// Where every value name comes from; each is defined once.
pub(super) fn define_names(g: &proto::GraphProto) -> Result<HashMap<&str, Source>, ErrorKind> {
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
    let initializer_names = initializer_names(g);
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
    Ok(sources)
}

/// Every node's op checked: in the vocabulary, as defined at the model's opset, with its arity.
pub(super) fn check_nodes(g: &proto::GraphProto, opsets: &BTreeMap<Domain, i64>) -> Result<Vec<NodeSpec>, ErrorKind> {
    g.node.iter().enumerate().map(|(i, n)| check_node(n, i, opsets)).collect()
}

/// Node `n` (index `i`): its op in the vocabulary, an ai.onnx op checked against the
/// definitions npuc implements (`crate::versions`), its inputs and outputs within the op's
/// arity.
fn check_node(n: &proto::NodeProto, i: usize, opsets: &BTreeMap<Domain, i64>) -> Result<NodeSpec, ErrorKind> {
    let op = n.op_type.clone().unwrap_or_default();
    let dom_s = n.domain.clone().unwrap_or_default();
    let unknown = |opset: i64| ErrorKind::UnknownOp {
        node: name_of(n, i),
        op: op.clone(),
        domain: if dom_s.is_empty() { "ai.onnx".into() } else { dom_s.clone() },
        opset,
    };
    let domain = Domain::parse(&dom_s).ok_or_else(|| unknown(0))?;
    let opset = *opsets.get(&domain).ok_or_else(|| unknown(0))?;
    let spec = ir::op::lookup(domain, &op).ok_or_else(|| unknown(opset))?;
    if domain == Domain::Onnx {
        crate::versions::check(&op, opset).map_err(|(since, implemented)| ErrorKind::OpVersion {
            node: name_of(n, i),
            op: op.clone(),
            since,
            opset,
            implemented,
        })?;
    }
    let n_in = n.input.iter().rposition(|s| !s.is_empty()).map_or(0, |p| p + 1);
    let n_out = n.output.iter().rposition(|s| !s.is_empty()).map_or(0, |p| p + 1);
    let arity = |what: &'static str, given: usize, (lo, hi): (usize, usize)| {
        if given < lo || given > hi {
            let expected = if hi == ir::op::MANY {
                format!("at least {lo}")
            } else if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo} to {hi}")
            };
            return Err(ErrorKind::Arity { node: name_of(n, i), op: op.clone(), what, given, expected });
        }
        Ok(())
    };
    arity("inputs", n_in, (spec.min_inputs, spec.max_inputs))?;
    arity("outputs", n_out, (spec.min_outputs, spec.max_outputs))?;
    Ok(NodeSpec { spec, opset, n_in, n_out })
}

/// The nodes in a topological order (Kahn), after checking every input is defined; nodes left
/// over are a cycle.
pub(super) fn topological_order(
    g: &proto::GraphProto,
    sources: &HashMap<&str, Source>,
) -> Result<Vec<usize>, ErrorKind> {
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); g.node.len()];
    let mut pending = vec![0usize; g.node.len()];
    for (i, n) in g.node.iter().enumerate() {
        for input in n.input.iter().filter(|s| !s.is_empty()) {
            match sources.get(input.as_str()) {
                None => return Err(ErrorKind::UndefinedInput { node: name_of(n, i), input: input.clone() }),
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
        let stuck: Vec<String> = (0..g.node.len())
            .filter(|&i| pending[i] > 0)
            .take(5)
            .map(|i| format!("`{}`", name_of(&g.node[i], i)))
            .collect();
        return Err(ErrorKind::Cycle(stuck.join(", ")));
    }
    Ok(order)
}

/// Every graph output is a node output, an input or an initializer.
pub(super) fn check_outputs_defined(g: &proto::GraphProto, sources: &HashMap<&str, Source>) -> Result<(), ErrorKind> {
    for o in &g.output {
        let name = o.name.as_deref().unwrap_or("");
        if !sources.contains_key(name) {
            return Err(ErrorKind::OutputNotProduced(name.to_string()));
        }
    }
    Ok(())
}

/// A graph output's declared element type, when it has one, is the inferred one.
pub(super) fn check_declared_outputs(g: &proto::GraphProto, infos: &HashMap<&str, Info>) -> Result<(), ErrorKind> {
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
    Ok(())
}

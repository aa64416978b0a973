//! The live computation as an [`ir::Graph`]: the nodes the graph outputs depend on, once
//! folding and the constant shape inputs have cut what they no longer need.

use super::{name_of, Analysis, Source};
use crate::infer::{Info, Known};
use ir::graph::{Graph, Node, NodeId, Value, ValueDef, ValueId};
use ir::{Attrs, DType, Tensor, WeightStore};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Which nodes the graph outputs depend on. A constant value (other than an input) needs no
/// node, and neither does a shape input replaced by a constant.
pub(super) fn live_nodes(a: &Analysis, overrides: &HashMap<(usize, usize), Tensor>) -> Vec<bool> {
    let (g, infos, sources) = (a.g, &a.infos, &a.sources);
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
                    if !input.is_empty() && !overrides.contains_key(&(ni, k)) {
                        stack.push(input.as_str());
                    }
                }
            }
        }
    }
    live_nodes
}

/// The IR graph of the live nodes in topological order, with the graph's inputs and outputs;
/// its weights and assumptions are the caller's to fill in.
pub(super) fn ir_graph(
    a: &Analysis,
    live_nodes: &[bool],
    overrides: &HashMap<(usize, usize), Tensor>,
    mut node_attrs: Vec<Option<Attrs>>,
) -> Graph {
    let mut b = GraphBuilder::new(a);
    b.add_inputs();
    for &i in &a.order {
        if live_nodes[i] {
            b.add_node(i, overrides, node_attrs[i].take().unwrap_or_default());
        }
    }
    for o in &a.g.output {
        let id = b.resolve(o.name.as_deref().unwrap_or(""));
        b.graph.outputs.push(id);
    }
    b.graph
}

/// The IR graph being built: a value per name, weights and constants made on first use, and
/// Identity and same-dtype Cast outputs as aliases of their inputs.
struct GraphBuilder<'a, 'g> {
    a: &'a Analysis<'g>,
    graph: Graph,
    ids: HashMap<String, ValueId>,
    /// An aliased value name, by the name of the value it stands for.
    aliases: HashMap<&'g str, &'g str>,
    output_names: HashSet<&'g str>,
}

impl<'a, 'g> GraphBuilder<'a, 'g> {
    fn new(a: &'a Analysis<'g>) -> Self {
        let graph = Graph {
            name: a.g.name.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "main".into()),
            values: Vec::new(),
            nodes: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            weights: Arc::new(WeightStore::default()),
            assumptions: Vec::new(),
        };
        let output_names = a.g.output.iter().map(|o| o.name.as_deref().unwrap_or("")).collect();
        GraphBuilder { a, graph, ids: HashMap::new(), aliases: HashMap::new(), output_names }
    }

    /// The value named `name`, added with `info` and `def` unless it already exists.
    fn leaf(&mut self, name: &str, info: &Info, def: ValueDef) -> ValueId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        self.graph.values.push(Value { name: name.to_string(), dtype: info.dtype, shape: info.shape.clone(), def });
        let id = ValueId(self.graph.values.len() as u32 - 1);
        self.ids.insert(name.to_string(), id);
        id
    }

    /// The graph inputs (initializers listed as inputs are weights, made when used).
    fn add_inputs(&mut self) {
        let a = self.a;
        let initializer_names = super::initializer_names(a.g);
        for v in &a.g.input {
            let name = v.name.as_deref().unwrap_or("");
            if !initializer_names.contains(name) {
                let id = self.leaf(name, &a.infos[name], ValueDef::Input);
                self.graph.inputs.push(id);
            }
        }
    }

    /// The value a name stands for, through aliases: one built already, or a weight or
    /// constant made now. Node outputs are built before they are used.
    fn resolve(&mut self, name: &str) -> ValueId {
        let a = self.a;
        let mut name = name;
        while let Some(alias) = self.aliases.get(name) {
            name = alias;
        }
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let info = &a.infos[name];
        let def = match (a.sources[name], &info.known) {
            (Source::Initializer, _) => ValueDef::Weight(a.weight_ids[name]),
            (_, Known::Const(t)) => ValueDef::Const(t.clone()),
            _ => unreachable!("non-constant value `{name}` used before its node was built"),
        };
        self.leaf(name, info, def)
    }

    /// Live node `i` as an IR node, its replaced shape inputs as constants; an Identity, or a
    /// Cast to the dtype the value already has, whose output is not a graph output becomes an
    /// alias instead.
    fn add_node(&mut self, i: usize, overrides: &HashMap<(usize, usize), Tensor>, attrs: Attrs) {
        let a = self.a;
        let n = &a.g.node[i];
        let spec = a.specs[i];
        let same_dtype_cast = spec.spec.name == "Cast"
            && a.infos.get(n.input[0].as_str()).map(|i| i.dtype) == a.infos.get(n.output[0].as_str()).map(|o| o.dtype);
        if (spec.spec.name == "Identity" || same_dtype_cast) && !self.output_names.contains(n.output[0].as_str()) {
            self.aliases.insert(n.output[0].as_str(), n.input[0].as_str());
            return;
        }
        let mut inputs = Vec::with_capacity(spec.n_in);
        for (k, s) in n.input[..spec.n_in].iter().enumerate() {
            if s.is_empty() {
                inputs.push(None);
            } else if let Some(t) = overrides.get(&(i, k)) {
                // One name per replaced input: a Slice may have both its starts and its ends
                // replaced, and a second leaf of the same name would be the first.
                let first = (0..k).all(|j| !overrides.contains_key(&(i, j)));
                let cname = match first {
                    true => format!("{}.shape", name_of(n, i)),
                    false => format!("{}.input{k}", name_of(n, i)),
                };
                let info = Info::constant(t.clone());
                inputs.push(Some(self.leaf(&cname, &info, ValueDef::Const(t.clone()))));
            } else {
                inputs.push(Some(self.resolve(s)));
            }
        }
        let node_id = NodeId(self.graph.nodes.len() as u32);
        let mut outputs = Vec::with_capacity(spec.n_out);
        for (k, o) in n.output[..spec.n_out].iter().enumerate() {
            let name = if o.is_empty() { format!("{}.unused{k}", name_of(n, i)) } else { o.clone() };
            let info = if o.is_empty() { a.unnamed_outputs.get(&(i, k)) } else { a.infos.get(o.as_str()) };
            let (dtype, shape) = info.map(|i| (i.dtype, i.shape.clone())).unwrap_or((DType::F32, vec![]));
            self.graph.values.push(Value {
                name: name.clone(),
                dtype,
                shape,
                def: ValueDef::Node { node: node_id, output: k },
            });
            let id = ValueId(self.graph.values.len() as u32 - 1);
            self.ids.insert(name, id);
            outputs.push(id);
        }
        self.graph.nodes.push(Node {
            name: name_of(n, i),
            domain: spec.spec.domain,
            op: spec.spec.name,
            opset: spec.opset,
            attrs,
            inputs,
            outputs,
        });
    }
}

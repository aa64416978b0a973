//! The typed DAG every pass works on.
//!
//! Invariants (checked by [`Graph::verify`]): nodes are in topological order; every node input is a
//! graph input, a weight, a constant or an output of an earlier node; every value has exactly one
//! definition; graph outputs are defined.

use crate::attr::Attrs;
use crate::dim::Dim;
use crate::dtype::DType;
use crate::op::Domain;
use crate::tensor::Tensor;
use crate::weights::{WeightId, WeightStore};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

#[derive(Clone, Debug)]
pub enum ValueDef {
    Input,
    Weight(WeightId),
    /// A small constant held by value (folded shape arithmetic, scalars, axes).
    Const(Tensor),
    Node {
        node: NodeId,
        output: usize,
    },
}

#[derive(Clone, Debug)]
pub struct Value {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<Dim>,
    pub def: ValueDef,
}

#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub domain: Domain,
    pub op: &'static str,
    /// Opset version of `domain` the node was written against.
    pub opset: i64,
    pub attrs: Attrs,
    /// `None` marks an omitted optional input.
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<ValueId>,
}

#[derive(Clone)]
pub struct Graph {
    pub name: String,
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    pub weights: Arc<WeightStore>,
    /// Facts the frontend assumed to make shapes agree (e.g. `total_sequence_length = past + seq`).
    pub assumptions: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GraphError {
    #[error("node `{node}` uses value `{value}` before it is defined")]
    UseBeforeDef { node: String, value: String },
    #[error("value `{0}` is defined more than once")]
    Redefined(String),
    #[error("graph output `{0}` is never defined")]
    OutputUndefined(String),
    #[error("node `{node}` output {index} is value `{value}`, whose definition points elsewhere")]
    BadDef { node: String, index: usize, value: String },
}

impl Graph {
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.0 as usize]
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    pub fn value_by_name(&self) -> HashMap<&str, ValueId> {
        self.values.iter().enumerate().map(|(i, v)| (v.name.as_str(), ValueId(i as u32))).collect()
    }

    /// Checks the invariants listed in the module documentation.
    pub fn verify(&self) -> Result<(), GraphError> {
        let mut defined = vec![false; self.values.len()];
        for (i, v) in self.values.iter().enumerate() {
            if !matches!(v.def, ValueDef::Node { .. }) {
                defined[i] = true;
            }
        }
        for (ni, node) in self.nodes.iter().enumerate() {
            for &input in node.inputs.iter().flatten() {
                if !defined[input.0 as usize] {
                    return Err(GraphError::UseBeforeDef {
                        node: node.name.clone(),
                        value: self.value(input).name.clone(),
                    });
                }
            }
            for (oi, &out) in node.outputs.iter().enumerate() {
                let v = self.value(out);
                match v.def {
                    ValueDef::Node { node: n, output } if n.0 as usize == ni && output == oi => {}
                    _ => return Err(GraphError::BadDef { node: node.name.clone(), index: oi, value: v.name.clone() }),
                }
                if defined[out.0 as usize] {
                    return Err(GraphError::Redefined(v.name.clone()));
                }
                defined[out.0 as usize] = true;
            }
        }
        for &o in &self.outputs {
            if !defined[o.0 as usize] {
                return Err(GraphError::OutputUndefined(self.value(o).name.clone()));
            }
        }
        Ok(())
    }

    /// Node count by `domain::op`, sorted by name.
    pub fn op_census(&self) -> Vec<(String, usize)> {
        let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
        for n in &self.nodes {
            *counts.entry(format!("{}::{}", n.domain, n.op)).or_default() += 1;
        }
        counts.into_iter().collect()
    }
}

impl Graph {
    /// The graph without nodes no output depends on and without values nothing uses (graph
    /// inputs are kept, in order). Identity nodes whose output is not a graph output are bypassed.
    /// Adds a value; its definition is the caller's to keep true.
    pub fn add_value(&mut self, name: String, dtype: DType, shape: Vec<Dim>, def: ValueDef) -> ValueId {
        self.values.push(Value { name, dtype, shape, def });
        ValueId(self.values.len() as u32 - 1)
    }

    /// Inserts `nodes` at index `at` of the node list (keeping it in order): the values they
    /// output point at them, and the node ids other values point at are renumbered.
    pub fn insert_nodes(&mut self, at: usize, nodes: Vec<Node>) {
        let shift = nodes.len() as u32;
        for v in self.values.iter_mut() {
            if let ValueDef::Node { node, .. } = &mut v.def {
                if node.0 as usize >= at {
                    node.0 += shift;
                }
            }
        }
        for (k, n) in nodes.iter().enumerate() {
            for (i, &o) in n.outputs.iter().enumerate() {
                self.values[o.0 as usize].def = ValueDef::Node { node: NodeId((at + k) as u32), output: i };
            }
        }
        self.nodes.splice(at..at, nodes);
    }

    /// The graph with its nodes replaced by `nodes` (in order, over `values`, which they may
    /// extend): each node output's definition points at its new place, then [`Graph::pruned`]
    /// drops what no output reads. What a pass that rebuilds the node list ends with.
    pub fn with_nodes(self, mut values: Vec<Value>, nodes: Vec<Node>) -> Graph {
        for (i, node) in nodes.iter().enumerate() {
            for (k, &o) in node.outputs.iter().enumerate() {
                values[o.0 as usize].def = ValueDef::Node { node: NodeId(i as u32), output: k };
            }
        }
        Graph { values, nodes, ..self }.pruned()
    }

    pub fn pruned(&self) -> Graph {
        let is_output: HashSet<ValueId> = self.outputs.iter().copied().collect();
        let alias = self.identity_aliases(&is_output);
        let resolve = |v: ValueId| alias[v.0 as usize];
        let live_node = self.live_nodes(&alias, &is_output);
        let mut copy = ValueCopier { from: self, g: self.empty_like(self.name.clone()), map: HashMap::new() };
        for &i in &self.inputs {
            let id = copy.keep(i, ValueDef::Input);
            copy.g.inputs.push(id);
        }
        for (ni, n) in self.nodes.iter().enumerate() {
            if !live_node[ni] {
                continue;
            }
            let inputs = n.inputs.iter().map(|i| i.map(|v| copy.keep(resolve(v), self.value(resolve(v)).def.clone())));
            let inputs = inputs.collect();
            let node_id = NodeId(copy.g.nodes.len() as u32);
            let outputs = n
                .outputs
                .iter()
                .enumerate()
                .map(|(k, &o)| copy.keep(o, ValueDef::Node { node: node_id, output: k }))
                .collect();
            copy.g.nodes.push(Node { outputs, inputs, ..n.clone() });
        }
        for &o in &self.outputs {
            let id = copy.keep(o, self.value(o).def.clone());
            copy.g.outputs.push(id);
        }
        copy.g
    }

    /// Each value's representative once Identity nodes are bypassed (except those that name a
    /// graph output): the start of its Identity chain.
    fn identity_aliases(&self, is_output: &HashSet<ValueId>) -> Vec<ValueId> {
        let mut alias: Vec<ValueId> = (0..self.values.len() as u32).map(ValueId).collect();
        for n in &self.nodes {
            if is_bypassed_identity(n, is_output) {
                if let Some(src) = n.inputs[0] {
                    alias[n.outputs[0].0 as usize] = alias[src.0 as usize];
                }
            }
        }
        alias
    }

    /// Which nodes a graph output depends on, reading through the aliases.
    fn live_nodes(&self, alias: &[ValueId], is_output: &HashSet<ValueId>) -> Vec<bool> {
        let mut live_value = vec![false; self.values.len()];
        let mut live_node = vec![false; self.nodes.len()];
        for &o in &self.outputs {
            live_value[alias[o.0 as usize].0 as usize] = true;
            live_value[o.0 as usize] = true;
        }
        for (ni, n) in self.nodes.iter().enumerate().rev() {
            if is_bypassed_identity(n, is_output) || !n.outputs.iter().any(|o| live_value[o.0 as usize]) {
                continue;
            }
            live_node[ni] = true;
            for &i in n.inputs.iter().flatten() {
                live_value[alias[i.0 as usize].0 as usize] = true;
            }
        }
        live_node
    }

    /// A graph named `name` with this graph's weights and assumptions and nothing else.
    fn empty_like(&self, name: String) -> Graph {
        Graph {
            name,
            values: Vec::new(),
            nodes: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            weights: self.weights.clone(),
            assumptions: self.assumptions.clone(),
        }
    }
}

/// An Identity node [`Graph::pruned`] bypasses: one whose output is not a graph output.
fn is_bypassed_identity(n: &Node, is_output: &HashSet<ValueId>) -> bool {
    n.op == "Identity" && n.domain == Domain::Onnx && !is_output.contains(&n.outputs[0])
}

/// Values of `from` copied into `g`, each once.
struct ValueCopier<'a> {
    from: &'a Graph,
    g: Graph,
    map: HashMap<ValueId, ValueId>,
}

impl ValueCopier<'_> {
    /// The copy of `v`, made with definition `def` if there is none yet.
    fn keep(&mut self, v: ValueId, def: ValueDef) -> ValueId {
        if let Some(&m) = self.map.get(&v) {
            return m;
        }
        let old = self.from.value(v);
        let id = self.push(old, def);
        self.map.insert(v, id);
        id
    }

    /// A new value like `old` with definition `def`.
    fn push(&mut self, old: &Value, def: ValueDef) -> ValueId {
        self.g.values.push(Value { name: old.name.clone(), dtype: old.dtype, shape: old.shape.clone(), def });
        ValueId(self.g.values.len() as u32 - 1)
    }
}

impl Graph {
    /// The subgraph of one decoder layer: nodes whose name contains `layers.N/` or `layers.N.`
    /// (the naming torch exporters and onnxruntime-genai use). Values read from outside the layer
    /// become inputs; values the rest of the graph reads (or graph outputs) become outputs.
    /// `None` when no node belongs to the layer.
    pub fn layer(&self, n: usize) -> Option<Graph> {
        let inside = self.layer_nodes(n)?;
        let read_outside = self.read_outside(&inside);
        let mut copy =
            ValueCopier { from: self, g: self.empty_like(format!("{} layer {n}", self.name)), map: HashMap::new() };
        for (ni, node) in self.nodes.iter().enumerate() {
            if !inside[ni] {
                continue;
            }
            let inputs = node.inputs.iter().map(|i| i.map(|v| copy.layer_input(v))).collect();
            let node_id = NodeId(copy.g.nodes.len() as u32);
            let mut outputs = Vec::new();
            for (k, &o) in node.outputs.iter().enumerate() {
                let id = copy.push(self.value(o), ValueDef::Node { node: node_id, output: k });
                copy.map.insert(o, id);
                outputs.push(id);
                if read_outside[o.0 as usize] {
                    copy.g.outputs.push(id);
                }
            }
            copy.g.nodes.push(Node { inputs, outputs, ..node.clone() });
        }
        Some(copy.g)
    }

    /// Which nodes belong to layer `n`: those named after it, and the nodes computed from weights
    /// and constants only that they read. `None` when no node is named after it.
    fn layer_nodes(&self, n: usize) -> Option<Vec<bool>> {
        let tags = [format!("layers.{n}/"), format!("layers.{n}."), format!("layers.{n}_")];
        let mut inside: Vec<bool> =
            self.nodes.iter().map(|node| tags.iter().any(|t| node.name.contains(t.as_str()))).collect();
        if !inside.iter().any(|&b| b) {
            return None;
        }
        // Nodes computed from weights and constants only (a weight's DequantizeLinear, which
        // quantize_static names after the weight, not the layer) belong to the layer that reads
        // them.
        let compile_time = self.compile_time_nodes();
        loop {
            let mut grew = false;
            for ni in (0..self.nodes.len()).rev() {
                if !inside[ni] {
                    continue;
                }
                for &i in self.nodes[ni].inputs.iter().flatten() {
                    if let ValueDef::Node { node, .. } = self.value(i).def {
                        let p = node.0 as usize;
                        if compile_time[p] && !inside[p] {
                            inside[p] = true;
                            grew = true;
                        }
                    }
                }
            }
            if !grew {
                return Some(inside);
            }
        }
    }

    /// Values read by a node outside `inside`, or graph outputs.
    fn read_outside(&self, inside: &[bool]) -> Vec<bool> {
        let mut read_outside = vec![false; self.values.len()];
        for (ni, node) in self.nodes.iter().enumerate() {
            if !inside[ni] {
                for &i in node.inputs.iter().flatten() {
                    read_outside[i.0 as usize] = true;
                }
            }
        }
        for &o in &self.outputs {
            read_outside[o.0 as usize] = true;
        }
        read_outside
    }
}

impl ValueCopier<'_> {
    /// The copy of `v` read by a layer's node: a value computed outside the layer (or a graph
    /// input) becomes an input of the layer; weights and constants stay what they are.
    fn layer_input(&mut self, v: ValueId) -> ValueId {
        if let Some(&m) = self.map.get(&v) {
            return m;
        }
        let old = self.from.value(v);
        let def = match &old.def {
            ValueDef::Node { .. } | ValueDef::Input => ValueDef::Input,
            other => other.clone(),
        };
        let is_input = matches!(def, ValueDef::Input);
        let id = self.push(old, def);
        self.map.insert(v, id);
        if is_input {
            self.g.inputs.push(id);
        }
        id
    }
}

impl std::fmt::Debug for Graph {
    /// The printed text form (weights by digest).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::print::print_graph(self))
    }
}

impl Graph {
    /// For each node, whether all its inputs are weights, constants or outputs of such nodes.
    pub fn compile_time_nodes(&self) -> Vec<bool> {
        let mut known = vec![false; self.values.len()];
        for (i, v) in self.values.iter().enumerate() {
            known[i] = matches!(v.def, ValueDef::Weight(_) | ValueDef::Const(_));
        }
        let mut out = vec![false; self.nodes.len()];
        for (ni, n) in self.nodes.iter().enumerate() {
            let ct = n.inputs.iter().flatten().all(|i| known[i.0 as usize]);
            out[ni] = ct;
            if ct {
                for &o in &n.outputs {
                    known[o.0 as usize] = true;
                }
            }
        }
        out
    }
}

impl Graph {
    /// The per-tensor scale of the DequantizeLinear that computes `value`, when it is one: the
    /// size of one quantisation step of that value.
    pub fn dequantize_step(&self, value: ValueId) -> Option<f64> {
        let ValueDef::Node { node, .. } = self.value(value).def else { return None };
        let n = self.node(node);
        if n.op != "DequantizeLinear" {
            return None;
        }
        let t = match &self.value(n.inputs.get(1).copied().flatten()?).def {
            ValueDef::Const(t) => t.clone(),
            ValueDef::Weight(w) => self.weights.get(*w).to_tensor().ok()?,
            _ => return None,
        };
        (t.numel() == 1).then(|| t.to_f64_vec()[0])
    }
}

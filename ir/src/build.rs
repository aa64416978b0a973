//! Writing a graph value by value: for passes that emit a new graph and for tests that need a
//! small program by hand.
//!
//! A [`GraphBuilder`] hands out the [`ValueId`]s the finished [`Graph`] uses, in the order the
//! values were made, so ids taken while building stay valid afterwards. Nodes must be added in
//! topological order (a node reads only values made before it), which is the order a program is
//! written in anyway.
//!
//! Names: every method that makes a value or a node takes its name; an empty name asks for a
//! generated one, `v<i>` for the value that gets index `i` and `n<i>` for the node that gets index
//! `i`. Value names must be unique in the graph (values are fed and read by name), so a caller
//! that mixes its own names with generated ones keeps them apart.
//!
//! Building never fails halfway: the methods record the first problem they meet (an op outside
//! the vocabulary, a wrong number of inputs or outputs, an id this builder has not made, a tensor
//! that has no byte encoding) and [`GraphBuilder::finish`] returns it, naming the node or weight.

use crate::attr::{Attr, Attrs};
use crate::dim::Dim;
use crate::dtype::DType;
use crate::graph::{Graph, GraphError, Node, NodeId, Value, ValueDef, ValueId};
use crate::op::{self, Domain};
use crate::tensor::{Tensor, TensorError};
use crate::weights::{Weight, WeightStore};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// Opset version written on nodes of the default ONNX domain unless the builder is told otherwise.
pub const DEFAULT_ONNX_OPSET: i64 = 21;

/// The dtype and shape of one value.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueType {
    pub dtype: DType,
    pub shape: Vec<Dim>,
}

impl ValueType {
    pub fn new(dtype: DType, shape: Vec<Dim>) -> ValueType {
        ValueType { dtype, shape }
    }

    /// A type whose dims are all known.
    pub fn known(dtype: DType, dims: &[usize]) -> ValueType {
        ValueType { dtype, shape: dims.iter().map(|&d| Dim::known(d as i64)).collect() }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BuildError {
    #[error("node `{node}`: {domain}::{op} is not in npuc's op vocabulary")]
    UnknownOp { node: String, domain: Domain, op: &'static str },
    #[error("node `{node}`: {domain}::{op} {what} given: {given}, expected: {expected}")]
    Arity { node: String, domain: Domain, op: &'static str, what: &'static str, expected: String, given: usize },
    #[error("node `{node}` reads value id {value}, which this builder has not made")]
    ForeignInput { node: String, value: u32 },
    #[error("graph output id {0} is not a value this builder has made")]
    ForeignOutput(u32),
    #[error("weight `{name}` has no byte encoding: {source}")]
    WeightBytes { name: String, source: TensorError },
    #[error("value name `{0}` is used more than once")]
    DuplicateName(String),
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// A graph under construction; see the module documentation for its contract.
pub struct GraphBuilder {
    graph: Graph,
    store: WeightStore,
    opsets: BTreeMap<Domain, i64>,
    problem: Option<BuildError>,
}

impl GraphBuilder {
    /// An empty graph called `name`. Nodes of the ONNX domain get opset [`DEFAULT_ONNX_OPSET`],
    /// nodes of every other domain opset 1, until [`GraphBuilder::with_opset`] says otherwise.
    pub fn new(name: &str) -> GraphBuilder {
        let graph = Graph {
            name: name.to_string(),
            values: Vec::new(),
            nodes: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            weights: Arc::default(),
            assumptions: Vec::new(),
        };
        let opsets = BTreeMap::from([(Domain::Onnx, DEFAULT_ONNX_OPSET)]);
        GraphBuilder { graph, store: WeightStore::default(), opsets, problem: None }
    }

    /// Nodes of `domain` added from now on carry opset `version`.
    pub fn with_opset(mut self, domain: Domain, version: i64) -> GraphBuilder {
        self.opsets.insert(domain, version);
        self
    }

    /// A new graph input, after the inputs made before it.
    pub fn input(&mut self, name: &str, ty: ValueType) -> ValueId {
        let id = self.push_value(name, ty, ValueDef::Input);
        self.graph.inputs.push(id);
        id
    }

    /// A weight holding `tensor`'s bytes in the graph's [`WeightStore`], under the value's name.
    pub fn weight(&mut self, name: &str, tensor: &Tensor) -> ValueId {
        let name = self.value_name(name);
        let bytes = tensor.to_le_bytes().unwrap_or_else(|source| {
            self.record(BuildError::WeightBytes { name: name.clone(), source });
            Vec::new()
        });
        let id = self.store.add(Weight::new(name.clone(), tensor.dtype, tensor.shape.clone(), bytes.into()));
        self.push_value(&name, ValueType::known(tensor.dtype, &tensor.shape), ValueDef::Weight(id))
    }

    /// A small constant held by value in the graph (a scalar, axes, a shape).
    pub fn constant(&mut self, name: &str, tensor: Tensor) -> ValueId {
        let ty = ValueType::known(tensor.dtype, &tensor.shape);
        self.push_value(name, ty, ValueDef::Const(tensor))
    }

    /// Starts a node of `domain::op`; [`NodeBuilder::add`] adds it after the nodes made before it.
    pub fn node(&mut self, domain: Domain, op: &'static str) -> NodeBuilder<'_> {
        NodeBuilder {
            builder: self,
            name: String::new(),
            domain,
            op,
            attrs: Attrs::default(),
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// An ONNX-domain node without attributes, reading `inputs` (all present) and making one value
    /// of type `ty`; node and value names are generated.
    pub fn op(&mut self, op: &'static str, inputs: &[ValueId], ty: ValueType) -> ValueId {
        self.node(Domain::Onnx, op).inputs(inputs).output("", ty).add()[0]
    }

    /// Makes `value` a graph output, after the outputs named before it.
    pub fn output(&mut self, value: ValueId) {
        if value.0 as usize >= self.graph.values.len() {
            self.record(BuildError::ForeignOutput(value.0));
        }
        self.graph.outputs.push(value);
    }

    /// Nodes added so far: the index the next node gets.
    pub fn node_count(&self) -> usize {
        self.graph.nodes.len()
    }

    /// A value made so far.
    ///
    /// # Panics
    /// If `id` was not made by this builder (a broken invariant of the caller).
    pub fn value(&self, id: ValueId) -> &Value {
        self.graph.value(id)
    }

    /// The graph, with the first problem met while building, a repeated value name, or a broken
    /// [`Graph::verify`] invariant as the error.
    pub fn finish(mut self) -> Result<Graph, BuildError> {
        if let Some(problem) = self.problem {
            return Err(problem);
        }
        let mut names = HashSet::new();
        if let Some(v) = self.graph.values.iter().find(|v| !names.insert(v.name.as_str())) {
            return Err(BuildError::DuplicateName(v.name.clone()));
        }
        self.graph.weights = Arc::new(self.store);
        self.graph.verify()?;
        Ok(self.graph)
    }

    fn value_name(&self, name: &str) -> String {
        if name.is_empty() {
            format!("v{}", self.graph.values.len())
        } else {
            name.to_string()
        }
    }

    fn push_value(&mut self, name: &str, ty: ValueType, def: ValueDef) -> ValueId {
        let name = self.value_name(name);
        self.graph.values.push(Value { name, dtype: ty.dtype, shape: ty.shape, def });
        ValueId(self.graph.values.len() as u32 - 1)
    }

    fn record(&mut self, problem: BuildError) {
        self.problem.get_or_insert(problem);
    }
}

/// One node being described; nothing is added to the graph until [`NodeBuilder::add`].
#[must_use = "a node is added to the graph only by `add`"]
pub struct NodeBuilder<'b> {
    builder: &'b mut GraphBuilder,
    name: String,
    domain: Domain,
    op: &'static str,
    attrs: Attrs,
    inputs: Vec<Option<ValueId>>,
    outputs: Vec<(String, ValueType)>,
}

impl NodeBuilder<'_> {
    /// The node's name (generated when not given or empty).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    pub fn attr(mut self, name: &str, value: Attr) -> Self {
        self.attrs.set(name, value);
        self
    }

    pub fn attrs(mut self, attrs: &[(&str, Attr)]) -> Self {
        for (name, value) in attrs {
            self.attrs.set(name, value.clone());
        }
        self
    }

    /// Appends present inputs.
    pub fn inputs(mut self, values: &[ValueId]) -> Self {
        self.inputs.extend(values.iter().copied().map(Some));
        self
    }

    /// Appends inputs of which `None` marks an omitted optional one.
    pub fn optional_inputs(mut self, values: &[Option<ValueId>]) -> Self {
        self.inputs.extend_from_slice(values);
        self
    }

    /// Appends an output value called `name` (generated when empty) of type `ty`.
    pub fn output(mut self, name: &str, ty: ValueType) -> Self {
        self.outputs.push((name.to_string(), ty));
        self
    }

    /// Adds the node and returns its output values in order.
    pub fn add(self) -> Vec<ValueId> {
        let NodeBuilder { builder, name, domain, op, attrs, inputs, outputs } = self;
        let node = NodeId(builder.graph.nodes.len() as u32);
        let name = if name.is_empty() { format!("n{}", node.0) } else { name };
        if let Some(problem) = check_node(&name, domain, op, &inputs, outputs.len(), builder.graph.values.len()) {
            builder.record(problem);
        }
        let outputs: Vec<ValueId> = outputs
            .into_iter()
            .enumerate()
            .map(|(output, (value_name, ty))| builder.push_value(&value_name, ty, ValueDef::Node { node, output }))
            .collect();
        let opset = builder.opsets.get(&domain).copied().unwrap_or(1);
        builder.graph.nodes.push(Node { name, domain, op, opset, attrs, inputs, outputs: outputs.clone() });
        outputs
    }
}

/// The first thing wrong with a node: its op, its arities, or an input id past the `values` made.
fn check_node(
    name: &str,
    domain: Domain,
    op: &'static str,
    inputs: &[Option<ValueId>],
    outputs: usize,
    values: usize,
) -> Option<BuildError> {
    let Some(spec) = op::lookup(domain, op) else {
        return Some(BuildError::UnknownOp { node: name.to_string(), domain, op });
    };
    let arity = |what, given, min, max| {
        let expected = arity_text(min, max);
        BuildError::Arity { node: name.to_string(), domain, op, what, expected, given }
    };
    if !(spec.min_inputs..=spec.max_inputs).contains(&inputs.len()) {
        return Some(arity("inputs", inputs.len(), spec.min_inputs, spec.max_inputs));
    }
    if !(spec.min_outputs..=spec.max_outputs).contains(&outputs) {
        return Some(arity("outputs", outputs, spec.min_outputs, spec.max_outputs));
    }
    let foreign = inputs.iter().flatten().find(|v| v.0 as usize >= values)?;
    Some(BuildError::ForeignInput { node: name.to_string(), value: foreign.0 })
}

/// `2`, `1 to 3` or `at least 1`.
fn arity_text(min: usize, max: usize) -> String {
    match max {
        op::MANY => format!("at least {min}"),
        _ if min == max => min.to_string(),
        _ => format!("{min} to {max}"),
    }
}

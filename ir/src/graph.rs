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
use std::collections::HashMap;
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
    Node { node: NodeId, output: usize },
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
                    return Err(GraphError::UseBeforeDef { node: node.name.clone(), value: self.value(input).name.clone() });
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

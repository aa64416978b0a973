//! The compiled graph as the bundle's program (`bundle::program`, format `npuc-program/1`): every
//! value with its dtype, symbolic shape and definition, every node with its attributes.

use bundle::program::{Attr as FAttr, Dim, Node, Program, Tensor as FTensor, TensorData, Value, ValueDef as FDef};
use ir::graph::{Graph, ValueDef};
use ir::{Attr, Data, Tensor};

/// The program of `g`: value `i` of the program is value `i` of the graph.
pub fn program(g: &Graph) -> Program {
    let values = g.values.iter().map(|v| value(g, v)).collect();
    let nodes = g.nodes.iter().map(node).collect();
    let index = |v: &ir::ValueId| v.0 as usize;
    Program::new(values, nodes, g.inputs.iter().map(index).collect(), g.outputs.iter().map(index).collect())
}

fn value(g: &Graph, v: &ir::Value) -> Value {
    let def = match &v.def {
        ValueDef::Input => FDef::Input,
        ValueDef::Node { .. } => FDef::Node,
        ValueDef::Weight(w) => FDef::Weight(g.weights.get(*w).name.clone()),
        ValueDef::Const(t) => FDef::Const(tensor(t)),
    };
    let shape = v
        .shape
        .iter()
        .map(|d| match d.as_known() {
            Some(k) => Dim::Known(k),
            None => Dim::Symbolic(d.to_string()),
        })
        .collect();
    Value { name: v.name.clone(), dtype: v.dtype.name().to_string(), shape, def }
}

fn node(n: &ir::Node) -> Node {
    Node {
        name: n.name.clone(),
        op: format!("{}::{}", n.domain, n.op),
        attrs: n.attrs.0.iter().map(|(k, v)| (k.clone(), attr(v))).collect(),
        inputs: n.inputs.iter().map(|i| i.map(|v| v.0 as usize)).collect(),
        outputs: n.outputs.iter().map(|v| v.0 as usize).collect(),
    }
}

fn tensor(t: &Tensor) -> FTensor {
    let data = match &t.data {
        Data::F32(v) => TensorData::Floats(v.clone()),
        Data::F64(v) => TensorData::Doubles(v.clone()),
        Data::I64(v) => TensorData::Ints(v.clone()),
        Data::Str(v) => TensorData::Strs(v.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect()),
    };
    FTensor { dtype: t.dtype.name().to_string(), shape: t.shape.clone(), data }
}

fn attr(a: &Attr) -> FAttr {
    match a {
        Attr::Int(v) => FAttr::Int(*v),
        Attr::Float(v) => FAttr::Float(*v),
        Attr::Str(v) => FAttr::Str(v.clone()),
        Attr::Ints(v) => FAttr::Ints(v.clone()),
        Attr::Floats(v) => FAttr::Floats(v.clone()),
        Attr::Strs(v) => FAttr::Strs(v.clone()),
        Attr::Tensor(t) => FAttr::Tensor { tensor: tensor(t) },
    }
}

//! The stable text form of a graph. One line per input, weight, constant, node and output, in
//! definition order; weights print by name and digest, never by value. Every snapshot and
//! `npuc passes` use this, so changing the format changes every snapshot: do it deliberately.
//!
//! ```text
//! graph llama_f1
//!   input  %input_ids : i64[batch_size,sequence_length]
//!   weight %embed : f32[512,256] #9c1f04d2aa51e7b3
//!   const  %axes : i64[1] = [-1]
//!   %h = ai.onnx::Gather(%embed, %input_ids) {axis=0} : f32[batch_size,sequence_length,256]
//!   output %logits
//! ```

use crate::dim::shape_to_string;
use crate::graph::{Graph, ValueDef, ValueId};
use crate::tensor::{Data, Tensor};
use std::fmt::Write;

/// Constants with at most this many elements print their values; larger ones print a digest.
const INLINE_CONST_ELEMENTS: usize = 8;

pub fn print_graph(g: &Graph) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "graph {}", g.name);
    for a in &g.assumptions {
        let _ = writeln!(out, "  assume {a}");
    }
    let ty = |id: ValueId| {
        let v = g.value(id);
        format!("{}{}", v.dtype, shape_to_string(&v.shape))
    };
    for &i in &g.inputs {
        let _ = writeln!(out, "  input  %{} : {}", g.value(i).name, ty(i));
    }
    for (i, v) in g.values.iter().enumerate() {
        let id = ValueId(i as u32);
        match &v.def {
            ValueDef::Weight(w) => {
                let _ = writeln!(out, "  weight %{} : {} #{:016x}", v.name, ty(id), g.weights.get(*w).digest());
            }
            ValueDef::Const(t) => {
                let _ = writeln!(out, "  const  %{} : {} = {}", v.name, ty(id), const_text(t));
            }
            _ => {}
        }
    }
    for n in &g.nodes {
        let outs: Vec<String> = n.outputs.iter().map(|&o| format!("%{}", g.value(o).name)).collect();
        let ins: Vec<String> = n
            .inputs
            .iter()
            .map(|i| match i {
                Some(v) => format!("%{}", g.value(*v).name),
                None => "_".to_string(),
            })
            .collect();
        let attrs: Vec<String> = n.attrs.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let types: Vec<String> = n.outputs.iter().map(|&o| ty(o)).collect();
        let _ = write!(out, "  {} = {}::{}({})", outs.join(", "), n.domain, n.op, ins.join(", "));
        if !attrs.is_empty() {
            let _ = write!(out, " {{{}}}", attrs.join(", "));
        }
        let _ = writeln!(out, " : {}", types.join(", "));
    }
    for &o in &g.outputs {
        let _ = writeln!(out, "  output %{}", g.value(o).name);
    }
    out
}

/// A constant's values when small, else its digest.
pub fn const_text(t: &Tensor) -> String {
    if t.numel() > INLINE_CONST_ELEMENTS {
        let bytes = t.to_le_bytes().unwrap_or_default();
        return format!("#{:016x}", crate::weights::content_digest(&bytes));
    }
    let items: Vec<String> = match &t.data {
        Data::F32(v) => v.iter().map(|x| format!("{x:e}")).collect(),
        Data::F64(v) => v.iter().map(|x| format!("{x:e}")).collect(),
        Data::I64(v) => v.iter().map(|x| x.to_string()).collect(),
        Data::Str(v) => v.iter().map(|x| format!("{:?}", String::from_utf8_lossy(x))).collect(),
    };
    if t.shape.is_empty() {
        items.join("")
    } else {
        format!("[{}]", items.join(","))
    }
}

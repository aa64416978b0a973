//! Several designs as one array program: a module holding each design's `aie.device` and a main
//! device whose runtime sequence configures them in turn (`aiex.configure @design`, which
//! mlir-aie lowers to a reconfiguration of the array within the same command) and runs each
//! one's sequence on buffers of the program (`aiex.run @sequence(...)`). A phase's output buffer
//! is a later phase's input as the array wrote it: the host gives the program its inputs and
//! reads its outputs, and nothing in between — decode's MLP, the norm-fed gate/up design
//! writing the gate's and up's rows that the gate-fed down design reads, is one command, and so
//! is the layer after attention ([`layer`]), the output projection writing the row the sum-fed
//! gate/up design adds to the residual stream.

use crate::design::{memref, Design, Elem};
use crate::device::Device;
use crate::qgemv::{self, Feed, QTiling};
use std::fmt::Write;

/// One phase: a design and the program buffers its sequence's arguments are, in order.
#[derive(Clone, Debug)]
pub struct Phase {
    pub design: Design,
    pub buffers: Vec<usize>,
}

/// An array program (see the module doc).
#[derive(Clone, Debug)]
pub struct ArrayProgram {
    pub name: String,
    pub device: Device,
    /// The program's buffers, as its sequence's arguments: (elements, type).
    pub buffers: Vec<(usize, Elem)>,
    pub phases: Vec<Phase>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SequenceError {
    #[error("program {program}: design {design} is for {found}, not {device}")]
    Device { program: String, design: String, found: Device, device: Device },
    #[error("program {program}: design {design}'s argument {arg} is {want:?}, buffer {buffer} {given:?}")]
    Buffer {
        program: String,
        design: String,
        arg: usize,
        buffer: usize,
        want: (usize, Elem),
        given: Option<(usize, Elem)>,
    },
    #[error("program {program}: design {design} takes {want} arguments, given {given} buffers")]
    Arity { program: String, design: String, want: usize, given: usize },
    #[error("program {program}: two phases are design {design}")]
    Repeated { program: String, design: String },
}

impl ArrayProgram {
    /// The program of `phases` on `buffers`, each phase's designs' arguments checked against
    /// the buffers they are given: of the argument's type and at least as long. A longer buffer
    /// widens the argument (its DMAs read and write the part they always did): the gate/up
    /// design's padded output row is the down design's `[2, rows, K]` rows operand and more.
    pub fn new(name: &str, buffers: Vec<(usize, Elem)>, mut phases: Vec<Phase>) -> Result<ArrayProgram, SequenceError> {
        let device = phases.first().map_or(Device::Npu1, |p| p.design.tiling.device);
        let program = name.to_string();
        for i in 0..phases.len() {
            let p = &phases[i];
            let design = p.design.name.clone();
            if p.design.tiling.device != device {
                let found = p.design.tiling.device;
                return Err(SequenceError::Device { program, design, found, device });
            }
            if phases[..i].iter().any(|q| q.design.name == design) {
                return Err(SequenceError::Repeated { program, design });
            }
            if p.design.args.len() != p.buffers.len() {
                let (want, given) = (p.design.args.len(), p.buffers.len());
                return Err(SequenceError::Arity { program, design, want, given });
            }
            for arg in 0..p.buffers.len() {
                let (want, buffer) = (phases[i].design.args[arg], phases[i].buffers[arg]);
                let given = buffers.get(buffer).copied();
                match given {
                    Some((len, elem)) if elem == want.1 && len >= want.0 => phases[i].design.args[arg].0 = len,
                    _ => return Err(SequenceError::Buffer { program, design, arg, buffer, want, given }),
                }
            }
        }
        Ok(ArrayProgram { name: program, device, buffers, phases })
    }

    fn arg_types(&self) -> Vec<String> {
        self.buffers.iter().map(|&(len, e)| memref(&[len], e)).collect()
    }

    /// The generic form: the main device, then each phase's design.
    pub fn generic(&self) -> String {
        let types = self.arg_types();
        let mut o = String::from("\"builtin.module\"() ({\n  \"aie.device\"() ({\n    \"aie.runtime_sequence\"() ({\n");
        let params: Vec<String> = types.iter().enumerate().map(|(i, ty)| format!("%arg{i}: {ty}")).collect();
        let _ = writeln!(o, "    ^bb0({}):", params.join(", "));
        for p in &self.phases {
            let args: Vec<String> = p.buffers.iter().map(|b| format!("%arg{b}")).collect();
            let tys: Vec<&str> = p.buffers.iter().map(|&b| types[b].as_str()).collect();
            let _ = writeln!(o, "      \"aiex.configure\"() ({{");
            let _ = writeln!(
                o,
                "        \"aiex.run\"({}) {{runtime_sequence_symbol = @sequence}} : ({}) -> ()",
                args.join(", "),
                tys.join(", ")
            );
            let _ = writeln!(o, "      }}) {{symbol = @{}}} : () -> ()", p.design.name);
        }
        let _ = writeln!(o, "    }}) {{sym_name = \"sequence\"}} : () -> ()\n    \"aie.end\"() : () -> ()");
        let device = crate::design::device_enum(self.device);
        let _ = writeln!(o, "  }}) {{device = {device} : i32, sym_name = \"{}\"}} : () -> ()", self.name);
        for p in &self.phases {
            p.design.generic_device(&mut o);
        }
        o.push_str("}) : () -> ()\n");
        o
    }

    /// The custom form mlir-aie's `aie-opt` and `aiecc` take.
    pub fn pretty(&self) -> String {
        let types = self.arg_types();
        let mut o = String::from("module {\n");
        let _ = writeln!(o, "  aie.device({}) @{} {{", self.device, self.name);
        let params: Vec<String> = types.iter().enumerate().map(|(i, ty)| format!("%arg{i}: {ty}")).collect();
        let _ = writeln!(o, "    aie.runtime_sequence @sequence({}) {{", params.join(", "));
        for p in &self.phases {
            let args: Vec<String> = p.buffers.iter().map(|b| format!("%arg{b}")).collect();
            let tys: Vec<&str> = p.buffers.iter().map(|&b| types[b].as_str()).collect();
            let _ = writeln!(o, "      aiex.configure @{} {{", p.design.name);
            let _ = writeln!(o, "        aiex.run @sequence ({}) : ({})", args.join(", "), tys.join(", "));
            let _ = writeln!(o, "      }}");
        }
        let _ = writeln!(o, "    }}\n  }}");
        for p in &self.phases {
            p.design.pretty_device(&mut o);
        }
        o.push_str("}\n");
        o
    }
}

/// Why three qgemv designs cannot be decode's layer after attention as one program.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LayerError {
    #[error("{0} is not a one-row rows-fed pairs design")]
    Projection(String),
    #[error("{0} is not a one-row sum-fed gate/up design")]
    Sum(String),
    #[error("{o} writes {n} values a row; {gate_up} normalises rows of {k}")]
    Rows { o: String, gate_up: String, n: usize, k: usize },
    #[error(transparent)]
    Mlp(#[from] MlpError),
}

/// Why two qgemv designs cannot be decode's MLP as one program.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MlpError {
    #[error("{0} is not a one-row norm- or rows-fed pairs design, whose output row is the gate's then the up's")]
    GateUp(String),
    #[error("{0} is not a one-row gate-fed design")]
    Down(String),
    #[error("{down} reads rows of {k} values; {gate_up}'s outputs are the gate's {half} then the up's")]
    Rows { gate_up: String, down: String, k: usize, half: usize },
    #[error(transparent)]
    Sequence(#[from] SequenceError),
}

/// Decode's MLP as one program: the gate/up pairs design (its output row the gate's `I` values,
/// then the up's), then the gate-fed down design reading that buffer as its `[2, 1, I]` rows
/// operand — so the down design's padded K must be `I`. Buffers: the gate/up design's rows
/// operand and weights, the row between the phases, the down design's weights, the output,
/// and a sum-fed gate/up design's sum last.
pub fn mlp(gate_up: &QTiling, down: &QTiling) -> Result<ArrayProgram, MlpError> {
    let (d1, d2) = (qgemv::build(gate_up), qgemv::build(down));
    let (t1, t2) = (&gate_up.tiling, &down.tiling);
    if !gate_up.pairs || t1.padded.m != 1 || matches!(gate_up.feed, Feed::Gate { .. }) {
        return Err(MlpError::GateUp(d1.name));
    }
    if !matches!(down.feed, Feed::Gate { .. }) || t2.padded.m != 1 {
        return Err(MlpError::Down(d2.name));
    }
    let half = t1.shape.n / 2;
    if t1.shape.n % 2 != 0 || t2.padded.k != half || t2.shape.k != half {
        return Err(MlpError::Rows { gate_up: d1.name, down: d2.name, k: t2.padded.k, half });
    }
    let mut buffers = vec![d1.args[0], d1.args[1], d1.args[2], d2.args[1], d2.args[2]];
    let mut first = vec![0, 1, 2];
    if let Some(&sum) = d1.args.get(3) {
        buffers.push(sum);
        first.push(5);
    }
    let name = format!("mlp_{}_{}", d1.name, d2.name);
    let phases = vec![Phase { design: d1, buffers: first }, Phase { design: d2, buffers: vec![2, 3, 4] }];
    Ok(ArrayProgram::new(&name, buffers, phases)?)
}

/// Decode's layer from the attention's rows to the next layer's residual stream as one program:
/// the attention's output projection `o` (a rows-fed pairs design) writes its output row into
/// the third plane of the sum-fed gate/up design's rows operand (the residual stream's row, γ,
/// then the projection's), and the MLP follows as in [`mlp`]. Buffers: `o`'s rows operand and
/// weights, the gate/up rows operand (the host fills the residual stream's row and γ), the
/// gate/up weights, the row between the MLP's phases, the down weights, the output, the sum.
pub fn layer(o: &QTiling, gate_up: &QTiling, down: &QTiling) -> Result<ArrayProgram, LayerError> {
    let (to, tg) = (&o.tiling, &gate_up.tiling);
    if !o.pairs || o.feed != Feed::Rows || to.padded.m != 1 || o.out_at != 0 {
        return Err(LayerError::Projection(qgemv::build(o).name));
    }
    if !matches!(gate_up.feed, Feed::Norm { sum: true, .. }) || tg.padded.m != 1 {
        return Err(LayerError::Sum(qgemv::build(gate_up).name));
    }
    if to.shape.n != tg.shape.k {
        let (o, gate_up) = (qgemv::build(o).name, qgemv::build(gate_up).name);
        return Err(LayerError::Rows { o, gate_up, n: to.shape.n, k: tg.shape.k });
    }
    let mlp = mlp(gate_up, down)?;
    let d0 = qgemv::build(&o.writing_at(gate_up.layout().addend_at()));
    let [gu, dn] = &mlp.phases[..] else { unreachable!("an MLP has two phases") };
    let rows = (d0.args[2].0.max(gu.design.args[0].0), Elem::F32);
    let b = &mlp.buffers;
    let buffers = vec![d0.args[0], d0.args[1], rows, b[1], b[2], b[3], b[4], b[5]];
    let name = format!("layer_{}_{}_{}", d0.name, gu.design.name, dn.design.name);
    let phases = vec![
        Phase { design: d0, buffers: vec![0, 1, 2] },
        Phase { design: qgemv::build(gate_up), buffers: vec![2, 3, 4, 7] },
        Phase { design: qgemv::build(down), buffers: vec![4, 5, 6] },
    ];
    Ok(ArrayProgram::new(&name, buffers, phases).map_err(MlpError::from)?)
}

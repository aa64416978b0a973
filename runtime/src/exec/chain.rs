//! Chains of program nodes an offload computes as one call: a decode projection from its f32
//! rows to its f32 outputs, quantisation and the sum of the weight's passes included, and a
//! residual `Add` in front of its norm ([`OffloadChain`]). A step of at most the chain's rows
//! skips the chain's ops and, at its last one, gives the offload the chain's inputs and the
//! QGemm's weights and writes what comes back as the chain's outputs; longer steps run the ops
//! (and offer the QGemm alone).

use super::error::ExecError;
use super::plan::{Loc, Op};
use super::run::numel;
use super::Executor;
use crate::kernels::qgemm::QGemmWeights;

/// A chain an offload computes (see the module doc), by the program's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffloadChain {
    /// Every node of the chain; nothing outside it may read what they compute but `outputs`.
    pub nodes: Vec<String>,
    /// The QGemm nodes whose weights the call multiplies, in the order it takes them.
    pub qgemms: Vec<String>,
    /// The f32 values the call reads, in the order it takes them (weights included).
    pub inputs: Vec<String>,
    /// The f32 values it writes: the projection's, `[rows, n]`, then a residual sum's.
    pub outputs: Vec<String>,
    /// Steps of at most this many rows run the chain as one call.
    pub rows: usize,
}

/// A chain resolved against the executor's plan.
pub(super) struct Chain {
    /// Its ops' indices; the last runs the call.
    ops: Vec<usize>,
    qgemm_ops: Vec<usize>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    rows: usize,
}

/// Per op, the chain it belongs to (`chain_of`), and the chains.
#[derive(Default)]
pub(super) struct Chains {
    pub(super) chains: Vec<Chain>,
    pub(super) chain_of: Vec<Option<usize>>,
    /// Rows of the current step (0 without an offload): each chain of at least as many rows
    /// runs as a call.
    pub(super) step_rows: usize,
    /// Chain calls made.
    pub(super) calls: u64,
}

impl Executor<'_> {
    /// Resolves the offload's chains against the program: every name must be a node or value
    /// of it, the inputs and outputs f32, each node's ops in no other chain, and nothing
    /// outside the chain reading what its ops compute but the outputs.
    pub(super) fn resolve_chains(&mut self, wanted: &[OffloadChain]) -> Result<(), ExecError> {
        let mut chains = Chains { chain_of: vec![None; self.plan.ops.len()], ..Chains::default() };
        for (id, c) in wanted.iter().enumerate() {
            let chain = self.resolve_chain(c, &chains.chain_of)?;
            for &op in &chain.ops {
                chains.chain_of[op] = Some(id);
            }
            chains.chains.push(chain);
        }
        self.chains = chains;
        Ok(())
    }

    fn resolve_chain(&self, c: &OffloadChain, taken: &[Option<usize>]) -> Result<Chain, ExecError> {
        let head = c.qgemms.first().cloned().unwrap_or_default();
        let bad = |problem: String| ExecError::Chain { qgemm: head.clone(), problem };
        let program = &self.plan.program;
        let value = |name: &str| program.values.iter().position(|v| v.name == name);
        let ops: Vec<usize> =
            (0..self.plan.ops.len()).filter(|&i| c.nodes.contains(&program.nodes[self.plan.ops[i].0].name)).collect();
        let qgemm_op = |name: &String| {
            let op = ops.iter().copied().find(|&i| {
                program.nodes[self.plan.ops[i].0].name == *name && matches!(self.plan.ops[i].1, Op::QGemm { .. })
            });
            op.ok_or_else(|| bad(format!("`{name}` is no QGemm op of the chain")))
        };
        let qgemm_ops = c.qgemms.iter().map(qgemm_op).collect::<Result<Vec<_>, _>>()?;
        if qgemm_ops.is_empty() {
            return Err(bad("it names no QGemm".into()));
        }
        if let Some(&op) = ops.iter().find(|&&i| taken[i].is_some()) {
            return Err(bad(format!("node `{}` is in another chain", program.nodes[self.plan.ops[op].0].name)));
        }
        let f32_value = |name: &str| -> Result<usize, ExecError> {
            let v = value(name).ok_or_else(|| bad(format!("`{name}` is no value of the program")))?;
            match self.plan.locs[v] {
                Loc::Buf(_) | Loc::Weight(_) | Loc::ConstF32(_) => Ok(v),
                _ => Err(bad(format!("`{name}` is not an f32 value"))),
            }
        };
        let inputs = c.inputs.iter().map(|n| f32_value(n)).collect::<Result<Vec<_>, _>>()?;
        let outputs = c.outputs.iter().map(|n| f32_value(n)).collect::<Result<Vec<_>, _>>()?;
        if let Some((_, name)) =
            outputs.iter().zip(&c.outputs).find(|(&v, _)| !matches!(self.plan.locs[v], Loc::Buf(_)))
        {
            return Err(bad(format!("`{name}` is not computed into a buffer")));
        }
        if outputs.is_empty() {
            return Err(bad("it writes no output".into()));
        }
        self.check_closed(&ops, &outputs).map_err(bad)?;
        Ok(Chain { ops, qgemm_ops, inputs, outputs, rows: c.rows })
    }

    /// Nothing outside `ops` reads a value the program's nodes of `ops` write, but `outputs`.
    fn check_closed(&self, ops: &[usize], outputs: &[usize]) -> Result<(), String> {
        let program = &self.plan.program;
        let nodes: Vec<usize> = ops.iter().map(|&i| self.plan.ops[i].0).collect();
        let written: Vec<usize> = nodes.iter().flat_map(|&n| program.nodes[n].outputs.clone()).collect();
        for (_, node) in program.nodes.iter().enumerate().filter(|(i, _)| !nodes.contains(i)) {
            if let Some(v) = node.inputs.iter().flatten().find(|v| written.contains(v) && !outputs.contains(v)) {
                return Err(format!("`{}` reads `{}`, which the chain computes", node.name, program.values[*v].name));
            }
        }
        match written.iter().find(|v| program.outputs.contains(v) && !outputs.contains(v)) {
            Some(v) => Err(format!("`{}` is a program output", program.values[*v].name)),
            None => Ok(()),
        }
    }

    /// Whether the step runs op `i` as part of a chain's call: the chain, and whether `i` is its
    /// last op (which makes the call; the step skips the others).
    pub(super) fn chained(&self, i: usize) -> Option<(usize, bool)> {
        let id = self.chains.chain_of.get(i).copied().flatten()?;
        let chain = &self.chains.chains[id];
        let on = self.chains.step_rows > 0 && self.chains.step_rows <= chain.rows;
        on.then(|| (id, chain.ops.last() == Some(&i)))
    }

    /// A step of `rows` rows begins: it runs as calls the chains of at least as many rows.
    pub(super) fn start_chains(&mut self, rows: usize) {
        self.chains.step_rows = if self.offload.is_some() { rows } else { 0 };
    }

    /// Runs chain `id` as one offload call and writes its outputs.
    pub(super) fn run_chain(&mut self, id: usize) -> Result<(), ExecError> {
        let chain = &self.chains.chains[id];
        let (node, _) = self.plan.node_op(chain.qgemm_ops[0]);
        let weights: Vec<QGemmWeights<'_>> = chain
            .qgemm_ops
            .iter()
            .map(|&i| match &self.plan.ops[i].1 {
                Op::QGemm { packed, .. } => self.plan.qpacked[*packed].weights(),
                _ => unreachable!("resolved as a QGemm"),
            })
            .collect();
        // Decode's rows are short: copied, so the offload can be borrowed beside them.
        let inputs: Vec<Vec<f32>> = chain.inputs.iter().map(|&v| self.f32_value(v).to_vec()).collect();
        let inputs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let rows = self.shapes[chain.inputs[0]].iter().rev().skip(1).product::<usize>();
        let Some(offload) = self.offload.as_mut() else { unreachable!("chains run with an offload") };
        let fail = |source| ExecError::Offload { node: node.name.clone(), source };
        let ys = offload.run_chain(id, &inputs, rows, &weights).map_err(fail)?;
        let outputs = self.chains.chains[id].outputs.clone();
        if ys.len() != outputs.len() {
            let problem = format!("the offload returned {} outputs for {}", ys.len(), outputs.len());
            return Err(ExecError::Chain { qgemm: node.name.clone(), problem });
        }
        for (y, v) in ys.iter().zip(outputs) {
            let n = numel(&self.shapes[v]);
            let Loc::Buf(b) = self.plan.locs[v] else { unreachable!("checked at resolve") };
            if y.len() != n {
                let problem = format!(
                    "the offload returned {} values of `{}` for {n}",
                    y.len(),
                    self.plan.program.values[v].name
                );
                return Err(ExecError::Chain { qgemm: node.name.clone(), problem });
            }
            self.bufs[b][..n].copy_from_slice(y);
        }
        self.chains.calls += 1;
        Ok(())
    }
}

//! Decode's chained projections on the NPU: each chain one qgemv design call a column chunk
//! (f32 rows in — a norm's γ or a gate's up rows beside them —, f32 outputs back), and the
//! chains the plan makes one array program (decode's MLP: gate/up, then down on the row it
//! wrote) one command: the program's buffer between its phases is given to the device and
//! never read back. A program without device artifacts in the bundle runs as its chains.

use super::{run_design, DesignRun, XdnaError, XdnaOffload};
use crate::bundle::xdna::{
    DesignKind, PlanChain, PlanGemvChunk, PlanProgram, QgemvFeed, QgemvLayout, QgemvWeights, XdnaPlan,
};
use crate::bundle::Bundle;
use crate::exec::OffloadChain;
use crate::kernels::qgemm::QGemmWeights;
use std::collections::HashMap;
use xdna_driver::Driver;

/// A chain, whether of its block's chunks, and a chunk.
pub(super) type ChunkKey = (usize, bool, usize);

/// What one offload chain of the executor is.
pub(super) enum Unit {
    /// A plan chain.
    Chain(usize),
    /// A program of plan chains.
    Program(usize),
}

/// The plan's units: each program the bundle has artifacts for, and every chain in none; the
/// programs it has none for, which run as their chains; and the programs' device runs, by name
/// (layers of one shape share a program, read once).
pub(super) fn units(bundle: &Bundle, plan: &XdnaPlan) -> Result<Units, XdnaError> {
    let (mut programs, mut unbuilt, mut runs) = (vec![], vec![], HashMap::new());
    for p in &plan.programs {
        let (pdi, insts) = (p.pdi_file(), p.insts_file());
        if bundle.file_path(&pdi).is_none() || bundle.file_path(&insts).is_none() {
            unbuilt.push(p.name.clone());
            continue;
        }
        if !runs.contains_key(&p.name) {
            let read = |path: String| {
                bundle.read_file(&path).map_err(|_| XdnaError::MissingArtifact { design: p.name.clone(), path })
            };
            let (pdi, insts) = (read(pdi)?, read(insts)?);
            let cols = p.array_columns as u32;
            let run = DesignRun { kind: DesignKind::Qgemv, padded: (0, 0, 0), cols, pdi, insts, layout: None };
            runs.insert(p.name.clone(), run);
        }
        programs.push(p.clone());
    }
    let in_program = |c: usize| programs.iter().any(|p: &PlanProgram| p.chains.contains(&c));
    let mut units: Vec<Unit> = (0..programs.len()).map(Unit::Program).collect();
    units.extend((0..plan.chains.len()).filter(|&c| !in_program(c)).map(Unit::Chain));
    Ok(Units { units, programs, unbuilt, runs })
}

/// What [`units`] finds.
pub(super) struct Units {
    pub(super) units: Vec<Unit>,
    pub(super) programs: Vec<PlanProgram>,
    pub(super) unbuilt: Vec<String>,
    pub(super) runs: HashMap<String, DesignRun>,
}

/// A chain's rows operand for `layout`: the rows `inputs[0]` (`rows × k`), and second a norm's
/// γ or a gate's up rows, or a sum's second addend and then γ; `None` when they do not fit the
/// design.
fn rows_operand(layout: &QgemvLayout, inputs: &[&[f32]], (rows, k): (usize, usize)) -> Option<Vec<f32>> {
    let x = inputs.first()?.get(..rows * k)?;
    let second = inputs.get(1).copied();
    let (gamma, up) = match layout.feed {
        QgemvFeed::Norm => (second, None),
        QgemvFeed::Gate => (None, second.and_then(|u| u.get(..rows * k))),
        QgemvFeed::Rows => (None, None),
        QgemvFeed::SumNorm => (inputs.get(2).copied(), second.and_then(|o| o.get(..rows * k))),
    };
    layout.rows_operand((x, k), gamma, up)
}

/// A program's rows operands from its inputs, for its chains' layouts and K: the gate/up
/// design's (an MLP's), or the output projection's and then the gate/up design's with the
/// residual stream's row and γ, its third plane zero for the projection to write and as long
/// as the projection's writes reach (a layer's). `None` when the rows do not fit.
fn program_rows(layouts: &[QgemvLayout], ks: &[usize], inputs: &[&[f32]], rows: usize) -> Option<Vec<Vec<f32>>> {
    match (layouts, ks) {
        ([o, up, _], [o_k, k, _]) => {
            let projection = rows_operand(o, &inputs[..1], (rows, *o_k))?;
            let x = inputs.get(1)?.get(..rows * k)?;
            let mut residual = up.rows_operand((x, *k), inputs.get(2).copied(), Some(&vec![0f32; rows * k]))?;
            residual.resize(residual.len().max(up.addend_at() + o.rows * o.padded_n), 0.0);
            Some(vec![projection, residual])
        }
        ([up, _], [k, _]) => Some(vec![rows_operand(up, inputs, (rows, *k))?]),
        _ => None,
    }
}

/// The bytes of a qgemv design's outputs: `[rows, padded N]` f32, and a sum-fed design's sum,
/// `[rows, padded K]`.
fn out_bytes(layout: &QgemvLayout) -> Vec<usize> {
    let mut sizes = vec![4 * layout.rows * layout.padded_n];
    if layout.feed == QgemvFeed::SumNorm {
        sizes.push(4 * layout.rows * layout.padded_k);
    }
    sizes
}

/// The first `cols` values of each of `rows` rows of a `[.., width]` buffer.
fn rows_of(values: &[f32], width: usize, (rows, cols): (usize, usize)) -> Vec<f32> {
    (0..rows).flat_map(|r| values[r * width..][..cols].to_vec()).collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

impl<D: Driver + Send> XdnaOffload<D> {
    /// The executor's chain of a unit: a chain reads its rows (a gate's rows and up's, a sum's
    /// two addends), then a norm's γ; a program its first chain's inputs (a layer's: the output
    /// projection's rows, then the gate/up chain's but the row the projection writes), and
    /// computes the nodes between its phases too.
    pub(super) fn offload_chain(&self, unit: &Unit) -> OffloadChain {
        let of = |c: usize| {
            let c = &self.chains[c];
            OffloadChain {
                nodes: c.nodes.clone(),
                qgemms: vec![c.qgemm.clone()],
                inputs: c.inputs.iter().chain(&c.gamma).cloned().collect(),
                outputs: [c.output.clone()].into_iter().chain(c.sum.clone()).collect(),
                rows: self.chain_rows(c),
            }
        };
        match *unit {
            Unit::Chain(c) => of(c),
            Unit::Program(p) => {
                let p = &self.programs[p];
                let phases: Vec<OffloadChain> = p.chains.iter().map(|&c| of(c)).collect();
                let [.., up, down] = &phases[..] else { unreachable!("checked by the plan") };
                let mut nodes: Vec<String> = phases[..phases.len() - 1].iter().flat_map(|c| c.nodes.clone()).collect();
                nodes.extend(p.between.iter().cloned().chain(down.nodes.clone()));
                let qgemms = phases.iter().flat_map(|c| c.qgemms.clone()).collect();
                // One-row designs only: a longer step runs the phases' nodes off the program.
                let rows = p.chains.iter().map(|&c| self.chains[c].rows).min().unwrap_or(1);
                let outputs = [&down.outputs[..], &up.outputs[1..]].concat();
                let inputs = match &phases[..] {
                    // The layer's: o's rows, then the gate/up's but the row o writes.
                    [o, up, _] => [&o.inputs[..], &up.inputs[..1], &up.inputs[2..]].concat(),
                    _ => up.inputs.clone(),
                };
                OffloadChain { nodes, qgemms, inputs, outputs, rows }
            }
        }
    }

    /// The most rows a chain's step takes: a block of its block's designs at a time (one-row
    /// designs alone take one row) up to the rows the plan sends to the GEMM designs.
    fn chain_rows(&self, c: &PlanChain) -> usize {
        match c.block_rows {
            0 => c.rows,
            _ => self.routing.host_threshold_rows - 1,
        }
    }

    /// Runs unit `index` on `inputs` for `rows` rows with its QGemms' weights `w`.
    pub(super) fn run_unit(
        &mut self,
        index: usize,
        inputs: &[&[f32]],
        rows: usize,
        w: &[QGemmWeights<'_>],
    ) -> Result<Vec<Vec<f32>>, XdnaError> {
        match self.units[index] {
            Unit::Chain(c) => self.chain(c, inputs, rows, w[0]),
            Unit::Program(p) => self.program(p, inputs, rows, w),
        }
    }

    /// Chain `index`'s one-row chunks, or with `block` its block's.
    fn chunks(&self, index: usize, block: bool) -> &[PlanGemvChunk] {
        let c = &self.chains[index];
        if block {
            &c.block_chunks
        } else {
            &c.chunks
        }
    }

    /// Packs the weight operand of chain `index`'s chunk `c` (of its block's with `block`) from
    /// `w` into `chain_operands`, once.
    fn pack_chain_weights(&mut self, key: ChunkKey, layout: &QgemvLayout, w: QGemmWeights<'_>) {
        let chunk = &self.chunks(key.0, key.1)[key.2];
        let (col_offset, cols) = (chunk.col_offset, chunk.cols);
        self.chain_operands.entry(key).or_insert_with(|| {
            let codes = w.codes_kn();
            let first_only = |_: usize| false;
            let q = QgemvWeights { codes: &codes, k: w.k(), n: w.n(), scales: w.scales(), first_only: &first_only };
            layout.pack(&q, (col_offset, cols)).iter().map(|&b| b as u8).collect()
        });
    }

    /// The layout of a chunk's design.
    fn chunk_layout(&self, (index, block, c): ChunkKey) -> Result<QgemvLayout, XdnaError> {
        let design = &self.chunks(index, block)[c].design;
        self.designs[design].layout.ok_or_else(|| XdnaError::NotQgemv { design: design.clone() })
    }

    /// Chain `index` on its designs, one call a column chunk: the rows operand from `inputs`,
    /// the weight operand packed from `w` once. Its outputs: the projection's, and a sum-fed
    /// chain's sum (every chunk's design writes it; the first's is taken). A step of more rows
    /// than its block's designs take runs a block of rows at a time.
    fn chain(
        &mut self,
        index: usize,
        inputs: &[&[f32]],
        rows: usize,
        w: QGemmWeights<'_>,
    ) -> Result<Vec<Vec<f32>>, XdnaError> {
        let c = &self.chains[index];
        let (k, block, feed) = (c.k, c.block_rows.max(c.rows), c.feed);
        if rows <= block {
            return self.chain_block(index, inputs, rows, w);
        }
        // A longer verify step: its rows a block at a time, the row-shaped inputs cut with them.
        let row_shaped = |i: usize| i == 0 || (i == 1 && matches!(feed, QgemvFeed::Gate | QgemvFeed::SumNorm));
        let mut outputs: Vec<Vec<f32>> = vec![];
        for r0 in (0..rows).step_by(block) {
            let r1 = (r0 + block).min(rows);
            let cut: Vec<&[f32]> = inputs
                .iter()
                .enumerate()
                .map(|(i, v)| if row_shaped(i) { v.get(r0 * k..r1 * k).unwrap_or(&[]) } else { v })
                .collect();
            let block_outputs = self.chain_block(index, &cut, r1 - r0, w)?;
            outputs.resize(block_outputs.len(), vec![]);
            for (all, part) in outputs.iter_mut().zip(block_outputs) {
                all.extend(part);
            }
        }
        Ok(outputs)
    }

    /// [`Self::chain`] for at most a block's rows: one call a column chunk of the one-row
    /// designs, or of the block's.
    fn chain_block(
        &mut self,
        index: usize,
        inputs: &[&[f32]],
        rows: usize,
        w: QGemmWeights<'_>,
    ) -> Result<Vec<Vec<f32>>, XdnaError> {
        let (k, n) = (self.chains[index].k, self.chains[index].n);
        let block = rows > self.chains[index].rows;
        let mut y = vec![0f32; rows * n];
        let mut sum = None;
        for c in 0..self.chunks(index, block).len() {
            let layout = self.chunk_layout((index, block, c))?;
            let chunk = &self.chunks(index, block)[c];
            let (design, col_offset, cols) = (chunk.design.clone(), chunk.col_offset, chunk.cols);
            let operand = rows_operand(&layout, inputs, (rows, k)).ok_or_else(|| XdnaError::ChainRows {
                design: design.clone(),
                rows,
                k,
            })?;
            let bytes: Vec<u8> = operand.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.pack_chain_weights((index, block, c), &layout, w);
            let weights = &self.chain_operands[&(index, block, c)];
            let d = &self.designs[&design];
            let outs =
                run_design(&mut self.npu, &mut self.contexts, (d, &design), &[&bytes, weights], &out_bytes(&layout))?;
            self.runs += 1;
            let out = f32s(&outs[0]);
            for r in 0..rows {
                y[r * n + col_offset..][..cols].copy_from_slice(&out[r * layout.padded_n..][..cols]);
            }
            if sum.is_none() {
                sum = outs.get(1).map(|h| rows_of(&f32s(h), layout.padded_k, (rows, k)));
            }
        }
        Ok([y].into_iter().chain(sum).collect())
    }

    /// Program `index` as one command: its first chain's rows operand and weights, the buffer
    /// between the MLP's phases (the gate/up design's output row, which the down design reads),
    /// the down chain's weights; the down chain's outputs back, and a sum-fed gate/up chain's
    /// sum. A layer's program has the output projection's rows operand and weights in front, and
    /// the gate/up rows operand holds the residual stream's row and γ, the projection's row
    /// left for the array to write.
    fn program(
        &mut self,
        index: usize,
        inputs: &[&[f32]],
        rows: usize,
        w: &[QGemmWeights<'_>],
    ) -> Result<Vec<Vec<f32>>, XdnaError> {
        let (name, chains) = (self.programs[index].name.clone(), self.programs[index].chains.clone());
        let layouts = chains.iter().map(|&c| self.chunk_layout((c, false, 0))).collect::<Result<Vec<_>, _>>()?;
        for (i, &c) in chains.iter().enumerate() {
            self.pack_chain_weights((c, false, 0), &layouts[i], w[i]);
        }
        let [.., up, down] = &layouts[..] else { unreachable!("checked by the plan") };
        let (k, n) = (self.chains[chains[chains.len() - 2]].k, self.chains[chains[chains.len() - 1]].n);
        let ks: Vec<usize> = chains.iter().map(|&c| self.chains[c].k).collect();
        let rows_operands = program_rows(&layouts, &ks, inputs, rows).ok_or_else(|| XdnaError::ChainRows {
            design: name.clone(),
            rows,
            k,
        })?;
        let bytes: Vec<Vec<u8>> =
            rows_operands.iter().map(|r| r.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
        let between = vec![0u8; 4 * up.rows * up.padded_n];
        let weights: Vec<&[u8]> = chains.iter().map(|&c| &self.chain_operands[&(c, false, 0)][..]).collect();
        let args: Vec<&[u8]> = match (&bytes[..], &weights[..]) {
            ([a, x], [w0, w1, w2]) => vec![a, w0, x, w1, &between, w2],
            ([x], [w1, w2]) => vec![x, w1, &between, w2],
            _ => unreachable!("a program of two or three chains"),
        };
        let mut sizes = vec![4 * down.rows * down.padded_n];
        sizes.extend(out_bytes(up).get(1));
        let run = &self.program_runs[&name];
        let outs = run_design(&mut self.npu, &mut self.contexts, (run, &name), &args, &sizes)?;
        self.runs += 1;
        let y = rows_of(&f32s(&outs[0]), down.padded_n, (rows, n));
        let sum = outs.get(1).map(|h| rows_of(&f32s(h), up.padded_k, (rows, k)));
        Ok([y].into_iter().chain(sum).collect())
    }
}

//! Decode's chained projections on the NPU: each chain one qgemv design call a column chunk
//! (f32 rows in — a norm's γ or a gate's up rows beside them —, f32 outputs back), and the
//! chains the plan makes one array program (decode's MLP: gate/up, then down on the row it
//! wrote) one command: the program's buffer between its phases is given to the device and
//! never read back. A program without device artifacts in the bundle runs as its chains.

use super::{run_design_outputs, DesignRun, XdnaError, XdnaOffload};
use crate::bundle::xdna::{DesignKind, PlanGemvChunk, PlanProgram, QgemvFeed, QgemvLayout, QgemvWeights, XdnaPlan};
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
    /// The executor's chain of a unit: a chain reads its rows (a gate's rows and up's), then a
    /// norm's γ; a program its first chain's inputs, and computes the nodes between its
    /// phases too.
    pub(super) fn offload_chain(&self, unit: &Unit) -> OffloadChain {
        let of = |c: usize| {
            let c = &self.chains[c];
            OffloadChain {
                nodes: c.nodes.clone(),
                qgemms: vec![c.qgemm.clone()],
                inputs: c.inputs.iter().chain(&c.gamma).cloned().collect(),
                outputs: [c.output.clone()].into_iter().chain(c.sum.clone()).collect(),
                rows: c.rows.max(c.block_rows),
            }
        };
        match *unit {
            Unit::Chain(c) => of(c),
            Unit::Program(p) => {
                let p = &self.programs[p];
                let (first, second) = (of(p.chains[0]), of(p.chains[1]));
                let nodes = [first.nodes, p.between.clone(), second.nodes].concat();
                let qgemms = [first.qgemms, second.qgemms].concat();
                let rows = first.rows.min(second.rows);
                let outputs = [&second.outputs[..], &first.outputs[1..]].concat();
                OffloadChain { nodes, qgemms, inputs: first.inputs, outputs, rows }
            }
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
    /// chain's sum (every chunk's design writes it; the first's is taken).
    fn chain(
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
            let outs = run_design_outputs(
                &mut self.npu,
                &mut self.contexts,
                (d, &design),
                &[&bytes, weights],
                &out_bytes(&layout),
            )?;
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
    /// between the phases (the first design's output row, which the second reads), the second
    /// chain's weights; the second chain's outputs back, and a sum-fed first chain's sum.
    fn program(
        &mut self,
        index: usize,
        inputs: &[&[f32]],
        rows: usize,
        w: &[QGemmWeights<'_>],
    ) -> Result<Vec<Vec<f32>>, XdnaError> {
        let [a, b] = self.programs[index].chains[..] else { unreachable!("checked by the plan") };
        let (first, second) = (self.chunk_layout((a, false, 0))?, self.chunk_layout((b, false, 0))?);
        let name = self.programs[index].name.clone();
        let k = self.chains[a].k;
        let operand = rows_operand(&first, inputs, (rows, k)).ok_or_else(|| XdnaError::ChainRows {
            design: name.clone(),
            rows,
            k,
        })?;
        let bytes: Vec<u8> = operand.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.pack_chain_weights((a, false, 0), &first, w[0]);
        self.pack_chain_weights((b, false, 0), &second, w[1]);
        let (w1, w2) = (&self.chain_operands[&(a, false, 0)], &self.chain_operands[&(b, false, 0)]);
        let between = vec![0u8; 4 * first.rows * first.padded_n];
        let mut sizes = vec![4 * second.rows * second.padded_n];
        sizes.extend(out_bytes(&first).get(1));
        let run = &self.program_runs[&name];
        let outs =
            run_design_outputs(&mut self.npu, &mut self.contexts, (run, &name), &[&bytes, w1, &between, w2], &sizes)?;
        self.runs += 1;
        let y = rows_of(&f32s(&outs[0]), second.padded_n, (rows, self.chains[b].n));
        let sum = outs.get(1).map(|h| rows_of(&f32s(h), first.padded_k, (rows, k)));
        Ok([y].into_iter().chain(sum).collect())
    }
}

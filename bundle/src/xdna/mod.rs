//! `xdna/plan.json`: an xdna bundle's host plan — which design every projection call uses, cut
//! how, and which calls stay on the host. `codegen-aie` builds an [`XdnaPlan`] and stores
//! [`XdnaPlan::encode`]; the runtime's `xrt` backend reads it back with [`XdnaPlan::decode`] and
//! routes each call with [`route_rows`] on the numbers the plan records, the same function the
//! compiler plans with, so the two cannot disagree.
//!
//! A call with fewer rows than the threshold (decode, a short verify step) runs as blocks of
//! `gemv_rows` rows on the GEMV designs, which stream every weight once per block, over the
//! projection's GEMV column chunks (wide: a GEMV design's width costs no core memory); a plan
//! without GEMV designs (`gemv_rows` 0) leaves those calls on the host. Larger calls are cut into
//! M-blocks of the GEMM designs over the projection's M-block column chunks: the prefill block
//! while more than the smallest block is left, then the smallest block the array takes (the
//! design for `decode_rows`) for the rest; a chunk of a weight's residual pass (a
//! `QGemm{first_pass_columns}`) takes the first activation pass's rows only. [`array_calls`]
//! lists the calls one projection call makes, for the runtime and the cost model alike.
//!
//! The file is pretty-printed JSON whose objects have their keys in sorted order; the first key
//! read is `format` ([`PLAN_FORMAT`]), and a plan of another format is refused before its fields.

use serde::{Deserialize, Serialize};

mod qgemv;
pub use qgemv::{meta as qgemv_meta, QgemvFeed, QgemvLayout, QgemvWeights};

/// Where a bundle keeps the plan.
pub const PLAN_FILE: &str = "xdna/plan.json";
/// The plan format this crate writes and reads.
pub const PLAN_FORMAT: &str = "npuc-xdna-plan/6";

/// The decoded `xdna/plan.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XdnaPlan {
    /// [`PLAN_FORMAT`].
    pub format: String,
    /// The XDNA device the designs are for (`npu1`, `npu2`).
    pub device: String,
    /// Calls with fewer rows run as `gemv_rows` blocks on the GEMV designs (on the host when
    /// `gemv_rows` is 0).
    pub host_threshold_rows: usize,
    /// Rows of one GEMV block (the activation rows a GEMV design keeps resident); 0: no GEMV
    /// designs.
    pub gemv_rows: usize,
    /// Rows of the smallest M-block (the decode designs).
    pub decode_rows: usize,
    /// Rows of the prefill M-block (the prefill designs), at least `decode_rows`.
    pub prefill_rows: usize,
    /// The widest column chunk one GEMM design computes.
    pub max_design_cols: usize,
    /// The widest column chunk one GEMV design computes.
    pub max_gemv_cols: usize,
    pub designs: Vec<PlanDesign>,
    pub gemms: Vec<PlanGemm>,
    /// Decode's chained projections: each a run of program nodes one qgemv design call a
    /// column chunk computes from f32 rows to f32 outputs, for steps of at most `rows` rows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chains: Vec<PlanChain>,
    /// Chains run as one array program each (decode's MLP: gate/up, then down on the row it
    /// wrote, in one command).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub programs: Vec<PlanProgram>,
    /// Whether MLIR verified the designs, and which MLIR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlir: Option<String>,
    /// Whether the bundle carries device artifacts (aiecc's outputs), and how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<String>,
}

/// One design: its texts in the bundle (the cores' code included), the command that builds its
/// device artifacts, its tiling, and the artifacts aiecc built for it (or why it could not).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanDesign {
    pub name: String,
    /// Bundle path of the generic form.
    pub file: String,
    /// Bundle path of the custom (pretty) form.
    pub pretty: String,
    /// The command, run in the bundle's folder with mlir-aie's `aiecc.py` and the Peano compiler
    /// installed, that writes the design's instruction stream, PDI and xclbin where
    /// [`PlanDesign::insts_file`] and [`PlanDesign::pdi_file`] look for them.
    pub build: String,
    /// What the design computes: a GEMM M-block, or a GEMV block over streamed weights.
    pub kind: DesignKind,
    /// Array columns the design occupies: the hardware context it needs.
    pub array_columns: usize,
    /// For a GEMM, its tiling; for a GEMV: `m` its rows, `k` the K part one core call reduces,
    /// `n` the columns of one core tile, `rows` the cores of the busiest column, `cols` the array
    /// columns, and `padded.k` × `padded.n` the shape of its B operand, the weight transposed
    /// (`[N, K]`, each output column's weights contiguous).
    pub tiling: PlanTiling,
    /// A qgemv design's operands (its `kind` is `qgemv`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qgemv: Option<QgemvLayout>,
    /// Bundle path of the instruction stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insts: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xclbin: Option<String>,
    /// Bundle path of the PDI the driver loads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdi: Option<String>,
    /// What aiecc said when it failed on the design.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aiecc_error: Option<String>,
}

/// Bundle path of a design's or program's artifact: the recorded one, else
/// `xdna/<name>.<ext>`.
fn artifact_file(recorded: &Option<String>, name: &str, ext: &str) -> String {
    recorded.clone().unwrap_or_else(|| format!("xdna/{name}.{ext}"))
}

impl PlanDesign {
    /// Bundle path of the PDI: the recorded one, else `xdna/<name>.pdi`.
    pub fn pdi_file(&self) -> String {
        artifact_file(&self.pdi, &self.name, "pdi")
    }

    /// Bundle path of the instruction stream: the recorded one, else `xdna/<name>.insts.bin`.
    pub fn insts_file(&self) -> String {
        artifact_file(&self.insts, &self.name, "insts.bin")
    }
}

/// What a design computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DesignKind {
    /// An M-block `[m, k] × [k, n]`, B the weight `[K, N]` row-major.
    Gemm,
    /// Up to `m` rows against streamed weights, B the weight transposed (`[N, K]` row-major).
    Gemv,
    /// A GEMV taking f32 rows and returning f32 outputs, its cores quantising the rows and
    /// dequantising the products; B the weight's codes with each core tile's scales after them.
    Qgemv,
}

/// A GEMM shape `[m, k] × [k, n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanShape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

/// A design's tiling and what the cost model predicts for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanTiling {
    pub device: String,
    /// The logical shape the design computes.
    pub shape: PlanShape,
    /// The host buffers' shape (each dimension rounded up to what the tiling divides).
    pub padded: PlanShape,
    /// Per-core tile.
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// Compute rows and columns the design uses.
    pub rows: usize,
    pub cols: usize,
    pub l1_bytes: usize,
    pub l2_bytes: usize,
    pub compute_cycles: u64,
    pub dma_cycles: u64,
    pub total_cycles: u64,
    pub utilisation: f64,
}

/// One projection and the column chunks it is cut into: for M-blocks and for GEMV blocks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanGemm {
    pub site: PlanSite,
    pub chunks: Vec<PlanChunk>,
    /// None without GEMV designs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gemv_chunks: Vec<PlanGemvChunk>,
}

/// The program node a projection is, and the weight it streams.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSite {
    pub node: String,
    /// `domain::op` of the node.
    pub op: String,
    pub k: usize,
    pub n: usize,
    pub weight: String,
    /// The weight is read transposed (a tied lm_head reading the `[n, k]` embedding).
    pub transposed: bool,
    /// Rows of a call per row of activations: the activation passes a `QGemm{passes}` stacks.
    pub passes: usize,
    /// The last columns, a weight's residual pass, multiply the first activation pass only
    /// (`QGemm{first_pass_columns}`; 0 for none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first_pass_columns: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// An M-block column chunk of one projection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanChunk {
    pub col_offset: usize,
    pub cols: usize,
    /// Design for the small M-block and for the prefill M-block.
    pub decode_design: String,
    pub prefill_design: String,
    /// Activation passes the chunk's blocks multiply (their rows a call's first `passes` of the
    /// site's): the site's, or 1 for a chunk of residual-pass columns.
    pub passes: usize,
}

/// A chained projection: the program's nodes from its quantisation (a norm's `InverseRms`, a
/// `QuantizeRows` or `QuantizeSwiGlu`, the row scales' product) through its `QGemm` to the sum
/// of the weight's two passes (`Slice`, `Slice`, `Add`) when the design adds them (`pairs`),
/// computed as one qgemv design call per column chunk. The runtime skips the nodes and writes
/// `output` from the calls; nothing outside the chain reads what its nodes compute.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanChain {
    /// The chain's QGemm node: its weights are the designs' weight operands.
    pub qgemm: String,
    /// What the designs' rows operand carries.
    pub feed: QgemvFeed,
    /// Every node of the chain, in program order; the last writes `output`.
    pub nodes: Vec<String>,
    /// The f32 values read: the rows (a norm's input), a gate's rows then the up's, or a sum's
    /// two addends (the residual stream, then the projection's output).
    pub inputs: Vec<String>,
    /// A norm's γ, a weight of the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gamma: Option<String>,
    pub output: String,
    /// A sum-fed chain's second output: the sum its first node (the residual `Add`) computes,
    /// which nodes outside the chain read too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum: Option<String>,
    /// Values a row read (`k`) and written (`n`: the weight's columns, half with pairs).
    pub k: usize,
    pub n: usize,
    /// Each output sums a weight column of every activation pass and one of the first only.
    pub pairs: bool,
    /// Steps of at most this many rows run the chain on the array.
    pub rows: usize,
    /// Output column chunks, each one call of its design.
    pub chunks: Vec<PlanGemvChunk>,
    /// Steps of more than `rows` rows and at most `block_rows` (short verify steps) run the
    /// chain on these chunks' designs instead; none (and 0) where no design of that many rows
    /// fits.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub block_rows: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_chunks: Vec<PlanGemvChunk>,
}

/// Several chains as one array program: a module of their designs and a main device whose
/// runtime sequence configures each in turn, a phase's output buffer the next one's input. Its
/// arguments: the first chain's rows operand and weights, the buffer between the phases, the
/// second chain's weights, the output, and a sum-fed first chain's sum last. A layer's program
/// has the attention's output projection in front: its rows operand and weights come first,
/// and it writes its row into the gate/up chain's rows operand (the third argument) after the
/// residual stream's row and γ's, which the host fills.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanProgram {
    /// The main device's name.
    pub name: String,
    /// Bundle paths of the generic and custom forms.
    pub file: String,
    pub pretty: String,
    /// Its phases' chains (indices into the plan's chains), in order, each of one chunk.
    pub chains: Vec<usize>,
    /// Nodes between the phases it computes too (the slices taking the gate/up row apart).
    pub between: Vec<String>,
    /// Array columns its hardware context needs: its widest phase's.
    pub array_columns: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insts: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdi: Option<String>,
}

impl PlanProgram {
    /// Bundle path of the PDI: the recorded one, else `xdna/<name>.pdi`.
    pub fn pdi_file(&self) -> String {
        artifact_file(&self.pdi, &self.name, "pdi")
    }

    /// Bundle path of the instruction stream: the recorded one, else `xdna/<name>.insts.bin`.
    pub fn insts_file(&self) -> String {
        artifact_file(&self.insts, &self.name, "insts.bin")
    }
}

/// A GEMV column chunk of one projection: every row of a call, every pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanGemvChunk {
    pub col_offset: usize,
    pub cols: usize,
    pub design: String,
}

/// A plan the runtime cannot use. Each names the file and where in it the problem is.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("`{file}`: plan format `{found}` is not `{expected}`, the one this runtime reads; recompile the bundle")]
    Format { file: &'static str, found: String, expected: &'static str },
    /// Not JSON, or a field missing, misspelled or of the wrong type, or a reference that does not
    /// resolve. `path` is the JSON path (`.` for the whole document).
    #[error("`{file}` is malformed at `{path}`: {message}")]
    Malformed { file: &'static str, path: String, message: String },
}

impl PlanError {
    fn malformed(path: impl Into<String>, message: impl Into<String>) -> PlanError {
        PlanError::Malformed { file: PLAN_FILE, path: path.into(), message: message.into() }
    }
}

/// A chain reads the rows its feed takes (a gate's and a sum's two, else one), and records a
/// sum exactly when its designs add one.
fn check_chain_rows(i: usize, chain: &PlanChain) -> Result<(), PlanError> {
    let inputs = if matches!(chain.feed, QgemvFeed::Gate | QgemvFeed::SumNorm) { 2 } else { 1 };
    if (chain.feed == QgemvFeed::SumNorm) == chain.sum.is_some() && chain.inputs.len() == inputs {
        return Ok(());
    }
    let message = format!(
        "a {:?} chain reads {inputs} rows and has a sum exactly when its design adds one; `{}` reads {} and {}",
        chain.feed,
        chain.qgemm,
        chain.inputs.len(),
        if chain.sum.is_some() { "has one" } else { "has none" }
    );
    Err(PlanError::malformed(format!("chains[{i}].feed"), message))
}

impl XdnaPlan {
    /// The bytes of `xdna/plan.json`: pretty JSON, keys sorted.
    pub fn encode(&self) -> Vec<u8> {
        // Through a `Value`, whose maps keep keys sorted: the bytes do not depend on field order.
        let value = serde_json::to_value(self).expect("a plan always serialises");
        serde_json::to_vec_pretty(&value).expect("a JSON value always serialises")
    }

    /// Decodes and checks the bytes of `xdna/plan.json`: the format first (another format's layout
    /// may differ), then every field, then that each chunk names a design the plan lists.
    pub fn decode(bytes: &[u8]) -> Result<XdnaPlan, PlanError> {
        let document: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| PlanError::malformed(".", e.to_string()))?;
        match document.get("format") {
            None => return Err(PlanError::malformed("format", "missing field `format`")),
            Some(serde_json::Value::String(found)) if found == PLAN_FORMAT => {}
            Some(found) => {
                let found = found.as_str().map_or_else(|| found.to_string(), str::to_string);
                return Err(PlanError::Format { file: PLAN_FILE, found, expected: PLAN_FORMAT });
            }
        }
        let plan: XdnaPlan = serde_path_to_error::deserialize(document)
            .map_err(|e| PlanError::malformed(e.path().to_string(), e.inner().to_string()))?;
        plan.check_designs()?;
        Ok(plan)
    }

    /// The design named `name`, if the plan lists it.
    pub fn design(&self, name: &str) -> Option<&PlanDesign> {
        self.designs.iter().find(|d| d.name == name)
    }

    /// How the plan cuts a call's rows.
    pub fn routing(&self) -> Routing {
        Routing {
            host_threshold_rows: self.host_threshold_rows,
            gemv_rows: self.gemv_rows,
            decode_rows: self.decode_rows,
            prefill_rows: self.prefill_rows,
        }
    }

    /// Where a call of `rows` rows runs (see [`route_rows`]).
    pub fn route(&self, rows: usize) -> Option<Vec<(usize, usize)>> {
        self.routing().route(rows)
    }

    /// The array calls of one call of `gemm` with `rows` rows (see [`array_calls`]).
    pub fn calls<'p>(&self, gemm: &'p PlanGemm, rows: usize) -> Option<Vec<ArrayCall<'p>>> {
        array_calls(self.routing(), gemm.site.passes, (&gemm.chunks, &gemm.gemv_chunks), rows)
    }

    fn check_designs(&self) -> Result<(), PlanError> {
        if self.gemv_rows > 0 && (self.gemv_rows == self.decode_rows || self.gemv_rows == self.prefill_rows) {
            return Err(PlanError::malformed(
                "gemv_rows",
                format!("{} rows is also a GEMM block's, so a block's design is ambiguous", self.gemv_rows),
            ));
        }
        for (g, gemm) in self.gemms.iter().enumerate() {
            let node = &gemm.site.node;
            let listed = |path: String, name: &str| match self.design(name) {
                Some(_) => Ok(()),
                None => Err(PlanError::malformed(
                    path,
                    format!("`{node}` calls design `{name}`, which the plan does not list"),
                )),
            };
            for (c, chunk) in gemm.chunks.iter().enumerate() {
                listed(format!("gemms[{g}].chunks[{c}].decode_design"), &chunk.decode_design)?;
                listed(format!("gemms[{g}].chunks[{c}].prefill_design"), &chunk.prefill_design)?;
                if chunk.passes == 0 || chunk.passes > gemm.site.passes {
                    let message = format!("{} passes, of the site's {}", chunk.passes, gemm.site.passes);
                    return Err(PlanError::malformed(format!("gemms[{g}].chunks[{c}].passes"), message));
                }
            }
            for (c, chunk) in gemm.gemv_chunks.iter().enumerate() {
                listed(format!("gemms[{g}].gemv_chunks[{c}].design"), &chunk.design)?;
            }
        }
        self.check_chains()
    }

    /// Every chain's chunks name qgemv designs of its feed that take its rows and columns.
    fn check_chains(&self) -> Result<(), PlanError> {
        for (i, chain) in self.chains.iter().enumerate() {
            let sets = [("chunks", &chain.chunks, chain.rows), ("block_chunks", &chain.block_chunks, chain.block_rows)];
            for (c, (field, chunk, rows)) in
                sets.iter().flat_map(|&(f, cs, r)| cs.iter().enumerate().map(move |(c, ch)| (c, (f, ch, r))))
            {
                let path = format!("chains[{i}].{field}[{c}].design");
                let layout = self.design(&chunk.design).and_then(|d| d.qgemv);
                let fits = layout.is_some_and(|l| {
                    l.feed == chain.feed
                        && l.pairs == chain.pairs
                        && l.rows >= rows
                        && rows > 0
                        && l.padded_k >= chain.k
                        && l.padded_n >= chunk.cols
                        && chunk.col_offset + chunk.cols <= chain.n
                });
                if !fits {
                    let message = format!(
                        "chain `{}` calls design `{}`, which the plan does not list as a qgemv design of its feed taking {} rows of {} values and {} columns",
                        chain.qgemm, chunk.design, rows, chain.k, chunk.cols
                    );
                    return Err(PlanError::malformed(path, message));
                }
            }
            check_chain_rows(i, chain)?;
        }
        self.check_programs()
    }

    /// Every program's phases are two one-chunk chains of the plan, a norm- or rows-fed pairs
    /// chain then a gate-fed one, or three, a rows-fed pairs chain writing the first's second
    /// addend in front; each in no other program.
    fn check_programs(&self) -> Result<(), PlanError> {
        let mut taken = vec![];
        for (i, p) in self.programs.iter().enumerate() {
            let chain = |c: usize| self.chains.get(c).filter(|c| c.chunks.len() == 1 && c.pairs);
            let mlp = |a: usize, b: usize| {
                chain(a).is_some_and(|c| c.feed != QgemvFeed::Gate)
                    && chain(b).is_some_and(|c| c.feed == QgemvFeed::Gate)
            };
            // The layer's: the attention's output projection writing the gate/up's second addend.
            let writes = |o: usize, a: usize| {
                let (o, a) = (chain(o), chain(a));
                o.is_some_and(|o| o.feed == QgemvFeed::Rows && a.is_some_and(|a| a.inputs.get(1) == Some(&o.output)))
            };
            let fits = match p.chains[..] {
                [a, b] => mlp(a, b),
                [o, a, b] => writes(o, a) && mlp(a, b),
                _ => false,
            };
            if !fits || p.chains.iter().any(|c| taken.contains(c)) {
                let message = format!(
                    "program `{}` is not a gate/up chain then a down chain of one chunk each (after the output projection whose row the gate/up chain adds), each in no other program",
                    p.name
                );
                return Err(PlanError::malformed(format!("programs[{i}].chains"), message));
            }
            taken.extend(&p.chains);
        }
        Ok(())
    }
}

/// The numbers a plan cuts a call's rows by (see [`route_rows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routing {
    pub host_threshold_rows: usize,
    pub gemv_rows: usize,
    pub decode_rows: usize,
    pub prefill_rows: usize,
}

impl Routing {
    /// Where a call of `rows` rows runs (see [`route_rows`]).
    pub fn route(&self, rows: usize) -> Option<Vec<(usize, usize)>> {
        route_rows(self.host_threshold_rows, self.gemv_rows, self.decode_rows, self.prefill_rows, rows)
    }
}

/// One array call of a projection call: a block of rows of one column chunk on one design.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayCall<'p> {
    pub design: &'p str,
    pub col_offset: usize,
    pub cols: usize,
    /// The call's rows this block takes: `first..first + used`, zero-padded to `block_rows`.
    pub first: usize,
    pub used: usize,
    pub block_rows: usize,
}

/// The array calls one call of `rows` rows (its activation passes stacked, `site_passes` of them)
/// makes, or `None` when it stays on the host: below the threshold, blocks of `gemv_rows` of
/// every row over each GEMV chunk (none without GEMV chunks); from there on, each M-block chunk's
/// rows — the first `chunk.passes` passes' — cut into M-blocks.
pub fn array_calls<'p>(
    routing: Routing,
    site_passes: usize,
    (chunks, gemv_chunks): (&'p [PlanChunk], &'p [PlanGemvChunk]),
    rows: usize,
) -> Option<Vec<ArrayCall<'p>>> {
    let mut calls = vec![];
    // Each of one chunk's `blocks`, on the design `design` names for its block rows.
    let mut push =
        |(col_offset, cols): (usize, usize), blocks: &[(usize, usize)], design: &dyn Fn(usize) -> &'p str| {
            let mut first = 0;
            for &(block_rows, used) in blocks {
                calls.push(ArrayCall { design: design(block_rows), col_offset, cols, first, used, block_rows });
                first += used;
            }
        };
    if rows < routing.host_threshold_rows {
        let blocks = routing.route(rows).filter(|_| !gemv_chunks.is_empty())?;
        for c in gemv_chunks {
            push((c.col_offset, c.cols), &blocks, &|_| &c.design);
        }
        return Some(calls);
    }
    let (small, large) = (routing.decode_rows, routing.prefill_rows.max(routing.decode_rows));
    if small == 0 {
        return None;
    }
    for c in chunks {
        let blocks = cut(rows / site_passes.max(1) * c.passes, small, large);
        push((c.col_offset, c.cols), &blocks, &|b| if b == small { &c.decode_design } else { &c.prefill_design });
    }
    Some(calls)
}

/// Where a call of `rows` rows runs, from the numbers the plan records: `None` on the host, else
/// the blocks `(design rows, rows used)` it is cut into. Below `host_threshold_rows`, blocks of
/// `gemv_rows` (none when it is 0: the host); from there on, M-blocks of the GEMM designs.
pub fn route_rows(
    host_threshold_rows: usize,
    gemv_rows: usize,
    decode_rows: usize,
    prefill_rows: usize,
    rows: usize,
) -> Option<Vec<(usize, usize)>> {
    if rows < host_threshold_rows {
        return (gemv_rows > 0 && rows > 0).then(|| cut(rows, gemv_rows, gemv_rows));
    }
    if decode_rows == 0 {
        return None;
    }
    Some(cut(rows, decode_rows, prefill_rows.max(decode_rows)))
}

/// `rows` cut into blocks of `large` while more than `small` is left, then blocks of `small`.
fn cut(rows: usize, small: usize, large: usize) -> Vec<(usize, usize)> {
    let mut blocks = vec![];
    let mut left = rows;
    while left > 0 {
        let block = if left <= small { small } else { large };
        let used = left.min(block);
        blocks.push((block, used));
        left -= used;
    }
    blocks
}

//! The row quantisation split across prologue cores ([`crate::qgemv::split`]): each core runs
//! the unsplit core's functions (`QuantizeRows(x)`'s, a norm's, a gate's) on its slice of the
//! row's K values, and what the slices must agree on crosses between the cores in one byte slot
//! a core a round: the core's row state `rs` (`[4, rows]` f32, `[6, rows]` with a norm, as
//! little-endian words), with a norm its squares' lanes (`[rows, 32]` i32), then its codes of
//! every pass. A mem tile joins the cores' slots and broadcasts them back, so every core sees
//! every slot.
//!
//! A row's maximum `|x|` is the unsigned maximum of its values' bits ([`super::absmax`]); so are
//! a norm's or a gate's scale markers, the residual's, and a norm's largest magnitude: the
//! maximum of the cores' partial maxima is the whole row's, the same bits whatever the split.
//! A norm's squares' lanes are int32 sums, element `j` in lane `j mod 32` (a slice is whole
//! 32-value blocks), so the lane-wise sum of the cores' lanes is the one core's, wrapping or
//! not. Every core then computes the same scales (and `r`) from them. The GEMV cores take the
//! last round's slots apart into the codes buffers their kernel reads and the row state their
//! epilogue reads.

use super::{lanes, lanes_n, Code, Input, Shape, LANES, NORM_LANES};
use crate::kernels::{idx, memref, v, Function, Stmt};

/// `q_share(%rs, [%ss,] %slot)`: the row state (and a norm's lanes) into the core's slot.
pub const SHARE: &str = "q_share";
/// `q_combine<r>(%slots, %rs[, %ss])`: round `r`'s maxima (and a norm's lanes' sum) of every
/// core's partial ones.
pub const COMBINE: [&str; 2] = ["q_combine0", "q_combine1"];
/// `q_pack(%rs, %c0, [%c1,] %slot)`: the row state and the slice's codes into the core's slot.
pub const PACK: &str = "q_pack";
/// `q_unpack(%slots, %rs, %codes_<p>_<q>...)`: a GEMV core's row state and codes from the slots.
pub const UNPACK: &str = "q_unpack";

/// The alignment of a slot's lanes and of every slot: a 256-bit vector's bytes.
const ALIGN: usize = 32;

/// The exchange of `cores` prologue cores, each quantising `slice` of a row's K values over
/// `rows` rows in `passes`, of rows that are `input`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exchange {
    pub cores: usize,
    pub slice: usize,
    pub rows: usize,
    pub passes: usize,
    pub input: Input,
}

impl Exchange {
    /// The exchange of `cores` prologue cores splitting a row of `k_total` values of a core
    /// shape `sh` (its rows, passes and input).
    pub fn of(sh: Shape, (k_total, cores): (usize, usize)) -> Exchange {
        Exchange { cores, slice: k_total / cores, rows: sh.rows, passes: sh.passes, input: sh.input }
    }

    /// Words of a row's state: the passes' maxima and scales, and a norm's largest magnitude
    /// and `r`.
    pub fn state_words(&self) -> usize {
        if self.input.norm() {
            6
        } else {
            4
        }
    }

    /// Where a norm's squares' lanes start in a slot: after the row state, on a 32-byte
    /// boundary, as a group of lanes is one aligned 256-bit read (aievec lowers no unaligned
    /// one of bytes).
    fn lanes_at(&self) -> usize {
        (4 * self.state_words() * self.rows).next_multiple_of(ALIGN)
    }

    /// Where pass `p`'s codes start in a slot: after the state and a norm's lanes.
    fn codes_at(&self, p: usize) -> usize {
        let lanes = if self.input.norm() { 4 * NORM_LANES * self.rows } else { 0 };
        self.lanes_at() + lanes + p * self.rows * self.slice
    }

    /// Bytes of one core's slot: the row state, a norm's lanes, each pass's `[rows, slice]`
    /// codes, to a 32-byte boundary, so every slot's lanes are aligned as the first's.
    pub fn slot(&self) -> usize {
        self.codes_at(self.passes).next_multiple_of(ALIGN)
    }

    /// Rounds of the exchange: one a pass's maximum (a norm's second with its lanes, whatever
    /// the passes), then the codes.
    pub fn rounds(&self) -> usize {
        if self.input.norm() {
            3
        } else {
            self.passes + 1
        }
    }

    /// A prologue core's shape: its slice as one K part, codes of exactly its rows.
    pub fn shape(&self) -> Shape {
        let (rows, k, passes, input) = (self.rows, self.slice, self.passes, self.input);
        Shape { rows, k, n: LANES, passes, kernel_rows: rows, input, pairs: false, stacked: false }
    }

    pub fn slot_ty(&self) -> String {
        memref(&[1, self.slot()], "i8")
    }

    pub fn slots_ty(&self) -> String {
        memref(&[self.cores, self.slot()], "i8")
    }

    pub fn rs_ty(&self) -> String {
        self.shape().rs_ty()
    }
}

impl Code {
    /// `rs[slot][%i]` as four bytes of row `row` (an index value) of `mem` from byte `at`.
    fn store_word(&mut self, (rs_ty, slot): (&str, usize), (mem, mem_ty, row): (&str, &str, &str), at: &str) {
        let value = self.load("rs", rs_ty, &[&idx(slot), "%i"], "f32");
        let bits = self.cast("bitcast", &value, "f32", "i32");
        self.store_bits(&bits, (mem, mem_ty, row), at);
    }

    /// The i32 `bits` as four little-endian bytes of row `row` of `mem` from byte `at`.
    fn store_bits(&mut self, bits: &str, (mem, mem_ty, row): (&str, &str, &str), at: &str) {
        for b in 0..4 {
            let byte = self.with("shrui", bits, 8 * b, "i32");
            let byte = self.cast("trunci", &byte, "i32", "i8");
            let col = self.bin("addi", at, &idx(b as usize), "index");
            self.store(&byte, mem, mem_ty, &[row, &col], "i8");
        }
    }

    /// The little-endian word at bytes `at..at+4` of row `row` of `mem`, as i32.
    fn load_word(&mut self, (mem, mem_ty, row): (&str, &str, &str), at: &str) -> String {
        let mut word = self.iconst(0, "i32");
        for b in 0..4 {
            let col = self.bin("addi", at, &idx(b), "index");
            let byte = self.load(mem, mem_ty, &[row, &col], "i8");
            let byte = self.cast("extui", &byte, "i8", "i32");
            let byte = self.with("shli", &byte, 8 * b as i64, "i32");
            word = self.bin("ori", &word, &byte, "i32");
        }
        word
    }

    /// Byte offset of row `%i`'s state word `slot` in a slot.
    fn state_at(&mut self, ex: Exchange, slot: usize) -> String {
        let at = self.bin("muli", "%i", &idx(4), "index");
        self.bin("addi", &at, &idx(4 * slot * ex.rows), "index")
    }

    /// Every row's state (and with `lanes` a norm's squares' lanes) into row 0 of `slot`.
    fn write_state(&mut self, ex: Exchange, lanes: bool) {
        let (rs_ty, slot_ty) = (ex.rs_ty(), ex.slot_ty());
        self.each("i", ex.rows, |c| {
            for s in 0..ex.state_words() {
                let at = c.state_at(ex, s);
                c.store_word((&rs_ty, s), ("slot", &slot_ty, &idx(0)), &at);
            }
            if lanes {
                c.write_lanes(ex);
            }
        });
    }

    /// Byte offset of row `%i`'s lane group `g` in a slot.
    fn group_at(&mut self, ex: Exchange, g: usize) -> String {
        let at = self.bin("muli", "%i", &idx(4 * NORM_LANES), "index");
        self.bin("addi", &at, &idx(ex.lanes_at() + 4 * g * LANES), "index")
    }

    /// Row `%i`'s squares' lanes into row 0 of `slot`, a word at a time.
    fn write_lanes(&mut self, ex: Exchange) {
        let (ss_ty, slot_ty) = (super::squares_ty(ex.shape()), ex.slot_ty());
        self.each("m", NORM_LANES, |c| {
            let bits = c.load("ss", &ss_ty, &["%i", "%m"], "i32");
            let at = c.group_at(ex, 0);
            let lane = c.bin("muli", "%m", &idx(4), "index");
            let at = c.bin("addi", &at, &lane, "index");
            c.store_bits(&bits, ("slot", &slot_ty, &idx(0)), &at);
        });
    }

    /// Row `%i`'s squares' lanes the sum of every core's.
    fn sum_lanes(&mut self, ex: Exchange) {
        let (ss_ty, slots_ty) = (super::squares_ty(ex.shape()), ex.slots_ty());
        let (wide, bytes) = (lanes("i32"), lanes_n("i8", 4 * LANES));
        for g in 0..NORM_LANES / LANES {
            let at = self.group_at(ex, g);
            let zero = self.iconst(0, &wide);
            let sum = self.fold_by("j", (ex.cores, 1), (&zero, &wide), |c, acc| {
                let pad = c.iconst(0, "i8");
                let b = c.read_block(("slots", &slots_ty), "i8", ["%j", &at], (&pad, 4 * LANES));
                let words = c.vector("bitcast", None, &b, (&bytes, &wide));
                c.bin("addi", acc, &words, &wide)
            });
            let idx = vec!["%i".to_string(), idx(g * LANES)];
            self.push(Stmt::Write { val: sum, mem: v("ss"), mem_ty: ss_ty.clone(), idx, vty: wide.clone() });
        }
    }

    /// `[rows, slice]` codes `src` into row 0 of `slot` from byte `at`, [`LANES`] at a time.
    fn copy_codes(&mut self, ex: Exchange, src: &str, at: usize) {
        let (c_ty, slot_ty) = (ex.shape().codes_ty(), ex.slot_ty());
        self.each("i", ex.rows, |c| {
            c.each_by("l", (ex.slice, LANES), |c| {
                let pad = c.iconst(0, "i8");
                let block = c.read_block((src, &c_ty), "i8", ["%i", "%l"], (&pad, LANES));
                let row = c.bin("muli", "%i", &idx(ex.slice), "index");
                let col = c.bin("addi", &row, "%l", "index");
                let col = c.bin("addi", &col, &idx(at), "index");
                let idx = vec![idx(0), col];
                let vty = super::lanes("i8");
                c.push(Stmt::Write { val: block, mem: v("slot"), mem_ty: slot_ty.clone(), idx, vty });
            });
        });
    }
}

/// Index values a function of `ex` names.
fn index_values(ex: Exchange, more: &[usize]) -> Vec<usize> {
    let mut values = vec![0, 1, 2, 3, 4, 5, ex.rows, ex.slice, ex.cores, LANES, NORM_LANES, 4 * NORM_LANES];
    values.extend((0..ex.state_words()).map(|s| 4 * s * ex.rows));
    values.extend((0..NORM_LANES / LANES).flat_map(|g| [g * LANES, ex.lanes_at() + 4 * g * LANES]));
    values.extend(more);
    values
}

/// `q_share(%rs, [%ss,] %slot)`.
pub fn share(ex: Exchange) -> Function {
    let norm = ex.input.norm();
    let mut c = Code::new(&index_values(ex, &[]));
    c.write_state(ex, norm);
    let mut params = vec![(v("rs"), ex.rs_ty())];
    if norm {
        params.push((v("ss"), super::squares_ty(ex.shape())));
    }
    params.push((v("slot"), ex.slot_ty()));
    c.finish(SHARE, params)
}

/// The state words round `round` takes the maximum of: each pass's maximum in its round; a
/// norm's first maximum and largest magnitude in round 0, its residual's maximum (with two
/// passes) in round 1 beside the lanes.
pub fn maxima(ex: Exchange, round: usize) -> Vec<usize> {
    match (ex.input, round) {
        (Input::Norm | Input::SumNorm, 0) => vec![0, 4],
        (Input::Norm | Input::SumNorm, _) if ex.passes > 1 => vec![2],
        (Input::Norm | Input::SumNorm, _) => vec![],
        (_, r) => vec![2 * r],
    }
}

/// `q_combine<r>(%slots, %rs[, %ss])`: each row's state words of round `r`'s maxima ([`maxima`],
/// each a partial maximum's bits) the unsigned maximum over every core's slot, and in a norm's
/// round 1 its squares' lanes the sum of every core's.
pub fn combine(ex: Exchange, round: usize) -> Function {
    let (rs_ty, slots_ty) = (ex.rs_ty(), ex.slots_ty());
    let words = maxima(ex, round);
    let mut c = Code::new(&index_values(ex, &words));
    let zero = c.iconst(0, "i32");
    let lanes = ex.input.norm() && round == 1;
    c.each("i", ex.rows, |c| {
        for &word in &words {
            let at = c.state_at(ex, word);
            let max = c.fold_by("j", (ex.cores, 1), (&zero, "i32"), |c, acc| {
                let bits = c.load_word(("slots", &slots_ty, "%j"), &at);
                c.bin("maxui", acc, &bits, "i32")
            });
            let max = c.cast("bitcast", &max, "i32", "f32");
            c.store(&max, "rs", &rs_ty, &[&idx(word), "%i"], "f32");
        }
        if lanes {
            c.sum_lanes(ex);
        }
    });
    let mut params = vec![(v("slots"), slots_ty), (v("rs"), rs_ty)];
    if lanes {
        params.push((v("ss"), super::squares_ty(ex.shape())));
    }
    c.finish(COMBINE[round], params)
}

/// `q_pack(%rs, %c0, [%c1,] %slot)`: the row state, then each pass's codes.
pub fn pack(ex: Exchange) -> Function {
    let at: Vec<usize> = (0..ex.passes).map(|p| ex.codes_at(p)).collect();
    let mut c = Code::new(&index_values(ex, &at));
    c.write_state(ex, false);
    for (p, &at) in at.iter().enumerate() {
        c.copy_codes(ex, &format!("c{p}"), at);
    }
    let mut params = vec![(v("rs"), ex.rs_ty())];
    params.extend((0..ex.passes).map(|p| (v(&format!("c{p}")), ex.shape().codes_ty())));
    params.push((v("slot"), ex.slot_ty()));
    c.finish(PACK, params)
}

/// `q_unpack(%slots, %rs, %codes_<p>_<q>...)`: the row state from the first core's slot, and
/// for each pass `p` and K part `q` of `k` values the GEMV core's `[kernel_rows, k]` codes
/// (`sh`'s) from the slots that hold them — global value `q·k + l` is core `(q·k + l) / slice`'s
/// value `(q·k + l) % slice`; `k` and `slice` are multiples of [`LANES`], so no block straddles
/// two slots. Rows past `rows` are left alone, as the GEMV kernel's products of them are never
/// read.
pub fn unpack(ex: Exchange, sh: Shape, parts: usize) -> Function {
    let (rs_ty, slots_ty, c_ty) = (ex.rs_ty(), ex.slots_ty(), sh.codes_ty());
    let starts: Vec<usize> =
        (0..parts).map(|q| q * sh.k).chain((0..ex.passes).flat_map(|p| [ex.codes_at(p), p * ex.rows])).collect();
    let mut c = Code::new(&index_values(ex, &[&starts[..], &[sh.k]].concat()));
    c.each("i", ex.rows, |c| {
        for s in 0..ex.state_words() {
            let at = c.state_at(ex, s);
            let word = c.load_word(("slots", &slots_ty, &idx(0)), &at);
            let value = c.cast("bitcast", &word, "i32", "f32");
            c.store(&value, "rs", &rs_ty, &[&idx(s), "%i"], "f32");
        }
    });
    for p in 0..ex.passes {
        for q in 0..parts {
            // Stacked, pass `p`'s rows follow the earlier passes' in the first buffer.
            let (dst, first_row) = match sh.stacked {
                true => (format!("codes_0_{q}"), p * ex.rows),
                false => (format!("codes_{p}_{q}"), 0),
            };
            c.each("i", ex.rows, |c| {
                c.each_by("l", (sh.k, LANES), |c| {
                    let global = c.bin("addi", "%l", &idx(q * sh.k), "index");
                    let core = c.bin("divui", &global, &idx(ex.slice), "index");
                    let within = c.bin("remui", &global, &idx(ex.slice), "index");
                    let row = c.bin("muli", "%i", &idx(ex.slice), "index");
                    let col = c.bin("addi", &row, &within, "index");
                    let col = c.bin("addi", &col, &idx(ex.codes_at(p)), "index");
                    let pad = c.iconst(0, "i8");
                    let block = c.read_block(("slots", &slots_ty), "i8", [&core, &col], (&pad, LANES));
                    let row = c.bin("addi", "%i", &idx(first_row), "index");
                    let idx = vec![row, "%l".to_string()];
                    let vty = super::lanes("i8");
                    c.push(Stmt::Write { val: block, mem: v(&dst), mem_ty: c_ty.clone(), idx, vty });
                });
            });
        }
    }
    let mut params = vec![(v("slots"), slots_ty), (v("rs"), rs_ty)];
    for p in 0..sh.buffered_passes() {
        params.extend((0..parts).map(|q| (v(&format!("codes_{p}_{q}")), c_ty.clone())));
    }
    c.finish(UNPACK, params)
}

/// Every function a prologue core calls: the unsplit core's on its slice (for a norm of rows
/// of `d` values with ε `epsilon`), and the exchange's.
pub fn prologue_functions(ex: Exchange, (d, epsilon): (usize, f32)) -> Vec<Function> {
    let sh = ex.shape();
    let mut f = match ex.input {
        Input::Rows => super::quantise_functions(sh),
        Input::Norm => super::norm_quantise_functions(sh, super::NormShape { rows: sh.rows, d, epsilon }),
        Input::SumNorm => {
            let mut f = vec![super::sum(sh)];
            f.extend(super::norm_quantise_functions(sh, super::NormShape { rows: sh.rows, d, epsilon }));
            f
        }
        Input::Gate => super::gate_functions(sh),
    };
    f.extend([share(ex), combine(ex, 0)]);
    if ex.rounds() > 2 {
        f.push(combine(ex, 1));
    }
    f.push(pack(ex));
    f
}

//! The design interpreter: parses a design's generic-form text (never the compiler's structures)
//! and executes it: the runtime sequence's shim DMAs (offsets, sizes, strides), object FIFOs with
//! their producers' access patterns (`dimensionsToStream`), mem-tile links (distribute by
//! destination offsets, join by source offsets, broadcast to every consumer; as mlir-aie lowers
//! them, one descriptor per transfer, a pattern addressing only its own transfer), and every core's
//! loops, FIFO acquires/releases and calls, on FIFO elements and on the core's own buffers
//! (`aie.buffer`, which start as garbage like a produced element). A call runs the callee's body
//! from the design text (`func`: the scalar `arith`/`memref`/`scf` operations of the cores' code, see
//! [`crate::kernels`]); a call to a function the design only declares is an error, as its code
//! would come from an object file no bundle carries.
//!
//! Object FIFOs with blocking acquire/release make the design a Kahn process network, so its
//! result does not depend on the schedule: the interpreter streams the runtime sequence's input
//! DMAs in, runs every core on a thread of its own over unbounded queues (a core's acquire waits
//! for its element, so cores may exchange data in cycles, as a row's maximum reduced through a
//! mem tile and broadcast back is), fires each mem-tile link whenever all its inputs hold an
//! element, and drains the output DMAs once the cores end. It fails on anything the hardware
//! would get wrong or hang on: a core acquiring an element nobody can produce any more (every
//! running core waiting on an empty queue), elements left over, a DMA whose length is not a whole number of FIFO
//! elements, a shim BD reused before its wait, a call to no body, FIFO buffers past a compute
//! tile's memory, an access pattern past its descriptor's limits. Elements a core acquires to
//! produce start as garbage, so a missing `zero_i32` shows; host output starts as `i32::MIN`, so a
//! missed store shows. FIFO depths are checked against memory but not simulated: a deadlock that
//! only bounded buffers would cause (consumers taking broadcast elements in different orders) is
//! not caught here.

use crate::device::Device;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

mod func;
mod program;
pub use func::{Function, MemType};

/// Every `func.func` of a generic-form module, at its top or in its `aie.device`, compiled;
/// `fused`: reduction loops run as one instruction, as [`run`] runs them (else every operation is
/// dispatched on its own).
pub fn module_functions(text: &str, fused: bool) -> Result<Vec<Function>, InterpError> {
    let module = parse(text)?;
    let top = module.regions.iter().flat_map(|b| &b.ops);
    let in_device = top.clone().filter(|o| o.name == "aie.device").flat_map(|o| o.regions.iter().flat_map(|b| &b.ops));
    let compile = if fused { func::compile } else { func::compile_unfused };
    top.chain(in_device).filter(|o| o.name == "func.func").map(compile).collect()
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InterpError {
    #[error("design text line {line}: {msg}")]
    Parse { line: usize, msg: String },
    #[error("design: {0}")]
    Run(String),
}

fn run_err<T>(msg: impl Into<String>) -> Result<T, InterpError> {
    Err(InterpError::Run(msg.into()))
}

/// One operation of the generic form.
#[derive(Debug, Clone)]
pub struct Op {
    pub results: Vec<String>,
    pub name: String,
    pub operands: Vec<String>,
    pub attrs: Vec<(String, String)>,
    pub ty: String,
    pub regions: Vec<Block>,
    pub line: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Block {
    pub args: Vec<(String, String)>,
    pub ops: Vec<Op>,
}

impl Op {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
    fn need(&self, key: &str) -> Result<&str, InterpError> {
        self.attr(key)
            .ok_or_else(|| InterpError::Parse { line: self.line, msg: format!("{} has no `{key}`", self.name) })
    }
    fn int(&self, key: &str) -> Result<i64, InterpError> {
        let v = self.need(key)?;
        parse_int(v).ok_or_else(|| InterpError::Parse {
            line: self.line,
            msg: format!("{}: `{key}` = {v} is not an integer", self.name),
        })
    }
    fn ints(&self, key: &str) -> Result<Vec<usize>, InterpError> {
        let v = self.need(key)?;
        parse_i64_array(v).ok_or_else(|| InterpError::Parse {
            line: self.line,
            msg: format!("{}: `{key}` = {v} is not an i64 array", self.name),
        })
    }
    fn int_list(&self, key: &str) -> Result<Vec<usize>, InterpError> {
        let v = self.need(key)?;
        parse_i64_array_attr(v).ok_or_else(|| InterpError::Parse {
            line: self.line,
            msg: format!("{}: `{key}` = {v} is not an i64 array attribute `[0 : i64, ...]`", self.name),
        })
    }
    fn symbol(&self, key: &str) -> Result<String, InterpError> {
        let v = self.need(key)?;
        v.strip_prefix('@').map(str::to_string).ok_or_else(|| InterpError::Parse {
            line: self.line,
            msg: format!("{}: `{key}` = {v} is not a symbol", self.name),
        })
    }
}

fn parse_int(v: &str) -> Option<i64> {
    let v = v.split(':').next()?.trim();
    match v {
        "true" => Some(1),
        "false" => Some(0),
        _ => v.parse().ok(),
    }
}

fn parse_i64_array(v: &str) -> Option<Vec<usize>> {
    let inner = v.trim().strip_prefix("array<i64")?.strip_suffix('>')?;
    let inner = inner.trim_start_matches(':').trim();
    if inner.is_empty() {
        return Some(vec![]);
    }
    inner.split(',').map(|x| x.trim().parse().ok()).collect()
}

/// The integers of an `I64ArrayAttr`, `[0 : i64, 512 : i64]`; the dense `array<i64: ...>` form
/// is refused, as mlir-aie's verifier refuses it where this form is the declared type.
fn parse_i64_array_attr(v: &str) -> Option<Vec<usize>> {
    let inner = v.trim().strip_prefix('[')?.strip_suffix(']')?.trim();
    if inner.is_empty() {
        return Some(vec![]);
    }
    inner.split(',').map(|x| x.trim().strip_suffix("i64")?.trim().strip_suffix(':')?.trim().parse().ok()).collect()
}

fn parse_symbols(v: &str) -> Option<Vec<String>> {
    let inner = v.trim().strip_prefix('[')?.strip_suffix(']')?;
    inner.split(',').map(|s| s.trim().strip_prefix('@').map(str::to_string)).collect()
}

/// `(size, stride)` pairs of a `#aie<bd_dim_layout_array[...]>` attribute, outermost first.
fn parse_dims(v: &str) -> Option<Vec<(usize, usize)>> {
    let mut out = vec![];
    let mut rest = v;
    while let Some(p) = rest.find("size = ") {
        rest = &rest[p + 7..];
        let end = rest.find(',')?;
        let size = rest[..end].trim().parse().ok()?;
        let q = rest.find("stride = ")?;
        rest = &rest[q + 9..];
        let end = rest.find('>')?;
        let stride = rest[..end].trim().parse().ok()?;
        out.push((size, stride));
    }
    Some(out)
}

/// Shape and element type of the first `memref<AxBxT>` in a type.
fn parse_memref(v: &str) -> Option<(Vec<usize>, String)> {
    let p = v.find("memref<")?;
    let rest = &v[p + 7..];
    let body = &rest[..rest.find('>')?];
    let mut parts: Vec<&str> = body.split('x').collect();
    let elem = parts.pop()?.to_string();
    let dims = parts.iter().map(|d| d.parse().ok()).collect::<Option<Vec<usize>>>()?;
    Some((dims, elem))
}

/// Splits `s` at top-level commas (outside (), [], {}, <> and quotes; `->` is not a bracket).
fn split_top(s: &str) -> Vec<String> {
    let mut out = vec![];
    let mut depth = 0i32;
    let mut quoted = false;
    let mut cur = String::new();
    let mut prev = ' ';
    for ch in s.chars() {
        match ch {
            '"' => quoted = !quoted,
            '(' | '[' | '{' | '<' if !quoted => depth += 1,
            ')' | ']' | '}' if !quoted => depth -= 1,
            '>' if !quoted && prev != '-' => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                prev = ch;
                continue;
            }
            _ => {}
        }
        cur.push(ch);
        prev = ch;
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Index just past the bracket matching the one at `open`.
fn matching(s: &str, open: usize) -> Option<usize> {
    let bytes = s.as_bytes();
    let (o, c) = (
        bytes[open],
        match bytes[open] {
            b'(' => b')',
            b'{' => b'}',
            b'[' => b']',
            _ => return None,
        },
    );
    let mut depth = 0;
    let mut quoted = false;
    for (i, &b) in bytes.iter().enumerate().skip(open) {
        if b == b'"' {
            quoted = !quoted;
        } else if !quoted && b == o {
            depth += 1;
        } else if !quoted && b == c {
            depth -= 1;
            if depth == 0 {
                return Some(i + 1);
            }
        }
    }
    None
}

struct Parser<'a> {
    lines: Vec<(usize, &'a str)>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn perr<T>(&self, line: usize, msg: impl Into<String>) -> Result<T, InterpError> {
        Err(InterpError::Parse { line, msg: msg.into() })
    }

    /// Parses `{attrs} : type` (both optional) from `rest`.
    fn tail(&self, line: usize, rest: &str) -> Result<(Vec<(String, String)>, String), InterpError> {
        let rest = rest.trim();
        let (attrs, rest) = if rest.starts_with('{') {
            let Some(end) = matching(rest, 0) else { return self.perr(line, "unbalanced attribute dictionary") };
            let mut attrs = vec![];
            for part in split_top(&rest[1..end - 1]) {
                let Some((k, v)) = part.split_once('=') else {
                    return self.perr(line, format!("attribute `{part}` has no value"));
                };
                attrs.push((k.trim().to_string(), v.trim().to_string()));
            }
            (attrs, rest[end..].trim())
        } else {
            (vec![], rest)
        };
        let Some(ty) = rest.strip_prefix(':') else {
            return self.perr(line, format!("expected `: type`, found `{rest}`"));
        };
        Ok((attrs, ty.trim().to_string()))
    }

    /// Ops until a line that closes the enclosing region (`})...`), which is not consumed.
    fn block(&mut self) -> Result<Block, InterpError> {
        let mut b = Block::default();
        while let Some(&(line, text)) = self.lines.get(self.pos) {
            let t = text.trim();
            if t.starts_with("})") {
                return Ok(b);
            }
            self.pos += 1;
            if t.is_empty() {
                continue;
            }
            if let Some(header) = t.strip_prefix("^bb0(") {
                let Some(header) = header.strip_suffix("):") else { return self.perr(line, "bad block header") };
                for a in split_top(header) {
                    let Some((n, ty)) = a.split_once(':') else {
                        return self.perr(line, "block argument without type");
                    };
                    b.args.push((n.trim().to_string(), ty.trim().to_string()));
                }
                continue;
            }
            b.ops.push(self.op(line, t)?);
        }
        Ok(b)
    }

    fn op(&mut self, line: usize, t: &str) -> Result<Op, InterpError> {
        let Some(q) = t.find('"') else { return self.perr(line, format!("expected a generic operation, found `{t}`")) };
        let results: Vec<String> = match t[..q].trim().strip_suffix('=') {
            Some(r) => r.split(',').map(|s| s.trim().to_string()).collect(),
            None if t[..q].trim().is_empty() => vec![],
            None => return self.perr(line, "text before the operation name"),
        };
        let Some(qe) = t[q + 1..].find('"') else { return self.perr(line, "unterminated operation name") };
        let name = t[q + 1..q + 1 + qe].to_string();
        let rest = &t[q + qe + 2..];
        if !rest.starts_with('(') {
            return self.perr(line, format!("{name}: expected operands"));
        }
        let Some(end) = matching(rest, 0) else { return self.perr(line, format!("{name}: unbalanced operands")) };
        let operands: Vec<String> = split_top(&rest[1..end - 1]);
        let rest = rest[end..].trim();
        let mut regions = vec![];
        let tail = if rest == "({" {
            regions.push(self.block()?);
            let Some(&(_, close)) = self.lines.get(self.pos) else {
                return self.perr(line, format!("{name}: region never closed"));
            };
            self.pos += 1;
            close.trim()[2..].to_string()
        } else {
            rest.to_string()
        };
        let (attrs, ty) = self.tail(line, &tail)?;
        Ok(Op { results, name, operands, attrs, ty, regions, line })
    }
}

/// Parses a generic-form module into its top operation.
pub fn parse(text: &str) -> Result<Op, InterpError> {
    let lines: Vec<(usize, &str)> = text.lines().enumerate().map(|(i, l)| (i + 1, l)).collect();
    let mut p = Parser { lines, pos: 0 };
    let b = p.block()?;
    if p.pos != p.lines.len() {
        return p.perr(p.lines[p.pos].0, "unmatched region close");
    }
    let mut ops = b.ops;
    if ops.len() != 1 || ops[0].name != "builtin.module" {
        return p.perr(1, "expected one \"builtin.module\"");
    }
    Ok(ops.remove(0))
}

#[derive(Debug, Clone)]
struct FifoInfo {
    producer: (usize, usize),
    consumers: Vec<(usize, usize)>,
    elems: usize,
    elem_bytes: usize,
    depth: usize,
    to_stream: Vec<(usize, usize)>,
}

/// A core's own buffer (`aie.buffer`): its tile, elements and their bytes.
#[derive(Debug, Clone)]
struct BufferInfo {
    tile: (usize, usize),
    elems: usize,
    elem_bytes: usize,
}

#[derive(Debug, Clone)]
struct LinkInfo {
    ins: Vec<String>,
    outs: Vec<String>,
    src: Vec<usize>,
    dst: Vec<usize>,
}

/// Element values in flight: int8 and int32 streams, as i32.
type Elem = Vec<i32>;

struct Machine {
    device: Device,
    functions: HashMap<String, func::Function>,
    fifos: HashMap<String, FifoInfo>,
    /// Each `aie.buffer`: its SSA name's tile and element count.
    buffers: HashMap<String, BufferInfo>,
    links: Vec<LinkInfo>,
    /// What the processes share: every queue, behind one lock.
    net: Mutex<Net>,
    /// Signalled whenever an element arrives or a core ends.
    wake: Condvar,
}

/// The network's state the cores' threads share.
#[derive(Default)]
struct Net {
    /// Elements waiting at each (fifo, consumer tile).
    queues: HashMap<(String, (usize, usize)), VecDeque<Elem>>,
    /// Partial element of a DMA stream into a FIFO.
    partial: HashMap<String, Vec<i32>>,
    /// Stream left over from an element a DMA out of a FIFO consumed in part.
    pending: HashMap<String, VecDeque<i32>>,
    /// Cores still running.
    running: usize,
    /// The queue each blocked core waits on.
    waiting: HashMap<(usize, usize), (String, (usize, usize))>,
    /// A core failed: the others stop at their next wait.
    failed: bool,
}

impl Net {
    fn take(&mut self, name: &str, at: (usize, usize)) -> Option<Elem> {
        self.queues.get_mut(&(name.to_string(), at)).and_then(|q| q.pop_front())
    }

    fn has(&self, name: &str, at: (usize, usize)) -> bool {
        self.queues.get(&(name.to_string(), at)).is_some_and(|q| !q.is_empty())
    }

    /// Every running core waits on an empty queue: nothing can ever arrive.
    fn stuck(&self) -> bool {
        self.waiting.len() == self.running && self.waiting.values().all(|(n, at)| !self.has(n, *at))
    }
}

/// The start offset of every innermost run of an access pattern `dims` (size, stride; outermost
/// first) at `base`, in the order a DMA walks them.
fn run_starts(base: usize, outer: &[(usize, usize)]) -> impl Iterator<Item = usize> + '_ {
    let total: usize = outer.iter().map(|d| d.0).product();
    let mut idx = vec![0usize; outer.len()];
    (0..total).map(move |_| {
        let off = base + idx.iter().zip(outer).map(|(i, &(_, stride))| i * stride).sum::<usize>();
        for i in (0..outer.len()).rev() {
            idx[i] += 1;
            if idx[i] < outer[i].0 {
                break;
            }
            idx[i] = 0;
        }
        off
    })
}

/// Gathers `sizes`/`strides` (outermost first) from `src` at `base`.
fn gather(src: &[i32], base: usize, dims: &[(usize, usize)], out: &mut Vec<i32>) -> Result<(), InterpError> {
    let Some((&(inner, inner_stride), outer)) = dims.split_last() else {
        return Ok(());
    };
    for off in run_starts(base, outer) {
        if inner_stride == 1 {
            let Some(s) = src.get(off..off + inner) else {
                return run_err(format!("access at {off}..{} outside a buffer of {}", off + inner, src.len()));
            };
            out.extend_from_slice(s);
        } else {
            for e in 0..inner {
                let Some(&v) = src.get(off + e * inner_stride) else { return run_err("access outside a buffer") };
                out.push(v);
            }
        }
    }
    Ok(())
}

/// Scatters `data` into `dst` at `base` along `dims`.
fn scatter(dst: &mut [i32], base: usize, dims: &[(usize, usize)], data: &[i32]) -> Result<(), InterpError> {
    let Some((&(inner, inner_stride), outer)) = dims.split_last() else { return Ok(()) };
    let mut pos = 0;
    for off in run_starts(base, outer) {
        for e in 0..inner {
            let Some(d) = dst.get_mut(off + e * inner_stride) else {
                return run_err(format!("store at {} outside a buffer of {}", off + e * inner_stride, dst_len(dst)));
            };
            *d = data[pos];
            pos += 1;
        }
    }
    Ok(())
}

fn dst_len(d: &[i32]) -> usize {
    d.len()
}

impl Machine {
    fn fifo(&self, name: &str) -> Result<&FifoInfo, InterpError> {
        self.fifos.get(name).ok_or_else(|| InterpError::Run(format!("unknown object FIFO @{name}")))
    }

    fn lock(&self) -> MutexGuard<'_, Net> {
        self.net.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a producer's stream to a FIFO, cutting it into elements for every consumer, and
    /// runs the links the new elements complete.
    fn push_stream(&self, net: &mut Net, name: &str, data: &[i32]) -> Result<(), InterpError> {
        let f = self.fifo(name)?;
        let part = net.partial.entry(name.to_string()).or_default();
        part.extend_from_slice(data);
        let whole = part.len() / f.elems * f.elems;
        let done: Vec<i32> = part.drain(..whole).collect();
        for chunk in done.chunks(f.elems) {
            for &c in &f.consumers {
                net.queues.entry((name.to_string(), c)).or_default().push_back(chunk.to_vec());
            }
        }
        self.fire_links(net)
    }

    /// Takes the next element of `name` at `at`, waiting for it while another core may still
    /// produce it; when every running core waits on an empty queue the hardware would hang.
    fn pop(&self, name: &str, at: (usize, usize), who: &str) -> Result<Elem, InterpError> {
        let mut net = self.lock();
        net.waiting.insert(at, (name.to_string(), at));
        let result = loop {
            if let Some(e) = net.take(name, at) {
                break Ok(e);
            }
            if net.failed {
                break Err(InterpError::Run(STOPPED.into()));
            }
            if net.stuck() {
                net.failed = true;
                break run_err(format!(
                    "{who} acquires from @{name} but no element was produced (the hardware would hang)"
                ));
            }
            net = self.wake.wait(net).unwrap_or_else(PoisonError::into_inner);
        };
        net.waiting.remove(&at);
        self.wake.notify_all();
        result
    }

    /// Produces one element of `name` from the link buffer `buf` as mlir-aie lowers it: one
    /// descriptor per transfer `(offset, length)`, each applying the producer's access pattern
    /// (`dimensionsToStream`) to its own transfer only, their streams in order.
    fn emit_from(
        &self,
        net: &mut Net,
        name: &str,
        buf: &[i32],
        transfers: &[(usize, usize)],
    ) -> Result<(), InterpError> {
        let f = self.fifo(name)?;
        let mut out = Vec::with_capacity(f.elems);
        for &(off, len) in transfers {
            let Some(transfer) = buf.get(off..off + len) else {
                return run_err(format!(
                    "@{name}: transfer {off}..{} outside the link buffer of {}",
                    off + len,
                    buf.len()
                ));
            };
            if f.to_stream.is_empty() {
                out.extend_from_slice(transfer);
            } else {
                gather(transfer, 0, &f.to_stream, &mut out)
                    .or_else(|e| run_err(format!("@{name}: access pattern in a transfer of {len}: {e}")))?;
            }
        }
        if out.len() != f.elems {
            return run_err(format!("@{name}: access pattern yields {} of {} elements", out.len(), f.elems));
        }
        for &c in &f.consumers {
            net.queues.entry((name.to_string(), c)).or_default().push_back(out.clone());
        }
        Ok(())
    }

    /// Runs every mem-tile link as long as each of its inputs has an element waiting.
    fn fire_links(&self, net: &mut Net) -> Result<(), InterpError> {
        loop {
            let mut fired = false;
            for l in &self.links {
                let mt = self.fifo(&l.ins[0])?.consumers[0];
                while l.ins.iter().all(|name| net.has(name, mt)) {
                    self.link_step(net, l, mt)?;
                    fired = true;
                }
            }
            if !fired {
                return Ok(());
            }
        }
    }

    /// One element through a mem-tile link at `mt`: the inputs' elements fill the link buffer
    /// (a join puts input `j` at `src_offsets[j]`), and the outputs are produced from it (a
    /// distribute sends output `j` the transfer at `dst_offsets[j]`; a join's output descriptor
    /// walks each input's transfer in turn).
    fn link_step(&self, net: &mut Net, l: &LinkInfo, mt: (usize, usize)) -> Result<(), InterpError> {
        let buf_elems = if l.ins.len() > 1 { self.fifo(&l.outs[0])?.elems } else { self.fifo(&l.ins[0])?.elems };
        let join = transfers(&l.src, buf_elems, "join", &l.ins)?;
        let distribute = transfers(&l.dst, buf_elems, "distribute", &l.outs)?;
        let mut buf = vec![0i32; buf_elems];
        for (i, name) in l.ins.iter().enumerate() {
            let e = net.take(name, mt).unwrap_or_default();
            let (off, len) = join.get(i).copied().unwrap_or((0, buf_elems));
            if e.len() != len {
                return run_err(format!("join input @{name} of {} elements into a transfer of {len}", e.len()));
            }
            buf[off..off + len].copy_from_slice(&e);
        }
        if l.outs.len() > 1 {
            for (name, &t) in l.outs.iter().zip(&distribute) {
                self.emit_from(net, name, &buf, &[t])?;
            }
        } else if l.ins.len() > 1 {
            self.emit_from(net, &l.outs[0], &buf, &join)?;
        } else {
            self.emit_from(net, &l.outs[0], &buf, &[(0, buf.len())])?;
        }
        Ok(())
    }
}

/// What a core that stopped because another failed reports (the other's error is the one shown).
const STOPPED: &str = "stopped: another core failed";

/// The transfers `(offset, length)` a join's or a distribute's offsets cut a buffer of `elems`
/// into, as mlir-aie computes them: each runs to the next offset, the last to the buffer's end.
/// Offsets must rise, start inside the buffer and number one per FIFO; a single FIFO has none.
fn transfers(
    offsets: &[usize],
    elems: usize,
    what: &str,
    fifos: &[String],
) -> Result<Vec<(usize, usize)>, InterpError> {
    if fifos.len() == 1 {
        return Ok(vec![]);
    }
    if offsets.len() != fifos.len() {
        return run_err(format!("{what} of {} FIFOs with {} offsets", fifos.len(), offsets.len()));
    }
    crate::rules::transfers(offsets, elems).or_else(|e| run_err(format!("{what}: {e}")))
}

#[derive(Clone, Copy)]
enum Val {
    Index(i64),
    /// An acquired subview: (fifo id, first element's sequence number).
    Sub(usize, u64),
    /// An element buffer: (fifo id, sequence number).
    Buf(usize, u64),
    /// One of the core's own buffers, by its index in [`CoreState::locals`].
    Local(usize),
}

struct CoreState {
    tile: (usize, usize),
    fifo_names: Vec<String>,
    /// Held elements per fifo id: (sequence number, data), oldest first; produce or consume.
    held: Vec<VecDeque<(u64, Elem, bool)>>,
    next_seq: u64,
    calls: BTreeMap<String, u64>,
    /// The core's own buffers, as long as it lives.
    locals: Vec<Vec<i32>>,
}

impl Machine {
    fn fifo_id(&self, st: &mut CoreState, name: &str) -> usize {
        match st.fifo_names.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                st.fifo_names.push(name.to_string());
                st.held.push(VecDeque::new());
                st.fifo_names.len() - 1
            }
        }
    }

    fn buffer(st: &mut CoreState, v: Val) -> Result<&mut Elem, InterpError> {
        if let Val::Local(i) = v {
            return Ok(&mut st.locals[i]);
        }
        let Val::Buf(f, seq) = v else { return run_err("kernel operand is neither a FIFO element nor a buffer") };
        st.held[f]
            .iter_mut()
            .find(|(s, _, _)| *s == seq)
            .map(|(_, e, _)| e)
            .ok_or_else(|| InterpError::Run("kernel operand was released".into()))
    }

    fn exec_block(&self, st: &mut CoreState, block: &Block, env: &mut HashMap<String, Val>) -> Result<(), InterpError> {
        for op in &block.ops {
            match op.name.as_str() {
                "arith.constant" => {
                    let v = op.int("value")?;
                    env.insert(op.results[0].clone(), Val::Index(v));
                }
                "scf.for" => self.exec_for(st, op, env)?,
                "scf.yield" | "aie.end" => {}
                "aie.objectfifo.acquire" => self.exec_acquire(st, op, env)?,
                "aie.objectfifo.subview.access" => {
                    let Val::Sub(f, first) = lookup(env, op, &op.operands[0])? else {
                        return run_err("subview.access of a non-subview");
                    };
                    let index = op.int("index")? as u64;
                    env.insert(op.results[0].clone(), Val::Buf(f, first + index));
                }
                "aie.objectfifo.release" => self.exec_release(st, op)?,
                "func.call" => self.exec_call(st, op, env)?,
                other => {
                    return Err(InterpError::Parse {
                        line: op.line,
                        msg: format!("core body: unsupported operation {other}"),
                    })
                }
            }
        }
        Ok(())
    }

    /// `scf.for`: the body once per index from the lower bound below the upper, by a positive step.
    fn exec_for(&self, st: &mut CoreState, op: &Op, env: &mut HashMap<String, Val>) -> Result<(), InterpError> {
        let idx = |v: Val| match v {
            Val::Index(i) => Ok(i),
            _ => Err(InterpError::Parse { line: op.line, msg: "scf.for bound is not an index".into() }),
        };
        let (lb, ub, step) = (
            idx(lookup(env, op, &op.operands[0])?)?,
            idx(lookup(env, op, &op.operands[1])?)?,
            idx(lookup(env, op, &op.operands[2])?)?,
        );
        if step <= 0 {
            return Err(InterpError::Parse { line: op.line, msg: "scf.for step must be positive".into() });
        }
        let body = &op.regions[0];
        let mut i = lb;
        while i < ub {
            if let Some((name, _)) = body.args.first() {
                env.insert(name.clone(), Val::Index(i));
            }
            self.exec_block(st, body, env)?;
            i += step;
        }
        Ok(())
    }

    /// `aie.objectfifo.acquire`: port 1 takes elements a producer made for this core; port 0 takes
    /// fresh (garbage) elements for the core to produce.
    fn exec_acquire(&self, st: &mut CoreState, op: &Op, env: &mut HashMap<String, Val>) -> Result<(), InterpError> {
        let name = op.symbol("objFifo_name")?;
        let port = op.int("port")?;
        let size = op.int("size")? as u64;
        let f = self.fifo(&name)?.clone();
        let id = self.fifo_id(st, &name);
        let first = st.next_seq;
        for _ in 0..size {
            let data = if port == 1 {
                if !f.consumers.contains(&st.tile) {
                    return run_err(format!("core {:?} consumes @{name}, which does not feed it", st.tile));
                }
                self.pop(&name, st.tile, &format!("core ({}, {})", st.tile.0, st.tile.1))?
            } else {
                if f.producer != st.tile {
                    return run_err(format!("core {:?} produces into @{name}, which it does not own", st.tile));
                }
                // Uninitialised memory: a kernel that forgets to zero shows.
                vec![0x5a5a_5a5a; f.elems]
            };
            st.held[id].push_back((st.next_seq, data, port == 0));
            st.next_seq += 1;
        }
        env.insert(op.results[0].clone(), Val::Sub(id, first));
        Ok(())
    }

    /// `aie.objectfifo.release`: the oldest held elements go; produced ones stream on.
    fn exec_release(&self, st: &mut CoreState, op: &Op) -> Result<(), InterpError> {
        let name = op.symbol("objFifo_name")?;
        let size = op.int("size")?;
        let id = self.fifo_id(st, &name);
        for _ in 0..size {
            let Some((_, data, produced)) = st.held[id].pop_front() else {
                return run_err(format!("core {:?} releases @{name} it does not hold", st.tile));
            };
            if produced {
                let mut net = self.lock();
                self.push_stream(&mut net, &name, &data)?;
                self.wake.notify_all();
            }
        }
        Ok(())
    }

    /// `func.call` of a function the design defines, on the FIFO elements the core holds: each
    /// operand's buffer goes in, and comes back as the body left it.
    fn exec_call(&self, st: &mut CoreState, op: &Op, env: &HashMap<String, Val>) -> Result<(), InterpError> {
        let callee = op.symbol("callee")?;
        let at = format!("core ({}, {}) line {}", st.tile.0, st.tile.1, op.line);
        let Some(f) = self.functions.get(&callee) else {
            return run_err(format!("{at}: calls @{callee}, which the design does not define"));
        };
        if !f.has_body() {
            return run_err(format!(
                "{at}: calls @{callee}, which has no body in the design (its code would be an object file no bundle carries)"
            ));
        }
        if op.ty.trim() != f.function_type.trim() {
            return run_err(format!("{at}: calls @{callee} as {}, defined as {}", op.ty, f.function_type));
        }
        let args: Vec<Val> = op.operands.iter().map(|o| lookup(env, op, o)).collect::<Result<_, _>>()?;
        let mut mems = Vec::with_capacity(args.len());
        for (i, &a) in args.iter().enumerate() {
            let same = |b: &Val| match (a, *b) {
                (Val::Buf(x, s), Val::Buf(y, t)) => x == y && s == t,
                (Val::Local(x), Val::Local(y)) => x == y,
                _ => false,
            };
            if args[..i].iter().any(same) {
                return run_err(format!("{at}: passes one buffer to @{callee} twice"));
            }
            mems.push(Self::buffer(st, a)?.clone());
        }
        f.call(&mut mems).map_err(|e| InterpError::Run(format!("{at}: {e}")))?;
        for (&a, m) in args.iter().zip(mems) {
            *Self::buffer(st, a)? = m;
        }
        *st.calls.entry(callee).or_default() += 1;
        Ok(())
    }
}

/// The value an operand names in a core body.
fn lookup(env: &HashMap<String, Val>, op: &Op, name: &str) -> Result<Val, InterpError> {
    env.get(name).copied().ok_or_else(|| InterpError::Parse { line: op.line, msg: format!("{name} is not defined") })
}

/// The limits the text itself must respect: each compute tile's FIFO buffers within its data
/// memory (stack reserved), and each mem-tile access pattern within the descriptor's limits.
fn check_limits(
    device: Device,
    (fifos, buffers): (&HashMap<String, FifoInfo>, &HashMap<String, BufferInfo>),
    cores: &[(usize, usize)],
) -> Result<(), InterpError> {
    for &tile in cores {
        let bytes: usize = fifos
            .values()
            .filter(|f| f.producer == tile || f.consumers.contains(&tile))
            .map(|f| f.depth * f.elems * f.elem_bytes)
            .sum::<usize>()
            + buffers.values().filter(|b| b.tile == tile).map(|b| b.elems * b.elem_bytes).sum::<usize>()
            + device.core_stack_bytes();
        if bytes > device.core_data_bytes() {
            return run_err(format!(
                "core {tile:?} needs {bytes} bytes of data memory; it has {}",
                device.core_data_bytes()
            ));
        }
    }
    for (name, f) in fifos {
        if f.producer.1 == Device::MEM_TILE_ROW && !f.to_stream.is_empty() {
            crate::design::check_pattern(device.mem_tile_dma(), f.elem_bytes, &f.to_stream, false)
                .or_else(|e| run_err(format!("@{name} access pattern: {e}")))?;
        }
    }
    Ok(())
}

/// What a run did, besides its output.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunStats {
    pub dmas: usize,
    /// Calls of each function the cores made.
    pub calls: BTreeMap<String, u64>,
    pub cores: usize,
}

/// Executes a design's text on host buffers: `inputs` are the runtime sequence's int8 arguments
/// (A then B, flat, as int values), the last argument (int32) is returned.
pub fn run(text: &str, inputs: &[&[i8]]) -> Result<(Vec<i32>, RunStats), InterpError> {
    let args: Vec<Arg> = inputs.iter().map(|a| Arg::I8(a)).collect();
    run_args(text, &args)
}

/// A runtime-sequence input: int8 values, or f32 ones (their bits cross the array).
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    I8(&'a [i8]),
    F32(&'a [f32]),
    /// A host buffer's bytes, read as the sequence argument's element type declares (`i8` a
    /// byte each, 32-bit types little-endian words): what a driver hands the device.
    Bytes(&'a [u8]),
}

/// [`run`] with inputs of either type; the last argument comes back as its 32-bit words (an
/// f32 output's bits: `f32::from_bits(w as u32)`).
pub fn run_args(text: &str, inputs: &[Arg]) -> Result<(Vec<i32>, RunStats), InterpError> {
    let (mut host, stats) = run_buffers(text, inputs)?;
    Ok((host.pop().unwrap_or_default(), stats))
}

/// [`run_args`] returning every argument's buffer after the run, in order, as 32-bit words (an
/// i8 argument a value a word): what a design with several outputs wrote.
pub fn run_buffers(text: &str, inputs: &[Arg]) -> Result<(Vec<Vec<i32>>, RunStats), InterpError> {
    let module = parse(text)?;
    let devices = program::devices(&module);
    if let Some(main) = program::main_device(&devices) {
        return program::run(&devices, main, inputs);
    }
    let Some(device) = devices.first() else { return run_err("no aie.device") };
    let Some(seq) = program::sequence(device) else { return run_err("no aie.runtime_sequence") };
    let mut host = host_buffers(&seq.regions[0], inputs)?;
    let stats = run_device(device, &mut host)?;
    Ok((host, stats))
}

/// Runs one `aie.device` on host buffers, its runtime sequence's arguments in order (checked
/// against its argument types by the caller); its output DMAs write into them.
fn run_device(device_op: &Op, host: &mut [Vec<i32>]) -> Result<RunStats, InterpError> {
    let body = device_body(device_op)?;
    check_limits(body.device, (&body.fifos, &body.buffers), &body.cores.iter().map(|c| c.0).collect::<Vec<_>>())?;
    let seq = &body.sequence.regions[0];
    let m = Machine {
        device: body.device,
        functions: body.functions,
        fifos: body.fifos,
        buffers: body.buffers,
        links: body.links,
        net: Mutex::new(Net::default()),
        wake: Condvar::new(),
    };
    let mut stats = RunStats { cores: body.cores.len(), ..Default::default() };
    let outputs = m.run_input_dmas(seq, host, &mut stats)?;
    m.run_cores(&body.cores, &mut stats)?;
    m.run_output_dmas(&outputs, host)?;
    m.check_drained()?;
    Ok(stats)
}

/// What an `aie.device` declares: its FIFOs, links, cores and runtime sequence.
struct DeviceBody<'o> {
    device: Device,
    functions: HashMap<String, func::Function>,
    fifos: HashMap<String, FifoInfo>,
    buffers: HashMap<String, BufferInfo>,
    links: Vec<LinkInfo>,
    cores: Vec<((usize, usize), &'o Op)>,
    sequence: &'o Op,
}

/// An `aie.device`: the device it names and every declaration in it, with both kernels
/// declared and a runtime sequence.
fn device_body(device_op: &Op) -> Result<DeviceBody<'_>, InterpError> {
    let device = match device_op.int("device")? {
        4 => Device::Npu1,
        8 => Device::Npu2,
        d => return run_err(format!("unsupported device enum {d}")),
    };
    let mut tiles: HashMap<String, (usize, usize)> = HashMap::new();
    let (mut fifos, mut links, mut cores) = (HashMap::new(), vec![], vec![]);
    let mut buffers = HashMap::new();
    let mut sequence = None;
    let mut functions = HashMap::new();
    for op in &device_op.regions[0].ops {
        match op.name.as_str() {
            "aie.tile" => {
                tiles.insert(op.results[0].clone(), (op.int("col")? as usize, op.int("row")? as usize));
            }
            "func.func" => {
                let f = func::compile(op)?;
                functions.insert(f.name.clone(), f);
            }
            "aie.objectfifo" => {
                let (name, fifo) = declared_fifo(op, &tiles)?;
                fifos.insert(name, fifo);
            }
            "aie.objectfifo.link" => links.push(declared_link(op)?),
            "aie.buffer" => {
                let (name, b) = declared_buffer(op, &tiles)?;
                buffers.insert(name, b);
            }
            "aie.core" => {
                let tile = tiles
                    .get(&op.operands[0])
                    .copied()
                    .ok_or_else(|| InterpError::Parse { line: op.line, msg: "core on an unknown tile".into() })?;
                cores.push((tile, op));
            }
            "aie.runtime_sequence" => sequence = Some(op),
            "aie.end" => {}
            other => {
                return Err(InterpError::Parse {
                    line: op.line,
                    msg: format!("unsupported operation {other} in aie.device"),
                })
            }
        }
    }
    let Some(sequence) = sequence else { return run_err("no aie.runtime_sequence") };
    Ok(DeviceBody { device, functions, fifos, buffers, links, cores, sequence })
}

/// An object FIFO's name, tiles, element and producer access pattern.
fn declared_fifo(op: &Op, tiles: &HashMap<String, (usize, usize)>) -> Result<(String, FifoInfo), InterpError> {
    let t: Vec<(usize, usize)> = op
        .operands
        .iter()
        .map(|o| {
            tiles.get(o).copied().ok_or_else(|| InterpError::Parse { line: op.line, msg: format!("{o} is not a tile") })
        })
        .collect::<Result<_, _>>()?;
    let (shape, elem) = parse_memref(op.need("elemType")?)
        .ok_or_else(|| InterpError::Parse { line: op.line, msg: "elemType".into() })?;
    let elem_bytes =
        elem_bytes(&elem).ok_or_else(|| InterpError::Parse { line: op.line, msg: format!("element type {elem}") })?;
    let dims = parse_dims(op.attr("dimensionsToStream").unwrap_or("")).unwrap_or_default();
    let name = op.need("sym_name")?.trim_matches('"').to_string();
    let fifo = FifoInfo {
        producer: t[0],
        consumers: t[1..].to_vec(),
        elems: shape.iter().product(),
        elem_bytes,
        depth: op.int("elemNumber")? as usize,
        to_stream: dims,
    };
    Ok((name, fifo))
}

/// Bytes of an element type the array moves: `i8`, `i32` or `f32`.
fn elem_bytes(elem: &str) -> Option<usize> {
    match elem {
        "i8" => Some(1),
        "i32" | "f32" => Some(4),
        _ => None,
    }
}

/// An `aie.buffer`'s SSA name, tile and memref.
fn declared_buffer(op: &Op, tiles: &HashMap<String, (usize, usize)>) -> Result<(String, BufferInfo), InterpError> {
    let perr = |msg: String| InterpError::Parse { line: op.line, msg };
    let tile = op.operands.first().and_then(|t| tiles.get(t)).copied();
    let Some(tile) = tile.filter(|t| t.1 >= Device::FIRST_COMPUTE_ROW) else {
        return Err(perr("aie.buffer on no compute tile".into()));
    };
    let ty = result_type(op);
    let (shape, elem) = parse_memref(ty).ok_or_else(|| perr(format!("aie.buffer of type {ty}")))?;
    let elem_bytes = elem_bytes(&elem).ok_or_else(|| perr(format!("aie.buffer of {elem}")))?;
    let name = op.results.first().cloned().ok_or_else(|| perr("aie.buffer without a result".into()))?;
    Ok((name, BufferInfo { tile, elems: shape.iter().product(), elem_bytes }))
}

/// The result type after `->` of a generic operation's type.
fn result_type(op: &Op) -> &str {
    op.ty.rsplit_once("->").map(|(_, t)| t.trim()).unwrap_or("")
}

fn declared_link(op: &Op) -> Result<LinkInfo, InterpError> {
    let syms = |k: &str| {
        parse_symbols(op.need(k)?).ok_or_else(|| InterpError::Parse { line: op.line, msg: format!("link `{k}`") })
    };
    Ok(LinkInfo {
        ins: syms("fifoIns")?,
        outs: syms("fifoOuts")?,
        src: op.int_list("src_offsets")?,
        dst: op.int_list("dst_offsets")?,
    })
}

/// The runtime sequence's arguments as host buffers: the given inputs (int8 values, or f32 bits),
/// then outputs filled with `i32::MIN` so a missed store shows.
fn host_buffers(seq: &Block, inputs: &[Arg]) -> Result<Vec<Vec<i32>>, InterpError> {
    let mut host: Vec<Vec<i32>> = vec![];
    for (i, (_, ty)) in seq.args.iter().enumerate() {
        let (shape, elem) = parse_memref(ty).ok_or_else(|| InterpError::Run(format!("sequence argument {i}: {ty}")))?;
        let len: usize = shape.iter().product();
        if let Some(&input) = inputs.get(i) {
            let (given, values): (&str, Vec<i32>) = match input {
                Arg::I8(v) => ("i8", v.iter().map(|&x| x as i32).collect()),
                Arg::F32(v) => ("f32", v.iter().map(|x| x.to_bits() as i32).collect()),
                Arg::Bytes(v) if elem == "i8" => ("i8", v.iter().map(|&x| x as i8 as i32).collect()),
                Arg::Bytes(v) if v.len() % 4 == 0 => {
                    (elem.as_str(), v.chunks_exact(4).map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect())
                }
                Arg::Bytes(v) => return run_err(format!("sequence argument {i} is {ty}; given {} bytes", v.len())),
            };
            if elem != given || values.len() != len {
                return run_err(format!("sequence argument {i} is {ty}; given {} {given} values", values.len()));
            }
            host.push(values);
        } else {
            host.push(vec![i32::MIN; len]);
        }
    }
    Ok(host)
}

/// A runtime-sequence DMA between a host buffer and a FIFO.
struct Dma {
    arg: usize,
    fifo: String,
    base: usize,
    dims: Vec<(usize, usize)>,
}

/// Shim buffer descriptors in flight: (shim tile, BD id, FIFO).
type InFlight = Vec<((usize, usize), i64, String)>;

impl Machine {
    /// The runtime sequence in order: input DMAs stream their host data into the FIFOs, waits free
    /// shim BDs; returns the output DMAs, to run once the array has produced their data.
    fn run_input_dmas(&self, seq: &Block, host: &[Vec<i32>], stats: &mut RunStats) -> Result<Vec<Dma>, InterpError> {
        let arg_index: HashMap<String, usize> = seq.args.iter().enumerate().map(|(i, (n, _))| (n.clone(), i)).collect();
        let mut outputs = vec![];
        let mut in_flight: InFlight = vec![];
        for op in &seq.ops {
            match op.name.as_str() {
                "aiex.npu.dma_memcpy_nd" => {
                    let (dma, into_array) = self.sequence_dma(op, seq, &arg_index, &mut in_flight)?;
                    stats.dmas += 1;
                    if into_array {
                        let mut data = vec![];
                        gather(&host[dma.arg], dma.base, &dma.dims, &mut data)?;
                        self.push_stream(&mut self.lock(), &dma.fifo, &data)?;
                    } else {
                        outputs.push(dma);
                    }
                }
                "aiex.npu.dma_wait" => {
                    let fifo = op.symbol("symbol")?;
                    in_flight.retain(|(_, _, f)| *f != fifo);
                }
                other => {
                    return Err(InterpError::Parse {
                        line: op.line,
                        msg: format!("unsupported runtime-sequence operation {other}"),
                    })
                }
            }
        }
        for (name, p) in &self.lock().partial {
            if !p.is_empty() {
                return run_err(format!(
                    "the runtime sequence leaves a partial element of @{name} ({} values)",
                    p.len()
                ));
            }
        }
        Ok(outputs)
    }

    /// One `dma_memcpy_nd`, checked (a shim FIFO, a free BD id below the shim's count, an access
    /// pattern within the shim descriptor's limits), and whether it streams into the array.
    fn sequence_dma(
        &self,
        op: &Op,
        seq: &Block,
        arg_index: &HashMap<String, usize>,
        in_flight: &mut InFlight,
    ) -> Result<(Dma, bool), InterpError> {
        let device = self.device;
        let fifo = op.symbol("metadata")?;
        let f = self.fifo(&fifo)?;
        let id = op.int("id")?;
        let shim = if f.producer.1 == Device::SHIM_ROW { f.producer } else { f.consumers[0] };
        if shim.1 != Device::SHIM_ROW {
            return run_err(format!("runtime DMA on @{fifo}, which does not touch a shim tile"));
        }
        if id < 0 || id as usize >= device.shim_bds() {
            return run_err(format!("BD id {id} on shim {shim:?}: it has {}", device.shim_bds()));
        }
        if in_flight.iter().any(|(t, i, _)| *t == shim && *i == id) {
            return run_err(format!("BD {id} of shim {shim:?} reused before a wait freed it"));
        }
        in_flight.push((shim, id, fifo.clone()));
        let arg = *arg_index
            .get(&op.operands[0])
            .ok_or_else(|| InterpError::Parse { line: op.line, msg: "DMA on a non-argument".into() })?;
        let (offs, sizes, strides) = (op.ints("static_offsets")?, op.ints("static_sizes")?, op.ints("static_strides")?);
        if offs.len() != 4 || sizes.len() != 4 || strides.len() != 4 {
            return Err(InterpError::Parse {
                line: op.line,
                msg: "dma_memcpy_nd wants 4 offsets, sizes, strides".into(),
            });
        }
        let base: usize =
            offs.iter().zip(&strides).enumerate().map(|(i, (o, s))| if i == 3 { *o } else { o * s }).sum();
        let dims: Vec<(usize, usize)> = sizes.iter().copied().zip(strides.iter().copied()).collect();
        let elem_bytes = parse_memref(&seq.args[arg].1).and_then(|(_, e)| elem_bytes(&e)).unwrap_or(1);
        crate::design::check_pattern(device.shim_dma(), elem_bytes, &dims, true)
            .or_else(|e| run_err(format!("runtime DMA on @{fifo} (line {}): {e}", op.line)))?;
        let into_array = f.producer.1 == Device::SHIM_ROW;
        Ok((Dma { arg, fifo, base, dims }, into_array))
    }

    /// The cores, each on its own thread as on the array, blocking on the FIFO elements they
    /// acquire; the links run whenever their inputs are there.
    fn run_cores(&self, cores: &[((usize, usize), &Op)], stats: &mut RunStats) -> Result<(), InterpError> {
        self.lock().running = cores.len();
        let results: Vec<_> = std::thread::scope(|scope| {
            let threads: Vec<_> = cores
                .iter()
                .map(|&(tile, op)| {
                    scope.spawn(move || {
                        let result = self.run_core(tile, op);
                        let mut net = self.lock();
                        net.running -= 1;
                        net.failed |= result.is_err();
                        self.wake.notify_all();
                        result
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap_or_else(|_| run_err("a core's thread panicked"))).collect()
        });
        let failed = |r: &Result<_, InterpError>| r.as_ref().is_err_and(|e| *e != InterpError::Run(STOPPED.into()));
        if let Some(first) = results.iter().position(failed).or_else(|| results.iter().position(Result::is_err)) {
            return Err(results
                .into_iter()
                .nth(first)
                .and_then(Result::err)
                .unwrap_or(InterpError::Run(STOPPED.into())));
        }
        for calls in results.into_iter().flatten() {
            for (name, n) in calls {
                *stats.calls.entry(name).or_default() += n;
            }
        }
        Ok(())
    }

    /// Runs one core's body; returns its calls of each function.
    fn run_core(&self, tile: (usize, usize), op: &Op) -> Result<BTreeMap<String, u64>, InterpError> {
        let mut st =
            CoreState { tile, fifo_names: vec![], held: vec![], next_seq: 0, calls: BTreeMap::new(), locals: vec![] };
        let mut env = HashMap::new();
        let mut own: Vec<(&String, &BufferInfo)> = self.buffers.iter().filter(|(_, b)| b.tile == tile).collect();
        own.sort_by_key(|(name, _)| name.as_str());
        for (name, b) in own {
            // Uninitialised memory, as an acquired element's: a kernel that reads before writing shows.
            st.locals.push(vec![0x5a5a_5a5a; b.elems]);
            env.insert(name.clone(), Val::Local(st.locals.len() - 1));
        }
        self.exec_block(&mut st, &op.regions[0], &mut env)?;
        if st.held.iter().any(|h| !h.is_empty()) {
            return run_err(format!("core {tile:?} ends holding FIFO elements"));
        }
        Ok(st.calls)
    }

    /// Output DMAs, in sequence order, drain their FIFOs' streams into the host buffers.
    fn run_output_dmas(&self, outputs: &[Dma], host: &mut [Vec<i32>]) -> Result<(), InterpError> {
        for dma in outputs {
            let want: usize = dma.dims.iter().map(|d| d.0).product();
            let shim = self.fifo(&dma.fifo)?.consumers[0];
            let mut data = Vec::with_capacity(want);
            let net = &mut *self.lock();
            while data.len() < want {
                let taken =
                    net.pending.get(&dma.fifo).is_none_or(VecDeque::is_empty).then(|| net.take(&dma.fifo, shim));
                if let Some(e) = taken {
                    let Some(e) = e else {
                        return run_err(format!(
                            "runtime DMA acquires from @{} but no element was produced (the hardware would hang)",
                            dma.fifo
                        ));
                    };
                    net.pending.entry(dma.fifo.clone()).or_default().extend(e);
                    continue;
                }
                let pend = net.pending.entry(dma.fifo.clone()).or_default();
                let take = (want - data.len()).min(pend.len());
                data.extend(pend.drain(..take));
            }
            scatter(&mut host[dma.arg], dma.base, &dma.dims, &data)?;
        }
        Ok(())
    }

    /// Every element produced was consumed, and every value streamed out written back.
    fn check_drained(&self) -> Result<(), InterpError> {
        let net = self.lock();
        for ((name, tile), q) in &net.queues {
            if !q.is_empty() {
                return run_err(format!("{} element(s) of @{name} never consumed at tile {tile:?}", q.len()));
            }
        }
        for (name, p) in &net.pending {
            if !p.is_empty() {
                return run_err(format!("{} value(s) of @{name} never written back", p.len()));
            }
        }
        Ok(())
    }
}

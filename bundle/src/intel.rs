//! `intel/plan.json`: the `npuc-intel/1` plan of an intel-npu bundle, written by `codegen-intel`
//! and read by the runtime's `openvino` backend.
//!
//! The plan lists the IR segments (one `.xml` network per token block size, all viewing one
//! weights file), the inputs and outputs of each with their shapes per block size, the attentions
//! the host computes between segments, the order they run in, and where the RoPE tables are in
//! the weights file. Verify blocks (`verify_blocks`, for speculative decoding) add a network per
//! segment for each of their sizes, the last-row segment's over every row; a plan written before
//! them has no such member and reads as having none. [`Plan::encode`] writes pretty JSON with every object's keys sorted (the
//! layout format 1 has always had); [`Plan::decode`] refuses another format before anything else,
//! then any missing, misspelled or ill-typed member, naming its JSON path.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The folder of the bundle that holds the intel-npu files.
pub const DIR: &str = "intel";
/// The plan, in [`DIR`].
pub const PLAN_FILE: &str = "plan.json";
/// The weights every segment's constants view, in [`DIR`].
pub const WEIGHTS_FILE: &str = "weights.bin";
/// The plan's path in the bundle (`DIR/PLAN_FILE`).
pub const PLAN_PATH: &str = "intel/plan.json";
/// The value of the plan's `format` member.
pub const FORMAT: &str = "npuc-intel/1";

/// The plan of an intel-npu bundle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub format: Format,
    /// The weights file's name in [`DIR`].
    pub weights_file: String,
    pub weights_bytes: u64,
    /// Token block sizes, ascending: one network per segment each (the last-row segment has 1).
    /// A step runs its tokens in these.
    pub blocks: Vec<usize>,
    /// Verify block sizes, ascending, each at least 2: every segment has a network for each
    /// (the last-row segment's computes every row's logits), which a verify step of speculative
    /// decoding runs its pending token and drafts in. Empty, and left out of the file, for none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verify_blocks: Vec<usize>,
    /// The value that holds the logits (an output of the last segment).
    pub logits: String,
    pub rope: Rope,
    /// The segments, in program order.
    pub segments: Vec<Segment>,
    /// The attentions the host computes between segments, by layer.
    pub attention: Vec<Attention>,
    /// The recurrent layers and mixtures of experts the host computes between segments (hybrid
    /// decoders), with their weights in the weights file. Empty, and left out of the file, for
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host: Vec<HostStep>,
    /// What one step runs, in order.
    pub schedule: Vec<Step>,
}

/// The `format` member: always [`FORMAT`]; decoding refuses any other value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Format;

impl Serialize for Format {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(FORMAT)
    }
}

impl<'de> Deserialize<'de> for Format {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let found = String::deserialize(deserializer)?;
        if found == FORMAT {
            Ok(Format)
        } else {
            Err(serde::de::Error::custom(format!("format `{found}` is not {FORMAT}, the one this runtime reads")))
        }
    }
}

/// The RoPE tables the host feeds: `[positions, width]` f32 rows in the weights file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rope {
    /// Positions the tables cover (the longest context the bundle runs).
    pub positions: usize,
    /// Values per row.
    pub width: usize,
    /// Each table by its input name (`rope_cos`, `rope_sin`, `rope_cos_1`, ...).
    pub tables: BTreeMap<String, ByteRange>,
}

/// Bytes `offset..offset + size` of the weights file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByteRange {
    pub offset: u64,
    pub size: u64,
}

/// One segment: the networks (one per block size) and what they read and write.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Segment {
    pub name: String,
    /// Its place in [`Plan::segments`].
    pub index: usize,
    /// The network file in [`DIR`] per block size (of [`Plan::blocks`] and
    /// [`Plan::verify_blocks`]).
    pub files: BTreeMap<usize, String>,
    /// Whether the segment runs on the block's last row only (the lm_head): its network of
    /// block 1 reads the last row of a block of any size; those of the verify blocks read every
    /// row.
    pub last_row_only: bool,
    pub inputs: Vec<SegmentInput>,
    pub outputs: Vec<SegmentOutput>,
}

/// An input of a segment: its tensor name, where it comes from, its element type, and its shape
/// per block size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentInput {
    pub name: String,
    pub role: Role,
    pub dtype: InputType,
    pub shape: BTreeMap<usize, Vec<usize>>,
}

/// An output of a segment: its tensor name and its shape per block size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentOutput {
    pub name: String,
    pub shape: BTreeMap<usize, Vec<usize>>,
}

/// Where a segment input's data comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A model input (the token ids).
    Input,
    /// Rows of a RoPE table (the input's name is the table's).
    Rope,
    /// A value an earlier segment or attention computed.
    Value,
}

/// The element type of a segment input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputType {
    F32,
    I64,
}

/// One attention, computed by the host over its paged KV cache: q, k and v are segment outputs
/// `[1, heads, block, head_dim]` (after RoPE), y the input of the next segment in the same layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attention {
    pub layer: usize,
    /// The attention node of the program.
    pub node: String,
    pub q: String,
    pub k: String,
    pub v: String,
    pub y: String,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// A sliding window (keys a query sees, its own included); `null` for none.
    pub window: Option<NonZeroUsize>,
    /// Attention sinks (gpt-oss): one f32 logit per query head in the weights file, which every
    /// row's softmax starts from; left out for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sinks: Option<ByteRange>,
}

/// One entry of the schedule: `{"segment": i}`, `{"attention": i}` or `{"host": i}`, indices
/// into [`Plan::segments`], [`Plan::attention`] and [`Plan::host`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Step {
    Segment(usize),
    Attention(usize),
    Host(usize),
}

/// A node the host computes between segments, reading segment outputs (f32, the block's rows
/// first) and writing a value later segments read. A recurrent layer keeps its state on the host,
/// one per sequence, updated in place by every step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum HostStep {
    CausalConv(CausalConv),
    DeltaRule(DeltaRule),
    Moe(Moe),
}

impl HostStep {
    /// The program node it computes.
    pub fn node(&self) -> &str {
        match self {
            HostStep::CausalConv(c) => &c.node,
            HostStep::DeltaRule(d) => &d.node,
            HostStep::Moe(m) => &m.node,
        }
    }

    /// Whether its sizes agree with each other and with its weights' byte ranges; why not.
    fn check(&self) -> Result<(), String> {
        let f32s = |r: ByteRange, count: usize, what: &str| match r.size == 4 * count as u64 {
            true => Ok(()),
            false => Err(format!("{what} holds {} bytes, not {count} f32", r.size)),
        };
        let bias = |r: Option<ByteRange>, count: usize, what: &str| r.map_or(Ok(()), |r| f32s(r, count, what));
        match self {
            HostStep::CausalConv(c) if c.channels > 0 && c.taps > 0 => {
                f32s(c.weight, c.channels * c.taps, "weight")?;
                bias(c.bias, c.channels, "bias")
            }
            HostStep::DeltaRule(d) if [d.q_heads, d.k_heads, d.kv_heads, d.dk, d.dv].iter().all(|&n| n > 0) => {
                let grouped = if d.q_heads >= d.kv_heads {
                    d.q_heads % d.kv_heads == 0 && d.k_heads == d.kv_heads
                } else {
                    d.kv_heads % d.q_heads == 0 && d.kv_heads % d.k_heads == 0
                };
                grouped.then_some(()).ok_or_else(|| "heads that do not group".to_string())
            }
            HostStep::Moe(m) if m.experts > 0 && m.hidden > 0 && m.inter > 0 && (1..=m.experts).contains(&m.k) => {
                let n1 = m.activation.fusion() * m.inter;
                bias(m.b1, m.experts * n1, "b1")?;
                bias(m.b2, m.experts * m.hidden, "b2")?;
                let Some(c) = m.codes else {
                    f32s(m.fc1, m.experts * n1 * m.hidden, "fc1")?;
                    return f32s(m.fc2, m.experts * m.hidden * m.inter, "fc2");
                };
                let fits = |k: usize| c.block_of(k) > 0 && k.is_multiple_of(c.block_of(k));
                if !(c.bits == 4 || c.bits == 8) || !fits(m.hidden) || !fits(m.inter) {
                    return Err(format!("{}-bit codes in blocks of {:?}", c.bits, c.block));
                }
                let codes =
                    |r: ByteRange, rows: usize, k: usize, what: &str| match r.size * 8 == (rows * k * c.bits) as u64 {
                        true => f32s(
                            if what == "fc1" { c.fc1_scales } else { c.fc2_scales },
                            rows * k / c.block_of(k),
                            "scales",
                        ),
                        false => Err(format!("{what} holds {} bytes of codes, not {rows} rows of {k}", r.size)),
                    };
                codes(m.fc1, m.experts * n1, m.hidden, "fc1")?;
                codes(m.fc2, m.experts * m.hidden, m.inter, "fc2")
            }
            _ => Err("a size of zero, or k outside the experts".to_string()),
        }
    }

    /// Floats of its recurrent state (0 for none).
    pub fn state_floats(&self) -> usize {
        match self {
            HostStep::CausalConv(c) => c.channels * c.taps.saturating_sub(1),
            HostStep::DeltaRule(d) => d.kv_heads * d.dk * d.dv,
            HostStep::Moe(_) => 0,
        }
    }
}

/// `com.microsoft::CausalConvWithState` (depthwise, one spatial dimension): `x` and `y` are
/// `[1, channels, block]`, the state the last `taps − 1` inputs of each channel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CausalConv {
    pub node: String,
    pub x: String,
    pub y: String,
    pub channels: usize,
    pub taps: usize,
    /// SiLU after the convolution.
    pub silu: bool,
    /// `[channels, taps]` f32.
    pub weight: ByteRange,
    /// `[channels]` f32.
    pub bias: Option<ByteRange>,
}

/// `LinearAttention` with the (gated) delta rule: `q` `[1, block, q_heads·dk]`, `k`
/// `[1, block, k_heads·dk]`, `v` `[1, block, kv_heads·dv]`, `decay` (log decay) and `beta`
/// `[1, block, kv_heads]`, `y` `[1, block, max(q_heads, kv_heads)·dv]`; the state
/// `[kv_heads, dk, dv]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeltaRule {
    pub node: String,
    pub q: String,
    pub k: String,
    pub v: String,
    pub decay: Option<String>,
    pub beta: Option<String>,
    pub y: String,
    pub q_heads: usize,
    pub k_heads: usize,
    pub kv_heads: usize,
    pub dk: usize,
    pub dv: usize,
    pub scale: f32,
    /// When given, q and k are normalised per head first: each run of `dk` values divided by
    /// √(Σx² + ε), a zero root giving zeros (DeltaNet's `qk_l2norm_eps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk_l2norm_eps: Option<f32>,
}

/// `com.microsoft::MoE` with f32 experts: `x` `[1, block, hidden]`, `router` `[block, experts]`
/// (logits: softmax, top `k`, renormalised when `normalize`), `y` like `x`. `fc1` is
/// `[experts, fusion·inter, hidden]`, `fc2` `[experts, hidden, inter]`, the biases one row per
/// expert.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Moe {
    pub node: String,
    pub x: String,
    pub router: String,
    pub y: String,
    pub experts: usize,
    pub hidden: usize,
    pub inter: usize,
    pub k: usize,
    pub normalize: bool,
    pub activation: ExpertActivation,
    pub fc1: ByteRange,
    pub b1: Option<ByteRange>,
    pub fc2: ByteRange,
    pub b2: Option<ByteRange>,
    /// The static expert network (see [`ExpertSegment`]); without one the host computes the
    /// experts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<ExpertSegment>,
    /// Experts stored as codes (QMoE): `fc1` and `fc2` are then `[experts, rows, K·bits/8]`
    /// bytes; none for f32 experts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codes: Option<ExpertCodes>,
}

/// QMoE's expert codes: unsigned `bits`-bit codes (low nibble first for 4 bits) with zero point
/// 2^(bits−1) and one f32 scale per block of `block` along K (`None`: one per row), the scales
/// `[experts, rows, K/block]`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertCodes {
    pub bits: usize,
    pub block: Option<usize>,
    pub fc1_scales: ByteRange,
    pub fc2_scales: ByteRange,
}

impl ExpertCodes {
    /// The block along a K of `k`.
    pub fn block_of(&self, k: usize) -> usize {
        self.block.unwrap_or(k)
    }
}

/// One expert as a network whose weights are run-time inputs: the host binds the selected
/// expert's weights (views of `fc1`, `b1`, `fc2`, `b2` of one expert) and the rows routed to it,
/// gathered into a block. Inputs [`EXPERT_INPUTS`] — `x` `[1, block, hidden]`, `fc1`
/// `[fusion·inter, hidden]`, `b1` `[fusion·inter]` (when the experts have it), `fc2`
/// `[hidden, inter]`, `b2` `[hidden]` (when they have it) — and output `y` like `x`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertSegment {
    /// The network file in [`DIR`] per block size (those of [`Plan::blocks`]).
    pub files: BTreeMap<usize, String>,
}

/// The input names of an [`ExpertSegment`]'s networks, and its output's.
pub const EXPERT_INPUTS: [&str; 5] = ["x", "fc1", "b1", "fc2", "b2"];
pub const EXPERT_OUTPUT: &str = "y";
/// The inputs of an [`ExpertSegment`] over codes ([`ExpertCodes`]): `fc1` and `fc2` are then
/// signed codes `[rows, K/block, block]` (i4 or i8: the unsigned codes minus the zero point), and
/// these their scales `[rows, K/block, 1]`.
pub const EXPERT_SCALES: [&str; 2] = ["fc1_scales", "fc2_scales"];

/// What an expert applies between its projections.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ExpertActivation {
    Relu,
    Gelu,
    Silu,
    Identity,
    /// `g·σ(alpha·g)·(l + beta)`, g clamped above and l on both sides at `limit` when there is
    /// one; gate and linear halves interleaved, or the first and second halves.
    SwiGlu {
        interleaved: bool,
        alpha: f32,
        beta: f32,
        limit: Option<f32>,
    },
}

impl ExpertActivation {
    /// Rows of fc1 per intermediate row.
    pub fn fusion(self) -> usize {
        match self {
            ExpertActivation::SwiGlu { .. } => 2,
            _ => 1,
        }
    }
}

/// A plan that cannot be read: `path` is where in the document (`.` for the whole document).
#[derive(Debug, thiserror::Error)]
#[error("`{file}` is malformed at `{path}`: {message}")]
pub struct PlanError {
    pub file: String,
    pub path: String,
    pub message: String,
}

impl PlanError {
    /// An error at `path` of the bundle's plan.
    pub fn at(path: impl Into<String>, message: impl Into<String>) -> PlanError {
        PlanError { file: PLAN_PATH.to_string(), path: path.into(), message: message.into() }
    }
}

impl Plan {
    /// The bytes of `plan.json`: pretty JSON, every object's keys sorted.
    pub fn encode(&self) -> Vec<u8> {
        // Through a `Value`, whose objects keep their keys sorted: the layout does not depend on
        // the order the structs declare their fields in.
        let document = serde_json::to_value(self).expect("a plan always serialises");
        serde_json::to_vec_pretty(&document).expect("a JSON value always serialises")
    }

    /// Decodes `plan.json`: another format is refused first (its layout may differ), then the
    /// members, and then the schedule's indices.
    pub fn decode(bytes: &[u8]) -> Result<Plan, PlanError> {
        let document: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| PlanError::at(".", e.to_string()))?;
        let format = document.get("format").ok_or_else(|| PlanError::at("format", "missing"))?;
        Format::deserialize(format).map_err(|e| PlanError::at("format", e.to_string()))?;
        let plan: Plan = serde_path_to_error::deserialize(document)
            .map_err(|e| PlanError::at(e.path().to_string(), e.inner().to_string()))?;
        plan.check_schedule()?;
        plan.check_verify_blocks()?;
        plan.check_host()?;
        Ok(plan)
    }

    /// Every host step's sizes agree with each other and with its weights' byte ranges, and every
    /// attention's sinks are one f32 per query head, so a runtime can index them as they say.
    fn check_host(&self) -> Result<(), PlanError> {
        for (i, a) in self.attention.iter().enumerate() {
            if a.sinks.is_some_and(|s| s.size != 4 * a.q_heads as u64) {
                return Err(PlanError::at(format!("attention[{i}].sinks"), format!("not {} f32 sinks", a.q_heads)));
            }
        }
        for (i, step) in self.host.iter().enumerate() {
            step.check().map_err(|message| PlanError::at(format!("host[{i}]"), message))?;
        }
        Ok(())
    }

    /// Every verify block is at least 2 rows (one row is a step) and has a network in every
    /// segment.
    fn check_verify_blocks(&self) -> Result<(), PlanError> {
        for (i, &block) in self.verify_blocks.iter().enumerate() {
            if block < 2 {
                return Err(PlanError::at(
                    format!("verify_blocks[{i}]"),
                    format!("{block} rows: a verify block holds at least 2"),
                ));
            }
            if let Some(s) = self.segments.iter().position(|s| !s.files.contains_key(&block)) {
                let message = format!("segment `{}` has no network for verify block {block}", self.segments[s].name);
                return Err(PlanError::at(format!("segments[{s}].files"), message));
            }
        }
        Ok(())
    }

    fn check_schedule(&self) -> Result<(), PlanError> {
        for (i, step) in self.schedule.iter().enumerate() {
            let (what, index, count) = match *step {
                Step::Segment(s) => ("segment", s, self.segments.len()),
                Step::Attention(a) => ("attention", a, self.attention.len()),
                Step::Host(h) => ("host", h, self.host.len()),
            };
            if index >= count {
                let message = format!("{what} {index} of a plan with {count}");
                return Err(PlanError::at(format!("schedule[{i}].{what}"), message));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        let shape = |rows: &[(usize, Vec<usize>)]| rows.iter().cloned().collect::<BTreeMap<_, _>>();
        let input = |name: &str, role, dtype, dims: fn(usize) -> Vec<usize>| SegmentInput {
            name: name.to_string(),
            role,
            dtype,
            shape: shape(&[(1, dims(1)), (64, dims(64))]),
        };
        let segment = Segment {
            name: "seg00".into(),
            index: 0,
            files: BTreeMap::from([(1, "seg00_t1.xml".into()), (64, "seg00_t64.xml".into())]),
            last_row_only: false,
            inputs: vec![
                input("input_ids", Role::Input, InputType::I64, |t| vec![1, t]),
                input("rope_cos", Role::Rope, InputType::F32, |t| vec![1, 1, t, 64]),
            ],
            outputs: vec![SegmentOutput { name: "q".into(), shape: shape(&[(1, vec![1, 9, 1, 64])]) }],
        };
        let attention = Attention {
            layer: 0,
            node: "attn0".into(),
            q: "q".into(),
            k: "k".into(),
            v: "v".into(),
            y: "y".into(),
            q_heads: 9,
            kv_heads: 3,
            head_dim: 64,
            scale: 0.125,
            window: NonZeroUsize::new(4096),
            sinks: None,
        };
        Plan {
            format: Format,
            weights_file: WEIGHTS_FILE.into(),
            weights_bytes: 1 << 20,
            blocks: vec![1, 64],
            verify_blocks: vec![],
            logits: "logits".into(),
            rope: Rope {
                positions: 4096,
                width: 64,
                tables: BTreeMap::from([("rope_cos".into(), ByteRange { offset: 0, size: 4096 * 64 * 4 })]),
            },
            segments: vec![segment],
            attention: vec![attention],
            host: vec![],
            schedule: vec![Step::Segment(0), Step::Attention(0)],
        }
    }

    /// The plan as JSON, edited by `edit`, then decoded.
    fn decode_edited(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Plan, PlanError> {
        let mut document: serde_json::Value = serde_json::from_slice(&plan().encode()).unwrap();
        edit(&mut document);
        Plan::decode(&serde_json::to_vec(&document).unwrap())
    }

    #[test]
    fn a_plan_encodes_and_decodes_to_an_equal_plan() {
        let bytes = plan().encode();
        assert_eq!(Plan::decode(&bytes).unwrap(), plan());
        let text = String::from_utf8(bytes).unwrap();
        for member in [r#""format": "npuc-intel/1""#, r#""segment": 0"#, r#""role": "rope""#, r#""window": 4096"#] {
            assert!(text.contains(member), "{member} in {text}");
        }
    }

    #[test]
    fn a_plan_is_written_with_its_keys_sorted() {
        let text = String::from_utf8(plan().encode()).unwrap();
        let top: Vec<usize> = [
            "attention",
            "blocks",
            "format",
            "logits",
            "rope",
            "schedule",
            "segments",
            "weights_bytes",
            "weights_file",
        ]
        .iter()
        .map(|k| text.find(&format!("\n  \"{k}\": ")).unwrap_or_else(|| panic!("{k} in {text}")))
        .collect();
        assert!(top.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    #[test]
    fn an_attention_without_a_window_is_written_as_null_and_read_back() {
        let mut p = plan();
        p.attention[0].window = None;
        let text = String::from_utf8(p.encode()).unwrap();
        assert!(text.contains(r#""window": null"#), "{text}");
        assert_eq!(Plan::decode(text.as_bytes()).unwrap(), p);
    }

    #[test]
    fn a_misspelled_member_is_refused_naming_it() {
        let err = decode_edited(|d| {
            let input = d["segments"][0]["inputs"][1].as_object_mut().unwrap();
            let role = input.remove("role").unwrap();
            input.insert("rol".into(), role);
        })
        .unwrap_err();
        assert_eq!(err.file, PLAN_PATH);
        assert_eq!(err.path, "segments[0].inputs[1].rol");
        assert!(err.message.contains("unknown field `rol`"), "{err}");
    }

    #[test]
    fn a_missing_member_is_refused_naming_it() {
        let err = decode_edited(|d| {
            d["attention"][0].as_object_mut().unwrap().remove("kv_heads");
        })
        .unwrap_err();
        assert_eq!(err.path, "attention[0]");
        assert!(err.message.contains("missing field `kv_heads`"), "{err}");
    }

    #[test]
    fn an_ill_typed_member_is_refused_at_its_path() {
        let err = decode_edited(|d| d["segments"][0]["inputs"][0]["role"] = "weights".into()).unwrap_err();
        assert_eq!(err.path, "segments[0].inputs[0].role");
        assert!(err.to_string().starts_with("`intel/plan.json` is malformed at `segments[0].inputs[0].role`"), "{err}");
    }

    #[test]
    fn another_format_is_refused_before_its_members() {
        let err = decode_edited(|d| {
            d["format"] = "npuc-intel/2".into();
            d["attention"] = serde_json::json!("a layout of another format");
        })
        .unwrap_err();
        assert_eq!(err.path, "format");
        assert!(err.message.contains("`npuc-intel/2` is not npuc-intel/1"), "{err}");
    }

    #[test]
    fn a_schedule_step_beyond_the_segments_is_refused() {
        let err = decode_edited(|d| d["schedule"][1] = serde_json::json!({"segment": 3})).unwrap_err();
        assert_eq!(err.path, "schedule[1].segment");
        assert!(err.message.contains("segment 3 of a plan with 1"), "{err}");
    }

    /// The plan with verify blocks 2 and 4: a network of each size in its segment.
    fn plan_with_verify_blocks() -> Plan {
        let mut p = plan();
        p.verify_blocks = vec![2, 4];
        for t in [2, 4] {
            p.segments[0].files.insert(t, format!("seg00_t{t}.xml"));
        }
        p
    }

    #[test]
    fn a_plan_with_verify_blocks_encodes_and_decodes_to_an_equal_plan() {
        let p = plan_with_verify_blocks();
        let text = String::from_utf8(p.encode()).unwrap();
        assert!(text.contains("\"verify_blocks\": [\n    2,\n    4\n  ]"), "{text}");
        assert_eq!(Plan::decode(text.as_bytes()).unwrap(), p);
    }

    #[test]
    fn a_plan_without_verify_blocks_has_the_layout_it_had_before_them() {
        // Written without the member, so a bundle compiled without verify blocks is byte for
        // byte what it was; and a plan from before them reads as having none.
        let text = String::from_utf8(plan().encode()).unwrap();
        assert!(!text.contains("verify_blocks"), "{text}");
        let mut document: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(document.as_object_mut().unwrap().remove("verify_blocks").is_none());
        let decoded = Plan::decode(&serde_json::to_vec(&document).unwrap()).unwrap();
        assert!(decoded.verify_blocks.is_empty());
    }

    #[test]
    fn a_verify_block_without_a_network_or_of_one_row_is_refused() {
        let mut p = plan_with_verify_blocks();
        p.segments[0].files.remove(&4);
        let err = Plan::decode(&p.encode()).unwrap_err();
        assert_eq!(err.path, "segments[0].files");
        assert!(err.message.contains("segment `seg00` has no network for verify block 4"), "{err}");
        let mut p = plan_with_verify_blocks();
        p.verify_blocks = vec![1, 2];
        let err = Plan::decode(&p.encode()).unwrap_err();
        assert_eq!(
            (err.path.as_str(), err.message.as_str()),
            ("verify_blocks[0]", "1 rows: a verify block holds at least 2")
        );
    }

    /// The plan with a causal convolution and a mixture of experts the host computes after the
    /// segment.
    fn plan_with_host_steps() -> Plan {
        let mut p = plan();
        let range = |offset: u64, size: u64| ByteRange { offset, size };
        p.host = vec![
            HostStep::CausalConv(CausalConv {
                node: "conv0".into(),
                x: "x".into(),
                y: "y".into(),
                channels: 8,
                taps: 4,
                silu: true,
                weight: range(0, 128),
                bias: None,
            }),
            HostStep::Moe(Moe {
                node: "moe0".into(),
                x: "h".into(),
                router: "logits".into(),
                y: "m".into(),
                experts: 4,
                hidden: 8,
                inter: 4,
                k: 2,
                normalize: true,
                activation: ExpertActivation::SwiGlu { interleaved: true, alpha: 1.0, beta: 0.0, limit: None },
                fc1: range(128, 1024),
                b1: None,
                fc2: range(1152, 512),
                b2: None,
                segment: Some(ExpertSegment { files: BTreeMap::from([(1, "expert01_t1.xml".into())]) }),
                codes: None,
            }),
        ];
        p.schedule.extend([Step::Host(0), Step::Host(1)]);
        p
    }

    #[test]
    fn a_plan_with_host_steps_encodes_and_decodes_to_an_equal_plan() {
        let p = plan_with_host_steps();
        let text = String::from_utf8(p.encode()).unwrap();
        for member in [r#""host": 1"#, r#""causal_conv": {"#, r#""swi_glu": {"#, r#""expert01_t1.xml""#] {
            assert!(text.contains(member), "{member} in {text}");
        }
        assert_eq!(Plan::decode(text.as_bytes()).unwrap(), p);
        assert_eq!(p.host.iter().map(HostStep::state_floats).collect::<Vec<_>>(), [8 * 3, 0]);
        // A plan without host steps leaves the member out, as before them.
        assert!(!String::from_utf8(plan().encode()).unwrap().contains("\"host\""));
    }

    #[test]
    fn a_host_step_whose_sizes_disagree_is_refused_naming_it() {
        let mut p = plan_with_host_steps();
        let HostStep::Moe(m) = &mut p.host[1] else { unreachable!() };
        m.fc2.size -= 4;
        let err = Plan::decode(&p.encode()).unwrap_err();
        assert_eq!((err.path.as_str(), err.message.as_str()), ("host[1]", "fc2 holds 508 bytes, not 128 f32"));
        let mut p = plan_with_host_steps();
        let HostStep::CausalConv(c) = &mut p.host[0] else { unreachable!() };
        c.taps = 0;
        let err = Plan::decode(&p.encode()).unwrap_err();
        assert_eq!(err.path, "host[0]");
        assert!(err.message.contains("a size of zero"), "{err}");
    }

    #[test]
    fn a_schedule_step_beyond_the_host_steps_is_refused() {
        let mut p = plan_with_host_steps();
        p.schedule.push(Step::Host(2));
        let err = Plan::decode(&p.encode()).unwrap_err();
        assert_eq!(err.path, "schedule[4].host");
        assert!(err.message.contains("host 2 of a plan with 2"), "{err}");
    }

    #[test]
    fn the_plan_path_is_the_plan_file_in_its_folder() {
        assert_eq!(PLAN_PATH, format!("{DIR}/{PLAN_FILE}"));
    }
}

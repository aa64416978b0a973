//! The e-graph form of a [`Graph`]: an egg [`Language`] over the op vocabulary (imported and
//! fused ops), an [`Analysis`] carrying dtype, symbolic shape and small constant values, and the
//! conversions Graph → EGraph → extracted Graph.
//!
//! Node heads:
//! - `Op`: an op of [`crate::op::VOCABULARY`] with its attributes in canonical text. In a rule's
//!   pattern, a head written without attributes (`Transpose`) matches any attributes; with
//!   attributes (`Transpose{perm=[0,2,1,3]}`) only equal ones.
//! - `Proj(i)`: output `i` of a multi-output node (the child is the node's tuple class).
//! - leaves: `Input(name)`, `Weight(id)`, `Const(id)` (an entry of the analysis' constant pool),
//!   `Absent` (an omitted optional input).
//! - `Outputs`: the synthetic root whose children are the graph outputs, so one extraction
//!   yields the whole program.
//!
//! Pattern spelling: ops by name (`Mul`; `com.microsoft::RotaryEmbedding` and `npuc::RmsNorm`
//! where a name needs its domain), `proj0`, `proj1`, …, `_` for an absent input.

use crate::attr::{Attr, Attrs};
use crate::dim::Dim;
use crate::dtype::DType;
use crate::graph::{Graph, Node, NodeId, Value, ValueDef, ValueId};
use crate::op::{lookup, Domain, OpSpec, VOCABULARY};
use crate::tensor::Tensor;
use crate::weights::WeightId;
pub use egg::Id;
use egg::{DidMerge, Language};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// Attributes of an op node: the canonical text (what equality, hashing and ordering see) and the
/// parsed attributes.
#[derive(Clone, Debug)]
pub struct AttrSet {
    pub text: Arc<str>,
    pub attrs: Arc<Attrs>,
}

impl AttrSet {
    pub fn new(attrs: Attrs) -> AttrSet {
        let parts: Vec<String> = attrs.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        AttrSet { text: parts.join(",").into(), attrs: Arc::new(attrs) }
    }

    pub fn empty() -> AttrSet {
        AttrSet::new(Attrs::default())
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

impl PartialEq for AttrSet {
    fn eq(&self, o: &Self) -> bool {
        self.text == o.text
    }
}
impl Eq for AttrSet {}
impl std::hash::Hash for AttrSet {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.text.hash(h)
    }
}
impl PartialOrd for AttrSet {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for AttrSet {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.text.cmp(&o.text)
    }
}

/// The operator part of an e-node. Field order matters: the derived `Ord` sorts by kind first,
/// which egg's matcher relies on for large classes (see [`Head::kind`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Head {
    Op { domain: Domain, op: &'static str, attrs: AttrSet },
    Proj(usize),
    Input(Arc<str>),
    Weight(WeightId),
    Const(u32),
    Absent,
    Outputs,
}

/// What a head is, ignoring attributes and leaf identity: egg's discriminant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HeadKind {
    Op(Domain, &'static str),
    Proj(usize),
    Input,
    Weight,
    Const,
    Absent,
    Outputs,
}

impl Head {
    pub fn kind(&self) -> HeadKind {
        match self {
            Head::Op { domain, op, .. } => HeadKind::Op(*domain, op),
            Head::Proj(i) => HeadKind::Proj(*i),
            Head::Input(_) => HeadKind::Input,
            Head::Weight(_) => HeadKind::Weight,
            Head::Const(_) => HeadKind::Const,
            Head::Absent => HeadKind::Absent,
            Head::Outputs => HeadKind::Outputs,
        }
    }

    pub fn op(&self) -> Option<&'static str> {
        match self {
            Head::Op { op, .. } => Some(op),
            _ => None,
        }
    }

    pub fn attrs(&self) -> Option<&Attrs> {
        match self {
            Head::Op { attrs, .. } => Some(&attrs.attrs),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ENode {
    pub head: Head,
    pub children: Vec<Id>,
}

impl ENode {
    pub fn op(domain: Domain, op: &'static str, attrs: Attrs, children: Vec<Id>) -> ENode {
        ENode { head: Head::Op { domain, op, attrs: AttrSet::new(attrs) }, children }
    }

    pub fn leaf(head: Head) -> ENode {
        ENode { head, children: vec![] }
    }
}

impl Language for ENode {
    type Discriminant = HeadKind;

    fn discriminant(&self) -> HeadKind {
        self.head.kind()
    }

    /// Pattern nodes without attributes match any attributes of the same op.
    fn matches(&self, other: &Self) -> bool {
        if self.children.len() != other.children.len() {
            return false;
        }
        match (&self.head, &other.head) {
            (Head::Op { domain: d1, op: o1, attrs: a1 }, Head::Op { domain: d2, op: o2, attrs: a2 }) => {
                d1 == d2 && o1 == o2 && (a1.is_empty() || a1 == a2)
            }
            (a, b) => a == b,
        }
    }

    fn children(&self) -> &[Id] {
        &self.children
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}

impl fmt::Display for ENode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.head {
            Head::Op { domain, op, attrs } => {
                if *domain != Domain::Onnx || ambiguous(op) {
                    write!(f, "{}::", domain)?;
                }
                f.write_str(op)?;
                if !attrs.is_empty() {
                    write!(f, "{{{}}}", attrs.text)?;
                }
                Ok(())
            }
            Head::Proj(i) => write!(f, "proj{i}"),
            Head::Input(n) => write!(f, "input:{n}"),
            Head::Weight(w) => write!(f, "weight:{}", w.0),
            Head::Const(c) => write!(f, "const:{c}"),
            Head::Absent => f.write_str("_"),
            Head::Outputs => f.write_str("outputs"),
        }
    }
}

/// True when an op name exists in more than one domain.
fn ambiguous(op: &str) -> bool {
    VOCABULARY.iter().filter(|s| s.name == op).count() > 1
}

#[derive(Debug, thiserror::Error)]
#[error("cannot parse pattern op `{0}`: {1}")]
pub struct ParseOpError(pub String, pub String);

impl egg::FromOp for ENode {
    type Error = ParseOpError;

    fn from_op(text: &str, children: Vec<Id>) -> Result<Self, Self::Error> {
        let err = |m: &str| ParseOpError(text.to_string(), m.to_string());
        if text == "_" {
            return Ok(ENode::leaf(Head::Absent));
        }
        // Leaves print as `kind:value` (see Display); parsing them back lets egg's explanation
        // terms round-trip.
        if let Some(n) = text.strip_prefix("input:") {
            return Ok(ENode::leaf(Head::Input(n.into())));
        }
        if let Some(w) = text.strip_prefix("weight:").and_then(|s| s.parse::<u32>().ok()) {
            return Ok(ENode::leaf(Head::Weight(WeightId(w))));
        }
        if let Some(c) = text.strip_prefix("const:").and_then(|s| s.parse::<u32>().ok()) {
            return Ok(ENode::leaf(Head::Const(c)));
        }
        if text == "outputs" {
            return Ok(ENode { head: Head::Outputs, children });
        }
        if let Some(i) = text.strip_prefix("proj").and_then(|s| s.parse::<usize>().ok()) {
            return Ok(ENode { head: Head::Proj(i), children });
        }
        let (name, attr_text) = match text.find('{') {
            Some(p) if text.ends_with('}') => (&text[..p], Some(&text[p + 1..text.len() - 1])),
            Some(_) => return Err(err("unbalanced braces")),
            None => (text, None),
        };
        let spec =
            resolve_op(name).ok_or_else(|| err("not an op of the vocabulary (prefix the domain if ambiguous)"))?;
        let attrs = match attr_text {
            Some(t) => parse_attrs(t).map_err(|e| err(&e.to_string()))?,
            None => Attrs::default(),
        };
        Ok(ENode::op(spec.domain, spec.name, attrs, children))
    }
}

/// Finds an op by `name` or `domain::name`; bare names prefer ai.onnx when ambiguous.
pub fn resolve_op(name: &str) -> Option<&'static OpSpec> {
    if let Some((d, n)) = name.split_once("::") {
        let domain = match d {
            "npuc" => Domain::Npuc,
            other => Domain::parse(other)?,
        };
        return lookup(domain, n);
    }
    lookup(Domain::Onnx, name).or_else(|| VOCABULARY.iter().find(|s| s.name == name))
}

/// Why attribute text in a pattern does not parse.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AttrTextError {
    #[error("`{0}` has no `=`")]
    NoEquals(String),
    #[error("unclosed list")]
    UnclosedList,
    #[error("unclosed string")]
    UnclosedString,
    #[error("bad list `{0}`")]
    BadList(String),
    #[error("bad value `{0}`")]
    BadValue(String),
}

/// Parses `k=v,k=v` attribute text: ints, floats, "strings", [lists of ints or floats].
pub fn parse_attrs(text: &str) -> Result<Attrs, AttrTextError> {
    let mut attrs = Attrs::default();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let eq = rest.find('=').ok_or_else(|| AttrTextError::NoEquals(rest.to_string()))?;
        let key = rest[..eq].trim().to_string();
        rest = rest[eq + 1..].trim_start();
        let (value, tail) = if rest.starts_with('[') {
            let close = rest.find(']').ok_or(AttrTextError::UnclosedList)?;
            (&rest[..=close], &rest[close + 1..])
        } else if let Some(body) = rest.strip_prefix('"') {
            let close = body.find('"').ok_or(AttrTextError::UnclosedString)? + 1;
            (&rest[..=close], &rest[close + 1..])
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            (&rest[..end], &rest[end..])
        };
        attrs.set(&key, parse_attr_value(value.trim())?);
        rest = tail.trim_start().trim_start_matches(',').trim_start();
    }
    Ok(attrs)
}

fn parse_attr_value(v: &str) -> Result<Attr, AttrTextError> {
    if let Some(inner) = v.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
        let items: Vec<&str> = inner.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        if let Ok(ints) = items.iter().map(|s| s.parse::<i64>()).collect::<Result<Vec<_>, _>>() {
            return Ok(Attr::Ints(ints));
        }
        let floats = items
            .iter()
            .map(|s| s.parse::<f32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| AttrTextError::BadList(v.to_string()))?;
        return Ok(Attr::Floats(floats));
    }
    if let Some(s) = v.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        return Ok(Attr::Str(s.to_string()));
    }
    if let Ok(i) = v.parse::<i64>() {
        return Ok(Attr::Int(i));
    }
    v.parse::<f32>().map(Attr::Float).map_err(|_| AttrTextError::BadValue(v.to_string()))
}

/// Dtype and symbolic shape of one value.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeInfo {
    pub dtype: DType,
    pub shape: Vec<Dim>,
}

/// What the analysis knows about an e-class.
#[derive(Clone, Debug, Default)]
pub struct ClassData {
    /// One entry per output (multi-output tuple classes have several); empty while unknown.
    pub types: Vec<TypeInfo>,
    /// The class's value when it is a small constant.
    pub constant: Option<u32>,
}

impl ClassData {
    pub fn ty(&self) -> Option<&TypeInfo> {
        self.types.first()
    }
}

/// A candidate group a rule looked at and declined to rewrite, with the reason (`explore --why`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Declined {
    pub rule: String,
    pub class: Id,
    pub reason: String,
}

/// The analysis: per-class types and constants, the constant pool, the disagreements seen when
/// two classes with different types were merged (each is a broken rule, reported by the pass
/// driver), and the groups rules declined with their reasons.
#[derive(Clone, Default)]
pub struct NpuAnalysis {
    pub consts: Vec<Tensor>,
    const_index: HashMap<(DType, Vec<usize>, Vec<u8>), u32>,
    pub type_conflicts: Vec<String>,
    pub declined: std::collections::BTreeSet<Declined>,
}

impl NpuAnalysis {
    /// Records that `rule` declined to rewrite `class`, and why.
    pub fn decline(&mut self, rule: &str, class: Id, reason: impl Into<String>) {
        self.declined.insert(Declined { rule: rule.to_string(), class, reason: reason.into() });
    }

    /// The constant value of a class, if it is a small constant.
    pub fn constant_of<'a>(&'a self, data: &ClassData) -> Option<&'a Tensor> {
        data.constant.map(|c| &self.consts[c as usize])
    }

    /// Adds a constant to the pool (deduplicated by value) and returns its index.
    pub fn intern(&mut self, t: Tensor) -> u32 {
        let key = (t.dtype, t.shape.clone(), t.to_le_bytes().unwrap_or_default());
        if let Some(&i) = self.const_index.get(&key) {
            return i;
        }
        self.consts.push(t);
        let i = self.consts.len() as u32 - 1;
        self.const_index.insert(key, i);
        i
    }
}

pub type EGraph = egg::EGraph<ENode, NpuAnalysis>;

impl egg::Analysis<ENode> for NpuAnalysis {
    type Data = ClassData;

    fn make(egraph: &mut EGraph, enode: &ENode, _id: Id) -> ClassData {
        match &enode.head {
            Head::Const(c) => {
                let t = &egraph.analysis.consts[*c as usize];
                ClassData {
                    types: vec![TypeInfo {
                        dtype: t.dtype,
                        shape: t.shape.iter().map(|&d| Dim::known(d as i64)).collect(),
                    }],
                    constant: Some(*c),
                }
            }
            Head::Proj(i) => {
                let tuple = &egraph[enode.children[0]].data;
                ClassData { types: tuple.types.get(*i).cloned().into_iter().collect(), constant: None }
            }
            Head::Op { domain, op, attrs } => {
                let inputs: Vec<Option<TypeInfo>> = enode
                    .children
                    .iter()
                    .map(|&c| {
                        if matches!(egraph[c].nodes.first().map(|n| &n.head), Some(Head::Absent)) {
                            None
                        } else {
                            egraph[c].data.ty().cloned()
                        }
                    })
                    .collect();
                ClassData { types: crate::fused::infer_types(*domain, op, &attrs.attrs, &inputs), constant: None }
            }
            _ => ClassData::default(),
        }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        let mut changed_a = false;
        if a.types.is_empty() && !b.types.is_empty() {
            a.types = b.types.clone();
            changed_a = true;
        } else if !a.types.is_empty() && !b.types.is_empty() && a.types != b.types {
            self.type_conflicts.push(format!("{:?} vs {:?}", a.types, b.types));
        }
        if a.constant.is_none() && b.constant.is_some() {
            a.constant = b.constant;
            changed_a = true;
        }
        DidMerge(changed_a, a.types != b.types || a.constant != b.constant)
    }
}

/// The e-graph of a graph, with the class of every graph output.
pub struct Seeded {
    pub egraph: EGraph,
    pub root: Id,
    /// The class of each graph value, by value id.
    pub classes: HashMap<ValueId, Id>,
}

/// Builds the e-graph of `g` (explanations optional: they cost memory).
/// Weights with at most this many elements are known by value in the e-graph analysis.
const KNOWN_WEIGHT_ELEMENTS: usize = 16;

pub fn seed(g: &Graph, explanations: bool) -> Seeded {
    let mut egraph = EGraph::new(NpuAnalysis::default());
    if explanations {
        egraph = egraph.with_explanations_enabled();
    }
    let mut classes: HashMap<ValueId, Id> = HashMap::new();
    let absent = egraph.add(ENode::leaf(Head::Absent));
    let class_of = |egraph: &mut EGraph, classes: &mut HashMap<ValueId, Id>, v: ValueId| -> Id {
        if let Some(&c) = classes.get(&v) {
            return c;
        }
        let value = g.value(v);
        let id = match &value.def {
            ValueDef::Input => egraph.add(ENode::leaf(Head::Input(value.name.as_str().into()))),
            ValueDef::Weight(w) => egraph.add(ENode::leaf(Head::Weight(*w))),
            ValueDef::Const(t) => {
                let c = egraph.analysis.intern(t.clone());
                egraph.add(ENode::leaf(Head::Const(c)))
            }
            ValueDef::Node { .. } => unreachable!("node outputs are added with their node"),
        };
        if egraph[id].data.types.is_empty() {
            egraph[id].data.types = vec![TypeInfo { dtype: value.dtype, shape: value.shape.clone() }];
        }
        // A weight of a few elements (torch.export writes scalars and shape vectors as
        // initializers) is also known by value, as a constant leaf would be: scales, epsilons
        // and axes must be readable by rules.
        if let ValueDef::Weight(w) = &value.def {
            let w = g.weights.get(*w);
            if w.numel() <= KNOWN_WEIGHT_ELEMENTS && egraph[id].data.constant.is_none() {
                if let Ok(t) = w.to_tensor() {
                    let c = egraph.analysis.intern(t);
                    egraph[id].data.constant = Some(c);
                }
            }
        }
        classes.insert(v, id);
        id
    };
    for n in &g.nodes {
        let children: Vec<Id> = n
            .inputs
            .iter()
            .map(|i| match i {
                Some(v) => class_of(&mut egraph, &mut classes, *v),
                None => absent,
            })
            .collect();
        let node_class = egraph.add(ENode::op(n.domain, n.op, n.attrs.clone(), children));
        let types: Vec<TypeInfo> =
            n.outputs.iter().map(|&o| TypeInfo { dtype: g.value(o).dtype, shape: g.value(o).shape.clone() }).collect();
        egraph[node_class].data.types = types.clone();
        if n.outputs.len() == 1 {
            classes.insert(n.outputs[0], node_class);
        } else {
            for (i, &o) in n.outputs.iter().enumerate() {
                let p = egraph.add(ENode { head: Head::Proj(i), children: vec![node_class] });
                egraph[p].data.types = vec![types[i].clone()];
                classes.insert(o, p);
            }
        }
    }
    let outs: Vec<Id> = g.outputs.iter().map(|&o| class_of(&mut egraph, &mut classes, o)).collect();
    let root = egraph.add(ENode { head: Head::Outputs, children: outs });
    egraph.rebuild();
    Seeded { egraph, root, classes }
}

/// A program extracted from an e-graph: nodes in dependency order, children given as indices
/// into the list, each with the e-class it was chosen for.
pub struct Extracted {
    pub nodes: Vec<(ENode, Id)>,
}

/// Extracts the best program under `cost` from `root`, sharing every class once (a DAG, not a
/// tree).
///
/// The cost function prices trees, where a multi-output op's second output costs the whole op
/// again: a fused op's extra outputs (Attention's presents) never beat the nodes they replace on
/// their own. So once the cheapest tree choice is made, a class that holds a projection of a tuple
/// the program computes anyway takes that projection (it adds nothing, and what the class chose
/// before may die), unless the tuple depends on the class.
pub fn extract<CF: egg::CostFunction<ENode>>(egraph: &EGraph, root: Id, cost: CF) -> Extracted {
    let extractor = egg::Extractor::new(egraph, cost);
    let root = egraph.find(root);
    let mut choice: HashMap<Id, ENode> = HashMap::new();
    while let Some((class, proj)) = shared_projection(egraph, &extractor, root, &mut choice) {
        choice.insert(class, proj);
    }
    let mut index: HashMap<Id, usize> = HashMap::new();
    let mut nodes: Vec<(ENode, Id)> = Vec::new();
    // Iterative post-order walk: a class is emitted after all its children.
    let mut stack: Vec<(Id, bool)> = vec![(root, false)];
    while let Some((class, expanded)) = stack.pop() {
        if index.contains_key(&class) {
            continue;
        }
        let best = choice.get(&class).cloned().unwrap_or_else(|| extractor.find_best_node(class).clone());
        if !expanded {
            stack.push((class, true));
            for &c in best.children.iter().rev() {
                let c = egraph.find(c);
                if !index.contains_key(&c) {
                    stack.push((c, false));
                }
            }
            continue;
        }
        let mut node = best;
        for c in node.children.iter_mut() {
            *c = Id::from(index[&egraph.find(*c)]);
        }
        index.insert(class, nodes.len());
        nodes.push((node, class));
    }
    Extracted { nodes }
}

/// The first class reachable from `root` under `choice` (the extractor's best node where `choice`
/// has none; filled in as the walk goes) that has not chosen a projection but holds one of a
/// tuple also reachable, which does not itself reach the class.
fn shared_projection<CF: egg::CostFunction<ENode>>(
    egraph: &EGraph,
    extractor: &egg::Extractor<CF, ENode, NpuAnalysis>,
    root: Id,
    choice: &mut HashMap<Id, ENode>,
) -> Option<(Id, ENode)> {
    let mut order = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![root];
    while let Some(c) = stack.pop() {
        if seen.insert(c) {
            order.push(c);
            let node = choice.entry(c).or_insert_with(|| extractor.find_best_node(c).clone());
            stack.extend(node.children.iter().map(|&k| egraph.find(k)));
        }
    }
    let reaches = |from: Id, target: Id| {
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![from];
        while let Some(c) = stack.pop() {
            if c == target {
                return true;
            }
            if seen.insert(c) {
                stack.extend(choice[&c].children.iter().map(|&k| egraph.find(k)));
            }
        }
        false
    };
    order.iter().filter(|&&c| !matches!(choice[&c].head, Head::Proj(_))).find_map(|&c| {
        egraph[c]
            .nodes
            .iter()
            .find(|n| {
                let tuple = n.children.first().map(|&t| egraph.find(t));
                matches!(n.head, Head::Proj(_)) && tuple.is_some_and(|t| seen.contains(&t) && !reaches(t, c))
            })
            .map(|n| (c, n.clone()))
    })
}

/// Rebuilds a [`Graph`] from an extracted program rooted at an `Outputs` node. Types come from
/// the e-class analysis; values keep the name of an original graph value of their class where
/// there is one (`names`), new values are named after their op.
pub fn to_graph(template: &Graph, egraph: &EGraph, program: &Extracted, names: &HashMap<Id, String>) -> Graph {
    let mut r = Rebuild {
        template,
        g: Graph {
            name: template.name.clone(),
            values: Vec::new(),
            nodes: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            weights: template.weights.clone(),
            assumptions: template.assumptions.clone(),
        },
        used: std::collections::HashSet::new(),
        input_ids: HashMap::new(),
        vals: Vec::with_capacity(program.nodes.len()),
    };
    // Output names are reserved: only the outputs themselves may carry them.
    for &o in &template.outputs {
        r.used.insert(template.value(o).name.clone());
    }
    r.add_inputs();
    for (idx, (node, class)) in program.nodes.iter().enumerate() {
        let data = &egraph[*class].data;
        let hint = names.get(&egraph.find(*class)).cloned();
        let out: Vec<ValueId> = match &node.head {
            Head::Input(n) => vec![r.input_ids[n.as_ref()]],
            Head::Weight(w) => r.leaf(data, template.weights.get(*w).name.clone(), ValueDef::Weight(*w)),
            Head::Const(c) => {
                let t = egraph.analysis.consts[*c as usize].clone();
                r.leaf(data, hint.unwrap_or_else(|| format!("const{c}")), ValueDef::Const(t))
            }
            Head::Absent => vec![],
            Head::Proj(i) => vec![r.vals[usize::from(node.children[0])][*i]],
            Head::Outputs => {
                r.add_outputs(&node.children);
                vec![]
            }
            Head::Op { domain, op, attrs } => r.add_op(idx, node, (*domain, *op, &*attrs.attrs), data, hint),
        };
        r.vals.push(out);
    }
    r.g
}

/// The graph [`to_graph`] is building and what it needs to name and wire its values.
struct Rebuild<'t> {
    template: &'t Graph,
    g: Graph,
    /// Value names taken so far (the outputs' reserved up front).
    used: std::collections::HashSet<String>,
    /// The new graph's inputs by name.
    input_ids: HashMap<String, ValueId>,
    /// The values of each program node so far, by its index in the program.
    vals: Vec<Vec<ValueId>>,
}

impl Rebuild<'_> {
    /// `base`, or `base.k` for the first `k` that makes it unused; the name is then taken.
    fn fresh(&mut self, base: String) -> String {
        let mut k = 0;
        loop {
            let candidate = if k == 0 { base.clone() } else { format!("{base}.{k}") };
            if self.used.insert(candidate.clone()) {
                return candidate;
            }
            k += 1;
        }
    }

    fn push_value(&mut self, name: String, dtype: DType, shape: Vec<Dim>, def: ValueDef) -> ValueId {
        self.g.values.push(Value { name, dtype, shape, def });
        ValueId(self.g.values.len() as u32 - 1)
    }

    /// Graph inputs come first and keep their order even if the program no longer reads them.
    fn add_inputs(&mut self) {
        for &i in &self.template.inputs {
            let v = self.template.value(i);
            let name = self.fresh(v.name.clone());
            let id = self.push_value(name, v.dtype, v.shape.clone(), ValueDef::Input);
            self.g.inputs.push(id);
            self.input_ids.insert(v.name.clone(), id);
        }
    }

    /// The opset the template imports `domain` at (1 when no node of it is left).
    fn opset_of(&self, domain: Domain) -> i64 {
        self.template.nodes.iter().find(|n| n.domain == domain).map(|n| n.opset).unwrap_or(1)
    }

    /// A weight or constant value typed by its class' analysis.
    fn leaf(&mut self, data: &ClassData, name: String, def: ValueDef) -> Vec<ValueId> {
        let ty = data.ty().cloned().unwrap_or(TypeInfo { dtype: DType::F32, shape: vec![] });
        let name = self.fresh(name);
        vec![self.push_value(name, ty.dtype, ty.shape, def)]
    }

    /// The graph outputs, in the template's order and under its names.
    fn add_outputs(&mut self, children: &[Id]) {
        for (c, &want) in children.iter().zip(&self.template.outputs) {
            let v = self.vals[usize::from(*c)][0];
            let name = self.template.value(want).name.clone();
            let claimed = self.g.outputs.contains(&v);
            if !claimed && matches!(self.g.values[v.0 as usize].def, ValueDef::Node { .. }) {
                self.g.values[v.0 as usize].name = name;
                self.g.outputs.push(v);
            } else {
                // An input, a leaf, or a value already returned under another name: the output
                // gets its own Identity so every output keeps its name.
                let node_id = NodeId(self.g.nodes.len() as u32);
                let src = self.g.values[v.0 as usize].clone();
                let out = self.push_value(name, src.dtype, src.shape, ValueDef::Node { node: node_id, output: 0 });
                self.g.nodes.push(Node {
                    name: format!("output_{}", self.g.outputs.len()),
                    domain: Domain::Onnx,
                    op: "Identity",
                    opset: self.opset_of(Domain::Onnx),
                    attrs: Attrs::default(),
                    inputs: vec![Some(v)],
                    outputs: vec![out],
                });
                self.g.outputs.push(out);
            }
        }
    }

    /// The node of program node `idx`, an op of its class, with its output values named after
    /// `hint` (the class' original value) or after the op.
    fn add_op(
        &mut self,
        idx: usize,
        node: &ENode,
        (domain, op, attrs): (Domain, &'static str, &Attrs),
        data: &ClassData,
        hint: Option<String>,
    ) -> Vec<ValueId> {
        let inputs: Vec<Option<ValueId>> =
            node.children.iter().map(|c| self.vals[usize::from(*c)].first().copied()).collect();
        let node_id = NodeId(self.g.nodes.len() as u32);
        let types = if data.types.is_empty() {
            vec![TypeInfo { dtype: DType::F32, shape: vec![] }]
        } else {
            data.types.clone()
        };
        let mut outputs = Vec::with_capacity(types.len());
        for (k, ty) in types.iter().enumerate() {
            let base = match (&hint, types.len()) {
                (Some(h), 1) => h.clone(),
                (Some(h), _) => format!("{h}.{k}"),
                (None, 1) => format!("{}_{idx}", op.to_lowercase()),
                (None, _) => format!("{}_{idx}.{k}", op.to_lowercase()),
            };
            let name = self.fresh(base);
            outputs.push(self.push_value(
                name,
                ty.dtype,
                ty.shape.clone(),
                ValueDef::Node { node: node_id, output: k },
            ));
        }
        self.g.nodes.push(Node {
            name: format!("{op}_{idx}"),
            domain,
            op,
            opset: self.opset_of(domain),
            attrs: attrs.clone(),
            inputs,
            outputs: outputs.clone(),
        });
        outputs
    }
}

/// Names of the original graph values by (canonical) e-class, for [`to_graph`].
pub fn class_names(g: &Graph, seeded: &Seeded, egraph: &EGraph) -> HashMap<Id, String> {
    let mut names = HashMap::new();
    let mut members: Vec<(&ValueId, &Id)> = seeded.classes.iter().collect();
    members.sort();
    for (&v, &c) in members {
        if matches!(g.value(v).def, ValueDef::Node { .. } | ValueDef::Const(_)) {
            names.entry(egraph.find(c)).or_insert_with(|| g.value(v).name.clone());
        }
    }
    names
}

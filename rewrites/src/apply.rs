//! The plumbing between egg and a rule whose right-hand side is computed by code.
//!
//! A family writes such a right-hand side as a [`Fold`]: for one match (the matched class, the
//! substitution, the rule's name as egg passes it) it adds what it builds, unions it with the
//! matched classes and returns the classes that changed, or a [`Decline`] saying why it does not
//! fold. [`Computed`] is the one egg `Applier` every such rule goes through: it records a decline
//! with a reason under egg's own rule name (what `npuc explore --why` lists), so no fold names its
//! rule, and hands the changed classes to egg. [`Computed::guarded`] is a pattern right-hand side
//! behind a check that says why it declines (egg's conditions can only say no), and [`declines`]
//! the right-hand side of a rule that exists to say why a look-alike group is not folded.

use crate::cond::var;
use egg::{Applier, Id, Pattern, PatternAst, Subst, Symbol, Var};
use ir::egraph::{EGraph, ENode, NpuAnalysis};

/// Why a fold does not apply to a match: `Some(reason)` for a candidate it declines (recorded for
/// `npuc explore --why`), `None` for a match that is no candidate at all (nothing worth telling a
/// user).
#[derive(Debug)]
pub struct Decline(pub Option<String>);

impl From<String> for Decline {
    fn from(s: String) -> Self {
        Decline(Some(s))
    }
}

impl From<&str> for Decline {
    fn from(s: &str) -> Self {
        Decline(Some(s.to_string()))
    }
}

/// Not a candidate: no reason to report.
pub fn no_match() -> Decline {
    Decline(None)
}

/// What a fold did: the classes it changed, or why it declined.
pub type Folded = Result<Vec<Id>, Decline>;

/// A rule's right-hand side computed by code.
pub trait Fold {
    /// Folds the match of `rule` at `class` under `subst`: adds the equal form, unions it with the
    /// classes it equals and returns those that changed, or declines.
    fn fold(&self, egraph: &mut EGraph, class: Id, subst: &Subst, rule: Symbol) -> Folded;
}

/// The egg right-hand side of a rule computed by `F`: declines recorded under the rule's name,
/// changed classes handed to egg; with `then`, a pattern applied when the fold passes.
pub struct Computed<F> {
    fold: F,
    then: Option<Pattern<ENode>>,
}

impl<F: Fold> Computed<F> {
    pub fn new(fold: F) -> Computed<F> {
        Computed { fold, then: None }
    }
}

/// A check as a fold that changes nothing: `Ok` to go on, or why the match is declined.
pub struct Guard<C>(C);

impl<C: Fn(&EGraph, Id, &Subst) -> Result<(), Decline>> Fold for Guard<C> {
    fn fold(&self, egraph: &mut EGraph, class: Id, subst: &Subst, _: Symbol) -> Folded {
        (self.0)(egraph, class, subst).map(|()| vec![])
    }
}

impl<C: Fn(&EGraph, Id, &Subst) -> Result<(), Decline>> Computed<Guard<C>> {
    /// The pattern right-hand side `rhs` (instantiated as egg instantiates a pattern, with
    /// explanations when they are on), applied when `check` passes; when it does not, the match
    /// is declined with the check's reason.
    pub fn guarded(rhs: &str, check: C) -> Computed<Guard<C>> {
        let rhs = rhs.parse().unwrap_or_else(|e| panic!("right-hand side `{rhs}`: {e}"));
        Computed { fold: Guard(check), then: Some(rhs) }
    }
}

impl<F: Fold> Applier<ENode, NpuAnalysis> for Computed<F> {
    fn apply_one(
        &self,
        egraph: &mut EGraph,
        eclass: Id,
        subst: &Subst,
        searcher_ast: Option<&PatternAst<ENode>>,
        rule: Symbol,
    ) -> Vec<Id> {
        match self.fold.fold(egraph, eclass, subst, rule) {
            Ok(mut changed) => {
                if let Some(rhs) = &self.then {
                    changed.extend(rhs.apply_one(egraph, eclass, subst, searcher_ast, rule));
                }
                changed
            }
            Err(Decline(Some(reason))) => {
                // Earlier applications of this iteration may have merged the matched class; the
                // canonical one is what the report names and what later iterations record.
                let class = egraph.find(eclass);
                egraph.analysis.decline(rule.as_str(), class, reason);
                vec![]
            }
            Err(Decline(None)) => vec![],
        }
    }

    fn get_pattern_ast(&self) -> Option<&PatternAst<ENode>> {
        self.then.as_ref().map(|p| &p.ast)
    }

    fn vars(&self) -> Vec<Var> {
        self.then.as_ref().map(Pattern::vars).unwrap_or_default()
    }
}

/// A fold that declines every match with a fixed reason.
pub struct Declines(&'static str);

impl Fold for Declines {
    fn fold(&self, _: &mut EGraph, _: Id, _: &Subst, _: Symbol) -> Folded {
        Err(self.0.into())
    }
}

/// The right-hand side of a rule that exists to say why a look-alike group is not folded: it
/// records `reason` for the matched class and rewrites nothing.
pub fn declines(reason: &'static str) -> Computed<Declines> {
    Computed::new(Declines(reason))
}

/// The classes the pattern variables `names` are bound to, in order.
pub fn bound<const N: usize>(subst: &Subst, names: [&str; N]) -> [Id; N] {
    names.map(|n| subst[var(n)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rewrite;
    use egg::{rewrite as rw, Runner};
    use ir::egraph::Head;
    use ir::{Attrs, Domain};

    /// `Neg(x)` after `rules` ran: the e-graph, x's class and the Neg's.
    fn run(rules: &[Rewrite]) -> (EGraph, Id, Id) {
        let mut egraph = EGraph::new(NpuAnalysis::default());
        let x = egraph.add(ENode::leaf(Head::Input("x".into())));
        let neg = egraph.add(ENode::op(Domain::Onnx, "Neg", Attrs::default(), vec![x]));
        let runner = Runner::default().with_egraph(egraph).with_iter_limit(3).run(rules);
        (runner.egraph, x, neg)
    }

    fn abs_of(egraph: &EGraph, x: Id) -> Option<Id> {
        egraph.lookup(ENode::op(Domain::Onnx, "Abs", Attrs::default(), vec![x]))
    }

    #[test]
    fn a_decline_is_recorded_under_the_rule_name_egg_passes() {
        let (egraph, _, neg) = run(&[rw!("test-declines"; "(Neg ?x)" => { declines("never folded") })]);
        let declined: Vec<_> = egraph.analysis.declined.iter().collect();
        assert_eq!(declined.len(), 1, "{declined:?}");
        assert_eq!(declined[0].rule, "test-declines");
        assert_eq!(declined[0].class, egraph.find(neg));
        assert_eq!(declined[0].reason, "never folded");
    }

    #[test]
    fn a_guarded_pattern_applies_when_its_check_passes() {
        let pass = |_: &EGraph, _: Id, _: &Subst| Ok(());
        let (egraph, x, neg) = run(&[rw!("test-pass"; "(Neg ?x)" => { Computed::guarded("(Abs ?x)", pass) })]);
        assert_eq!(abs_of(&egraph, x).map(|a| egraph.find(a)), Some(egraph.find(neg)));
        assert!(egraph.analysis.declined.is_empty());
    }

    #[test]
    fn a_guarded_pattern_whose_check_refuses_declines_with_its_reason_or_silently() {
        let refuse = |_: &EGraph, _: Id, _: &Subst| Err(Decline::from("x is not wanted"));
        let (egraph, x, _) = run(&[rw!("test-refuse"; "(Neg ?x)" => { Computed::guarded("(Abs ?x)", refuse) })]);
        assert_eq!(abs_of(&egraph, x), None);
        let reasons: Vec<_> = egraph.analysis.declined.iter().map(|d| (d.rule.as_str(), d.reason.as_str())).collect();
        assert_eq!(reasons, [("test-refuse", "x is not wanted")]);

        let no_candidate = |_: &EGraph, _: Id, _: &Subst| Err(no_match());
        let (egraph, x, _) = run(&[rw!("test-silent"; "(Neg ?x)" => { Computed::guarded("(Abs ?x)", no_candidate) })]);
        assert_eq!(abs_of(&egraph, x), None);
        assert!(egraph.analysis.declined.is_empty());
    }
}

//! User rules for `npuc explore --rules FILE`.
//!
//! One rule per line: `name: LHS => RHS [if COND, COND...]`, LHS and RHS egg patterns over npuc's
//! ops. Conditions: `is_scalar_const(?v, VALUE)`, `is_scalar(?v)`, `is_constant(?v)`,
//! `is_float(?v)`, `is_last_axis(?axes, ?x)`. Blank lines and lines starting with `#` are ignored.

use crate::cond;
use crate::Rewrite;
use egg::{ConditionalApplier, Id, Pattern, Subst};
use ir::egraph::{EGraph, ENode};

type Condition = Box<dyn Fn(&mut EGraph, Id, &Subst) -> bool + Send + Sync>;

/// Why a pattern of a rule does not parse (egg's error).
pub type PatternError = <Pattern<ENode> as std::str::FromStr>::Err;

/// A line of a rules file that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {kind}")]
pub struct RuleError {
    /// 1-based line number in the file.
    pub line: usize,
    pub kind: RuleErrorKind,
}

#[derive(Debug, thiserror::Error)]
pub enum RuleErrorKind {
    #[error("expected `name: LHS => RHS`")]
    NoName,
    #[error("the rule has no name")]
    EmptyName,
    #[error("expected `=>` between the two patterns")]
    NoArrow,
    #[error("left-hand side: {0}")]
    Lhs(PatternError),
    #[error("right-hand side: {0}")]
    Rhs(PatternError),
    #[error("condition `{0}` has no arguments")]
    NoArguments(String),
    #[error("`{name}` takes {count} argument(s), the first a pattern variable: `{text}`")]
    Arguments { name: String, count: usize, text: String },
    #[error("`{0}` is not a number")]
    NotANumber(String),
    #[error("unknown condition `{0}` (known: is_scalar_const, is_scalar, is_constant, is_float, is_last_axis)")]
    UnknownCondition(String),
    /// egg refused the rule (its message).
    #[error("{0}")]
    Rewrite(String),
}

/// Parses a rules file; errors name the line.
pub fn parse_rules(text: &str) -> Result<Vec<Rewrite>, RuleError> {
    let mut rules = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        rules.push(parse_rule(line).map_err(|kind| RuleError { line: i + 1, kind })?);
    }
    Ok(rules)
}

fn parse_rule(line: &str) -> Result<Rewrite, RuleErrorKind> {
    let (name, rest) = line.split_once(':').ok_or(RuleErrorKind::NoName)?;
    let name = name.trim();
    if name.is_empty() {
        return Err(RuleErrorKind::EmptyName);
    }
    let (lhs, rhs) = rest.split_once("=>").ok_or(RuleErrorKind::NoArrow)?;
    let (rhs, conds) = match rhs.split_once(" if ") {
        Some((r, c)) => (r, Some(c)),
        None => (rhs, None),
    };
    let lhs: Pattern<ENode> = lhs.trim().parse().map_err(RuleErrorKind::Lhs)?;
    let rhs: Pattern<ENode> = rhs.trim().parse().map_err(RuleErrorKind::Rhs)?;
    let conditions: Vec<Condition> = match conds {
        Some(c) => split_conditions(c).iter().map(|c| parse_condition(c)).collect::<Result<_, _>>()?,
        None => vec![],
    };
    let condition = move |eg: &mut EGraph, id: Id, subst: &Subst| conditions.iter().all(|c| c(eg, id, subst));
    Rewrite::new(name, lhs, ConditionalApplier { condition, applier: rhs }).map_err(RuleErrorKind::Rewrite)
}

/// Splits `a(x, y), b(z)` at the commas outside parentheses.
fn split_conditions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

fn parse_condition(text: &str) -> Result<Condition, RuleErrorKind> {
    let open = text.find('(').ok_or_else(|| RuleErrorKind::NoArguments(text.to_string()))?;
    let name = text[..open].trim();
    let args: Vec<&str> = text[open + 1..].trim_end_matches(')').split(',').map(str::trim).collect();
    let want = |n: usize| {
        if args.len() == n && args.iter().take(1).all(|a| a.starts_with('?')) {
            Ok(())
        } else {
            Err(RuleErrorKind::Arguments { name: name.to_string(), count: n, text: text.to_string() })
        }
    };
    Ok(match name {
        "is_scalar_const" => {
            want(2)?;
            let v: f64 = args[1].parse().map_err(|_| RuleErrorKind::NotANumber(args[1].to_string()))?;
            Box::new(cond::is_scalar_const(args[0], v))
        }
        "is_scalar" => {
            want(1)?;
            Box::new(cond::is_scalar(args[0]))
        }
        "is_constant" => {
            want(1)?;
            Box::new(cond::is_constant(args[0]))
        }
        "is_float" => {
            want(1)?;
            Box::new(cond::is_float(args[0]))
        }
        "is_last_axis" => {
            want(2)?;
            Box::new(cond::is_last_axis(args[0], args[1]))
        }
        other => return Err(RuleErrorKind::UnknownCondition(other.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rules_with_conditions_and_reports_bad_lines() {
        let rules = parse_rules(
            "# square as a product\nsquare: (Pow ?x ?two) => (Mul ?x ?x) if is_scalar_const(?two, 2.0), is_float(?x)\n\nsilu: (Mul ?x (Sigmoid ?x)) => (npuc::Silu ?x)\n",
        )
        .unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].name.as_str(), "square");
        let err = parse_rules("ok: (Neg ?x) => (Neg ?x)\nbad: (Frobnicate ?x) => ?x").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(matches!(err.kind, RuleErrorKind::Lhs(_)), "{err}");
        assert!(err.to_string().starts_with("line 2:"), "{err}");
        let err = parse_rules("c: (Neg ?x) => ?x if is_prime(?x)").unwrap_err();
        assert!(err.to_string().contains("unknown condition `is_prime`"), "{err}");
    }
}

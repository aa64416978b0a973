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

/// Parses a rules file; errors name the line.
pub fn parse_rules(text: &str) -> Result<Vec<Rewrite>, String> {
    let mut rules = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        rules.push(parse_rule(line).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    Ok(rules)
}

fn parse_rule(line: &str) -> Result<Rewrite, String> {
    let (name, rest) = line.split_once(':').ok_or("expected `name: LHS => RHS`")?;
    let name = name.trim();
    if name.is_empty() {
        return Err("the rule has no name".into());
    }
    let (lhs, rhs) = rest.split_once("=>").ok_or("expected `=>` between the two patterns")?;
    let (rhs, conds) = match rhs.split_once(" if ") {
        Some((r, c)) => (r, Some(c)),
        None => (rhs, None),
    };
    let lhs: Pattern<ENode> = lhs.trim().parse().map_err(|e| format!("left-hand side: {e}"))?;
    let rhs: Pattern<ENode> = rhs.trim().parse().map_err(|e| format!("right-hand side: {e}"))?;
    let conditions: Vec<Condition> = match conds {
        Some(c) => split_conditions(c).iter().map(|c| parse_condition(c)).collect::<Result<_, _>>()?,
        None => vec![],
    };
    let condition = move |eg: &mut EGraph, id: Id, subst: &Subst| conditions.iter().all(|c| c(eg, id, subst));
    Rewrite::new(name, lhs, ConditionalApplier { condition, applier: rhs }).map_err(|e| e.to_string())
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

fn parse_condition(text: &str) -> Result<Condition, String> {
    let open = text.find('(').ok_or_else(|| format!("condition `{text}` has no arguments"))?;
    let name = text[..open].trim();
    let args: Vec<&str> = text[open + 1..].trim_end_matches(')').split(',').map(str::trim).collect();
    let want = |n: usize| {
        if args.len() == n && args.iter().take(1).all(|a| a.starts_with('?')) {
            Ok(())
        } else {
            Err(format!("`{name}` takes {n} argument(s), the first a pattern variable: `{text}`"))
        }
    };
    Ok(match name {
        "is_scalar_const" => {
            want(2)?;
            let v: f64 = args[1].parse().map_err(|_| format!("`{}` is not a number", args[1]))?;
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
        other => {
            return Err(format!(
                "unknown condition `{other}` (known: is_scalar_const, is_scalar, is_constant, is_float, is_last_axis)"
            ))
        }
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
        assert!(err.starts_with("line 2:"), "{err}");
        let err = parse_rules("c: (Neg ?x) => ?x if is_prime(?x)").unwrap_err();
        assert!(err.contains("unknown condition `is_prime`"), "{err}");
    }
}

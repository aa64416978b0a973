//! Symbolic dimensions.
//!
//! A [`Dim`] is a polynomial with integer coefficients over named sizes (`batch_size`,
//! `sequence_length`, `past_sequence_length`, ...). Exporters compute shapes in-graph with
//! Shape/Gather/Add/Mul/Concat; keeping dims as canonical polynomials lets the frontend fold that
//! arithmetic exactly (`past + seq` from one branch equals `seq + past` from another) without
//! knowing any size.

use std::collections::BTreeMap;
use std::fmt;

/// A canonical polynomial: monomial (sorted symbol names, possibly repeated) → non-zero coefficient.
/// The empty monomial is the constant term.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Dim {
    terms: BTreeMap<Vec<String>, i64>,
}

impl Dim {
    pub fn known(v: i64) -> Dim {
        let mut terms = BTreeMap::new();
        if v != 0 {
            terms.insert(vec![], v);
        }
        Dim { terms }
    }

    pub fn sym(name: &str) -> Dim {
        let mut terms = BTreeMap::new();
        terms.insert(vec![name.to_string()], 1);
        Dim { terms }
    }

    /// The value when the dim has no symbols.
    pub fn as_known(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    /// The symbol's name when the dim is exactly one symbol with coefficient 1.
    pub fn as_symbol(&self) -> Option<&str> {
        if self.terms.len() != 1 {
            return None;
        }
        let (mono, &c) = self.terms.iter().next()?;
        (c == 1 && mono.len() == 1).then(|| mono[0].as_str())
    }

    pub fn is_known(&self) -> bool {
        self.as_known().is_some()
    }

    /// Symbols this dim mentions.
    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        self.terms.keys().flat_map(|m| m.iter().map(|s| s.as_str()))
    }

    fn from_terms(terms: impl IntoIterator<Item = (Vec<String>, i64)>) -> Option<Dim> {
        let mut out: BTreeMap<Vec<String>, i64> = BTreeMap::new();
        for (m, c) in terms {
            let e = out.entry(m).or_insert(0);
            *e = e.checked_add(c)?;
        }
        out.retain(|_, c| *c != 0);
        Some(Dim { terms: out })
    }

    /// `self + other`; `None` on coefficient overflow.
    pub fn add(&self, other: &Dim) -> Option<Dim> {
        Dim::from_terms(self.terms.iter().chain(other.terms.iter()).map(|(m, c)| (m.clone(), *c)))
    }

    pub fn neg(&self) -> Option<Dim> {
        Dim::from_terms(
            self.terms.iter().map(|(m, c)| c.checked_neg().map(|c| (m.clone(), c))).collect::<Option<Vec<_>>>()?,
        )
    }

    pub fn sub(&self, other: &Dim) -> Option<Dim> {
        self.add(&other.neg()?)
    }

    pub fn mul(&self, other: &Dim) -> Option<Dim> {
        let mut terms = Vec::new();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let mut m: Vec<String> = ma.iter().chain(mb.iter()).cloned().collect();
                m.sort();
                terms.push((m, ca.checked_mul(*cb)?));
            }
        }
        Dim::from_terms(terms)
    }

    /// Exact division: `Some(q)` with `q * other == self` when such a polynomial quotient exists
    /// for a monomial divisor, or a monomial quotient for a divisor of several terms
    /// (`128·b·p + 128·b·s` by `p + s` is `128·b`, as torch.export's reshapes need); `None`
    /// otherwise.
    pub fn div_exact(&self, other: &Dim) -> Option<Dim> {
        if other.terms.len() != 1 {
            // The quotient's one term times some term of the divisor is self's first term.
            let (m0, &c0) = self.terms.iter().next()?;
            return other.terms.iter().find_map(|(md, &cd)| {
                if cd == 0 || c0 % cd != 0 {
                    return None;
                }
                let mut rest = m0.clone();
                for s in md {
                    let i = rest.iter().position(|x| x == s)?;
                    rest.remove(i);
                }
                let q = Dim::from_terms([(rest, c0 / cd)])?;
                (q.mul(other)? == *self).then_some(q)
            });
        }
        let (dm, &dc) = other.terms.iter().next()?;
        let mut terms = Vec::new();
        for (m, &c) in &self.terms {
            if c % dc != 0 {
                return None;
            }
            let mut rest = m.clone();
            for s in dm {
                let i = rest.iter().position(|x| x == s)?;
                rest.remove(i);
            }
            terms.push((rest, c / dc));
        }
        Dim::from_terms(terms)
    }

    /// Replaces every occurrence of `symbol` by `value`.
    pub fn substitute(&self, symbol: &str, value: &Dim) -> Option<Dim> {
        let mut acc = Dim::known(0);
        for (m, &c) in &self.terms {
            let mut term = Dim::known(c);
            for s in m {
                term = if s == symbol { term.mul(value)? } else { term.mul(&Dim::sym(s))? };
            }
            acc = acc.add(&term)?;
        }
        Some(acc)
    }

    /// The value under a binding of every symbol; `None` if a symbol is unbound or on overflow.
    pub fn eval(&self, bindings: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        let mut acc: i64 = 0;
        for (m, &c) in &self.terms {
            let mut t = c;
            for s in m {
                t = t.checked_mul(bindings(s)?)?;
            }
            acc = acc.checked_add(t)?;
        }
        Some(acc)
    }
}

impl fmt::Display for Dim {
    /// Terms with more symbols first, constant last: `batch_size*sequence_length`, `past + seq + 1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        let mut ordered: Vec<(&Vec<String>, &i64)> = self.terms.iter().collect();
        ordered.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(b.0)));
        for (i, (m, &c)) in ordered.iter().enumerate() {
            let (neg, mag) = (c < 0, c.unsigned_abs());
            if i == 0 {
                if neg {
                    f.write_str("-")?;
                }
            } else {
                f.write_str(if neg { " - " } else { " + " })?;
            }
            if m.is_empty() {
                write!(f, "{mag}")?;
            } else {
                if mag != 1 {
                    write!(f, "{mag}*")?;
                }
                f.write_str(&m.join("*"))?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// Formats a shape as `[batch_size,sequence_length,576]`.
pub fn shape_to_string(shape: &[Dim]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_are_canonical() {
        let a = Dim::sym("past").add(&Dim::sym("seq")).unwrap();
        let b = Dim::sym("seq").add(&Dim::sym("past")).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "past + seq");
        assert_eq!(a.sub(&Dim::sym("past")).unwrap(), Dim::sym("seq"));
    }

    #[test]
    fn exact_division_by_monomials() {
        let numel = Dim::sym("b").mul(&Dim::sym("s")).unwrap().mul(&Dim::known(576)).unwrap();
        let others = Dim::sym("b").mul(&Dim::sym("s")).unwrap().mul(&Dim::known(9)).unwrap();
        assert_eq!(numel.div_exact(&others), Some(Dim::known(64)));
        assert_eq!(Dim::sym("s").div_exact(&Dim::known(2)), None);
        let two_s = Dim::sym("s").add(&Dim::sym("p")).unwrap().mul(&Dim::known(2)).unwrap();
        assert_eq!(two_s.div_exact(&Dim::sym("s").add(&Dim::sym("p")).unwrap()), Some(Dim::known(2)));
    }

    #[test]
    fn exact_division_by_sums_with_a_monomial_quotient() {
        let (b, p, s) = (Dim::sym("b"), Dim::sym("p"), Dim::sym("s"));
        let total = p.add(&s).unwrap();
        // torch.export: 128·b·p + 128·b·s elements into [-1, p + s, 32].
        let numel = b.mul(&total).unwrap().mul(&Dim::known(128)).unwrap();
        let rest = total.mul(&Dim::known(32)).unwrap();
        assert_eq!(numel.div_exact(&rest), Some(b.mul(&Dim::known(4)).unwrap()));
        // No monomial quotient: (p + s)·(p + s) by p + s, or p + 1 by p + s.
        assert_eq!(total.mul(&total).unwrap().div_exact(&total), None);
        assert_eq!(p.add(&Dim::known(1)).unwrap().div_exact(&total), None);
    }

    #[test]
    fn substitution_and_evaluation() {
        let d = Dim::sym("total").mul(&Dim::known(3)).unwrap();
        let total = Dim::sym("past").add(&Dim::sym("seq")).unwrap();
        let e = d.substitute("total", &total).unwrap();
        assert_eq!(e.to_string(), "3*past + 3*seq");
        assert_eq!(e.eval(&|s| if s == "past" { Some(4) } else { Some(1) }), Some(15));
        assert_eq!(Dim::known(i64::MAX).add(&Dim::known(1)), None);
    }
}

//! What inference knows of each value ([`Info`], [`Known`]) and the per-import state ([`Ctx`]):
//! fresh symbols for sizes nothing determines, and the equalities between sizes it had to assume.

use ir::{DType, Dim, Tensor};

#[derive(Clone, Debug)]
pub enum Known {
    Nothing,
    /// A concrete tensor.
    Const(Tensor),
    /// An integer scalar (`scalar == true`) or vector of symbolic dims.
    Dims {
        dims: Vec<Dim>,
        scalar: bool,
    },
}

#[derive(Clone, Debug)]
pub struct Info {
    pub dtype: DType,
    pub shape: Vec<Dim>,
    pub known: Known,
}

impl Info {
    pub fn new(dtype: DType, shape: Vec<Dim>) -> Info {
        Info { dtype, shape, known: Known::Nothing }
    }

    pub fn constant(t: Tensor) -> Info {
        Info { dtype: t.dtype, shape: t.shape.iter().map(|&d| Dim::known(d as i64)).collect(), known: Known::Const(t) }
    }

    pub(super) fn from_dims(dtype: DType, dims: Vec<Dim>, scalar: bool) -> Info {
        if dims.iter().all(|d| d.is_known()) {
            let vals: Vec<i64> = dims.iter().map(|d| d.as_known().unwrap()).collect();
            let shape = if scalar { vec![] } else { vec![vals.len()] };
            return Info::constant(Tensor::from_i64(dtype, shape, vals));
        }
        let shape = if scalar { vec![] } else { vec![Dim::known(dims.len() as i64)] };
        Info { dtype, shape, known: Known::Dims { dims, scalar } }
    }

    pub fn as_const(&self) -> Option<&Tensor> {
        match &self.known {
            Known::Const(t) => Some(t),
            _ => None,
        }
    }

    /// Contents as symbolic dims when this is an integer scalar or vector whose values are known.
    pub fn as_dims(&self) -> Option<(Vec<Dim>, bool)> {
        match &self.known {
            Known::Dims { dims, scalar } => Some((dims.clone(), *scalar)),
            Known::Const(t) if t.rank() <= 1 => {
                let v = t.as_i64()?;
                Some((v.iter().map(|&x| Dim::known(x)).collect(), t.rank() == 0))
            }
            _ => None,
        }
    }

    pub(super) fn is_concrete(&self) -> bool {
        matches!(self.known, Known::Const(_))
    }
}

/// Per-import state: fresh symbols for dims nothing determines, and the equalities assumed.
#[derive(Default)]
pub struct Ctx {
    fresh: usize,
    /// `symbol → expression` substitutions assumed so far, in order.
    pub substitutions: Vec<(String, Dim)>,
    /// Equalities assumed between two compound dims (no substitution possible).
    pub assumptions: Vec<String>,
}

impl Ctx {
    pub(super) fn fresh(&mut self, hint: &str) -> Dim {
        self.fresh += 1;
        Dim::sym(&format!("{hint}_{}", self.fresh))
    }

    /// Rewrites a dim with every substitution assumed so far.
    pub fn normalize(&self, d: &Dim) -> Dim {
        let mut d = d.clone();
        for (s, v) in &self.substitutions {
            if d.symbols().any(|x| x == s) {
                d = d.substitute(s, v).unwrap_or(d);
            }
        }
        d
    }

    /// Makes `a` and `b` equal: substitutes a bare symbol by the other side when possible.
    pub(crate) fn unify(&mut self, a: &Dim, b: &Dim) -> Dim {
        let (a, b) = (self.normalize(a), self.normalize(b));
        if a == b {
            return a;
        }
        let renamed = renamed_symbol(&a, &b);
        let (sym, other) = match (a.as_symbol(), b.as_symbol()) {
            (Some(s), _) if !b.symbols().any(|x| x == s) => (s.to_string(), b.clone()),
            (_, Some(s)) if !a.symbols().any(|x| x == s) => (s.to_string(), a.clone()),
            _ if renamed.is_some() => {
                let (x, y) = renamed.unwrap();
                (x, Dim::sym(&y))
            }
            _ => {
                let fact = format!("{a} = {b}");
                if !self.assumptions.contains(&fact) {
                    self.assumptions.push(fact);
                }
                return a;
            }
        };
        self.substitutions.push((sym, other));
        // The size itself under the substitution (`s69 + s70`, not the renamed symbol alone).
        self.normalize(&a)
    }
}

/// `(x, y)` when `a` and `b` differ only in that one has symbol `x` where the other has `y`
/// (`a − b = x − y`): the same size under two names, as torch.export names each input's sizes
/// apart (`s15 + s70` against `s69 + s70`).
pub(super) fn renamed_symbol(a: &Dim, b: &Dim) -> Option<(String, String)> {
    let d = a.sub(b)?;
    let syms: Vec<String> = d.symbols().map(str::to_string).collect();
    let [x, y] = &syms[..] else { return None };
    [(x.clone(), y.clone()), (y.clone(), x.clone())]
        .into_iter()
        .find(|(p, q)| Dim::sym(p).sub(&Dim::sym(q)).as_ref() == Some(&d))
}

#[cfg(test)]
mod tests {
    use super::Ctx;
    use ir::Dim;

    fn sum(a: &Dim, b: &Dim) -> Dim {
        a.add(b).unwrap()
    }

    #[test]
    fn a_bare_symbol_unified_with_a_size_is_substituted_by_it() {
        let (total, past, seq) = (Dim::sym("total"), Dim::sym("past"), Dim::sym("seq"));
        let mut ctx = Ctx::default();
        assert_eq!(ctx.unify(&total, &sum(&past, &seq)), sum(&past, &seq));
        assert_eq!(ctx.substitutions, [("total".to_string(), sum(&past, &seq))]);
        assert_eq!(ctx.normalize(&sum(&total, &Dim::known(1))).to_string(), "past + seq + 1");
        assert!(ctx.assumptions.is_empty());
    }

    #[test]
    fn sizes_named_apart_by_one_symbol_are_one_size() {
        // torch.export names each input's sizes apart: s15 + s70 against s69 + s70.
        let (s15, s69, s70) = (Dim::sym("s15"), Dim::sym("s69"), Dim::sym("s70"));
        let mut ctx = Ctx::default();
        // The unified size is the whole sum under its one name, not the renamed symbol alone.
        assert_eq!(ctx.unify(&sum(&s15, &s70), &sum(&s69, &s70)), sum(&s69, &s70));
        assert_eq!(ctx.substitutions, [("s15".to_string(), s69.clone())]);
        assert_eq!(ctx.normalize(&sum(&s15, &s70)), sum(&s69, &s70));
    }

    #[test]
    fn other_compound_sizes_are_recorded_as_an_assumption_once() {
        let two_p = Dim::sym("p").mul(&Dim::known(2)).unwrap();
        let q_r = sum(&Dim::sym("q"), &Dim::sym("r"));
        let mut ctx = Ctx::default();
        assert_eq!(ctx.unify(&two_p, &q_r), two_p);
        ctx.unify(&two_p, &q_r);
        assert_eq!((ctx.assumptions.as_slice(), ctx.substitutions.len()), (&["2*p = q + r".to_string()][..], 0));
    }
}

//! Einsum: the general contraction. Every operand dim carries a label; the result is indexed by
//! the output labels and sums, over every assignment of the other labels, the product of the
//! operands' elements. That covers transposes, batched matmuls, diagonals (a label repeated in
//! one operand), traces and sums over labels absent from the output.
//!
//! Labels are letters (`a`–`z`, `A`–`Z`) and one `...` per term, which stands for the dims not
//! labelled by letters; ellipsis dims of different operands align from the right and broadcast
//! as numpy does. Without `->` the output is the ellipsis dims followed by the letters that occur
//! once in the equation, in ASCII order (uppercase first), as numpy orders them.

use super::layout::{checked_numel, strides};
use super::{Ctx, Res};
use crate::dtype::DType;
use crate::tensor::{Data, Tensor};

/// Label ids: `0..broadcast` are ellipsis dims (right-aligned), then one id per letter.
const LETTERS: usize = 52;

/// Why an equation does not fit its operands.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EinsumError {
    #[error("term `{term}` has more than one `...`")]
    RepeatedEllipsis { term: String },
    #[error("term `{term}` holds `{found}`, not a letter")]
    NotALetter { term: String, found: char },
    #[error("equation `{equation}` has {terms} input terms for {inputs} inputs")]
    TermCount { equation: String, terms: usize, inputs: usize },
    #[error("term `{term}` does not label the {rank} dims of its input")]
    Unlabelled { term: String, rank: usize },
    #[error("output `{output}` repeats a letter or names one no input has")]
    BadOutput { output: String },
}

/// A parsed equation for operands of given ranks.
#[derive(Debug, PartialEq)]
pub struct EinsumSpec {
    /// Per operand, the label id of each dim.
    pub operands: Vec<Vec<usize>>,
    /// The label id of each output dim.
    pub output: Vec<usize>,
    /// How many label ids there are (ellipsis dims and letters).
    pub labels: usize,
    /// How many of those are ellipsis dims.
    pub broadcast: usize,
}

fn letter_id(c: char) -> Option<usize> {
    match c {
        'a'..='z' => Some(c as usize - 'a' as usize),
        'A'..='Z' => Some(26 + c as usize - 'A' as usize),
        _ => None,
    }
}

/// One term: its letter ids in order, with the position of `...` among them.
fn parse_term(term: &str) -> Result<(Vec<usize>, Option<usize>), EinsumError> {
    let mut letters = Vec::new();
    let mut ellipsis = None;
    let mut rest = term;
    while let Some(c) = rest.chars().next() {
        if let Some(tail) = rest.strip_prefix("...") {
            if ellipsis.replace(letters.len()).is_some() {
                return Err(EinsumError::RepeatedEllipsis { term: term.to_string() });
            }
            rest = tail;
        } else {
            letters.push(letter_id(c).ok_or_else(|| EinsumError::NotALetter { term: term.to_string(), found: c })?);
            rest = &rest[c.len_utf8()..];
        }
    }
    Ok((letters, ellipsis))
}

/// Parses `equation` for operands of the given ranks, checking that every term fits its operand.
pub fn parse_einsum(equation: &str, ranks: &[usize]) -> Result<EinsumSpec, EinsumError> {
    let compact: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match compact.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (compact.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(EinsumError::TermCount { equation: equation.to_string(), terms: terms.len(), inputs: ranks.len() });
    }
    let parsed: Vec<(Vec<usize>, Option<usize>)> = terms.iter().map(|t| parse_term(t)).collect::<Result<_, _>>()?;
    let mut widths = Vec::with_capacity(ranks.len());
    for ((term, (letters, ellipsis)), &rank) in terms.iter().zip(&parsed).zip(ranks) {
        match rank.checked_sub(letters.len()) {
            Some(w) if w == 0 || ellipsis.is_some() => widths.push(w),
            _ => return Err(EinsumError::Unlabelled { term: term.to_string(), rank }),
        }
    }
    let broadcast = widths.iter().copied().max().unwrap_or(0);
    let operands: Vec<Vec<usize>> = parsed
        .iter()
        .zip(&widths)
        .map(|((letters, ellipsis), &w)| {
            let ids = letters.iter().map(|&l| broadcast + l);
            let mut dims: Vec<usize> = ids.clone().take(ellipsis.unwrap_or(0)).collect();
            dims.extend(broadcast - w..broadcast);
            dims.extend(ids.skip(ellipsis.unwrap_or(0)));
            dims
        })
        .collect();
    let output = match rhs {
        Some(r) => explicit_output(r, &parsed, broadcast)?,
        None => implicit_output(&parsed, broadcast),
    };
    Ok(EinsumSpec { operands, output, labels: broadcast + LETTERS, broadcast })
}

fn explicit_output(
    rhs: &str,
    inputs: &[(Vec<usize>, Option<usize>)],
    broadcast: usize,
) -> Result<Vec<usize>, EinsumError> {
    let (letters, ellipsis) = parse_term(rhs)?;
    let mut output = Vec::new();
    for (k, &l) in letters.iter().enumerate() {
        if ellipsis == Some(k) {
            output.extend(0..broadcast);
        }
        if letters[..k].contains(&l) || !inputs.iter().any(|(ls, _)| ls.contains(&l)) {
            return Err(EinsumError::BadOutput { output: rhs.to_string() });
        }
        output.push(broadcast + l);
    }
    if ellipsis == Some(letters.len()) {
        output.extend(0..broadcast);
    }
    Ok(output)
}

fn implicit_output(inputs: &[(Vec<usize>, Option<usize>)], broadcast: usize) -> Vec<usize> {
    let mut count = [0usize; LETTERS];
    inputs.iter().flat_map(|(ls, _)| ls).for_each(|&l| count[l] += 1);
    // Ids count a-z first; ASCII order puts A-Z first.
    let ascii = (26..LETTERS).chain(0..26);
    (0..broadcast).chain(ascii.filter(|&l| count[l] == 1).map(|l| broadcast + l)).collect()
}

/// The size of every label: equal wherever a letter occurs; ellipsis dims broadcast (1 stretches).
fn label_sizes(spec: &EinsumSpec, shapes: &[&[usize]]) -> Res<Vec<usize>> {
    let mut sizes: Vec<Option<usize>> = vec![None; spec.labels];
    for (labels, shape) in spec.operands.iter().zip(shapes) {
        for (&l, &n) in labels.iter().zip(*shape) {
            sizes[l] = match sizes[l] {
                None => Some(n),
                Some(m) if m == n => Some(m),
                Some(1) if l < spec.broadcast => Some(n),
                Some(m) if l < spec.broadcast && n == 1 => Some(m),
                Some(m) => bail!("a label has sizes {m} and {n} in operands {shapes:?}"),
            };
        }
    }
    Ok(sizes.into_iter().map(|s| s.unwrap_or(1)).collect())
}

/// Most multiply-adds one Einsum may take, so a careless equation errors instead of running for
/// hours.
const MAX_TERMS: usize = 1 << 36;

pub(super) fn einsum(cx: &Ctx) -> Res<Vec<Tensor>> {
    let operands: Vec<&Tensor> = cx.present_inputs().collect();
    let Some(&first) = operands.first() else { bail!("needs at least one input") };
    if operands.iter().any(|t| t.dtype != first.dtype) || matches!(first.dtype, DType::Bool | DType::Str) {
        let dtypes: Vec<String> = operands.iter().map(|t| t.dtype.to_string()).collect();
        bail!("inputs must share one numeric dtype, got {}", dtypes.join(", "));
    }
    let Some(equation) = cx.attrs().str("equation")? else { bail!("attribute `equation` is required") };
    let ranks: Vec<usize> = operands.iter().map(|t| t.rank()).collect();
    let spec = parse_einsum(equation, &ranks).map_err(|e| super::Fail(e.to_string()))?;
    let shapes: Vec<&[usize]> = operands.iter().map(|t| &t.shape[..]).collect();
    let sizes = label_sizes(&spec, &shapes)?;
    let shape: Vec<usize> = spec.output.iter().map(|&l| sizes[l]).collect();
    let n = checked_numel(&shape)?;
    let summed: Vec<usize> = (0..spec.labels).filter(|l| !spec.output.contains(l) && sizes[*l] != 1).collect();
    let terms = summed.iter().try_fold(n, |acc, &l| acc.checked_mul(sizes[l]));
    if terms.is_none_or(|t| t > MAX_TERMS) {
        bail!("`{equation}` on {shapes:?} takes more than {MAX_TERMS} multiply-adds");
    }
    let walk = Walk::new(&spec, &operands, &sizes, &summed);
    let out = match &first.data {
        Data::F32(_) | Data::F64(_) => {
            let values: Vec<Vec<f64>> = operands.iter().map(|t| t.to_f64_vec()).collect();
            let out = walk.run(n, 0.0, |offsets| offsets.iter().zip(&values).map(|(&o, v)| v[o]).product::<f64>());
            super::float_tensor(first.dtype, shape, out)
        }
        _ => {
            let values: Vec<&[i64]> = operands.iter().map(|t| t.as_i64().unwrap_or(&[])).collect();
            let term = |offsets: &[usize]| offsets.iter().zip(&values).fold(1i64, |p, (&o, v)| p.wrapping_mul(v[o]));
            let out = walk.run(n, 0i64, term);
            Tensor::from_i64(first.dtype, shape, out)
        }
    };
    Ok(vec![out])
}

/// An odometer over the output labels (outer) and the summed labels (inner), keeping each
/// operand's element offset current.
struct Walk {
    /// Size of each walked label, output labels first.
    sizes: Vec<usize>,
    /// Per operand, the offset step of each walked label (0 where the operand lacks it or
    /// broadcasts it).
    steps: Vec<Vec<usize>>,
    /// Product of the summed labels' sizes.
    inner: usize,
}

impl Walk {
    fn new(spec: &EinsumSpec, operands: &[&Tensor], sizes: &[usize], summed: &[usize]) -> Walk {
        let walked: Vec<usize> = spec.output.iter().chain(summed).copied().collect();
        let steps = spec
            .operands
            .iter()
            .zip(operands)
            .map(|(labels, t)| {
                let st = strides(&t.shape);
                let step_of =
                    |l: usize| (0..labels.len()).filter(|&d| labels[d] == l && t.shape[d] > 1).map(|d| st[d]).sum();
                walked.iter().map(|&l| step_of(l)).collect()
            })
            .collect();
        let inner = summed.iter().map(|&l| sizes[l]).product();
        Walk { sizes: walked.iter().map(|&l| sizes[l]).collect(), steps, inner }
    }

    /// For each of the `n` output elements, the sum of `term(offsets)` over the summed labels.
    fn run<T: Copy + WrappingAdd>(&self, n: usize, zero: T, term: impl Fn(&[usize]) -> T) -> Vec<T> {
        let mut index = vec![0usize; self.sizes.len()];
        let mut offsets = vec![0usize; self.steps.len()];
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let mut acc = zero;
            for _ in 0..self.inner {
                acc = acc.wrapping_add(term(&offsets));
                self.advance(&mut index, &mut offsets);
            }
            out.push(acc);
        }
        out
    }

    fn advance(&self, index: &mut [usize], offsets: &mut [usize]) {
        for d in (0..index.len()).rev() {
            index[d] += 1;
            offsets.iter_mut().zip(&self.steps).for_each(|(o, s)| *o += s[d]);
            if index[d] < self.sizes[d] {
                return;
            }
            offsets.iter_mut().zip(&self.steps).for_each(|(o, s)| *o -= s[d] * self.sizes[d]);
            index[d] = 0;
        }
    }
}

/// Addition that wraps for integers (like the dtype's arithmetic) and is plain for floats.
trait WrappingAdd {
    fn wrapping_add(self, other: Self) -> Self;
}

impl WrappingAdd for f64 {
    fn wrapping_add(self, other: f64) -> f64 {
        self + other
    }
}

impl WrappingAdd for i64 {
    fn wrapping_add(self, other: i64) -> i64 {
        i64::wrapping_add(self, other)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::attr::Attr;

    fn einsum(eq: &str, inputs: &[&Tensor]) -> Tensor {
        run1("Einsum", &[("equation", Attr::Str(eq.into()))], inputs)
    }

    #[test]
    fn implicit_outputs_keep_letters_seen_once_in_ascii_order_after_the_ellipsis() {
        let spec = parse_einsum("...ij,jB", &[3, 2]).unwrap();
        // One ellipsis dim (id 0); letters i=9, j=10, B=27 shifted by one.
        assert_eq!(spec.operands, vec![vec![0, 9, 10], vec![10, 28]]);
        assert_eq!(spec.output, vec![0, 28, 9]);
        assert!(parse_einsum("ij->ik", &[2]).unwrap_err().to_string().contains("no input has"));
        assert!(parse_einsum("ij", &[3]).unwrap_err().to_string().contains("does not label"));
        assert!(parse_einsum("i,j", &[1]).unwrap_err().to_string().contains("2 input terms"));
    }

    #[test]
    fn matmul_transpose_trace_and_diagonal() {
        let a = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = f32t(&[3, 1], &[1.0, 0.0, -1.0]);
        // Rows of a dotted with [1, 0, -1]: 1-3 and 4-6.
        assert_eq!(f32s(&einsum("ij,jk->ik", &[&a, &b])), vec![-2.0, -2.0]);
        assert_eq!(f32s(&einsum("ij->ji", &[&a])), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        // Column sums: the label absent from the output is summed.
        assert_eq!(f32s(&einsum("ij->j", &[&a])), vec![5.0, 7.0, 9.0]);
        let m = f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(f32s(&einsum("ii", &[&m])), vec![5.0]);
        assert_eq!(f32s(&einsum("ii->i", &[&m])), vec![1.0, 4.0]);
    }

    #[test]
    fn batched_matmul_broadcasts_ellipsis_dims() {
        // Batch [2] against batch [1]: the single right-hand matrix serves both.
        let a = f32t(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
        let b = f32t(&[1, 2, 1], &[10.0, 1.0]);
        let y = einsum("...ij,...jk->...ik", &[&a, &b]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![2, 1, 1], vec![12.0, 34.0]));
        let i = typed(DType::I32, &[2], &[3, 4]);
        assert_eq!(ints(&einsum("i,i", &[&i, &i])), vec![25]);
    }
}

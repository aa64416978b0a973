//! Lowerings of the element-wise and row-wise ops hybrid decoders (Qwen3.5, LFM2) keep around
//! their recurrent layers, into OpenVINO's public opset: the L2 norm of the delta rule's q and k,
//! LinearAttentionGate's decay and beta, GatedRMSNorm, GatedAdd (the shared expert's gate) and
//! text-only M-RoPE. The recurrent layers themselves run on the host (see `partition`).

use crate::lower::Lower;
use crate::ops::form;
use crate::xml::Port;
use crate::LowerError;
use ir::Node;

impl Lower<'_> {
    /// LpNormalization with p = 2 along the last axis: `x / max(‖x‖, tiny)` (a zero row stays zero,
    /// as the host computes it); row-scaled (`L2NormRowScaled`), the same of `x / c` with `c`
    /// the row's power-of-two scale, so that Σx² stays in fp16's range.
    pub(crate) fn l2_norm(&mut self, n: &Node, row_scaled: bool) -> Result<Port, LowerError> {
        let mut x = self.input(n, 0)?;
        if row_scaled {
            let c = self.row_scale(&x)?;
            x = self.net.binary("Divide", &x, &c)?;
        }
        let rank = x.shape.len() as i64;
        let (axis, p) = (n.attrs.int_or("axis", -1)?, n.attrs.int_or("p", 2)?);
        if p != 2 || (axis != -1 && axis != rank - 1) {
            return Err(LowerError::Form(format!("LpNormalization with p = {p} along axis {axis}")));
        }
        let sq = self.net.binary("Multiply", &x, &x)?;
        let sum = self.net.reduce_last(self.bin, "ReduceSum", &sq);
        let norm = self.net.unary("Sqrt", &sum);
        let floor = if row_scaled { ir::fused::ROOT_FLOOR as f32 } else { f32::MIN_POSITIVE };
        let tiny = self.scalar(floor);
        let norm = self.net.binary("Maximum", &norm, &tiny)?;
        Ok(self.net.binary("Divide", &x, &norm)?)
    }

    /// LinearAttentionGate: the log decay `scale · softplus(a + dt_bias)` and, when asked for,
    /// `beta = σ(b)`.
    pub(crate) fn linear_attention_gate(&mut self, n: &Node) -> Result<Vec<Port>, LowerError> {
        let (a, bias, scale) = (self.input(n, 0)?, self.input(n, 1)?, self.input(n, 2)?);
        let x = self.net.binary("Add", &a, &bias)?;
        let sp = self.softplus(&x)?;
        let decay = self.net.binary("Multiply", &sp, &scale)?;
        if n.outputs.len() < 2 {
            return Ok(vec![decay]);
        }
        let b = self.input(n, 3)?;
        Ok(vec![decay, self.net.unary("Sigmoid", &b)])
    }

    /// `max(x, 0) + ln(1 + e^−|x|)`, which neither overflows nor loses small values.
    fn softplus(&mut self, x: &Port) -> Result<Port, LowerError> {
        let zero = self.scalar(0.0);
        let one = self.scalar(1.0);
        let pos = self.net.binary("Maximum", x, &zero)?;
        let abs = self.net.unary("Abs", x);
        let neg = self.net.unary("Negative", &abs);
        let e = self.net.unary("Exp", &neg);
        let e1 = self.net.binary("Add", &e, &one)?;
        let log = self.net.unary("Log", &e1);
        Ok(self.net.binary("Add", &pos, &log)?)
    }

    /// GatedRMSNorm: each group of `c` values (the scale's width) of a row normalised (row-scaled
    /// per group for `GatedRmsNormRowScaled`), scaled, and multiplied by silu(gate) (or σ(gate)).
    pub(crate) fn gated_rms_norm(&mut self, n: &Node, row_scaled: bool) -> Result<Port, LowerError> {
        let (x, gamma, gate) = (self.input(n, 0)?, self.input(n, 1)?, self.input(n, 2)?);
        let eps = n.attrs.float_or("epsilon", 1e-5)?;
        let silu = match n.attrs.str("activation")?.unwrap_or("silu") {
            "silu" | "swish" => true,
            "sigmoid" => false,
            a => return Err(LowerError::Form(format!("GatedRMSNorm activation {a:?}"))),
        };
        let c = gamma.shape.iter().product::<usize>();
        let w = *x.shape.last().ok_or_else(|| form("GatedRMSNorm of a scalar"))?;
        if c == 0 || w % c != 0 || gate.shape != x.shape {
            return Err(LowerError::Form(format!("GatedRMSNorm of {:?} by a scale of {c}", x.shape)));
        }
        let mut groups = x.shape.clone();
        *groups.last_mut().unwrap() = w / c;
        groups.push(c);
        let xg = self.net.reshape(self.bin, &x, &groups);
        let gamma = self.net.reshape(self.bin, &gamma, &[c]);
        let y = self.rms_norm(&xg, &gamma, eps, row_scaled)?;
        let y = self.net.reshape(self.bin, &y, &x.shape);
        let sg = self.net.unary("Sigmoid", &gate);
        let act = if silu { self.net.binary("Multiply", &gate, &sg)? } else { sg };
        Ok(self.net.binary("Multiply", &y, &act)?)
    }

    /// GatedAdd without a gate projection: `x + y · gate`, one gate per row.
    pub(crate) fn gated_add(&mut self, n: &Node) -> Result<Port, LowerError> {
        if n.inputs.get(3).copied().flatten().is_some() {
            return Err(form("GatedAdd with a gate projection"));
        }
        let (x, y, gate) = (self.input(n, 0)?, self.input(n, 1)?, self.input(n, 2)?);
        let yg = self.net.binary("Multiply", &y, &gate)?;
        Ok(self.net.binary("Add", &x, &yg)?)
    }

    /// Text-only M-RoPE of `[1, T, heads·head]`: the first `2·half` values of each head rotate
    /// by halves with the cos/sin rows of the tokens' positions (`[1, 1, T, half]`, fed by the
    /// host), the rest pass through.
    pub(crate) fn m_rope(&mut self, n: &Node) -> Result<Port, LowerError> {
        if n.attrs.int_or("interleaved", 0)? != 0 || n.attrs.int_or("is_packed_batching", 0)? != 0 {
            return Err(form("interleaved or packed M-RoPE"));
        }
        let x = self.input(n, 0)?;
        let (c, s) = (self.input(n, 2)?, self.input(n, 3)?);
        let heads = n.attrs.int_or("num_heads", 0)?.max(0) as usize;
        let (t, w, half) = (x.shape[1], x.shape[2], *c.shape.last().unwrap_or(&0));
        let head = w.checked_div(heads).unwrap_or(0);
        if x.shape.len() != 3 || heads == 0 || head * heads != w || half == 0 || 2 * half > head {
            return Err(LowerError::Form(format!("M-RoPE of {:?} with {heads} heads and {half} rows", x.shape)));
        }
        let xh = self.net.reshape(self.bin, &x, &[1, t, heads, head]);
        let c = self.net.reshape(self.bin, &c, &[1, t, 1, half]);
        let s = self.net.reshape(self.bin, &s, &[1, t, 1, half]);
        let x1 = self.net.slice(self.bin, &xh, 3, 0, half);
        let x2 = self.net.slice(self.bin, &xh, 3, half, 2 * half);
        let (x1c, x2s) = (self.net.binary("Multiply", &x1, &c)?, self.net.binary("Multiply", &x2, &s)?);
        let (x2c, x1s) = (self.net.binary("Multiply", &x2, &c)?, self.net.binary("Multiply", &x1, &s)?);
        let y1 = self.net.binary("Subtract", &x1c, &x2s)?;
        let y2 = self.net.binary("Add", &x2c, &x1s)?;
        let mut parts = vec![y1, y2];
        if 2 * half < head {
            parts.push(self.net.slice(self.bin, &xh, 3, 2 * half, head));
        }
        let refs: Vec<&Port> = parts.iter().collect();
        let y = self.net.concat(&refs, 3);
        Ok(self.net.reshape(self.bin, &y, &[1, t, w]))
    }
}

//! Reproducible test values without a dependency.

/// xorshift64.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in ±[1, 2) times 2^e, e uniform in `-spread..spread`.
    pub fn spread(&mut self, spread: i32) -> f32 {
        let bits = self.next();
        let m = 1.0 + (bits >> 40) as f32 / (1u64 << 24) as f32;
        let e = (bits % (2 * spread as u64)) as i32 - spread;
        let sign = if bits & (1 << 20) == 0 { 1.0 } else { -1.0 };
        sign * m * 2f32.powi(e)
    }
}

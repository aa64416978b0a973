//! Weights by reference: the graph names a weight, the store holds its bytes, which usually are a
//! slice of a memory-mapped model or external-data file (`bytes::Bytes` over the mapping), so
//! importing a model never copies its weights.

use crate::dtype::DType;
use crate::tensor::{Tensor, TensorError};
use bytes::Bytes;
use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WeightId(pub u32);

#[derive(Clone)]
pub struct Weight {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Little-endian bytes in ONNX `raw_data` layout; exactly `dtype.storage_bytes(numel)` long.
    pub bytes: Bytes,
    digest: OnceLock<u64>,
}

impl Weight {
    pub fn new(name: String, dtype: DType, shape: Vec<usize>, bytes: Bytes) -> Weight {
        Weight { name, dtype, shape, bytes, digest: OnceLock::new() }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// A short content digest for printing (computed once, on first use).
    pub fn digest(&self) -> u64 {
        *self.digest.get_or_init(|| content_digest(&self.bytes))
    }

    /// Decodes the weight into a concrete tensor (copies; for the evaluator and small constants).
    pub fn to_tensor(&self) -> Result<Tensor, TensorError> {
        Tensor::from_le_bytes(self.dtype, self.shape.clone(), &self.bytes)
    }
}

/// Cloning a store clones `Bytes` handles, never weight bytes (a graph pass that adds weights
/// clones the store it shares with earlier graphs through `Arc::make_mut`).
#[derive(Clone, Default)]
pub struct WeightStore {
    weights: Vec<Weight>,
}

impl WeightStore {
    pub fn add(&mut self, w: Weight) -> WeightId {
        self.weights.push(w);
        WeightId(self.weights.len() as u32 - 1)
    }

    pub fn get(&self, id: WeightId) -> &Weight {
        &self.weights[id.0 as usize]
    }

    /// Gives weight `id` another name (its bytes stay where they are).
    pub fn rename(&mut self, id: WeightId, name: String) {
        self.weights[id.0 as usize].name = name;
    }

    pub fn iter(&self) -> impl Iterator<Item = (WeightId, &Weight)> {
        self.weights.iter().enumerate().map(|(i, w)| (WeightId(i as u32), w))
    }

    pub fn len(&self) -> usize {
        self.weights.len()
    }

    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }
}

/// A 64-bit content digest: FNV-1a over 8-byte little-endian words (and the tail bytes), then a
/// final avalanche. Fast enough to run over hundreds of MiB; not cryptographic.
pub fn content_digest(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        h = (h ^ u64::from_le_bytes(c.try_into().unwrap())).wrapping_mul(PRIME);
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(PRIME);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::content_digest;

    #[test]
    fn digest_sees_every_byte_and_the_length() {
        let a = vec![0u8; 4096];
        let mut b = a.clone();
        b[4095] = 1;
        assert_ne!(content_digest(&a), content_digest(&b));
        assert_ne!(content_digest(&a[..8]), content_digest(&a[..16]));
        assert_eq!(content_digest(&a), content_digest(&a.clone()));
    }
}

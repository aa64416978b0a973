//! Rule families for npuc's e-graph (one file per family): `qdq`, `weight-only`, `rmsnorm`,
//! `rope`, `silu-gate`, `attention`, `fp16-rescale`.
//!
//! Not built yet. This crate will hold, per family, a `//!` header stating the identity and the
//! exporter patterns it recognises, an aligned table of directional egg rewrites with named
//! conditions, and the family's own tests. It will depend on `ir` (the egg `Language` and
//! `Analysis`) and nothing else of npuc's.

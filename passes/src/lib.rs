//! The pass pipeline: the `Pass` trait (name, contract, run), one pipeline per target supplied by
//! a `Target` trait, the driver that checks the graph after every pass and can stop after a named
//! one, and the cost models extraction uses.
//!
//! Not built yet. It will depend on `ir` and `rewrites`; the code generators depend on it.

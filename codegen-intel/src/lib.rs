//! Code generation for Intel NPUs: weightless OpenVINO IR v11 segments cut at attention, static
//! token-block shapes, symmetric int4/int8 decompression subgraphs, and one shared weights file.
//!
//! Not built yet. It will depend on `ir` and `passes`.

//! vigil sim: a deterministic fleet simulator driving vigil-core's policies.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cli;

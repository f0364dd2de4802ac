//! vigil lb: an HTTP load balancer that ejects failed servers fast and fails open.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cli;

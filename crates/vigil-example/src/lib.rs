//! An example service built with the vigil library.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cli;

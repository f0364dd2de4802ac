//! Fuzzes `vigil_core::http1`: the response-head framing and the chunked decoder that the
//! load balancer's upstream client and the controller's prober feed with bytes from
//! targets.
//!
//! Invariants: never panics; a complete head's length lies within the input and every
//! header field handed over lies within the head; the chunked decoder, fed the input in
//! pieces of any size, consumes within what it was given, returns data ranges inside it,
//! never loops without progress, and decodes the same body whatever the piece size.
#![no_main]

include!("../checks/http1_response.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));

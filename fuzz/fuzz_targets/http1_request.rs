//! Fuzzes `vigil_core::http1::parse_request` (the load balancer's client side feeds it
//! whatever clients send) and the lb's rewrite of a parsed head into the head its
//! targets get (`vigil_lb::downstream::forwarded_head`).
//!
//! Invariants: never panics; a complete head lies within the input, and no shorter
//! prefix of it parses as complete (what a client sends in pieces is read the same);
//! `host` is the Host field's value; a chunked body never comes with a
//! `Content-Length` field or in HTTP/1.0. The forwarded head parses again as a complete
//! request with the same method, no body framing of its own (the lb writes that from the
//! body it read), no hop-by-hop field, and one `X-Forwarded-For` ending with the
//! client's address, and no field whose name has an underscore (dropped by default):
//! nothing a client writes can smuggle a second request past it.
#![no_main]

include!("../checks/http1_request.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));

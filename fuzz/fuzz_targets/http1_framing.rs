//! A differential fuzz target for request framing: where does a request end, and what
//! is its body? vigil (`vigil_core::http1::parse_request`, then the body read by
//! `Content-Length` or decoded by `ChunkedDecoder`, fed in pieces as a socket would)
//! against an oracle written here from RFC 9112 sections 6 and 7.1 on top of
//! `httparse`'s `Request::parse` for the head. (vigil parses heads with httparse too, so
//! the head is not where the two differ: the framing decisions and the chunked body
//! are vigil's own code, and the oracle's are written separately, plainly, without
//! `httparse::parse_chunk_size`, which takes an empty line for the last chunk.)
//!
//! A request smuggling bug is two readers disagreeing on where a message ends. So:
//! - vigil accepting a message (its head, body and end) that the oracle refuses, or
//!   reads with another body or end, is a failure;
//! - vigil waiting for more bytes where the oracle already has a complete message is a
//!   failure (vigil would take the next request's bytes for this one's);
//! - vigil refusing what the oracle accepts is allowed (refusing is always safe: the
//!   connection closes); vigil is stricter on purpose in several places (docs/lb.md:
//!   `Content-Length: 2, 2`, a chunk line over 4 KiB, chunked twice, ...).
//!
//! The first input byte sets how many bytes each read delivers to the chunked decoder.
#![no_main]

include!("../checks/http1_framing.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));

//! Connection buffers, kept per worker thread while their connections are idle: client
//! connections waiting for their next request and pooled target connections
//! ([`crate::upstream`]) give theirs here.
//!
//! Floor 7, shared (floors: the crate doc): imports no other module of this crate.
//!
//! A keep-alive connection waiting for its next request holds no buffer: it gives its
//! read and write buffers here the moment it has nothing to read, and takes one back
//! when the socket has bytes (nginx frees its header buffer the same way). A busy
//! worker then owns about as many buffers as it has requests in progress, not as many
//! as it has connections, and taking one back costs no allocation: the last one given
//! is the first taken (still in the CPU's cache).
//!
//! A worker thread runs its connections' tasks (`daemon.rs`: one runtime per thread), so
//! the spare list is the thread's own: no lock, no atomic. At most [`KEPT`] of each kind
//! are kept, none over [`LARGEST`] bytes (a buffer grown by a large head or body is
//! freed instead).

use bytes::BytesMut;
use std::cell::RefCell;

/// A client connection's read buffer's first size: most request heads fit (a load
/// generator's are 40 bytes, a browser's 0.5-2 KiB; nginx's `client_header_buffer_size`
/// is 1k too). A larger head grows it once (`body::HEAD_RESERVE`), a body reads in
/// large pieces. Smaller than a page: in a burst, four requests in flight share the page
/// that one used to take (docs/lb.md, "A burst").
pub const CLIENT_READ: usize = 1024;
/// A pooled target connection's read buffer, taken again for its next exchange: a
/// response head and a small body, with room to spare (`body::MIN_READ_ROOM`) so it
/// is not grown at once. (A new connection starts with its own 16 KiB buffer.)
pub const TARGET_READ: usize = 4 * 1024;
/// A write buffer's first size: a response head.
pub const WRITE: usize = 1024;
/// Spare buffers kept per kind and worker thread.
pub const KEPT: usize = 128;
/// Larger buffers are freed, not kept.
pub const LARGEST: usize = 32 * 1024;

#[derive(Default)]
struct Spare {
    reads: Vec<BytesMut>,
    writes: Vec<Vec<u8>>,
}

thread_local! {
    static SPARE: RefCell<Spare> = RefCell::default();
}

/// An empty read buffer with room for `room` bytes ([`CLIENT_READ`] or
/// [`TARGET_READ`]). Clients and targets share the spare list: a kept buffer smaller
/// than `room` grows once and stays that size.
pub fn take_read(room: usize) -> BytesMut {
    let kept = SPARE.with(|s| s.borrow_mut().reads.pop());
    match kept {
        Some(mut buf) => {
            // Room from the start again (a buffer advanced past a head keeps its
            // allocation; one still shared with a body forwarded reallocates).
            buf.reserve(room);
            buf
        }
        None => BytesMut::with_capacity(room),
    }
}

/// Gives an idle connection's read buffer back (its bytes, if any, are dropped: give
/// only an empty one).
pub fn give_read(mut buf: BytesMut) {
    debug_assert!(buf.is_empty(), "a read buffer given back with bytes in it");
    if buf.capacity() == 0 || buf.capacity() > LARGEST {
        return;
    }
    buf.clear();
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.reads.len() < KEPT {
            s.reads.push(buf);
        }
    });
}

/// An empty write buffer.
pub fn take_write() -> Vec<u8> {
    SPARE
        .with(|s| s.borrow_mut().writes.pop())
        .unwrap_or_else(|| Vec::with_capacity(WRITE))
}

/// Gives an idle connection's write buffer back.
pub fn give_write(mut buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > LARGEST {
        return;
    }
    buf.clear();
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.writes.len() < KEPT {
            s.writes.push(buf);
        }
    });
}

/// Spare buffers this thread holds now: (read, write).
#[cfg(test)]
fn held() -> (usize, usize) {
    SPARE.with(|s| {
        let s = s.borrow();
        (s.reads.len(), s.writes.len())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf;

    #[test]
    fn a_buffer_given_back_is_the_next_one_taken_with_its_room_from_the_start() {
        std::thread::spawn(|| {
            let mut buf = take_read(TARGET_READ);
            assert!(buf.capacity() >= TARGET_READ);
            buf.extend_from_slice(&[b'x'; 3000]);
            let at = buf.as_ptr() as usize;
            buf.advance(3000);
            give_read(buf);
            assert_eq!(held(), (1, 0));
            let again = take_read(TARGET_READ);
            assert_eq!(held(), (0, 0));
            assert!(
                again.capacity() >= TARGET_READ,
                "room from the start: {}",
                again.capacity()
            );
            assert_eq!(
                again.as_ptr() as usize,
                at,
                "the same allocation, not a new one"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn large_buffers_are_freed_and_at_most_kept_are_kept() {
        std::thread::spawn(|| {
            give_read(BytesMut::with_capacity(LARGEST * 2));
            give_write(Vec::with_capacity(LARGEST * 2));
            give_read(BytesMut::new());
            assert_eq!(held(), (0, 0), "large or empty ones are not kept");
            for _ in 0..KEPT + 10 {
                give_read(BytesMut::with_capacity(TARGET_READ));
                give_write(Vec::with_capacity(WRITE));
            }
            assert_eq!(held(), (KEPT, KEPT));
            let w = take_write();
            assert!(w.is_empty() && w.capacity() >= WRITE);
        })
        .join()
        .unwrap();
    }
}

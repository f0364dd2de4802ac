//! Idle keep-alive client connections, parked off the runtime.
//!
//! Floor 7, shared (floors: the crate doc): imports no other module of this crate.
//!
//! A client connection is a task ([`crate::downstream`]). While it waits for its next request
//! it holds no buffer ([`crate::spare`]), but the task itself, its timer and the
//! runtime's registration of its socket still cost about 1.5 KB of resident memory:
//! tokio aligns both to cache lines. nginx keeps an idle keep-alive connection in
//! about 0.5 KB. So a connection idle for [`PARK_AFTER`] ends its task and leaves its
//! socket here: one per listener and worker thread, an epoll set of its own (mio)
//! that the worker's runtime watches as one file descriptor, and per connection its
//! socket, its client's address and its deadline (under 100 bytes beside the
//! kernel's). When the socket turns readable (the next request, or the client
//! closing), it goes back to the runtime and a new connection task serves it; when
//! its idle time (`timeouts.client_header`, counted from the moment it went idle)
//! runs out, it is closed, as an idle connection always was; when the balancer drains,
//! every parked connection is closed at once (there is no request to finish).
//!
//! A connection busy with requests never comes here: one idle for less than
//! [`PARK_AFTER`] keeps its task, so a keep-alive client with a steady stream of
//! requests costs nothing more than before. Parking and waking cost four
//! `epoll_ctl` calls.
//!
//! Measured by `bench/lb/memory.py` (docs/lb.md).

use slab::Slab;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long a keep-alive connection waits with its task before it is parked.
pub const PARK_AFTER: Duration = Duration::from_millis(250);

/// Events taken from the epoll set per wake-up.
const EVENTS: usize = 256;

/// A connection handed to the park by its task, with `K`, what it keeps while parked
/// and gets back when woken (its place under the listener's connection limit).
#[derive(Debug)]
pub struct Parked<K = ()> {
    /// Its socket, taken off the runtime (`tokio::net::TcpStream::into_std`).
    pub tcp: std::net::TcpStream,
    /// The client.
    pub peer: SocketAddr,
    /// When it went idle: its idle time runs from then.
    pub idle_since: Instant,
    /// Kept with it, dropped when it closes.
    pub keep: K,
}

/// Where a connection task parks its connection.
pub type Sender<K = ()> = mpsc::UnboundedSender<Parked<K>>;

#[derive(Debug)]
struct Slot<K> {
    tcp: mio::net::TcpStream,
    peer: SocketAddr,
    keep: K,
    /// Tells a slot from a later one at the same key (the expiry queue keeps keys).
    serial: u64,
}

/// The parked connections of one listener on one worker thread.
#[derive(Debug)]
pub struct Park<K = ()> {
    poll: AsyncFd<mio::Poll>,
    events: mio::Events,
    slots: Slab<Slot<K>>,
    /// Deadlines in the order connections were parked: they went idle in that order
    /// (give or take the channel), so the front is the next to expire.
    expiry: VecDeque<(Instant, usize, u64)>,
    serial: u64,
    idle_timeout: Duration,
    rx: mpsc::UnboundedReceiver<Parked<K>>,
    tx: Sender<K>,
}

impl<K> Park<K> {
    /// A park for connections that close after `idle_timeout` without a request.
    /// Must be called within the worker's runtime.
    pub fn new(idle_timeout: Duration) -> io::Result<Park<K>> {
        // Deprecated because a generic `T` may close or swap its descriptor while
        // registered; a `mio::Poll` owns its epoll descriptor for its whole life and
        // the `AsyncFd` owns the `Poll`, which is the condition the unsafe
        // `register_with_interest` asks for (the workspace forbids `unsafe`).
        #[allow(deprecated)]
        let poll = AsyncFd::with_interest(mio::Poll::new()?, tokio::io::Interest::READABLE)?;
        let (tx, rx) = mpsc::unbounded_channel();
        Ok(Park {
            poll,
            events: mio::Events::with_capacity(EVENTS),
            slots: Slab::new(),
            expiry: VecDeque::new(),
            serial: 0,
            idle_timeout,
            rx,
            tx,
        })
    }

    /// For connection tasks to park their connection with.
    pub fn sender(&self) -> Sender<K> {
        self.tx.clone()
    }

    /// Connections parked now.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// No connection is parked.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Parks what arrives, closes what expires, and returns the connections whose
    /// socket turned readable (at least one), taken out of the park. Cancel-safe: a
    /// connection is either still parked or returned.
    pub async fn woken(&mut self) -> Vec<(std::net::TcpStream, SocketAddr, K)> {
        loop {
            let next_expiry = self.expiry.front().map(|e| e.0);
            tokio::select! {
                Some(p) = self.rx.recv() => self.insert(p),
                ready = self.poll.readable_mut() => {
                    let mut guard = match ready {
                        Ok(g) => g,
                        Err(e) => {
                            // The epoll set itself failed: nothing parked can be watched.
                            tracing::warn!("parked connections lost their epoll set: {e}");
                            self.close_all();
                            continue;
                        }
                    };
                    if let Err(e) = guard.get_inner_mut().poll(&mut self.events, Some(Duration::ZERO)) {
                        if e.kind() != io::ErrorKind::Interrupted {
                            tracing::warn!("polling parked connections failed: {e}");
                        }
                        continue;
                    }
                    let n = self.events.iter().count();
                    if n < EVENTS {
                        // All taken; readiness arriving since is kept by tokio.
                        guard.clear_ready();
                    }
                    drop(guard);
                    let woken = self.take_ready();
                    if !woken.is_empty() {
                        return woken;
                    }
                }
                _ = tokio::time::sleep_until(next_expiry.unwrap_or_else(Instant::now)),
                    if next_expiry.is_some() => self.expire(Instant::now()),
            }
        }
    }

    fn insert(&mut self, p: Parked<K>) {
        let deadline = p.idle_since + self.idle_timeout;
        if deadline <= Instant::now() {
            return; // its time is up already: dropped, closed
        }
        let mut tcp = mio::net::TcpStream::from_std(p.tcp);
        let entry = self.slots.vacant_entry();
        let key = entry.key();
        // Readable now or later: epoll reports bytes already there when added.
        if let Err(e) = self.poll.get_ref().registry().register(
            &mut tcp,
            mio::Token(key),
            mio::Interest::READABLE,
        ) {
            tracing::debug!(peer = %p.peer, "could not park an idle connection, closed: {e}");
            return;
        }
        self.serial += 1;
        entry.insert(Slot {
            tcp,
            peer: p.peer,
            keep: p.keep,
            serial: self.serial,
        });
        self.expiry.push_back((deadline, key, self.serial));
    }

    fn take_ready(&mut self) -> Vec<(std::net::TcpStream, SocketAddr, K)> {
        let mut woken = Vec::new();
        for event in self.events.iter() {
            let Some(mut slot) = self.slots.try_remove(event.token().0) else {
                continue;
            };
            let _ = self.poll.get_ref().registry().deregister(&mut slot.tcp);
            let tcp: std::net::TcpStream = slot.tcp.into();
            // A client that closed (or reset) its idle connection: closed here, without
            // a task (a crowd of clients leaving would otherwise start one each).
            match tcp.peek(&mut [0u8]) {
                Ok(0) => continue,
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => continue,
                _ => woken.push((tcp, slot.peer, slot.keep)),
            }
        }
        woken
    }

    /// Closes the connections whose idle time is up at `now`.
    fn expire(&mut self, now: Instant) {
        while let Some(&(deadline, key, serial)) = self.expiry.front() {
            if deadline > now {
                break;
            }
            self.expiry.pop_front();
            if self.slots.get(key).is_some_and(|s| s.serial == serial) {
                let mut slot = self.slots.remove(key);
                let _ = self.poll.get_ref().registry().deregister(&mut slot.tcp);
            }
        }
        if self.slots.is_empty() {
            self.expiry.clear();
        }
    }

    fn close_all(&mut self) {
        self.slots.clear();
        self.expiry.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn pair(listener: &std::net::TcpListener) -> (std::net::TcpStream, std::net::TcpStream) {
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        (client, server)
    }

    #[tokio::test(start_paused = true)]
    async fn a_parked_connection_wakes_on_bytes_and_closes_when_its_idle_time_is_up() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut park = Park::new(Duration::from_secs(10)).unwrap();
        let tx = park.sender();
        let (mut quiet_client, quiet) = pair(&listener);
        let (mut busy_client, busy) = pair(&listener);
        let idle_since = Instant::now();
        for tcp in [quiet, busy] {
            let peer = tcp.peer_addr().unwrap();
            tx.send(Parked {
                tcp,
                peer,
                idle_since,
                keep: (),
            })
            .unwrap();
        }
        // Bytes on one: it comes back with them unread, the other stays parked.
        busy_client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let woken = tokio::time::timeout(Duration::from_secs(5), park.woken())
            .await
            .expect("the connection with bytes wakes");
        assert_eq!(woken.len(), 1);
        let (mut tcp, peer, ()) = woken.into_iter().next().unwrap();
        assert_eq!(peer, busy_client.local_addr().unwrap());
        assert_eq!(park.len(), 1, "the quiet one is still parked");
        tcp.set_nonblocking(false).unwrap();
        let mut got = [0u8; 18];
        tcp.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"GET / HTTP/1.1\r\n\r\n");

        // The quiet one: closed once 10 s have passed since it went idle, not before.
        let wait = tokio::time::timeout(Duration::from_secs(9), park.woken()).await;
        assert!(wait.is_err(), "nothing wakes before its idle time is up");
        assert_eq!(park.len(), 1, "still parked after 9 s");
        let _ = tokio::time::timeout(Duration::from_secs(2), park.woken()).await;
        assert!(park.is_empty(), "closed after 10 s");
        quiet_client
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(
            quiet_client.read(&mut buf).unwrap(),
            0,
            "the client sees it close"
        );
    }

    #[tokio::test]
    async fn a_client_closing_its_parked_connection_closes_it_there_and_dropping_the_park_closes_the_rest()
     {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut park = Park::new(Duration::from_secs(60)).unwrap();
        let (closing_client, a) = pair(&listener);
        let (mut kept_client, b) = pair(&listener);
        for tcp in [a, b] {
            let peer = tcp.peer_addr().unwrap();
            park.sender()
                .send(Parked {
                    tcp,
                    peer,
                    idle_since: Instant::now(),
                    keep: (),
                })
                .unwrap();
        }
        // Runs the park until `done`; nothing may wake meanwhile.
        async fn run_until(park: &mut Park, done: impl Fn(&Park) -> bool) {
            let run = async {
                while !done(park) {
                    let woken = tokio::time::timeout(Duration::from_millis(10), park.woken()).await;
                    assert!(woken.is_err(), "a connection was handed back: {woken:?}");
                }
            };
            tokio::time::timeout(Duration::from_secs(5), run)
                .await
                .expect("the park got there");
        }
        run_until(&mut park, |p| p.len() == 2).await;
        // A close is readable: the park closes it itself, nothing wakes.
        drop(closing_client);
        run_until(&mut park, |p| p.len() < 2).await;
        assert_eq!(park.len(), 1, "the kept one stays");
        drop(park);
        kept_client
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(
            kept_client.read(&mut buf).unwrap(),
            0,
            "closed with the park"
        );
    }
}

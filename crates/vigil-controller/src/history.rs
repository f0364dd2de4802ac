//! A target's recent probes, as the API shows them, in a compact ring.
//!
//! Every target keeps its last `probe.history` probes (10 by default) for the API and
//! dashboard. At 10,000 targets that is 100,000 records, so each is packed into 16
//! bytes: time, duration in microseconds, HTTP status, verdict, and whether it has
//! words (what failed). The words, which passing probes do not have, wait in a list of
//! their own in the records' order, allocated only while a record has some. The ring
//! is one allocation of exactly `history` records, made on the first probe.

use crate::prober::ProbeRecord;
use std::collections::VecDeque;
use vigil_core::Status;

/// One probe, packed (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Packed {
    at_ms: i64,
    /// Microseconds, saturating at about 71 minutes (probes time out long before).
    duration_us: u32,
    /// 0: no HTTP status came back.
    status: u16,
    /// Bit 0: passed; bits 1-2: the report's status (0 none, 1 pass, 2 warn, 3 fail);
    /// bit 3: its words are in the details list.
    flags: u8,
}

const HAS_DETAIL: u8 = 8;

impl Packed {
    fn pack(r: &ProbeRecord) -> Packed {
        let health = match r.health {
            None => 0,
            Some(Status::Pass) => 1,
            Some(Status::Warn) => 2,
            Some(Status::Fail) => 3,
        };
        Packed {
            at_ms: r.at_ms,
            // `as` saturates: a negative or huge duration cannot wrap.
            duration_us: (r.duration_ms * 1000.0).round() as u32,
            status: r.status.unwrap_or(0),
            flags: u8::from(r.ok)
                | (health << 1)
                | if r.detail.is_empty() { 0 } else { HAS_DETAIL },
        }
    }

    fn has_detail(&self) -> bool {
        self.flags & HAS_DETAIL != 0
    }

    fn unpack(&self, detail: Option<&str>) -> ProbeRecord {
        ProbeRecord {
            at_ms: self.at_ms,
            ok: self.flags & 1 != 0,
            duration_ms: f64::from(self.duration_us) / 1000.0,
            status: (self.status != 0).then_some(self.status),
            health: match (self.flags >> 1) & 3 {
                1 => Some(Status::Pass),
                2 => Some(Status::Warn),
                3 => Some(Status::Fail),
                _ => None,
            },
            detail: detail.map_or_else(String::new, str::to_string),
        }
    }
}

/// The last few probes of a target, oldest first.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// At most `keep` records; once full, `head` is the oldest and is overwritten next.
    ring: Vec<Packed>,
    head: usize,
    /// The words of the records that have some, oldest first (None: no record has).
    /// Boxed on purpose: one word per target instead of four, for a list most targets
    /// never need.
    #[allow(clippy::box_collection)]
    details: Option<Box<VecDeque<Box<str>>>>,
}

impl History {
    /// Adds a probe, dropping the oldest beyond `keep` (at least 1).
    pub fn push(&mut self, record: ProbeRecord, keep: usize) {
        let keep = keep.max(1);
        let packed = Packed::pack(&record);
        if self.ring.len() == keep {
            let old = std::mem::replace(&mut self.ring[self.head], packed);
            self.head = (self.head + 1) % keep;
            if old.has_detail() {
                self.drop_oldest_detail();
            }
        } else {
            if self.head != 0 || self.ring.len() > keep {
                // `keep` changed (a reload): lay the ring out afresh, oldest first.
                self.ring.rotate_left(self.head);
                self.head = 0;
                let excess = (self.ring.len() + 1).saturating_sub(keep);
                for old in self.ring.drain(..excess).collect::<Vec<_>>() {
                    if old.has_detail() {
                        self.drop_oldest_detail();
                    }
                }
                self.ring.shrink_to(keep);
            }
            if self.ring.capacity() < keep {
                self.ring.reserve_exact(keep - self.ring.len());
            }
            self.ring.push(packed);
        }
        if packed.has_detail() {
            self.details
                .get_or_insert_with(Default::default)
                .push_back(record.detail.into_boxed_str());
        }
    }

    fn drop_oldest_detail(&mut self) {
        if let Some(d) = &mut self.details {
            d.pop_front();
            if d.is_empty() {
                self.details = None;
            }
        }
    }

    /// The records oldest first, each with its words.
    fn each(&self) -> impl Iterator<Item = ProbeRecord> + '_ {
        let (newer, older) = self.ring.split_at(self.head);
        let mut details = self.details.iter().flat_map(|d| d.iter());
        older.iter().chain(newer).map(move |p| {
            let detail = if p.has_detail() {
                details.next().map(|d| &**d)
            } else {
                None
            };
            p.unpack(detail)
        })
    }

    /// The probes, oldest first.
    pub fn records(&self) -> Vec<ProbeRecord> {
        self.each().collect()
    }

    /// The latest probe.
    pub fn last(&self) -> Option<ProbeRecord> {
        let i = if self.head == 0 {
            self.ring.len().checked_sub(1)?
        } else {
            self.head - 1
        };
        let p = &self.ring[i];
        let detail = if p.has_detail() {
            self.details.as_ref().and_then(|d| d.back()).map(|d| &**d)
        } else {
            None
        };
        Some(p.unpack(detail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: i64) -> ProbeRecord {
        ProbeRecord {
            at_ms: i,
            ok: i % 2 == 0,
            duration_ms: 1.5,
            status: (i % 3 != 0).then_some(503),
            health: [
                None,
                Some(Status::Pass),
                Some(Status::Warn),
                Some(Status::Fail),
            ][(i % 4) as usize],
            detail: if i % 2 == 0 {
                String::new()
            } else {
                format!("failing: disk:{i}")
            },
        }
    }

    fn times(h: &History) -> Vec<i64> {
        h.records().iter().map(|r| r.at_ms).collect()
    }

    #[test]
    fn a_record_comes_back_as_it_went_in() {
        let mut h = History::default();
        for i in 0..8 {
            h.push(rec(i), 10);
        }
        assert_eq!(h.records(), (0..8).map(rec).collect::<Vec<_>>());
        assert_eq!(h.last(), Some(rec(7)));
        assert_eq!(std::mem::size_of::<Packed>(), 16);
    }

    #[test]
    fn the_ring_keeps_the_newest_in_order_and_follows_a_new_size() {
        let mut h = History::default();
        assert_eq!(h.last(), None);
        for i in 0..25 {
            h.push(rec(i), 10);
        }
        assert_eq!(times(&h), (15..25).collect::<Vec<_>>());
        assert_eq!(h.last().map(|r| r.at_ms), Some(24));
        assert_eq!(h.ring.capacity(), 10, "one allocation of exactly `keep`");
        h.push(rec(25), 4);
        assert_eq!(times(&h), vec![22, 23, 24, 25]);
        h.push(rec(26), 4);
        assert_eq!(times(&h), vec![23, 24, 25, 26]);
        h.push(rec(27), 6);
        h.push(rec(28), 6);
        h.push(rec(29), 6);
        assert_eq!(times(&h), vec![24, 25, 26, 27, 28, 29]);
        assert_eq!(h.last().map(|r| r.at_ms), Some(29));
        // Every record still has its own words after all that.
        assert_eq!(h.records(), (24..30).map(rec).collect::<Vec<_>>());
        assert_eq!(
            h.details.as_ref().map_or(0, |d| d.len()),
            3,
            "odd ones only"
        );
        for i in 30..40 {
            h.push(rec(i * 2), 6);
        }
        assert!(h.details.is_none(), "no words kept once no record has any");
    }
}

//! Detection bookkeeping: when a server's harm started, and when it was cured.

use super::Sim;
use vigil_core::Time;

impl<'a> Sim<'a> {
    pub(super) fn harm(&mut self, i: usize, at: Time) {
        if self.pending_detect[i].is_none() {
            self.pending_detect[i] = Some(at);
            self.pending_count += 1;
        }
    }

    pub(super) fn detect_tick(&mut self) {
        let now = self.now;
        for i in 0..self.pending_detect.len() {
            if let Some(at) = self.pending_detect[i]
                && now >= at
                && !self.in_service(i)
            {
                self.detect_times.push(now.since(at));
                self.pending_detect[i] = None;
                self.pending_count -= 1;
            }
        }
    }

    pub(super) fn cure(&mut self, i: usize) {
        if self.pending_detect[i].take().is_some() {
            self.pending_count -= 1;
        }
    }
}

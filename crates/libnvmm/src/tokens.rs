//! Sync tokens (SPEC §7 "sync … returns a time token (Lamport)"). The clock
//! ticks once per sync, so tokens are consecutive integers; token 0 is the
//! empty region of a fresh file. A token can be rolled back to while it is
//! live: at or above the horizon (garbage collection raises it, discarding
//! the oldest versions first) and not inside an interval that a rollback
//! abandoned.
//!
//! Retention (issue 24): garbage collection never discards any of the
//! newest `retain` live tokens ([`Tokens::retain`], `Options::retain_syncs`,
//! 2 by default: the last sync and the one before it). Keeping k tokens
//! leaves up to k + 1 versions of a page after collection (one run per
//! live token and one of unsynced writes), and a write-back may need one
//! more entry before anything can merge; with the table's three previous
//! versions per page that always fits for k ≤ 2 ([`MAX_RETAIN`]; k = 3
//! was tried and ran out of entries when every page had four versions).
//! Older tokens stay restorable while the version area has room.

use crate::entry::MAX_TIME;
use crate::error::{ErrorKind, NvmmError, Result};

/// At most this many abandoned intervals are remembered; beyond it the
/// horizon rises past the oldest.
pub const MAX_ROLLED_BACK: usize = 1024;

/// The most syncs a page table of three previous versions per page can
/// always keep restorable (see the module header).
pub const MAX_RETAIN: u64 = crate::table::VERSIONS_PER_PAGE - 1;

/// Syncs kept restorable unless asked otherwise: the last and the previous.
pub const DEFAULT_RETAIN: u64 = 2;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    /// The oldest token that can still be rolled back to.
    pub horizon: u64,
    /// The last committed token.
    pub last: u64,
    /// Abandoned intervals `(a, b]`: tokens in them were rolled back.
    pub rolled_back: Vec<(u64, u64)>,
    /// How many of the newest live tokens garbage collection must keep
    /// (an option of the open, not stored in the log; 0 counts as 1).
    pub retain: u64,
}

impl Tokens {
    /// The Lamport time of writes since the last sync: the next token.
    pub fn pending(&self) -> u64 {
        self.last + 1
    }

    pub fn next_token(&self) -> Result<u64> {
        let t = self.pending();
        if t > MAX_TIME {
            return Err(NvmmError::new(
                ErrorKind::Exhausted,
                format!(
                    "the 24-bit Lamport time is exhausted after {} syncs",
                    self.last
                ),
            ));
        }
        Ok(t)
    }

    fn skip_rolled_back(&self, mut t: u64) -> u64 {
        loop {
            let mut moved = false;
            for &(a, b) in &self.rolled_back {
                if a < t && t <= b {
                    t = b + 1;
                    moved = true;
                }
            }
            if !moved {
                return t;
            }
        }
    }

    pub fn is_live(&self, token: u64) -> bool {
        token >= self.horizon && token <= self.last && self.skip_rolled_back(token) == token
    }

    /// Whether a live token `t` with `lo <= t < hi` exists: versions written
    /// at `lo` and at `hi` are then told apart by some rollback.
    pub fn live_between(&self, lo: u64, hi: u64) -> bool {
        let t = self.skip_rolled_back(lo.max(self.horizon));
        t < hi && t <= self.last
    }

    /// The live token before `t`, if any.
    fn previous_live(&self, t: u64) -> Option<u64> {
        let mut p = t.checked_sub(1)?;
        while let Some(&(a, _)) = self.rolled_back.iter().find(|&&(a, b)| a < p && p <= b) {
            p = a;
        }
        (p >= self.horizon).then_some(p)
    }

    /// The oldest token the retention policy protects.
    pub fn oldest_retained(&self) -> u64 {
        let mut t = self.last;
        for _ in 1..self.retain.max(1) {
            match self.previous_live(t) {
                Some(p) => t = p,
                None => break,
            }
        }
        t
    }

    /// Why `token` cannot be rolled back to, or None if it is live: a
    /// sentence saying what to change.
    pub fn why_not_live(&self, token: u64) -> Option<String> {
        if self.is_live(token) {
            return None;
        }
        Some(if token > self.last {
            format!(
                "token {token} was never issued (the last sync's token is {})",
                self.last
            )
        } else if token < self.horizon {
            format!(
                "token {token} was collected: garbage collection keeps the newest {} syncs \
                 (retain_syncs, at most {MAX_RETAIN}) and older ones while the page table's \
                 version area has room; the oldest restorable token is {}. To roll back this \
                 far, open with a larger Options::retain_syncs, sync less often, or use a \
                 larger region (more version entries)",
                self.retain.max(1),
                self.horizon
            )
        } else {
            let (a, b) = self
                .rolled_back
                .iter()
                .copied()
                .find(|&(a, b)| a < token && token <= b)
                .unwrap_or((token, token));
            format!(
                "token {token} was abandoned by a rollback to {a} (tokens {}..={b} no longer \
                 exist); roll back to {a} or a later live token",
                a + 1
            )
        })
    }

    /// Discard the oldest live token, never one the retention policy
    /// protects. Returns false when none can go.
    pub fn raise_horizon(&mut self) -> bool {
        if self.horizon >= self.oldest_retained() {
            return false;
        }
        self.horizon = self.skip_rolled_back(self.horizon + 1).min(self.last);
        self.rolled_back.retain(|&(_, b)| b >= self.horizon);
        true
    }

    /// Record that every token after `token` up to the last was abandoned.
    pub fn abandon_after(&mut self, token: u64) {
        if token < self.last {
            self.rolled_back.push((token, self.last));
        }
        while self.rolled_back.len() > MAX_ROLLED_BACK {
            let oldest = self.rolled_back.iter().map(|&(_, b)| b).min().unwrap_or(0);
            self.horizon = self.horizon.max(oldest + 1);
            self.rolled_back.retain(|&(_, b)| b >= self.horizon);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_follows_horizon_and_rollbacks() {
        let mut t = Tokens {
            horizon: 0,
            last: 10,
            rolled_back: vec![],
            retain: 1,
        };
        assert!(t.is_live(0) && t.is_live(10) && !t.is_live(11));
        t.abandon_after(4); // rollback to 4 at last = 10
        t.last = 11; // the rollback's own commit
        assert!(t.is_live(4) && !t.is_live(5) && !t.is_live(10) && t.is_live(11));
        assert!(!t.live_between(5, 11));
        assert!(t.live_between(5, 12));
        assert!(t.live_between(3, 5));
        assert!(t.raise_horizon());
        assert_eq!(t.horizon, 1);
        t.horizon = 4;
        assert!(t.raise_horizon());
        assert_eq!(t.horizon, 11, "the horizon skips abandoned tokens");
        assert!(t.rolled_back.is_empty());
        assert!(!t.raise_horizon(), "the last token stays");
    }

    #[test]
    fn retention_keeps_the_newest_live_tokens() {
        let mut t = Tokens {
            horizon: 0,
            last: 10,
            rolled_back: vec![(6, 9)], // a rollback at 9 to 6 made token 10
            retain: 3,
        };
        assert_eq!(
            t.oldest_retained(),
            5,
            "10, 6, 5: the abandoned 7..=9 do not count"
        );
        let mut discarded = 0;
        while t.raise_horizon() {
            discarded += 1;
        }
        assert_eq!((t.horizon, discarded), (5, 5));
        assert!(t.is_live(5) && t.is_live(6) && t.is_live(10));
        assert!(t.why_not_live(4).unwrap().contains("retain_syncs"));
        assert!(t.why_not_live(8).unwrap().contains("rollback to 6"));
        assert!(t.why_not_live(11).unwrap().contains("never issued"));
        assert_eq!(t.why_not_live(6), None);
        t.retain = 0;
        assert_eq!(
            t.oldest_retained(),
            10,
            "0 counts as 1: the last always stays"
        );
    }
}

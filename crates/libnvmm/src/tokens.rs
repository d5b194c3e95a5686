//! Sync tokens (SPEC §7 "sync … returns a time token (Lamport)"). The clock
//! ticks once per sync, so tokens are consecutive integers; token 0 is the
//! empty region of a fresh file. A token can be rolled back to while it is
//! live: at or above the horizon (garbage collection raises it, discarding
//! the oldest versions first) and not inside an interval that a rollback
//! abandoned.

use crate::entry::MAX_TIME;
use crate::error::{ErrorKind, NvmmError, Result};

/// At most this many abandoned intervals are remembered; beyond it the
/// horizon rises past the oldest.
pub const MAX_ROLLED_BACK: usize = 1024;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    /// The oldest token that can still be rolled back to.
    pub horizon: u64,
    /// The last committed token.
    pub last: u64,
    /// Abandoned intervals `(a, b]`: tokens in them were rolled back.
    pub rolled_back: Vec<(u64, u64)>,
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

    /// Discard the oldest live token (never the last committed one).
    /// Returns false when only the last is left.
    pub fn raise_horizon(&mut self) -> bool {
        if self.horizon >= self.last {
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
}

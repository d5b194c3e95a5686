//! Start-gap wear leveling with address randomization (SPEC §1.7).
//! TEMPORARY STUB with the agreed API; replaced by the full implementation.

pub struct GapMove {
    pub from_physical_line: u64,
    pub to_physical_line: u64,
}

pub struct StartGap {
    n: u64,
    g: u64,
    writes: u64,
    moves: u64,
}

impl StartGap {
    pub fn new(logical_lines: u64, gap_interval_writes: u64, _randomize: bool, _seed: u64, _track_wear: bool) -> Self {
        Self { n: logical_lines, g: gap_interval_writes, writes: 0, moves: 0 }
    }
    pub fn logical_lines(&self) -> u64 {
        self.n
    }
    pub fn physical_lines(&self) -> u64 {
        self.n + 1
    }
    pub fn translate(&self, logical_line: u64) -> u64 {
        logical_line
    }
    pub fn record_write(&mut self, _logical_line: u64) -> Option<GapMove> {
        self.writes += 1;
        if self.writes % self.g == 0 {
            self.moves += 1;
            Some(GapMove { from_physical_line: 0, to_physical_line: 1 })
        } else {
            None
        }
    }
    pub fn gap_moves(&self) -> u64 {
        self.moves
    }
    pub fn wear(&self) -> Option<&[u32]> {
        None
    }
}

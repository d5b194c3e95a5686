//! Device-side permission checking of Moneta-Direct (SPEC §3.3).
//!
//! Moneta-D lets user space issue requests straight to the device; the OS and
//! file system still decide *who may access what*, and the device enforces it.
//! The device holds one table of extent records (16K in the hardware; the
//! capacity is a parameter here) shared by all channels (1024 in the hardware;
//! also a parameter). Each channel owns a balanced binary (red-black) tree of
//! its records; a root table holds each channel's root. A record grants
//! permission bits ([`READ`], [`WRITE`]) on one physical byte range
//! `[START, START + LEN)` of the device.
//!
//! A lookup walks down the channel's tree comparing the request range against
//! START/LEN. Each node visited is one *step* (3 cycles = 12 ns at 250 MHz in
//! the hardware); [`PermissionTable::check`] reports steps and leaves the
//! conversion to time to the caller. A red-black tree of n records is at
//! most 2·log2(n + 1) deep, so even the worst 16K-record tree (28 steps,
//! 336 ns) meets the 500 ns budget that 1.8M IOPS allow, where a linear scan
//! would take tens of microseconds.
//!
//! Two failures exist: *missing record* (no single record covers the range;
//! the library treats it as a miss and asks the kernel to re-install) and
//! *permission failure* (a record covers the range but lacks the needed bit).
//!
//! The OS (control plane) edits the trees through an update protocol and the
//! device only looks up; this module holds the table and applies updates
//! ([`Update`]), while the queueing of updates lives elsewhere. Installing a
//! record cuts away overlapping parts of the channel's records (the newest
//! grant wins) and then merges it with physically adjacent records of the
//! same file and permission bits, even when the parts are logically
//! discontinuous in the file (XFS often allocates discontinuous file parts
//! adjacently), so a fragmented file needs fewer records. When the table is
//! full a clock hand sweeping the slots picks a record to evict; a later
//! request to the evicted range is a *hard miss* the library recovers from by
//! re-installing.
//!
//! Records live in a fixed arena allocated once in [`PermissionTable::new`];
//! tree links are `u32` slot indices, so `check` never allocates and walks a
//! compact array.

use std::fmt;

/// Permission bit: the range may be read.
pub const READ: u8 = 1;
/// Permission bit: the range may be written.
pub const WRITE: u8 = 2;

/// The "no node" link (a child, a parent or an empty root).
const NIL: u32 = u32::MAX;
/// Marks a free arena slot. Valid channels are `< channels <= u16::MAX`, so
/// `u16::MAX` never names one.
const FREE_SLOT: u16 = u16::MAX;

/// The kind of access a request makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl Access {
    /// The permission bit this access needs.
    pub fn perm_bit(self) -> u8 {
        match self {
            Access::Read => READ,
            Access::Write => WRITE,
        }
    }
}

/// One record the control plane wants installed. Ranges are device byte addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSpec {
    pub channel: u16,
    /// The file the extent belongs to (records only merge within a file).
    pub file: u64,
    /// First device byte of the range.
    pub start: u64,
    /// Length of the range in bytes.
    pub len: u64,
    /// [`READ`] and/or [`WRITE`].
    pub perms: u8,
}

/// One edit of the table by the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    Install(RecordSpec),
    /// Remove every record of the channel (channel freed).
    ClearChannel(u16),
    /// Remove every record of (channel, file) (file closed / permission revoked).
    RemoveFile {
        channel: u16,
        file: u64,
    },
}

/// The verdict of one permission check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckOutcome {
    /// One record covers the whole range and grants the access.
    Allowed,
    /// No single record covers the whole range.
    Missing,
    /// A record covers the whole range but lacks the needed bit.
    Denied,
}

/// A check's verdict and the tree steps it took (one per node visited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    pub outcome: CheckOutcome,
    pub steps: u32,
}

/// Why an [`Update`] was rejected; a rejected update changes nothing.
#[derive(Debug)]
pub enum UpdateError {
    ChannelOutOfRange(u16),
    ZeroLength,
    RangeOverflow,
    BadPerms(u8),
}

impl fmt::Display for UpdateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpdateError::ChannelOutOfRange(channel) => {
                write!(f, "channel {channel} is out of range")
            }
            UpdateError::ZeroLength => write!(f, "record length is zero"),
            UpdateError::RangeOverflow => {
                write!(f, "record range overflows the 64-bit device address space")
            }
            UpdateError::BadPerms(perms) => write!(
                f,
                "permission bits {perms:#04x} are not a nonzero combination of READ and WRITE"
            ),
        }
    }
}

impl std::error::Error for UpdateError {}

/// Counters of the table's activity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProtectionStats {
    /// Arena slots holding a record now.
    pub records_in_use: u32,
    /// Accepted `Install` updates.
    pub installs: u64,
    /// Times two records became one (an install joining both neighbours counts 2).
    pub merges: u64,
    /// Records dropped because the table was full.
    pub evictions: u64,
    /// Checks made, including malformed requests.
    pub lookups: u64,
    /// Tree steps over all checks.
    pub lookup_steps: u64,
    /// Most steps one check took.
    pub max_lookup_steps: u32,
    /// Checks that found no covering record.
    pub missing: u64,
    /// Checks whose covering record lacked the needed bit.
    pub denied: u64,
}

/// One arena slot: a record and its red-black tree links.
///
/// The end is stored rather than the length so the descent compares the
/// request address against two stored values without arithmetic.
#[derive(Debug, Clone, Copy)]
struct Node {
    start_byte: u64,
    /// Exclusive.
    end_byte: u64,
    left: u32,
    right: u32,
    parent: u32,
    file: u64,
    /// Owning channel, or [`FREE_SLOT`].
    channel: u16,
    perms: u8,
    red: bool,
}

impl Node {
    const FREE: Node = Node {
        start_byte: 0,
        end_byte: 0,
        left: NIL,
        right: NIL,
        parent: NIL,
        file: 0,
        channel: FREE_SLOT,
        perms: 0,
        red: false,
    };
}

/// The device's permission table: a fixed arena of records and one
/// red-black tree per channel, keyed by start address.
pub struct PermissionTable {
    nodes: Vec<Node>,
    /// Each channel's tree root, or [`NIL`].
    roots: Vec<u32>,
    /// Free slots, used as a stack.
    free: Vec<u32>,
    /// The next slot the eviction clock examines.
    clock_hand: u32,
    /// Slot list reused by `ClearChannel` and `RemoveFile` so updates do not
    /// allocate either; its capacity is the arena's.
    scratch: Vec<u32>,
    /// Merge physically adjacent records of the same file and bits (on by
    /// default; `direct.merge_records = false` models a device without it).
    merging: bool,
    stats: ProtectionStats,
}

impl PermissionTable {
    /// A table of `capacity_records` record slots (>= 1) shared by `channels`
    /// channels, all empty.
    pub fn new(capacity_records: u32, channels: u16) -> Self {
        assert!(
            (1..NIL).contains(&capacity_records),
            "capacity_records must be in 1..u32::MAX, got {capacity_records}"
        );
        let capacity = capacity_records as usize;
        Self {
            nodes: vec![Node::FREE; capacity],
            roots: vec![NIL; usize::from(channels)],
            // Reversed so slot 0 is handed out first: tests and traces read
            // naturally, and a first sweep of the clock evicts in
            // installation order.
            free: (0..capacity_records).rev().collect(),
            clock_hand: 0,
            scratch: Vec::with_capacity(capacity),
            merging: true,
            stats: ProtectionStats::default(),
        }
    }

    /// The same table with record merging switched on or off (SPEC §3.3:
    /// without merging, a fragmented file needs one record per extent).
    pub fn with_merging(mut self, merging: bool) -> Self {
        self.merging = merging;
        self
    }

    /// Applies one control-plane update. A rejected update changes nothing.
    /// Debug builds check every invariant after it ([`Self::check_invariants`]).
    pub fn apply(&mut self, update: &Update) -> Result<(), UpdateError> {
        let applied = self.apply_unchecked(update);
        #[cfg(debug_assertions)]
        self.check_invariants();
        applied
    }

    fn apply_unchecked(&mut self, update: &Update) -> Result<(), UpdateError> {
        match *update {
            Update::Install(spec) => self.install(spec),
            Update::ClearChannel(channel) => {
                self.validate_channel(channel)?;
                self.clear_channel(channel);
                Ok(())
            }
            Update::RemoveFile { channel, file } => {
                self.validate_channel(channel)?;
                self.remove_file(channel, file);
                Ok(())
            }
        }
    }

    /// Checks whether `channel` may make `access` to `[addr, addr + len)` and
    /// counts the check in the statistics. An out-of-range channel, a zero
    /// length or a range past the end of the address space is `Missing` with
    /// 0 steps (the hardware would not start a descent for it).
    pub fn check(&mut self, channel: u16, addr: u64, len: u64, access: Access) -> Check {
        let check = self.lookup(channel, addr, len, access);
        let stats = &mut self.stats;
        stats.lookups += 1;
        stats.lookup_steps += u64::from(check.steps);
        stats.max_lookup_steps = stats.max_lookup_steps.max(check.steps);
        match check.outcome {
            CheckOutcome::Allowed => {}
            CheckOutcome::Missing => stats.missing += 1,
            CheckOutcome::Denied => stats.denied += 1,
        }
        check
    }

    /// The counters, with `records_in_use` as of now.
    pub fn stats(&self) -> ProtectionStats {
        ProtectionStats {
            records_in_use: self.records_in_use(),
            ..self.stats.clone()
        }
    }

    /// The channel's records in address order (empty for an unknown channel).
    pub fn records_of(&self, channel: u16) -> Vec<RecordSpec> {
        let mut records = Vec::new();
        let Some(&root) = self.roots.get(usize::from(channel)) else {
            return records;
        };
        let mut node = self.minimum(root);
        while node != NIL {
            let n = self.node(node);
            records.push(RecordSpec {
                channel,
                file: n.file,
                start: n.start_byte,
                len: n.end_byte - n.start_byte,
                perms: n.perms,
            });
            node = self.successor(node);
        }
        records
    }

    /// Height of the channel's tree: nodes on its longest root-to-leaf path
    /// (0 when empty or the channel is unknown). Bounds any check's steps.
    pub fn depth(&self, channel: u16) -> u32 {
        self.roots
            .get(usize::from(channel))
            .map_or(0, |&root| self.height(root))
    }

    /// Panics if any invariant fails: red-black shape (black root, no red
    /// node with a red child, equal black height on every path), parent
    /// links, ordering and non-overlap of each channel's records, maximal
    /// merging, valid permission bits, and the accounting between trees,
    /// free list and arena.
    pub fn check_invariants(&self) {
        let capacity = self.nodes.len();
        assert!(
            (self.clock_hand as usize) < capacity,
            "clock hand out of the arena"
        );

        let mut is_free = vec![false; capacity];
        for &slot in &self.free {
            let index = slot as usize;
            assert!(index < capacity, "free slot {slot} out of the arena");
            assert!(!is_free[index], "slot {slot} is on the free list twice");
            is_free[index] = true;
            assert_eq!(
                self.node(slot).channel,
                FREE_SLOT,
                "free slot {slot} is marked in use"
            );
        }
        let marked_in_use = self.nodes.iter().filter(|n| n.channel != FREE_SLOT).count();
        assert_eq!(
            marked_in_use + self.free.len(),
            capacity,
            "arena slots are neither free nor in use"
        );

        let mut reachable = 0usize;
        for (channel, &root) in self.roots.iter().enumerate() {
            let channel = u16::try_from(channel).expect("channel count fits u16");
            if root == NIL {
                continue;
            }
            assert_eq!(
                self.node(root).parent,
                NIL,
                "channel {channel}: root has a parent"
            );
            assert!(!self.node(root).red, "channel {channel}: root is red");
            self.check_subtree(channel, root);

            let mut previous: Option<&Node> = None;
            let mut node = self.minimum(root);
            while node != NIL {
                let n = self.node(node);
                reachable += 1;
                assert!(
                    n.start_byte < n.end_byte,
                    "channel {channel}: empty record at slot {node}"
                );
                assert!(
                    n.perms != 0 && n.perms & !(READ | WRITE) == 0,
                    "channel {channel}: bad permission bits at slot {node}"
                );
                if let Some(p) = previous {
                    assert!(
                        p.end_byte <= n.start_byte,
                        "channel {channel}: records out of order or overlapping at slot {node}"
                    );
                    assert!(
                        !(self.merging
                            && p.end_byte == n.start_byte
                            && p.file == n.file
                            && p.perms == n.perms),
                        "channel {channel}: adjacent mergeable records left unmerged at slot {node}"
                    );
                }
                previous = Some(n);
                node = self.successor(node);
            }
        }
        assert_eq!(
            reachable, marked_in_use,
            "in-use slots not reachable from a root"
        );
    }

    /// Checks one subtree's links and red-black shape; returns its black
    /// height (NIL leaves count 1). Recursion depth is the tree's height.
    fn check_subtree(&self, channel: u16, node: u32) -> u32 {
        if node == NIL {
            return 1;
        }
        let n = self.node(node);
        assert_eq!(
            n.channel, channel,
            "slot {node} is in the tree of another channel"
        );
        for child in [n.left, n.right] {
            if child != NIL {
                assert_eq!(
                    self.node(child).parent,
                    node,
                    "slot {child}: wrong parent link"
                );
                assert!(
                    !(n.red && self.node(child).red),
                    "slot {node}: red node with red child"
                );
            }
        }
        if n.left != NIL {
            assert!(
                self.node(n.left).start_byte < n.start_byte,
                "slot {node}: left key order"
            );
        }
        if n.right != NIL {
            assert!(
                self.node(n.right).start_byte > n.start_byte,
                "slot {node}: right key order"
            );
        }
        let left_black_height = self.check_subtree(channel, n.left);
        let right_black_height = self.check_subtree(channel, n.right);
        assert_eq!(
            left_black_height, right_black_height,
            "slot {node}: unequal black heights"
        );
        left_black_height + u32::from(!n.red)
    }

    // ---- Data plane -------------------------------------------------------

    /// The descent, without statistics. At each node the request address
    /// either lies before the record (go left), after it (go right) or in
    /// it; records of a channel never overlap, so the record holding `addr`
    /// is the only one that could cover the whole request.
    fn lookup(&self, channel: u16, addr: u64, len: u64, access: Access) -> Check {
        const MALFORMED: Check = Check {
            outcome: CheckOutcome::Missing,
            steps: 0,
        };
        let Some(&root) = self.roots.get(usize::from(channel)) else {
            return MALFORMED;
        };
        let end_byte = match addr.checked_add(len) {
            Some(end_byte) if len > 0 => end_byte,
            _ => return MALFORMED,
        };
        let mut node = root;
        let mut steps = 0;
        while node != NIL {
            let n = &self.nodes[node as usize];
            steps += 1;
            if addr < n.start_byte {
                node = n.left;
            } else if addr >= n.end_byte {
                node = n.right;
            } else {
                let outcome = if end_byte > n.end_byte {
                    CheckOutcome::Missing
                } else if n.perms & access.perm_bit() != 0 {
                    CheckOutcome::Allowed
                } else {
                    CheckOutcome::Denied
                };
                return Check { outcome, steps };
            }
        }
        Check {
            outcome: CheckOutcome::Missing,
            steps,
        }
    }

    // ---- Control plane ----------------------------------------------------

    fn validate_channel(&self, channel: u16) -> Result<(), UpdateError> {
        if usize::from(channel) < self.roots.len() {
            Ok(())
        } else {
            Err(UpdateError::ChannelOutOfRange(channel))
        }
    }

    fn install(&mut self, spec: RecordSpec) -> Result<(), UpdateError> {
        self.validate_channel(spec.channel)?;
        if spec.len == 0 {
            return Err(UpdateError::ZeroLength);
        }
        let end_byte = spec
            .start
            .checked_add(spec.len)
            .ok_or(UpdateError::RangeOverflow)?;
        if spec.perms == 0 || spec.perms & !(READ | WRITE) != 0 {
            return Err(UpdateError::BadPerms(spec.perms));
        }
        self.stats.installs += 1;
        let channel = spec.channel;

        // Re-installing a grant that is already in place (a retry after a
        // miss that raced with another thread's install) changes nothing;
        // handled first so it neither splits nor needs a slot.
        let holder = self.find_containing(channel, spec.start);
        if holder != NIL {
            let h = self.node(holder);
            if h.end_byte >= end_byte && h.file == spec.file && h.perms == spec.perms {
                return Ok(());
            }
        }

        // Records inside the new range go first: they free slots, which can
        // spare an eviction for the split below or for the new record.
        self.cut_starting_within(channel, spec.start, end_byte);
        let split_tail = self.cut_straddling(channel, spec.start, end_byte);
        self.insert_merged(spec, end_byte, split_tail);
        Ok(())
    }

    /// Deletes the channel's records starting in `[start_byte, end_byte)`
    /// that end inside it, and trims the one that extends past it (at most
    /// one, since records do not overlap) to start at `end_byte`.
    fn cut_starting_within(&mut self, channel: u16, start_byte: u64, end_byte: u64) {
        loop {
            let next = self.ceiling(channel, start_byte);
            if next == NIL || self.node(next).start_byte >= end_byte {
                return;
            }
            if self.node(next).end_byte <= end_byte {
                self.remove_node(next);
            } else {
                // Moving the key up to `end_byte` keeps the order: nothing
                // else of the channel starts in the range any more.
                self.node_mut(next).start_byte = end_byte;
                return;
            }
        }
    }

    /// Cuts the new range out of the record that starts before it and runs
    /// into it (at most one): trims its end, or splits it in two when it also
    /// runs past the range. Returns the split-off tail, or NIL.
    fn cut_straddling(&mut self, channel: u16, start_byte: u64, end_byte: u64) -> u32 {
        loop {
            // After `cut_starting_within` no record starts inside the range,
            // so a record holding `start_byte` starts before it.
            let straddler = self.find_containing(channel, start_byte);
            if straddler == NIL {
                return NIL;
            }
            let old = *self.node(straddler);
            if old.end_byte <= end_byte {
                self.node_mut(straddler).end_byte = start_byte;
                return NIL;
            }
            if self.free.is_empty() {
                // The split needs a slot. The victim may be the straddler
                // itself, so look again afterwards.
                self.evict_one(NIL);
                continue;
            }
            self.node_mut(straddler).end_byte = start_byte;
            return self.insert_new(channel, end_byte, old.end_byte, old.file, old.perms);
        }
    }

    /// Adds `[spec.start, end_byte)` to its channel, whose records no longer
    /// overlap it, merging with a physically adjacent neighbour on either
    /// side that has the same file and bits. Extending a neighbour needs no
    /// slot, so a merge never causes an eviction; otherwise a new record is
    /// created, evicting (never `split_tail`, created by this same install)
    /// if the table is full.
    fn insert_merged(&mut self, spec: RecordSpec, end_byte: u64, split_tail: u32) {
        let channel = spec.channel;
        let mergeable = |table: &Self, node: u32| {
            table.merging && node != NIL && {
                let n = table.node(node);
                n.file == spec.file && n.perms == spec.perms
            }
        };
        // Nothing overlaps the new range now, so a record holding the byte
        // before it ends exactly at its start, and one holding `end_byte`
        // starts exactly at its end.
        let left = match spec.start.checked_sub(1) {
            Some(last_byte_before) => self.find_containing(channel, last_byte_before),
            None => NIL,
        };
        let right = self.find_containing(channel, end_byte);
        match (mergeable(self, left), mergeable(self, right)) {
            (true, true) => {
                let right_end_byte = self.node(right).end_byte;
                self.remove_node(right);
                self.node_mut(left).end_byte = right_end_byte;
                self.stats.merges += 2;
            }
            (true, false) => {
                self.node_mut(left).end_byte = end_byte;
                self.stats.merges += 1;
            }
            (false, true) => {
                // The key moves down to `spec.start`, still after the left
                // neighbour's end, so the tree order holds.
                self.node_mut(right).start_byte = spec.start;
                self.stats.merges += 1;
            }
            (false, false) => {
                if self.free.is_empty() {
                    self.evict_one(split_tail);
                }
                self.insert_new(channel, spec.start, end_byte, spec.file, spec.perms);
            }
        }
    }

    /// Frees every record of the channel.
    fn clear_channel(&mut self, channel: u16) {
        // A whole tree goes, so no rebalancing: walk it with an explicit
        // stack (never more entries than records) and free each slot.
        let mut pending = std::mem::take(&mut self.scratch);
        pending.clear();
        let root = std::mem::replace(&mut self.roots[usize::from(channel)], NIL);
        if root != NIL {
            pending.push(root);
        }
        while let Some(node) = pending.pop() {
            let n = *self.node(node);
            for child in [n.left, n.right] {
                if child != NIL {
                    pending.push(child);
                }
            }
            self.free_slot(node);
        }
        self.scratch = pending;
    }

    /// Frees every record of (channel, file).
    fn remove_file(&mut self, channel: u16, file: u64) {
        // Collect first: deleting rebalances the tree under an in-order
        // walk. Deletion relinks nodes and never moves a record between
        // slots, so the collected slot numbers stay valid.
        let mut victims = std::mem::take(&mut self.scratch);
        victims.clear();
        let mut node = self.minimum(self.roots[usize::from(channel)]);
        while node != NIL {
            if self.node(node).file == file {
                victims.push(node);
            }
            node = self.successor(node);
        }
        for &victim in &victims {
            self.remove_node(victim);
        }
        self.scratch = victims;
    }

    /// Evicts the next in-use slot under the clock hand other than
    /// `protected` (NIL protects nothing). Called only when the arena is
    /// full.
    fn evict_one(&mut self, protected: u32) {
        let capacity = self.capacity();
        for _ in 0..capacity {
            let slot = self.clock_hand;
            self.clock_hand = (slot + 1) % capacity;
            if self.node(slot).channel != FREE_SLOT && slot != protected {
                self.remove_node(slot);
                self.stats.evictions += 1;
                return;
            }
        }
        // The arena is full and at most one slot is protected; a protected
        // split tail coexists with its trimmed head, so a victim exists.
        unreachable!("eviction found no victim in a full table");
    }

    // ---- Arena ------------------------------------------------------------

    fn capacity(&self) -> u32 {
        u32::try_from(self.nodes.len()).expect("capacity checked in new")
    }

    fn records_in_use(&self) -> u32 {
        self.capacity() - u32::try_from(self.free.len()).expect("free list within capacity")
    }

    fn node(&self, index: u32) -> &Node {
        &self.nodes[index as usize]
    }

    fn node_mut(&mut self, index: u32) -> &mut Node {
        &mut self.nodes[index as usize]
    }

    fn free_slot(&mut self, index: u32) {
        *self.node_mut(index) = Node::FREE;
        self.free.push(index);
    }

    /// Takes a free slot (the caller made sure there is one), fills it and
    /// links it into the channel's tree.
    fn insert_new(
        &mut self,
        channel: u16,
        start_byte: u64,
        end_byte: u64,
        file: u64,
        perms: u8,
    ) -> u32 {
        let index = self.free.pop().expect("caller reserved a free slot");
        *self.node_mut(index) = Node {
            start_byte,
            end_byte,
            left: NIL,
            right: NIL,
            parent: NIL,
            file,
            channel,
            perms,
            red: true,
        };
        self.rb_insert(index);
        index
    }

    /// Unlinks a record from its tree and frees its slot.
    fn remove_node(&mut self, index: u32) {
        self.rb_delete(index);
        self.free_slot(index);
    }

    // ---- Searches ---------------------------------------------------------

    /// The channel's record holding byte `addr`, or NIL.
    fn find_containing(&self, channel: u16, addr: u64) -> u32 {
        let mut node = self.roots[usize::from(channel)];
        while node != NIL {
            let n = self.node(node);
            if addr < n.start_byte {
                node = n.left;
            } else if addr >= n.end_byte {
                node = n.right;
            } else {
                return node;
            }
        }
        NIL
    }

    /// The channel's record with the smallest start `>= start_byte`, or NIL.
    fn ceiling(&self, channel: u16, start_byte: u64) -> u32 {
        let mut node = self.roots[usize::from(channel)];
        let mut best = NIL;
        while node != NIL {
            let n = self.node(node);
            if n.start_byte >= start_byte {
                best = node;
                node = n.left;
            } else {
                node = n.right;
            }
        }
        best
    }

    fn minimum(&self, mut node: u32) -> u32 {
        if node == NIL {
            return NIL;
        }
        while self.node(node).left != NIL {
            node = self.node(node).left;
        }
        node
    }

    /// The next record in address order, via parent links (no stack).
    fn successor(&self, node: u32) -> u32 {
        let right = self.node(node).right;
        if right != NIL {
            return self.minimum(right);
        }
        let mut child = node;
        let mut parent = self.node(node).parent;
        while parent != NIL && self.node(parent).right == child {
            child = parent;
            parent = self.node(parent).parent;
        }
        parent
    }

    /// Recursion depth is the subtree's height.
    fn height(&self, node: u32) -> u32 {
        if node == NIL {
            return 0;
        }
        let n = self.node(node);
        1 + self.height(n.left).max(self.height(n.right))
    }

    // ---- Red-black tree (CLRS ch. 13, NIL as an index, not a node) -------

    fn is_red(&self, node: u32) -> bool {
        node != NIL && self.node(node).red
    }

    fn set_red(&mut self, node: u32, red: bool) {
        if node != NIL {
            self.node_mut(node).red = red;
        }
    }

    /// Points `parent`'s link to `old` (or the channel's root, when `parent`
    /// is NIL) at `new`.
    fn replace_child(&mut self, parent: u32, old: u32, new: u32) {
        if parent == NIL {
            let channel = self.node(old).channel;
            self.roots[usize::from(channel)] = new;
        } else if self.node(parent).left == old {
            self.node_mut(parent).left = new;
        } else {
            self.node_mut(parent).right = new;
        }
    }

    fn rotate_left(&mut self, x: u32) {
        let y = self.node(x).right;
        let y_left = self.node(y).left;
        self.node_mut(x).right = y_left;
        if y_left != NIL {
            self.node_mut(y_left).parent = x;
        }
        let x_parent = self.node(x).parent;
        self.node_mut(y).parent = x_parent;
        self.replace_child(x_parent, x, y);
        self.node_mut(y).left = x;
        self.node_mut(x).parent = y;
    }

    fn rotate_right(&mut self, x: u32) {
        let y = self.node(x).left;
        let y_right = self.node(y).right;
        self.node_mut(x).left = y_right;
        if y_right != NIL {
            self.node_mut(y_right).parent = x;
        }
        let x_parent = self.node(x).parent;
        self.node_mut(y).parent = x_parent;
        self.replace_child(x_parent, x, y);
        self.node_mut(y).right = x;
        self.node_mut(x).parent = y;
    }

    /// Links a fresh red node into its channel's tree by start address and
    /// restores the red-black properties.
    fn rb_insert(&mut self, z: u32) {
        let channel = self.node(z).channel;
        let key = self.node(z).start_byte;
        let mut parent = NIL;
        let mut node = self.roots[usize::from(channel)];
        while node != NIL {
            parent = node;
            node = if key < self.node(node).start_byte {
                self.node(node).left
            } else {
                self.node(node).right
            };
        }
        self.node_mut(z).parent = parent;
        if parent == NIL {
            self.roots[usize::from(channel)] = z;
        } else if key < self.node(parent).start_byte {
            self.node_mut(parent).left = z;
        } else {
            self.node_mut(parent).right = z;
        }
        self.insert_fixup(z);
    }

    fn insert_fixup(&mut self, mut z: u32) {
        while self.is_red(self.node(z).parent) {
            // A red parent is not the root, so the grandparent exists.
            let parent = self.node(z).parent;
            let grandparent = self.node(parent).parent;
            let parent_is_left = self.node(grandparent).left == parent;
            let uncle = if parent_is_left {
                self.node(grandparent).right
            } else {
                self.node(grandparent).left
            };
            if self.is_red(uncle) {
                // Push the grandparent's blackness down; continue above.
                self.set_red(parent, false);
                self.set_red(uncle, false);
                self.set_red(grandparent, true);
                z = grandparent;
                continue;
            }
            // Make z an outer grandchild, then rotate the grandparent.
            if parent_is_left {
                if self.node(parent).right == z {
                    z = parent;
                    self.rotate_left(z);
                }
            } else if self.node(parent).left == z {
                z = parent;
                self.rotate_right(z);
            }
            let parent = self.node(z).parent;
            let grandparent = self.node(parent).parent;
            self.set_red(parent, false);
            self.set_red(grandparent, true);
            if parent_is_left {
                self.rotate_right(grandparent);
            } else {
                self.rotate_left(grandparent);
            }
        }
        let root = self.roots[usize::from(self.node(z).channel)];
        self.set_red(root, false);
    }

    /// Replaces the subtree at `u` by the one at `v` (which may be NIL).
    fn transplant(&mut self, u: u32, v: u32) {
        let u_parent = self.node(u).parent;
        self.replace_child(u_parent, u, v);
        if v != NIL {
            self.node_mut(v).parent = u_parent;
        }
    }

    /// Unlinks `z` from its channel's tree by relinking (records never move
    /// between slots) and restores the red-black properties.
    fn rb_delete(&mut self, z: u32) {
        let z_node = *self.node(z);
        // `x` takes the place of the node removed from its position; with no
        // sentinel node, its parent is tracked separately since `x` may be NIL.
        let (x, x_parent, removed_black) = if z_node.left == NIL {
            self.transplant(z, z_node.right);
            (z_node.right, z_node.parent, !z_node.red)
        } else if z_node.right == NIL {
            self.transplant(z, z_node.left);
            (z_node.left, z_node.parent, !z_node.red)
        } else {
            // Two children: z's successor y takes z's place and colour.
            let y = self.minimum(z_node.right);
            let y_was_black = !self.node(y).red;
            let x = self.node(y).right;
            let x_parent = if self.node(y).parent == z {
                y
            } else {
                let y_parent = self.node(y).parent;
                self.transplant(y, x);
                self.node_mut(y).right = z_node.right;
                self.node_mut(z_node.right).parent = y;
                y_parent
            };
            self.transplant(z, y);
            self.node_mut(y).left = z_node.left;
            self.node_mut(z_node.left).parent = y;
            self.node_mut(y).red = z_node.red;
            (x, x_parent, y_was_black)
        };
        if removed_black {
            self.delete_fixup(z_node.channel, x, x_parent);
        }
    }

    /// Restores the black height after a black node was removed above `x`
    /// ("doubly black" `x`, possibly NIL, child of `x_parent`).
    fn delete_fixup(&mut self, channel: u16, mut x: u32, mut x_parent: u32) {
        while x != self.roots[usize::from(channel)] && !self.is_red(x) {
            // x is doubly black, so its sibling has black height >= 1 and is
            // not NIL; this also tells which side x is on when x is NIL.
            let x_is_left = self.node(x_parent).left == x;
            let mut sibling = if x_is_left {
                self.node(x_parent).right
            } else {
                self.node(x_parent).left
            };
            if self.is_red(sibling) {
                // Turn a red sibling into a black one by rotating the parent.
                self.set_red(sibling, false);
                self.set_red(x_parent, true);
                if x_is_left {
                    self.rotate_left(x_parent);
                    sibling = self.node(x_parent).right;
                } else {
                    self.rotate_right(x_parent);
                    sibling = self.node(x_parent).left;
                }
            }
            let (near, far) = if x_is_left {
                (self.node(sibling).left, self.node(sibling).right)
            } else {
                (self.node(sibling).right, self.node(sibling).left)
            };
            if !self.is_red(near) && !self.is_red(far) {
                // Take one black from x and its sibling; move the problem up.
                self.set_red(sibling, true);
                x = x_parent;
                x_parent = self.node(x).parent;
                continue;
            }
            if !self.is_red(far) {
                // Make the far nephew red by rotating the sibling.
                self.set_red(near, false);
                self.set_red(sibling, true);
                if x_is_left {
                    self.rotate_right(sibling);
                    sibling = self.node(x_parent).right;
                } else {
                    self.rotate_left(sibling);
                    sibling = self.node(x_parent).left;
                }
            }
            let far = if x_is_left {
                self.node(sibling).right
            } else {
                self.node(sibling).left
            };
            let parent_red = self.node(x_parent).red;
            self.set_red(sibling, parent_red);
            self.set_red(x_parent, false);
            self.set_red(far, false);
            if x_is_left {
                self.rotate_left(x_parent);
            } else {
                self.rotate_right(x_parent);
            }
            x = self.roots[usize::from(channel)];
        }
        self.set_red(x, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(channel: u16, file: u64, start: u64, len: u64, perms: u8) -> RecordSpec {
        RecordSpec {
            channel,
            file,
            start,
            len,
            perms,
        }
    }

    fn install(table: &mut PermissionTable, record: RecordSpec) {
        table
            .apply(&Update::Install(record))
            .expect("valid install");
        table.check_invariants();
    }

    fn outcome(
        table: &mut PermissionTable,
        channel: u16,
        addr: u64,
        len: u64,
        access: Access,
    ) -> CheckOutcome {
        table.check(channel, addr, len, access).outcome
    }

    /// (start, len, file, perms) of a channel's records, for compact asserts.
    fn ranges(table: &PermissionTable, channel: u16) -> Vec<(u64, u64, u64, u8)> {
        table
            .records_of(channel)
            .iter()
            .map(|r| (r.start, r.len, r.file, r.perms))
            .collect()
    }

    #[test]
    fn protection_allowed_denied_missing() {
        let mut table = PermissionTable::new(16, 4);
        install(&mut table, spec(1, 7, 4096, 8192, READ));
        use CheckOutcome::*;
        assert_eq!(outcome(&mut table, 1, 4096, 8192, Access::Read), Allowed);
        assert_eq!(outcome(&mut table, 1, 5000, 512, Access::Read), Allowed);
        assert_eq!(outcome(&mut table, 1, 5000, 512, Access::Write), Denied);
        // Runs past the record, starts before it, or lies elsewhere.
        assert_eq!(outcome(&mut table, 1, 12_000, 512, Access::Read), Missing);
        assert_eq!(outcome(&mut table, 1, 4000, 512, Access::Read), Missing);
        assert_eq!(outcome(&mut table, 1, 0, 512, Access::Read), Missing);
        // Another channel holds no permissions.
        assert_eq!(outcome(&mut table, 2, 5000, 512, Access::Read), Missing);
        // Malformed requests: no descent.
        for (channel, addr, len) in [(4, 5000, 512), (1, 5000, 0), (1, u64::MAX, 2)] {
            let check = table.check(channel, addr, len, Access::Read);
            assert_eq!(
                check,
                Check {
                    outcome: Missing,
                    steps: 0
                }
            );
        }
        let stats = table.stats();
        assert_eq!(stats.lookups, 10);
        assert_eq!(stats.denied, 1);
        assert_eq!(stats.missing, 7);
        assert_eq!(stats.max_lookup_steps, 1);
        assert_eq!(
            stats.lookup_steps, 6,
            "one step each, except the empty channel and malformed"
        );
        assert_eq!(stats.records_in_use, 1);
    }

    #[test]
    fn protection_a_request_spanning_two_records_is_missing() {
        let mut table = PermissionTable::new(16, 1);
        install(&mut table, spec(0, 1, 0, 100, READ));
        install(&mut table, spec(0, 2, 100, 100, READ));
        assert_eq!(
            outcome(&mut table, 0, 50, 100, Access::Read),
            CheckOutcome::Missing
        );
    }

    #[test]
    fn protection_merges_adjacent_records_of_a_file_in_any_logical_order() {
        let mut table = PermissionTable::new(16, 2);
        // The file's first logical extent sits physically after its second
        // one: they still merge, from either side.
        install(&mut table, spec(0, 3, 1000, 100, READ | WRITE));
        install(&mut table, spec(0, 3, 900, 100, READ | WRITE));
        assert_eq!(ranges(&table, 0), vec![(900, 200, 3, READ | WRITE)]);
        install(&mut table, spec(0, 3, 1100, 50, READ | WRITE));
        assert_eq!(ranges(&table, 0), vec![(900, 250, 3, READ | WRITE)]);
        // Filling a gap joins both neighbours: two merges.
        install(&mut table, spec(0, 3, 1200, 100, READ | WRITE));
        install(&mut table, spec(0, 3, 1150, 50, READ | WRITE));
        assert_eq!(ranges(&table, 0), vec![(900, 400, 3, READ | WRITE)]);
        assert_eq!(table.stats().merges, 4);
        assert_eq!(table.stats().records_in_use, 1);
        assert_eq!(
            outcome(&mut table, 0, 900, 400, Access::Write),
            CheckOutcome::Allowed
        );
    }

    #[test]
    fn protection_without_merging_keeps_one_record_per_extent() {
        let mut table = PermissionTable::new(16, 1).with_merging(false);
        install(&mut table, spec(0, 3, 1000, 100, READ));
        install(&mut table, spec(0, 3, 1100, 100, READ));
        assert_eq!(table.stats().merges, 0);
        assert_eq!(table.stats().records_in_use, 2);
        table.check_invariants();
        // The two records together do not cover a range across them.
        assert_eq!(
            outcome(&mut table, 0, 1050, 100, Access::Read),
            CheckOutcome::Missing
        );
    }

    #[test]
    fn protection_no_merge_across_file_perms_or_channel() {
        let mut table = PermissionTable::new(16, 2);
        install(&mut table, spec(0, 1, 0, 100, READ));
        install(&mut table, spec(0, 2, 100, 100, READ)); // other file
        install(&mut table, spec(0, 2, 200, 100, READ | WRITE)); // other bits
        install(&mut table, spec(1, 2, 300, 100, READ | WRITE)); // other channel
        install(&mut table, spec(0, 2, 401, 100, READ | WRITE)); // a byte apart
        assert_eq!(table.stats().merges, 0);
        assert_eq!(table.stats().records_in_use, 5);
        assert_eq!(table.records_of(0).len(), 4);
        assert_eq!(table.records_of(1).len(), 1);
    }

    #[test]
    fn protection_overlaps_are_trimmed_and_split() {
        let mut table = PermissionTable::new(16, 1);
        install(&mut table, spec(0, 1, 0, 100, READ | WRITE));
        // Overlapping the tail: the old record is trimmed.
        install(&mut table, spec(0, 2, 50, 100, READ));
        assert_eq!(
            ranges(&table, 0),
            vec![(0, 50, 1, READ | WRITE), (50, 100, 2, READ)]
        );
        // Strictly inside: the old record is split around the new one.
        install(&mut table, spec(0, 3, 60, 10, WRITE));
        assert_eq!(
            ranges(&table, 0),
            vec![
                (0, 50, 1, READ | WRITE),
                (50, 10, 2, READ),
                (60, 10, 3, WRITE),
                (70, 80, 2, READ)
            ]
        );
        // Covering several records: they go, the partly covered ones shrink.
        install(&mut table, spec(0, 4, 40, 50, READ));
        assert_eq!(
            ranges(&table, 0),
            vec![
                (0, 40, 1, READ | WRITE),
                (40, 50, 4, READ),
                (90, 60, 2, READ)
            ]
        );
        // Same file and bits as a record it overlaps: they become one.
        install(&mut table, spec(0, 2, 80, 20, READ));
        assert_eq!(
            ranges(&table, 0),
            vec![
                (0, 40, 1, READ | WRITE),
                (40, 40, 4, READ),
                (80, 70, 2, READ)
            ]
        );
        // Newest grant wins the overlap: write on [0, 40) is gone from 20 on.
        install(&mut table, spec(0, 5, 20, 20, READ));
        assert_eq!(
            outcome(&mut table, 0, 25, 5, Access::Write),
            CheckOutcome::Denied
        );
        assert_eq!(
            outcome(&mut table, 0, 5, 5, Access::Write),
            CheckOutcome::Allowed
        );
        // Re-installing a grant already in place changes nothing.
        let before = ranges(&table, 0);
        install(&mut table, spec(0, 2, 100, 10, READ));
        assert_eq!(ranges(&table, 0), before);
    }

    #[test]
    fn protection_evicts_by_clock_when_full_then_misses() {
        let mut table = PermissionTable::new(4, 2);
        for (i, channel) in [0u16, 1, 0, 1].into_iter().enumerate() {
            install(&mut table, spec(channel, 1, 1000 * i as u64, 100, READ));
        }
        assert_eq!(table.stats().evictions, 0);
        install(&mut table, spec(1, 1, 9000, 100, READ));
        // The hand starts at slot 0, which holds the first record.
        assert_eq!(table.stats().evictions, 1);
        assert_eq!(table.stats().records_in_use, 4);
        assert_eq!(
            outcome(&mut table, 0, 0, 100, Access::Read),
            CheckOutcome::Missing
        );
        assert_eq!(
            outcome(&mut table, 1, 1000, 100, Access::Read),
            CheckOutcome::Allowed
        );
        assert_eq!(
            outcome(&mut table, 1, 9000, 100, Access::Read),
            CheckOutcome::Allowed
        );
        // The hard miss is recovered by re-installing; the hand moves on to
        // slot 1 (channel 1's record at 1000).
        install(&mut table, spec(0, 1, 0, 100, READ));
        assert_eq!(
            outcome(&mut table, 0, 0, 100, Access::Read),
            CheckOutcome::Allowed
        );
        assert_eq!(
            outcome(&mut table, 1, 1000, 100, Access::Read),
            CheckOutcome::Missing
        );
        assert_eq!(table.stats().evictions, 2);
        // A merge needs no slot, so it evicts nothing.
        install(&mut table, spec(0, 1, 100, 100, READ));
        assert_eq!(table.stats().evictions, 2);
        // Re-installing part of a grant in place (a retry) neither splits
        // the record, which would need a slot, nor counts as merges.
        let merges = table.stats().merges;
        install(&mut table, spec(0, 1, 120, 10, READ));
        assert_eq!(table.stats().evictions, 2);
        assert_eq!(table.stats().merges, merges);
        assert_eq!(table.records_of(0)[0], spec(0, 1, 0, 200, READ));
    }

    #[test]
    fn protection_never_evicts_what_the_install_creates() {
        // One slot: splitting the only record would need two, so the record
        // is evicted and the new grant still lands.
        let mut table = PermissionTable::new(1, 1);
        install(&mut table, spec(0, 1, 0, 100, READ));
        install(&mut table, spec(0, 2, 40, 10, WRITE));
        assert_eq!(ranges(&table, 0), vec![(40, 10, 2, WRITE)]);
        assert_eq!(table.stats().evictions, 1);

        // Two slots. Set up the hand on free slot 1 and the record to split
        // in slot 0: the split tail then takes slot 1, under the hand, and
        // the new record must evict the trimmed head in slot 0, not the tail.
        let mut table = PermissionTable::new(2, 2);
        install(&mut table, spec(1, 9, 0, 10, READ));
        install(&mut table, spec(1, 8, 20, 10, READ));
        install(&mut table, spec(0, 1, 0, 100, READ)); // evicts slot 0
        table
            .apply(&Update::RemoveFile {
                channel: 1,
                file: 8,
            })
            .expect("valid");
        install(&mut table, spec(0, 2, 40, 10, WRITE));
        assert_eq!(
            ranges(&table, 0),
            vec![(40, 10, 2, WRITE), (50, 50, 1, READ)]
        );
        assert!(table.records_of(1).is_empty());
        assert_eq!(table.stats().evictions, 2);
    }

    #[test]
    fn protection_clear_channel_and_remove_file() {
        let mut table = PermissionTable::new(64, 3);
        for i in 0..10u64 {
            install(&mut table, spec(0, i % 2, i * 200, 100, READ));
            install(&mut table, spec(1, i % 2, i * 200, 100, READ));
        }
        table
            .apply(&Update::RemoveFile {
                channel: 0,
                file: 1,
            })
            .expect("valid");
        table.check_invariants();
        assert!(table.records_of(0).iter().all(|r| r.file == 0));
        assert_eq!(table.records_of(0).len(), 5);
        assert_eq!(table.records_of(1).len(), 10);
        assert_eq!(
            outcome(&mut table, 0, 200, 100, Access::Read),
            CheckOutcome::Missing
        );
        assert_eq!(
            outcome(&mut table, 0, 400, 100, Access::Read),
            CheckOutcome::Allowed
        );

        table.apply(&Update::ClearChannel(1)).expect("valid");
        table.check_invariants();
        assert!(table.records_of(1).is_empty());
        assert_eq!(table.depth(1), 0);
        assert_eq!(table.stats().records_in_use, 5);
        assert_eq!(table.stats().evictions, 0, "freeing is not evicting");
        // Freed slots are reused.
        for i in 0..59u64 {
            install(&mut table, spec(2, 0, i * 2, 1, READ));
        }
        assert_eq!(table.stats().records_in_use, 64);
        assert_eq!(table.stats().evictions, 0);
    }

    #[test]
    fn protection_bad_updates_are_errors_and_change_nothing() {
        let mut table = PermissionTable::new(8, 2);
        install(&mut table, spec(0, 1, 0, 100, READ));
        let before_records = ranges(&table, 0);
        let before_stats = table.stats();
        let bad = [
            Update::Install(spec(2, 1, 0, 10, READ)),
            Update::Install(spec(0, 1, 0, 0, READ)),
            Update::Install(spec(0, 1, u64::MAX - 5, 10, READ)),
            Update::Install(spec(0, 1, 0, 10, 0)),
            Update::Install(spec(0, 1, 0, 10, 4 | READ)),
            Update::ClearChannel(2),
            Update::RemoveFile {
                channel: 9,
                file: 1,
            },
        ];
        let errors: Vec<String> = bad
            .iter()
            .map(|update| {
                table
                    .apply(update)
                    .expect_err("must be rejected")
                    .to_string()
            })
            .collect();
        assert_eq!(
            errors,
            vec![
                "channel 2 is out of range",
                "record length is zero",
                "record range overflows the 64-bit device address space",
                "permission bits 0x00 are not a nonzero combination of READ and WRITE",
                "permission bits 0x05 are not a nonzero combination of READ and WRITE",
                "channel 2 is out of range",
                "channel 9 is out of range",
            ]
        );
        assert!(matches!(
            table.apply(&bad[2]),
            Err(UpdateError::RangeOverflow)
        ));
        table.check_invariants();
        assert_eq!(ranges(&table, 0), before_records);
        assert_eq!(table.stats(), before_stats);
        // A range ending exactly at the top of the address space is fine.
        install(&mut table, spec(1, 1, u64::MAX - 10, 10, READ));
    }

    #[test]
    fn protection_depth_of_16k_records_is_logarithmic() {
        const RECORDS: u64 = 16_384;
        const LEN_BYTES: u64 = 4096;
        let mut table = PermissionTable::new(RECORDS as u32, 1);
        // Ascending starts (an unbalanced tree's worst case), stride 2×len
        // so nothing merges.
        for i in 0..RECORDS {
            let record = spec(0, i % 2, i * 2 * LEN_BYTES, LEN_BYTES, READ);
            table.apply(&Update::Install(record)).expect("valid");
        }
        table.check_invariants();
        let bound = |n: u64| 2.0 * ((n + 1) as f64).log2();
        let depth = table.depth(0);
        assert!(f64::from(depth) <= bound(RECORDS), "depth {depth}");
        for i in 0..RECORDS {
            let start = i * 2 * LEN_BYTES;
            let hit = table.check(0, start, LEN_BYTES, Access::Read);
            assert_eq!(hit.outcome, CheckOutcome::Allowed);
            assert!(hit.steps >= 1 && hit.steps <= depth);
            let gap = table.check(0, start + LEN_BYTES, 1, Access::Read);
            assert_eq!(gap.outcome, CheckOutcome::Missing);
            assert!(gap.steps <= depth);
        }
        assert!(table.stats().max_lookup_steps <= depth);

        // Deleting every other record exercises delete rebalancing.
        table
            .apply(&Update::RemoveFile {
                channel: 0,
                file: 1,
            })
            .expect("valid");
        table.check_invariants();
        assert_eq!(table.records_of(0).len(), RECORDS as usize / 2);
        assert!(f64::from(table.depth(0)) <= bound(RECORDS / 2));
        // The table is half empty: refilling it evicts nothing.
        for i in 0..RECORDS / 2 {
            let record = spec(0, 2, (2 * i + 1) * 2 * LEN_BYTES, LEN_BYTES, WRITE);
            table.apply(&Update::Install(record)).expect("valid");
        }
        table.check_invariants();
        assert_eq!(table.stats().evictions, 0);
        assert_eq!(table.stats().records_in_use, RECORDS as u32);
        assert!(f64::from(table.depth(0)) <= bound(RECORDS));
    }

    // ---- Property tests -------------------------------------------------

    const CHANNELS: u16 = 3;

    #[derive(Debug, Clone)]
    enum Op {
        Apply(Update),
        Check {
            channel: u16,
            addr: u64,
            len: u64,
            access: Access,
        },
    }

    /// Small address space, few files and channels: overlaps, adjacency and
    /// merges are frequent. Some updates and checks are malformed.
    fn op() -> impl Strategy<Value = Op> {
        let access = prop_oneof![Just(Access::Read), Just(Access::Write)];
        prop_oneof![
            8 => (0..CHANNELS, 0u64..3, 0u64..64, 1u64..16, 1u8..=3).prop_map(
                |(channel, file, start, len, perms)| {
                    Op::Apply(Update::Install(spec(channel, file, start, len, perms)))
                }
            ),
            1 => (0..=CHANNELS, 0u64..3, 0u64..64, 0u64..16, 0u8..=4).prop_map(
                |(channel, file, start, len, perms)| {
                    Op::Apply(Update::Install(spec(channel, file, start, len, perms)))
                }
            ),
            1 => (0..=CHANNELS).prop_map(|channel| Op::Apply(Update::ClearChannel(channel))),
            2 => (0..=CHANNELS, 0u64..3)
                .prop_map(|(channel, file)| Op::Apply(Update::RemoveFile { channel, file })),
            8 => (0..=CHANNELS, 0u64..80, 0u64..16, access)
                .prop_map(|(channel, addr, len, access)| Op::Check { channel, addr, len, access }),
        ]
    }

    /// What a check must answer, judged from a plain list of records.
    fn expected_outcome(
        records: &[RecordSpec],
        addr: u64,
        len: u64,
        access: Access,
    ) -> CheckOutcome {
        let Some(end) = addr.checked_add(len).filter(|_| len > 0) else {
            return CheckOutcome::Missing;
        };
        match records
            .iter()
            .find(|r| r.start <= addr && end <= r.start + r.len)
        {
            None => CheckOutcome::Missing,
            Some(r) if r.perms & access.perm_bit() != 0 => CheckOutcome::Allowed,
            Some(_) => CheckOutcome::Denied,
        }
    }

    /// The naive table without eviction: per channel a sorted Vec of
    /// non-overlapping records.
    struct Model {
        channels: Vec<Vec<RecordSpec>>,
    }

    impl Model {
        fn apply(&mut self, update: &Update) -> bool {
            match *update {
                Update::Install(r) => {
                    let valid = r.channel < CHANNELS
                        && r.len > 0
                        && r.start.checked_add(r.len).is_some()
                        && r.perms != 0
                        && r.perms & !(READ | WRITE) == 0;
                    if valid {
                        self.install(r);
                    }
                    valid
                }
                Update::ClearChannel(channel) => {
                    let valid = channel < CHANNELS;
                    if valid {
                        self.channels[usize::from(channel)].clear();
                    }
                    valid
                }
                Update::RemoveFile { channel, file } => {
                    let valid = channel < CHANNELS;
                    if valid {
                        self.channels[usize::from(channel)].retain(|r| r.file != file);
                    }
                    valid
                }
            }
        }

        /// Cut, insert, then merge every adjacent same-file, same-bits pair.
        fn install(&mut self, new: RecordSpec) {
            let records = &mut self.channels[usize::from(new.channel)];
            let new_end = new.start + new.len;
            let mut kept = Vec::new();
            for old in records.drain(..) {
                let old_end = old.start + old.len;
                if old_end <= new.start || old.start >= new_end {
                    kept.push(old);
                    continue;
                }
                if old.start < new.start {
                    kept.push(RecordSpec {
                        len: new.start - old.start,
                        ..old
                    });
                }
                if old_end > new_end {
                    kept.push(RecordSpec {
                        start: new_end,
                        len: old_end - new_end,
                        ..old
                    });
                }
            }
            kept.push(new);
            kept.sort_by_key(|r| r.start);
            for r in kept {
                match records.last_mut() {
                    Some(last)
                        if last.start + last.len == r.start
                            && last.file == r.file
                            && last.perms == r.perms =>
                    {
                        last.len += r.len;
                    }
                    _ => records.push(r),
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn protection_matches_naive_model_without_eviction(
            ops in prop::collection::vec(op(), 1..200),
        ) {
            // 3 channels × at most 79 one-byte records: never full.
            let mut table = PermissionTable::new(1024, CHANNELS);
            let mut model = Model { channels: vec![Vec::new(); usize::from(CHANNELS)] };
            for op in &ops {
                match *op {
                    Op::Apply(update) => {
                        let accepted = table.apply(&update).is_ok();
                        prop_assert_eq!(accepted, model.apply(&update));
                    }
                    Op::Check { channel, addr, len, access } => {
                        let check = table.check(channel, addr, len, access);
                        let records = model
                            .channels
                            .get(usize::from(channel))
                            .map_or(&[][..], |r| &r[..]);
                        let expected = expected_outcome(records, addr, len, access);
                        prop_assert_eq!(check.outcome, expected);
                        prop_assert!(check.steps <= table.depth(channel));
                    }
                }
                table.check_invariants();
                for channel in 0..CHANNELS {
                    let expected = &model.channels[usize::from(channel)];
                    prop_assert_eq!(&table.records_of(channel), expected);
                }
            }
            prop_assert_eq!(table.stats().evictions, 0);
        }

        #[test]
        fn protection_small_table_keeps_invariants_and_justifies_checks(
            capacity in 1u32..6,
            ops in prop::collection::vec(op(), 1..200),
        ) {
            let mut table = PermissionTable::new(capacity, CHANNELS);
            for op in &ops {
                match *op {
                    Op::Apply(update) => {
                        if table.apply(&update).is_ok() {
                            if let Update::Install(r) = update {
                                // The grant just installed is never the victim.
                                for access in [Access::Read, Access::Write] {
                                    if r.perms & access.perm_bit() != 0 {
                                        let check = table.check(r.channel, r.start, r.len, access);
                                        prop_assert_eq!(check.outcome, CheckOutcome::Allowed);
                                    }
                                }
                            }
                        }
                    }
                    Op::Check { channel, addr, len, access } => {
                        let check = table.check(channel, addr, len, access);
                        let records = table.records_of(channel);
                        let expected = expected_outcome(&records, addr, len, access);
                        prop_assert_eq!(check.outcome, expected);
                        prop_assert!(check.steps <= table.depth(channel));
                    }
                }
                table.check_invariants();
                let stats = table.stats();
                prop_assert!(stats.records_in_use <= capacity);
                let listed: usize = (0..CHANNELS).map(|c| table.records_of(c).len()).sum();
                prop_assert_eq!(listed, stats.records_in_use as usize);
            }
        }
    }
}

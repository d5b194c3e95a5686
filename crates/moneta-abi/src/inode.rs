//! A file's identity on its file system: the key of the daemon's file
//! grants (SPEC §3.4), here so that everything naming a file (the file
//! table, the layout watch, the passes over /proc, tests) shares one type
//! without depending on the file table.

/// A file's identity on its file system (st_dev, st_ino).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InodeId {
    pub dev: u64,
    pub ino: u64,
}

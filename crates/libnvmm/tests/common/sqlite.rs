//! SQLite in an NVMM region (issue 24: a real application): the database
//! image lives in the region and SQLite runs on it in place through its
//! in-memory VFS (`sqlite3_deserialize` of the region's bytes, neither
//! copied nor resizable), so every page SQLite reads or writes is a load
//! or store the DRAM cache and the flash serve. Durability is libnvmm's:
//! after each COMMIT the database's size goes into a header and
//! `Nvmm::sync` makes both durable at once; a crash at any point reopens
//! to the last synced commit.
//!
//! Region layout: the first 64 KB page is the header (magic, database
//! bytes), the database image starts at 64 KB.

use nvmm::Nvmm;
use rusqlite::{ffi, Connection};

pub const HEADER_BYTES: u64 = 64 << 10;
const MAGIC: u64 = 0x4e56_4d4d_5351_4c31; // "NVMMSQL1"

extern "C" {
    // In libsqlite3 ≥ 3.36 (always compiled in); rusqlite's bundled
    // bindings for old versions do not declare it.
    fn sqlite3_deserialize(
        db: *mut ffi::sqlite3,
        schema: *const std::ffi::c_char,
        data: *mut u8,
        size_db: i64,
        size_buf: i64,
        flags: u32,
    ) -> std::ffi::c_int;
}

/// The database of `region`, opened in place.
pub fn open_in(region: &Nvmm) -> Connection {
    let mut header = [0u8; 16];
    region.read(0, &mut header).unwrap();
    let magic = u64::from_le_bytes(header[..8].try_into().unwrap());
    let size = if magic == MAGIC {
        u64::from_le_bytes(header[8..].try_into().unwrap())
    } else {
        0
    };
    // SAFETY: the region outlives the connection (callers drop it first);
    // its bytes from HEADER_BYTES on are the database's.
    unsafe {
        open_on(
            region.as_ptr().add(HEADER_BYTES as usize),
            size,
            region.len() - HEADER_BYTES,
        )
    }
}

/// A connection on `capacity` bytes at `data` holding a database of `size`
/// bytes (0: empty).
///
/// # Safety
/// `data` must stay valid and unaliased for `capacity` bytes while the
/// connection lives.
pub unsafe fn open_on(data: *mut u8, size: u64, capacity: u64) -> Connection {
    let c = Connection::open_in_memory().unwrap();
    // SAFETY: the caller's promise; flags 0: SQLite neither frees nor
    // resizes the buffer, the database grows within `capacity`.
    let rc = unsafe {
        sqlite3_deserialize(
            c.handle(),
            c"main".as_ptr(),
            data,
            size as i64,
            capacity as i64,
            0,
        )
    };
    assert_eq!(rc, 0, "sqlite3_deserialize");
    c.execute_batch("PRAGMA journal_mode=MEMORY; PRAGMA cache_size=-256;")
        .unwrap();
    c
}

/// Record the database's size and make it durable with the region.
pub fn checkpoint(region: &Nvmm, c: &Connection) -> u64 {
    let pages: u64 = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    let page_size: u64 = c.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(&MAGIC.to_le_bytes());
    header[8..].copy_from_slice(&(pages * page_size).to_le_bytes());
    region.write(0, &header).unwrap();
    region.sync().unwrap()
}

pub const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS item(id INTEGER PRIMARY KEY, txn INTEGER, k INTEGER, v BLOB);
     CREATE INDEX IF NOT EXISTS item_k ON item(k);
     CREATE TABLE IF NOT EXISTS progress(txn INTEGER PRIMARY KEY, rows INTEGER);";

/// Rows transaction `txn` inserts.
pub fn rows_of(txn: u64) -> u64 {
    1 + txn % 50
}

/// Transaction `txn`: insert its rows (random keys, 200-byte values),
/// update a few old rows, record it in `progress`; committed.
pub fn transaction(c: &Connection, txn: u64) {
    let tx = c.unchecked_transaction().unwrap();
    let mut x = txn.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for _ in 0..rows_of(txn) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        tx.execute(
            "INSERT INTO item(txn, k, v) VALUES (?1, ?2, randomblob(200))",
            (txn as i64, (x >> 16) as i64),
        )
        .unwrap();
    }
    tx.execute(
        "UPDATE item SET v = randomblob(200) WHERE id IN (SELECT id FROM item WHERE k > ?1 LIMIT 5)",
        [((x >> 20) as i64)],
    )
    .unwrap();
    tx.execute(
        "INSERT INTO progress(txn, rows) VALUES (?1, ?2)",
        (txn as i64, rows_of(txn) as i64),
    )
    .unwrap();
    tx.commit().unwrap();
}

/// The last transaction in the database, after checking it is whole:
/// `PRAGMA integrity_check` says ok and every recorded transaction's rows
/// are all there (none of a later one).
pub fn verify(c: &Connection) -> u64 {
    let check: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok", "integrity_check");
    let last: i64 = c
        .query_row("SELECT coalesce(max(txn), 0) FROM progress", [], |r| {
            r.get(0)
        })
        .unwrap();
    let count: i64 = c
        .query_row("SELECT count(*) FROM progress", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, last, "transactions 1..={last} all recorded");
    let rows: i64 = c
        .query_row("SELECT count(*) FROM item", [], |r| r.get(0))
        .unwrap();
    let want: u64 = (1..=last as u64).map(rows_of).sum();
    assert_eq!(rows as u64, want, "rows of transactions 1..={last}");
    last as u64
}

//! Memory technologies and their array latencies (SPEC §1.8).
//!
//! Latencies are whole nanoseconds; the SC'10 half-nanosecond values are
//! rounded up (the prototype itself inserts latency in 4 ns steps).

/// A memory technology's array read and write latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Technology {
    pub name: &'static str,
    pub latency_ns_read: u64,
    pub latency_ns_write: u64,
    pub source: &'static str,
}

pub const TECHNOLOGIES: &[Technology] = &[
    Technology {
        name: "dram",
        latency_ns_read: 25,
        latency_ns_write: 25,
        source: "DDR3 25–50 ns, SC'10 Table I",
    },
    Technology {
        name: "pcm",
        latency_ns_read: 48,
        latency_ns_write: 150,
        source: "PCM, Lee ISCA'09; Moneta default",
    },
    Technology {
        name: "pcm-sc10",
        latency_ns_read: 68,
        latency_ns_write: 215,
        source: "PCM 67.5/215 ns, SC'10 Table I",
    },
    Technology {
        name: "pcm-optimistic",
        latency_ns_read: 50,
        latency_ns_write: 150,
        source: "NVMM table",
    },
    Technology {
        name: "pcm-expected",
        latency_ns_read: 125,
        latency_ns_write: 1000,
        source: "NVMM table",
    },
    Technology {
        name: "p8p-pcm",
        latency_ns_read: 314,
        latency_ns_write: 120_000,
        source: "Micron P8P PCM as Onyx drives it: 314 ns per 16 B read, 120 µs per 64 B buffered write (SPEC §5; the onyx controller times from [onyx])",
    },
    Technology {
        name: "stt-mram",
        latency_ns_read: 30,
        latency_ns_write: 95,
        source: "STT-MRAM 29.5/95 ns, SC'10 Table I",
    },
    Technology {
        name: "slc-nand",
        latency_ns_read: 25_000,
        latency_ns_write: 200_000,
        source: "SLC NAND 25/200 µs",
    },
    Technology {
        name: "slc-nand-8",
        latency_ns_read: 3125,
        latency_ns_write: 200_000,
        source: "SLC/8: a read latency reachable by design trade-offs (NVMM table: Micron 2012; Micheloni et al. 2010)",
    },
    Technology {
        name: "slc-nand-4",
        latency_ns_read: 6250,
        latency_ns_write: 200_000,
        source: "SLC/4 (NVMM table: Micheloni et al. 2010)",
    },
    Technology {
        name: "slc-nand-2",
        latency_ns_read: 12_500,
        latency_ns_write: 200_000,
        source: "SLC/2 (NVMM table: Micron 2012)",
    },
    Technology {
        name: "mlc-nand",
        latency_ns_read: 50_000,
        latency_ns_write: 1_200_000,
        source: "MLC NAND 50 µs / 1.2 ms",
    },
];

/// Every technology's name, in table order (for error messages).
pub fn names() -> Vec<&'static str> {
    TECHNOLOGIES.iter().map(|t| t.name).collect()
}

impl Technology {
    pub fn find(name: &str) -> Option<&'static Technology> {
        TECHNOLOGIES.iter().find(|t| t.name == name)
    }
}

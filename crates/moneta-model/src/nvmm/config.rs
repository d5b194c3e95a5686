//! NVMM configuration as data (SPEC §7; DESIGN.md "Configuration as data").
//!
//! Presets live in `presets/nvmm-*.toml`; `nvmm-mlc` sets every key and is
//! the schema, the others `inherits` it and override what their system
//! changes. Loading goes through the project's layering (`config::layer`):
//! unknown keys, missing keys and bad enum values are errors that name the
//! key and list what is allowed. A layer that names `flash.technology`
//! without latencies gets the technology's read/program latencies
//! (`config::TECHNOLOGIES`, SPEC §1.8 and the report's table) and its erase
//! time and endurance from [`FLASH_ERASE`], so a name never disagrees with
//! its timing.

use crate::config::layer::{self, Layered, Layering};
use crate::config::{err, ConfigError, Technology};
use serde::{Deserialize, Serialize};
use toml::{Table, Value};

/// NVMM's presets, layered as the device's (`config::layer`); `nvmm-mlc`
/// sets every key (the schema); named technologies bring their timing.
const NVMM: Layering = Layering {
    presets: NVMM_PRESETS,
    root: "nvmm-mlc",
    what: "NVMM preset",
    implied: technologies,
};

/// (name, TOML) of every NVMM preset.
pub const NVMM_PRESETS: &[(&str, &str)] = &[
    ("nvmm-mlc", include_str!("../../presets/nvmm-mlc.toml")),
    ("nvmm-slc", include_str!("../../presets/nvmm-slc.toml")),
    ("nvmm-slc-2", include_str!("../../presets/nvmm-slc-2.toml")),
    ("nvmm-slc-4", include_str!("../../presets/nvmm-slc-4.toml")),
    ("nvmm-slc-8", include_str!("../../presets/nvmm-slc-8.toml")),
    ("nvmm-pcm", include_str!("../../presets/nvmm-pcm.toml")),
    (
        "nvmm-pcm-optimistic",
        include_str!("../../presets/nvmm-pcm-optimistic.toml"),
    ),
    (
        "nvmm-mlc-onfi4",
        include_str!("../../presets/nvmm-mlc-onfi4.toml"),
    ),
];

/// Erase time and endurance of the backing-store technologies of the
/// report's table ("Technology / Read ns / Write ns / Erase"); read and
/// program latencies come from `config::TECHNOLOGIES`.
pub struct FlashErase {
    pub technology: &'static str,
    pub erase_ns: u64,
    /// Mean program/erase cycles a page survives (assumption: typical
    /// 2010-era datasheet figures; the report gives none).
    pub endurance_cycles: u64,
    pub source: &'static str,
}

pub const FLASH_ERASE: &[FlashErase] = &[
    FlashErase {
        technology: "slc-nand",
        erase_ns: 1_500_000,
        endurance_cycles: 100_000,
        source: "SLC erase 1.5 ms [Micron 2012] (NVMM table); 100K cycles (assumption)",
    },
    FlashErase {
        technology: "slc-nand-2",
        erase_ns: 1_500_000,
        endurance_cycles: 100_000,
        source: "as SLC (NVMM table)",
    },
    FlashErase {
        technology: "slc-nand-4",
        erase_ns: 1_500_000,
        endurance_cycles: 100_000,
        source: "as SLC (NVMM table)",
    },
    FlashErase {
        technology: "slc-nand-8",
        erase_ns: 1_500_000,
        endurance_cycles: 100_000,
        source: "as SLC (NVMM table)",
    },
    FlashErase {
        technology: "mlc-nand",
        erase_ns: 3_000_000,
        endurance_cycles: 10_000,
        source: "MLC erase 3 ms [Micron 2012] (NVMM table); 10K cycles (assumption)",
    },
    FlashErase {
        technology: "pcm-optimistic",
        erase_ns: 0,
        endurance_cycles: 100_000_000,
        source: "PCM: no erase (n/a in the NVMM table); 10^8 writes (Lee ISCA'09)",
    },
    FlashErase {
        technology: "pcm-expected",
        erase_ns: 0,
        endurance_cycles: 100_000_000,
        source: "PCM: no erase (n/a in the NVMM table); 10^8 writes (Lee ISCA'09)",
    },
];

/// ONFI interface generation of the flash channels.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Onfi {
    /// ONFI 3.x NV-DDR2: 400 MB/s per 8-bit channel ("the latest ONFI
    /// standard is capable of bandwidths up to 400 MB/s", the report; ONFI 3.2).
    Onfi3,
    /// ONFI 4.0: 800 MB/s ("increases individual device bandwidth up to 800
    /// MB/s", the report's conclusion).
    Onfi4,
}

impl Onfi {
    pub fn bytes_per_s(self) -> f64 {
        match self {
            Onfi::Onfi3 => 400e6,
            Onfi::Onfi4 => 800e6,
        }
    }
}

/// How a command shares a flash channel with data transfers.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommandPriority {
    /// A command waits for every transfer booked on the channel and goes
    /// only into a gap before data booked for later (the model before
    /// issue 23's fourth pass: a command behind queued return data waits
    /// for all of it).
    Gaps,
    /// "The flash controller in NVMM accomplishes this by giving commands
    /// priority over return data on the package interface. This ensures
    /// that a plane can begin working on its next access while
    /// simultaneously sending back the data from its last access.
    /// Alternatively, the return data using the interface would prevent the
    /// command from being sent, and the plane would sit idle during the data
    /// transmission" (the report, SPEC §7): a command waits only for other
    /// commands and for write data going in; return data pauses for it.
    Interrupt,
}

/// How the flash controller queues reads against programs (`flash.rs`,
/// step 1).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Queues {
    /// One FTL queue and one queue per die for every operation, in order.
    Shared,
    /// Reads in an FTL queue and die queues of their own, programs and
    /// erases in another pair (NVDIMMSim's `readQueues` / `writeQueues`,
    /// `FTL_READ_QUEUE_LENGTH` / `FTL_WRITE_QUEUE_LENGTH`: the report's
    /// authors' flash simulator).
    Split,
}

/// What a warm workload finds in NVMM's DRAM cache (`controller.start_blocks`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartBlocks {
    Footprint,
    Other,
}

/// Where the SSD writes a page it is given.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteAllocation {
    /// Every logical page at a fixed striped physical page (in place).
    Home,
    /// Out of place: each write goes to the next page of a log striped
    /// over the planes, and the page is read from where it was last
    /// written ("For the virtual page that is evicted from the main
    /// memory, the SSD allocates a new physical page slot and issues a
    /// write to the appropriate device", the report).
    Log,
}

/// Where the pages of one flash block are.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// A block's pages on one plane (SPEC §7 taken literally: a virtual
    /// page's segments N … N+7 in one block of one plane, so they are read
    /// and programmed one after another).
    Block,
    /// A block's consecutive pages on consecutive planes (a stripe across
    /// channels, as SSDs stripe "in a RAID manner across multiple flash
    /// devices", the report): the page table is unchanged, the segments of
    /// a virtual page are read and programmed in parallel. Erases stay per
    /// block in the bookkeeping (a simplification: a real stripe erases a
    /// superblock).
    Interleaved,
}

/// The whole NVMM system: DRAM cache, flash, controller policies, the CPU
/// side, and the SSD baseline's host parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvmmConfig {
    pub name: String,
    pub description: String,
    pub dram: DramConfig,
    pub flash: FlashConfig,
    pub controller: ControllerConfig,
    pub journal: JournalConfig,
    pub cpu: CpuConfig,
    pub ssd: SsdConfig,
}

/// The DRAM: NVMM's cache, the SSD system's main memory, all-DRAM's memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DramConfig {
    /// A name of `config::TECHNOLOGIES` (its latencies, unless given).
    pub technology: String,
    pub latency_ns_read: u64,
    pub latency_ns_write: u64,
    /// NVMM's DRAM cache, and the SSD system's main memory (same size).
    pub capacity_bytes: u64,
    pub channels: u32,
    pub banks_per_channel: u32,
    pub channel_bytes_per_s: f64,
    /// CPU access granularity.
    pub line_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlashConfig {
    pub technology: String,
    pub read_ns: u64,
    pub program_ns: u64,
    pub erase_ns: u64,
    pub endurance_cycles: u64,
    /// Spread of page endurance (standard deviation / mean).
    pub endurance_spread: f64,
    pub onfi: Onfi,
    pub layout: Layout,
    /// Whether a command waits for return data on its channel.
    pub command_priority: CommandPriority,
    /// Whether reads queue apart from programs and erases.
    pub queues: Queues,
    pub channels: u32,
    pub volumes_per_channel: u32,
    pub dies_per_volume: u32,
    pub planes_per_die: u32,
    pub blocks_per_plane: u32,
    pub pages_per_block: u32,
    /// Flash page = DRAM cache block (4, 8 or 16 KB).
    pub page_bytes: u64,
    /// Command and address cycles of one operation on the channel.
    pub command_ns: u64,
    /// Translation of one command by the FTL.
    pub ftl_ns: u64,
    pub ftl_queue_entries: u32,
    pub die_queue_entries: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    pub ways: u32,
    /// Pages after a missing one to fetch (0: no prefetch; 16 in the report).
    pub prefetch_pages: u32,
    /// Write back the next-to-evict page of a set when it is dirty.
    pub early_writeback: bool,
    /// Return a missed line once its 64 B have crossed the flash channel
    /// (true), or once the whole flash page has (false: HybridSim answers
    /// the CPU when the page's read has completed, NVDIMMSim's
    /// `CRIT_LINE_FIRST = 0`).
    pub critical_word_first: bool,
    /// Whether the blocks a workload starts with in the DRAM cache are
    /// dirty (true) or clean (false: HybridSim's `PREFILL_CACHE` fills
    /// the cache before the measured run with `PREFILL_CACHE_DIRTY = 0`).
    pub start_dirty: bool,
    /// Which blocks those are: the footprint's last (`"footprint"`: the
    /// data the workload just wrote) or blocks of other data
    /// (`"other"`, always clean: a prefill of addresses the workload does
    /// not touch, as HybridSim's prefill of "the first CACHE_PAGES pages
    /// of the address space" would be if the workload's data lay above).
    pub start_blocks: StartBlocks,
    /// Tag check and hit/miss decision in the controller.
    pub controller_ns: u64,
    /// Entries of the TLB-like cache of page-table entries.
    pub mapping_cache_entries: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalConfig {
    /// Upper-table entries per virtual page (the report: 1B entries for
    /// 2^28 pages = 3 previous versions per page).
    pub versions_per_page: u32,
    /// Garbage collection starts below this many free blocks per plane.
    pub gc_free_blocks: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuConfig {
    /// Cores; threads beyond this share them.
    pub cores: u32,
    /// Computation between two memory accesses of a thread.
    pub think_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SsdConfig {
    /// OS page size.
    pub page_bytes: u64,
    /// PCIe 3.0 ×16 (the report's NVMe SSD).
    pub link_bytes_per_s: f64,
    /// SSD controller: command fetch, FTL, completion (assumption).
    pub controller_ns: u64,
    /// Measured software time per access at the SLC (25 µs) and MLC (75 µs)
    /// points (the report's table: 46.5 µs and 73.4 µs).
    pub software_ns_slc: u64,
    pub software_ns_mlc: u64,
    pub software_anchor_ns_slc: u64,
    pub software_anchor_ns_mlc: u64,
    /// Share of the software time spent before the device is started
    /// (fault, file system, block layer); the rest after (interrupt, wake).
    pub software_before_fraction: f64,
    /// Swap readahead of anonymous memory: 2^page-cluster pages.
    pub swap_readahead_pages: u32,
    /// File readahead window (read-around) for mmap faults.
    pub file_readahead_pages: u32,
    /// mmap faults missing readahead after which read-around stops.
    pub mmap_miss_limit: u32,
    /// Where the SSD writes evicted pages.
    pub write_allocation: WriteAllocation,
    /// The controller's write buffer gathers evicted OS pages until one
    /// flash page is full and programs it once (with `write_allocation =
    /// "log"`); false: each OS page is programmed into a flash page of its
    /// own. The report: the SSD controller "typically has a small amount of
    /// SRAM or DRAM to cache metadata and to buffer writes [Marvell 2012]".
    #[serde(default)]
    pub write_buffer: bool,
    pub ways: u32,
}

impl NvmmConfig {
    /// A built-in preset by name.
    pub fn preset(name: &str) -> Result<NvmmConfig, ConfigError> {
        NVMM.preset(name)
    }

    /// A configuration file's text: every key, or `inherits = "PRESET"` and
    /// the keys that differ.
    pub fn from_toml(text: &str, default_name: &str) -> Result<NvmmConfig, ConfigError> {
        NVMM.load_toml(text, default_name)
    }

    pub fn from_file(path: &std::path::Path) -> Result<NvmmConfig, ConfigError> {
        NVMM.load_file(path)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serializes")
    }

    /// `key=value`, e.g. `controller.prefetch_pages=0` or
    /// `flash.technology=slc-nand` (which also sets its latencies).
    pub fn set(&mut self, assignment: &str) -> Result<(), ConfigError> {
        *self = NVMM.set(self, assignment)?;
        Ok(())
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config serializes")
    }

    /// Planes in the whole flash subsystem.
    pub fn planes(&self) -> u64 {
        let f = &self.flash;
        u64::from(f.channels)
            * u64::from(f.volumes_per_channel)
            * u64::from(f.dies_per_volume)
            * u64::from(f.planes_per_die)
    }

    pub fn flash_pages(&self) -> u64 {
        self.planes()
            * u64::from(self.flash.blocks_per_plane)
            * u64::from(self.flash.pages_per_block)
    }

    pub fn flash_bytes(&self) -> u64 {
        self.flash_pages() * self.flash.page_bytes
    }

    /// DRAM cache blocks (one flash page each).
    pub fn cache_blocks(&self) -> u64 {
        self.dram.capacity_bytes / self.flash.page_bytes
    }

    /// Reject impossible values, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        Layered::validate(self)
    }
}

impl Layered for NvmmConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let positive: [(&str, u64); 18] = [
            ("dram.capacity_bytes", self.dram.capacity_bytes),
            ("dram.channels", self.dram.channels.into()),
            ("dram.banks_per_channel", self.dram.banks_per_channel.into()),
            ("dram.line_bytes", self.dram.line_bytes),
            ("flash.read_ns", self.flash.read_ns),
            ("flash.program_ns", self.flash.program_ns),
            ("flash.endurance_cycles", self.flash.endurance_cycles),
            ("flash.channels", self.flash.channels.into()),
            (
                "flash.volumes_per_channel",
                self.flash.volumes_per_channel.into(),
            ),
            ("flash.dies_per_volume", self.flash.dies_per_volume.into()),
            ("flash.planes_per_die", self.flash.planes_per_die.into()),
            ("flash.blocks_per_plane", self.flash.blocks_per_plane.into()),
            (
                "flash.ftl_queue_entries",
                self.flash.ftl_queue_entries.into(),
            ),
            (
                "flash.die_queue_entries",
                self.flash.die_queue_entries.into(),
            ),
            ("controller.ways", self.controller.ways.into()),
            ("cpu.cores", self.cpu.cores.into()),
            ("ssd.page_bytes", self.ssd.page_bytes),
            ("ssd.ways", self.ssd.ways.into()),
        ];
        for (key, v) in positive {
            if v == 0 {
                return Err(err(key, "must be positive"));
            }
        }
        for (key, v) in [
            ("dram.channel_bytes_per_s", self.dram.channel_bytes_per_s),
            ("ssd.link_bytes_per_s", self.ssd.link_bytes_per_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(err(key, "must be a positive number"));
            }
        }
        if ![4096, 8192, 16384].contains(&self.flash.page_bytes) {
            return Err(err(
                "flash.page_bytes",
                "must be 4096, 8192 or 16384 (SPEC §7)",
            ));
        }
        if self.flash.pages_per_block < 32 || self.flash.pages_per_block > 1024 {
            return Err(err(
                "flash.pages_per_block",
                "must be 32 … 1024 (a 64 KB page's segments sit at +0 … +31 in a block)",
            ));
        }
        if self.flash.blocks_per_plane < self.journal.gc_free_blocks + 2 {
            return Err(err(
                "flash.blocks_per_plane",
                "must exceed journal.gc_free_blocks + 1",
            ));
        }
        if self.dram.line_bytes > self.flash.page_bytes || !self.dram.line_bytes.is_power_of_two() {
            return Err(err(
                "dram.line_bytes",
                "must be a power of two no larger than flash.page_bytes",
            ));
        }
        let blocks = self.cache_blocks();
        if blocks < u64::from(self.controller.ways)
            || !blocks.is_multiple_of(u64::from(self.controller.ways))
        {
            return Err(err(
                "dram.capacity_bytes",
                "must hold a whole number of sets of controller.ways flash pages",
            ));
        }
        let os_pages = self.dram.capacity_bytes / self.ssd.page_bytes;
        if !os_pages.is_multiple_of(u64::from(self.ssd.ways))
            || !self.ssd.page_bytes.is_power_of_two()
        {
            return Err(err(
                "ssd.ways",
                "dram.capacity_bytes / ssd.page_bytes must be a multiple of ssd.ways",
            ));
        }
        if self.flash_bytes() <= self.dram.capacity_bytes {
            return Err(err(
                "flash.blocks_per_plane",
                "the flash must be larger than the DRAM cache",
            ));
        }
        if self.journal.versions_per_page == 0 {
            return Err(err("journal.versions_per_page", "must be positive"));
        }
        for (key, v) in [
            ("flash.endurance_spread", self.flash.endurance_spread),
            (
                "ssd.software_before_fraction",
                self.ssd.software_before_fraction,
            ),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(err(key, "must be between 0 and 1"));
            }
        }
        if self.ssd.software_anchor_ns_mlc <= self.ssd.software_anchor_ns_slc {
            return Err(err(
                "ssd.software_anchor_ns_mlc",
                "must exceed ssd.software_anchor_ns_slc",
            ));
        }
        Ok(())
    }
}

pub fn nvmm_preset_names() -> impl Iterator<Item = &'static str> {
    NVMM_PRESETS.iter().map(|(n, _)| *n)
}

/// What the technologies a layer names imply: DRAM latencies, flash read
/// and program latencies, erase time and endurance, where the layer does
/// not give them.
fn technologies(top: &mut Table) -> Result<(), ConfigError> {
    if let Some(Value::Table(dram)) = top.get_mut("dram") {
        if let Some(name) = dram.get("technology").and_then(Value::as_str) {
            let t = technology("dram.technology", name)?;
            layer::fill_latencies(
                dram,
                &[
                    ("latency_ns_read", t.latency_ns_read),
                    ("latency_ns_write", t.latency_ns_write),
                ],
            );
        }
    }
    if let Some(Value::Table(flash)) = top.get_mut("flash") {
        if let Some(name) = flash.get("technology").and_then(Value::as_str) {
            let t = technology("flash.technology", name)?;
            let e = FLASH_ERASE.iter().find(|e| e.technology == name);
            let Some(e) = e else {
                let names: Vec<_> = FLASH_ERASE.iter().map(|e| e.technology).collect();
                return Err(err(
                    "flash.technology",
                    format!(
                        "'{name}' is not a backing-store technology (expected one of {})",
                        names.join(", ")
                    ),
                ));
            };
            layer::fill_latencies(
                flash,
                &[
                    ("read_ns", t.latency_ns_read),
                    ("program_ns", t.latency_ns_write),
                    ("erase_ns", e.erase_ns),
                    ("endurance_cycles", e.endurance_cycles),
                ],
            );
        }
    }
    Ok(())
}

fn technology(key: &str, name: &str) -> Result<&'static Technology, ConfigError> {
    Technology::find(name).ok_or_else(|| {
        err(
            key,
            format!(
                "unknown technology '{name}' (expected one of {})",
                crate::config::technology_names().join(", ")
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_loads() {
        for name in nvmm_preset_names() {
            let c = NvmmConfig::preset(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(c.name, name);
        }
        let slc = NvmmConfig::preset("nvmm-slc").unwrap();
        assert_eq!(slc.flash.read_ns, 25_000);
        assert_eq!(slc.flash.erase_ns, 1_500_000);
    }

    #[test]
    fn overrides_and_errors_name_the_key() {
        let mut c = NvmmConfig::preset("nvmm-mlc").unwrap();
        c.set("controller.prefetch_pages=0").unwrap();
        assert_eq!(c.controller.prefetch_pages, 0);
        c.set("flash.technology=slc-nand").unwrap();
        assert_eq!(c.flash.read_ns, 25_000);
        assert_eq!(c.flash.program_ns, 200_000);
        let e = c.set("flash.onfi=onfi9").unwrap_err();
        assert_eq!(e.key, "flash.onfi");
        assert!(e.message.contains("onfi3"), "{e}");
        let e = c.set("flash.layout=diagonal").unwrap_err();
        assert!(e.message.contains("interleaved"), "{e}");
        let e = c.set("flash.colour=3").unwrap_err();
        assert!(e.message.contains("pages_per_block"), "{e}");
        let e = c.set("flash.technology=unobtainium").unwrap_err();
        assert!(e.message.contains("mlc-nand"), "{e}");
        let e =
            NvmmConfig::from_toml("inherits = \"nvmm-slc\"\n[dram]\nways = 3\n", "x").unwrap_err();
        assert_eq!(e.key, "dram.ways");
        assert!(NvmmConfig::preset("nvmm-nope").is_err());
    }
}

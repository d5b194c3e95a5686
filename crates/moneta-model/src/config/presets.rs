//! The presets shipped with the binary (their layering is `layer.rs`).

/// (name, TOML text) of every preset, in the order `moneta presets` lists them.
pub const PRESETS: &[(&str, &str)] = &[
    (
        "moneta-micro10",
        include_str!("../../presets/moneta-micro10.toml"),
    ),
    ("moneta", include_str!("../../presets/moneta.toml")),
    ("moneta-d", include_str!("../../presets/moneta-d.toml")),
    ("haste", include_str!("../../presets/haste.toml")),
    ("onyx-late", include_str!("../../presets/onyx-late.toml")),
    ("onyx-early", include_str!("../../presets/onyx-early.toml")),
    (
        "ddr-ramdisk",
        include_str!("../../presets/ddr-ramdisk.toml"),
    ),
    ("null", include_str!("../../presets/null.toml")),
    (
        "quicksan-ssd",
        include_str!("../../presets/quicksan-ssd.toml"),
    ),
    (
        "quicksan-nic",
        include_str!("../../presets/quicksan-nic.toml"),
    ),
];

pub fn preset_names() -> impl Iterator<Item = &'static str> {
    PRESETS.iter().map(|(n, _)| *n)
}

/// The TOML text of a preset, with its comments (for `moneta presets --verbose`).
pub fn preset_source(name: &str) -> Option<&'static str> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

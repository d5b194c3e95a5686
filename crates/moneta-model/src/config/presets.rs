//! The presets shipped with the binary, and `inherits` resolution.

use super::{err, ConfigError};

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
];

pub fn preset_names() -> impl Iterator<Item = &'static str> {
    PRESETS.iter().map(|(n, _)| *n)
}

/// The TOML text of a preset, with its comments (for `moneta presets --verbose`).
pub fn preset_source(name: &str) -> Option<&'static str> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// The preset as a TOML tree with its `inherits` chain merged in.
pub(super) fn preset_value(name: &str) -> Result<toml::Value, ConfigError> {
    preset_value_depth(name, 0)
}

fn preset_value_depth(name: &str, depth: usize) -> Result<toml::Value, ConfigError> {
    if depth > PRESETS.len() {
        return Err(err(
            "inherits",
            format!("preset '{name}' inherits in a cycle"),
        ));
    }
    let text = preset_source(name).ok_or_else(|| {
        let names: Vec<_> = preset_names().collect();
        err(
            "",
            format!(
                "unknown preset '{name}' (expected one of {})",
                names.join(", ")
            ),
        )
    })?;
    let mut table: toml::Table = text
        .parse()
        .map_err(|e| err("", format!("preset '{name}' is not valid TOML: {e}")))?;
    match table.remove("inherits") {
        None => Ok(toml::Value::Table(table)),
        Some(toml::Value::String(parent)) => {
            let mut base = preset_value_depth(&parent, depth + 1)?;
            merge(&mut base, toml::Value::Table(table));
            Ok(base)
        }
        Some(_) => Err(err(
            "inherits",
            format!("preset '{name}': inherits must be a preset name"),
        )),
    }
}

/// Overlay `top` onto `base`, table by table.
fn merge(base: &mut toml::Value, top: toml::Value) {
    match (base, top) {
        (toml::Value::Table(b), toml::Value::Table(t)) => {
            for (k, v) in t {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

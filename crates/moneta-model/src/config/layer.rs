//! How a configuration is put together from TOML layers, the same way for
//! the built-in presets, `--config` files and `--set` overrides:
//!
//! - a layer may name its base with `inherits = "PRESET"`; the base is
//!   resolved first and the layer overlaid on it, key by key;
//! - a layer that names `memory.technology` without giving the latencies
//!   gets the technology's (SPEC §1.8), so a name never silently disagrees
//!   with the timing it stands for;
//! - the result has exactly the keys of the schema, the root preset
//!   (`moneta`, which sets every key): an unknown or missing key is an error
//!   naming it and listing the keys of its section;
//! - a value of the wrong type, or an enum value that does not exist, is an
//!   error naming its key and, for enums, the allowed values.

use super::{coerce_like, err, parse_value, presets, ConfigError, Technology};
use serde::{de::DeserializeOwned, Serialize};
use toml::{Table, Value};

/// A configuration type built by layering: both the device's
/// ([`super::Config`], presets in `presets/*.toml`) and NVMM's
/// (`crate::nvmm::NvmmConfig`, `presets/nvmm-*.toml`) go through the one
/// [`Layering`] below (issue 24: one config layering).
pub(crate) trait Layered: Serialize + DeserializeOwned {
    /// Reject impossible values, naming the key.
    fn validate(&self) -> Result<(), ConfigError>;
}

/// One family of presets and how its layers combine.
pub(crate) struct Layering {
    /// (name, TOML text) of every preset.
    pub presets: &'static [(&'static str, &'static str)],
    /// The preset that sets every key: its tree is the schema.
    pub root: &'static str,
    /// What a preset is called in errors ("preset", "NVMM preset").
    pub what: &'static str,
    /// Fill in, in a layer, what the technologies it names imply (their
    /// latencies, unless the layer gives them); an error names the key.
    pub implied: fn(&mut Table) -> Result<(), ConfigError>,
}

/// The device's presets: `memory.technology` brings its latencies.
pub(crate) const DEVICE: Layering = Layering {
    presets: presets::PRESETS,
    root: "moneta",
    what: "preset",
    implied: memory_technology,
};

fn memory_technology(top: &mut Table) -> Result<(), ConfigError> {
    if let Some(Value::Table(memory)) = top.get_mut("memory") {
        let technology = memory.get("technology").and_then(Value::as_str);
        if let Some(t) = technology.and_then(Technology::find) {
            fill_latencies(
                memory,
                &[
                    ("latency_ns_read", t.latency_ns_read),
                    ("latency_ns_write", t.latency_ns_write),
                ],
            );
        }
    }
    Ok(())
}

/// Insert each `(key, ns)` a section does not give.
pub(crate) fn fill_latencies(section: &mut Table, values: &[(&str, u64)]) {
    for &(key, ns) in values {
        section
            .entry(key)
            .or_insert(Value::Integer(ns.try_into().expect("latencies fit i64")));
    }
}

/// Parse one layer's TOML text; `origin` names it in errors.
pub(crate) fn parse(text: &str, origin: &str) -> Result<Table, ConfigError> {
    text.parse()
        .map_err(|e| err("", format!("{origin} is not valid TOML: {e}")))
}

impl Layering {
    /// The TOML text of a preset, or an error listing the presets; `key` is
    /// the key that named it (`inherits` in a file, none on the command line).
    pub fn source(&self, name: &str, key: &str) -> Result<&'static str, ConfigError> {
        self.presets
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<_> = self.presets.iter().map(|(n, _)| *n).collect();
                err(
                    key,
                    format!(
                        "unknown {} '{name}'{} (expected one of {})",
                        self.what,
                        crate::suggest::did_you_mean(name, names.iter().copied()),
                        names.join(", ")
                    ),
                )
            })
    }

    /// A preset by name.
    pub fn preset<T: Layered>(&self, name: &str) -> Result<T, ConfigError> {
        let text = self.source(name, "")?;
        let origin = format!("preset '{name}'");
        self.build(self.resolve(parse(text, &origin)?, &origin)?)
    }

    /// A configuration text: every key, or `inherits = "PRESET"` and the
    /// keys that differ; named `default_name` unless it says.
    pub fn load_toml<T: Layered>(&self, text: &str, default_name: &str) -> Result<T, ConfigError> {
        let mut table = parse(text, default_name)?;
        table
            .entry("name")
            .or_insert(Value::String(default_name.into()));
        self.build(self.resolve(table, default_name)?)
    }

    /// A configuration file (see [`Layering::load_toml`]); a file without
    /// `name` is named after the file (`my-array.toml` → `my-array`).
    pub fn load_file<T: Layered>(&self, path: &std::path::Path) -> Result<T, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::caused("", e))?;
        let stem = path
            .file_stem()
            .map_or("config".into(), |s| s.to_string_lossy());
        self.load_toml(&text, &stem)
    }

    /// A layer with its `inherits` chain resolved and overlaid (a layer
    /// with no base still gets what its technologies imply).
    pub fn resolve(&self, layer: Table, origin: &str) -> Result<Table, ConfigError> {
        self.resolve_depth(layer, origin, 0)
    }

    fn resolve_depth(
        &self,
        mut layer: Table,
        origin: &str,
        depth: usize,
    ) -> Result<Table, ConfigError> {
        let mut base = match layer.remove("inherits") {
            None => Table::new(),
            Some(Value::String(parent)) => {
                if depth > self.presets.len() {
                    return Err(err("inherits", format!("{origin} inherits in a cycle")));
                }
                let text = self.source(&parent, "inherits")?;
                let origin = format!("preset '{parent}'");
                self.resolve_depth(parse(text, &origin)?, &origin, depth + 1)?
            }
            Some(other) => {
                return Err(err(
                    "inherits",
                    format!("expected a preset name, got {} '{other}'", other.type_str()),
                ))
            }
        };
        self.overlay(&mut base, layer)?;
        Ok(base)
    }

    /// Overlay `top` onto `base`, table by table; a technology named in
    /// `top` brings what it implies unless `top` gives it.
    pub fn overlay(&self, base: &mut Table, mut top: Table) -> Result<(), ConfigError> {
        (self.implied)(&mut top)?;
        overlay_tables(base, top);
        Ok(())
    }

    /// The complete tree as a configuration: keys checked against the
    /// schema, values deserialized, the whole validated.
    pub fn build<T: Layered>(&self, tree: Table) -> Result<T, ConfigError> {
        let schema = self.schema();
        check_keys(&tree, &schema, "")?;
        let config: T = deserialize(tree, &schema)?;
        config.validate()?;
        Ok(config)
    }

    fn schema(&self) -> Table {
        let text = self
            .source(self.root, "")
            .expect("the root preset is built in");
        let tree = parse(text, self.root).expect("the root preset parses");
        self.resolve(tree, self.root)
            .expect("the root preset resolves")
    }

    /// `config` with a `key=value` override applied: the value is parsed as
    /// TOML (numbers, booleans, strings; bare words are strings), coerced
    /// to the key's type, and overlaid as a one-key layer, so naming a
    /// technology also sets its latencies.
    pub fn set<T: Layered>(&self, config: &T, assignment: &str) -> Result<T, ConfigError> {
        let (key, raw) = assignment
            .split_once('=')
            .ok_or_else(|| err(assignment, "expected key=value"))?;
        let (key, raw) = (key.trim(), raw.trim());
        let mut tree = Value::try_from(config).map_err(|e| err(key, e.to_string()))?;
        let old = lookup_mut(&mut tree, key)?;
        let mut top = coerce_like(key, old, parse_value(raw))?;
        for part in key.rsplit('.') {
            top = Value::Table(Table::from_iter([(part.to_string(), top)]));
        }
        let (Value::Table(mut tree), Value::Table(top)) = (tree, top) else {
            unreachable!("a configuration and a dotted key are tables")
        };
        self.overlay(&mut tree, top)?;
        self.build(tree)
    }
}

pub(crate) fn overlay_tables(base: &mut Table, top: Table) {
    for (key, value) in top {
        match (base.get_mut(&key), value) {
            (Some(Value::Table(b)), Value::Table(t)) => overlay_tables(b, t),
            (Some(slot), value) => *slot = value,
            (None, value) => {
                base.insert(key, value);
            }
        }
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// "unknown key (expected one of …)" for `key`, a child of `section`.
pub(super) fn unknown_key(key: &str, section: &Table) -> ConfigError {
    let names: Vec<&str> = section.keys().map(String::as_str).collect();
    err(
        key,
        format!("unknown key (expected one of {})", names.join(", ")),
    )
}

pub(crate) fn check_keys(tree: &Table, schema: &Table, prefix: &str) -> Result<(), ConfigError> {
    for (name, value) in tree {
        let key = join(prefix, name);
        match (schema.get(name), value) {
            (None, _) => return Err(unknown_key(&key, schema)),
            (Some(Value::Table(s)), Value::Table(t)) => check_keys(t, s, &key)?,
            (Some(Value::Table(_)), _) => {
                return Err(err(&key, format!("is a section ([{key}]), not a value")))
            }
            (Some(_), Value::Table(_)) => return Err(err(&key, "is a value, not a section")),
            (Some(_), _) => {}
        }
    }
    match schema.keys().find(|name| !tree.contains_key(*name)) {
        Some(name) => Err(err(
            &join(prefix, name),
            "missing (a file without `inherits = \"PRESET\"` sets every key; \
             `moneta config dump` prints them all)",
        )),
        None => Ok(()),
    }
}

/// Deserialize a tree whose keys are right. serde's message for a bad value
/// does not say where it is, so on failure each value is tried alone in the
/// schema's tree to find the key it belongs to.
pub(crate) fn deserialize<T: serde::de::DeserializeOwned>(
    tree: Table,
    schema: &Table,
) -> Result<T, ConfigError> {
    let whole = Value::Table(tree);
    let e = match whole.clone().try_into::<T>() {
        Ok(config) => return Ok(config),
        Err(e) => e,
    };
    let mut leaves = Vec::new();
    collect_leaves(&whole, "", &mut leaves);
    for (key, value) in leaves {
        let mut probe = Value::Table(schema.clone());
        *lookup_mut(&mut probe, &key)? = value.clone();
        if let Err(e) = probe.try_into::<T>() {
            return Err(err(&key, serde_message(&e)));
        }
    }
    Err(err("", serde_message(&e)))
}

fn collect_leaves<'a>(value: &'a Value, prefix: &str, out: &mut Vec<(String, &'a Value)>) {
    match value {
        Value::Table(t) => {
            for (name, v) in t {
                collect_leaves(v, &join(prefix, name), out);
            }
        }
        leaf => out.push((prefix.to_string(), leaf)),
    }
}

/// The value at a dotted key; an unknown key is an error listing its section's keys.
pub(crate) fn lookup_mut<'a>(tree: &'a mut Value, key: &str) -> Result<&'a mut Value, ConfigError> {
    let mut node = tree;
    for part in key.split('.') {
        let section = node
            .as_table_mut()
            .ok_or_else(|| err(key, "unknown key (its parent is a value, not a section)"))?;
        if !section.contains_key(part) {
            return Err(unknown_key(key, section));
        }
        node = section.get_mut(part).expect("checked");
    }
    Ok(node)
}

/// serde's message without toml's framing ("TOML parse error …" lines).
fn serde_message(e: &toml::de::Error) -> String {
    let m = e.message();
    m.lines().last().unwrap_or(m).trim().to_string()
}

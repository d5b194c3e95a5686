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

use super::{err, presets, Config, ConfigError, Technology};
use toml::{Table, Value};

/// The preset that sets every key: its tree is the schema.
const ROOT_PRESET: &str = "moneta";

/// Parse one layer's TOML text; `origin` names it in errors.
pub(crate) fn parse(text: &str, origin: &str) -> Result<Table, ConfigError> {
    text.parse()
        .map_err(|e| err("", format!("{origin} is not valid TOML: {e}")))
}

/// A layer with its `inherits` chain resolved and overlaid.
pub(super) fn resolve(mut layer: Table, origin: &str) -> Result<Table, ConfigError> {
    resolve_depth(&mut layer, origin, 0)?;
    Ok(layer)
}

fn resolve_depth(layer: &mut Table, origin: &str, depth: usize) -> Result<(), ConfigError> {
    match layer.remove("inherits") {
        None => Ok(()),
        Some(Value::String(parent)) => {
            if depth > presets::PRESETS.len() {
                return Err(err("inherits", format!("{origin} inherits in a cycle")));
            }
            let text = presets::source_or_error(&parent, "inherits")?;
            let mut base = parse(text, &format!("preset '{parent}'"))?;
            resolve_depth(&mut base, &format!("preset '{parent}'"), depth + 1)?;
            overlay(&mut base, std::mem::take(layer));
            *layer = base;
            Ok(())
        }
        Some(other) => Err(err(
            "inherits",
            format!("expected a preset name, got {} '{other}'", other.type_str()),
        )),
    }
}

/// Overlay `top` onto `base`, table by table; a technology named in `top`
/// brings its latencies unless `top` gives them.
pub(super) fn overlay(base: &mut Table, mut top: Table) {
    if let Some(Value::Table(memory)) = top.get_mut("memory") {
        let technology = memory.get("technology").and_then(Value::as_str);
        if let Some(t) = technology.and_then(Technology::find) {
            for (key, ns) in [
                ("latency_ns_read", t.latency_ns_read),
                ("latency_ns_write", t.latency_ns_write),
            ] {
                memory
                    .entry(key)
                    .or_insert(Value::Integer(ns.try_into().expect("latencies fit i64")));
            }
        }
    }
    overlay_tables(base, top);
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

/// The complete tree as a configuration: keys checked against the schema,
/// values deserialized, the whole validated.
pub(super) fn build(tree: Table) -> Result<Config, ConfigError> {
    let schema = schema();
    check_keys(&tree, &schema, "")?;
    let config: Config = deserialize(tree, &schema)?;
    config.validate()?;
    Ok(config)
}

fn schema() -> Table {
    let text = presets::preset_source(ROOT_PRESET).expect("the root preset is built in");
    parse(text, ROOT_PRESET).expect("the root preset parses")
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

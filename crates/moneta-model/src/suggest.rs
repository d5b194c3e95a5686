//! "Did you mean …?" for a name that is not one of the allowed ones: the
//! allowed name that differs only in case, else the nearest by edit
//! distance when it is close (at most a third of the name's length, and
//! at most 2 edits). Used by every "unknown X (expected one of …)" error.

/// ` (did you mean 'x'?)` or the empty string.
pub fn did_you_mean<'a>(name: &str, allowed: impl IntoIterator<Item = &'a str>) -> String {
    let allowed: Vec<&str> = allowed.into_iter().collect();
    let lower = name.to_lowercase();
    let best = allowed
        .iter()
        .find(|a| a.to_lowercase() == lower)
        .or_else(|| {
            let limit = (name.chars().count() / 3).min(2);
            allowed
                .iter()
                .map(|a| (distance(&lower, &a.to_lowercase()), a))
                .filter(|(d, _)| *d <= limit)
                .min_by_key(|(d, _)| *d)
                .map(|(_, a)| a)
        });
    match best {
        Some(a) if *a != name => format!(" (did you mean '{a}'?)"),
        _ => String::new(),
    }
}

/// Levenshtein distance over characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_then_near_names_and_nothing_for_far_ones() {
        let presets = ["moneta", "moneta-d", "onyx-late", "null"];
        assert_eq!(did_you_mean("Moneta", presets), " (did you mean 'moneta'?)");
        assert_eq!(
            did_you_mean("moneta-dd", presets),
            " (did you mean 'moneta-d'?)"
        );
        assert_eq!(
            did_you_mean("onyx-lat", presets),
            " (did you mean 'onyx-late'?)"
        );
        assert_eq!(did_you_mean("nul", presets), " (did you mean 'null'?)");
        assert_eq!(did_you_mean("xyz", presets), "");
        assert_eq!(did_you_mean("moneta", presets), "");
        assert_eq!(did_you_mean("", presets), "");
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}

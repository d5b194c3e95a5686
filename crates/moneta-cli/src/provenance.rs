//! Where a result came from: the command line, the tool's version and the
//! commit it was built from, when it ran, and, where they apply, the seed,
//! the requests per point, the emulator's verdict and whether the result is
//! partial. Every figure, page, JSON and CSV result the tool writes carries
//! it, so a number lifted from one can be traced and re-run.

use serde::Serialize;

/// The commit this binary was built from (build.rs).
pub const COMMIT: &str = env!("MONETA_COMMIT");

#[derive(Debug, Clone, Serialize)]
pub struct Provenance {
    pub tool: &'static str,
    pub version: &'static str,
    pub commit: &'static str,
    /// The whole command line, as the shell passed it.
    pub command: Vec<String>,
    /// UTC, RFC 3339, to the second.
    pub date: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_point: Option<u64>,
    /// An emulator result's verdict: whether the host kept up with the
    /// modeled device (a result the host could not keep up with is the
    /// host's, not the device's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// The run stopped before it finished (a signal, a failed point).
    pub partial: bool,
}

impl Provenance {
    /// This process's command line, now.
    pub fn here() -> Self {
        Provenance {
            tool: "moneta",
            version: env!("CARGO_PKG_VERSION"),
            commit: COMMIT,
            command: std::env::args().collect(),
            date: utc_now(),
            seed: None,
            requests_per_point: None,
            verdict: None,
            partial: false,
        }
    }

    pub fn verdict(mut self, verdict: &str) -> Self {
        self.verdict = Some(verdict.to_string());
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    pub fn requests_per_point(mut self, n: u64) -> Self {
        self.requests_per_point = Some(n);
        self
    }

    pub fn partial(mut self, partial: bool) -> Self {
        self.partial = partial;
        self
    }

    /// The command line as one shell-pasteable string.
    pub fn command_line(&self) -> String {
        self.command
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// One line for a page's or figure's footer.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{} {} (commit {}), {}: {}",
            self.tool,
            self.version,
            self.commit,
            self.date,
            self.command_line()
        );
        if let Some(seed) = self.seed {
            s.push_str(&format!("; seed {seed}"));
        }
        if let Some(n) = self.requests_per_point {
            s.push_str(&format!("; {n} requests per point"));
        }
        if let Some(v) = &self.verdict {
            s.push_str(&format!("; verdict: {v}"));
        }
        if self.partial {
            s.push_str("; PARTIAL: the run stopped before it finished");
        }
        s
    }
}

fn shell_quote(a: &str) -> String {
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

/// The wall clock as UTC RFC 3339 (civil-from-days, Howard Hinnant's
/// algorithm), without a date crate.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    utc(secs)
}

fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_176_800), "2026-12-02T02:00:00Z");
    }

    #[test]
    fn figures_and_pages_carry_it() {
        let svg = crate::plot::stamp("<svg width=\"1\"><g/></svg>", "moneta <x> & y");
        assert!(
            svg.starts_with("<svg width=\"1\">\n<metadata class=\"provenance\">moneta &lt;x&gt; &amp; y</metadata><g/>"),
            "{svg}"
        );
        let html = crate::plot::stamp("<html><body><svg></svg></body></html>", "p");
        assert!(html.contains("<footer class=\"provenance\"><small>p</small></footer>\n</body>"));
        assert!(
            !html.contains("<metadata"),
            "the page carries it once: {html}"
        );
    }

    #[test]
    fn lines_say_what_ran() {
        let p = Provenance {
            command: vec!["moneta".into(), "sim".into(), "--set".into(), "a b".into()],
            ..Provenance::here()
        }
        .seed(7)
        .partial(true);
        let l = p.line();
        assert!(l.contains("moneta sim --set 'a b'"), "{l}");
        assert!(l.contains("seed 7"));
        assert!(l.contains("PARTIAL"));
        assert!(l.contains(COMMIT));
    }
}

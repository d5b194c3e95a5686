//! A calibration check: one published number beside the model's
//! prediction, the tolerance the project accepts, and how the tables print
//! it. The checks themselves are in [`crate::calibration`] and
//! [`crate::nvmm::calibration`].

use serde::Serialize;

use crate::units::format_table_number;

/// One published number and what the model predicts for it.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub source: &'static str,
    pub published: f64,
    pub simulated: f64,
    /// Accepted relative error (0.15 = ±15%).
    pub tolerance: f64,
    pub unit: &'static str,
    /// A statement that gives a range rather than a number (SPEC §7's
    /// "1.5–2×", "< 1"): within means within these bounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bounds: Option<(f64, f64)>,
}

impl Check {
    pub fn error(&self) -> f64 {
        (self.simulated - self.published) / self.published
    }

    /// What the project accepts, as the tables print it.
    pub fn tolerance_text(&self) -> String {
        match self.bounds {
            Some(bounds) => range_text(bounds),
            None => format!("±{:.0}%", 100.0 * self.tolerance),
        }
    }

    /// The published column: the number, or for a statement that gives
    /// only a range ("between 21% and 171%", "more than", "less than"),
    /// the range.
    pub fn published_text(&self) -> String {
        match self.bounds {
            Some((low, high)) if low == self.published || high == self.published => {
                range_text((low, high))
            }
            _ => format_table_number(self.published),
        }
    }

    pub fn within(&self) -> bool {
        match self.bounds {
            Some((low, high)) => low <= self.simulated && self.simulated <= high,
            None => self.error().abs() <= self.tolerance,
        }
    }
}

/// A range as the tables print it: "low … high", "> low" (no upper
/// bound) or "< high" (a lower bound of zero).
fn range_text((low, high): (f64, f64)) -> String {
    if !high.is_finite() {
        format!("> {}", format_table_number(low))
    } else if low == 0.0 {
        format!("< {}", format_table_number(high))
    } else {
        format!(
            "{} … {}",
            format_table_number(low),
            format_table_number(high)
        )
    }
}

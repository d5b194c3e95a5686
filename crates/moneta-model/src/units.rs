//! Units and identifiers shared by every component.
//!
//! Time is an integer number of nanoseconds (`Ns`) on whatever clock drives
//! the model; names of variables say their unit (`latency_ns_read`,
//! `bandwidth_bytes_per_s`). Addresses, tags and channels are newtypes so they
//! cannot be mixed up (STYLE.md rule 4).

use serde::{Deserialize, Serialize};

/// A byte count as people type it: digits, optionally followed by K, M, G
/// or T (powers of 1024; also KiB, MiB, GiB, TiB, any case; a bare B means
/// bytes). "GB" is refused rather than guessed. Zero is a valid count (an
/// offset); callers that need a size check for it. The one parser of the
/// command line and of the NBD server's export specifications.
pub fn parse_bytes(s: &str) -> crate::error::Result<u64> {
    use crate::error::Error;
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    let bad = || {
        Error::parse(format!(
            "'{s}': expected bytes, or a number with K, M, G or T (powers of 1024)"
        ))
    };
    let n: u64 = number.parse().map_err(|_| bad())?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| Error::parse(format!("'{s}': more than 16 EiB")))
}

/// [`parse_bytes`] for sizes: zero is refused.
pub fn parse_size(s: &str) -> crate::error::Result<u64> {
    match parse_bytes(s)? {
        0 => Err(crate::error::Error::parse(format!(
            "'{s}': a size must be at least 1 byte"
        ))),
        n => Ok(n),
    }
}

/// The spellings of the binary units for [`format_size`]: bytes, then
/// 2^10, 2^20, 2^30 and 2^40 (each name is written right after the number).
pub type SizeUnits = [&'static str; 5];
/// `4 KiB`, `16 MiB`: what people read in messages.
pub const IEC_UNITS: SizeUnits = [" B", " KiB", " MiB", " GiB", " TiB"];
/// `4K`, `1M`: axis and table labels.
pub const SHORT_UNITS: SizeUnits = ["", "K", "M", "G", "T"];
/// `4k`, `1m`: what [`parse_size`] reads back (printed commands).
pub const ARG_UNITS: SizeUnits = ["", "k", "m", "g", "t"];
/// `4 KB`: figure legends, as the papers name request sizes.
pub const LEGEND_UNITS: SizeUnits = [" B", " KB", " MB", " GB", " TB"];

/// The one size formatter: `bytes` in the largest binary unit it reaches
/// (with `exact`, the largest that divides it), as a number with at most
/// three decimals and no trailing zeros, spelled with `units`. `exact`
/// sizes are always whole numbers: `1536` is `1.5K` inexact, `1536` exact.
pub fn format_size(bytes: f64, exact: bool, units: &SizeUnits) -> String {
    let mut unit = 0;
    for shift in (1..units.len()).rev() {
        let n = (10.0 * shift as f64).exp2();
        if bytes >= n && (!exact || (bytes / n).fract() == 0.0) {
            unit = shift;
            break;
        }
    }
    let number = format_label_number(bytes / (10.0 * unit as f64).exp2());
    format!("{number}{}", units[unit])
}

/// `bytes` in MiB to a tenth (`0.0 MiB`, `1.5 MiB`, `2048.0 MiB`): the
/// fixed unit of the run report's tables, where columns compare.
pub fn format_mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// A number in a label: `v` with at most three decimals and no trailing
/// zeros (`1.5`, `2`, `0.125`). What sizes ([`format_size`]) and plot axis
/// ticks print, where a value is as exact as it was given.
pub fn format_label_number(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A measured or predicted number in a table: decimals by magnitude, so a
/// column reads at about three significant digits: none from 1000 up
/// (`1234`), one from 10 (`12.3`), two below (`1.23`, `0.05`). What the
/// calibration tables and the report print for published and simulated
/// values.
pub fn format_table_number(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A comma-separated list of sizes (`--sizes 512,4k,1M`); `what` names
/// the option in errors.
pub fn parse_size_list(what: &str, list: &str) -> crate::error::Result<Vec<u64>> {
    list.split(',')
        .map(|s| parse_size(s).map_err(|e| e.context(what)))
        .collect()
}

/// A point in time or a duration, in nanoseconds.
pub type Ns = u64;

/// One 512-byte sector, the addressing unit of the command interface (SPEC §1.2).
pub const SECTOR_BYTES: u64 = 512;

/// x86's page: the unit in which `bio_add_page` builds an O_DIRECT bio
/// (Linux 2.6.18 `fs/direct-io.c`, one page of the user's buffer per call).
pub const PAGE_BYTES: u64 = 4096;

/// A byte address in the device's internal (storage) address space.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct DeviceAddr(pub u64);

/// One of the device's physical tags (64 in flight device-wide, SPEC §1.4).
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct PhysTag(pub u8);

/// A channel: a virtual interface to the device (Moneta-D, SPEC §3.1).
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ChannelId(pub u16);

/// Direction of a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

/// Time to move `bytes` at `bytes_per_s`, rounded up to the next nanosecond.
#[inline]
pub fn transfer_ns(bytes: u64, bytes_per_s: f64) -> Ns {
    if bytes == 0 {
        return 0;
    }
    ceil_to_ns(bytes as f64 * 1e9 / bytes_per_s)
}

/// `x.ceil() as Ns`, exactly (saturating, NaN → 0), without the call into
/// libm that `f64::ceil` costs on a baseline x86-64 build (it was ~2% of
/// the simulators' time).
#[inline]
fn ceil_to_ns(x: f64) -> Ns {
    let truncated = x as Ns;
    // Below 2^53 the truncation converts back exactly; above, every f64 is
    // an integer, so the comparison only rounds up a true fraction.
    if (truncated as f64) < x {
        truncated.saturating_add(1)
    } else {
        truncated
    }
}

/// A divisor fixed at configuration time (stripe, segment, row sizes,
/// controller counts): a shift and a mask when it is a power of two, as
/// the configurations almost always are, so the per-request address
/// arithmetic does not wait on hardware division. Same results as `/`, `%`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Divisor {
    value: u64,
    /// log2 of `value` when it is a power of two.
    shift: Option<u32>,
}

impl Divisor {
    /// `value` must not be 0 (the configurations are validated).
    pub fn new(value: u64) -> Divisor {
        assert!(value > 0, "a divisor of 0");
        Divisor {
            value,
            shift: value.is_power_of_two().then(|| value.trailing_zeros()),
        }
    }

    pub fn get(self) -> u64 {
        self.value
    }

    #[inline]
    pub fn quotient_of(self, x: u64) -> u64 {
        match self.shift {
            Some(s) => x >> s,
            None => x / self.value,
        }
    }

    #[inline]
    pub fn remainder_of(self, x: u64) -> u64 {
        match self.shift {
            Some(_) => x & (self.value - 1),
            None => x % self.value,
        }
    }
}

/// Nanoseconds from microseconds given as in the papers' tables.
#[inline]
pub fn us(microseconds: f64) -> Ns {
    (microseconds * 1000.0).round() as Ns
}

#[cfg(test)]
mod tests {

    #[test]
    fn sizes_are_written_in_the_largest_unit_they_reach_or_divide() {
        use super::*;
        assert_eq!(format_size(512.0, false, &SHORT_UNITS), "512");
        assert_eq!(format_size(1536.0, false, &SHORT_UNITS), "1.5K");
        assert_eq!(format_size(1536.0, true, &ARG_UNITS), "1536");
        assert_eq!(format_size(262_144.0, true, &ARG_UNITS), "256k");
        assert_eq!(format_size((3u64 << 30) as f64, true, &IEC_UNITS), "3 GiB");
        assert_eq!(format_size(4096.0, false, &LEGEND_UNITS), "4 KB");
        assert_eq!(format_mib(0), "0.0 MiB");
        assert_eq!(format_mib(3 << 19), "1.5 MiB");
        assert_eq!(format_size(0.5, false, &SHORT_UNITS), "0.5");
        for n in [1u64, 512, 4096, 1 << 20, 3 << 40, 12_345 << 10] {
            let arg = format_size(n as f64, true, &ARG_UNITS);
            assert_eq!(parse_size(&arg).ok(), Some(n), "{arg}");
        }
    }

    #[test]
    fn labels_trim_to_three_decimals_and_tables_round_by_magnitude() {
        use super::*;
        assert_eq!(format_label_number(2.0), "2");
        assert_eq!(format_label_number(1.5), "1.5");
        assert_eq!(format_label_number(0.12345), "0.123");
        assert_eq!(format_label_number(1234.5), "1234.5");
        assert_eq!(format_table_number(1234.4), "1234");
        assert_eq!(format_table_number(12.345), "12.3");
        assert_eq!(format_table_number(2.0), "2.00");
        assert_eq!(format_table_number(-0.056), "-0.06");
    }

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_guesses() {
        assert_eq!(parse_bytes("4096").ok(), Some(4096));
        assert_eq!(parse_bytes("0").ok(), Some(0));
        assert_eq!(parse_size("4k").ok(), Some(4096));
        assert_eq!(parse_size("64K").ok(), Some(64 << 10));
        assert_eq!(parse_size("512MiB").ok(), Some(512 << 20));
        assert_eq!(parse_size("4g").ok(), Some(4 << 30));
        assert_eq!(parse_size("1T").ok(), Some(1 << 40));
        assert!(parse_size("4GB").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("k").is_err());
        assert!(parse_size("99999999T").is_err());
    }

    use super::*;

    #[test]
    fn transfer_time_rounds_up() {
        assert_eq!(transfer_ns(0, 2e9), 0);
        assert_eq!(transfer_ns(1, 2e9), 1);
        assert_eq!(transfer_ns(4096, 4e9), 1024);
        assert_eq!(us(1.98), 1980);
    }

    /// The exact integer ceiling against `f64::ceil` on random, integral,
    /// huge, negative and non-finite values.
    #[test]
    fn ceil_to_ns_is_f64_ceil() {
        let seed = 7;
        eprintln!("seed {seed}");
        let mut rng = crate::kernel::Rng::new(seed);
        let mut values = vec![
            0.0,
            -0.0,
            0.5,
            1.0,
            -0.5,
            -3.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            9_007_199_254_740_993.0,
            1.8446744073709552e19,
            1e30,
        ];
        for _ in 0..100_000 {
            let bytes = rng.below(1 << 24) + 1;
            let rate = [1e15, 2e9, 1.7297e9, 4e9, 1.25e9, 3.3e9][rng.below(6) as usize];
            values.push(bytes as f64 * 1e9 / rate);
            values.push((rng.below(1 << 53) as f64) * 1e3);
        }
        for x in values {
            assert_eq!(ceil_to_ns(x), x.ceil() as Ns, "{x}");
        }
    }

    #[test]
    fn divisor_matches_division() {
        let seed = 11;
        eprintln!("seed {seed}");
        let mut rng = crate::kernel::Rng::new(seed);
        for d in [1, 2, 3, 7, 8, 512, 4096, 8192, 12288, 1 << 40, u64::MAX] {
            let divisor = Divisor::new(d);
            for _ in 0..10_000 {
                let x = rng.next_u64() >> rng.below(64);
                assert_eq!(divisor.quotient_of(x), x / d, "{x} / {d}");
                assert_eq!(divisor.remainder_of(x), x % d, "{x} % {d}");
            }
        }
    }
}

//! Dependency-free SVG line charts and self-contained HTML reports.
//!
//! The `moneta` CLI uses this module to show sweep results: a [`Chart`] holds
//! one or more [`Series`] of `(x, y)` points and renders to a standalone SVG
//! document (axes, 1-2-5 "nice" ticks or log2 request-size ticks, grid,
//! legend outside the plot area, a polyline plus markers per series, no
//! markers on a dense one).  A
//! [`Report`] strings headings, paragraphs, charts, tables and preformatted
//! text together into one HTML file with inline SVGs.  Non-finite points (and
//! non-positive values on a log axis) are skipped; all text is escaped.
//! Latency axes can be log10 (`x_log10`, `y_log10`: 1-2-5 ticks per decade).
//! [`StackedBars`] draws one stacked bar per configuration: where time goes
//! (SPEC §2.1 Table 3.1), one segment per component, colours shared by name.
//! [`stacked_svg`] puts several charts in one SVG file.

// Temporary: main.rs is still a placeholder, so nothing calls this yet.

use std::fmt::Write as _;
use std::path::Path;

/// Okabe–Ito colour-blind-friendly palette (yellow omitted: too pale on white).
const PALETTE: [&str; 7] = [
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000",
];

/// Marker shapes, cycled independently of colours so that series stay distinct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    Circle,
    Square,
    Triangle,
    Diamond,
    Cross,
}

const MARKERS: [Marker; 5] = [
    Marker::Circle,
    Marker::Square,
    Marker::Triangle,
    Marker::Diamond,
    Marker::Cross,
];

/// A series with more points than this is a line without markers.
const DENSE_POINTS: usize = 20;

/// Approximate glyph width (in px) of the sans-serif font at `size` px.
fn text_width(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * 0.6
}

/// One named line on a chart.  Points are drawn in the order given.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A series named `published <name>` holds published points: drawn as
/// crosses without a line, in the colour of the series `<name>` (the model's
/// curve they are compared with).
pub const PUBLISHED_PREFIX: &str = "published ";

/// What a title adds when the chart has published points: "; crosses:
/// published", or nothing (a title does not promise crosses it lacks).
pub fn crosses_note(has_published: bool) -> &'static str {
    if has_published {
        "; crosses: published"
    } else {
        ""
    }
}

impl Chart {
    /// The colour index and whether series `i` is published points.
    fn style(&self, i: usize) -> (usize, bool) {
        match self.series[i].name.strip_prefix(PUBLISHED_PREFIX) {
            Some(model) => (
                self.series
                    .iter()
                    .position(|s| s.name == model)
                    .unwrap_or(i),
                true,
            ),
            None => (i, false),
        }
    }
}

/// A line chart; see [`Chart::to_svg`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Log2 x axis (request sizes 512..1M), ticks labelled 512, 1K, …, 1M.
    pub x_log2: bool,
    /// Log10 x axis (latencies in a CDF).
    pub x_log10: bool,
    /// Log10 y axis (latencies).
    pub y_log10: bool,
    pub series: Vec<Series>,
}

/// An axis in "transformed" space (log2 of the value for a log2 axis).
struct Axis {
    lo: f64,
    hi: f64,
    log2: bool,
    log10: bool,
    ticks: Vec<(f64, String)>,
}

impl Axis {
    /// Position of `v` along the axis, 0.0 at `lo` and 1.0 at `hi`.
    fn frac(&self, v: f64) -> f64 {
        let t = if self.log2 {
            v.log2()
        } else if self.log10 {
            v.log10()
        } else {
            v
        };
        (t - self.lo) / (self.hi - self.lo)
    }

    /// Whole decades covering `[min, max]` (both > 0); grid lines at 1, 2
    /// and 5 × 10^k, labels at each decade (and at 2 and 5 over ≤ 2 decades).
    /// The axis reaches 3% of its span past the outer decades, so a point
    /// on a decade (a published "1×") is not drawn on the frame.
    fn log10(min: f64, max: f64) -> Axis {
        const INSET: f64 = 0.03;
        let mut lo = min.log10().floor();
        let mut hi = max.log10().ceil();
        if hi <= lo {
            hi = lo + 1.0;
        }
        if !lo.is_finite() || !hi.is_finite() {
            (lo, hi) = (0.0, 1.0);
        }
        let few = hi - lo <= 2.0;
        let mut ticks = Vec::new();
        for k in lo as i32..=hi as i32 {
            for m in [1.0, 2.0, 5.0] {
                let v = m * 10f64.powi(k);
                if v.log10() > hi + 1e-9 {
                    break;
                }
                let label = if m == 1.0 || few {
                    moneta_model::units::format_label_number(v)
                } else {
                    String::new()
                };
                ticks.push((v, label));
            }
        }
        let inset = INSET * (hi - lo);
        Axis {
            lo: lo - inset,
            hi: hi + inset,
            log2: false,
            log10: true,
            ticks,
        }
    }

    fn linear(min: f64, max: f64, target_ticks: usize) -> Axis {
        let ticks = nice_ticks(min, max, target_ticks);
        let step = if ticks.len() > 1 {
            ticks[1] - ticks[0]
        } else {
            1.0
        };
        let max_abs = ticks.iter().fold(0.0, |m: f64, t| m.max(t.abs()));
        Axis {
            lo: ticks[0],
            hi: ticks[ticks.len() - 1],
            log2: false,
            log10: false,
            ticks: ticks
                .iter()
                .map(|&t| (t, format_tick(t, step, max_abs)))
                .collect(),
        }
    }

    fn log2(min: f64, max: f64, max_ticks: usize) -> Axis {
        let mut lo = min.log2().floor();
        let mut hi = max.log2().ceil();
        if hi <= lo {
            lo -= 1.0;
            hi += 1.0;
        }
        let span = (hi - lo) as usize;
        let stride = span.div_ceil(max_ticks.max(2) - 1).max(1);
        // Every power of two gets a grid line; only every `stride`-th a label.
        let ticks = (0..=span)
            .map(|i| {
                let v = (lo + i as f64).exp2();
                let label = if i % stride == 0 {
                    format_pow2(v)
                } else {
                    String::new()
                };
                (v, label)
            })
            .collect();
        Axis {
            lo,
            hi,
            log2: true,
            log10: false,
            ticks,
        }
    }
}

/// "Nice" tick values covering `[lo, hi]`: evenly spaced by 1, 2 or 5 × 10^k,
/// roughly `target` of them, the first ≤ `lo` and the last ≥ `hi`.  A
/// degenerate or non-finite range is widened so at least two ticks result.
pub fn nice_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let (mut lo, mut hi) = if lo.is_finite() && hi.is_finite() {
        (lo.min(hi), lo.max(hi))
    } else {
        (0.0, 1.0)
    };
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        if lo == 0.0 {
            hi = 1.0;
        } else {
            let pad = lo.abs() * 0.1;
            lo -= pad;
            hi += pad;
        }
    }
    let raw = (hi - lo) / target.max(2) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * mag);
    let first = (lo / step + 1e-9).floor() as i64;
    let last = (hi / step - 1e-9).ceil() as i64;
    (first..=last.max(first + 1))
        .map(|i| {
            let v = i as f64 * step;
            if v == 0.0 {
                0.0 // avoid "-0"
            } else {
                v
            }
        })
        .collect()
}

/// Label for a linear tick `v` on an axis with spacing `step` whose largest
/// |tick| is `max_abs`: plain numbers with just enough decimals, k/M/G/T
/// suffixes from 100 000 up, exponent notation for tiny or enormous values.
fn format_tick(v: f64, step: f64, max_abs: f64) -> String {
    if v == 0.0 {
        return "0".to_string();
    }
    if !(1e-3..1e15).contains(&max_abs) {
        return format!("{v:.1e}");
    }
    let (scale, suffix) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|&(scale, _)| max_abs >= 1e5 && max_abs >= scale)
        .unwrap_or((1.0, ""));
    let decimals = (-(step / scale).log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{:.decimals$}{suffix}", v / scale)
}

/// Label for a power-of-two size: 512, 1K, 2K, …, 1M, 1G.
pub fn format_pow2(v: f64) -> String {
    moneta_model::units::format_size(v, false, &moneta_model::units::SHORT_UNITS)
}

/// Escapes `&`, `<`, `>`, `"` and `'` for XML/HTML text and attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// SVG for one marker of `shape` centred on (`x`, `y`).
fn marker_svg(shape: Marker, x: f64, y: f64, colour: &str) -> String {
    marker_svg_sized(shape, x, y, colour, 3.5)
}

/// A marker of radius `r`.
fn marker_svg_sized(shape: Marker, x: f64, y: f64, colour: &str, r: f64) -> String {
    match shape {
        Marker::Circle => format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="{colour}"/>"#),
        Marker::Square => format!(
            r#"<rect x="{:.1}" y="{:.1}" width="{w}" height="{w}" fill="{colour}"/>"#,
            x - r,
            y - r,
            w = 2.0 * r
        ),
        Marker::Triangle => format!(
            r#"<path d="M{x:.1} {:.1}L{:.1} {:.1}L{:.1} {:.1}Z" fill="{colour}"/>"#,
            y - 1.2 * r,
            x + 1.1 * r,
            y + 0.8 * r,
            x - 1.1 * r,
            y + 0.8 * r
        ),
        Marker::Diamond => format!(
            r#"<path d="M{x:.1} {:.1}L{:.1} {y:.1}L{x:.1} {:.1}L{:.1} {y:.1}Z" fill="{colour}"/>"#,
            y - 1.3 * r,
            x + 1.3 * r,
            y + 1.3 * r,
            x - 1.3 * r
        ),
        Marker::Cross => format!(
            r#"<path d="M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}" stroke="{colour}" stroke-width="2" fill="none"/>"#,
            x - r,
            y - r,
            x + r,
            y + r,
            x - r,
            y + r,
            x + r,
            y - r
        ),
    }
}

impl Chart {
    /// The points of series `i` that can be drawn (finite; x > 0 on log2 axes).
    fn drawable(&self, i: usize) -> Vec<(f64, f64)> {
        let x_log = self.x_log2 || self.x_log10;
        let y_log = self.y_log10;
        self.series[i]
            .points
            .iter()
            .copied()
            .filter(|&(x, y)| {
                x.is_finite() && y.is_finite() && (!x_log || x > 0.0) && (!y_log || y > 0.0)
            })
            .collect()
    }

    /// A standalone SVG document of `width_px` × `height_px`: title, axes,
    /// ticks, grid, one polyline with markers per series, and a legend to
    /// the right of the plot area (or below it when names are long).
    pub fn to_svg(&self, width_px: u32, height_px: u32) -> String {
        let (w, h) = canvas(width_px, height_px);
        let (w, h) = (w.max(200.0), h.max(150.0));
        let data: Vec<Vec<(f64, f64)>> = (0..self.series.len()).map(|i| self.drawable(i)).collect();
        let all = data.iter().flatten();
        let (mut x_min, mut x_max, mut y_min, mut y_max) = (
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::NEG_INFINITY,
        );
        for &(x, y) in all {
            x_min = x_min.min(x);
            x_max = x_max.max(x);
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
        let empty = x_min > x_max;
        if empty {
            (x_min, x_max, y_min, y_max) = if self.x_log2 {
                (512.0, 1048576.0, 0.0, 1.0)
            } else {
                (0.0, 1.0, 0.0, 1.0)
            };
            // Log axes need positive ends.
            if self.x_log10 {
                (x_min, x_max) = (1.0, 10.0);
            }
            if self.y_log10 {
                (y_min, y_max) = (1.0, 10.0);
            }
        }
        // Bandwidth, IOPS and latency are non-negative: anchor linear axes at 0.
        if !self.y_log10 {
            y_min = y_min.min(0.0);
        }

        // Legend geometry: on the right unless it would take > 30% of the width.
        let font = 12.0;
        let row_h = 18.0;
        let sample_w = 28.0;
        let longest = self
            .series
            .iter()
            .map(|s| text_width(&s.name, font))
            .fold(0.0, f64::max);
        let entry_w = sample_w + 6.0 + longest + 16.0;
        let n = self.series.len();
        let legend_right = n > 0 && entry_w <= w * 0.3;
        let (mut legend_cols, mut legend_rows) = (1usize, n);
        if n > 0 && !legend_right {
            legend_cols = (((w - 40.0) / entry_w).floor() as usize).clamp(1, n);
            legend_rows = n.div_ceil(legend_cols);
        }

        // Margins; the left one must fit the y tick labels.
        let top = if self.title.is_empty() { 16.0 } else { 40.0 };
        let right = if legend_right { entry_w + 20.0 } else { 20.0 };
        let x_label_h = if self.x_label.is_empty() { 0.0 } else { 22.0 };
        let mut bottom = 30.0 + x_label_h;
        if n > 0 && !legend_right {
            bottom += legend_rows as f64 * row_h + 10.0;
        }
        let plot_h = (h - top - bottom).max(40.0);
        let y_axis = if self.y_log10 {
            Axis::log10(y_min, y_max)
        } else {
            Axis::linear(y_min, y_max, ((plot_h / 45.0) as usize).clamp(2, 10))
        };
        let y_label_w = y_axis
            .ticks
            .iter()
            .map(|(_, l)| text_width(l, font))
            .fold(0.0, f64::max);
        let left = y_label_w + 14.0 + if self.y_label.is_empty() { 0.0 } else { 24.0 };
        let plot_w = (w - left - right).max(40.0);
        let x_axis = if self.x_log2 {
            Axis::log2(x_min, x_max, ((plot_w / 40.0) as usize).clamp(2, 24))
        } else if self.x_log10 {
            Axis::log10(x_min, x_max)
        } else {
            Axis::linear(x_min, x_max, ((plot_w / 90.0) as usize).clamp(2, 10))
        };
        // Leave room for the last x tick label, centred on the right edge.
        let overhang = x_axis
            .ticks
            .last()
            .map_or(0.0, |(_, l)| text_width(l, font) / 2.0 + 4.0);
        let plot_w = if legend_right {
            plot_w
        } else {
            plot_w - (overhang - right).max(0.0)
        };
        let px = |x: f64| left + x_axis.frac(x) * plot_w;
        let py = |y: f64| top + (1.0 - y_axis.frac(y)) * plot_h;
        let (plot_r, plot_b) = (left + plot_w, top + plot_h);

        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Helvetica, Arial, sans-serif" font-size="{font}">"#
        );
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        if !self.title.is_empty() {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="24" text-anchor="middle" font-size="{:.1}" font-weight="bold">{}</text>"#,
                w / 2.0,
                title_font(&self.title, w),
                escape(&self.title)
            );
        }
        // Grid and tick labels.
        s.push_str("<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
        for &(v, _) in &y_axis.ticks {
            let _ = writeln!(
                s,
                r#"<line x1="{left:.1}" y1="{y:.1}" x2="{plot_r:.1}" y2="{y:.1}"/>"#,
                y = py(v)
            );
        }
        for &(v, _) in &x_axis.ticks {
            let _ = writeln!(
                s,
                r#"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{plot_b:.1}"/>"#,
                x = px(v)
            );
        }
        s.push_str("</g>\n");
        let _ = writeln!(
            s,
            r##"<rect x="{left:.1}" y="{top:.1}" width="{plot_w:.1}" height="{plot_h:.1}" fill="none" stroke="#444"/>"##
        );
        s.push_str("<g fill=\"#333\">\n");
        for (v, label) in y_axis.ticks.iter().filter(|(_, l)| !l.is_empty()) {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end" dominant-baseline="middle">{}</text>"#,
                left - 6.0,
                py(*v),
                escape(label)
            );
        }
        for (v, label) in x_axis.ticks.iter().filter(|(_, l)| !l.is_empty()) {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                px(*v),
                plot_b + 18.0,
                escape(label)
            );
        }
        s.push_str("</g>\n");
        if !self.x_label.is_empty() {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">{}</text>"#,
                left + plot_w / 2.0,
                plot_b + 40.0,
                escape(&self.x_label)
            );
        }
        if !self.y_label.is_empty() {
            let (lx, ly) = (16.0, top + plot_h / 2.0);
            let _ = writeln!(
                s,
                r#"<text x="{lx}" y="{ly:.1}" text-anchor="middle" font-size="13" transform="rotate(-90 {lx} {ly:.1})">{}</text>"#,
                escape(&self.y_label)
            );
        }
        if empty {
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#888">no data</text>"##,
                left + plot_w / 2.0,
                top + plot_h / 2.0
            );
        }

        // Series: polyline then markers.
        for (i, pts) in data.iter().enumerate() {
            let (style, published) = self.style(i);
            let colour = PALETTE[style % PALETTE.len()];
            let shape = if published {
                Marker::Cross
            } else {
                MARKERS[style % MARKERS.len()]
            };
            let _ = writeln!(
                s,
                "<g class=\"series\"><title>{}</title>",
                escape(&self.series[i].name)
            );
            // Later series are drawn thinner on top of earlier ones, so a
            // series equal to another (reads and writes both at the link's
            // rate) still shows: a wide line under a narrow one, a large
            // marker under a small one.
            let under = (i + 1..data.len()).filter(|&j| !self.style(j).1).count() as f64;
            if pts.len() > 1 && !published {
                let coords: Vec<String> = pts
                    .iter()
                    .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                    .collect();
                let _ = writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="{:.1}" stroke-linejoin="round"/>"#,
                    coords.join(" "),
                    2.0 + 1.0 * under.min(3.0)
                );
            }
            // A dense line (a CDF's 25 points) is drawn without markers:
            // they would cover it.
            let markers = if published || pts.len() <= DENSE_POINTS {
                &pts[..]
            } else {
                &[]
            };
            for &(x, y) in markers {
                s.push_str(&marker_svg_sized(
                    shape,
                    px(x),
                    py(y),
                    colour,
                    3.0 + 1.2 * under.min(3.0),
                ));
                s.push('\n');
            }
            s.push_str("</g>\n");
        }

        // Legend, outside the plot area.
        if n > 0 {
            let (x0, y0) = if legend_right {
                (plot_r + 16.0, top + 4.0)
            } else {
                let total = legend_cols as f64 * entry_w;
                (
                    ((w - total) / 2.0).max(4.0),
                    plot_b + 30.0 + x_label_h + 8.0,
                )
            };
            s.push_str("<g class=\"legend\">\n");
            for (i, series) in self.series.iter().enumerate() {
                let (col, row) = if legend_right {
                    (0, i)
                } else {
                    (i % legend_cols, i / legend_cols)
                };
                let ex = x0 + col as f64 * entry_w;
                let ey = y0 + row as f64 * row_h + row_h / 2.0;
                let (style, published) = self.style(i);
                let colour = PALETTE[style % PALETTE.len()];
                if !published {
                    let _ = writeln!(
                        s,
                        r#"<line x1="{ex:.1}" y1="{ey:.1}" x2="{:.1}" y2="{ey:.1}" stroke="{colour}" stroke-width="2"/>"#,
                        ex + sample_w
                    );
                }
                if published || data[i].len() <= DENSE_POINTS {
                    s.push_str(&marker_svg(
                        if published {
                            Marker::Cross
                        } else {
                            MARKERS[style % MARKERS.len()]
                        },
                        ex + sample_w / 2.0,
                        ey,
                        colour,
                    ));
                }
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{ey:.1}" dominant-baseline="middle">{}</text>"#,
                    ex + sample_w + 6.0,
                    escape(&series.name)
                );
            }
            s.push_str("</g>\n");
        }
        s.push_str("</svg>\n");
        s
    }
}

/// Several charts one above the other in one SVG document, each
/// `width_px` × `height_px` (one `--plot` file for a command that draws
/// more than one figure).
pub fn stacked_svg(charts: &[Chart], width_px: u32, height_px: u32) -> String {
    let docs: Vec<String> = charts
        .iter()
        .map(|c| c.to_svg(width_px, height_px))
        .collect();
    one_below_the_other(&docs)
}

/// SVG documents one below the other in one document as wide as the
/// widest: the panels of one figure (each panel's size is its root's).
pub fn one_below_the_other(docs: &[String]) -> String {
    let sizes: Vec<(f64, f64)> = docs
        .iter()
        .map(|d| root_size(d).unwrap_or((900.0, 480.0)))
        .collect();
    let w = sizes.iter().map(|&(w, _)| w).fold(1.0, f64::max);
    let total = sizes.iter().map(|&(_, h)| h).sum::<f64>().max(1.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{total}\" viewBox=\"0 0 {w} {total}\">\n"
    );
    let mut y = 0.0;
    for (one, (_, h)) in docs.iter().zip(&sizes) {
        s.push_str(&one.replacen("<svg ", &format!("<svg y=\"{y}\" "), 1));
        y += h;
    }
    s.push_str("</svg>\n");
    s
}

/// One stacked bar per configuration, one segment per component; see
/// [`StackedBars::to_svg`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackedBars {
    pub title: String,
    pub y_label: String,
    /// (bar label, [(component, value)]) with components in stacking order,
    /// bottom first. A component keeps its colour in every bar.
    pub bars: Vec<(String, Vec<(String, f64)>)>,
    /// Show each bar as percentages of its total.
    pub percent: bool,
}

/// The families of where time goes, each with its own hue: host OS,
/// driver, user-space library, SAN transport and network, device (link,
/// queues, ring) and media (the memory controllers and array). A segment's
/// colour is its family's hue at a lightness of its own, so one component
/// has one colour in every chart and a bar reads by family at a glance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    HostOs,
    Driver,
    Library,
    Network,
    Device,
    Media,
}

impl Family {
    /// The family's hue (degrees) and saturation (%): blue, amber,
    /// magenta, violet, green, red.
    fn hue(self) -> (u32, u32) {
        match self {
            Family::HostOs => (210, 75),
            Family::Driver => (40, 90),
            Family::Library => (320, 60),
            Family::Network => (265, 45),
            Family::Device => (155, 65),
            Family::Media => (2, 70),
        }
    }

    /// The family of `c`, and `c`'s place among the family's members.
    pub fn of(c: moneta_model::breakdown::Component) -> (Family, usize) {
        use moneta_model::breakdown::Component as C;
        const FAMILIES: [(Family, &[C]); 6] = [
            (
                Family::HostOs,
                &[
                    C::SyscallEntry,
                    C::FileSystem,
                    C::BlockLayer,
                    C::Interrupt,
                    C::WakeUp,
                    C::CoreWait,
                    C::Preempted,
                    C::Return,
                ],
            ),
            (
                Family::Driver,
                &[
                    C::Tag,
                    C::CopyIn,
                    C::Pio,
                    C::DriverLock,
                    C::LockWait,
                    C::TagWait,
                    C::SpinDetect,
                    C::CopyOut,
                ],
            ),
            (Family::Library, &[C::Library, C::PermissionMiss]),
            (
                Family::Network,
                &[
                    C::BlockTransport,
                    C::TargetWait,
                    C::NetworkWait,
                    C::Network,
                    C::PacketBuffer,
                ],
            ),
            (
                Family::Device,
                &[
                    C::Retag,
                    C::Protection,
                    C::DeviceQueue,
                    C::DmaWait,
                    C::Dma,
                    C::RingWait,
                    C::Ring,
                    C::Notify,
                ],
            ),
            (Family::Media, &[C::ControllerQueue, C::Array]),
        ];
        FAMILIES
            .iter()
            .find_map(|(f, members)| members.iter().position(|&m| m == c).map(|k| (*f, k)))
            .unwrap_or((Family::Device, 0))
    }
}

/// The name of the segment that sums the components a bar chart leaves
/// out (see `output::breakdown_bars`): drawn grey.
pub const OTHER_COMPONENTS: &str = "other";

/// The colour of a component by its name: its family's hue at the
/// lightness of its place in the family (see [`Family`]); the "other"
/// segment is grey; names outside the breakdown follow the palette in the
/// chart's first-seen order.
fn component_colour_of(name: &str, first_seen: usize) -> String {
    use moneta_model::breakdown::Component;
    if name.starts_with(OTHER_COMPONENTS) {
        return "#a0a0a0".into();
    }
    match Component::ALL.iter().find(|c| c.label() == name) {
        Some(&c) => {
            let (family, k) = Family::of(c);
            let (hue, saturation) = family.hue();
            // Dark and light alternate, so that neighbours in a family differ.
            const LIGHTNESS: [u32; 8] = [32, 62, 45, 75, 38, 68, 52, 80];
            format!(
                "hsl({hue},{saturation}%,{}%)",
                LIGHTNESS[k % LIGHTNESS.len()]
            )
        }
        None => component_colour(first_seen),
    }
}

/// Angle of bar labels too long for their slot (see [`StackedBars::to_svg`]).
const SLANT_DEGREES: f64 = 35.0;

/// A bar's total above it: no "0.00", at most four digits before the point.
fn format_total(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.1e}")
    }
}

/// Colour of the `i`-th component: the palette first, then hues spread by
/// the golden angle so that neighbours differ.
fn component_colour(i: usize) -> String {
    match PALETTE.get(i) {
        Some(c) if i < PALETTE.len() - 1 => c.to_string(),
        _ => {
            let hue = (i as f64 * 137.508) % 360.0;
            let light = if i.is_multiple_of(2) { 45 } else { 65 };
            format!("hsl({hue:.0},60%,{light}%)")
        }
    }
}

impl StackedBars {
    /// Component names in first-seen order (the legend and colour order).
    fn components(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for (_, parts) in &self.bars {
            for (name, _) in parts {
                if !names.contains(&name.as_str()) {
                    names.push(name);
                }
            }
        }
        names
    }

    /// A standalone SVG document: bars left to right with their totals on
    /// top, a linear y axis from 0, and the component legend on the right.
    pub fn to_svg(&self, width_px: u32, height_px: u32) -> String {
        let (w, h) = canvas(width_px, height_px);
        let (w, h) = (w.max(300.0), h.max(200.0));
        let font = 12.0;
        let names = self.components();
        let value = |parts: &[(String, f64)], v: f64| {
            let total: f64 = parts.iter().map(|(_, v)| v.max(0.0)).sum();
            if self.percent && total > 0.0 {
                100.0 * v / total
            } else {
                v
            }
        };
        let y_max = self
            .bars
            .iter()
            .map(|(_, parts)| parts.iter().map(|&(_, v)| value(parts, v.max(0.0))).sum())
            .fold(0.0, f64::max);
        let legend_w = names
            .iter()
            .map(|n| text_width(n, font))
            .fold(0.0, f64::max)
            + 40.0;
        // Room for the title, then for the totals above the tallest bar.
        let top = if self.title.is_empty() { 16.0 } else { 40.0 } + 18.0;
        // Bar labels too long for their slot even at 9 px are drawn slanted
        // at full size, with room below the axis for the widest of them (the
        // slot is estimated with a 60 px y axis; the axis itself needs the
        // plot's height, which needs this room).
        let label_wide = self
            .bars
            .iter()
            .map(|(l, _)| text_width(l, font))
            .fold(0.0, f64::max);
        let slot_estimate = (w - 60.0 - legend_w - 20.0).max(60.0) / self.bars.len().max(1) as f64;
        let slant =
            label_wide > slot_estimate - 4.0 && font * (slot_estimate - 4.0) / label_wide < 9.0;
        let bottom = if slant {
            30.0 + label_wide * SLANT_DEGREES.to_radians().sin()
        } else {
            46.0
        };
        let plot_h = (h - top - bottom).max(40.0);
        let y_axis = Axis::linear(
            0.0,
            y_max.max(1e-9),
            ((plot_h / 45.0) as usize).clamp(2, 10),
        );
        let left = y_axis
            .ticks
            .iter()
            .map(|(_, l)| text_width(l, font))
            .fold(0.0, f64::max)
            + 38.0;
        // A slanted first label reaches left of its bar by its run.
        let left = if slant {
            let run = label_wide * SLANT_DEGREES.to_radians().cos();
            left.max(run - slot_estimate / 2.0 + 6.0)
        } else {
            left
        };
        let plot_w = (w - left - legend_w - 20.0).max(60.0);
        let py = |y: f64| top + (1.0 - y_axis.frac(y)) * plot_h;
        let slot = plot_w / self.bars.len().max(1) as f64;
        let bar_w = (slot * 0.6).min(90.0);
        // Totals and bar labels shrink to fit their slot rather than overlap.
        let widest = |texts: &mut dyn Iterator<Item = String>| {
            texts.map(|t| text_width(&t, font)).fold(0.0, f64::max)
        };
        let fit = |wide: f64| {
            if wide > slot - 4.0 {
                (font * (slot - 4.0) / wide).max(6.0)
            } else {
                font
            }
        };
        let total_font =
            fit(widest(&mut self.bars.iter().map(|(_, parts)| {
                format_total(parts.iter().map(|(_, v)| v.max(0.0)).sum())
            })));
        let label_font = if slant { font } else { fit(label_wide) };
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Helvetica, Arial, sans-serif" font-size="{font}">"#
        );
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        if !self.title.is_empty() {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="24" text-anchor="middle" font-size="{:.1}" font-weight="bold">{}</text>"#,
                w / 2.0,
                title_font(&self.title, w),
                escape(&self.title)
            );
        }
        s.push_str("<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
        for &(v, _) in &y_axis.ticks {
            let _ = writeln!(
                s,
                r#"<line x1="{left:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}"/>"#,
                left + plot_w,
                y = py(v)
            );
        }
        s.push_str("</g>\n<g fill=\"#333\">\n");
        for (v, label) in &y_axis.ticks {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end" dominant-baseline="middle">{}</text>"#,
                left - 6.0,
                py(*v),
                escape(label)
            );
        }
        s.push_str("</g>\n");
        let (lx, ly) = (16.0, top + plot_h / 2.0);
        let y_label = if self.percent {
            "% of latency"
        } else {
            self.y_label.as_str()
        };
        let _ = writeln!(
            s,
            r#"<text x="{lx}" y="{ly:.1}" text-anchor="middle" font-size="13" transform="rotate(-90 {lx} {ly:.1})">{}</text>"#,
            escape(y_label)
        );
        for (i, (label, parts)) in self.bars.iter().enumerate() {
            let x = left + slot * (i as f64 + 0.5) - bar_w / 2.0;
            let mut base = 0.0;
            let _ = writeln!(s, "<g class=\"bar\"><title>{}</title>", escape(label));
            for (name, v) in parts {
                let v = value(parts, v.max(0.0));
                if v <= 0.0 {
                    continue;
                }
                let colour =
                    component_colour_of(name, names.iter().position(|n| n == name).unwrap_or(0));
                let (y0, y1) = (py(base), py(base + v));
                let _ = writeln!(
                    s,
                    r#"<rect x="{x:.1}" y="{y1:.1}" width="{bar_w:.1}" height="{:.1}" fill="{colour}" stroke="white" stroke-width="0.5"><title>{}: {v:.2}</title></rect>"#,
                    (y0 - y1).max(0.0),
                    escape(name)
                );
                base += v;
            }
            let total: f64 = parts.iter().map(|(_, v)| v.max(0.0)).sum();
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="{total_font:.1}">{}</text>"#,
                x + bar_w / 2.0,
                py(base) - 4.0,
                format_total(total)
            );
            let (lx, ly) = (x + bar_w / 2.0, top + plot_h + 18.0);
            if slant {
                let _ = writeln!(
                    s,
                    r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="end" font-size="{label_font:.1}" transform="rotate(-{SLANT_DEGREES} {lx:.1} {ly:.1})">{}</text>"#,
                    escape(label)
                );
            } else {
                let _ = writeln!(
                    s,
                    r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="middle" font-size="{label_font:.1}">{}</text>"#,
                    escape(label)
                );
            }
            s.push_str("</g>\n");
        }
        let _ = writeln!(
            s,
            r##"<rect x="{left:.1}" y="{top:.1}" width="{plot_w:.1}" height="{plot_h:.1}" fill="none" stroke="#444"/>"##
        );
        // Legend: the top of the stack first, as the bars read.
        s.push_str("<g class=\"legend\">\n");
        let x0 = left + plot_w + 16.0;
        for (row, (i, name)) in names.iter().enumerate().rev().enumerate() {
            let y = top + 4.0 + row as f64 * 18.0;
            let _ = writeln!(
                s,
                r#"<rect x="{x0:.1}" y="{y:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" dominant-baseline="middle">{}</text>"#,
                component_colour_of(name, i),
                x0 + 18.0,
                y + 6.0,
                escape(name)
            );
        }
        s.push_str("</g>\n</svg>\n");
        s
    }
}

/// A self-contained HTML report; see [`Report::to_html`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub title: String,
    pub sections: Vec<ReportSection>,
}

/// One block of a [`Report`].
#[derive(Clone, Debug, PartialEq)]
pub enum ReportSection {
    Heading(String),
    Paragraph(String),
    Chart(Chart),
    Bars(StackedBars),
    Table {
        header: Vec<String>,
        rows: Vec<Vec<String>>,
    },
    Preformatted(String),
    /// A list of links: (text, relative address).
    Links(Vec<(String, String)>),
}

const CSS: &str = "body{font-family:Helvetica,Arial,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222;line-height:1.4}
h1{border-bottom:2px solid #0072B2;padding-bottom:.2em}
h2{margin-top:1.6em}
figure{margin:1em 0}
svg{max-width:100%;height:auto}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.3em .7em}
th{background:#f0f4f8;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tbody tr:nth-child(even){background:#fafafa}
pre{background:#f6f6f6;border:1px solid #ddd;padding:.8em;overflow-x:auto}
";

impl Report {
    /// One self-contained HTML document: inline CSS and SVG, all text escaped.
    pub fn to_html(&self) -> String {
        let mut s = String::new();
        let title = escape(&self.title);
        let _ = write!(
            s,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n<style>\n{CSS}</style>\n</head>\n<body>\n<h1>{title}</h1>\n"
        );
        for section in &self.sections {
            match section {
                ReportSection::Heading(t) => {
                    let _ = writeln!(s, "<h2>{}</h2>", escape(t));
                }
                ReportSection::Paragraph(t) => {
                    let _ = writeln!(s, "<p>{}</p>", escape(t));
                }
                ReportSection::Chart(chart) => {
                    let _ = writeln!(s, "<figure>\n{}</figure>", chart.to_svg(900, 480));
                }
                ReportSection::Bars(bars) => {
                    let _ = writeln!(s, "<figure>\n{}</figure>", bars.to_svg(900, 520));
                }
                ReportSection::Table { header, rows } => {
                    s.push_str("<table>\n<thead><tr>");
                    for cell in header {
                        let _ = write!(s, "<th>{}</th>", escape(cell));
                    }
                    s.push_str("</tr></thead>\n<tbody>\n");
                    for row in rows {
                        s.push_str("<tr>");
                        for cell in row {
                            let class = if cell.trim().parse::<f64>().is_ok() {
                                " class=\"num\""
                            } else {
                                ""
                            };
                            let _ = write!(s, "<td{class}>{}</td>", escape(cell));
                        }
                        s.push_str("</tr>\n");
                    }
                    s.push_str("</tbody>\n</table>\n");
                }
                ReportSection::Preformatted(t) => {
                    let _ = writeln!(s, "<pre>{}</pre>", escape(t));
                }
                ReportSection::Links(links) => {
                    s.push_str("<ul>\n");
                    for (text, href) in links {
                        let _ = writeln!(
                            s,
                            "<li><a href=\"{}\">{}</a></li>",
                            escape(href),
                            escape(text)
                        );
                    }
                    s.push_str("</ul>\n");
                }
            }
        }
        s.push_str("</body>\n</html>\n");
        s
    }
}

/// Write an output file: an SVG document to `*.svg`, or rendered to
/// `*.png` (raster, [`FigureArgs::dpi`]) or `*.pdf` (vector); an HTML page
/// to `*.html`. Each carries its provenance (a `<metadata>` element, a
/// page footer, a PNG `tEXt` chunk, the PDF's document information). Any
/// other name is refused, as is SVG under an HTML name. No directory is
/// created: a missing parent is an error naming it. Errors carry the path
/// in their message.
pub fn write_file(path: &Path, contents: &str) -> std::io::Result<()> {
    write_file_from(path, contents, &crate::provenance::Provenance::here())
}

/// [`write_file`] with a provenance that knows more than the command line
/// (the seed, requests per point, whether the run is partial).
pub fn write_file_from(
    path: &Path,
    contents: &str,
    provenance: &crate::provenance::Provenance,
) -> std::io::Result<()> {
    let is_svg = contents.trim_start().starts_with("<svg") || contents.starts_with("<?xml");
    check_output(path, is_svg)
        .map_err(|m| std::io::Error::new(std::io::ErrorKind::InvalidInput, m))?;
    let line = provenance.line();
    let sized = if is_svg {
        physical_size(contents)
    } else {
        contents.to_string()
    };
    let stamped = stamp(&sized, &line);
    let bytes = match output_kind(path) {
        Some(OutputKind::Png) => render_png(&stamped, &line),
        Some(OutputKind::Pdf) => render_pdf(&stamped, &line),
        _ => Ok(stamped.into_bytes()),
    }
    .map_err(|m| std::io::Error::other(format!("{}: {m}", path.display())))?;
    std::fs::write(path, bytes)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// `contents` carrying where it came from: an SVG gets a `<metadata>`
/// element right after its opening tag, an HTML page a
/// footer before `</body>`.
pub fn stamp(contents: &str, provenance: &str) -> String {
    let text = escape(provenance);
    if let Some(body_end) = contents.rfind("</body>") {
        let mut s = String::with_capacity(contents.len() + text.len() + 64);
        s.push_str(&contents[..body_end]);
        let _ = writeln!(
            s,
            "<footer class=\"provenance\"><small>{text}</small></footer>"
        );
        s.push_str(&contents[body_end..]);
        return s;
    }
    let Some(start) = contents.find("<svg") else {
        return contents.to_string();
    };
    let Some(open_end) = contents[start..].find('>').map(|i| start + i + 1) else {
        return contents.to_string();
    };
    let mut s = String::with_capacity(contents.len() + 2 * text.len() + 64);
    s.push_str(&contents[..open_end]);
    let _ = write!(s, "\n<metadata class=\"provenance\">{text}</metadata>");
    s.push_str(&contents[open_end..]);
    s
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutputKind {
    Svg,
    Png,
    Pdf,
    Html,
}

fn output_kind(path: &Path) -> Option<OutputKind> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "svg" => OutputKind::Svg,
        "png" => OutputKind::Png,
        "pdf" => OutputKind::Pdf,
        "html" | "htm" => OutputKind::Html,
        _ => return None,
    })
}

/// Whether [`write_file`] will accept `path` for a figure (`svg`: SVG, PNG
/// or PDF) or an HTML page: commands call it before they run, so a bad
/// name costs no run.
pub fn check_output(path: &Path, svg: bool) -> Result<(), String> {
    let kind = output_kind(path);
    let fits = match kind {
        Some(OutputKind::Svg | OutputKind::Png | OutputKind::Pdf) => svg,
        Some(OutputKind::Html) => !svg,
        None => false,
    };
    if !fits {
        return Err(if svg {
            format!(
                "{}: a figure is written as SVG, PNG or PDF; name the file *.svg, *.png or *.pdf",
                path.display()
            )
        } else {
            format!(
                "{}: this writes an HTML page only; name the file *.html",
                path.display()
            )
        });
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            return Err(format!(
                "{}: directory {} does not exist (not created)",
                path.display(),
                parent.display()
            ));
        }
    }
    Ok(())
}

/// [`check_output`] for a command's optional `--plot` (SVG, PNG or PDF)
/// and `--report` (HTML).
pub fn check_outputs(plot: Option<&Path>, report: Option<&Path>) -> Result<(), String> {
    plot.map_or(Ok(()), |p| check_output(p, true))?;
    report.map_or(Ok(()), |p| check_output(p, false))
}

// ---------------------------------------------------------------------------
// Figure sizes for papers, and PNG and PDF output.

/// A figure's size: for a screen (the layout's own pixels), or on paper,
/// across one column of a two-column paper or across the page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FigureSize {
    /// The layout's own pixels (900 px wide for most figures), for a browser.
    #[default]
    Screen,
    /// 3.5 in wide: one column of a two-column paper (ACM, IEEE).
    Column,
    /// 7 in wide: across both columns.
    Page,
}

impl FigureSize {
    /// The width on paper, in inches.
    pub fn width_in(self) -> Option<f64> {
        match self {
            FigureSize::Screen => None,
            FigureSize::Column => Some(3.5),
            FigureSize::Page => Some(7.0),
        }
    }
}

/// How figures are sized and rendered (options of every command that
/// writes one).
#[derive(clap::Args, Clone, Copy, Debug, PartialEq)]
pub struct FigureArgs {
    /// Figures' size: `screen` (the layout's pixels), `column` (3.5 in, one
    /// column of a two-column paper) or `page` (7 in). On paper the text is
    /// --font-pt and the file's width and height are physical (SVG in
    /// inches, PDF in points, PNG at --dpi).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        help_heading = "Figures"
    )]
    pub figure: FigureSize,
    /// Figure body text in points for `--figure column` and `page` (titles
    /// 4/3 and axis labels 13/12 of it).
    #[arg(long, global = true, default_value_t = 8.0, help_heading = "Figures")]
    pub font_pt: f64,
    /// PNG resolution in dots per inch (on paper; a screen figure's PNG has
    /// two pixels per layout pixel).
    #[arg(long, global = true, default_value_t = 300, help_heading = "Figures")]
    pub dpi: u32,
}

impl Default for FigureArgs {
    fn default() -> Self {
        FigureArgs {
            figure: FigureSize::Screen,
            font_pt: 8.0,
            dpi: 300,
        }
    }
}

/// A title's font size: 16 px, smaller where the title would not fit the
/// figure's width (a one-column figure), never below the body's 12 px less
/// a quarter.
fn title_font(title: &str, width: f64) -> f64 {
    let wide = text_width(title, 16.0);
    if wide <= width - 16.0 {
        16.0
    } else {
        (16.0 * (width - 16.0) / wide).max(9.0)
    }
}

/// The layout's body font (px); on paper it becomes [`FigureArgs::font_pt`].
const BODY_FONT_PX: f64 = 12.0;

static FIGURE: std::sync::OnceLock<FigureArgs> = std::sync::OnceLock::new();

/// Set once, by main, from the command line.
pub fn set_figure(args: FigureArgs) -> Result<(), String> {
    if !(4.0..=24.0).contains(&args.font_pt) {
        return Err(format!("--font-pt {}: from 4 to 24", args.font_pt));
    }
    if !(36..=2400).contains(&args.dpi) {
        return Err(format!("--dpi {}: from 36 to 2400", args.dpi));
    }
    let _ = FIGURE.set(args);
    Ok(())
}

thread_local! {
    /// A test's figure settings on its own thread (the process's are set once).
    static FIGURE_HERE: std::cell::Cell<Option<FigureArgs>> = const { std::cell::Cell::new(None) };
}

fn figure() -> FigureArgs {
    FIGURE_HERE
        .with(|f| f.get())
        .or_else(|| FIGURE.get().copied())
        .unwrap_or_default()
}

/// `f` with figures sized by `args` on this thread (the tests' way to draw
/// at paper sizes side by side).
#[cfg(test)]
pub(crate) fn with_figure<T>(args: FigureArgs, f: impl FnOnce() -> T) -> T {
    FIGURE_HERE.with(|c| c.set(Some(args)));
    let out = f();
    FIGURE_HERE.with(|c| c.set(None));
    out
}

/// The layout canvas (px) for a figure the caller drew at `width_px` ×
/// `height_px` on a screen: on paper, as wide as makes the body font
/// --font-pt at the paper width, and no flatter than 0.6 (a one-column
/// figure needs the height for its legend).
fn canvas(width_px: u32, height_px: u32) -> (f64, f64) {
    let (w, h) = (f64::from(width_px.max(1)), f64::from(height_px.max(1)));
    let f = figure();
    match f.figure.width_in() {
        None => (w, h),
        Some(inches) => {
            let cw = (inches * 72.0 * BODY_FONT_PX / f.font_pt).round();
            (cw, (cw * (h / w).max(0.6)).round())
        }
    }
}

/// The root element's `width` and `height` (layout px) of one of this
/// module's SVG documents.
fn root_size(svg: &str) -> Option<(f64, f64)> {
    let start = svg.find("<svg")?;
    let tag = &svg[start..start + svg[start..].find('>')?];
    let attr = |name: &str| -> Option<f64> {
        let key = format!(" {name}=\"");
        let at = tag.find(&key)? + key.len();
        tag[at..at + tag[at..].find('"')?].parse().ok()
    };
    Some((attr("width")?, attr("height")?))
}

/// On paper, the root's width and height in inches (the viewBox keeps the
/// layout); on a screen, unchanged.
fn physical_size(svg: &str) -> String {
    let Some(inches) = figure().figure.width_in() else {
        return svg.to_string();
    };
    let Some((w, h)) = root_size(svg) else {
        return svg.to_string();
    };
    let from = format!(" width=\"{w}\" height=\"{h}\"");
    let to = format!(
        " width=\"{inches:.3}in\" height=\"{:.3}in\"",
        inches * h / w
    );
    svg.replacen(&from, &to, 1)
}

/// The SVG as usvg's tree, its text in the system's fonts: Helvetica or
/// Arial where installed, else DejaVu Sans (Debian's fonts-dejavu-core).
fn svg_tree(svg: &str) -> Result<resvg::usvg::Tree, String> {
    let mut options = resvg::usvg::Options::default();
    let db = options.fontdb_mut();
    db.load_system_fonts();
    if db.is_empty() {
        return Err(
            "no fonts found for the figure's text: install fonts-dejavu-core (make setup)".into(),
        );
    }
    let has = |family: &str| {
        db.faces()
            .any(|f| f.families.iter().any(|(name, _)| name == family))
    };
    if let Some(sans) = ["Helvetica", "Arial", "Liberation Sans", "DejaVu Sans"]
        .into_iter()
        .find(|f| has(f))
    {
        db.set_sans_serif_family(sans);
    }
    resvg::usvg::Tree::from_str(svg, &options).map_err(|e| format!("rendering the figure: {e}"))
}

/// The figure rasterized: a screen figure at 2 px per layout px, a paper
/// figure at --dpi, with the provenance in a `tEXt` chunk and the
/// resolution in `pHYs`.
fn render_png(svg: &str, provenance: &str) -> Result<Vec<u8>, String> {
    use resvg::tiny_skia;
    let tree = svg_tree(svg)?;
    let f = figure();
    // usvg's size: inches at 96 px each, or the layout's px.
    let (scale, dpi) = match f.figure.width_in() {
        None => (2.0, 192.0),
        Some(_) => (f64::from(f.dpi) / 96.0, f64::from(f.dpi)),
    };
    let size = tree.size();
    let (pw, ph) = (
        (f64::from(size.width()) * scale).ceil() as u32,
        (f64::from(size.height()) * scale).ceil() as u32,
    );
    let mut pixmap = tiny_skia::Pixmap::new(pw.max(1), ph.max(1))
        .ok_or_else(|| format!("a {pw} × {ph} px image is too large"))?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        tiny_skia::Transform::from_scale(scale as f32, scale as f32),
        &mut pixmap.as_mut(),
    );
    let png = pixmap
        .encode_png()
        .map_err(|e| format!("encoding the PNG: {e}"))?;
    let per_metre = (dpi / 0.0254).round() as u32;
    let mut phys = Vec::with_capacity(9);
    phys.extend_from_slice(&per_metre.to_be_bytes());
    phys.extend_from_slice(&per_metre.to_be_bytes());
    phys.push(1);
    let mut text = b"Source\0".to_vec();
    // tEXt is Latin-1: anything else becomes '?'.
    text.extend(
        provenance
            .chars()
            .map(|c| if (c as u32) < 256 { c as u8 } else { b'?' }),
    );
    Ok(png_with_chunks(&png, &[(b"pHYs", &phys), (b"tEXt", &text)]))
}

/// `png` with `chunks` inserted right after IHDR (the first chunk: 8 bytes
/// of signature, then 4 length + 4 type + 13 data + 4 CRC).
fn png_with_chunks(png: &[u8], chunks: &[(&[u8; 4], &[u8])]) -> Vec<u8> {
    let after_ihdr = 8 + 4 + 4 + 13 + 4;
    let mut out = Vec::with_capacity(png.len() + 256);
    out.extend_from_slice(&png[..after_ihdr]);
    for (kind, data) in chunks {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&kind[..]);
        crc.update(data);
        out.extend_from_slice(&kind[..]);
        out.extend_from_slice(data);
        out.extend_from_slice(&crc.finalize().to_be_bytes());
    }
    out.extend_from_slice(&png[after_ihdr..]);
    out
}

/// The figure as a one-page vector PDF of its size (text embedded as font
/// subsets), the provenance in the document information's Subject.
fn render_pdf(svg: &str, provenance: &str) -> Result<Vec<u8>, String> {
    use pdf_writer::{Content, Finish, Name, Pdf, Rect, Ref, TextStr};
    let tree = svg_tree(svg)?;
    let (chunk, svg_ref) = svg2pdf::to_chunk(&tree, svg2pdf::ConversionOptions::default())
        .map_err(|e| format!("converting the figure to PDF: {e}"))?;
    let mut alloc = Ref::new(1);
    let (catalog, pages, page, content, info) = (
        alloc.bump(),
        alloc.bump(),
        alloc.bump(),
        alloc.bump(),
        alloc.bump(),
    );
    let mut map = std::collections::HashMap::new();
    let chunk = chunk.renumber(|old| *map.entry(old).or_insert_with(|| alloc.bump()));
    let svg_ref = map[&svg_ref];
    // usvg's px are 1/96 in; PDF's points 1/72.
    let (w, h) = (tree.size().width() * 0.75, tree.size().height() * 0.75);
    let mut pdf = Pdf::new();
    pdf.catalog(catalog).pages(pages);
    pdf.pages(pages).kids([page]).count(1);
    let mut p = pdf.page(page);
    p.media_box(Rect::new(0.0, 0.0, w, h));
    p.parent(pages);
    p.contents(content);
    p.resources().x_objects().pair(Name(b"F0"), svg_ref);
    p.finish();
    let mut c = Content::new();
    c.transform([w, 0.0, 0.0, h, 0.0, 0.0])
        .x_object(Name(b"F0"));
    pdf.stream(content, &c.finish());
    pdf.extend(&chunk);
    pdf.document_info(info)
        .creator(TextStr(&format!("moneta {}", env!("CARGO_PKG_VERSION"))))
        .producer(TextStr("moneta (svg2pdf)"))
        .subject(TextStr(provenance));
    Ok(pdf.finish())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Checks that every `<tag>` is closed by a matching `</tag>` in order
    /// (self-closing tags, comments and the doctype are skipped) and that no
    /// raw `<`, `>` or unescaped `&` appears in text.  Returns the tag count.
    pub(crate) fn check_balanced(doc: &str) -> usize {
        let mut stack: Vec<String> = Vec::new();
        let mut count = 0;
        let mut rest = doc;
        while let Some(open) = rest.find('<') {
            let text = &rest[..open];
            assert!(!text.contains('>'), "stray '>' in text {text:?}");
            for (i, _) in text.match_indices('&') {
                let ent = &text[i..];
                assert!(
                    ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"]
                        .iter()
                        .any(|e| ent.starts_with(e)),
                    "bad entity at {ent:?}"
                );
            }
            let close = rest[open..].find('>').expect("unterminated tag") + open;
            let tag = &rest[open + 1..close];
            assert!(!tag.contains('<'), "'<' inside tag {tag:?}");
            rest = &rest[close + 1..];
            if tag.starts_with('!') {
                continue;
            }
            count += 1;
            let name: String = tag
                .trim_start_matches('/')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if let Some(closing) = tag.strip_prefix('/') {
                let top = stack
                    .pop()
                    .unwrap_or_else(|| panic!("unmatched </{closing}>"));
                assert_eq!(top, name, "mismatched close tag");
            } else if !tag.ends_with('/') && !["meta", "br", "hr"].contains(&name.as_str()) {
                stack.push(name);
            }
        }
        assert!(stack.is_empty(), "unclosed tags: {stack:?}");
        count
    }

    fn sample_chart() -> Chart {
        let sizes: Vec<f64> = (9..=20).map(|k| f64::from(k).exp2()).collect();
        let curve = |peak: f64, knee: f64| -> Vec<(f64, f64)> {
            sizes.iter().map(|&s| (s, peak * s / (s + knee))).collect()
        };
        Chart {
            title: "Sequential read bandwidth vs request size".into(),
            x_label: "Request size (bytes)".into(),
            y_label: "Bandwidth (MB/s)".into(),
            x_log2: true,
            x_log10: false,
            y_log10: false,
            series: vec![
                Series {
                    name: "1 thread".into(),
                    points: curve(1400.0, 16384.0),
                },
                Series {
                    name: "2 threads".into(),
                    points: curve(2500.0, 12000.0),
                },
                Series {
                    name: "4 threads".into(),
                    points: curve(3800.0, 8000.0),
                },
                Series {
                    name: "8 threads".into(),
                    points: curve(4600.0, 4096.0),
                },
                Series {
                    name: "RAID-0 <8 ch> & \"PCIe\"".into(),
                    points: curve(5200.0, 3000.0),
                },
            ],
        }
    }

    #[test]
    fn svg_is_balanced_and_names_every_series() {
        let chart = sample_chart();
        let svg = chart.to_svg(800, 450);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(check_balanced(&svg) > 50);
        for s in &chart.series {
            assert!(svg.contains(&escape(&s.name)), "missing {}", s.name);
        }
        assert!(svg.contains("RAID-0 &lt;8 ch&gt; &amp; &quot;PCIe&quot;"));
        assert_eq!(svg.matches("<polyline").count(), chart.series.len());
    }

    #[test]
    fn log2_ticks_for_request_sizes() {
        let axis = Axis::log2(512.0, 1048576.0, 24);
        let labels: Vec<&str> = axis.ticks.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(
            labels,
            ["512", "1K", "2K", "4K", "8K", "16K", "32K", "64K", "128K", "256K", "512K", "1M"]
        );
        // And they all appear in a rendered chart of normal width.
        let svg = sample_chart().to_svg(800, 450);
        for l in labels {
            assert!(svg.contains(&format!(">{l}</text>")), "tick {l} missing");
        }
        // A narrow chart thins the ticks instead of overlapping them.
        let narrow = Axis::log2(512.0, 1048576.0, 6);
        let shown: Vec<&str> = narrow
            .ticks
            .iter()
            .map(|(_, l)| l.as_str())
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(shown, ["512", "4K", "32K", "256K"]);
        assert_eq!(
            narrow.ticks.len(),
            12,
            "grid lines stay at every power of two"
        );
    }

    #[test]
    fn linear_tick_labels() {
        assert_eq!(format_tick(0.0, 0.2, 1.0), "0");
        assert_eq!(format_tick(0.4, 0.2, 1.0), "0.4");
        assert_eq!(format_tick(4000.0, 1000.0, 6000.0), "4000");
        assert_eq!(format_tick(200000.0, 200000.0, 1.2e6), "0.2M");
        assert_eq!(format_tick(300000.0, 100000.0, 500000.0), "300k");
        assert_eq!(format_tick(2e-5, 1e-5, 5e-5), "2.0e-5");
        let axis = Axis::linear(0.0, 0.3, 4);
        let labels: Vec<&str> = axis.ticks.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["0", "0.1", "0.2", "0.3"]);
    }

    #[test]
    fn pow2_labels() {
        assert_eq!(format_pow2(512.0), "512");
        assert_eq!(format_pow2(1024.0), "1K");
        assert_eq!(format_pow2(1536.0), "1.5K");
        assert_eq!(format_pow2(1048576.0), "1M");
        assert_eq!(format_pow2(f64::from(1u32 << 30)), "1G");
    }

    #[test]
    fn escaping() {
        assert_eq!(
            escape(r#"a<b>&"c"'d"#),
            "a&lt;b&gt;&amp;&quot;c&quot;&#39;d"
        );
        assert_eq!(escape("plain µs text"), "plain µs text");
        let report = Report {
            title: "<script>alert(1)</script>".into(),
            sections: vec![
                ReportSection::Heading("A & B".into()),
                ReportSection::Paragraph("x < y".into()),
                ReportSection::Preformatted("<pre>".into()),
                ReportSection::Table {
                    header: vec!["k<".into()],
                    rows: vec![vec!["v&".into()]],
                },
            ],
        };
        let html = report.to_html();
        assert!(!html.contains("<script>"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("<h2>A &amp; B</h2>"));
        assert!(html.contains("<td>v&amp;</td>"));
        check_balanced(&html);
    }

    #[test]
    fn nice_tick_properties() {
        let cases = [
            (0.0, 1.0),
            (0.0, 4623.7),
            (0.0, 0.037),
            (-3.2, 17.9),
            (12.0, 12.0),
            (0.0, 0.0),
            (-5.0, -5.0),
            (1e-3, 2e9),
            (980.0, 1020.0),
            (7.0, 3.0),
            (f64::NAN, 1.0),
        ];
        for (lo, hi) in cases {
            for target in [2, 5, 8, 10] {
                let t = nice_ticks(lo, hi, target);
                assert!(t.len() >= 2, "{lo}..{hi}: {t:?}");
                assert!(
                    t.len() <= 2 * target + 2,
                    "{lo}..{hi} target {target}: {t:?}"
                );
                if lo.is_finite() {
                    assert!(
                        t[0] <= lo.min(hi) && *t.last().unwrap() >= lo.max(hi),
                        "{lo}..{hi}: {t:?}"
                    );
                }
                let step = t[1] - t[0];
                assert!(step > 0.0);
                let mantissa = step / 10f64.powf(step.log10().floor());
                assert!(
                    [1.0, 2.0, 5.0, 10.0]
                        .iter()
                        .any(|m| (mantissa - m).abs() < 1e-6),
                    "step {step} is not 1-2-5"
                );
                for w in t.windows(2) {
                    assert!(((w[1] - w[0]) - step).abs() <= step * 1e-9, "uneven {t:?}");
                }
            }
        }
        assert_eq!(
            nice_ticks(0.0, 4623.7, 5),
            [0.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0]
        );
        assert_eq!(nice_ticks(0.0, 0.0, 5)[0], 0.0);
    }

    #[test]
    fn degenerate_inputs_render_without_nan() {
        let chart = |series: Vec<Series>, log2: bool| Chart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_log2: log2,
            x_log10: false,
            y_log10: false,
            series,
        };
        let weird = vec![
            Series {
                name: "empty".into(),
                points: vec![],
            },
            Series {
                name: "single".into(),
                points: vec![(4096.0, 10.0)],
            },
            Series {
                name: "bad".into(),
                points: vec![
                    (f64::NAN, 1.0),
                    (8192.0, f64::INFINITY),
                    (0.0, 3.0),
                    (-1.0, 2.0),
                    (16384.0, 12.0),
                ],
            },
        ];
        for log2 in [false, true] {
            for series in [
                vec![],
                weird.clone(),
                vec![weird[1].clone()],
                vec![weird[0].clone()],
            ] {
                for (w, h) in [(800, 450), (300, 200), (0, 0)] {
                    let svg = chart(series.clone(), log2).to_svg(w, h);
                    check_balanced(&svg);
                    assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
                    for s in &series {
                        assert!(svg.contains(&s.name));
                    }
                }
            }
        }
    }

    #[test]
    fn many_series_cycle_colours_and_markers() {
        let series: Vec<Series> = (0..12)
            .map(|i| Series {
                name: format!("s{i}"),
                points: vec![(1.0, f64::from(i)), (2.0, f64::from(i) + 1.0)],
            })
            .collect();
        let svg = Chart {
            series,
            ..Chart::default()
        }
        .to_svg(800, 450);
        check_balanced(&svg);
        for c in PALETTE {
            assert!(svg.contains(c));
        }
        // Series 0 and 7 share a colour but not a marker shape.
        assert_ne!(MARKERS[0], MARKERS[PALETTE.len() % MARKERS.len()]);
        assert!(
            svg.contains("<circle")
                && svg.contains("<rect x=")
                && svg.contains("stroke-width=\"2\" fill=\"none\"/>")
        );
    }

    #[test]
    fn long_names_move_legend_below() {
        let mut chart = sample_chart();
        chart.series[0].name = "a very long series name that would squeeze the plot area".into();
        let svg = chart.to_svg(800, 450);
        check_balanced(&svg);
        // Plot frame keeps most of the width when the legend is below.
        let frame = svg.lines().find(|l| l.contains("stroke=\"#444\"")).unwrap();
        let width: f64 = frame
            .split("width=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(width > 600.0, "{frame}");
    }

    #[test]
    fn write_file_refuses_other_formats_and_missing_directories() {
        let dir = std::env::temp_dir().join(format!("moneta-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = "<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>";
        write_file(&dir.join("p.svg"), svg).unwrap();
        write_file(&dir.join("r.html"), "<!doctype html><html></html>").unwrap();
        let jpeg = write_file(&dir.join("p.jpg"), svg).unwrap_err();
        assert!(jpeg.to_string().contains("p.jpg"), "{jpeg}");
        assert!(!dir.join("p.jpg").exists());
        let html_as_png = write_file(&dir.join("r.png"), "<!doctype html>").unwrap_err();
        assert!(html_as_png.to_string().contains("HTML"), "{html_as_png}");
        let html_as_svg = write_file(&dir.join("r.svg"), "<!doctype html>").unwrap_err();
        assert!(html_as_svg.to_string().contains("HTML"), "{html_as_svg}");
        // A missing directory is named and not created.
        let deep = dir.join("a/b/p.svg");
        let err = write_file(&deep, svg).unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
        assert!(!dir.join("a").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The boxes of an SVG's unrotated `<text>` elements, from their
    /// position, anchor, font size and the same glyph-width estimate the
    /// layout uses: (x0, y0, x1, y1, text).
    fn text_boxes(svg: &str) -> Vec<(f64, f64, f64, f64, String)> {
        let attr = |tag: &str, name: &str| -> Option<String> {
            let key = format!(" {name}=\"");
            let i = tag.find(&key)? + key.len();
            Some(tag[i..i + tag[i..].find('"')?].to_string())
        };
        let mut boxes = Vec::new();
        for piece in svg.split("<text").skip(1) {
            let (tag, rest) = piece.split_once('>').expect("a text tag ends");
            if tag.contains("rotate(") {
                continue;
            }
            let text = rest.split("</text>").next().unwrap_or("").to_string();
            let num = |n: &str| attr(tag, n).and_then(|v| v.parse::<f64>().ok());
            let (Some(x), Some(y)) = (num("x"), num("y")) else {
                continue;
            };
            let size = num("font-size").unwrap_or(12.0);
            let w = text_width(&text, size);
            let x0 = match attr(tag, "text-anchor").as_deref() {
                Some("middle") => x - w / 2.0,
                Some("end") => x - w,
                _ => x,
            };
            let middle = attr(tag, "dominant-baseline").as_deref() == Some("middle");
            let y0 = if middle {
                y - size / 2.0
            } else {
                y - size * 0.8
            };
            boxes.push((x0, y0, x0 + w, y0 + size, text));
        }
        boxes
    }

    /// No two labels of an SVG overlap, and every label lies inside its
    /// width (a title too long for the chart is cut off).
    pub(crate) fn assert_no_label_overlaps(what: &str, svg: &str) {
        let boxes = text_boxes(svg);
        assert!(!boxes.is_empty(), "{what}: no text");
        let width: f64 = svg
            .split_once(" width=\"")
            .and_then(|(_, rest)| rest.split('"').next()?.parse().ok())
            .expect("an SVG has a width");
        for b in &boxes {
            assert!(
                b.0 >= -1.0 && b.2 <= width + 1.0,
                "{what}: '{}' runs past the edge ({b:?}, width {width})",
                b.4
            );
        }
        for (i, a) in boxes.iter().enumerate() {
            for b in &boxes[i + 1..] {
                // 1 px of slack for the width estimate.
                let overlap_x = a.0 < b.2 - 1.0 && b.0 < a.2 - 1.0;
                let overlap_y = a.1 < b.3 - 1.0 && b.1 < a.3 - 1.0;
                assert!(
                    !(overlap_x && overlap_y),
                    "{what}: '{}' overlaps '{}' ({a:?} / {b:?})",
                    a.4,
                    b.4
                );
            }
        }
    }

    /// Every plot type the tool writes, at the sizes it writes them, with
    /// the longest labels it produces: no two labels overlap.
    #[test]
    fn no_plot_type_has_overlapping_labels() {
        let sizes: Vec<f64> = (9..=20).map(|k| f64::from(1u32 << k)).collect();
        let line = |x_log2: bool, y_log10: bool, names: &[&str]| Chart {
            title: "Bandwidth vs request size (moneta, 2q stack, 16 threads; crosses: published)"
                .into(),
            x_label: "request size (bytes)".into(),
            y_label: "bandwidth (MB/s)".into(),
            x_log2,
            x_log10: false,
            y_log10,
            series: names
                .iter()
                .enumerate()
                .map(|(k, n)| Series {
                    name: n.to_string(),
                    points: sizes
                        .iter()
                        .map(|&x| (x, 3.0 + x * (k + 1) as f64 / 300.0))
                        .collect(),
                })
                .collect(),
        };
        let charts = [
            line(
                true,
                false,
                &[
                    "read",
                    "write",
                    "mixed",
                    "published read",
                    "published write",
                    "published mixed",
                ],
            ),
            line(
                true,
                true,
                &["quicksan-d", "quicksan-os", "iscsi", "fibre-channel"],
            ),
            line(
                false,
                false,
                &[
                    "a rather long series name for the legend below",
                    "another long one",
                ],
            ),
        ];
        for (k, c) in charts.iter().enumerate() {
            assert_no_label_overlaps(&format!("line chart {k}"), &c.to_svg(900, 480));
        }
        // NVMM's: speedups on log-log axes (the sweep) and capacity over
        // days on a log x axis (wear), with their longest titles and names;
        // the real charts are checked in `nvmm`'s tests.
        let log_log = Chart {
            title: "MMAP, 8 threads: NVMM over DRAM + SSD (nvmm-mlc, seed 1; crosses: published)"
                .into(),
            x_label: "flash read latency (µs, log scale)".into(),
            y_label: "speedup: SSD time / NVMM time (log scale)".into(),
            x_log10: true,
            y_log10: true,
            series: [
                "no prefetch",
                "prefetch 16 pages",
                "published no prefetch",
                "published prefetch 16 pages",
            ]
            .iter()
            .enumerate()
            .map(|(k, n)| Series {
                name: n.to_string(),
                points: [3.125, 6.25, 12.5, 25.0, 50.0, 75.0, 150.0, 750.0]
                    .iter()
                    .map(|&x| (x, 0.4 + 2.0 * k as f64 + 7.0 / x))
                    .collect(),
            })
            .collect(),
            ..Chart::default()
        };
        let wear = Chart {
            title: "Usable flash capacity as it wears (nvmm-mlc, 50 MB/s each, seed 1; crosses: published)"
                .into(),
            x_label: "days (log scale)".into(),
            y_label: "usable capacity (% of the flash)".into(),
            x_log10: true,
            series: vec![
                Series {
                    name: "one 8 Gb device".into(),
                    points: vec![(0.13, 100.0), (0.5, 80.0), (0.6, 49.0), (0.6, 0.0)],
                },
                Series {
                    name: "1000 devices (1 TB)".into(),
                    points: vec![(130.0, 100.0), (500.0, 80.0), (600.0, 49.0), (600.0, 0.0)],
                },
                Series {
                    name: "published one 8 Gb device".into(),
                    points: vec![(2.0, 50.0), (3.0, 0.0)],
                },
                Series {
                    name: "published 1000 devices (1 TB)".into(),
                    points: vec![(912.5, 50.0), (1642.5, 0.0)],
                },
            ],
            ..Chart::default()
        };
        for (what, c) in [("log-log chart", &log_log), ("log-x chart", &wear)] {
            assert_no_label_overlaps(what, &c.to_svg(900, 480));
        }
        use moneta_model::breakdown::Component;
        let labels: Vec<String> = sizes.iter().map(|&x| format_pow2(x)).collect();
        for percent in [true, false] {
            let bars = StackedBars {
                title: "Where read time goes, by request size (moneta-d, direct stack, 16 threads)"
                    .into(),
                y_label: "% of latency".into(),
                bars: labels
                    .iter()
                    .enumerate()
                    .map(|(k, l)| {
                        (
                            l.clone(),
                            Component::ALL
                                .iter()
                                .map(|c| (c.label().to_string(), 1.5 * (1u64 << k) as f64))
                                .collect(),
                        )
                    })
                    .collect(),
                percent,
            };
            assert_no_label_overlaps("stacked bars", &bars.to_svg(900, 520));
        }
    }

    #[test]
    fn bar_labels_too_long_for_their_slot_are_slanted_at_full_size() {
        let label = |k: usize| format!("randwrite {} KB · guest XFS", 1 << k);
        let bars = |n: usize| StackedBars {
            title: "fio psync QD1: median latency per path (µs)".into(),
            y_label: "median latency (µs)".into(),
            bars: (0..n)
                .map(|k| (label(k), vec![("guest".to_string(), 100.0 + k as f64)]))
                .collect(),
            percent: false,
        };
        // Three fit upright; eighteen do not, even shrunk to 9 px.
        let upright = bars(3).to_svg(1100, 560);
        assert!(!upright.contains("rotate(-35"), "{upright}");
        let svg = bars(18).to_svg(1100, 560);
        let slanted: Vec<&str> = svg
            .split("<text")
            .filter(|t| t.contains("rotate(-35"))
            .collect();
        assert_eq!(slanted.len(), 18, "{svg}");
        for t in &slanted {
            assert!(t.contains("font-size=\"12.0\""), "{t}");
            // The label's far end stays inside the figure.
            let x: f64 = t
                .split_once(" x=\"")
                .and_then(|(_, r)| r.split('"').next()?.parse().ok())
                .expect("x");
            let w = text_width(&label(17), 12.0) * SLANT_DEGREES.to_radians().cos();
            assert!(x - w > -1.0 || !t.contains(&label(0)), "{t}");
        }
        assert_no_label_overlaps("slanted bars", &svg);
    }

    #[test]
    fn a_component_has_one_colour_in_every_chart() {
        use moneta_model::breakdown::Component;
        let name = Component::ALL[3].label();
        // First in one chart, fifth in another: the same colour.
        assert_eq!(component_colour_of(name, 0), component_colour_of(name, 4));
        assert_ne!(
            component_colour_of(Component::ALL[0].label(), 0),
            component_colour_of(Component::ALL[1].label(), 0)
        );
        // The legend's swatch is the bars' colour.
        let bars = StackedBars {
            title: String::new(),
            y_label: String::new(),
            bars: vec![("a".into(), vec![(name.to_string(), 1.0)])],
            percent: false,
        };
        let svg = bars.to_svg(600, 300);
        let colour = component_colour_of(name, 0);
        assert_eq!(
            svg.matches(&format!("fill=\"{colour}\"")).count(),
            2,
            "{svg}"
        );
        assert_eq!(format_total(4848.25), "4848");
        // The overlap check sees an overlap.
        let clash = r#"<svg><text x="10" y="20">4848</text><text x="20" y="22">2424</text></svg>"#;
        let caught = std::panic::catch_unwind(|| assert_no_label_overlaps("clash", clash));
        assert!(caught.is_err(), "two overlapping labels must be caught");
        let wide = r#"<svg width="100"><text x="50" y="20" text-anchor="middle">a title too long for its chart</text></svg>"#;
        let caught = std::panic::catch_unwind(|| assert_no_label_overlaps("wide", wide));
        assert!(caught.is_err(), "a label past the edge must be caught");
        assert_eq!(format_total(3.754), "3.75");
        assert_eq!(format_total(0.004), "4.0e-3");
    }

    /// Components are coloured by family: one hue per family, members at
    /// different lightness; "other" is grey; every component has a family.
    #[test]
    fn components_are_coloured_by_family() {
        use moneta_model::breakdown::Component as C;
        let hue = |c: C| {
            let colour = component_colour_of(c.label(), 0);
            colour.split(',').next().unwrap().to_string()
        };
        assert_eq!(hue(C::SyscallEntry), hue(C::Return));
        assert_eq!(hue(C::Dma), hue(C::Ring));
        assert_ne!(hue(C::SyscallEntry), hue(C::Dma));
        assert_ne!(hue(C::Array), hue(C::Tag));
        assert_ne!(
            component_colour_of(C::SyscallEntry.label(), 0),
            component_colour_of(C::BlockLayer.label(), 0)
        );
        assert_eq!(
            component_colour_of("other (9 smaller components)", 3),
            "#a0a0a0"
        );
        for c in C::ALL {
            let (f, k) = Family::of(c);
            assert!(
                (f, k) != (Family::Device, 0) || c == C::Retag,
                "{c:?} has no family"
            );
        }
    }

    /// A dense line (a CDF's 25 points) has no markers; a sweep's 12 do.
    #[test]
    fn dense_lines_have_no_markers() {
        let line = |n: usize| Chart {
            series: vec![Series {
                name: "s".into(),
                points: (1..=n).map(|i| (i as f64, i as f64)).collect(),
            }],
            ..Chart::default()
        };
        assert_eq!(line(25).to_svg(600, 400).matches("<circle").count(), 0);
        // Twelve on the line and one in the legend.
        assert_eq!(line(12).to_svg(600, 400).matches("<circle").count(), 13);
    }

    #[test]
    fn stacked_charts_sit_one_below_the_other_in_one_document() {
        let charts = [sample_chart(), sample_chart(), sample_chart()];
        let svg = stacked_svg(&charts, 900, 480);
        check_balanced(&svg);
        assert!(svg.starts_with("<svg xmlns") && svg.contains("height=\"1440\""));
        for k in 0..3 {
            assert!(
                svg.contains(&format!("<svg y=\"{}\" xmlns", k * 480)),
                "panel {k}"
            );
        }
        // Each panel as drawn alone: the same text.
        let one = charts[0].to_svg(900, 480);
        assert_eq!(
            svg.matches("<text").count(),
            3 * one.matches("<text").count()
        );
    }

    /// Every plot type this module draws (line chart on log2, linear and
    /// log10 axes with published points and a dense CDF, stacked bars,
    /// panels one below the other) renders to PNG and PDF at each figure
    /// size: a PNG of the size asked for whose pixels are not all white and
    /// that carries the provenance, and a PDF page of the size in points
    /// with the text's font embedded. `MONETA_FIGURE_DIR=D` keeps them in D
    /// for a look.
    #[test]
    fn every_plot_type_renders_to_png_and_pdf_at_every_figure_size() {
        use resvg::tiny_skia::Pixmap;
        let keep = std::env::var_os("MONETA_FIGURE_DIR").map(std::path::PathBuf::from);
        let dir = keep.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("moneta-figures-{}", std::process::id()))
        });
        std::fs::create_dir_all(&dir).unwrap();
        let line = sample_chart();
        let mut linear = sample_chart();
        linear.x_log2 = false;
        linear.title = "linear axes".into();
        linear.series.push(Series {
            name: format!("{PUBLISHED_PREFIX}1 thread"),
            points: vec![(4096.0, 300.0), (65536.0, 1100.0)],
        });
        let cdf = Chart {
            title: "latency CDF".into(),
            x_label: "latency (µs)".into(),
            y_label: "fraction of requests".into(),
            x_log10: true,
            series: vec![Series {
                name: "read".into(),
                points: (1..=200)
                    .map(|i| (5.0 + f64::from(i).powf(1.5), f64::from(i) / 200.0))
                    .collect(),
            }],
            ..Chart::default()
        };
        let part = |n: &str, v: f64| (n.to_string(), v);
        let bars = StackedBars {
            title: "where time goes, read 4 KB".into(),
            y_label: "µs per request".into(),
            bars: ["base", "spin", "direct"]
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    (
                        l.to_string(),
                        vec![
                            part("system call", 3.0 - i as f64),
                            part("driver", 2.0),
                            part("PCIe link", 1.5),
                            part("memory array", 4.0),
                        ],
                    )
                })
                .collect(),
            percent: false,
        };
        let panels = one_below_the_other(&[line.to_svg(900, 480), bars.to_svg(900, 520)]);
        let figures = [
            ("line", line.to_svg(900, 480)),
            ("linear", linear.to_svg(900, 480)),
            ("cdf", cdf.to_svg(900, 480)),
            ("bars", bars.to_svg(900, 520)),
            (
                "stacked",
                stacked_svg(&[line.clone(), cdf.clone()], 900, 480),
            ),
            ("panels", panels),
        ];
        let provenance = crate::provenance::Provenance::here().seed(7);
        for size in [FigureSize::Screen, FigureSize::Column, FigureSize::Page] {
            let args = FigureArgs {
                figure: size,
                dpi: 150,
                ..FigureArgs::default()
            };
            with_figure(args, || {
                // Re-laid out at this size (the canvas depends on it).
                let figures: Vec<(&str, String)> = match size {
                    FigureSize::Screen => figures.to_vec(),
                    _ => vec![
                        ("line", line.to_svg(900, 480)),
                        ("cdf", cdf.to_svg(900, 480)),
                        ("bars", bars.to_svg(900, 520)),
                        (
                            "stacked",
                            stacked_svg(&[line.clone(), cdf.clone()], 900, 480),
                        ),
                    ],
                };
                for (name, svg) in &figures {
                    let what = format!("{name} at {size:?}");
                    let (w, h) = root_size(svg).unwrap();
                    let base = dir.join(format!("{name}-{size:?}").to_lowercase());
                    for ext in ["svg", "png", "pdf"] {
                        write_file_from(&base.with_extension(ext), svg, &provenance)
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                    }
                    let png = std::fs::read(base.with_extension("png")).unwrap();
                    let image = Pixmap::decode_png(&png).unwrap();
                    let (want_w, want_h) = match size.width_in() {
                        None => (2.0 * w, 2.0 * h),
                        Some(inches) => (inches * 150.0, inches * 150.0 * h / w),
                    };
                    assert!(
                        (f64::from(image.width()) - want_w).abs() <= 1.0
                            && (f64::from(image.height()) - want_h).abs() <= 1.0,
                        "{what}: {} × {} px, wanted {want_w} × {want_h}",
                        image.width(),
                        image.height()
                    );
                    let inked = image
                        .pixels()
                        .iter()
                        .filter(|p| p.red() < 128 && p.green() < 128 && p.blue() < 128)
                        .count();
                    // Axes, text and lines: well over 0.3% of the pixels dark.
                    assert!(
                        inked * 300 > image.pixels().len(),
                        "{what}: {inked} dark pixels of {}",
                        image.pixels().len()
                    );
                    let text = String::from_utf8_lossy(&png);
                    assert!(text.contains("tEXtSource\0moneta ") && text.contains("; seed 7"));
                    let pdf = std::fs::read(base.with_extension("pdf")).unwrap();
                    let text = String::from_utf8_lossy(&pdf);
                    assert!(
                        text.starts_with("%PDF-") && text.contains("/FontFile"),
                        "{what}"
                    );
                    let pt = size.width_in().map_or(w * 0.75, |i| i * 72.0);
                    assert!(
                        text.contains(&format!("/MediaBox [0 0 {pt} ")),
                        "{what}: no {pt} pt wide page"
                    );
                    assert!(text.contains("seed 7"), "{what}: provenance");
                }
            });
        }
        if keep.is_none() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    /// `cargo test -p moneta-cli render_sample -- --ignored` writes
    /// /tmp/plot-sample.svg and /tmp/plot-sample.html for eyeballing.
    #[test]
    #[ignore]
    fn render_sample() {
        let chart = sample_chart();
        write_file(Path::new("/tmp/plot-sample.svg"), &chart.to_svg(800, 450)).unwrap();
        let mut latency = chart.clone();
        latency.title = "Linear axes, long legend names".into();
        latency.x_log2 = false;
        latency.series[0].name = "a very long series name that pushes the legend below".into();
        write_file(
            Path::new("/tmp/plot-sample2.svg"),
            &latency.to_svg(800, 450),
        )
        .unwrap();
        let mut many = sample_chart();
        many.title = "Many series, small canvas".into();
        many.series = (0..10)
            .map(|i| Series {
                name: format!("queue depth {}", 1 << i),
                points: (9..=20)
                    .map(|k| (f64::from(k).exp2(), f64::from(i * 30 + k)))
                    .collect(),
            })
            .collect();
        write_file(Path::new("/tmp/plot-sample3.svg"), &many.to_svg(480, 320)).unwrap();
        let report = Report {
            title: "Moneta sweep report".into(),
            sections: vec![
                ReportSection::Heading("Bandwidth".into()),
                ReportSection::Paragraph("Sequential reads, 1–8 threads.".into()),
                ReportSection::Chart(chart),
                ReportSection::Table {
                    header: vec!["size".into(), "MB/s".into()],
                    rows: vec![
                        vec!["4K".into(), "1234.5".into()],
                        vec!["1M".into(), "4600".into()],
                    ],
                },
                ReportSection::Preformatted("moneta sweep --preset baseline".into()),
            ],
        };
        write_file(Path::new("/tmp/plot-sample.html"), &report.to_html()).unwrap();
    }

    #[test]
    fn log10_axes_place_decades_and_skip_non_positive_values() {
        let chart = Chart {
            title: "latency".into(),
            x_log10: true,
            y_log10: true,
            series: vec![Series {
                name: "cdf".into(),
                points: vec![(0.0, 1.0), (3.0, 0.1), (300.0, 0.9), (30.0, -1.0)],
            }],
            ..Chart::default()
        };
        let svg = chart.to_svg(800, 450);
        check_balanced(&svg);
        // Decades 1 … 1000 on x, 0.1 … 1 on y, labelled.
        for label in [">1<", ">10<", ">100<", ">1000<", ">0.1<"] {
            assert!(svg.contains(label), "missing tick {label}");
        }
        // Two drawable points of four: two markers, plus the legend's.
        assert_eq!(svg.matches("<circle").count(), 3);
    }

    #[test]
    fn stacked_bars_stack_every_component_with_one_colour_each() {
        let part = |n: &str, v: f64| (n.to_string(), v);
        let bars = StackedBars {
            title: "where time goes <4 KB>".into(),
            y_label: "µs".into(),
            bars: vec![
                ("base".into(), vec![part("entry", 2.0), part("device", 8.0)]),
                (
                    "spin".into(),
                    vec![part("entry", 2.0), part("device", 8.0), part("spin", 0.5)],
                ),
            ],
            percent: false,
        };
        let svg = bars.to_svg(900, 520);
        check_balanced(&svg);
        assert!(svg.contains("where time goes &lt;4 KB&gt;"));
        assert_eq!(svg.matches("<g class=\"bar\">").count(), 2);
        // One legend entry per component; bar totals printed on top.
        assert_eq!(svg.matches("<rect x=").count(), 5 + 3 + 1);
        assert!(svg.contains(">10.0<") && svg.contains(">10.5<"));
        let html = Report {
            title: "t".into(),
            sections: vec![ReportSection::Bars(StackedBars {
                percent: true,
                ..bars
            })],
        }
        .to_html();
        check_balanced(&html);
        assert!(html.contains("% of latency"));
    }
}

//! Hand-written SVG grouped bar charts (no plotting dependency).

use std::fmt::Write;

/// One chart: groups along the x axis, one bar per series in each group.
#[derive(Debug, Clone)]
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub series: Vec<String>,
    /// (group label, one value per series; `None` = not measured).
    pub groups: Vec<(String, Vec<Option<f64>>)>,
    /// Logarithmic y axis (values must be > 0).
    pub log: bool,
    /// Horizontal reference lines: (value, label).
    pub reference_lines: Vec<(f64, String)>,
}

const COLORS: [&str; 6] = [
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02",
];
const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 460.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 70.0;
const BOTTOM: f64 = 90.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A short label for a value (3 significant digits).
pub fn short(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1e6 {
        format!("{:.3}M", value / 1e6)
    } else if magnitude >= 1e4 {
        format!("{:.0}k", value / 1e3)
    } else if magnitude >= 1e3 {
        format!("{:.2}k", value / 1e3)
    } else if magnitude >= 100.0 {
        format!("{value:.0}")
    } else if magnitude >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// An axis label: no trailing zeros, thousands as `k`.
pub fn tick_label(value: f64) -> String {
    fn trimmed(value: f64) -> String {
        let text = format!("{value:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
    if value.abs() >= 1e6 {
        format!("{}M", trimmed(value / 1e6))
    } else if value.abs() >= 1e3 {
        format!("{}k", trimmed(value / 1e3))
    } else {
        trimmed(value)
    }
}

/// Linear axis ticks from 0 to at least `max`: 1, 2 or 5 times a power of 10.
pub fn linear_ticks(max: f64) -> Vec<f64> {
    let max = if max > 0.0 { max } else { 1.0 };
    let raw = max / 5.0;
    let power = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| max / s <= 6.0)
        .unwrap_or(10.0 * power);
    let count = (max / step).ceil() as usize;
    // Rounded so 3 x 0.2 prints as 0.6.
    (0..=count)
        .map(|i| (i as f64 * step * 1e9).round() / 1e9)
        .collect()
}

/// Powers of ten covering `[min, max]`.
pub fn log_ticks(min: f64, max: f64) -> Vec<f64> {
    let low = min.max(1e-9).log10().floor() as i32;
    let high = max.max(min.max(1e-9)).log10().ceil() as i32;
    let high = high.max(low + 1);
    (low..=high).map(|e| 10f64.powi(e)).collect()
}

impl BarChart {
    pub fn render(&self) -> String {
        let values: Vec<f64> = self
            .groups
            .iter()
            .flat_map(|(_, v)| v.iter().flatten().copied())
            .chain(self.reference_lines.iter().map(|(v, _)| *v))
            .filter(|v| v.is_finite() && (!self.log || *v > 0.0))
            .collect();
        let max = values.iter().copied().fold(0.0, f64::max);
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let ticks = if self.log {
            log_ticks(if min.is_finite() { min } else { 1.0 }, max)
        } else {
            linear_ticks(max * 1.08)
        };
        let (axis_min, axis_max) = (
            ticks.first().copied().unwrap_or(0.0),
            ticks.last().copied().unwrap_or(1.0),
        );
        let plot_height = HEIGHT - TOP - BOTTOM;
        let plot_width = WIDTH - LEFT - RIGHT;
        let y_of = |value: f64| -> f64 {
            let fraction = if self.log {
                (value.max(axis_min).log10() - axis_min.log10())
                    / (axis_max.log10() - axis_min.log10())
            } else {
                (value - axis_min) / (axis_max - axis_min)
            };
            TOP + plot_height * (1.0 - fraction.clamp(0.0, 1.0))
        };

        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            svg,
            r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="16" text-anchor="middle" font-weight="bold">{}</text>"#,
            WIDTH / 2.0,
            escape(&self.title)
        );
        // Legend.
        let mut x = LEFT;
        for (i, name) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let _ = writeln!(
                svg,
                r#"<rect x="{x}" y="36" width="12" height="12" fill="{color}"/><text x="{}" y="47">{}</text>"#,
                x + 16.0,
                escape(name)
            );
            x += 30.0 + 7.0 * name.len() as f64;
        }
        // Reference lines are labelled in the legend: next to the lines
        // their labels would collide with the bars' values.
        if !self.reference_lines.is_empty() {
            let labels: Vec<&str> = self
                .reference_lines
                .iter()
                .map(|(_, label)| label.as_str())
                .collect();
            let _ = writeln!(
                svg,
                r##"<line x1="{x}" x2="{}" y1="42" y2="42" stroke="#c00" stroke-dasharray="6 4"/><text x="{}" y="47">{}</text>"##,
                x + 24.0,
                x + 28.0,
                escape(&labels.join(", "))
            );
        }
        // Axes and grid.
        for tick in &ticks {
            let y = y_of(*tick);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                WIDTH - RIGHT,
                LEFT - 6.0,
                y + 4.0,
                tick_label(*tick)
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="18" y="{:.1}" transform="rotate(-90 18 {:.1})" text-anchor="middle">{}</text>"#,
            TOP + plot_height / 2.0,
            TOP + plot_height / 2.0,
            escape(&self.y_label)
        );
        // Bars.
        let group_width = plot_width / self.groups.len().max(1) as f64;
        let bar_width = (group_width * 0.8) / self.series.len().max(1) as f64;
        for (g, (label, values)) in self.groups.iter().enumerate() {
            let group_x = LEFT + g as f64 * group_width + group_width * 0.1;
            for (s, value) in values.iter().enumerate() {
                let bar_x = group_x + s as f64 * bar_width;
                let color = COLORS[s % COLORS.len()];
                match value {
                    Some(v) if v.is_finite() && (!self.log || *v > 0.0) => {
                        let y = y_of(*v);
                        let base = y_of(axis_min);
                        let _ = writeln!(
                            svg,
                            r#"<rect x="{bar_x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>{}: {}</title></rect>"#,
                            (bar_width - 2.0).max(1.0),
                            (base - y).max(0.5),
                            escape(&self.series[s]),
                            short(*v)
                        );
                        let _ = writeln!(
                            svg,
                            r#"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle">{}</text>"#,
                            bar_x + bar_width / 2.0,
                            y - 3.0,
                            short(*v)
                        );
                    }
                    _ => {
                        let _ = writeln!(
                            svg,
                            r##"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle" fill="#888">n/a</text>"##,
                            bar_x + bar_width / 2.0,
                            y_of(axis_min) - 3.0
                        );
                    }
                }
            }
            let label_x = LEFT + g as f64 * group_width + group_width / 2.0;
            for (line_no, line) in label.split('\n').enumerate() {
                let _ = writeln!(
                    svg,
                    r#"<text x="{label_x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                    HEIGHT - BOTTOM + 18.0 + 14.0 * line_no as f64,
                    escape(line)
                );
            }
        }
        for (value, _) in &self.reference_lines {
            let y = y_of(*value);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#c00" stroke-dasharray="6 4"/>"##,
                WIDTH - RIGHT,
            );
        }
        let _ = writeln!(
            svg,
            r#"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{}" stroke="black"/><line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="black"/>"#,
            TOP + plot_height,
            WIDTH - RIGHT,
            TOP + plot_height,
            TOP + plot_height
        );
        svg.push_str("</svg>\n");
        svg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks() {
        assert_eq!(linear_ticks(9.0), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(linear_ticks(1.1), [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2]);
        assert_eq!(log_ticks(1.5, 230.0), [1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(log_ticks(0.3, 0.3), [0.1, 1.0]);
    }

    #[test]
    fn tick_labels() {
        assert_eq!(tick_label(1000.0), "1k");
        assert_eq!(tick_label(0.0), "0");
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(60.0), "60");
        assert_eq!(tick_label(0.01), "0.01");
        assert_eq!(tick_label(2.5e6), "2.5M");
    }

    #[test]
    fn short_labels() {
        assert_eq!(short(0.953), "0.95");
        assert_eq!(short(12.34), "12.3");
        assert_eq!(short(153.0), "153");
        assert_eq!(short(1530.0), "1.53k");
        assert_eq!(short(153_000.0), "153k");
        assert_eq!(short(2_500_000.0), "2.500M");
    }

    #[test]
    fn renders_well_formed_svg_with_every_bar() {
        let chart = BarChart {
            title: "t <&>".into(),
            y_label: "ms".into(),
            series: vec!["a".into(), "b".into()],
            groups: vec![
                ("g1".into(), vec![Some(1.0), Some(10.0)]),
                ("g2\nmore".into(), vec![None, Some(100.0)]),
            ],
            log: true,
            reference_lines: vec![(20.0, "target".into())],
        };
        let svg = chart.render();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t &lt;&amp;&gt;"));
        assert_eq!(
            svg.matches("<rect x=").count(),
            2 + 3,
            "2 legend boxes + 3 bars"
        );
        assert!(svg.contains("n/a"));
        assert!(svg.contains("stroke-dasharray"));
    }
}

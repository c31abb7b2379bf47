//! How the operator verbs print: aligned columns and colours on a terminal,
//! plain tab-separated text when stdout is a pipe or a file (and no colour
//! when `NO_COLOR` is set), so `ebpf-portmap list | grep` and `awk -F'\t'`
//! see no escape codes or padding.

use std::{
    io::{IsTerminal, Write},
    time::{Duration, SystemTime},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    Plain,
    Bold,
    Dim,
    Green,
    Yellow,
    Red,
}

impl Colour {
    fn code(self) -> &'static str {
        match self {
            Colour::Plain => "",
            Colour::Bold => "\x1b[1m",
            Colour::Dim => "\x1b[2m",
            Colour::Green => "\x1b[32m",
            Colour::Yellow => "\x1b[33m",
            Colour::Red => "\x1b[31m",
        }
    }
}

/// Whether stdout gets terminal decoration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    pub terminal: bool,
    pub colour: bool,
}

impl Style {
    /// Alignment when stdout is a terminal; colour as `--color` says (with
    /// `auto`, on a terminal unless `NO_COLOR` is set).
    pub fn detect(colour: ColourChoice) -> Style {
        let terminal = std::io::stdout().is_terminal();
        let no_colour = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style {
            terminal,
            colour: colour.wanted(terminal, no_colour),
        }
    }

    pub fn paint(&self, colour: Colour, text: &str) -> String {
        if self.colour && colour != Colour::Plain {
            format!("{}{text}\x1b[0m", colour.code())
        } else {
            text.to_owned()
        }
    }
}

/// `--color`: when to colour the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColourChoice {
    /// On a terminal, unless NO_COLOR is set.
    Auto,
    /// Always, also into a pipe (for `less -R`).
    Always,
    /// Never.
    Never,
}

impl ColourChoice {
    pub fn wanted(self, terminal: bool, no_colour_env: bool) -> bool {
        match self {
            ColourChoice::Auto => terminal && !no_colour_env,
            ColourChoice::Always => true,
            ColourChoice::Never => false,
        }
    }
}

/// `-o`: how a verb prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns on a terminal, tab-separated text in a pipe.
    #[default]
    Table,
    /// The table with more columns (where the verb has more to show).
    Wide,
    /// One JSON document (a stream of them for `trace` and `list --watch`);
    /// errors too are a JSON object on stdout.
    Json,
}

/// The output options every verb takes (global: before or after the verb).
#[derive(Debug, Clone, clap::Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        value_enum,
        value_name = "FORMAT",
        default_value = "table",
        global = true
    )]
    format: Format,
    /// The same as `-o json`.
    #[arg(long, global = true)]
    json: bool,
    /// When to colour the output (NO_COLOR in the environment turns `auto` off).
    #[arg(
        long,
        value_enum,
        value_name = "WHEN",
        default_value = "auto",
        global = true
    )]
    color: ColourChoice,
}

impl OutputArgs {
    /// JSON with colour off: what `list --watch` writes into a pipe.
    pub fn json_only() -> OutputArgs {
        OutputArgs {
            format: Format::Json,
            json: true,
            color: ColourChoice::Never,
        }
    }

    pub fn format(&self) -> Format {
        if self.json { Format::Json } else { self.format }
    }

    pub fn json(&self) -> bool {
        self.format() == Format::Json
    }

    pub fn wide(&self) -> bool {
        self.format() == Format::Wide
    }

    pub fn style(&self) -> Style {
        Style::detect(self.color)
    }
}

/// Prints `value` as pretty JSON with a final newline.
pub fn print_json(value: &serde_json::Value) {
    print(&format!(
        "{}\n",
        serde_json::to_string_pretty(value).expect("a JSON value serialises")
    ));
}

/// A table: a header and rows of cells, each cell with a colour.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<(String, Colour)>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<(String, Colour)>) {
        self.rows.push(cells);
    }

    /// Aligned on a terminal, tab-separated otherwise; coloured as `style`
    /// says (`--color always` colours the tab-separated form too).
    pub fn render(&self, style: Style) -> String {
        let mut out = String::new();
        if !style.terminal {
            let header: Vec<String> = self
                .header
                .iter()
                .map(|h| style.paint(Colour::Bold, h))
                .collect();
            out.push_str(&header.join("\t"));
            out.push('\n');
            for row in &self.rows {
                let cells: Vec<String> = row
                    .iter()
                    .map(|(text, colour)| style.paint(*colour, text))
                    .collect();
                out.push_str(&cells.join("\t"));
                out.push('\n');
            }
            return out;
        }
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, (text, _)) in row.iter().enumerate() {
                if i < widths.len() {
                    widths[i] = widths[i].max(text.chars().count());
                }
            }
        }
        let line = |cells: Vec<(&str, Colour)>| {
            let last = cells.len().saturating_sub(1);
            let mut line = String::new();
            for (i, (text, colour)) in cells.into_iter().enumerate() {
                line.push_str(&style.paint(colour, text));
                if i < last {
                    let pad = widths[i].saturating_sub(text.chars().count()) + 2;
                    line.push_str(&" ".repeat(pad));
                }
            }
            line.push('\n');
            line
        };
        out.push_str(&line(
            self.header
                .iter()
                .map(|h| (h.as_str(), Colour::Bold))
                .collect(),
        ));
        for row in &self.rows {
            out.push_str(&line(row.iter().map(|(t, c)| (t.as_str(), *c)).collect()));
        }
        out
    }
}

/// Writes `text` to stdout; a closed pipe (`| head`) ends the output quietly.
pub fn print(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

/// `512B`, `1.5K`, `20.0M`, `3.1G` (powers of 1024).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1}{}", UNITS[unit])
}

/// `45s`, `12m`, `3h`, `2d` (largest unit, rounded down).
pub fn human_age(age: Duration) -> String {
    let secs = age.as_secs();
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86_400 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// Age of something created at `time`, `-` if unknown.
pub fn age_of(time: Option<SystemTime>) -> String {
    time.and_then(|t| SystemTime::now().duration_since(t).ok())
        .map_or_else(|| "-".into(), human_age)
}

/// The first 12 characters of a container ID, as runtimes show them.
pub fn short_id(id: &str) -> String {
    id.chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: Style = Style {
        terminal: false,
        colour: false,
    };
    const TERMINAL: Style = Style {
        terminal: true,
        colour: true,
    };

    fn table() -> Table {
        let mut table = Table::new(&["HOST", "FLOWS"]);
        table.row(vec![
            ("0.0.0.0:8080/tcp".into(), Colour::Plain),
            ("1".into(), Colour::Green),
        ]);
        table
    }

    #[test]
    fn plain_output_is_tab_separated_without_escapes() {
        assert_eq!(table().render(PLAIN), "HOST\tFLOWS\n0.0.0.0:8080/tcp\t1\n");
    }

    #[test]
    fn colour_always_paints_the_tab_separated_form() {
        let always = Style {
            terminal: false,
            colour: true,
        };
        assert_eq!(
            table().render(always),
            "\x1b[1mHOST\x1b[0m\t\x1b[1mFLOWS\x1b[0m\n0.0.0.0:8080/tcp\t\x1b[32m1\x1b[0m\n"
        );
    }

    #[test]
    fn terminal_output_is_aligned_and_coloured() {
        let out = table().render(TERMINAL);
        assert_eq!(
            out,
            "\x1b[1mHOST\x1b[0m              \x1b[1mFLOWS\x1b[0m\n0.0.0.0:8080/tcp  \x1b[32m1\x1b[0m\n"
        );
        let uncoloured = Style {
            terminal: true,
            colour: false,
        };
        assert_eq!(
            table().render(uncoloured),
            "HOST              FLOWS\n0.0.0.0:8080/tcp  1\n"
        );
    }

    #[test]
    fn colour_follows_the_flag_then_the_terminal_and_no_color() {
        assert!(ColourChoice::Auto.wanted(true, false));
        assert!(
            !ColourChoice::Auto.wanted(true, true),
            "NO_COLOR turns auto off"
        );
        assert!(
            !ColourChoice::Auto.wanted(false, false),
            "no colour into a pipe"
        );
        assert!(
            ColourChoice::Always.wanted(false, true),
            "an explicit flag wins"
        );
        assert!(!ColourChoice::Never.wanted(true, false));
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(0), "0B");
        assert_eq!(human_bytes(1023), "1023B");
        assert_eq!(human_bytes(1536), "1.5K");
        assert_eq!(human_bytes(20 * 1024 * 1024), "20.0M");
        assert_eq!(human_age(Duration::from_secs(59)), "59s");
        assert_eq!(human_age(Duration::from_secs(61)), "1m");
        assert_eq!(human_age(Duration::from_secs(7200)), "2h");
        assert_eq!(human_age(Duration::from_secs(3 * 86_400)), "3d");
        assert_eq!(age_of(None), "-");
        assert_eq!(short_id("0123456789abcdef"), "0123456789ab");
    }
}

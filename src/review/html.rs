//! The HTML of `ckptfs report`: escaping, the page frame, diffs and the chart.
//!
//! Everything shown comes from a sandbox (paths, link targets, file contents), so
//! every piece of it goes through [`text`] or [`name`] before it meets markup; no
//! function here takes markup from data. Pages carry no script at all, and a
//! Content-Security-Policy that allows nothing but the one stylesheet written in the
//! page (by its SHA-256): no script, no image, no font, no request of any kind. Links
//! are relative, between the report's own files, so it opens from `file://`.

use std::fmt::Write;

use base64::Engine;
use sha2::{Digest, Sha256};

/// `s` with the five characters that can open or close markup or an attribute
/// replaced by entities.
pub fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A name from an archive (a path, a link target): escaped as the terminal commands
/// print it ([`crate::printable::escape`]: no control character, no byte that is not
/// UTF-8, no reordering character), then as [`text`].
pub fn name(bytes: &[u8]) -> String {
    text(&crate::printable::escape(bytes))
}

/// A line of file contents: tabs stay, other control characters and bytes that are
/// not UTF-8 are escaped (as `diff --patch` does on a terminal), then as [`text`].
fn contents(bytes: &[u8]) -> String {
    let clean = crate::printable::for_terminal(bytes);
    text(&String::from_utf8_lossy(&clean))
}

const STYLE: &str = "\
:root{color-scheme:light dark;--fg:#1f2328;--bg:#fff;--muted:#59636e;--line:#d1d9e0;\
--add:#dafbe1;--add-fg:#116329;--del:#ffebe9;--del-fg:#a40e26;--hunk:#ddf4ff;--bad:#cf222e}
@media (prefers-color-scheme:dark){:root{--fg:#e6edf3;--bg:#0d1117;--muted:#9198a1;\
--line:#3d444d;--add:#12261e;--add-fg:#6fdd8b;--del:#25171c;--del-fg:#ff9492;\
--hunk:#121d2f;--bad:#f85149}}
body{font:15px/1.45 system-ui,sans-serif;color:var(--fg);background:var(--bg);\
margin:0 auto;padding:1rem;max-width:70rem}
h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:2rem}
a{color:inherit}code,pre,.mono{font-family:ui-monospace,monospace;font-size:13px}
.muted{color:var(--muted)}.bad{color:var(--bad);font-weight:600}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid var(--line);padding:.25rem .5rem;text-align:left;\
vertical-align:top;white-space:nowrap}
td.num,th.num{text-align:right}
nav{display:flex;gap:1rem;flex-wrap:wrap;margin:.5rem 0}
.change{border:1px solid var(--line);border-radius:6px;margin:1rem 0}
.change>h3{font:600 13px ui-monospace,monospace;margin:0;padding:.4rem .6rem;\
border-bottom:1px solid var(--line);overflow-wrap:anywhere}
.change>p{margin:.4rem .6rem;overflow-wrap:anywhere}
pre{margin:0;padding:.4rem 0;overflow-x:auto}
pre span{display:block;padding:0 .6rem}
.add{background:var(--add);color:var(--add-fg)}
.del{background:var(--del);color:var(--del-fg)}
.hunk{background:var(--hunk);color:var(--muted)}
.bar-size{fill:#8c959f}.bar-add{fill:#2da44e}.bar-del{fill:#cf222e}
svg text{fill:var(--muted);font:11px system-ui,sans-serif}
details{margin:1rem 0}summary{cursor:pointer}
";

/// The `<head>` and opening of a page; `title` is markup-free text.
pub fn page_start(title: &str) -> String {
    let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(STYLE));
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'sha256-{hash}'; base-uri 'none'; form-action 'none'\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"referrer\" content=\"no-referrer\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        text(title)
    )
}

pub const PAGE_END: &str = "</body>\n</html>\n";

/// What one unified diff adds and removes, in lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Lines {
    pub added: u64,
    pub removed: u64,
}

/// Counts the lines of a unified diff ([`super::diff::unified_diff`]'s text).
pub fn count_lines(patch: &[u8]) -> Lines {
    let mut lines = Lines::default();
    // The first two lines are the `---` and `+++` headers.
    for line in patch.split(|&b| b == b'\n').skip(2) {
        match line.first() {
            Some(b'+') => lines.added += 1,
            Some(b'-') => lines.removed += 1,
            _ => {}
        }
    }
    lines
}

/// A unified diff as a `<pre>` with a line per element: added, removed and hunk
/// lines classed for colour, each keeping its `+`, `-` or `@@` for readers who do not
/// see the colours and for print. The `---`/`+++` headers are left out (the path is
/// the change's heading).
pub fn patch(patch: &[u8]) -> String {
    let mut out = String::from("<pre>");
    let body = patch.strip_suffix(b"\n").unwrap_or(patch);
    for line in body.split(|&b| b == b'\n').skip(2) {
        let class = match line.first() {
            Some(b'+') => "add",
            Some(b'-') => "del",
            Some(b'@') => "hunk",
            _ => "ctx",
        };
        let _ = write!(out, "<span class=\"{class}\">{}</span>", contents(line));
    }
    out.push_str("</pre>");
    out
}

/// One turn in the chart.
pub struct ChartTurn {
    /// The bytes of the workspace's files.
    pub size: u64,
    pub lines: Lines,
    /// What a bar's tooltip says first (markup-free text).
    pub label: String,
}

/// Two bar charts as inline SVG, one turn per bar: the workspace's size, and the
/// lines added (up) and removed (down).
pub fn chart(turns: &[ChartTurn]) -> String {
    if turns.is_empty() {
        return String::new();
    }
    const WIDTH: f64 = 720.0;
    const HEIGHT: f64 = 120.0;
    let step = WIDTH / turns.len() as f64;
    let bar = (step * 0.8).max(1.0);
    let max_size = turns.iter().map(|t| t.size).max().unwrap_or(0).max(1) as f64;
    let max_lines = turns
        .iter()
        .map(|t| t.lines.added.max(t.lines.removed))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let mut out = String::new();
    let _ = write!(
        out,
        "<div class=\"scroll\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" \
         height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\" \
         aria-label=\"workspace size and changed lines per turn\">\
         <text x=\"0\" y=\"12\">workspace size (max {})</text>",
        bytes(max_size as u64),
        w = WIDTH,
        h = 2.0 * HEIGHT + 60.0,
    );
    for (i, turn) in turns.iter().enumerate() {
        let x = i as f64 * step;
        let h = (turn.size as f64 / max_size * HEIGHT).max(1.0);
        let _ = write!(
            out,
            "<rect class=\"bar-size\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar:.1}\" \
             height=\"{h:.1}\"><title>{}: {}</title></rect>",
            20.0 + HEIGHT - h,
            text(&turn.label),
            bytes(turn.size)
        );
    }
    // The second chart's zero line: below the first chart and its label.
    let middle = HEIGHT + 50.0 + HEIGHT / 2.0;
    let _ = write!(
        out,
        "<text x=\"0\" y=\"{:.1}\">lines added (up) and removed (down), max {}</text>",
        HEIGHT + 40.0,
        max_lines as u64
    );
    for (i, turn) in turns.iter().enumerate() {
        let x = i as f64 * step;
        let up = turn.lines.added as f64 / max_lines * (HEIGHT / 2.0);
        let down = turn.lines.removed as f64 / max_lines * (HEIGHT / 2.0);
        let title = format!(
            "{}: +{} -{} lines",
            text(&turn.label),
            turn.lines.added,
            turn.lines.removed
        );
        let _ = write!(
            out,
            "<rect class=\"bar-add\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar:.1}\" \
             height=\"{up:.1}\"><title>{title}</title></rect>\
             <rect class=\"bar-del\" x=\"{x:.1}\" y=\"{middle:.1}\" width=\"{bar:.1}\" \
             height=\"{down:.1}\"><title>{title}</title></rect>",
            middle - up
        );
    }
    out.push_str("</svg></div>\n");
    out
}

/// A byte count as people read it: `1.5 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_names_and_contents_is_text() {
        assert_eq!(
            text("<img src=x onerror='a(1)'>&\""),
            "&lt;img src=x onerror=&#39;a(1)&#39;&gt;&amp;&quot;"
        );
        // A control character, a byte that is not UTF-8 and a reordering character
        // are escaped first, then the markup.
        assert_eq!(
            name(b"a\n<b>\xff\xe2\x80\xae"),
            "a\\n&lt;b&gt;\\xff\\u{202e}"
        );
        let shown =
            patch(b"--- a/f\n+++ b/f\n@@ -1 +1 @@\n-</pre><script>x()</script>\n+\x1b[2Jok\t!\n");
        assert_eq!(
            shown,
            "<pre><span class=\"hunk\">@@ -1 +1 @@</span>\
             <span class=\"del\">-&lt;/pre&gt;&lt;script&gt;x()&lt;/script&gt;</span>\
             <span class=\"add\">+\\x1b[2Jok\t!</span></pre>"
        );
    }

    #[test]
    fn lines_are_counted_without_the_headers() {
        let patch = b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n+C\n c\n";
        assert_eq!(
            count_lines(patch),
            Lines {
                added: 2,
                removed: 1
            }
        );
        assert_eq!(count_lines(b""), Lines::default());
    }

    #[test]
    fn the_page_allows_its_own_style_and_nothing_else() {
        let page = page_start("a <title>");
        assert!(page.contains("<title>a &lt;title&gt;</title>"));
        assert!(page.contains("default-src 'none'"));
        let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(STYLE));
        assert!(page.contains(&format!("style-src 'sha256-{hash}'")));
        assert!(page.contains(&format!("<style>{STYLE}</style>")));
        assert!(!page.contains("<script"));
    }

    #[test]
    fn byte_counts_read_as_people_write_them() {
        assert_eq!(bytes(999), "999 bytes");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(5 << 30), "5.0 GiB");
    }
}

//! Names are data: how a name that came from outside ckptfs (an archive's paths and
//! symlink targets, a writer's names in `staging/`, a commit name) is printed in text
//! read by people or split into lines by programs (`diff`, `find`, `.status`, error
//! messages, logs), so that it can neither end a line nor drive the terminal.
//!
//! Printable UTF-8 passes as it is. A backslash is doubled; newline, carriage return and
//! tab are written `\n`, `\r`, `\t`; any other ASCII control character (and DEL) and
//! bytes that are not UTF-8 are written `\xNN`; the C1 controls and the invisible
//! characters that reorder text on screen (bidirectional controls, as in "Trojan
//! Source") or show nothing (zero-width spaces, the byte order mark, tags) are written
//! `\u{XX}`. Letters that look alike in different scripts pass as they are.
//! The escaping is reversible ([`unescape`]): a JSON rendering made from escaped text
//! gives the name itself. Raw bytes stay available where a program asks for them
//! (`find -0`, `cat`).

use std::borrow::Cow;
use std::fmt::Write;

/// `bytes` as text that holds no control character, escaped as the module says.
pub fn escape(bytes: &[u8]) -> Cow<'_, str> {
    if bytes
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) && b != b'\\')
    {
        // The usual case: printable ASCII, shown as it is.
        return Cow::Borrowed(std::str::from_utf8(bytes).expect("ASCII"));
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else if !push_control(&mut out, c) {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    Cow::Owned(out)
}

/// A message (an error, a reason) that may quote names, made one line of printable
/// text: control and reordering characters are escaped as in [`escape`], but
/// backslashes are left as they are, since names quoted in it may be escaped already.
pub fn message(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() || reorders(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !push_control(&mut out, c) {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Writes `c` escaped if it is a control character or one that reorders text (see the
/// module comment); returns whether it was one.
fn push_control(out: &mut String, c: char) -> bool {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if c.is_ascii_control() => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c if c.is_control() || reorders(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        _ => return false,
    }
    true
}

/// File contents shown on a terminal (`diff --patch`): lines and tabs stay, every
/// other control character, reordering character or byte that is not UTF-8 is escaped
/// as in [`escape`]; backslashes are left as they are. A checkpoint's file could
/// otherwise erase the lines above it and print others.
pub fn for_terminal(bytes: &[u8]) -> Cow<'_, [u8]> {
    let clean = |c: char| c == '\n' || c == '\t' || !(c.is_control() || reorders(c));
    if std::str::from_utf8(bytes).is_ok_and(|text| text.chars().all(clean)) {
        return Cow::Borrowed(bytes);
    }
    let mut out = String::with_capacity(bytes.len() + 16);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if clean(c) || !push_control(&mut out, c) {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    Cow::Owned(out.into_bytes())
}

/// A value shown by [`message`], for `tracing` fields and `format!`.
pub struct Message<T>(pub T);

impl<T: std::fmt::Display> std::fmt::Display for Message<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&message(&self.0.to_string()))
    }
}

/// The bytes `text` was escaped from; a sequence [`escape`] never writes is kept as
/// it is.
pub fn unescape(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out.extend_from_slice(&rest.as_bytes()[..at]);
        let escaped = &rest[at..];
        let (bytes, used): (Vec<u8>, usize) = match escaped.as_bytes().get(1) {
            Some(b'\\') => (vec![b'\\'], 2),
            Some(b'n') => (vec![b'\n'], 2),
            Some(b'r') => (vec![b'\r'], 2),
            Some(b't') => (vec![b'\t'], 2),
            Some(b'x') => match escaped
                .get(2..4)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(b) => (vec![b], 4),
                None => (vec![b'\\'], 1),
            },
            Some(b'u') => {
                let code = escaped
                    .strip_prefix("\\u{")
                    .and_then(|r| r.split_once('}'))
                    .and_then(|(hex, _)| u32::from_str_radix(hex, 16).ok().map(|c| (c, hex)))
                    .and_then(|(c, hex)| char::from_u32(c).map(|c| (c, hex.len())));
                match code {
                    Some((c, digits)) => (c.to_string().into_bytes(), 4 + digits),
                    None => (vec![b'\\'], 1),
                }
            }
            _ => (vec![b'\\'], 1),
        };
        out.extend_from_slice(&bytes);
        rest = &escaped[used..];
    }
    out.extend_from_slice(rest.as_bytes());
    out
}

/// Invisible characters: the bidirectional formatting characters, which change the
/// order in which the text around them is shown, and those that show nothing at all
/// (zero-width spaces and joiners, the soft hyphen, word joiners, the byte order mark,
/// fillers, variation selectors, tags), with which `run.sh` and `run.sh\u{200b}` look
/// alike.
fn reorders(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{61c}'
            | '\u{115f}'
            | '\u{1160}'
            | '\u{17b4}'
            | '\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_contents_for_a_terminal_keep_lines_and_tabs() {
        let shown = for_terminal(b"a\tb\\n\n\x1b[2K\r\xff\xe2\x80\xae.");
        assert_eq!(&*shown, &b"a\tb\\n\n\\x1b[2K\\r\\xff\\u{202e}."[..]);
        assert!(matches!(for_terminal(b"plain\ttext\n"), Cow::Borrowed(_)));
    }
    use proptest::prelude::*;

    #[test]
    fn printable_names_pass_and_the_rest_is_escaped() {
        assert!(matches!(
            escape(b"src/main.rs"),
            Cow::Borrowed("src/main.rs")
        ));
        assert_eq!(escape("café/é".as_bytes()), "café/é");
        assert_eq!(escape(b"a\nb\tc\rd\\e"), "a\\nb\\tc\\rd\\\\e");
        assert_eq!(escape(b"\x1b[2K\x1b[1A.bashrc"), "\\x1b[2K\\x1b[1A.bashrc");
        assert_eq!(escape(b"caf\xe9\xff"), "caf\\xe9\\xff");
        assert_eq!(
            escape("x\u{202e}y\u{85}\u{7f}\0".as_bytes()),
            "x\\u{202e}y\\u{85}\\x7f\\x00"
        );
        // Invisible characters that make one name look like another.
        assert_eq!(
            escape("run.sh\u{200b}\u{feff}\u{ad}\u{e0065}".as_bytes()),
            "run.sh\\u{200b}\\u{feff}\\u{ad}\\u{e0065}"
        );
    }

    #[test]
    fn a_forged_line_stays_on_its_line() {
        let name = b"turn\n# seal forged: sealed as ffff (stored)";
        let shown = escape(name);
        assert_eq!(shown.lines().count(), 1);
        assert!(!shown.chars().any(char::is_control));
    }

    #[test]
    fn a_message_is_one_line_and_keeps_its_escapes() {
        let quoted = format!("cannot read {}: gone\nFORGED", escape(b"caf\xe9\n"));
        assert_eq!(message(&quoted), "cannot read caf\\xe9\\n: gone\\nFORGED");
        assert_eq!(Message("a\u{2028}b").to_string(), "a\\u{2028}b");
        assert!(matches!(message("plain"), Cow::Borrowed("plain")));
    }

    #[test]
    fn unknown_escapes_are_kept() {
        assert_eq!(unescape("a\\qb\\x\\u{zz}\\"), b"a\\qb\\x\\u{zz}\\");
    }

    proptest! {
        #[test]
        fn escaping_is_reversible_and_leaves_no_control(name in proptest::collection::vec(any::<u8>(), 0..64)) {
            let shown = escape(&name);
            prop_assert!(!shown.chars().any(|c| c.is_control() || reorders(c)));
            prop_assert_eq!(unescape(&shown), name);
        }

        #[test]
        fn text_with_backslashes_round_trips(text in "[a-z\\\\\u{1b}\n\u{202e}é]{0,24}") {
            prop_assert_eq!(unescape(&escape(text.as_bytes())), text.as_bytes());
        }
    }
}

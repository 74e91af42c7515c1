//! What a command tells its user on stderr besides the log: notes when a job is done
//! (`stored checkpoint …`) and the final error. They follow the log's settings: `-q`
//! leaves only the error, and `--log-format json` makes each one a JSON object on a
//! line of its own, shaped as the log's own lines are, so that a log collector reads
//! stderr whole.

use std::fmt::Display;
use std::sync::OnceLock;

#[derive(Clone, Copy, Default)]
struct Settings {
    quiet: bool,
    json: bool,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Called once, by `main`, with the log's settings; before that, notes are text.
pub fn init(quiet: bool, json: bool) {
    let _ = SETTINGS.set(Settings { quiet, json });
}

/// Whether `-q` was given: nothing but errors on stderr, no progress either.
pub fn is_quiet() -> bool {
    settings().quiet
}

fn settings() -> Settings {
    SETTINGS.get().copied().unwrap_or_default()
}

/// A note to the user, unless `-q`: `say::note!("stored {id}")`.
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::commands::say::note_text(format_args!($($arg)*))
    };
}
pub(crate) use note;

pub fn note_text(text: impl Display) {
    let settings = settings();
    if !settings.quiet {
        emit(settings, "INFO", &text.to_string(), None);
    }
}

/// The error a command ended with, whatever `-q` says. `text` is printed as given:
/// the caller makes names in it printable.
pub fn error(text: &str) {
    emit(settings(), "ERROR", text, Some("ckptfs: error: "));
}

fn emit(settings: Settings, level: &str, text: &str, prefix: Option<&str>) {
    if settings.json {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            timestamp: String,
            level: &'a str,
            fields: Fields<'a>,
            target: &'a str,
        }
        #[derive(serde::Serialize)]
        struct Fields<'a> {
            message: &'a str,
        }
        let line = Line {
            timestamp: humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
            level,
            fields: Fields { message: text },
            target: "ckptfs",
        };
        eprintln!(
            "{}",
            serde_json::to_string(&line).expect("strings serialize")
        );
    } else {
        eprintln!("{}{text}", prefix.unwrap_or(""));
    }
}

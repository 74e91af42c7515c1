//! Command-line definitions (clap) and their validation; no work happens here.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

const STORE_HELP: &str = "s3://BUCKET/PREFIX, or a local directory";

#[derive(Debug, Parser)]
#[command(
    name = "ckptfs",
    version,
    about = "Content-addressed workspace checkpoints in S3, as a filesystem and a CLI",
    after_help = "Credentials and region come from the standard AWS chain: AWS_ACCESS_KEY_ID and\n\
                  AWS_SECRET_ACCESS_KEY, AWS_PROFILE with ~/.aws/config and ~/.aws/credentials,\n\
                  SSO, or an instance role; AWS_REGION. -v, -vv or RUST_LOG=debug for detailed logs.\n\
                  mount -t fuse.ckptfs STORE MOUNTPOINT -o OPTIONS (and /etc/fstab) run `ckptfs mount`\n\
                  with each -o option as a flag: cache_dir=DIR is --cache-dir DIR."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// S3 endpoint for MinIO, R2 or a local server (implies path-style addressing).
    #[arg(long, global = true, env = "AWS_ENDPOINT_URL", value_name = "URL")]
    pub endpoint_url: Option<String>,

    /// More detail in the log: -v for debug, -vv for everything.
    #[arg(short, long, global = true, action = ArgAction::Count)]
    pub verbose: u8,

    /// Errors only in the log.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Log lines as text, or as one JSON object each (for log collectors).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "CKPTFS_LOG_FORMAT"
    )]
    pub log_format: LogFormat,

    /// A download that receives nothing for this long fails (and the mount tries it
    /// again) instead of hanging.
    #[arg(long, global = true, default_value = "60", value_parser = parse_seconds, value_name = "SECONDS", env = "CKPTFS_STALL_TIMEOUT")]
    pub stall_timeout: Duration,

    /// Largest archive accepted, compressed (bytes, or with K/M/G/KiB/MiB/GiB).
    #[arg(long, global = true, default_value = "1GiB", value_parser = parse_size, value_name = "SIZE", env = "CKPTFS_MAX_ARCHIVE_SIZE")]
    pub max_archive_size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mount the store: one read-only directory per verified checkpoint.
    #[command(
        after_help = "Example:\n  ckptfs mount s3://my-bucket/checkpoints /mnt/ckpt\n  \
                            ls /mnt/ckpt/latest/\n  \
                            mkdir /mnt/ckpt/staging/turn-8 && cp -a ./workspace/. /mnt/ckpt/staging/turn-8/\n  \
                            mv /mnt/ckpt/staging/turn-8 /mnt/ckpt/commit/     # captures it\n  \
                            fusermount3 -u /mnt/ckpt\n\
                            The same from /etc/fstab:\n  \
                            s3://my-bucket/checkpoints /mnt/ckpt fuse.ckptfs noauto,_netdev,x-systemd.automount,cache_dir=/var/cache/ckptfs 0 0"
    )]
    Mount(MountArgs),
    /// Capture DIR as a checkpoint; prints `<sha256> <size>`.
    #[command(after_help = "Example:\n  ckptfs put s3://my-bucket/checkpoints ./workspace")]
    Put(PutArgs),
    /// Download, verify, and restore a checkpoint into DEST (new or empty).
    #[command(after_help = "Example:\n  ckptfs get s3://my-bucket/checkpoints 0a9686a9 ./restored")]
    Get(GetArgs),
    /// Check checkpoints against their names: all of them, or the ones given.
    #[command(
        after_help = "Example:\n  ckptfs verify s3://my-bucket/checkpoints\n  \
                            ckptfs verify ./store 0a9686a9"
    )]
    Verify(VerifyArgs),
    /// List checkpoints, oldest first: sha256, size, time.
    #[command(after_help = "Example:\n  ckptfs ls s3://my-bucket/checkpoints --json")]
    Ls(LsArgs),
    /// Delete the checkpoints no keep rule keeps (restic's rules), never one younger
    /// than the grace period; prints each decision.
    #[command(
        after_help = "Example:\n  ckptfs prune s3://my-bucket/checkpoints --keep-last 50 --keep-within 7d --dry-run\n  \
                      ckptfs prune ./store --keep-last 10 --keep-lineage"
    )]
    Prune(PruneArgs),
    /// The checkpoints, oldest first, with what changed in each since the one before.
    #[command(
        long_about = LOG_ABOUT,
        after_help = "Example:\n  ckptfs log s3://my-bucket/checkpoints\n  \
                      2026-11-29T07:08:00Z  0a9686a94759  1834 bytes  12 files  \
                      +3 ~1 -0  +1206 -27 bytes\n  \
                      ckptfs log ./store --json"
    )]
    Log(LogArgs),
    /// Write a static HTML history of the turns into a directory: an index with a chart,
    /// one page per turn with its diffs, every checkpoint verified while it is made.
    #[command(
        long_about = REPORT_ABOUT,
        after_help = "Example:\n  ckptfs report s3://my-bucket/checkpoints ./review\n  \
                      ckptfs report ./store ./review --lineage latest\n  \
                      chromium ./review/index.html"
    )]
    Report(ReportArgs),
    /// What changed from checkpoint A to checkpoint B: A (added), D (removed), M
    /// (modified) and the path, one line each.
    #[command(
        long_about = DIFF_ABOUT,
        after_help = "Example:\n  ckptfs diff s3://my-bucket/checkpoints latest~1 latest\n  \
                      ckptfs diff s3://my-bucket/checkpoints 0a9686a9 latest --patch"
    )]
    Diff(DiffArgs),
    /// Write one file of a checkpoint to stdout, verified.
    #[command(
        long_about = CAT_ABOUT,
        after_help = "Example:\n  ckptfs cat s3://my-bucket/checkpoints latest src/main.py"
    )]
    Cat(CatArgs),
    /// List the paths of a checkpoint, sorted, optionally only those matching a glob.
    #[command(
        long_about = FIND_ABOUT,
        after_help = "Example:\n  ckptfs find s3://my-bucket/checkpoints latest '*.py'\n  \
                      ckptfs find ./store 0a9686a9 'src/**/*.rs'"
    )]
    Find(FindArgs),
    /// What a running mount's `.status` says: each checkpoint's state, the seals, the
    /// counters and latencies.
    #[command(after_help = "Example:\n  ckptfs status /mnt/ckpt --json")]
    Status(StatusArgs),
    /// Make a workspace in a running mount's `staging/` from a checkpoint, in one
    /// request to the daemon: the next turn without a `cp -a` through the mount.
    #[command(
        long_about = FORK_ABOUT,
        after_help = "Example:\n  ckptfs fork /mnt/ckpt latest turn-8\n  \
                      ckptfs fork /mnt/ckpt 0a9686a9 turn-8"
    )]
    Fork(ForkArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(after_help = "Example:\n  ckptfs completions bash > /etc/bash_completion.d/ckptfs")]
    Completions(CompletionsArgs),
    /// Print the manual page (roff), for `man -l -`; or write every page (one per
    /// command) into a directory.
    #[command(
        after_help = "Example:\n  ckptfs man | man -l -\n  ckptfs man --out-dir /usr/local/share/man/man1"
    )]
    Man(ManArgs),
}

const FORK_ABOUT: &str = "\
Make workspace MOUNTPOINT/staging/NAME from checkpoint REF, in one request to the
daemon: what `cp -a MOUNTPOINT/REF/. MOUNTPOINT/staging/NAME/` gives (modes, times, and
the owners shown when run as root), without a round trip through the mount per file.

NAME must not exist: the command makes it, then the daemon copies the verified files
from its cache into it (a reflink where the filesystem has them), building the tree
out of sight and moving it in once whole; on a failure NAME is removed again. The seal
of the workspace names REF as its parent. REF is a checkpoint id, a prefix of one, or
`latest`. The same without this command: `mkdir MOUNTPOINT/staging/NAME && setfattr -n
user.ckptfs.fork -v ID MOUNTPOINT/staging/NAME`.";

const LOG_ABOUT: &str = "\
The checkpoints, oldest first, with what changed in each since the one before.

One line per checkpoint: the object's time (the store's clock), the first 12 hex
digits of its sha256, its size (compressed), its number of regular files, the
entries added (+), modified (~) and removed (-) since the checkpoint before it (for
the first one: since nothing), and the bytes of file contents added and removed. As in
`diff --stat`, a file whose contents changed counts its old size as removed and its
new size as added; modification times are not compared.

Every checkpoint is downloaded and verified first (hashed and indexed in one pass,
see --cache-dir); nothing is printed unless all of them verify.";

const REPORT_ABOUT: &str = "\
Write a static HTML history of the turns into OUTDIR, to open from file:// with no
server and no network: index.html lists the turns in capture order (time, sha256,
size, files added, modified, removed and renamed, lines added and removed) under a
chart of the workspace's size and changed lines; turns/SHA256.html shows one turn's
changes, each with its unified diff against its parent (put --parent) or else the turn
before, and every entry of the turn.

Every checkpoint shown is downloaded and verified (hashed against its name) while the
report is made; one that fails is shown as FAILED and the exit status is 1. Names and
contents come from the sandbox and are shown as text: the pages hold no script, and
their Content-Security-Policy forbids scripts and every request.

OUTDIR is made if missing. Given an earlier report, only the turns it does not hold
are computed again (the others are still verified); a directory that holds anything
else is refused.";

const DIFF_ABOUT: &str = "\
What changed from checkpoint A to checkpoint B, one line per changed entry, sorted by
path (byte order):

  A PATH   added: in B, not in A
  D PATH   removed (deleted): in A, not in B
  M PATH   modified: its contents, type, permission bits, numeric owner or symlink
           target differ

Paths and symlink targets are escaped as `find` does (see `ckptfs find --help`), so a
name cannot start a line of its own or drive the terminal.

Entries below an added or removed directory are listed one by one, and so are those
below a directory that took the place of a file (or the other way round: the path
itself is then M). Contents are compared by the size and checksum recorded when the
checkpoint was verified, without reading them; modification times are not compared.

--stat prints one line instead: the counts, and the bytes of file contents added and
removed (a file whose contents changed counts its old size as removed and its new size
as added). --json prints a JSON array of {path, change, fields, old, new} (change:
added, removed or modified; fields: the names of what differs, among type, content,
mode, owner and target; old and new: null or {type, mode, uid, gid, and size or
target}). Paths
that are not UTF-8 are written with \\xNN escapes there. --patch adds below each line
what changed in it: a unified diff for text files of up to 4MiB (`--- a/PATH`,
`+++ b/PATH`), \"Binary files differ\" when either side holds a NUL byte in its first
8000 bytes, and lines such as `mode 0644 -> 0755` for the other fields. Looking for a
minimal diff takes at most 0.5 s a file and 3 s in all; after that a file's diff shows
the rest of it as removed and added.

Both checkpoints are downloaded and verified before anything is printed.";

const CAT_ABOUT: &str = "\
Write one regular file of a checkpoint to stdout, byte for byte.

The checkpoint is downloaded and verified (hashed and indexed in one pass) before
anything is written, and the file is checked once more against its checksum as it is
read. PATH is relative to the checkpoint's root (a leading / is ignored). Symlinks are
not followed: a path that is or goes through one is an error that says where it
points; so are a directory and a path that does not exist.";

const FIND_ABOUT: &str = "\
List the paths of a checkpoint (files, directories and symlinks, the root excepted),
one per line, sorted in byte order (as `LC_ALL=C sort` would), relative to the
checkpoint's root. Names are printed as data: a backslash is doubled, a newline, tab or
carriage return is written \\n, \\t, \\r, another ASCII control character or a byte
that is not UTF-8 \\xNN, another control character (or one that reorders text on
screen) \\u{XX}; -0 prints the bytes as they are.

PATTERN is a shell glob. A pattern without / is matched against each entry's name,
like `find -name` (`*.py` finds Python files at any depth); one with / against its
whole path from the checkpoint's root (`src/*.rs` only directly in src/; a leading /
is ignored). `*`, `?` and `[...]` never match /; `**` matches any number of
directories (`src/**/*.rs`); `{a,b}` matches either; a leading `.` is not special; `\\`
quotes the next character. Matching is on bytes (names need not be UTF-8): `?` and
`[...]` match one byte, not one multi-byte character. Quote the pattern so that the
shell does not expand it.

The checkpoint is downloaded and verified before anything is printed.";

/// Where the review commands (`log`, `diff`, `cat`, `find`) keep the checkpoints they
/// verify, and the archive limits they hold them to.
#[derive(Debug, Args)]
pub struct ReviewArgs {
    /// Use and fill this cache directory, such as a mount's --cache-dir, so that
    /// checkpoints verified there are not downloaded again. When a running mount holds
    /// it, a private temporary cache is used instead (with a note on stderr). Default:
    /// a temporary cache, deleted at exit.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Bound on --cache-dir; least recently used checkpoints are evicted first.
    #[arg(long, default_value = "4GiB", value_parser = parse_size, value_name = "SIZE")]
    pub cache_size: u64,
    /// Where the temporary cache is made (default: the system's temporary directory).
    #[arg(long, value_name = "DIR", env = "TMPDIR")]
    pub temp_dir: Option<PathBuf>,
    #[command(flatten)]
    pub limits: LimitArgs,
}

const CHECKPOINT_HELP: &str =
    "A sha256, an unambiguous prefix of one, latest, or latest~N (the N-th before the newest)";

#[derive(Debug, Args)]
pub struct LogArgs {
    #[arg(help = STORE_HELP)]
    pub store: String,
    /// One JSON array of {"sha256", "size", "last_modified", "entries", "files",
    /// "unpacked_bytes", "previous", "parent", "compared_with", "added", "modified",
    /// "removed", "bytes_added", "bytes_removed"}.
    #[arg(long)]
    pub json: bool,
    /// Only CHECKPOINT and the chain of parents it claims (`put --parent`), oldest
    /// first: one sandbox's turns in a store that several write.
    #[arg(long, value_name = "CHECKPOINT")]
    pub lineage: Option<String>,
    #[command(flatten)]
    pub review: ReviewArgs,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    #[arg(help = STORE_HELP)]
    pub store: String,
    /// The directory to write the report into.
    pub outdir: PathBuf,
    /// Only these checkpoints (default: all), in capture order.
    #[arg(
        value_name = "CHECKPOINT",
        help = "Only these checkpoints (default: all), shown in capture order; each a sha256, a prefix of one, latest or latest~N"
    )]
    pub checkpoints: Vec<String>,
    /// Only CHECKPOINT and the chain of parents it claims (`put --parent`).
    #[arg(long, value_name = "CHECKPOINT", conflicts_with = "checkpoints")]
    pub lineage: Option<String>,
    #[command(flatten)]
    pub review: ReviewArgs,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    #[arg(help = STORE_HELP)]
    pub store: String,
    #[arg(help = CHECKPOINT_HELP, value_name = "A")]
    pub old: String,
    #[arg(help = CHECKPOINT_HELP, value_name = "B")]
    pub new: String,
    /// Only the counts and the bytes added and removed.
    #[arg(long, conflicts_with_all = ["json", "patch"])]
    pub stat: bool,
    /// A JSON array of {path, change, fields, old, new}.
    #[arg(long, conflicts_with = "patch")]
    pub json: bool,
    /// Also unified diffs of the text files that changed, and the other fields.
    #[arg(long)]
    pub patch: bool,
    #[command(flatten)]
    pub review: ReviewArgs,
}

#[derive(Debug, Args)]
pub struct CatArgs {
    #[arg(help = STORE_HELP)]
    pub store: String,
    #[arg(help = CHECKPOINT_HELP, value_name = "CHECKPOINT")]
    pub checkpoint: String,
    /// The file, relative to the checkpoint's root.
    pub path: std::ffi::OsString,
    #[command(flatten)]
    pub review: ReviewArgs,
}

#[derive(Debug, Args)]
pub struct FindArgs {
    #[arg(help = STORE_HELP)]
    pub store: String,
    #[arg(help = CHECKPOINT_HELP, value_name = "CHECKPOINT")]
    pub checkpoint: String,
    /// A shell glob: against names without /, against whole paths with / (see above).
    pub pattern: Option<String>,
    /// End each path with a NUL byte instead of a newline (for `xargs -0`).
    #[arg(short = '0', long)]
    pub null: bool,
    #[command(flatten)]
    pub review: ReviewArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Where the store is mounted.
    pub mountpoint: PathBuf,
    /// One JSON object: {"store", "listed", "listing_error", "counters",
    /// "seals_in_progress", "seals", "latencies", "checkpoints": [{"sha256", "size",
    /// "time", "state", "verified_at", "from", "rechecked_at", "reason"}]}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ForkArgs {
    /// Where the store is mounted (not `--read-only`).
    pub mountpoint: PathBuf,
    /// The checkpoint: its id, a prefix of it, or `latest`.
    #[arg(value_name = "REF")]
    pub reference: String,
    /// The new workspace's name in `staging/`.
    pub name: std::ffi::OsString,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write ckptfs.1 and ckptfs-COMMAND.1 here instead of printing ckptfs.1.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct PutArgs {
    #[arg(help = STORE_HELP)]
    pub store: String,
    /// The workspace directory to capture.
    pub dir: PathBuf,
    /// Archives larger than this are uploaded in parts of this size (at least 5MiB).
    #[arg(long, default_value = "64MiB", value_parser = parse_size, value_name = "SIZE", env = "CKPTFS_PART_SIZE")]
    pub part_size: u64,
    /// Where the archive is written before upload.
    #[arg(long, value_name = "DIR", env = "TMPDIR")]
    pub temp_dir: Option<PathBuf>,
    /// Refuse a tree whose archive would unpack to more than this (readers refuse it
    /// too, with the same default).
    #[arg(long, default_value = "16GiB", value_parser = parse_size, value_name = "SIZE", env = "CKPTFS_MAX_UNPACKED_SIZE")]
    pub max_unpacked_size: u64,
    /// Keeps the compressed pieces of earlier captures in DIR/members, so that the
    /// next capture compresses only what changed (the same directory as a mount's
    /// --cache-dir; default as there).
    #[arg(long, value_name = "DIR", env = "CKPTFS_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    #[arg(long, default_value = "1GiB", value_parser = parse_size, value_name = "SIZE", env = "CKPTFS_MEMBER_CACHE_SIZE", help = MEMBER_CACHE_HELP)]
    pub member_cache_size: u64,
    /// The checkpoint this workspace was made from (a sha256, a prefix of one,
    /// latest or latest~N; it must be in the store): recorded in the new object's
    /// metadata, so that `log` compares the new turn with it and `log --lineage`
    /// follows the chain.
    #[arg(long, value_name = "CHECKPOINT")]
    pub parent: Option<String>,
    /// Files changed less than this many seconds before the put are read whatever the
    /// last put of DIR saw of them: writes through a memory mapping can leave a file's
    /// times as they were until the kernel writes its pages back (about 30 s on ext4).
    #[arg(long, default_value = "60", value_parser = parse_seconds, value_name = "SECONDS", env = "CKPTFS_PUT_SETTLE")]
    pub settle: Duration,
}

const MEMBER_CACHE_HELP: &str = "Bound on the compressed pieces of earlier captures kept in \
    CACHE_DIR/members (0: keep none, compress everything)";

#[derive(Debug, Args)]
pub struct GetArgs {
    #[arg(help = STORE_HELP)]
    pub store: String,
    #[arg(help = CHECKPOINT_HELP, value_name = "CHECKPOINT")]
    pub sha256: String,
    /// Where to restore; must not exist or be empty.
    pub dest: PathBuf,
    /// Where the archive is downloaded before it is verified and extracted.
    #[arg(long, value_name = "DIR", env = "TMPDIR")]
    pub temp_dir: Option<PathBuf>,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// Bounds on what one checkpoint may unpack to; the same for `get` and the mount.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Largest total size of one checkpoint's files once unpacked.
    #[arg(long, default_value = "16GiB", value_parser = parse_size, value_name = "SIZE", env = "CKPTFS_MAX_UNPACKED_SIZE")]
    pub max_unpacked_size: u64,
    /// Largest number of entries in one checkpoint (directories implied by paths count,
    /// and existing ones a path enters again beyond 32 from the previous path).
    #[arg(
        long,
        default_value = "2000000",
        value_name = "N",
        env = "CKPTFS_MAX_ENTRIES"
    )]
    pub max_entries: u64,
    /// Largest total size of one checkpoint's paths and link targets (what a reader
    /// keeps in memory grows with it).
    #[arg(long, default_value = "256MiB", value_parser = parse_size, value_name = "SIZE", env = "CKPTFS_MAX_METADATA_SIZE")]
    pub max_metadata_size: u64,
}

impl LimitArgs {
    pub fn limits(&self) -> crate::archive::Limits {
        crate::archive::Limits {
            max_entries: self.max_entries,
            max_unpacked_bytes: self.max_unpacked_size,
            max_metadata_bytes: self.max_metadata_size,
            max_index_bytes: u64::MAX,
        }
    }
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[arg(help = STORE_HELP)]
    pub store: String,
    /// Checkpoints to verify (a sha256, a prefix of one, latest or latest~N); all of
    /// them when none is given.
    #[arg(value_name = "CHECKPOINT")]
    pub sha256: Vec<String>,
    /// Also read the bucket's versions: report every checkpoint hidden by a delete
    /// (HIDDEN), every version of a name with other bytes (TAMPERED) and every version
    /// that could not be read (UNREADABLE). Needs a versioned bucket; downloads each
    /// version, up to --max-versions per name.
    #[arg(long, conflicts_with = "sha256")]
    pub history: bool,
    /// With --history: the versions of one name downloaded at most, the current one
    /// and the newest (a writer can pile versions on a name); the older ones are
    /// reported as NOT CHECKED.
    #[arg(long, default_value_t = 32, value_name = "N", requires = "history")]
    pub max_versions: usize,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    #[arg(help = STORE_HELP)]
    pub store: String,
    /// Keep the N newest checkpoints.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_last: usize,
    /// Keep the checkpoints taken within DURATION of the newest one (such as 7d, 12h).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub keep_within: Option<std::time::Duration>,
    /// Keep this checkpoint (a sha256, a prefix, latest or latest~N); repeatable.
    #[arg(long, value_name = "CHECKPOINT")]
    pub keep: Vec<String>,
    /// Also keep the parents that kept checkpoints claim (put --parent, seals), back
    /// to the first.
    #[arg(long)]
    pub keep_lineage: bool,
    /// Never delete a checkpoint younger than this, whatever the rules say: a replica
    /// may be opening it, or a capture may have just found its content present.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = humantime::parse_duration)]
    pub grace: std::time::Duration,
    /// Print the decisions; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    #[arg(help = STORE_HELP)]
    pub store: String,
    /// One JSON array of {"sha256", "size", "last_modified"}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct MountArgs {
    #[arg(help = STORE_HELP)]
    pub store: String,
    /// An existing empty directory.
    pub mountpoint: PathBuf,
    /// Verified checkpoints are kept here, between runs too [default:
    /// $XDG_CACHE_HOME/ckptfs, else ~/.cache/ckptfs, else /var/cache/ckptfs for root].
    #[arg(long, value_name = "DIR", env = "CKPTFS_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Bound on the cache; least recently used checkpoints are evicted first.
    #[arg(long, default_value = "4GiB", value_parser = parse_size, value_name = "SIZE", env = "CKPTFS_CACHE_SIZE")]
    pub cache_size: u64,
    /// Where staged workspaces live (default: a folder in the cache directory).
    #[arg(long, value_name = "DIR", env = "CKPTFS_STAGING_DIR")]
    pub staging_dir: Option<PathBuf>,
    /// Seconds between listings of the store.
    #[arg(long, default_value = "5", value_parser = parse_seconds, value_name = "SECONDS", env = "CKPTFS_REFRESH")]
    pub refresh: Duration,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Stay in the foreground instead of daemonizing once the mount is ready.
    #[arg(short, long, env = "CKPTFS_FOREGROUND")]
    pub foreground: bool,
    /// Let other users access the mount (needs user_allow_other in /etc/fuse.conf; with
    /// a writable staging/, needs the daemon to run as root).
    #[arg(long, env = "CKPTFS_ALLOW_OTHER")]
    pub allow_other: bool,
    /// Show every entry as owned by the mounting user instead of the archive's owners.
    #[arg(long, env = "CKPTFS_OWNER_SELF")]
    pub owner_self: bool,
    /// Part size of the uploads of sealed workspaces.
    #[arg(long, default_value = "64MiB", value_parser = parse_size, value_name = "SIZE", env = "CKPTFS_PART_SIZE")]
    pub part_size: u64,
    #[arg(long, default_value = "1GiB", value_parser = parse_size, value_name = "SIZE", env = "CKPTFS_MEMBER_CACHE_SIZE", help = MEMBER_CACHE_HELP)]
    pub member_cache_size: u64,
    /// Browse only: no staging/ and commit/, mounted `ro`; the kernel then opens files
    /// by itself, without a round trip each (the fastest way to review turns).
    #[arg(long, env = "CKPTFS_READ_ONLY")]
    pub read_only: bool,
    /// Open files through the daemon, so that checkpoint files of 16 KiB and more are
    /// read by FUSE passthrough, at the speed of the cache's disk, from the first
    /// read on; costs a round trip to the daemon per open (slower for many small
    /// files) on a read-only mount, where the kernel otherwise opens files by itself
    /// (a writable mount always opens through the daemon).
    #[arg(long, env = "CKPTFS_PASSTHROUGH")]
    pub passthrough: bool,
    /// Checkpoints verified and loaded at once (default: half the cores, 2 to 16);
    /// first accesses beyond it wait in order.
    #[arg(long, value_name = "N", env = "CKPTFS_LOADERS")]
    pub loaders: Option<usize>,
    /// The memory loaded checkpoints' indexes may take in all: checkpoints nobody
    /// uses are unloaded (kept on disk) to stay within it, and an archive whose index
    /// alone would take more than half of it is refused.
    #[arg(long, default_value = "512MiB", value_parser = parse_size, value_name = "SIZE", env = "CKPTFS_MEMORY_BUDGET")]
    pub memory_budget: u64,
    /// Request threads of the FUSE session.
    #[arg(long, default_value = "4", value_name = "N", env = "CKPTFS_THREADS")]
    pub threads: usize,
}

/// Parses `1048576`, `64M`, `64MiB`, `1G`, `1GiB`, `512K` (all binary multiples).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as 5MiB or 1048576"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("unknown unit in {text:?}; use K, M, G or T")),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.0..=86400.0).contains(&seconds) {
        return Err("give a number of seconds between 0 and 86400".into());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The clap command, with two changes to what clap shows: `--help` does not print the
/// values of environment variables (`AWS_ENDPOINT_URL` may hold a password), and a
/// usage error shows each command's usage as `--help` does, not with every flag an
/// environment variable set (as if `--endpoint-url` were required).
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
        .mut_args(|arg| arg.hide_env_values(true))
        .mut_subcommands(|sub| {
            let name = sub.get_name().to_owned();
            let mut shown = sub.clone().bin_name(format!("ckptfs {name}"));
            let usage = shown.render_usage().to_string();
            let usage = usage.trim_start_matches("Usage: ").to_owned();
            sub.mut_args(|arg| arg.hide_env_values(true))
                .override_usage(usage)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("5MiB"), Ok(5 << 20));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn limit_defaults_are_the_library_defaults() {
        let cli = Cli::try_parse_from(["ckptfs", "get", "store", "abc", "dest"]).unwrap();
        let Command::Get(args) = cli.command else {
            panic!("parsed as another command")
        };
        assert_eq!(args.limits.limits(), crate::archive::Limits::DEFAULT);
    }

    #[test]
    fn definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

//! File operations that never leave a directory: everything is reached from a
//! directory descriptor, one name at a time, without following a symlink.
//!
//! This is how ckptfs touches anything a hostile party could have shaped: the paths in
//! an archive being restored, and the trees that a sandboxed writer builds under
//! `staging/`. The rules:
//! - a directory is entered with `openat(O_DIRECTORY | O_NOFOLLOW)` on one name, so a
//!   symlink on the way fails the call (`ELOOP`) instead of being followed, and `..`
//!   is never passed (callers split paths with [`crate::archive::clean_path`] or take
//!   names from `readdir`);
//! - what was opened is what is acted on: attributes are set with `fchmod`, `fchown`
//!   and `futimens` on the descriptor, or with `AT_SYMLINK_NOFOLLOW` on a name in an
//!   opened directory; nothing learnt about a path is reused later without opening it
//!   again.
//!
//! A check on a path string followed by an action on the same string is the bug this
//! module exists to avoid: the path can be swapped in between.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};

fn os(e: rustix::io::Errno) -> io::Error {
    io::Error::from(e)
}

/// Opens the file at `path` for reading if it is a regular file: a symlink in its last
/// component is not followed (`ELOOP`), and a FIFO put in its place neither blocks the
/// open nor is read (`InvalidInput`). For ckptfs's own files (store, cache), whose
/// directories a hostile party does not shape.
pub fn open_regular(path: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Opens the directory `name` in `dir` for reading, refusing a symlink (`ELOOP`) or
/// anything that is not a directory (`ENOTDIR`).
pub fn open_dir(dir: impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    let dir = dir.as_fd();
    rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        // With O_DIRECTORY, a symlink is "not a directory" too; say which it was.
        rustix::io::Errno::NOTDIR
            if kind_at(dir, name).ok().flatten() == Some(FileType::Symlink) =>
        {
            io::Error::from_raw_os_error(libc::ELOOP)
        }
        e => os(e),
    })
}

/// Opens the directory `root/parts[0]/parts[1]/...`, one component at a time.
pub fn open_dir_path(root: BorrowedFd<'_>, parts: &[&[u8]]) -> io::Result<OwnedFd> {
    let mut dir = rfs::openat(
        root,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(os)?;
    for part in parts {
        dir = open_dir(&dir, OsStr::from_bytes(part))?;
    }
    Ok(dir)
}

/// Opens, beneath `from`, the directory that the first of `names` lead to, as many at
/// once as a path holds (for a chain of directories deeper than `PATH_MAX` allows in
/// one path); returns it (`O_PATH`) and how many names it took. Links and `..` are
/// refused by the kernel (`openat2` with `RESOLVE_BENEATH` and `RESOLVE_NO_SYMLINKS`),
/// or, on a kernel without `openat2`, by taking one name at a time without following
/// links.
pub fn open_dirs_beneath(from: impl AsFd, names: &[&[u8]]) -> io::Result<(OwnedFd, usize)> {
    use rustix::fs::ResolveFlags;
    use std::sync::atomic::{AtomicBool, Ordering};
    /// The longest path handed to the kernel at once, under `PATH_MAX`.
    const PATH_CHUNK: usize = 4000;
    const FLAGS: OFlags = OFlags::PATH
        .union(OFlags::DIRECTORY)
        .union(OFlags::NOFOLLOW)
        .union(OFlags::CLOEXEC);
    static NO_OPENAT2: AtomicBool = AtomicBool::new(false);
    let from = from.as_fd();
    let one_at_a_time = || {
        rfs::openat(from, OsStr::from_bytes(names[0]), FLAGS, Mode::empty())
            .map(|fd| (fd, 1))
            .map_err(os)
    };
    if NO_OPENAT2.load(Ordering::Relaxed) {
        return one_at_a_time();
    }
    let mut path = Vec::new();
    let mut taken = 0;
    for name in names {
        if !path.is_empty() && path.len() + 1 + name.len() >= PATH_CHUNK {
            break;
        }
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(name);
        taken += 1;
    }
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rfs::openat2(
        from,
        OsStr::from_bytes(&path),
        FLAGS,
        Mode::empty(),
        resolve,
    ) {
        Ok(fd) => Ok((fd, taken)),
        Err(rustix::io::Errno::NOSYS) => {
            NO_OPENAT2.store(true, Ordering::Relaxed);
            one_at_a_time()
        }
        Err(e) => Err(os(e)),
    }
}

/// Why [`DirCursor::make`] could not reach a directory.
#[derive(Debug)]
pub enum WalkError {
    /// A component is a symlink: following it could leave the root.
    Symlink,
    /// A component exists and is not a directory.
    NotADirectory,
    Io(io::Error),
}

impl From<io::Error> for WalkError {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ELOOP) => WalkError::Symlink,
            Some(libc::ENOTDIR) => WalkError::NotADirectory,
            _ => WalkError::Io(e),
        }
    }
}

/// How often a [`DirCursor`] keeps a descriptor along its path: one directory in this
/// many, and the path's end. A path of 2,047 directories (the deepest that fits in
/// `PATH_MAX`) then holds 128, well under the usual limit of 1,024 open files that one
/// descriptor per level would exceed, and going back up to any directory of the path
/// reopens fewer than this many.
pub const CURSOR_STRIDE: usize = 16;

/// The directories of one path below a root, kept open so that reaching the next path
/// opens only what the two do not share: a restore reaches each entry's parent, and
/// consecutive entries nearly always share most of it (a tar lists a directory's
/// contents together), so a tree thousands of levels deep costs about one `openat` per
/// entry instead of one per level per entry.
///
/// The rules of this module hold for every directory it opens: each is entered with
/// [`open_dir`] from its parent's descriptor, one name at a time. What it adds is that
/// a descriptor opened for one path is used again for the next; that is sound only as
/// long as each kept descriptor is still the directory at its path, so:
/// - it keeps descriptors of directories only, and a directory stops being the one at
///   its path only when it, or a directory above it, is removed or renamed: creating
///   or replacing anything else, anywhere, leaves it in place;
/// - whoever removes a directory calls [`DirCursor::forget`] with its path before the
///   next reach, and the cursor drops what it held at and below that path. A restore's
///   entry removes at most the name it is for, below its parent, so the cursor that
///   just reached that parent keeps all of it;
/// - it assumes that nothing else removes or renames directories under the root
///   meanwhile, as the restore already does between opening a directory and writing
///   in it (the root is a new or empty DEST that only the restore writes).
///
/// Descriptors kept: the one of every [`CURSOR_STRIDE`]th directory of the path, and
/// the one of its end; a reach that leaves the path below a kept directory reopens the
/// few directories between it and where the new path departs.
pub struct DirCursor {
    root: OwnedFd,
    /// The path the cursor is at, one component each.
    names: Vec<Vec<u8>>,
    /// `kept[i]` is the directory at `names[..(i + 1) * CURSOR_STRIDE]`; always
    /// `names.len() / CURSOR_STRIDE` of them.
    kept: Vec<OwnedFd>,
    /// The directory at `names` when that is not a kept one (when `names.len()` is not
    /// a multiple of the stride), else `None`.
    end: Option<OwnedFd>,
}

/// What a reach does with a missing directory: creates it with this mode (before the
/// umask), calling the function first (which can refuse, with an error).
type Create<'a> = (u32, &'a mut dyn FnMut() -> io::Result<()>);

impl DirCursor {
    /// A cursor at `root` itself (on a descriptor of its own).
    pub fn new(root: BorrowedFd<'_>) -> io::Result<Self> {
        Ok(DirCursor {
            root: open_dir_path(root, &[])?,
            names: Vec::new(),
            kept: Vec::new(),
            end: None,
        })
    }

    /// Opens the directory `root/parts[0]/parts[1]/...` (as [`open_dir_path`] does).
    pub fn open(&mut self, parts: &[&[u8]]) -> io::Result<BorrowedFd<'_>> {
        self.walk(parts, None)?;
        Ok(self.dir())
    }

    /// Opens the directory at `parts`, creating missing components with `mode` (before
    /// the umask) and calling `created` before each one is made.
    pub fn make(
        &mut self,
        parts: &[&[u8]],
        mode: u32,
        created: &mut dyn FnMut() -> io::Result<()>,
    ) -> Result<BorrowedFd<'_>, WalkError> {
        self.walk(parts, Some((mode, created)))?;
        Ok(self.dir())
    }

    /// Drops whatever the cursor holds at `parts` or below: the directory at that path
    /// was removed (or may have been). The root itself cannot be.
    pub fn forget(&mut self, parts: &[&[u8]]) {
        let below = !parts.is_empty() && shared_prefix(&self.names, parts) == parts.len();
        if below {
            self.truncate(parts.len() - 1);
        }
    }

    /// Goes back to the root, closing everything but the root's descriptor.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// The directory the cursor is at.
    fn dir(&self) -> BorrowedFd<'_> {
        match (&self.end, self.kept.last()) {
            (Some(end), _) => end.as_fd(),
            (None, Some(kept)) => kept.as_fd(),
            (None, None) => self.root.as_fd(),
        }
    }

    /// Goes up to the first `len` components of the path, or further up, to the
    /// deepest kept directory among them, when the one at `len` was not kept.
    fn truncate(&mut self, len: usize) {
        if len >= self.names.len() {
            return;
        }
        let len = len - len % CURSOR_STRIDE;
        self.names.truncate(len);
        self.kept.truncate(len / CURSOR_STRIDE);
        self.end = None;
    }

    /// Moves the cursor to `parts`: up to the deepest directory it shares with them,
    /// then down one component at a time. On an error the cursor stays at the last
    /// directory it reached.
    fn walk(&mut self, parts: &[&[u8]], mut create: Option<Create<'_>>) -> io::Result<()> {
        self.truncate(shared_prefix(&self.names, parts));
        for part in &parts[self.names.len()..] {
            let name = OsStr::from_bytes(part);
            let dir = self.dir();
            let next = match (open_dir(dir, name), &mut create) {
                (Ok(next), _) => next,
                (Err(e), Some((mode, created))) if e.kind() == io::ErrorKind::NotFound => {
                    created()?;
                    match rfs::mkdirat(dir, name, Mode::from_raw_mode(*mode)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(os(e)),
                    }
                    open_dir(dir, name)?
                }
                (Err(e), _) => return Err(e),
            };
            self.names.push(part.to_vec());
            if self.names.len().is_multiple_of(CURSOR_STRIDE) {
                self.kept.push(next);
                self.end = None;
            } else {
                self.end = Some(next);
            }
        }
        Ok(())
    }
}

/// How many leading components path `held` shares with path `parts`.
pub(crate) fn shared_prefix(held: &[Vec<u8>], parts: &[&[u8]]) -> usize {
    held.iter()
        .zip(parts)
        .take_while(|(held, part)| held.as_slice() == **part)
        .count()
}

/// Writes `name` in `dir` whole or not at all: into a new file (`O_EXCL`, never
/// through a symlink), renamed over `name` once written, which replaces a symlink or
/// file there rather than writing through it. `mode` is given to the new file (less
/// the umask).
pub fn replace_file_at(dir: impl AsFd, name: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = dir.as_fd();
    let temp = format!(
        ".partial-{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let fd = rfs::openat(
        dir,
        temp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .map_err(os)?;
    let written = std::fs::File::from(fd).write_all(bytes);
    let renamed = written.and_then(|()| rfs::renameat(dir, temp.as_str(), dir, name).map_err(os));
    if renamed.is_err() {
        let _ = rfs::unlinkat(dir, temp.as_str(), AtFlags::empty());
    }
    renamed
}

/// Whether `name` in `dir` is a regular file of this user (a symlink is not followed).
pub fn is_own_file_at(dir: impl AsFd, name: &OsStr) -> bool {
    rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|stat| {
        FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile
            && stat.st_uid == rustix::process::geteuid().as_raw()
    })
}

/// The bytes of `name` in `dir` if it is a regular file of this user, opened without
/// following a symlink (a FIFO planted there does not block), of at most `most` bytes.
pub fn read_own_file_at(dir: impl AsFd, name: &OsStr, most: u64) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let fd = rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let stat = rfs::fstat(&fd).ok()?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
        || stat.st_uid != rustix::process::geteuid().as_raw()
    {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(most.saturating_add(1))
        .read_to_end(&mut bytes)
        .ok()?;
    (bytes.len() as u64 <= most).then_some(bytes)
}

/// The type of `name` in `dir`, if it exists (a symlink is reported as one).
pub fn kind_at(dir: impl AsFd, name: &OsStr) -> io::Result<Option<FileType>> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(FileType::from_raw_mode(stat.st_mode))),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(os(e)),
    }
}

/// Removes `name` from `dir`: a file, a symlink (never its target), or a whole
/// directory tree (entered only through directories, never through symlinks).
pub fn remove_at(dir: impl AsFd, name: &OsStr) -> io::Result<()> {
    remove_kind_at(dir, name).map(drop)
}

/// [`remove_at`], saying what was removed, if anything.
pub fn remove_kind_at(dir: impl AsFd, name: &OsStr) -> io::Result<Option<FileType>> {
    let dir = dir.as_fd();
    let kind = kind_at(dir, name)?;
    match kind {
        None => {}
        Some(FileType::Directory) => remove_tree(dir, name)?,
        Some(_) => rfs::unlinkat(dir, name, AtFlags::empty()).map_err(os)?,
    }
    Ok(kind)
}

/// A walk down a directory tree that holds one descriptor, whatever the depth: going
/// down opens a child with `O_NOFOLLOW`, going up opens `..` and checks that it is the
/// very directory that was left (a tree moved under the walk fails it, rather than
/// leading it elsewhere). Deep trees are legitimate (2,000 levels fit in a 4,096-byte
/// path), and one descriptor per level would run into the open-file limit.
pub struct Descent {
    current: OwnedFd,
    /// (device, inode) of each directory above `current`, the top one first.
    above: Vec<(u64, u64)>,
}

fn identity(fd: impl AsFd) -> io::Result<(u64, u64)> {
    let stat = rfs::fstat(fd).map_err(os)?;
    Ok((stat.st_dev, stat.st_ino))
}

impl Descent {
    pub fn new(top: OwnedFd) -> Self {
        Descent {
            current: top,
            above: Vec::new(),
        }
    }

    /// The directory the walk is in.
    pub fn dir(&self) -> BorrowedFd<'_> {
        self.current.as_fd()
    }

    /// How many levels below the top the walk is.
    pub fn depth(&self) -> usize {
        self.above.len()
    }

    /// Goes down into the subdirectory `name`.
    pub fn enter(&mut self, name: &OsStr) -> io::Result<()> {
        let child = open_dir(&self.current, name)?;
        self.above.push(identity(&self.current)?);
        self.current = child;
        Ok(())
    }

    /// Goes back up one level.
    pub fn leave(&mut self) -> io::Result<()> {
        let expected = self
            .above
            .pop()
            .ok_or_else(|| io::Error::other("the walk is at its top"))?;
        let parent = open_dir(&self.current, OsStr::new(".."))?;
        if identity(&parent)? != expected {
            return Err(io::Error::other(
                "a directory was moved while the tree was being walked",
            ));
        }
        self.current = parent;
        Ok(())
    }
}

/// Calls `each(name, inode, kind)` for the entries of directory `dir`, without `.`
/// and `..`; a kind the directory does not give is found by `lstat` (`Unknown` if the
/// entry went meanwhile), so a symlink is never taken for what it points to. Stops
/// at the first error; the listing's own are given to `io_err`.
pub fn for_each_entry<E>(
    dir: impl AsFd,
    io_err: impl Fn(io::Error) -> E,
    mut each: impl FnMut(&[u8], u64, FileType) -> Result<(), E>,
) -> Result<(), E> {
    let dir = dir.as_fd();
    let mut listing = rfs::Dir::read_from(dir).map_err(|e| io_err(os(e)))?;
    while let Some(entry) = listing.read() {
        let entry = entry.map_err(|e| io_err(os(e)))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => kind_at(dir, OsStr::from_bytes(name))
                .map_err(&io_err)?
                .unwrap_or(FileType::Unknown),
            kind => kind,
        };
        each(name, entry.ino(), kind)?;
    }
    Ok(())
}

/// The names in directory `dir` (without `.` and `..`), each with whether it is a
/// directory (never true for a symlink).
pub fn list(dir: impl AsFd) -> io::Result<Vec<(Vec<u8>, bool)>> {
    let mut names = Vec::new();
    for_each_entry(
        dir,
        |e| e,
        |name, _, kind| {
            names.push((name.to_vec(), kind == FileType::Directory));
            Ok(())
        },
    )?;
    Ok(names)
}

/// Removes the directory `name` of `dir` and everything in it, depth first, holding
/// one descriptor at a time (see [`Descent`]).
fn remove_tree(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let_owner_in(dir, name)?;
    let mut walk = Descent::new(open_dir(dir, name)?);
    // The name of each directory entered, to remove it once it is empty.
    let mut names: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut subdir = None;
        for (child, is_dir) in list(walk.dir())? {
            if is_dir {
                subdir = Some(child);
                break;
            }
            match rfs::unlinkat(walk.dir(), OsStr::from_bytes(&child), AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(os(e)),
            }
        }
        if let Some(child) = subdir {
            let_owner_in(walk.dir(), OsStr::from_bytes(&child))?;
            walk.enter(OsStr::from_bytes(&child))?;
            names.push(child);
            continue;
        }
        let Some(done) = names.pop() else { break };
        walk.leave()?;
        match rfs::unlinkat(walk.dir(), OsStr::from_bytes(&done), AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(os(e)),
        }
    }
    drop(walk);
    match rfs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(os(e)),
    }
}

/// Gives directory `name` in `dir` to its owner (`u+rwx`) when its mode does not, so
/// that it can be listed and emptied: a tree being removed may hold read-only
/// directories (a checkpoint's, in a failed fork), which a daemon that is not root
/// could not remove otherwise. Anything else is left as it is.
fn let_owner_in(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let stat = rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(os)?;
    let is_dir = FileType::from_raw_mode(stat.st_mode) == FileType::Directory;
    if is_dir && stat.st_mode & 0o700 != 0o700 {
        chmod_at(dir, name, (stat.st_mode & 0o7777) | 0o700)?;
    }
    Ok(())
}

/// `chmod` of `name` in `dir` itself, never of what it points to: a symlink's mode
/// cannot be changed on Linux (`EOPNOTSUPP`). Uses `fchmodat2` with
/// `AT_SYMLINK_NOFOLLOW` (Linux 6.6), or else changes the inode opened with
/// `O_PATH | O_NOFOLLOW` through its `/proc/self/fd` link, as glibc does.
pub fn chmod_at(dir: impl AsFd, name: &OsStr, mode: u32) -> io::Result<()> {
    let dir = dir.as_fd();
    let c_name = std::ffi::CString::new(name.as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: dir is a valid descriptor and c_name a NUL-terminated string, both alive
    // for the call; fchmodat2 only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fchmodat2,
            dir.as_raw_fd(),
            c_name.as_ptr(),
            mode as libc::mode_t,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() != Some(libc::ENOSYS) {
        return Err(error);
    }
    let fd = rfs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(os)?;
    chmod_opened(&fd, mode)
}

/// `chmod` of the inode behind `fd`, which may be an `O_PATH` descriptor; refuses a
/// symlink with `EOPNOTSUPP`.
pub fn chmod_opened(fd: impl AsFd, mode: u32) -> io::Result<()> {
    let fd = fd.as_fd();
    if FileType::from_raw_mode(rfs::fstat(fd).map_err(os)?.st_mode) == FileType::Symlink {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    // The /proc link names the opened inode itself, whatever its path is now.
    rfs::chmod(
        format!("/proc/self/fd/{}", fd.as_raw_fd()),
        Mode::from_raw_mode(mode),
    )
    .map_err(os)
}

/// Links the very file open as `file` at `dest`, through its `/proc/self/fd` link
/// (never by a path, which could have been swapped), and checks that `dest` is now that
/// regular file: a `/proc` that is not this process's own could name another. False,
/// with nothing left at `dest`, where it cannot be linked (another filesystem, no
/// `/proc`, a file deleted since) or `dest` is not that inode.
pub fn link_opened(file: &std::fs::File, dest: &std::path::Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let linked = rfs::linkat(
        rfs::CWD,
        format!("/proc/self/fd/{}", file.as_raw_fd()),
        rfs::CWD,
        dest,
        AtFlags::SYMLINK_FOLLOW,
    );
    if linked.is_err() {
        return Ok(false);
    }
    let same = (|| {
        let (want, got) = (file.metadata()?, std::fs::symlink_metadata(dest)?);
        io::Result::Ok(got.is_file() && (got.dev(), got.ino()) == (want.dev(), want.ino()))
    })();
    if !matches!(same, Ok(true)) {
        let _ = std::fs::remove_file(dest);
    }
    same
}

#[cfg(test)]
mod tests;

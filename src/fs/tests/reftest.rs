//! A reference model of `staging/` (in the style of mountpoint-s3's reftests): random
//! sequences of `mkdir`, `create`/`write`, `truncate`, `rename`, `unlink`, `rmdir`,
//! `link`, `symlink`, `chmod` and seals are applied to the real tree, through the core
//! as the adapter calls it, and to a small in-memory model. After every operation the
//! outcome (success, or the errno) and the whole workspace must agree; after a seal,
//! the sealed checkpoint must hold exactly what the model held.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

const CALLER: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 0,
};
const NAMES: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone)]
enum Op {
    Mkdir(Vec<usize>),
    Write(Vec<usize>, u8, Vec<u8>),
    Truncate(Vec<usize>, u8),
    Rename(Vec<usize>, Vec<usize>),
    Unlink(Vec<usize>),
    Rmdir(Vec<usize>),
    Link(Vec<usize>, Vec<usize>),
    Symlink(Vec<usize>, u8),
    Chmod(Vec<usize>, u16),
    Seal,
}

fn path() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0..NAMES.len(), 1..=2)
}

fn op(seals: bool) -> impl Strategy<Value = Op> {
    let weight = if seals { 1 } else { 0 };
    prop_oneof![
        3 => path().prop_map(Op::Mkdir),
        4 => (path(), 0..8u8, prop::collection::vec(any::<u8>(), 0..6))
            .prop_map(|(p, o, d)| Op::Write(p, o, d)),
        1 => (path(), 0..10u8).prop_map(|(p, s)| Op::Truncate(p, s)),
        3 => (path(), path()).prop_map(|(a, b)| Op::Rename(a, b)),
        2 => path().prop_map(Op::Unlink),
        1 => path().prop_map(Op::Rmdir),
        2 => (path(), path()).prop_map(|(a, b)| Op::Link(a, b)),
        1 => (path(), 0..3u8).prop_map(|(p, t)| Op::Symlink(p, t)),
        1 => (path(), prop::sample::select(vec![0o600u16, 0o644, 0o755, 0o700, 0o640]))
            .prop_map(|(p, m)| Op::Chmod(p, m)),
        weight => Just(Op::Seal),
    ]
}

/// One entry of the model: files are inodes, so hard links share contents.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir {
        mode: u16,
        children: BTreeMap<String, Node>,
    },
    File {
        inode: usize,
    },
    /// Symlinks have an identity too: a hard link to one is the same inode.
    Link {
        target: String,
        id: usize,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct File {
    mode: u16,
    data: Vec<u8>,
}

#[derive(Default)]
struct Model {
    root: BTreeMap<String, Node>,
    files: Vec<File>,
    /// Symlinks made so far (their identities).
    links: usize,
}

fn names_of(path: &[usize]) -> Vec<String> {
    path.iter().map(|&i| NAMES[i].to_owned()).collect()
}

type Errno = i32;

impl Model {
    /// The directory at `path`, as a lookup would reach it.
    fn dir_mut(&mut self, path: &[String]) -> Result<&mut BTreeMap<String, Node>, Errno> {
        let mut dir = &mut self.root;
        for name in path {
            dir = match dir.get_mut(name) {
                Some(Node::Dir { children, .. }) => children,
                Some(_) => return Err(libc::ENOTDIR),
                None => return Err(libc::ENOENT),
            };
        }
        Ok(dir)
    }

    fn get(&mut self, path: &[String]) -> Result<Node, Errno> {
        let (name, parent) = path.split_last().expect("non-empty path");
        self.dir_mut(parent)?.get(name).cloned().ok_or(libc::ENOENT)
    }

    fn apply(&mut self, op: &Op) -> Result<(), Errno> {
        match op {
            Op::Mkdir(p) => {
                let p = names_of(p);
                let (name, parent) = p.split_last().unwrap();
                let dir = self.dir_mut(parent)?;
                if dir.contains_key(name) {
                    return Err(libc::EEXIST);
                }
                dir.insert(
                    name.clone(),
                    Node::Dir {
                        mode: 0o755,
                        children: BTreeMap::new(),
                    },
                );
                Ok(())
            }
            Op::Write(p, offset, data) => {
                let p = names_of(p);
                let inode = match self.get(&p) {
                    Err(libc::ENOENT) => {
                        let (name, parent) = p.split_last().unwrap();
                        self.dir_mut(parent)?;
                        self.files.push(File {
                            mode: 0o644,
                            data: Vec::new(),
                        });
                        let inode = self.files.len() - 1;
                        self.dir_mut(parent)?
                            .insert(name.clone(), Node::File { inode });
                        inode
                    }
                    Err(e) => return Err(e),
                    Ok(Node::File { inode }) => inode,
                    Ok(Node::Dir { .. }) => return Err(libc::EISDIR),
                    Ok(Node::Link { .. }) => return Err(libc::ELOOP),
                };
                // A write of nothing does not extend the file.
                if data.is_empty() {
                    return Ok(());
                }
                let file = &mut self.files[inode].data;
                let end = *offset as usize + data.len();
                if file.len() < end {
                    file.resize(end, 0);
                }
                file[*offset as usize..end].copy_from_slice(data);
                Ok(())
            }
            Op::Truncate(p, size) => match self.get(&names_of(p))? {
                Node::File { inode } => {
                    self.files[inode].data.resize(*size as usize, 0);
                    Ok(())
                }
                Node::Dir { .. } => Err(libc::EISDIR),
                Node::Link { .. } => Err(libc::ELOOP),
            },
            Op::Unlink(p) => {
                let p = names_of(p);
                match self.get(&p)? {
                    Node::Dir { .. } => Err(libc::EISDIR),
                    _ => {
                        let (name, parent) = p.split_last().unwrap();
                        self.dir_mut(parent)?.remove(name);
                        Ok(())
                    }
                }
            }
            Op::Rmdir(p) => {
                let p = names_of(p);
                match self.get(&p)? {
                    Node::Dir { children, .. } if children.is_empty() => {
                        let (name, parent) = p.split_last().unwrap();
                        self.dir_mut(parent)?.remove(name);
                        Ok(())
                    }
                    Node::Dir { .. } => Err(libc::ENOTEMPTY),
                    _ => Err(libc::ENOTDIR),
                }
            }
            Op::Rename(a, b) => {
                let (a, b) = (names_of(a), names_of(b));
                let (b_name, b_parent) = b.split_last().unwrap();
                // Both parents are resolved before the entry is looked up, as rename(2)
                // does.
                self.dir_mut(&a[..a.len() - 1])?;
                self.dir_mut(b_parent)?;
                let moved = self.get(&a)?;
                let target = self.dir_mut(b_parent)?.get(b_name).cloned();
                if a == b {
                    return Ok(());
                }
                if matches!(moved, Node::Dir { .. }) && b.starts_with(&a) {
                    return Err(libc::EINVAL);
                }
                // The target is an ancestor of the source: a directory, not empty.
                if a.starts_with(&b) {
                    return Err(libc::ENOTEMPTY);
                }
                match (&moved, &target) {
                    // Two names of one file: rename does nothing.
                    (Node::File { inode: x }, Some(Node::File { inode: y })) if x == y => {
                        return Ok(());
                    }
                    (Node::Link { id: x, .. }, Some(Node::Link { id: y, .. })) if x == y => {
                        return Ok(());
                    }
                    (Node::Dir { .. }, Some(Node::Dir { children, .. }))
                        if !children.is_empty() =>
                    {
                        return Err(libc::ENOTEMPTY);
                    }
                    (Node::Dir { .. }, Some(Node::File { .. } | Node::Link { .. })) => {
                        return Err(libc::ENOTDIR);
                    }
                    (Node::File { .. } | Node::Link { .. }, Some(Node::Dir { .. })) => {
                        return Err(libc::EISDIR);
                    }
                    _ => {}
                }
                let (a_name, a_parent) = a.split_last().unwrap();
                self.dir_mut(a_parent)?.remove(a_name);
                self.dir_mut(b_parent)?.insert(b_name.clone(), moved);
                Ok(())
            }
            Op::Link(a, b) => {
                // As link(2) checks: the old name, then the new one, then the kind.
                let (a, b) = (names_of(a), names_of(b));
                let node = self.get(&a)?;
                let (name, parent) = b.split_last().unwrap();
                let dir = self.dir_mut(parent)?;
                if dir.contains_key(name) {
                    return Err(libc::EEXIST);
                }
                if matches!(node, Node::Dir { .. }) {
                    return Err(libc::EPERM);
                }
                dir.insert(name.clone(), node);
                Ok(())
            }
            Op::Symlink(p, t) => {
                let p = names_of(p);
                let (name, parent) = p.split_last().unwrap();
                self.links += 1;
                let id = self.links;
                let dir = self.dir_mut(parent)?;
                if dir.contains_key(name) {
                    return Err(libc::EEXIST);
                }
                let target = link_target(*t);
                dir.insert(name.clone(), Node::Link { target, id });
                Ok(())
            }
            Op::Chmod(p, mode) => {
                let p = names_of(p);
                match self.get(&p)? {
                    Node::File { inode } => self.files[inode].mode = *mode,
                    Node::Dir { .. } => {
                        let (name, parent) = p.split_last().unwrap();
                        if let Some(Node::Dir { mode: m, .. }) = self.dir_mut(parent)?.get_mut(name)
                        {
                            *m = *mode;
                        }
                    }
                    Node::Link { .. } => return Err(libc::EOPNOTSUPP),
                }
                Ok(())
            }
            Op::Seal => Ok(()),
        }
    }

    /// What a walk of the tree shows: path, kind, mode, contents or target, and which
    /// paths are the same file.
    fn render(&self) -> Vec<String> {
        let mut out = Vec::new();
        render_model(&self.root, "", &self.files, &mut out);
        out
    }
}

fn link_target(t: u8) -> String {
    ["a", "../b", "/etc/passwd"][t as usize % 3].to_owned()
}

fn render_model(dir: &BTreeMap<String, Node>, prefix: &str, files: &[File], out: &mut Vec<String>) {
    for (name, node) in dir {
        let path = format!("{prefix}{name}");
        match node {
            Node::Dir { mode, children } => {
                out.push(format!("{path}/ {mode:o}"));
                render_model(children, &format!("{path}/"), files, out);
            }
            Node::File { inode } => {
                let f = &files[*inode];
                out.push(format!("{path} {:o} {:?} #{inode}", f.mode, f.data));
            }
            Node::Link { target, .. } => out.push(format!("{path} -> {target}")),
        }
    }
}

/// Walks a real directory `ino` (of staging or of a checkpoint) the same way; file
/// identities are numbered in order of first appearance, in both.
fn render_real(fs: &CheckpointFs, ino: u64) -> Vec<String> {
    fn walk(fs: &CheckpointFs, ino: u64, prefix: &str, ids: &mut Vec<u64>, out: &mut Vec<String>) {
        let mut entries = Vec::new();
        fs.readdir(ino, 0, &mut |e, _| {
            if e.name != b"." && e.name != b".." {
                entries.push(String::from_utf8(e.name.clone()).unwrap());
            }
            false
        })
        .unwrap();
        entries.sort();
        for name in entries {
            let attr = fs.lookup(ino, name.as_bytes()).unwrap().attr;
            let path = format!("{prefix}{name}");
            match attr.kind {
                FileKind::Directory => {
                    out.push(format!("{path}/ {:o}", attr.perm));
                    walk(fs, attr.ino, &format!("{path}/"), ids, out);
                }
                FileKind::Symlink => {
                    let target = String::from_utf8(fs.readlink(attr.ino).unwrap()).unwrap();
                    out.push(format!("{path} -> {target}"));
                }
                _ => {
                    let id = ids.iter().position(|&i| i == attr.ino).unwrap_or_else(|| {
                        ids.push(attr.ino);
                        ids.len() - 1
                    });
                    let data = read_all(fs, attr.ino);
                    out.push(format!("{path} {:o} {data:?} #{id}", attr.perm));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(fs, ino, "", &mut Vec::new(), &mut out);
    out
}

/// Renumbers file identities in order of first appearance, as `render_real` does.
fn normalise(lines: Vec<String>) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    lines
        .into_iter()
        .map(|line| match line.rsplit_once(" #") {
            Some((head, id)) => {
                let n = seen.iter().position(|s| s == id).unwrap_or_else(|| {
                    seen.push(id.to_owned());
                    seen.len() - 1
                });
                format!("{head} #{n}")
            }
            None => line,
        })
        .collect()
}

struct Real<'a> {
    fs: &'a Arc<CheckpointFs>,
    ws: u64,
    seals: usize,
}

impl Real<'_> {
    fn resolve(&self, path: &[String]) -> Result<u64, Errno> {
        let mut ino = self.ws;
        for name in path {
            ino = self
                .fs
                .lookup(ino, name.as_bytes())
                .map_err(|e| e.errno())?
                .attr
                .ino;
        }
        Ok(ino)
    }

    /// The directory that holds `path`, walked as the kernel walks a path: every
    /// component of the parent must be a directory.
    fn parent(&self, path: &[usize]) -> Result<(u64, String), Errno> {
        let names = names_of(path);
        let (name, parent) = names.split_last().unwrap();
        let dir = self.resolve(parent)?;
        if self.fs.getattr(dir).map_err(|e| e.errno())?.attr.kind != FileKind::Directory {
            return Err(libc::ENOTDIR);
        }
        Ok((dir, name.clone()))
    }

    fn apply(&mut self, op: &Op) -> Result<(), Errno> {
        let fs = self.fs;
        let errno = |e: FsError| e.errno();
        match op {
            Op::Mkdir(p) => {
                let (dir, name) = self.parent(p)?;
                fs.mkdir(dir, name.as_bytes(), 0o755, CALLER)
                    .map(drop)
                    .map_err(errno)
            }
            Op::Write(p, offset, data) => {
                let (dir, name) = self.parent(p)?;
                // Writes come by inode: the kernel opens files by itself.
                let ino = match fs.lookup(dir, name.as_bytes()) {
                    Ok(entry) => entry.attr.ino,
                    Err(e) if e.errno() == libc::ENOENT => {
                        let (entry, opened) = fs
                            .create(dir, name.as_bytes(), 0o644, libc::O_WRONLY, CALLER)
                            .map_err(errno)?;
                        fs.release(opened.fh);
                        entry.attr.ino
                    }
                    Err(e) => return Err(e.errno()),
                };
                fs.write(ino, *offset as u64, data).map(drop).map_err(errno)
            }
            Op::Truncate(p, size) => {
                let ino = self.resolve(&names_of(p))?;
                let set = SetAttr {
                    size: Some(*size as u64),
                    ..SetAttr::default()
                };
                fs.setattr(ino, set).map(drop).map_err(errno)
            }
            Op::Unlink(p) => {
                let (dir, name) = self.parent(p)?;
                fs.unlink(dir, name.as_bytes()).map_err(errno)
            }
            Op::Rmdir(p) => {
                let (dir, name) = self.parent(p)?;
                fs.rmdir(dir, name.as_bytes()).map_err(errno)
            }
            Op::Rename(a, b) => {
                let (from, from_name) = self.parent(a)?;
                let (to, to_name) = self.parent(b)?;
                let (tx, rx) = mpsc::channel();
                fs.rename(
                    (from, from_name.as_bytes()),
                    (to, to_name.as_bytes()),
                    0,
                    Box::new(move |r| tx.send(r).unwrap()),
                );
                rx.recv().unwrap().map_err(errno)
            }
            Op::Link(a, b) => {
                let ino = self.resolve(&names_of(a))?;
                let (dir, name) = self.parent(b)?;
                fs.link(ino, dir, name.as_bytes()).map(drop).map_err(errno)
            }
            Op::Symlink(p, t) => {
                let (dir, name) = self.parent(p)?;
                let target = link_target(*t);
                fs.symlink(dir, name.as_bytes(), target.as_bytes(), CALLER)
                    .map(drop)
                    .map_err(errno)
            }
            Op::Chmod(p, mode) => {
                let ino = self.resolve(&names_of(p))?;
                let set = SetAttr {
                    mode: Some(*mode as u32),
                    ..SetAttr::default()
                };
                fs.setattr(ino, set).map(drop).map_err(errno)
            }
            Op::Seal => unreachable!("seals are checked by the runner"),
        }
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let (f, _) = fixture(&[]);
    let mut model = Model::default();
    let mut real = Real {
        fs: &f.fs,
        ws: f
            .fs
            .mkdir(inode::STAGING, b"ws", 0o755, CALLER)
            .unwrap()
            .attr
            .ino,
        seals: 0,
    };
    for (step, op) in ops.iter().enumerate() {
        if let Op::Seal = op {
            real.seals += 1;
            let name = format!("turn-{}", real.seals);
            let (tx, rx) = mpsc::channel();
            f.fs.rename(
                (inode::STAGING, b"ws"),
                (inode::COMMIT, name.as_bytes()),
                0,
                Box::new(move |r| tx.send(r).unwrap()),
            );
            prop_assert!(rx.recv().unwrap().is_ok(), "step {step}: seal failed");
            let link =
                f.fs.lookup(inode::COMMIT, name.as_bytes())
                    .unwrap()
                    .attr
                    .ino;
            let target = f.fs.readlink(link).unwrap();
            let dir = f.fs.lookup(inode::ROOT, &target[3..]).unwrap().attr.ino;
            wait_loaded(&f.fs, dir);
            // A checkpoint's own directory has its own mode; compare what is in it.
            prop_assert_eq!(
                render_real(&f.fs, dir),
                normalise(model.render()),
                "step {}: the sealed checkpoint differs from the model",
                step
            );
            model = Model::default();
            real.ws =
                f.fs.mkdir(inode::STAGING, b"ws", 0o755, CALLER)
                    .unwrap()
                    .attr
                    .ino;
            continue;
        }
        let expected = model.apply(op);
        let got = real.apply(op);
        prop_assert_eq!(got, expected, "step {}: {:?}", step, op);
        prop_assert_eq!(
            render_real(&f.fs, real.ws),
            normalise(model.render()),
            "step {}: after {:?}",
            step,
            op
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn staging_matches_the_model(ops in prop::collection::vec(op(false), 1..40)) {
        run(&ops)?;
    }

    #[test]
    fn seals_capture_exactly_the_model(ops in prop::collection::vec(op(true), 1..30)) {
        run(&ops)?;
    }
}

use super::*;

/// Builds an index from `(path, kind)` pairs: `"d"` a directory, `"l:TARGET"` a
/// symlink, anything else a file with those contents (checksum = xxh3).
pub fn index_of(entries: &[(&str, &str)]) -> Index {
    let mut nodes = crate::review::diff::empty_index().nodes;
    for (path, what) in entries {
        let parts: Vec<&str> = path.split('/').collect();
        let (name, parents) = parts.split_last().unwrap();
        let mut dir = ROOT;
        for part in parents {
            dir = nodes_lookup(&nodes, dir, part.as_bytes()).expect("parent listed first");
        }
        let kind = if *what == "d" {
            NodeKind::Dir {
                children: Vec::new(),
            }
        } else if let Some(target) = what.strip_prefix("l:") {
            NodeKind::Symlink {
                target: target.as_bytes().to_vec(),
            }
        } else {
            NodeKind::File {
                size: what.len() as u64,
                location: FileLocation::Packed { offset: 0 },
                checksum: xxhash_rust::xxh3::xxh3_64(what.as_bytes()),
            }
        };
        let mode = if *what == "d" { 0o755 } else { 0o644 };
        nodes.push(Node {
            mode,
            uid: 1000,
            gid: 1000,
            mtime: 0,
            nlink: 1,
            kind,
        });
        let new = (nodes.len() - 1) as u32;
        let NodeKind::Dir { children } = &mut nodes[dir as usize].kind else {
            panic!("{path}: parent is not a directory")
        };
        children.push((name.as_bytes().to_vec(), new));
        children.sort();
    }
    Index {
        nodes,
        unpacked_bytes: 0,
    }
}

fn nodes_lookup(nodes: &[Node], dir: u32, name: &[u8]) -> Option<u32> {
    match &nodes[dir as usize].kind {
        NodeKind::Dir { children } => children
            .iter()
            .find(|(n, _)| n.as_slice() == name)
            .map(|(_, i)| *i),
        _ => None,
    }
}

pub fn paths(index: &Index) -> Vec<String> {
    let mut out = Vec::new();
    walk::<()>(index, |path, _, _| {
        out.push(String::from_utf8(path.to_vec()).unwrap());
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn walk_gives_byte_order_of_whole_paths() {
    let index = index_of(&[
        ("a", "d"),
        ("a/x", "1"),
        ("a/y", "d"),
        ("a/y/z", "2"),
        ("a-b", "3"),
        ("a.c", "d"),
        ("a.c/q", "4"),
        ("B", "l:a"),
        ("a0", "5"),
    ]);
    let got = paths(&index);
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(got, sorted);
    assert_eq!(
        got,
        ["B", "a", "a-b", "a.c", "a.c/q", "a/x", "a/y", "a/y/z", "a0"]
    );
}

#[test]
fn summary_counts_entries_and_files() {
    let index = index_of(&[("a", "d"), ("a/x", "1"), ("l", "l:a"), ("f", "22")]);
    let summary = summarize(&index);
    assert_eq!((summary.entries, summary.files), (4, 2));
}

#[test]
fn lookup_does_not_follow_links() {
    let index = index_of(&[("a", "d"), ("a/x", "1"), ("link", "l:a"), ("f", "2")]);
    assert_eq!(lookup(&index, b"a/x"), Ok(2));
    assert_eq!(lookup(&index, b"/a//./x"), Ok(2));
    assert_eq!(lookup(&index, b""), Ok(ROOT));
    assert_eq!(
        lookup(&index, b"a/nope").unwrap_err().to_string(),
        "a/nope: no such file or directory"
    );
    assert_eq!(
        lookup(&index, b"link/x").unwrap_err().to_string(),
        "link/x: link is a symbolic link to a (links are not followed)"
    );
    assert_eq!(
        lookup(&index, b"f/x").unwrap_err().to_string(),
        "f/x: f is not a directory"
    );
    assert_eq!(
        lookup(&index, b"a/../f").unwrap_err().to_string(),
        "a/../f: `..` is not allowed in a path"
    );
}

/// A real cache entry of a tar holding `small` (packed), `big` (a file of its own),
/// `dir/` and `link -> small`.
fn cached_checkpoint() -> (
    tempfile::TempDir,
    std::sync::Arc<VerifiedCheckpoint>,
    Vec<u8>,
) {
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, data: &[u8], link: Option<&str>| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        if let Some(link) = link {
            header.set_link_name(link).unwrap();
        }
        tar.append_data(&mut header, path, data).unwrap();
    };
    add("small", tar::EntryType::Regular, b"small file\n", None);
    add("big", tar::EntryType::Regular, &big, None);
    add("dir", tar::EntryType::Directory, b"", None);
    add("link", tar::EntryType::Symlink, b"", Some("small"));
    let tar = tar.into_inner().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let cache =
        crate::cache::Cache::open(&crate::cache::CacheDir::open(dir.path()).unwrap(), u64::MAX)
            .unwrap();
    let id = crate::checkpoint::CheckpointId::parse(&"a".repeat(64)).unwrap();
    let mut pending = cache.begin().unwrap();
    let index =
        crate::archive::index::build(&tar[..], &mut pending, crate::archive::Limits::DEFAULT, 0)
            .unwrap();
    let provenance = crate::cache::Provenance::Store {
        verified_at: std::time::SystemTime::now(),
    };
    let checkpoint = cache.finish(pending, &id, index, provenance).unwrap();
    (dir, checkpoint, big)
}

fn read(checkpoint: &VerifiedCheckpoint, path: &[u8]) -> io::Result<Vec<u8>> {
    let mut data = Vec::new();
    open_file(checkpoint, path)
        .map_err(|e| io::Error::other(e.to_string()))?
        .read_to_end(&mut data)?;
    Ok(data)
}

#[test]
fn files_read_back_verified_from_the_cache() {
    let (dir, checkpoint, big) = cached_checkpoint();
    assert_eq!(read(&checkpoint, b"small").unwrap(), b"small file\n");
    assert_eq!(read(&checkpoint, b"/big").unwrap(), big);
    let node = lookup(&checkpoint.index, b"big").unwrap();
    let reader = FileReader::new(&checkpoint, node).unwrap();
    assert_eq!(reader.size(), big.len() as u64);
    assert_eq!(reader.read_all(1000).unwrap(), None, "over the bound");
    for (path, error) in [
        (&b"dir"[..], "dir is a directory"),
        (b"link", "link is a symbolic link to small"),
        (b"", "/ is a directory"),
    ] {
        let Err(e) = open_file(&checkpoint, path) else {
            panic!("{path:?} opened")
        };
        assert_eq!(e.to_string(), error);
    }

    // Changed behind our back after the load: a read error, not other data.
    let entry = dir.path().join("checkpoints").join("a".repeat(64));
    let pack = entry.join("pack");
    let mut packed = std::fs::read(&pack).unwrap();
    packed[0] ^= 1;
    std::fs::write(&pack, &packed).unwrap();
    let e = read(&checkpoint, b"small").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    let own = entry.join("files").join(node.to_string());
    let mut file = std::fs::OpenOptions::new().append(true).open(&own).unwrap();
    std::io::Write::write_all(&mut file, b"more").unwrap();
    let e = read(&checkpoint, b"big").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
}

#[test]
fn patterns_match_names_or_whole_paths() {
    let matches =
        |pattern: &str, path: &str| PathFilter::new(pattern).unwrap().matches(path.as_bytes());
    assert!(matches("*.rs", "lib.rs"));
    assert!(matches("*.rs", "src/deep/lib.rs"));
    assert!(!matches("*.rs", "src/lib.rs/x"));
    assert!(matches("src/*.rs", "src/lib.rs"));
    assert!(matches("/src/*.rs", "src/lib.rs"));
    assert!(!matches("src/*.rs", "src/a/lib.rs"));
    assert!(!matches("src/*.rs", "x/src/lib.rs"));
    assert!(matches("src/**/*.rs", "src/a/b/lib.rs"));
    assert!(matches("src/**", "src/a/b/lib.rs"));
    assert!(matches("**/lib.rs", "lib.rs"));
    assert!(matches("*.{py,sh}", "run.sh"));
    assert!(matches(".*", ".hidden"));
    assert!(matches("*", ".hidden"));
    assert!(matches("\\*", "*"));
    assert!(!matches("\\*", "x"));
    // Matching is on bytes: `?` is one byte, not one UTF-8 character.
    assert!(matches("caf??.txt", "caf\u{e9}.txt"));
    assert!(!matches("caf?.txt", "caf\u{e9}.txt"));
    assert!(matches("caf*.txt", "caf\u{e9}.txt"));
    let filter = PathFilter::new("caf*").unwrap();
    assert!(filter.matches(b"dir/caf\xe9.txt"), "non-UTF-8 names match");
    assert!(PathFilter::new("[").is_err());
}

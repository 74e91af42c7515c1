use super::*;

fn span(n: u8, length: u64) -> MemberSpan {
    MemberSpan {
        digest: [n; 32],
        length,
    }
}

fn object(n: u8) -> String {
    format!("{}.tar.gz", hex::encode([n; 32]))
}

/// Priming keeps our own compression of the data, once; a capture then reuses
/// it, and only the capture counts in the stats.
#[test]
fn primed_members_are_reused_by_the_next_capture() {
    let (_dir, cache) = cache();
    let data = noise(64 << 10, 1);
    let compress = crate::archive::gz::compress_member;
    assert_eq!(cache.prime(&data, compress).unwrap(), Primed::Compressed);
    assert_eq!(cache.prime(&data, compress).unwrap(), Primed::Present);
    assert_eq!(cache.stats.counts(), (0, 0, 0));
    let (member, _) = cache
        .get_or_compress(&data, |_| panic!("compressed again"))
        .unwrap();
    assert_eq!(member, compress(&data).unwrap());
    assert_eq!(cache.stats.counts(), (1, 0, data.len() as u64));
    // Priming compressed it here: the capture did not inflate it.
    assert_eq!(cache.stats.inflated.load(Ordering::Relaxed), 0);
}

/// A member this process compressed, or inflated once to check it, is not
/// inflated again; what vouches for it is in memory, so another process inflates
/// it, and damage on disk is found all the same.
#[test]
fn members_checked_once_are_not_inflated_again_and_damage_is_still_found() {
    let (dir, cache) = cache();
    let compress = crate::archive::gz::compress_member;
    let inflated = |cache: &MemberCache| cache.stats.inflated.load(Ordering::Relaxed);
    let damaged = |cache: &MemberCache| cache.stats.damaged.load(Ordering::Relaxed);
    let (data, other) = (noise(64 << 10, 2), noise(64 << 10, 3));
    let (member, digest) = cache.get_or_compress(&data, compress).unwrap();
    assert_eq!(digest, <[u8; 32]>::from(Sha256::digest(&member)));
    let never = |_: &[u8]| -> io::Result<Vec<u8>> { panic!("compressed again") };
    assert_eq!(
        cache.get_or_compress(&data, never).unwrap(),
        (member.clone(), digest)
    );
    assert_eq!(inflated(&cache), 0);

    let second = MemberCache::open(&dir.path().join("members"), 1 << 30).unwrap();
    for _ in 0..2 {
        assert_eq!(second.get_or_compress(&data, never).unwrap().0, member);
    }
    assert_eq!(inflated(&second), 1, "checked once, then known");
    // Priming checks a member already there; the capture after it does not.
    let third = MemberCache::open(&dir.path().join("members"), 1 << 30).unwrap();
    assert_eq!(third.prime(&data, never).unwrap(), Primed::Present);
    assert_eq!(third.get_or_compress(&data, never).unwrap().0, member);
    assert_eq!(inflated(&third), 1, "inflated by priming only");

    // Under the name of the known member: one byte changed, then a valid member
    // of other data. Each is inflated, refused and replaced.
    let file = std::fs::read_dir(dir.path().join("members"))
        .unwrap()
        .map(|e| e.unwrap().path().join(hex::encode(Sha256::digest(&data))))
        .find(|p| p.exists())
        .unwrap();
    let mut flipped = member.clone();
    flipped[member.len() / 2] ^= 1;
    let planted = compress(&other).unwrap();
    for (k, bad) in [flipped, planted].into_iter().enumerate() {
        std::fs::write(&file, bad).unwrap();
        assert_eq!(cache.get_or_compress(&data, compress).unwrap().0, member);
        assert_eq!(
            (inflated(&cache), damaged(&cache)),
            (k as u64 + 1, k as u64 + 1)
        );
    }
    assert_eq!(std::fs::read(&file).unwrap(), member, "repaired");
}

/// Bytes that do not compress (so their members are kept: [`MIN_KEPT`]).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

fn cache() -> (tempfile::TempDir, MemberCache) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let cache = MemberCache::open(&dir.path().join("members"), 1 << 30).unwrap();
    (dir, cache)
}

#[test]
fn reuse_finds_runs_and_keeps_to_one_source_while_it_continues() {
    let (_dir, cache) = cache();
    // Recorded first (older): object 1 = a b c d; then object 2 = e b c.
    cache
        .record_layout(
            &object(1),
            &[span(1, 10), span(2, 20), span(3, 30), span(4, 40)],
        )
        .unwrap();
    cache
        .record_layout(&object(2), &[span(5, 50), span(2, 20), span(3, 30)])
        .unwrap();
    // New archive: a b c x d.
    let runs = cache.reuse(&[
        span(1, 10),
        span(2, 20),
        span(3, 30),
        span(9, 5),
        span(4, 40),
    ]);
    let got: Vec<_> = runs
        .iter()
        .map(|r| (r.offset, r.length, r.source.clone(), r.source_offset))
        .collect();
    assert_eq!(
        got,
        vec![(0, 60, object(1), 0), (65, 40, object(1), 60)],
        "b and c continue a's run in object 1, although object 2 is newer"
    );
    // b c alone: the newest object that has them.
    let runs = cache.reuse(&[span(2, 20), span(3, 30)]);
    assert_eq!(
        (runs.len(), runs[0].source.as_str()),
        (1, object(2).as_str())
    );
}

#[test]
fn bad_layouts_are_skipped_and_old_ones_forgotten() {
    let (dir, cache) = cache();
    cache.record_layout(&object(1), &[span(1, 10)]).unwrap();
    let layouts = std::fs::read_dir(dir.path().join("members"))
        .unwrap()
        .map(|e| e.unwrap().path().join("layouts"))
        .find(|p| p.is_dir())
        .unwrap();
    // Truncated, and a symlink under an object's name: neither is read.
    std::fs::write(layouts.join(object(2)), b"ckptfs layout v1\n12345").unwrap();
    std::os::unix::fs::symlink(layouts.join(object(1)), layouts.join(object(3))).unwrap();
    let runs = cache.reuse(&[span(1, 10)]);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].source, object(1));
    for n in 10..10 + LAYOUTS_KEPT as u8 + 3 {
        cache.record_layout(&object(n), &[span(n, 1)]).unwrap();
    }
    assert!(std::fs::read_dir(&layouts).unwrap().count() <= LAYOUTS_KEPT);
}

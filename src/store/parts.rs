//! How a multipart upload is cut into parts when some ranges of the new object can be
//! copied from objects the store already holds (`UploadPartCopy`).
//!
//! S3's rules decide the shape: every part but the last holds at least
//! [`MIN_PART_SIZE`], a copied part at most [`MAX_PART_SIZE`], and there are at most
//! [`MAX_PARTS`]. A copy run shorter than the minimum cannot be a part of its own, and
//! neither can a short changed region between two runs: such a region takes bytes
//! from a neighbouring run (a copied range need not start on a member boundary), and
//! when no neighbour can spare them, the run is sent instead of copied.
//!
//! Invariant of [`plan`]: the parts cover `0..size` in order, without gaps or overlaps,
//! and each copied part lies inside one of the hints it was given.

use super::Reuse;

/// S3 rejects parts smaller than this (except the last one).
pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;
/// The largest part S3 accepts.
pub const MAX_PART_SIZE: u64 = 5 * 1024 * 1024 * 1024;
/// The most parts one upload may have.
pub const MAX_PARTS: usize = 10_000;

/// One part: `length` bytes at `offset` of the new object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub offset: u64,
    pub length: u64,
    /// `None`: sent from the file. `Some((source, source_offset))`: copied.
    pub copy: Option<(String, u64)>,
}

/// The parts of an object of `size` bytes, sending what is sent in parts of about
/// `part_size` (at least [`MIN_PART_SIZE`]). `reuse` may be in any order; overlapping
/// or out-of-range hints are dropped.
pub fn plan(size: u64, part_size: u64, reuse: &[Reuse]) -> Vec<Part> {
    let part_size = part_size.clamp(MIN_PART_SIZE, MAX_PART_SIZE);
    // Segments covering 0..size: copy runs long enough to be parts, and what is between.
    let mut runs: Vec<&Reuse> = reuse
        .iter()
        .filter(|r| r.length >= MIN_PART_SIZE && r.offset.saturating_add(r.length) <= size)
        .collect();
    runs.sort_by_key(|r| r.offset);
    let mut segments: Vec<Part> = Vec::new();
    let mut at = 0;
    for run in runs {
        if run.offset < at {
            continue;
        }
        if run.offset > at {
            segments.push(sent(at, run.offset - at));
        }
        segments.push(Part {
            offset: run.offset,
            length: run.length,
            copy: Some((run.source.clone(), run.source_offset)),
        });
        at = run.offset + run.length;
    }
    if at < size {
        segments.push(sent(at, size - at));
    }
    fix_short_sends(&mut segments);
    let parts: Vec<Part> = segments
        .into_iter()
        .flat_map(|s| split(s, part_size))
        .collect();
    if parts.len() > MAX_PARTS {
        return split(
            sent(0, size),
            size.div_ceil(MAX_PARTS as u64).max(part_size),
        );
    }
    parts
}

fn sent(offset: u64, length: u64) -> Part {
    Part {
        offset,
        length,
        copy: None,
    }
}

/// Makes every sent segment but the last at least [`MIN_PART_SIZE`] long, by taking
/// bytes from the copy run after it or before it, or by sending that run too.
fn fix_short_sends(segments: &mut Vec<Part>) {
    let mut i = 0;
    while i < segments.len() {
        let last = i + 1 == segments.len();
        if segments[i].copy.is_some() || last || segments[i].length >= MIN_PART_SIZE {
            i += 1;
            continue;
        }
        let need = MIN_PART_SIZE - segments[i].length;
        // A sent segment is always followed by a copy run (sent neighbours are merged).
        if segments[i + 1].length >= MIN_PART_SIZE + need {
            let next = &mut segments[i + 1];
            next.offset += need;
            next.length -= need;
            if let Some((_, source_offset)) = &mut next.copy {
                *source_offset += need;
            }
            segments[i].length += need;
            i += 1;
        } else if i > 0 && segments[i - 1].length >= MIN_PART_SIZE + need {
            segments[i - 1].length -= need;
            segments[i].offset -= need;
            segments[i].length += need;
            i += 1;
        } else {
            // Send the next run as well, and look at the merged segment again.
            let next = segments.remove(i + 1);
            segments[i].length += next.length;
            if i + 1 < segments.len() && segments[i + 1].copy.is_none() {
                let after = segments.remove(i + 1);
                segments[i].length += after.length;
            }
        }
    }
}

/// Cuts a segment into parts: sent ones of about `part_size` (never less, so that each
/// is at least the minimum), none of more than [`MAX_PART_SIZE`].
fn split(segment: Part, part_size: u64) -> Vec<Part> {
    let count = match segment.copy {
        None => (segment.length / part_size).max(segment.length.div_ceil(MAX_PART_SIZE)),
        Some(_) => segment.length.div_ceil(MAX_PART_SIZE),
    }
    .max(1);
    let each = segment.length / count;
    (0..count)
        .map(|k| {
            let start = k * each;
            let length = if k + 1 == count {
                segment.length - start
            } else {
                each
            };
            Part {
                offset: segment.offset + start,
                length,
                copy: segment
                    .copy
                    .as_ref()
                    .map(|(source, offset)| (source.clone(), offset + start)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1024 * 1024;

    fn reuse(offset: u64, length: u64, source_offset: u64) -> Reuse {
        Reuse {
            offset,
            length,
            source: "old.tar.gz".into(),
            source_offset,
        }
    }

    fn copied(parts: &[Part]) -> u64 {
        parts
            .iter()
            .filter(|p| p.copy.is_some())
            .map(|p| p.length)
            .sum()
    }

    #[test]
    fn a_change_in_the_middle_is_sent_with_the_minimum_around_it() {
        // 100 MiB, all reusable but one changed MiB at 50 MiB.
        let hints = [reuse(0, 50 * MIB, 0), reuse(51 * MIB, 49 * MIB, 50 * MIB)];
        let parts = plan(100 * MIB, 64 * MIB, &hints);
        assert_eq!(copied(&parts), 95 * MIB);
        let sent: Vec<_> = parts.iter().filter(|p| p.copy.is_none()).collect();
        assert_eq!(sent.len(), 1);
        assert_eq!((sent[0].offset, sent[0].length), (50 * MIB, 5 * MIB));
        // The run after the change gave the 4 MiB the sent part needed.
        assert!(parts.contains(&Part {
            offset: 55 * MIB,
            length: 45 * MIB,
            copy: Some(("old.tar.gz".into(), 54 * MIB)),
        }));
    }

    #[test]
    fn runs_too_short_to_spare_bytes_are_sent() {
        let hints = [reuse(0, 6 * MIB, 0), reuse(7 * MIB, 6 * MIB, 7 * MIB)];
        let parts = plan(14 * MIB, 8 * MIB, &hints);
        assert_eq!(copied(&parts), 6 * MIB);
        assert_eq!(parts[0].copy, Some(("old.tar.gz".into(), 0)));
    }

    #[test]
    fn nothing_to_reuse_is_plain_parts() {
        let parts = plan(200 * MIB, 64 * MIB, &[]);
        assert_eq!(parts.len(), 3);
        assert!(
            parts
                .iter()
                .all(|p| p.copy.is_none() && p.length >= 64 * MIB)
        );
    }

    #[test]
    fn no_part_is_larger_than_s3_allows() {
        let size = 7 * 1024 * MIB;
        let parts = plan(size, 4 * 1024 * MIB, &[]);
        assert!(parts.len() >= 2, "{parts:?}");
        assert!(parts.iter().all(|p| p.length <= MAX_PART_SIZE), "{parts:?}");
        assert_eq!(parts.iter().map(|p| p.length).sum::<u64>(), size);
    }

    proptest! {
        #[test]
        fn parts_follow_s3s_rules_and_copy_only_what_the_hints_say(
            size_mib in 1u64..300,
            part_mib in 5u64..70,
            cuts in proptest::collection::vec((0u64..300, 1u64..40, 0u64..500), 0..12),
        ) {
            let size = size_mib * MIB + 12345;
            let hints: Vec<Reuse> = cuts
                .iter()
                .map(|&(at, len, src)| reuse(at * MIB + 7, len * MIB / 3 + 1, src * MIB))
                .collect();
            let parts = plan(size, part_mib * MIB, &hints);
            let mut at = 0;
            for (k, part) in parts.iter().enumerate() {
                prop_assert_eq!(part.offset, at);
                prop_assert!(part.length > 0);
                if k + 1 < parts.len() {
                    prop_assert!(part.length >= MIN_PART_SIZE);
                }
                if let Some((_, source_offset)) = &part.copy {
                    let inside = hints.iter().any(|h| {
                        part.offset >= h.offset
                            && part.offset + part.length <= h.offset + h.length
                            && *source_offset == h.source_offset + (part.offset - h.offset)
                    });
                    prop_assert!(inside, "{:?} is not inside a hint", part);
                }
                at += part.length;
            }
            prop_assert_eq!(at, size);
        }
    }
}

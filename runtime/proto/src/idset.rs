//! RFC 22 idsets: sets of non-negative integer ids (here daemon ranks) and their string form,
//! `1-3,5-6,42` or `[1-3,5-6,42]`. Job placements and every job-control message name their
//! ranks this way.
//!
//! Decoding is strict: ids ascending with no overlap, decimal without leading zeroes, ranges
//! `lo-hi` with `lo < hi`, only digits, commas, hyphens and one pair of enclosing brackets.
//! Encoding is canonical: ascending, every run of two or more consecutive ids as a range,
//! so equal sets always encode to the same string.

use std::fmt;
use std::str::FromStr;

/// A set of ids, kept as sorted, disjoint, non-adjacent inclusive ranges (so a range of a
/// million ranks costs one entry).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct IdSet {
    ranges: Vec<(u32, u32)>,
}

/// Why a string is not an idset; `at` is the byte offset of the offending element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdSetError {
    pub at: usize,
    pub reason: String,
    pub input: String,
}

impl fmt::Display for IdSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "not an RFC 22 idset at byte {}: {} (in {:?})",
            self.at, self.reason, self.input
        )
    }
}

impl std::error::Error for IdSetError {}

impl IdSet {
    pub fn new() -> IdSet {
        IdSet::default()
    }

    /// The ids `lo..=hi`.
    pub fn range(lo: u32, hi: u32) -> IdSet {
        let mut s = IdSet::new();
        if lo <= hi {
            s.ranges.push((lo, hi));
        }
        s
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// How many ids.
    pub fn len(&self) -> u64 {
        self.ranges
            .iter()
            .map(|&(lo, hi)| u64::from(hi - lo) + 1)
            .sum()
    }

    pub fn contains(&self, id: u32) -> bool {
        // The last range starting at or below `id` is the only candidate.
        let i = self.ranges.partition_point(|&(lo, _)| lo <= id);
        i > 0 && self.ranges[i - 1].1 >= id
    }

    /// Adds `lo..=hi`, merging with overlapping or adjacent ranges.
    pub fn insert_range(&mut self, lo: u32, hi: u32) {
        if lo > hi {
            return;
        }
        let at = self.ranges.partition_point(|&(a, _)| a < lo);
        self.ranges.insert(at, (lo, hi));
        // Merge in one pass; u64 so that adjacency at u32::MAX cannot overflow.
        let mut out: Vec<(u32, u32)> = Vec::with_capacity(self.ranges.len());
        for &(a, b) in &self.ranges {
            match out.last_mut() {
                Some(last) if u64::from(a) <= u64::from(last.1) + 1 => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        self.ranges = out;
    }

    pub fn insert(&mut self, id: u32) {
        self.insert_range(id, id);
    }

    /// Removes `id` if present.
    pub fn remove(&mut self, id: u32) {
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        for &(a, b) in &self.ranges {
            if id < a || id > b {
                out.push((a, b));
                continue;
            }
            if a < id {
                out.push((a, id - 1));
            }
            if id < b {
                out.push((id + 1, b));
            }
        }
        self.ranges = out;
    }

    /// The ids in both sets.
    pub fn intersection(&self, other: &IdSet) -> IdSet {
        let mut out = Vec::new();
        let (mut i, mut j) = (0, 0);
        while i < self.ranges.len() && j < other.ranges.len() {
            let (a, b) = self.ranges[i];
            let (c, d) = other.ranges[j];
            let (lo, hi) = (a.max(c), b.min(d));
            if lo <= hi {
                out.push((lo, hi));
            }
            if b < d {
                i += 1;
            } else {
                j += 1;
            }
        }
        IdSet { ranges: out }
    }

    pub fn intersects(&self, other: &IdSet) -> bool {
        !self.intersection(other).is_empty()
    }

    /// The ids in either set.
    pub fn union(&self, other: &IdSet) -> IdSet {
        // One merge of the two sorted lists: a controller takes the union of every child's
        // subtree and of every report, so inserting range by range (a pass each) would cost
        // it the square of its children.
        let mut out: Vec<(u32, u32)> = Vec::with_capacity(self.ranges.len() + other.ranges.len());
        let (mut i, mut j) = (0, 0);
        while i < self.ranges.len() || j < other.ranges.len() {
            let next = match (self.ranges.get(i), other.ranges.get(j)) {
                (Some(&a), Some(&b)) if a.0 <= b.0 => {
                    i += 1;
                    a
                }
                (_, Some(&b)) => {
                    j += 1;
                    b
                }
                (Some(&a), None) => {
                    i += 1;
                    a
                }
                (None, None) => break,
            };
            // u64: adjacency at u32::MAX cannot overflow.
            match out.last_mut() {
                Some(last) if u64::from(next.0) <= u64::from(last.1) + 1 => {
                    last.1 = last.1.max(next.1)
                }
                _ => out.push(next),
            }
        }
        IdSet { ranges: out }
    }

    /// The ids of `self` not in `other`.
    pub fn difference(&self, other: &IdSet) -> IdSet {
        let mut out = Vec::new();
        for &(a, b) in &self.ranges {
            // u64: one past u32::MAX must be representable.
            let (mut lo, b) = (u64::from(a), u64::from(b));
            for &(c, d) in &other.ranges {
                let (c, d) = (u64::from(c), u64::from(d));
                if d < lo || c > b {
                    continue;
                }
                if c > lo {
                    out.push((lo as u32, (c - 1) as u32));
                }
                lo = d + 1;
                if lo > b {
                    break;
                }
            }
            if lo <= b {
                out.push((lo as u32, b as u32));
            }
        }
        IdSet { ranges: out }
    }

    /// Every id, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ranges.iter().flat_map(|&(lo, hi)| lo..=hi)
    }

    /// The canonical string, optionally in brackets (`[1-3,5]`; an empty set is `[]`).
    pub fn encode(&self, brackets: bool) -> String {
        let body = self
            .ranges
            .iter()
            .map(|&(lo, hi)| {
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}-{hi}")
                }
            })
            .collect::<Vec<_>>()
            .join(",");
        if brackets {
            format!("[{body}]")
        } else {
            body
        }
    }

    /// Parses an RFC 22 idset string (see the module documentation for what is refused).
    pub fn decode(s: &str) -> Result<IdSet, IdSetError> {
        let err = |at: usize, reason: &str| IdSetError {
            at,
            reason: reason.to_string(),
            input: s.chars().take(200).collect(),
        };
        let (body, offset) = match (s.strip_prefix('['), s.ends_with(']')) {
            (Some(rest), true) => (&rest[..rest.len() - 1], 1),
            (Some(_), false) => return Err(err(0, "'[' without a closing ']'")),
            (None, true) => return Err(err(s.len() - 1, "']' without an opening '['")),
            (None, false) => (s, 0),
        };
        let mut set = IdSet::new();
        if body.is_empty() {
            return Ok(set);
        }
        let mut at = offset;
        let mut last: Option<u32> = None;
        for elem in body.split(',') {
            let (lo, hi) = match elem.split_once('-') {
                Some((a, b)) => {
                    let lo = number(a).map_err(|r| err(at, &r))?;
                    let hi = number(b).map_err(|r| err(at + a.len() + 1, &r))?;
                    if lo >= hi {
                        return Err(err(at, "a range must go from a lower to a higher id"));
                    }
                    (lo, hi)
                }
                None => {
                    let v = number(elem).map_err(|r| err(at, &r))?;
                    (v, v)
                }
            };
            if last.is_some_and(|l| lo <= l) {
                return Err(err(
                    at,
                    "ids must be ascending, without duplicates or overlap",
                ));
            }
            last = Some(hi);
            set.insert_range(lo, hi);
            at += elem.len() + 1;
        }
        Ok(set)
    }
}

/// One decimal id: digits only, no leading zero, fits in 32 bits.
fn number(s: &str) -> Result<u32, String> {
    if s.is_empty() {
        return Err("an empty element".into());
    }
    if let Some(c) = s.chars().find(|c| !c.is_ascii_digit()) {
        return Err(format!("{c:?} is not allowed in an idset"));
    }
    if s.len() > 1 && s.starts_with('0') {
        return Err(format!("{s} has a leading zero"));
    }
    s.parse::<u32>()
        .map_err(|_| format!("{s} is larger than {}", u32::MAX))
}

impl fmt::Display for IdSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode(false))
    }
}

impl FromStr for IdSet {
    type Err = IdSetError;
    fn from_str(s: &str) -> Result<IdSet, IdSetError> {
        IdSet::decode(s)
    }
}

impl FromIterator<u32> for IdSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> IdSet {
        let mut v: Vec<u32> = iter.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        let mut s = IdSet::new();
        for id in v {
            match s.ranges.last_mut() {
                Some(last) if last.1.checked_add(1) == Some(id) => last.1 = id,
                _ => s.ranges.push((id, id)),
            }
        }
        s
    }
}

impl serde::Serialize for IdSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.encode(false))
    }
}

impl<'de> serde::Deserialize<'de> for IdSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<IdSet, D::Error> {
        let s = String::deserialize(d)?;
        IdSet::decode(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn set(ids: &[u32]) -> IdSet {
        ids.iter().copied().collect()
    }

    #[test]
    fn encodes_canonically_with_ranges_for_consecutive_runs() {
        assert_eq!(set(&[1, 2, 3, 5, 6, 42]).to_string(), "1-3,5-6,42");
        assert_eq!(set(&[1, 2, 3, 5, 6, 42]).encode(true), "[1-3,5-6,42]");
        assert_eq!(set(&[0]).to_string(), "0");
        assert_eq!(IdSet::new().to_string(), "");
        assert_eq!(IdSet::new().encode(true), "[]");
        assert_eq!(
            set(&[u32::MAX - 1, u32::MAX]).to_string(),
            "4294967294-4294967295"
        );
    }

    #[test]
    fn decodes_every_valid_form() {
        for (s, ids) in [
            ("1,2,3,5,6,42", vec![1, 2, 3, 5, 6, 42]),
            ("1-3,5-6,42", vec![1, 2, 3, 5, 6, 42]),
            ("[1-3,5-6,42]", vec![1, 2, 3, 5, 6, 42]),
            ("1-2,3", vec![1, 2, 3]),
            ("0", vec![0]),
            ("[7]", vec![7]),
            ("", vec![]),
            ("[]", vec![]),
        ] {
            assert_eq!(IdSet::decode(s).unwrap(), set(&ids), "{s}");
        }
    }

    #[test]
    fn rejects_every_malformed_form_naming_the_problem() {
        for (s, why) in [
            ("3,1", "ascending"),
            ("1,1", "ascending"),
            ("1-5,3", "ascending"),
            ("1-5,5-7", "ascending"),
            ("01", "leading zero"),
            ("1-03", "leading zero"),
            ("1,,2", "empty element"),
            (",1", "empty element"),
            ("1,", "empty element"),
            ("5-3", "lower to a higher"),
            ("3-3", "lower to a higher"),
            ("1-", "empty element"),
            ("-1", "empty element"),
            ("1-2-3", "'-' is not allowed"),
            ("1 2", "' ' is not allowed"),
            ("a", "'a' is not allowed"),
            ("+1", "'+' is not allowed"),
            ("[1", "without a closing"),
            ("1]", "without an opening"),
            ("[[1]]", "'[' is not allowed"),
            ("4294967296", "larger than"),
        ] {
            let e = IdSet::decode(s).unwrap_err();
            assert!(e.to_string().contains(why), "{s:?}: {e}");
        }
    }

    #[test]
    fn set_operations() {
        let a = set(&[1, 2, 3, 7, 8]);
        let b = set(&[3, 4, 8, 9]);
        assert_eq!(a.intersection(&b), set(&[3, 8]));
        assert_eq!(a.union(&b), set(&[1, 2, 3, 4, 7, 8, 9]));
        assert_eq!(a.difference(&b), set(&[1, 2, 7]));
        assert!(a.intersects(&b) && !a.intersects(&set(&[5, 6])));
        let mut c = IdSet::range(0, 9);
        c.remove(0);
        c.remove(5);
        c.remove(9);
        assert_eq!(c.to_string(), "1-4,6-8");
        assert_eq!(c.len(), 7);
        assert_eq!(IdSet::range(0, u32::MAX).len(), 1 << 32);
        let top = IdSet::range(u32::MAX - 1, u32::MAX).union(&IdSet::range(0, u32::MAX - 2));
        assert_eq!(top, IdSet::range(0, u32::MAX));
    }

    fn model(s: &IdSet) -> BTreeSet<u32> {
        s.iter().collect()
    }

    proptest! {
        #[test]
        fn any_set_round_trips_through_its_canonical_string(
            ids in proptest::collection::btree_set(0u32..200, 0..60),
            brackets in any::<bool>(),
        ) {
            let s: IdSet = ids.iter().copied().collect();
            let text = s.encode(brackets);
            prop_assert_eq!(IdSet::decode(&text).unwrap(), s.clone());
            prop_assert_eq!(model(&s), ids);
        }

        #[test]
        fn every_accepted_string_reencodes_to_the_canonical_form_of_its_set(
            parts in proptest::collection::vec((0u32..40, 0u32..4), 0..12),
        ) {
            // Build a valid, possibly non-canonical string: ascending elements, single ids
            // or ranges, adjacent ones not merged.
            let mut next = 0u32;
            let mut elems = Vec::new();
            let mut ids = BTreeSet::new();
            for (gap, width) in parts {
                let lo = next + gap;
                let hi = lo + width;
                elems.push(if width == 0 { lo.to_string() } else { format!("{lo}-{hi}") });
                ids.extend(lo..=hi);
                next = hi + 1;
            }
            let text = elems.join(",");
            let s = IdSet::decode(&text).unwrap();
            prop_assert_eq!(model(&s), ids.clone());
            let canonical = ids.iter().copied().collect::<IdSet>().to_string();
            prop_assert_eq!(s.to_string(), canonical);
        }

        #[test]
        fn no_input_panics_the_decoder(text in "[0-9,\\-\\[\\] a]{0,24}") {
            let _ = IdSet::decode(&text);
        }

        #[test]
        fn set_operations_agree_with_a_btreeset(
            a in proptest::collection::btree_set(0u32..64, 0..40),
            b in proptest::collection::btree_set(0u32..64, 0..40),
            x in 0u32..64,
        ) {
            let (sa, sb): (IdSet, IdSet) = (a.iter().copied().collect(), b.iter().copied().collect());
            prop_assert_eq!(model(&sa.intersection(&sb)), a.intersection(&b).copied().collect::<BTreeSet<_>>());
            prop_assert_eq!(model(&sa.union(&sb)), a.union(&b).copied().collect::<BTreeSet<_>>());
            // Canonical too (adjacent ranges merged), or equal sets would compare unequal.
            prop_assert_eq!(sa.union(&sb), a.union(&b).copied().collect::<IdSet>());
            prop_assert_eq!(model(&sa.difference(&sb)), a.difference(&b).copied().collect::<BTreeSet<_>>());
            prop_assert_eq!(sa.contains(x), a.contains(&x));
            let mut r = sa.clone();
            r.remove(x);
            let mut ra = a.clone();
            ra.remove(&x);
            prop_assert_eq!(model(&r), ra);
            let mut i = sa.clone();
            i.insert(x);
            let mut ia = a.clone();
            ia.insert(x);
            prop_assert_eq!(model(&i), ia.clone());
            prop_assert_eq!(i.len(), ia.len() as u64);
        }
    }
}

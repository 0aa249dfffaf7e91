//! The radix routing tree: PRRTE's strided layout, so that this runtime and a vendor's agree on
//! every daemon's parent.
//!
//! Layer `d` starts at `off(d) = (R^d - 1) / (R - 1)` and holds `R^d` ranks. A rank `r` in
//! layer `d` has parent `off(d-1) + (r - off(d)) mod R^(d-1)` and children
//! `r + R^d * (i + 1)` for `i` in `0..R`, those below the tree size.

pub use dvmlab_proto::Rank;

/// The routing tree over ranks `0..size` with a given radix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RadixTree {
    radix: u64,
    size: u64,
}

impl RadixTree {
    /// A tree of `size` ranks. `radix` below 2 is raised to 2, as PRRTE does.
    pub fn new(radix: u32, size: u32) -> RadixTree {
        RadixTree {
            radix: u64::from(radix.max(2)),
            size: u64::from(size),
        }
    }

    pub fn size(&self) -> u32 {
        self.size as u32
    }

    pub fn radix(&self) -> u32 {
        self.radix as u32
    }

    /// `(layer, offset of that layer, ranks in that layer)` for rank `r`.
    fn layer(&self, r: u64) -> (u32, u64, u64) {
        let (mut d, mut off, mut width) = (0u32, 0u64, 1u64);
        loop {
            let next = off.saturating_add(width);
            if r < next {
                return (d, off, width);
            }
            off = next;
            width = width.saturating_mul(self.radix);
            d += 1;
        }
    }

    /// The depth of `r` (the controller is at depth 0).
    pub fn depth(&self, r: Rank) -> u32 {
        self.layer(u64::from(r)).0
    }

    /// The parent of `r`, or `None` for the root. It does not depend on the tree's size: a
    /// rank appended later leaves every existing rank's parent as it was.
    pub fn parent(&self, r: Rank) -> Option<Rank> {
        let r = u64::from(r);
        if r == 0 {
            return None;
        }
        let (_, off, width) = self.layer(r);
        let up_width = width / self.radix;
        let up_off = off - up_width;
        Some((up_off + (r - off) % up_width) as Rank)
    }

    /// The children of `r`, in increasing rank order.
    pub fn children(&self, r: Rank) -> Vec<Rank> {
        let r64 = u64::from(r);
        if r64 >= self.size {
            return Vec::new();
        }
        let (_, _, width) = self.layer(r64);
        (1..=self.radix)
            .map_while(|i| {
                let c = r64.checked_add(width.checked_mul(i)?)?;
                (c < self.size).then_some(c as Rank)
            })
            .collect()
    }

    /// The ancestors of `r` from its parent up to the root.
    pub fn ancestors(&self, r: Rank) -> Vec<Rank> {
        std::iter::successors(self.parent(r), |&p| self.parent(p)).collect()
    }

    /// Whether `a` is `r` or one of `r`'s ancestors.
    pub fn is_ancestor_or_self(&self, a: Rank, r: Rank) -> bool {
        // Walked, not collected: this runs once per rank of every report a daemon accepts.
        std::iter::successors(Some(r), |&p| self.parent(p)).any(|x| x == a)
    }

    /// The number of ranks in the subtree rooted at `r`, `r` included.
    pub fn subtree_size(&self, r: Rank) -> u64 {
        let mut count = 0;
        let mut stack = vec![r];
        while let Some(x) = stack.pop() {
            count += 1;
            stack.extend(self.children(x));
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_the_prrte_examples() {
        let t2 = RadixTree::new(2, 100);
        assert_eq!(t2.children(0), [1, 2]);
        assert_eq!(t2.children(1), [3, 5]);
        assert_eq!(t2.children(2), [4, 6]);
        assert_eq!(t2.children(3), [7, 11]);
        let t3 = RadixTree::new(3, 100);
        assert_eq!(t3.children(0), [1, 2, 3]);
        assert_eq!(t3.children(1), [4, 7, 10]);
        assert_eq!(t3.children(4), [13, 22, 31]);
        assert_eq!(t3.parent(14), Some(5));
        let t64 = RadixTree::new(64, 1000);
        assert_eq!(t64.parent(65), Some(1));
        assert_eq!(t64.parent(129), Some(1));
        assert_eq!(t64.children(0).len(), 64);
    }

    #[test]
    fn small_and_degenerate_trees() {
        assert_eq!(RadixTree::new(64, 1).children(0), Vec::<Rank>::new());
        assert_eq!(RadixTree::new(2, 1).parent(0), None);
        assert_eq!(RadixTree::new(1, 4).radix(), 2);
        assert_eq!(
            RadixTree::new(2, 4).parent(4),
            RadixTree::new(2, 5).parent(4),
            "a rank past the size has the parent it will have"
        );
        assert_eq!(RadixTree::new(2, 12).ancestors(11), [3, 1, 0]);
    }

    fn ceil_log(n: u64, r: u64) -> u32 {
        let (mut d, mut p) = (0, 1u64);
        while p < n {
            p = p.saturating_mul(r);
            d += 1;
        }
        d
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn every_tree_is_well_formed(radix in 2u32..=64, n in 1u32..=10_000) {
            let t = RadixTree::new(radix, n);
            let mut parent_count = vec![0u32; n as usize];
            for r in 0..n {
                let kids = t.children(r);
                prop_assert!(kids.len() <= radix as usize);
                for &c in &kids {
                    prop_assert_eq!(t.parent(c), Some(r));
                    parent_count[c as usize] += 1;
                }
                prop_assert!(t.depth(r) <= ceil_log(u64::from(n), u64::from(radix)));
                if r > 0 {
                    let p = t.parent(r).unwrap();
                    prop_assert!(t.children(p).contains(&r));
                    prop_assert_eq!(t.depth(p) + 1, t.depth(r));
                    let kids_total: u64 = kids.iter().map(|&c| t.subtree_size(c)).sum();
                    prop_assert_eq!(t.subtree_size(r), 1 + kids_total);
                }
            }
            prop_assert_eq!(parent_count[0], 0);
            prop_assert!(parent_count[1..].iter().all(|&c| c == 1));
            prop_assert_eq!(t.subtree_size(0), u64::from(n));
        }
    }
}

//! One page in order over many sorted shards, read a little at a time: a
//! page costs about what it shows plus one item per shard, not shards ×
//! page size (1,024 shards × 1,000 bodies for one page of 1,000).
//!
//! The caller drives it: [`Merge::wants`] names the shard to read next and
//! how many items, the caller reads them after [`Merge::last`] (or from the
//! start) and hands them to [`Merge::fill`]; [`Merge::finish`] gives the
//! page. Keeping the reads in the caller keeps this free of connections.

use std::cmp::Ordering;
use std::collections::VecDeque;

/// A k-way merge that asks for its input as it goes.
pub struct Merge<T> {
    /// Read from each shard, not yet taken.
    buffered: Vec<VecDeque<T>>,
    /// Whether each shard may hold more after what was read.
    more: Vec<bool>,
    /// Items read from each shard so far (the next read doubles it).
    read: Vec<usize>,
    /// The last item read from each shard: where its next read starts.
    last: Vec<Option<T>>,
    /// A floor under each shard's items, when known: a shard whose floor
    /// lies after every item in hand is not read yet.
    floors: Vec<Option<T>>,
    out: Vec<T>,
    limit: usize,
    order: fn(&T, &T) -> Ordering,
}

impl<T: Clone> Merge<T> {
    /// A page of at most `limit` items over `shards` shards, each sorted by
    /// `order`.
    pub fn new(shards: usize, limit: usize, order: fn(&T, &T) -> Ordering) -> Self {
        Self {
            buffered: (0..shards).map(|_| VecDeque::new()).collect(),
            more: vec![true; shards],
            read: vec![0; shards],
            last: vec![None; shards],
            floors: vec![None; shards],
            out: Vec::new(),
            limit,
            order,
        }
    }

    /// The same merge knowing a floor under each shard's items (`None`:
    /// none known), so a page reads only the shards that can reach it.
    pub fn with_floors(mut self, floors: Vec<Option<T>>) -> Self {
        self.floors = floors;
        self.floors.resize(self.buffered.len(), None);
        self
    }

    /// The shard to read next and how many items, or `None` once the page
    /// is complete. A shard is read when its next item may be the page's
    /// next: first `limit / shards` each, then as many again as were read
    /// from it, so a shard that holds most of the page is read in a few
    /// calls and one that holds little costs one item beyond it.
    pub fn wants(&mut self) -> Option<(usize, usize)> {
        while self.out.len() < self.limit {
            let left = self.limit - self.out.len();
            let shards = self.buffered.len();
            if let Some(i) = self.next_read() {
                let n = match self.read[i] {
                    0 => self.limit.div_ceil(shards),
                    read => read,
                };
                return Some((i, n.clamp(1, left)));
            }
            let order = self.order;
            let next = (0..shards)
                .filter(|&i| !self.buffered[i].is_empty())
                .min_by(|&a, &b| order(&self.buffered[a][0], &self.buffered[b][0]))?;
            let item = self.buffered[next].pop_front()?;
            self.out.push(item);
        }
        None
    }

    /// The shard that must be read before the next item can be taken: one
    /// with nothing in hand that may hold more and whose floor is not after
    /// the least item in hand, the lowest floor first.
    fn next_read(&self) -> Option<usize> {
        let order = self.order;
        let shards = 0..self.buffered.len();
        let head = shards
            .clone()
            .filter_map(|i| self.buffered[i].front())
            .min_by(|a, b| order(a, b));
        let floor = |i: usize| self.floors[i].as_ref();
        shards
            .filter(|&i| self.buffered[i].is_empty() && self.more[i])
            .filter(|&i| match (floor(i), head) {
                (Some(f), Some(h)) => order(f, h) != Ordering::Greater,
                _ => true,
            })
            .min_by(|&a, &b| match (floor(a), floor(b)) {
                (None, None) => Ordering::Equal,
                (None, _) => Ordering::Less,
                (_, None) => Ordering::Greater,
                (Some(x), Some(y)) => order(x, y),
            })
    }

    /// Where `shard`'s next read starts: after this item (`None`: from the
    /// page's start).
    pub fn last(&self, shard: usize) -> Option<&T> {
        self.last[shard].as_ref()
    }

    /// Items read from `shard` so far (for reads by offset).
    pub fn read(&self, shard: usize) -> usize {
        self.read[shard]
    }

    /// What a read of `shard` returned, in order, and whether more follow.
    pub fn fill(&mut self, shard: usize, items: Vec<T>, more: bool) {
        self.more[shard] = more && !items.is_empty();
        self.read[shard] += items.len();
        if let Some(l) = items.last() {
            self.last[shard] = Some(l.clone());
        }
        self.buffered[shard].extend(items);
    }

    /// Items taken into the page so far.
    pub fn taken(&self) -> usize {
        self.out.len()
    }

    /// The page, and whether anything follows it (also the page so far,
    /// when the caller stops reading before [`Merge::wants`] is done).
    pub fn finish(self) -> (Vec<T>, bool) {
        let more = self.more.iter().any(|m| *m) || self.buffered.iter().any(|b| !b.is_empty());
        (self.out, more)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Merges `shards` with reads counted; returns (page, more, items read).
    fn run(shards: &[Vec<u32>], limit: usize) -> (Vec<u32>, bool, usize) {
        run_from(Merge::new(shards.len(), limit, u32::cmp), shards)
    }

    /// [`run`] with a merge set up by the caller.
    fn run_from(mut m: Merge<u32>, shards: &[Vec<u32>]) -> (Vec<u32>, bool, usize) {
        let mut total = 0;
        while let Some((i, n)) = m.wants() {
            let from = m.read(i);
            let got: Vec<u32> = shards[i].iter().skip(from).take(n).copied().collect();
            total += got.len();
            let more = from + got.len() < shards[i].len();
            m.fill(i, got, more);
        }
        let (page, more) = m.finish();
        (page, more, total)
    }

    #[test]
    fn a_page_is_in_order_over_every_shard_and_says_when_more_follow() {
        let shards = vec![vec![1, 4, 7], vec![2, 5, 8], vec![3, 6, 9]];
        assert_eq!(run(&shards, 4).0, [1, 2, 3, 4]);
        assert!(run(&shards, 4).1);
        let (page, more, _) = run(&shards, 100);
        assert_eq!(page, (1..=9).collect::<Vec<_>>());
        assert!(!more);
        assert_eq!(run(&[vec![], vec![]], 5).0, Vec::<u32>::new());
    }

    #[test]
    fn a_page_reads_about_what_it_shows_plus_one_item_per_shard() {
        // 64 shards of 1,000; the page's 100 all on one shard, or spread.
        let mut lopsided: Vec<Vec<u32>> = (0..64)
            .map(|s| (0..1000).map(|i| 10_000 + s * 1000 + i).collect())
            .collect();
        lopsided[5] = (0..1000).collect();
        let (page, _, read) = run(&lopsided, 100);
        assert_eq!(page, (0..100).collect::<Vec<_>>());
        assert!(read <= 2 * 100 + 64 * 2, "{read} read for a page of 100");
        let spread: Vec<Vec<u32>> = (0..64)
            .map(|s| (0..1000).map(|i| i * 64 + s).collect())
            .collect();
        let (page, _, read) = run(&spread, 100);
        assert_eq!(page, (0..100).collect::<Vec<_>>());
        assert!(read <= 2 * 100 + 64 * 2, "{read} read for a page of 100");
    }

    #[test]
    fn shards_whose_floor_lies_after_the_page_are_not_read() {
        // K (no floor) and 1,000 tenants whose floors are their heads: a
        // page of 10 reads K and the tenants whose heads are on it, and no
        // other (each of which has one head on the page).
        let mut shards = vec![vec![5, 50]];
        let mut floors = vec![None];
        for t in 0..1000u32 {
            let head = if t < 2 { t } else { 100 + t };
            shards.push(vec![
                head,
                head + 2000,
                head + 4000,
                head + 6000,
                head + 8000,
            ]);
            floors.push(Some(head));
        }
        let m = Merge::new(shards.len(), 10, u32::cmp).with_floors(floors);
        let (page, more, read) = run_from(m, &shards);
        assert_eq!(page, [0, 1, 5, 50, 102, 103, 104, 105, 106, 107]);
        assert!(more);
        assert!(read <= 2 * 10 + 2 * 12, "{read} read for a page of 10");
    }
}

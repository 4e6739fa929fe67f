//! The fair share: which tenants get how many members of the next batch.
//! A pure function over what the last claim saw, so the policy is tested
//! without Redis and the script only carries it out.
//!
//! Start-time fair queueing (virtual time): each backlogged tenant has a
//! virtual time that advances by 1 / weight per member released, and each
//! member of the batch goes to the tenant whose next member would finish
//! earliest in virtual time. A tenant that returns from idle starts at the
//! floor, the smallest virtual time among the backlogged, so it is served at
//! once but banks no credit for its idle spell; a heavy tenant's backlog
//! only raises its own virtual time, never a light tenant's wait.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One tenant with due work, as the choice sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog<'a> {
    /// The tenant.
    pub tenant: &'a [u8],
    /// Its due members (the most it can be given).
    pub due: u64,
    /// Its shared virtual time, `None` after an idle spell.
    pub vtime: Option<f64>,
    /// Its weight, at least 1.
    pub weight: u32,
}

/// The members one batch takes from each tenant, and the floor the script
/// starts returning tenants from.
#[derive(Debug, Clone, PartialEq)]
pub struct Shares<'a> {
    /// `(tenant, count)` for every tenant given at least one member, in the
    /// order the members were handed out.
    pub counts: Vec<(&'a [u8], u64)>,
    /// The smallest virtual time among the backlogged tenants.
    pub floor: f64,
}

/// Splits `batch` members among `backlogs` by weighted fair share. Work
/// conserving: the batch is filled while any tenant has due members left.
pub fn shares<'a>(backlogs: &[Backlog<'a>], batch: u64) -> Shares<'a> {
    let floor = backlogs
        .iter()
        .filter_map(|b| b.vtime)
        .fold(f64::INFINITY, f64::min);
    let floor = if floor.is_finite() { floor } else { 0.0 };
    let mut heap: BinaryHeap<Next> = backlogs
        .iter()
        .enumerate()
        .filter(|(_, b)| b.due > 0)
        .map(|(i, b)| {
            let step = 1.0 / b.weight.max(1) as f64;
            Next {
                finish: b.vtime.unwrap_or(floor).max(floor) + step,
                step,
                fresh: b.vtime.is_none(),
                index: i,
            }
        })
        .collect();
    let mut given = vec![0u64; backlogs.len()];
    let mut order = Vec::new();
    let mut left = batch;
    while left > 0 {
        let Some(mut n) = heap.pop() else { break };
        if given[n.index] == 0 {
            order.push(n.index);
        }
        given[n.index] += 1;
        left -= 1;
        if given[n.index] < backlogs[n.index].due {
            n.finish += n.step;
            n.fresh = false;
            heap.push(n);
        }
    }
    Shares {
        counts: order
            .into_iter()
            .map(|i| (backlogs[i].tenant, given[i]))
            .collect(),
        floor,
    }
}

/// A tenant's next member in the heap: the earliest finish comes first;
/// on a tie, a tenant back from idle (it starts at the floor, level with the
/// busiest, so without this a batch of one would go to the busy one every
/// time), then the tenant listed first (the one whose earliest member is
/// oldest).
struct Next {
    finish: f64,
    step: f64,
    fresh: bool,
    index: usize,
}

impl Ord for Next {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .finish
            .total_cmp(&self.finish)
            .then(self.fresh.cmp(&other.fresh))
            .then(other.index.cmp(&self.index))
    }
}

impl PartialOrd for Next {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Next {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Next {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Tenants with a backlog, as the script keeps them: virtual time
    /// advanced by moved / weight from at least the floor, forgotten when
    /// the tenant runs dry.
    struct World {
        due: Vec<(&'static [u8], u64, u32)>,
        vtime: HashMap<&'static [u8], f64>,
    }

    impl World {
        fn new(due: &[(&'static [u8], u64, u32)]) -> Self {
            Self {
                due: due.to_vec(),
                vtime: HashMap::new(),
            }
        }

        /// A heavy tenant with a huge backlog, after `claims` claims of
        /// `batch`: a large virtual time.
        fn heavy_after(claims: usize, batch: u64) -> Self {
            let mut w = Self::new(&[(b"heavy", 1_000_000, 1)]);
            for _ in 0..claims {
                w.claim(batch);
            }
            w
        }

        /// A light tenant's member comes due, and the claim of `batch` right
        /// after must carry it (`round`, for the message): what each got.
        fn claim_a_light_member(
            &mut self,
            batch: u64,
            round: usize,
        ) -> HashMap<&'static [u8], u64> {
            self.due.push((b"light", 1, 1));
            let got = self.claim(batch);
            assert_eq!(got.get(&b"light"[..]), Some(&1), "round {round}");
            self.due.retain(|d| d.1 > 0);
            got
        }

        /// One claim of `batch`: returns what each tenant got.
        fn claim(&mut self, batch: u64) -> HashMap<&'static [u8], u64> {
            let backlogs: Vec<Backlog> = self
                .due
                .iter()
                .filter(|d| d.1 > 0)
                .map(|&(t, due, weight)| Backlog {
                    tenant: t,
                    due,
                    vtime: self.vtime.get(t).copied(),
                    weight,
                })
                .collect();
            let s = shares(&backlogs, batch);
            let mut got = HashMap::new();
            for (t, n) in s.counts {
                let d = self.due.iter_mut().find(|d| d.0 == t).unwrap();
                let v = self.vtime.get(t).copied().unwrap_or(s.floor).max(s.floor);
                self.vtime.insert(t, v + n as f64 / d.2 as f64);
                d.1 -= n;
                if d.1 == 0 {
                    self.vtime.remove(t);
                }
                got.insert(t, n);
            }
            got
        }
    }

    #[test]
    fn weights_3_to_1_share_a_saturated_release_within_10_percent() {
        let mut w = World::new(&[(b"a", 1_000_000, 3), (b"b", 1_000_000, 1)]);
        let (mut a, mut b) = (0u64, 0u64);
        for batch in [256u64, 7, 1000, 3, 256].iter().cycle().take(500) {
            let got = w.claim(*batch);
            a += got.get(&b"a"[..]).copied().unwrap_or(0);
            b += got.get(&b"b"[..]).copied().unwrap_or(0);
        }
        let ratio = a as f64 / b as f64;
        assert!((ratio - 3.0).abs() <= 0.3, "a {a} b {b} ratio {ratio}");
        // Within one batch too.
        let got = w.claim(400);
        assert_eq!((got[&b"a"[..]], got[&b"b"[..]]), (300, 100));
    }

    #[test]
    fn a_tenant_alone_gets_the_whole_batch() {
        let mut w = World::new(&[(b"heavy", 100_000, 1)]);
        assert_eq!(w.claim(256)[&b"heavy"[..]], 256);
        // And the others' unused share goes to whoever has due work.
        let mut w = World::new(&[(b"heavy", 100_000, 1), (b"light", 2, 1)]);
        let got = w.claim(256);
        assert_eq!((got[&b"heavy"[..]], got[&b"light"[..]]), (254, 2));
    }

    #[test]
    fn a_light_tenant_never_waits_behind_a_heavy_backlog() {
        let mut w = World::heavy_after(1000, 256);
        // A light tenant's member comes due while the heavy one has a huge
        // backlog and a large virtual time: the very next batch carries it,
        // and so does every later one, as members keep coming due.
        for round in 0..100 {
            let got = w.claim_a_light_member(256, round);
            assert_eq!(got[&b"heavy"[..]], 255);
        }
    }

    #[test]
    fn a_light_tenant_goes_first_even_in_batches_of_one() {
        // A rate cap can grant a claim a single token: the light member must
        // still take the next one, not wait for the heavy backlog to drain.
        let mut w = World::heavy_after(50, 1);
        for round in 0..20 {
            w.claim_a_light_member(1, round);
            w.claim(1);
        }
    }

    #[test]
    fn a_tenant_back_from_idle_banks_no_credit() {
        // `old` was served long ago (low virtual time); it returns with a
        // backlog beside `busy`: it gets an even share, not the whole batch.
        let backlogs = [
            Backlog {
                tenant: b"busy",
                due: 10_000,
                vtime: Some(5_000.0),
                weight: 1,
            },
            Backlog {
                tenant: b"old",
                due: 10_000,
                vtime: Some(3.0),
                weight: 1,
            },
        ];
        // The floor is the least virtual time among them; a stale one the
        // script kept would only pull the floor down, so the script forgets
        // a tenant's virtual time when it runs dry.
        let s = shares(&backlogs[..1], 100);
        assert_eq!(s.counts, vec![(&b"busy"[..], 100)]);
        let fresh = [
            backlogs[0].clone(),
            Backlog {
                vtime: None,
                ..backlogs[1].clone()
            },
        ];
        let s = shares(&fresh, 100);
        assert_eq!(s.counts, vec![(&b"old"[..], 50), (&b"busy"[..], 50)]);
    }

    #[test]
    fn nothing_due_gives_nothing() {
        assert!(shares(&[], 100).counts.is_empty());
        let b = [Backlog {
            tenant: b"x",
            due: 0,
            vtime: None,
            weight: 1,
        }];
        assert!(shares(&b, 100).counts.is_empty());
        assert!(shares(&b[..0], 0).counts.is_empty());
    }
}

//! Key names that Redis Cluster cares about: hash tags, slots, and the names
//! of a sharded business's keys. Pure functions, shared by the configuration
//! (validation), the store (key families) and the commands (`delayd shards`).

/// Redis Cluster's number of hash slots.
pub const SLOTS: u16 = 16384;

/// The part of `key` Redis Cluster hashes: the text between the first `{`
/// and the next `}` when it is not empty, else the whole key.
pub fn hash_part(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&c| c == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&c| c == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// True when `key` carries a hash tag (a non-empty `{...}`), which then
/// alone decides its slot.
pub fn has_hash_tag(key: &str) -> bool {
    hash_part(key.as_bytes()).len() != key.len()
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash part, mod 16384.
pub fn slot(key: &str) -> u16 {
    crc16(hash_part(key.as_bytes())) % SLOTS
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// How the keys of a business with `shards = M > 1` are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardNames {
    /// `K:0 .. K:M-1`: simple, but on a cluster their slots fall where the
    /// hash puts them, so three shards can share a master.
    Index,
    /// `K:{s<i>.<n>}`: shard `i` hashes into the middle of the `i`-th of
    /// `M` equal slot ranges, so the shards spread over the masters as the
    /// slots do.
    Spread,
}

/// The key names of shard `0..shards` of `key`.
pub fn shard_keys(key: &str, shards: usize, names: ShardNames) -> Vec<String> {
    if shards <= 1 {
        return vec![key.to_string()];
    }
    (0..shards)
        .map(|i| match names {
            ShardNames::Index => format!("{key}:{i}"),
            ShardNames::Spread => format!("{key}:{{{}}}", spread_tag(i, shards)),
        })
        .collect()
}

/// The first tag `s<i>.<n>` (n = 0, 1, ...) whose slot lies in the middle
/// half of the `i`-th of `shards` equal slot ranges: the middle, so that
/// however a tool rounds the boundaries when it splits the slots evenly
/// (`redis-cli --cluster create` gives 0-5460, 5461-10922, 10923-16383),
/// the shard falls on the `i`-th master. The search takes about
/// `2 × shards` tries and its result never changes, so producers can
/// compute the same names.
pub fn spread_tag(i: usize, shards: usize) -> String {
    let (lo, hi) = slot_range(i, shards);
    let quarter = (hi - lo) / 4;
    let (lo, hi) = (lo + quarter, (hi - quarter).max(lo + quarter + 1));
    (0u64..)
        .map(|n| format!("s{i}.{n}"))
        .find(|tag| {
            let s = crc16(tag.as_bytes()) % SLOTS;
            s >= lo && s < hi
        })
        .unwrap_or_default()
}

/// Slots `[lo, hi)` of the `i`-th of `shards` equal ranges.
pub fn slot_range(i: usize, shards: usize) -> (u16, u16) {
    let lo = (i * SLOTS as usize / shards) as u16;
    let hi = ((i + 1) * SLOTS as usize / shards) as u16;
    (lo, hi)
}

/// `{K}`, or `K` when it already carries a hash tag: what every helper key
/// of `K` starts with, so all of them share `K`'s cluster slot.
fn helper_base(key: &str) -> String {
    if has_hash_tag(key) {
        key.to_string()
    } else {
        format!("{{{key}}}")
    }
}

/// A key beside `K`'s family, in `K`'s cluster slot: `{K}:suffix`, or
/// `K:suffix` when `K` already carries a hash tag (a shard).
pub fn helper_key(key: &str, suffix: &str) -> String {
    format!("{}:{suffix}", helper_base(key))
}

/// Methods that name one helper key of the family each, `{K}:suffix` (see
/// [`helper_key`]): one line apiece, so a new key is named in one place.
macro_rules! helper_keys {
    ($($(#[$doc:meta])* $name:ident => $suffix:literal;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> String {
                format!("{}:{}", self.base(), $suffix)
            }
        )*
    };
}

/// Declares [`KeyFamily`] from one list of its helper keys, each with its
/// suffix, so that the struct, [`KeyFamily::new`] and [`KeyFamily::all`]
/// cannot disagree about which keys a family has.
macro_rules! key_family {
    ($($(#[$doc:meta])* $field:ident => $suffix:literal,)*) => {
        /// The names of every key that belongs to one producer key `K`.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct KeyFamily {
            /// `K`: pending members, score = due time.
            pub pending: String,
            $($(#[$doc])* pub $field: String,)*
        }

        impl KeyFamily {
            /// Derives the helper keys so they hash to the same cluster slot as `key`:
            /// `{K}:suffix`, or `K:suffix` when `K` already carries a hash tag.
            pub fn new(key: &str) -> Self {
                let base = helper_base(key);
                Self {
                    pending: key.to_string(),
                    $($field: format!("{base}:{}", $suffix),)*
                }
            }

            /// Every key of the family, for clean-up in tests and benchmarks.
            pub fn all(&self) -> Vec<&str> {
                vec![&self.pending, $(&self.$field,)*]
            }
        }
    };
}

key_family! {
    /// Claimed, awaiting the broker: score = lease deadline (ms), whose
    /// fraction (n/1024) is the tag of the claim that holds the member.
    inflight => "inflight",
    /// Retried, released and recovered members: `attempts:due_ms:score`.
    meta => "meta",
    /// One record per claim: the due times of its first attempts, needed
    /// only to recover them if the claiming process dies.
    claims => "claims",
    /// Given up: score = when it died (ms).
    dead => "dead",
    /// Why each dead member died.
    reasons => "dead-reason",
    /// Id mode: task id -> body, for pending, in-flight and dead ids.
    body => "body",
    /// Id mode with `dedup_window`: ids delivered lately, score = when
    /// (epoch ms); trimmed to the window, so it holds only recent ids.
    delivered => "delivered",
    /// Recurring schedules: schedule -> "<fingerprint> <handled up to, ms>".
    schedules => "schedules",
    /// Occurrences written for a time still ahead, score = due (ms): what a
    /// changed or removed schedule takes back.
    occurrences => "occurrences",
    /// Set while an operator has paused the business: `"<since ms> <by>"`.
    /// The claim script reads it, so every instance stops claiming at once.
    paused => "paused",
    /// Adoption: plugin entry -> the id it was stored under, so a rerun of
    /// `delayd adopt` knows what it already moved, even once delivered.
    adopted => "adopted",
    /// Adoption: plugin entry -> the message read from it, not yet pending
    /// (until its plugin entry is deleted).
    staged => "staged",
}

impl KeyFamily {
    fn base(&self) -> String {
        helper_base(&self.pending)
    }

    helper_keys! {
        /// The shared `max_rate` budget of a business whose base key is this
        /// family's `K` (`max_rate_scope = "cluster"`).
        rate => "rate";
        /// A business with tenants: the index of tenants by the due time of
        /// their earliest member (score as in `K`), so a claim finds the tenants
        /// with due work in O(log tenants).
        tenant_index => "tenants";
        /// A business with tenants: each backlogged tenant's virtual time, the
        /// fairness state every instance shares.
        tenant_clock => "tenants:vtime";
        /// A business with tenants: the tenants an operator paused (tenant ->
        /// "<since ms> <by>"), whose members no claim moves until resumed.
        tenant_paused => "tenants:paused";
        /// A business with tenants: weights set at run time (tenant -> weight),
        /// each in place of the config's weight for that tenant.
        tenant_weights => "tenants:weight";
        /// A business with tenants: `max_rate`s set at run time (tenant ->
        /// members a second over every key), each in place of the config's.
        tenant_max_rates => "tenants:max_rate";
        /// A business with tenants: the release budget of each tenant with a
        /// `max_rate` (tenant -> the time, µs on Redis's clock, at which its
        /// budget is full again), shared by every instance.
        tenant_rate => "tenants:rate";
        /// A business with tenants: members each tenant's claims released lately
        /// (tenant -> "<second> <count in it> <count in the second before>",
        /// seconds of Redis's clock), for its released rate.
        tenant_released => "tenants:released";
        /// What a tenant's sorted set is named: this prefix, then the tenant.
        tenant_prefix => "tenant:";
    }

    /// The sorted set of `tenant`'s pending members (score = due), in `K`'s
    /// cluster slot.
    pub fn tenant_set(&self, tenant: &[u8]) -> Vec<u8> {
        let mut k = self.tenant_prefix().into_bytes();
        k.extend_from_slice(tenant);
        k
    }
}

/// The shard key a producer-side hash puts `member` on: XXH3-64 of the
/// member modulo the shard count, as `delayd schedule` uses.
pub fn shard_of<'a>(keys: &'a [String], member: &[u8]) -> &'a str {
    if keys.len() == 1 {
        return &keys[0];
    }
    let i = xxhash_rust::xxh3::xxh3_64(member) % keys.len() as u64;
    &keys[i as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster() {
        // Values from CLUSTER KEYSLOT on a real server.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(hash_part(b"foo{}{bar}"), b"foo{}{bar}");
    }

    #[test]
    fn empty_braces_are_not_a_tag() {
        assert!(!has_hash_tag("a{}b"));
        assert!(has_hash_tag("a{b}c"));
        assert!(!has_hash_tag("a}b{c"));
    }

    #[test]
    fn tenant_keys_share_the_slot_of_k() {
        for key in ["delay:jobs", "delay:jobs:{s0.3}"] {
            let f = KeyFamily::new(key);
            let set = String::from_utf8(f.tenant_set(b"acme")).unwrap();
            for k in [
                f.tenant_index(),
                f.tenant_clock(),
                f.tenant_paused(),
                f.tenant_weights(),
                f.tenant_max_rates(),
                f.tenant_rate(),
                f.tenant_released(),
                set,
            ] {
                assert_eq!(slot(&k), slot(key), "{k}");
            }
        }
        assert_eq!(
            KeyFamily::new("delay:jobs").tenant_set(b"acme"),
            b"{delay:jobs}:tenant:acme"
        );
    }

    #[test]
    fn index_names_are_key_colon_i() {
        assert_eq!(
            shard_keys("k", 3, ShardNames::Index),
            vec!["k:0", "k:1", "k:2"]
        );
        assert_eq!(shard_keys("k", 1, ShardNames::Spread), vec!["k"]);
    }

    #[test]
    fn spread_names_land_in_their_slot_range() {
        for m in [2usize, 3, 5, 16, 100] {
            let keys = shard_keys("delay:order", m, ShardNames::Spread);
            for (i, k) in keys.iter().enumerate() {
                let (lo, hi) = slot_range(i, m);
                let s = slot(k);
                assert!(s >= lo && s < hi, "{k} slot {s} not in {lo}..{hi}");
                assert!(k.starts_with("delay:order:{s"), "{k}");
            }
        }
    }
}

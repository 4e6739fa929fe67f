//! What `--fair` writes: a tenant's burst due at once, and light tenants'
//! members due as they are written, into a business with tenants (the
//! tenant's set and the index, as producers write them, docs/tenants.md) or
//! into `K` of a business without (the same members, no tenant). Each body
//! carries its due time and class (`late<due>-<class>-...`), so the
//! consumer times every member by class.

use super::*;

/// Where a pass writes: a business with tenants, or `K` alone.
#[derive(Clone)]
pub(super) struct Target {
    /// The business's keys.
    pub fam: KeyFamily,
    /// Whether members go into their tenants' sets.
    pub tenants: bool,
}

impl Target {
    /// The set `tenant`'s members go to: its own, or `K`.
    pub fn set(&self, tenant: &str) -> Vec<u8> {
        if self.tenants {
            self.fam.tenant_set(tenant.as_bytes())
        } else {
            self.fam.pending.clone().into_bytes()
        }
    }

    /// The keys of `tenants` outside the family, for the clean-up.
    pub fn extra_keys(&self, tenants: &[String]) -> Vec<Vec<u8>> {
        if !self.tenants {
            return Vec::new();
        }
        let mut keys = vec![
            self.fam.tenant_index().into_bytes(),
            self.fam.tenant_clock().into_bytes(),
            self.fam.tenant_rate().into_bytes(),
        ];
        keys.extend(tenants.iter().map(|t| self.set(t)));
        keys
    }

    /// Queues one tenant's members on `pipe`: into its set and, with
    /// tenants, the tenant into the index at its earliest due time.
    fn add(&self, pipe: &mut redis::Pipeline, tenant: &str, items: &[(i64, Vec<u8>)]) {
        let Some(first) = items.iter().map(|(due, _)| *due).min() else {
            return;
        };
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(self.set(tenant));
        for (due, body) in items {
            zadd.arg(*due).arg(body.as_slice());
        }
        pipe.add_command(zadd).ignore();
        if self.tenants {
            pipe.cmd("ZADD")
                .arg(self.fam.tenant_index())
                .arg("LT")
                .arg(first)
                .arg(tenant)
                .ignore();
        }
    }
}

/// A member's body: its class and due time ride in it.
fn body(class: u8, due: i64, i: usize, size: usize) -> Vec<u8> {
    body_of(&format!("late{due}-{}", class as char), i, size)
}

/// Redis's clock, epoch ms.
pub(super) async fn redis_now_ms(redis: &mut RedisConn) -> Result<i64, BenchError> {
    let time: (i64, i64) = redis::cmd("TIME")
        .query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))?;
    Ok(time_ms(time))
}

/// Redis's `TIME` reply (seconds, microseconds) in milliseconds.
pub(super) fn time_ms((secs, micros): (i64, i64)) -> i64 {
    secs * 1000 + micros / 1000
}

/// `n` members of `tenant` (class `class`), all due at `due`: staged in a
/// helper key, then renamed into the tenant's set in one transaction with
/// the last member's `ZADD` (the event that wakes delayd) and the index
/// entry, so the whole burst is pending at once.
pub(super) async fn burst(
    redis: &mut RedisConn,
    target: &Target,
    (tenant, class): (&str, u8),
    n: usize,
    due: i64,
    size: usize,
) -> Result<(), BenchError> {
    let staging = crate::keys::helper_key(&target.fam.pending, "staging");
    let n = n.max(2);
    for start in (0..n - 1).step_by(5000) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&staging);
        for i in start..(start + 5000).min(n - 1) {
            zadd.arg(due).arg(body(class, due, i, size));
        }
        let _: i64 = zadd
            .query_async(redis)
            .await
            .map_err(|e| fail("redis")(e.to_string()))?;
    }
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd("RENAME")
        .arg(&staging)
        .arg(target.set(tenant))
        .ignore();
    target.add(&mut pipe, tenant, &[(due, body(class, due, n - 1, size))]);
    send_pipe(redis, &pipe).await
}

/// Light tenants' members, each due as it is written: `rate` per second in
/// all for `secs`, member `i` to tenant `i mod tenants`, one transaction
/// per 10 ms. `offset` is this machine's clock minus Redis's. Each member
/// written goes to `watch` as well, with the time (Redis's clock) its
/// transaction ran: a write that reaches Redis after its due time (this
/// process was busy) cannot be released before it. Returns how many were
/// written.
pub(super) async fn light(
    redis: &mut RedisConn,
    target: &Target,
    tenants: &[String],
    (rate, secs): (u32, u64),
    (size, offset): (usize, f64),
    watch: &tokio::sync::mpsc::UnboundedSender<super::fair_release::Written>,
) -> Result<usize, BenchError> {
    let mut pace = super::pace::Pace::new(rate, secs, Duration::from_millis(10));
    let mut next = 0usize;
    while let Some(upto) = pace.upto(next).await {
        let due = (wall_ms_f() - offset).floor() as i64;
        let mut by_tenant: Vec<Vec<(i64, Vec<u8>)>> = vec![Vec::new(); tenants.len()];
        for i in next..upto {
            by_tenant[i % tenants.len()].push((due, body(b'l', due, i, size)));
        }
        next = upto.max(next);
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("TIME");
        for (t, items) in tenants.iter().zip(&by_tenant) {
            target.add(&mut pipe, t, items);
        }
        let (time,): ((i64, i64),) = pipe
            .query_async(redis)
            .await
            .map_err(|e| fail("redis")(e.to_string()))?;
        let visible = time_ms(time);
        for (t, items) in tenants.iter().zip(by_tenant) {
            for (due, member) in items {
                let _ = watch.send((target.set(t), member, due, visible));
            }
        }
    }
    Ok(pace.total())
}

/// Cancels what is left of a burst due at `due` (as a producer's
/// `ZREMRANGEBYSCORE` would): the pass measured its window and needs no
/// more. Returns how many were still pending.
pub(super) async fn cancel_rest(
    redis: &mut RedisConn,
    target: &Target,
    tenant: &str,
    due: i64,
) -> Result<u64, BenchError> {
    redis::cmd("ZREMRANGEBYSCORE")
        .arg(target.set(tenant))
        .arg(due)
        .arg(due)
        .query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))
}

/// Waits until `target` holds nothing pending or in flight (the tenants'
/// index empties as its sets do), at most `limit`.
pub(super) async fn wait_idle(
    redis: &mut RedisConn,
    target: &Target,
    limit: Duration,
) -> Result<(), BenchError> {
    let start = Instant::now();
    loop {
        let (p, i, t): (u64, u64, u64) = redis::pipe()
            .cmd("ZCARD")
            .arg(&target.fam.pending)
            .cmd("ZCARD")
            .arg(&target.fam.inflight)
            .cmd("ZCARD")
            .arg(target.fam.tenant_index())
            .query_async(redis)
            .await
            .map_err(|e| fail("redis")(e.to_string()))?;
        if p + i + t == 0 {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(BenchError::Runtime(format!(
                "bench: {} did not empty within {limit:?} ({p} pending, {i} in flight, {t} tenants indexed)",
                target.fam.pending
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The sizes of `tenants`' sets on Redis's clock every 20 ms for `secs`:
/// `(seconds, [size of each])`, `TIME` and the `ZCARD`s in one
/// transaction, so a release rate is read where delayd releases.
pub(super) async fn set_sizes(
    redis: &mut RedisConn,
    target: &Target,
    tenants: &[&str],
    secs: u64,
) -> Result<Vec<(f64, Vec<i64>)>, BenchError> {
    let end = Instant::now() + Duration::from_secs(secs);
    let mut out = Vec::new();
    while Instant::now() < end {
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("TIME");
        for t in tenants {
            pipe.zcard(target.set(t));
        }
        let mut reply: Vec<redis::Value> = pipe
            .query_async(redis)
            .await
            .map_err(|e| fail("redis")(e.to_string()))?;
        let sizes: Vec<i64> = reply
            .split_off(1)
            .into_iter()
            .map(|v| redis::from_redis_value(v).unwrap_or(0))
            .collect();
        let (s, us): (f64, f64) = redis::from_redis_value(reply.swap_remove(0))
            .map_err(|e| fail("redis")(e.to_string()))?;
        out.push((s + us / 1e6, sizes));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(out)
}

//! Redis side of the tests: connections, bulk writes, and waits and checks
//! on a key family.

use super::*;

/// Connection settings that tolerate a busy CI machine: the client's default
/// half-second response timeout fails large pipelined ZADDs there, and its
/// one-second connect timeout cut connects short under the 5 s that
/// [`redis_at`] allows.
pub fn slow_ok() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(5)))
}

/// A Redis connection to the shared server.
pub async fn redis() -> redis::aio::MultiplexedConnection {
    redis_at(&redis_url()).await
}

/// A Redis connection to the server at `url`.
pub async fn redis_at(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection_with_config(&slow_ok()),
    )
    .await
    .expect("Redis did not answer within 5s")
    .expect("cannot connect to Redis")
}

/// A connection for a `Store` the test drives itself, with the daemon's own
/// timeouts: a claim may take up to `RESPONSE_TIMEOUT` to answer, which the
/// client's half-second default does not allow on a busy machine.
pub async fn store_conn() -> redis::aio::ConnectionManager {
    store_conn_at(&redis_url()).await
}

/// [`store_conn`] to the server at `url`.
pub async fn store_conn_at(url: &str) -> redis::aio::ConnectionManager {
    use delayd::redis_conn::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
    let cfg = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    let client = redis::Client::open(url).unwrap();
    client
        .get_connection_manager_with_config(cfg)
        .await
        .expect("cannot connect to Redis")
}

/// Redis's clock in epoch ms (the clock delayd's scripts use).
pub async fn redis_now_ms(conn: &mut impl redis::aio::ConnectionLike) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1000 + us / 1000
}

/// `ZADD key score member` for many members, pipelined.
pub async fn zadd_many(
    conn: &mut impl redis::aio::ConnectionLike,
    key: &str,
    items: &[(f64, Vec<u8>)],
) {
    for chunk in items.chunks(1000) {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(key);
        for (score, m) in chunk {
            cmd.arg(*score).arg(m.as_slice());
        }
        let _: i64 = cmd.query_async(conn).await.unwrap();
    }
}

/// What a producer writes into a business with tenants for one tenant, in
/// one `MULTI` per 1,000 members (docs/tenants.md): the members into the
/// tenant's set of `key`, the tenant into the index at its earliest due
/// time (`LT`: an earlier entry stays).
pub async fn zadd_tenant(
    conn: &mut impl redis::aio::ConnectionLike,
    key: &str,
    tenant: &str,
    items: &[(f64, Vec<u8>)],
) {
    let f = family(key);
    for chunk in items.chunks(1000) {
        let mut p = redis::pipe();
        p.atomic();
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(f.tenant_set(tenant.as_bytes()));
        for (score, m) in chunk {
            zadd.arg(*score).arg(m.as_slice());
        }
        p.add_command(zadd).ignore();
        let first = chunk.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
        p.cmd("ZADD")
            .arg(f.tenant_index())
            .arg("LT")
            .arg(first)
            .arg(tenant)
            .ignore();
        let () = p.query_async(conn).await.unwrap();
    }
}

/// `ZCARD` of a key.
pub async fn zcard(conn: &mut impl redis::aio::ConnectionLike, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

/// The members of the sorted sets `keys` together, read in one `MULTI`:
/// a member moving between them meanwhile (claimed from the key into the
/// in-flight set, or handed back) is counted once, as `ZCARD`s in a row
/// would not. One server's connection: a cluster's does not take `MULTI`.
pub async fn zcard_all(conn: &mut redis::aio::MultiplexedConnection, keys: &[&str]) -> u64 {
    let mut p = redis::pipe();
    p.atomic();
    for k in keys {
        p.zcard(*k);
    }
    let sizes: Vec<u64> = p.query_async(conn).await.unwrap();
    sizes.iter().sum()
}

/// Every helper key of `key`, as delayd names them.
pub fn family(key: &str) -> delayd::store::KeyFamily {
    delayd::store::KeyFamily::new(key)
}

/// Waits until `key` and its in-flight set are both empty; panics after `limit`.
pub async fn wait_drained(conn: &mut impl redis::aio::ConnectionLike, key: &str, limit: Duration) {
    let f = family(key);
    let start = Instant::now();
    loop {
        let p = zcard(conn, &f.pending).await;
        let i = zcard(conn, &f.inflight).await;
        if p == 0 && i == 0 {
            return;
        }
        if start.elapsed() > limit {
            panic!("{key} not drained within {limit:?}: {p} pending, {i} in flight");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no key of the family is left, for tests that kill or cut off
/// the daemon: what a crash leaves (a claim record, retry state) is recovered
/// or swept within a lease plus a sweep interval. Panics after `limit`.
pub async fn wait_family_empty(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    limit: Duration,
) {
    let start = Instant::now();
    loop {
        let mut left = Vec::new();
        for k in family(key).all() {
            let exists: i64 = redis::cmd("EXISTS").arg(k).query_async(conn).await.unwrap();
            if exists == 1 {
                left.push(k.to_string());
            }
        }
        if left.is_empty() {
            return;
        }
        if start.elapsed() > limit {
            panic!("{left:?} still exist {limit:?} after the drain");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes `keys` (one key or several).
pub async fn del(conn: &mut impl redis::aio::ConnectionLike, keys: impl redis::ToRedisArgs) {
    let _: i64 = redis::cmd("DEL").arg(keys).query_async(conn).await.unwrap();
}

/// Deletes every key of the family (for tests that leave members behind).
pub async fn del_family(conn: &mut impl redis::aio::ConnectionLike, key: &str) {
    del(conn, &family(key).all()[..]).await;
}

/// How many keys of the family exist.
pub async fn family_keys_left(conn: &mut impl redis::aio::ConnectionLike, key: &str) -> i64 {
    redis::cmd("EXISTS")
        .arg(&family(key).all()[..])
        .query_async(conn)
        .await
        .unwrap()
}

/// Whether no key of `key`'s family is left, the tenants' index and
/// virtual times included; a key whose check fails counts as left.
pub async fn family_empty(conn: &mut impl redis::aio::ConnectionLike, key: &str) -> bool {
    let f = family(key);
    let tenant_keys = [f.tenant_index(), f.tenant_clock()];
    for k in f
        .all()
        .into_iter()
        .chain(tenant_keys.iter().map(String::as_str))
    {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(k)
            .query_async(conn)
            .await
            .unwrap_or(1);
        if exists != 0 {
            return false;
        }
    }
    true
}

/// Asserts no key of the family is left behind (a clean drain leaves nothing).
pub async fn assert_family_empty(conn: &mut impl redis::aio::ConnectionLike, key: &str) {
    for k in family(key).all() {
        let exists: i64 = redis::cmd("EXISTS").arg(k).query_async(conn).await.unwrap();
        assert_eq!(exists, 0, "{k} still exists after the drain");
    }
}

/// A number from `INFO section`, on the line that starts with `prefix`
/// (0 when there is none).
pub async fn info_field(
    c: &mut redis::aio::MultiplexedConnection,
    section: &str,
    prefix: &str,
) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Calls and microseconds of one command in `INFO commandstats` (commands a
/// script runs count too).
pub async fn command_stats(conn: &mut redis::aio::MultiplexedConnection, cmd: &str) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{cmd}:");
    let Some(line) = info.lines().find(|l| l.starts_with(&prefix)) else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        line[prefix.len()..]
            .split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("calls"), field("usec"))
}

/// Runs one Redis command and returns its reply, for the staging and
/// reading a test does by hand: `query(conn, "ZADD", (key, score, member))`.
pub async fn query<T: redis::FromRedisValue>(
    conn: &mut impl redis::aio::ConnectionLike,
    name: &str,
    args: impl redis::ToRedisArgs,
) -> T {
    redis::cmd(name).arg(args).query_async(conn).await.unwrap()
}

/// Every member of the sorted set `key`, lowest score first.
pub async fn zrange<T: redis::FromRedisValue>(
    conn: &mut impl redis::aio::ConnectionLike,
    key: &str,
) -> Vec<T> {
    query(conn, "ZRANGE", (key, 0, -1)).await
}

/// Whether the server has `WAITAOF` (Redis 7.2 and later, Valkey).
pub async fn has_waitaof(conn: &mut impl redis::aio::ConnectionLike) -> bool {
    let info: Vec<redis::Value> = query(conn, "COMMAND", ("INFO", "WAITAOF")).await;
    !matches!(info.first(), None | Some(redis::Value::Nil))
}

/// Every member of the sorted set `key` with its score, lowest first.
pub async fn zrange_scores<T: redis::FromRedisValue>(
    conn: &mut impl redis::aio::ConnectionLike,
    key: &str,
) -> Vec<(T, f64)> {
    query(conn, "ZRANGE", (key, 0, -1, "WITHSCORES")).await
}

/// The score of `member` in the sorted set `key`, if it is there.
pub async fn zscore(
    conn: &mut impl redis::aio::ConnectionLike,
    key: impl redis::ToRedisArgs,
    member: impl redis::ToRedisArgs,
) -> Option<f64> {
    query(conn, "ZSCORE", (key, member)).await
}

/// `HLEN` of a key.
pub async fn hlen(conn: &mut impl redis::aio::ConnectionLike, key: &str) -> i64 {
    query(conn, "HLEN", key).await
}

/// The reason the dead set of `key`'s family holds for `member`.
pub async fn dead_reason(
    conn: &mut impl redis::aio::ConnectionLike,
    key: &str,
    member: impl redis::ToRedisArgs,
) -> Option<String> {
    query(conn, "HGET", (&family(key).reasons, member)).await
}

/// Polls `check` on a clone of `conn` every 50 ms until it holds; false
/// after `limit`.
pub async fn eventually_redis<F, Fut>(
    conn: &redis::aio::MultiplexedConnection,
    limit: Duration,
    mut check: F,
) -> bool
where
    F: FnMut(redis::aio::MultiplexedConnection) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually(limit, || check(conn.clone())).await
}

/// True once nothing of `key` is pending or in flight; false after `limit`.
pub async fn eventually_settled(
    conn: &redis::aio::MultiplexedConnection,
    key: &str,
    limit: Duration,
) -> bool {
    let f = &family(key);
    eventually_redis(conn, limit, |mut r| async move {
        zcard_all(&mut r, &[&f.pending, &f.inflight]).await == 0
    })
    .await
}

/// True once the sorted set `key` holds `n` members; false after `limit`.
pub async fn eventually_zcard(
    conn: &redis::aio::MultiplexedConnection,
    key: &str,
    n: u64,
    limit: Duration,
) -> bool {
    eventually_redis(
        conn,
        limit,
        |mut r| async move { zcard(&mut r, key).await == n },
    )
    .await
}

/// True once no key of `key`'s family is left; false after `limit`.
pub async fn eventually_family_gone(
    conn: &redis::aio::MultiplexedConnection,
    key: &str,
    limit: Duration,
) -> bool {
    eventually_redis(conn, limit, |mut r| async move {
        family_keys_left(&mut r, key).await == 0
    })
    .await
}

/// Schedules `n` members `PREFIX-0` … due now on Redis's clock; returns them
/// with their scores.
pub async fn schedule_due_now(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    prefix: &str,
    n: usize,
) -> Vec<(f64, Vec<u8>)> {
    let now = redis_now_ms(conn).await as f64;
    let items: Vec<(f64, Vec<u8>)> = (0..n)
        .map(|i| (now, format!("{prefix}-{i}").into_bytes()))
        .collect();
    zadd_many(conn, key, &items).await;
    items
}

/// Asserts that `member` is in `key`'s dead set with a reason that
/// contains `why`.
pub async fn assert_dead_with_reason(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    member: &[u8],
    why: &str,
) {
    let f = family(key);
    assert!(
        zscore(conn, &f.dead, member).await.is_some(),
        "not in the dead set"
    );
    let reason = dead_reason(conn, key, member).await.unwrap_or_default();
    assert!(
        reason.contains(why),
        "the reason should say {why:?}: {reason:?}"
    );
}

/// Schedules each of `members` due at `due_ms` (epoch ms).
pub async fn schedule_at(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    due_ms: i64,
    members: &[&[u8]],
) {
    let items: Vec<(f64, Vec<u8>)> = members
        .iter()
        .map(|m| (due_ms as f64, m.to_vec()))
        .collect();
    zadd_many(conn, key, &items).await;
}

/// What [`watch_released`] saw of each light member.
pub struct Released {
    /// When each left its tenant's set (epoch ms on this host's clock): the
    /// time a claim released it, or a little after.
    pub at: Vec<i64>,
    /// How many of the heavy tenant's members left its set, by claims run
    /// on Redis's clock at or after each light member's due time, while
    /// that member stayed in its own set: claims that passed it over.
    pub passed_over_by: Vec<u64>,
}

/// Watches `ids` (tenant, member) in their tenants' sets of `key` beside
/// the set of the tenant `heavy`, in atomic snapshots a few milliseconds
/// apart, each with Redis's clock. A claim is atomic too, so a claim that
/// ran between two snapshots in which a member was due and still waiting
/// passed it over: counted by heavy's set shrinking. That count does not
/// depend on how loaded the machine is; the times do. Panics if one is
/// still there after 30 s.
pub fn watch_released(
    conn: &redis::aio::MultiplexedConnection,
    key: &str,
    ids: &[(&str, String)],
    heavy: &str,
) -> tokio::task::JoinHandle<Released> {
    let f = family(key);
    let heavy_set = f.tenant_set(heavy.as_bytes());
    let sets: Vec<(Vec<u8>, String)> = ids
        .iter()
        .map(|(tenant, id)| (f.tenant_set(tenant.as_bytes()), id.clone()))
        .collect();
    let mut r = conn.clone();
    tokio::spawn(async move {
        let mut at: Vec<Option<i64>> = vec![None; sets.len()];
        let mut passed_over_by = vec![0u64; sets.len()];
        // Heavy's size at the last snapshot in which each was due and waiting.
        let mut waiting_beside: Vec<Option<u64>> = vec![None; sets.len()];
        let start = Instant::now();
        while at.iter().any(Option::is_none) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "not all released within 30 s"
            );
            let mut pipe = redis::pipe();
            pipe.atomic().cmd("TIME").zcard(&heavy_set);
            for (set, id) in &sets {
                pipe.zscore(set, id);
            }
            let mut v: Vec<redis::Value> = pipe.query_async(&mut r).await.unwrap();
            let scores: Vec<Option<f64>> = v
                .split_off(2)
                .into_iter()
                .map(|s| redis::from_redis_value(s).unwrap())
                .collect();
            let mut v = v.into_iter();
            let (secs, micros): (u64, u64) = redis::from_redis_value(v.next().unwrap()).unwrap();
            let heavy_left: u64 = redis::from_redis_value(v.next().unwrap()).unwrap();
            let redis_ms = (secs * 1000 + micros / 1000) as f64;
            let now = wall_ms();
            for (i, score) in scores.iter().enumerate() {
                match score {
                    None if at[i].is_none() => at[i] = Some(now),
                    Some(due) if *due <= redis_ms => {
                        if let Some(before) = waiting_beside[i] {
                            passed_over_by[i] += before.saturating_sub(heavy_left);
                        }
                        waiting_beside[i] = Some(heavy_left);
                    }
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Released {
            at: at.into_iter().flatten().collect(),
            passed_over_by,
        }
    })
}

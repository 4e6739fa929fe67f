//! The lateness phase: members written at a steady rate, each timed from its
//! due time to the consumer.

use super::*;

/// Redis's clock minus this machine's, in ms, so lateness compares like with like.
pub(super) async fn clock_offset_ms(redis: &mut RedisConn) -> Result<f64, BenchError> {
    let mut best: Option<(f64, f64)> = None;
    for _ in 0..5 {
        let t0 = wall_ms_f();
        let (s, us): (i64, i64) = redis::cmd("TIME")
            .query_async(redis)
            .await
            .map_err(|e| fail("redis")(e.to_string()))?;
        let t1 = wall_ms_f();
        let rtt = t1 - t0;
        let off = (s as f64 * 1000.0 + us as f64 / 1000.0) - (t0 + t1) / 2.0;
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, off));
        }
    }
    Ok(best.map(|(_, o)| -o).unwrap_or(0.0))
}

/// A producer that, every 10 ms, schedules the members due one second later
/// at `rate` per second, member `i` into shard `i mod M`; in id mode ids
/// with their bodies in the shard's `{K}:body`, in one transaction per
/// shard. Returns how many it scheduled.
pub(super) async fn lateness_phase(
    redis: &mut RedisConn,
    fams: &[KeyFamily],
    id_mode: bool,
    rate: u32,
    secs: u64,
    size: usize,
) -> Result<usize, BenchError> {
    let (s, us): (i64, i64) = redis::cmd("TIME")
        .query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))?;
    let t0 = s * 1000 + us / 1000 + 1000;
    let total = (rate as u64 * secs) as usize;
    let spacing = 1000.0 / rate as f64;
    let shards = fams.len().max(1);
    let started = Instant::now();
    let mut next = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while next < total {
        tick.tick().await;
        // Everything due within the next second (of the schedule) is added now.
        let horizon = started.elapsed().as_millis() as f64 + 1000.0;
        let (mut zadds, mut hsets): (Vec<_>, Vec<_>) = fams.iter().map(writes_to).unzip();
        let mut any = vec![false; shards];
        while next < total && (next as f64 * spacing) <= horizon {
            let due = t0 + (next as f64 * spacing) as i64;
            let s = next % shards;
            // The due time rides in the body too, for businesses that send
            // no headers.
            let body = body_of(&format!("late{due}"), next, size);
            let id = || format!("late-{next}");
            add_member((&mut zadds[s], &mut hsets[s]), id_mode, due, id, body);
            next += 1;
            any[s] = true;
        }
        for ((zadd, hset), any) in zadds.into_iter().zip(hsets).zip(any) {
            if !any {
                continue;
            }
            let mut pipe = redis::pipe();
            pipe.atomic();
            queue_writes(&mut pipe, id_mode, (zadd, hset));
            send_pipe(redis, &pipe).await?;
        }
    }
    // Let the last members come due.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(total)
}

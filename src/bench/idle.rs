//! delayd's Redis commands while nothing is due.

use super::*;

/// Counts, with MONITOR on every master that holds one of `keys`, the
/// commands that name one of them: delayd's own traffic for the business,
/// whatever else the servers are doing.
pub(super) async fn idle_commands(
    redis: &Redis,
    conn: &RedisConn,
    keys: &[String],
    secs: u64,
) -> Result<u64, BenchError> {
    // MONITOR shows one server's commands.
    let masters = conn
        .masters(redis)
        .await
        .map_err(|e| fail("masters")(e.to_string()))?;
    let mut holders: Vec<&crate::redis_conn::Master> = Vec::new();
    for key in keys {
        let slot = crate::keys::slot(key);
        let master = masters
            .iter()
            .find(|m| m.serves(slot))
            .ok_or_else(|| fail("masters")(format!("no master serves slot {slot}")))?;
        if !holders.iter().any(|h| h.addr == master.addr) {
            holders.push(master);
        }
    }
    let mut streams = Vec::new();
    for master in holders {
        let client = conn
            .subscriber(redis, master)
            .map_err(|e| fail("MONITOR")(e.to_string()))?;
        let monitor = client
            .get_async_monitor()
            .await
            .map_err(|e| fail("MONITOR")(e.to_string()))?;
        streams.push(Box::pin(monitor.into_on_message::<String>()));
    }
    let mut lines = futures::stream::select_all(streams);
    let needles: Vec<String> = keys.iter().map(|k| format!("\"{k}\"")).collect();
    let end = tokio::time::sleep(Duration::from_secs(secs));
    tokio::pin!(end);
    let mut count = 0u64;
    loop {
        tokio::select! {
            _ = &mut end => break,
            line = lines.next() => match line {
                // Commands a script runs show up too, tagged "lua"; count the calls.
                Some(l) if !l.contains(" lua]") && needles.iter().any(|n| l.contains(n.as_str())) => count += 1,
                Some(_) => {}
                None => return Err(BenchError::Runtime("bench: MONITOR stream ended".into())),
            }
        }
    }
    Ok(count)
}

//! The light tenants' lateness at delayd's release, on Redis's clock, apart
//! from the wait behind the heavy burst in the broker and the consumer. A
//! watcher takes atomic snapshots every 2 ms: Redis's `TIME`, how many of
//! the heavy burst are still pending, and each light member written and not
//! yet seen gone. A member's release time is the first snapshot without it
//! (at most a snapshot and a round trip late); its lateness counts from its
//! due time, or from its write where that reached Redis later. The watcher
//! runs on a thread and a Redis connection of its own, so the bench's
//! consumer, busy with the burst, does not space its snapshots out. The
//! heavy members that claims moved between two snapshots in which a light member was due and still
//! waiting are counted too: a claim is atomic, so that count is what the
//! fair claim decided, and a stall of the host does not inflate it.

use tokio::sync::mpsc;

use super::*;

/// The most waiting members one snapshot looks at.
const LOOK: usize = 32;

/// A light member written: its set, the member, its due time and the time
/// its write ran (Redis ms).
pub(super) type Written = (Vec<u8>, Vec<u8>, i64, i64);

/// What the watcher saw over a pass.
#[derive(Default)]
pub(super) struct Released {
    /// Each light member's lateness at release, ms, sorted.
    pub late_ms: Vec<f64>,
    /// Heavy members moved by claims that passed a due light member over.
    pub passed_over: u64,
    /// How long after its due time each light write ran, ms, sorted.
    pub write_late_ms: Vec<f64>,
    /// The time between two snapshots, ms, sorted: the measure's grain.
    pub gaps_ms: Vec<f64>,
}

/// A light member the watcher has not yet seen released.
struct Waiting {
    set: Vec<u8>,
    member: Vec<u8>,
    /// Its due time, or its write's where that came later.
    due: i64,
    /// The heavy burst's pending count at the last snapshot that found this
    /// member due and still in its set.
    heavy_then: Option<u64>,
}

/// The burst's members still pending: those of `heavy_set` due at
/// `heavy_due` (the light members are due later, as written).
pub(super) struct Heavy {
    pub set: Vec<u8>,
    pub due: i64,
}

/// [`watch`] on a thread with a runtime and a connection of its own; its
/// outcome arrives on the receiver returned.
pub(super) fn watch_apart(
    client: Redis,
    heavy: Heavy,
    written: mpsc::UnboundedReceiver<Written>,
    closed: tokio::sync::oneshot::Sender<()>,
    limit: Duration,
) -> Result<tokio::sync::oneshot::Receiver<Result<Released, BenchError>>, BenchError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let run = move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fail("watcher")(e.to_string()))?;
        rt.block_on(async {
            let redis = client
                .connect()
                .await
                .map_err(|e| fail("redis")(e.to_string()))?;
            watch(redis, heavy, written, closed, limit).await
        })
    };
    std::thread::Builder::new()
        .name("bench-watcher".into())
        .spawn(move || {
            let _ = tx.send(run());
        })
        .map_err(|e| fail("watcher")(e.to_string()))?;
    Ok(rx)
}

/// Watches the members sent on `written` until the sender is dropped and
/// each has been released; gives up after `limit`. Heavy members stop
/// counting once the sender is dropped, which `closed` answers: the pass
/// then cancels the rest of the burst, which no claim moved.
pub(super) async fn watch(
    mut redis: RedisConn,
    heavy: Heavy,
    mut written: mpsc::UnboundedReceiver<Written>,
    closed: tokio::sync::oneshot::Sender<()>,
    limit: Duration,
) -> Result<Released, BenchError> {
    let mut closed = Some(closed);
    let start = Instant::now();
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut out = Released::default();
    let mut open = true;
    let mut last: Option<i64> = None;
    while open || !waiting.is_empty() {
        if start.elapsed() > limit {
            return Err(fail("redis")(format!(
                "{} light members not released within {} s",
                waiting.len(),
                limit.as_secs()
            )));
        }
        loop {
            match written.try_recv() {
                Ok((set, member, due, visible)) => {
                    out.write_late_ms.push((visible - due).max(0) as f64);
                    waiting.push(Waiting {
                        set,
                        member,
                        due: due.max(visible),
                        heavy_then: None,
                    });
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    if let Some(c) = closed.take() {
                        let _ = c.send(());
                    }
                    break;
                }
            }
        }
        if !waiting.is_empty() {
            // The earliest due first, and a bounded look: where many wait
            // (behind a burst without tenants, released in due order),
            // 500,000 ZSCOREs a second would load the Redis being measured.
            let looked = waiting.len().min(LOOK);
            let (now, heavy_left, scores) =
                snapshot(&mut redis, &heavy, &waiting[..looked]).await?;
            if let Some(then) = last.replace(now) {
                out.gaps_ms.push((now - then) as f64);
            }
            let rest = waiting.split_off(looked);
            let mut kept = Vec::with_capacity(waiting.len() + rest.len());
            for (mut w, score) in waiting.into_iter().zip(scores) {
                match score {
                    None => out.late_ms.push((now - w.due) as f64),
                    Some(_) => {
                        if w.due <= now && open {
                            if let Some(then) = w.heavy_then {
                                out.passed_over += then.saturating_sub(heavy_left);
                            }
                            w.heavy_then = Some(heavy_left);
                        }
                        kept.push(w);
                    }
                }
            }
            kept.extend(rest);
            waiting = kept;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for v in [&mut out.late_ms, &mut out.write_late_ms, &mut out.gaps_ms] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    Ok(out)
}

/// One atomic look: Redis's clock (ms), the heavy members still pending,
/// and each waiting member's score (`None` once released).
async fn snapshot(
    redis: &mut RedisConn,
    heavy: &Heavy,
    waiting: &[Waiting],
) -> Result<(i64, u64, Vec<Option<f64>>), BenchError> {
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("TIME")
        .cmd("ZCOUNT")
        .arg(&heavy.set)
        .arg(heavy.due)
        .arg(heavy.due);
    for w in waiting {
        pipe.zscore(&w.set, &w.member);
    }
    let mut v: Vec<redis::Value> = pipe
        .query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))?;
    let parse = |e: redis::ParsingError| fail("redis")(e.to_string());
    let scores = v
        .split_off(2)
        .into_iter()
        .map(redis::from_redis_value)
        .collect::<Result<Vec<Option<f64>>, _>>()
        .map_err(parse)?;
    let mut v = v.into_iter();
    let mut next = || v.next().unwrap_or(redis::Value::Nil);
    let time: (i64, i64) = redis::from_redis_value(next()).map_err(parse)?;
    let heavy_left: u64 = redis::from_redis_value(next()).map_err(parse)?;
    Ok((super::fair_load::time_ms(time), heavy_left, scores))
}

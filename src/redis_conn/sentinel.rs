//! Following the master Sentinel names, through failovers.

use super::*;

/// The master found through Sentinel, re-resolved after a connection error
/// or a `READONLY` answer (the old master became a replica).
pub(super) struct SentinelConn {
    pub(super) redis: Redis,
    pub(super) current: tokio::sync::Mutex<Option<(u64, MultiplexedConnection)>>,
    /// The master's address while connected, for the keyspace watcher.
    pub(super) master: Mutex<Option<Addr>>,
    /// The last failed resolution: within [`RESOLVE_INTERVAL`] of it,
    /// callers get its error rather than a new round of connections, so
    /// many waiting commands cost the sentinels one round per interval.
    pub(super) failed: Mutex<Option<(std::time::Instant, ConnError)>>,
    /// The sentinel [`SentinelConn::follow`] asks (configured URL index),
    /// kept open: it asks every second.
    pub(super) asker: tokio::sync::Mutex<Option<(usize, MultiplexedConnection)>>,
}

static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How often the master is looked for while none is reachable.
const RESOLVE_INTERVAL: Duration = Duration::from_millis(200);

/// How long a command waits for the sentinels to name a reachable master
/// after the old one went away, rather than failing at once: a failover
/// takes the sentinels' `down-after-milliseconds` plus an election, and a
/// caller that failed would back off for longer than the wait that is left.
/// Only the search for a master is retried, never a command that was sent.
const FAILOVER_WAIT: Duration = RESPONSE_TIMEOUT;

impl SentinelConn {
    pub(super) async fn get(&self) -> Result<(u64, MultiplexedConnection), ConnError> {
        let mut cur = self.current.lock().await;
        if let Some((g, c)) = cur.as_ref() {
            return Ok((*g, c.clone()));
        }
        if let Some((at, e)) = self.failed.lock().ok().and_then(|f| f.clone()) {
            if at.elapsed() < RESOLVE_INTERVAL {
                return Err(e);
            }
        }
        let (addr, c) = match self.redis.resolve_master().await {
            Ok(found) => found,
            Err(e) => {
                if let Ok(mut f) = self.failed.lock() {
                    *f = Some((std::time::Instant::now(), e.clone()));
                }
                return Err(e);
            }
        };
        if let Ok(mut f) = self.failed.lock() {
            *f = None;
        }
        let g = GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut m) = self.master.lock() {
            *m = Some(addr);
        }
        *cur = Some((g, c.clone()));
        Ok((g, c))
    }

    /// [`SentinelConn::get`], retried for up to [`FAILOVER_WAIT`] while no
    /// master is reachable: a command issued during a failover runs on the
    /// new master as soon as the sentinels name it.
    pub(super) async fn get_waiting(&self) -> Result<(u64, MultiplexedConnection), ConnError> {
        let deadline = tokio::time::Instant::now() + FAILOVER_WAIT;
        loop {
            match self.get().await {
                Ok(found) => return Ok(found),
                Err(e) if tokio::time::Instant::now() + RESOLVE_INTERVAL >= deadline => {
                    return Err(e)
                }
                Err(_) => tokio::time::sleep(RESOLVE_INTERVAL).await,
            }
        }
    }

    pub(super) async fn forget(&self, generation: u64) {
        let mut cur = self.current.lock().await;
        if cur.as_ref().is_some_and(|(g, _)| *g == generation) {
            *cur = None;
            if let Ok(mut m) = self.master.lock() {
                *m = None;
            }
        }
    }

    /// Where the sentinels say the master is now: the sentinel asked last
    /// if it still answers, else the first that does.
    pub(super) async fn named_master(&self) -> Result<Addr, ConnError> {
        let mut asker = self.asker.lock().await;
        if let Some((i, c)) = asker.as_mut() {
            match self.redis.ask_sentinel(*i, c).await {
                Ok(addr) => return Ok(addr),
                Err(_) => *asker = None,
            }
        }
        let mut last = None;
        for i in 0..self.redis.infos.len() {
            let found = async {
                let mut c = self.redis.connect_sentinel(i).await?;
                let addr = self.redis.ask_sentinel(i, &mut c).await?;
                Ok::<_, ConnError>((addr, c))
            }
            .await;
            match found {
                Ok((addr, c)) => {
                    *asker = Some((i, c));
                    return Ok(addr);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| ConnError::Settings("no sentinel configured".into())))
    }

    /// Moves to the master the sentinels name, if it is not the one we are
    /// connected to. Commands re-resolve only when they fail, which an idle
    /// process never sees, and a demoted master still answers reads; the
    /// keyspace watcher calls this every second so that its subscription
    /// and the scanners follow a failover within about a second.
    pub(super) async fn follow(&self) -> Result<(), ConnError> {
        let named = self.named_master().await?;
        let current = self.master.lock().ok().and_then(|m| m.clone());
        if current.as_ref() == Some(&named) {
            return Ok(());
        }
        if current.is_none() {
            return self.get().await.map(|_| ());
        }
        // A sentinel that has not heard of the failover yet names a server
        // that is no longer master: resolve_master checks the role.
        let (addr, c) = self.redis.resolve_master().await?;
        let mut cur = self.current.lock().await;
        let Ok(mut master) = self.master.lock() else {
            return Ok(());
        };
        if master.as_ref() != Some(&addr) {
            tracing::info!(master = %addr, "the sentinels name a new master; moving to it");
            let g = GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *cur = Some((g, c));
            *master = Some(addr);
        }
        Ok(())
    }

    pub(super) fn must_reresolve(e: &RedisError) -> bool {
        e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.is_unrecoverable_error()
            || matches!(
                e.code(),
                Some("READONLY") | Some("MASTERDOWN") | Some("LOADING")
            )
    }
}

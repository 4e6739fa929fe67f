//! `delayd bench --intake`: the intake measured against the broker it sits
//! on. Producers publish with `x-delay`, as to the delayed-message plugin;
//! each round times the same messages twice, in one run:
//!
//! - the plain rate: publish → a queue → one consumer acking with
//!   `multiple`, which is the least work the broker does for a message
//!   delayd takes in;
//! - the intake rate: publish → the intake queue → delayd, until every
//!   message is a member of `K` (delays of an hour, so none comes due).
//!
//! Then the end-to-end lateness (publish with `x-delay` → consumer of the
//! target) at a steady rate, and again while a burst is being taken in.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection};

use super::report::{median, percentile, row};
use super::{
    body_of, confirm_channel, declare_bench_queue, drain_confirms, fail, join_publishers,
    memory_usage, rss_kb, start_consumer, wall_ms_f, BenchArgs, BenchError, BenchState, Counter,
    Ctx, Names,
};
use crate::config;
use crate::redis_conn::RedisConn;
use crate::store::KeyFamily;

/// A delay long enough that nothing comes due while a round is timed.
const FAR_MS: i64 = 3_600_000;
/// The delay of the lateness phases' messages.
const NEAR_MS: i64 = 1000;
/// Steady rate of the lateness phases, messages/s.
const STEADY_RATE: u32 = 1000;
/// Messages taken in while the second lateness phase measures.
const BURST: usize = 50_000;
/// Seconds of steady messages coming due during the burst (it takes about
/// two seconds to publish on the reference machine).
const BURST_SECS: u64 = 2;
/// Publishes in flight per producer channel.
const WINDOW: usize = 1024;

/// The intake's names: what producers publish to, what delayd consumes, and
/// the plain queue the broker's own rate is measured on.
struct IntakeNames {
    exchange: String,
    queue: String,
    plain_exchange: String,
    plain_queue: String,
}

impl IntakeNames {
    /// The run's names with `-intake` and `-plain` added.
    fn of(names: &Names) -> IntakeNames {
        IntakeNames {
            exchange: format!("{}-intake", names.exchange),
            queue: format!("{}-intake", names.queue),
            plain_exchange: format!("{}-plain", names.exchange),
            plain_queue: format!("{}-plain", names.queue),
        }
    }
}

/// Runs the intake bench and prints its table.
pub(super) async fn bench(
    ctx: &Ctx<'_>,
    redis: &mut RedisConn,
    state: &mut BenchState,
) -> Result<(), BenchError> {
    let intake = IntakeNames::of(ctx.names);
    state.intake_names = vec![
        (intake.exchange.clone(), intake.queue.clone()),
        (intake.plain_exchange.clone(), intake.plain_queue.clone()),
    ];
    let ch = declare_bench_queue(ctx.amqp, ctx.names).await?;
    crate::amqp::declare_bound_queue(
        &ch,
        &intake.plain_exchange,
        &intake.plain_queue,
        &ctx.names.routing_key,
        FieldTable::default(),
    )
    .await
    .map_err(|e| fail("declare plain queue")(e.to_string()))?;
    let counter = Counter::default();
    start_consumer(ctx.amqp, ctx.names, &counter).await?;

    let extra = ctx.args.business.join("\n");
    let intake_extra = ctx.args.intake_setting.join("\n");
    let toml = format!(
        "{}{}[http]\nlisten = \"off\"\n[log]\nlevel = \"warn\"\n[businesses.bench]\nkey = \"{}\"\nexchange = \"{}\"\n{extra}\n[businesses.bench.intake]\nexchange = \"{}\"\nqueue = \"{}\"\n{intake_extra}\n",
        ctx.cfg.redis.to_toml(),
        ctx.cfg.amqp.to_toml(),
        ctx.names.key,
        ctx.names.exchange,
        intake.exchange,
        intake.queue,
    );
    let (pid, business) = super::start_daemon(ctx.names, state, &toml)?;
    let fams: Vec<KeyFamily> = business.keys().iter().map(|k| KeyFamily::new(k)).collect();
    wait_consumer(ctx.amqp, &intake.queue).await?;

    let r = rounds(ctx.args, ctx.amqp, &intake, ctx.names, redis, &fams).await?;

    eprintln!(
        "bench: lateness at {STEADY_RATE}/s with x-delay {NEAR_MS} ms for {} s ...",
        ctx.args.lateness_secs
    );
    let phase = Phase {
        amqp: ctx.amqp,
        cfg: ctx.cfg,
        intake: &intake,
        names: ctx.names,
        counter: &counter,
        size: ctx.args.size,
    };
    let steady = lateness(&phase, ctx.args.lateness_secs).await?;
    eprintln!("bench: messages coming due while {BURST} are taken in ...");
    let (burst, burst_took) = lateness_under_burst(&phase, &intake.exchange, BURST_SECS).await?;
    eprintln!("bench: the same with the burst sent to a plain queue instead ...");
    let (control, _) = lateness_under_burst(&phase, &intake.plain_exchange, BURST_SECS).await?;
    ch.queue_purge(
        intake.plain_queue.as_str().into(),
        QueuePurgeOptions::default(),
    )
    .await
    .map_err(|e| fail("purge")(e.to_string()))?;
    let rss = rss_kb(pid);
    for f in &fams {
        let _: redis::RedisResult<i64> =
            redis::cmd("DEL").arg(&f.all()[..]).query_async(redis).await;
    }

    report(ctx.args, &r, [&steady, &burst, &control], burst_took, rss);
    let _ = counter.received.load(Ordering::Relaxed);
    Ok(())
}

/// Per-round figures: the broker's own publish-to-consume rate, the
/// intake's publish-to-stored rate, their ratio, and Redis memory per
/// stored message.
#[derive(Default)]
struct Rounds {
    plain: Vec<f64>,
    intake: Vec<f64>,
    ratios: Vec<f64>,
    memory: Vec<f64>,
}

/// Each round: the plain rate, then `n` messages through the intake until
/// stored, measured and deleted.
async fn rounds(
    args: &BenchArgs,
    amqp: &Connection,
    intake: &IntakeNames,
    names: &Names,
    redis: &mut RedisConn,
    fams: &[KeyFamily],
) -> Result<Rounds, BenchError> {
    let n = args.messages;
    let mut r = Rounds::default();
    for round in 1..=args.rounds.max(1) {
        let plain = plain_rate(amqp, intake, names, n, args.size).await?;
        let start = Instant::now();
        publish(
            amqp,
            &intake.exchange,
            &names.routing_key,
            n,
            args.size,
            None,
            |_| FAR_MS,
        )
        .await?;
        wait_stored(redis, fams, n, Duration::from_secs(120)).await?;
        let rate = n as f64 / start.elapsed().as_secs_f64();
        r.memory
            .push(memory_per_task(redis, fams).await? / n as f64);
        for f in fams {
            let _: i64 = redis::cmd("DEL")
                .arg(&f.pending)
                .arg(&f.body)
                .query_async(redis)
                .await
                .map_err(|e| fail("redis")(e.to_string()))?;
        }
        eprintln!(
            "bench: round {round}: plain publish->consume {plain:.0} msg/s, intake {rate:.0} msg/s, ratio {:.3}",
            rate / plain
        );
        r.plain.push(plain);
        r.intake.push(rate);
        r.ratios.push(rate / plain);
    }
    Ok(r)
}

/// Prints the table: rates, memory, the three lateness phases (steady,
/// under a burst, the burst elsewhere), the burst's time and the RSS.
fn report(
    args: &BenchArgs,
    r: &Rounds,
    [steady, burst, control]: [&Lateness; 3],
    burst_took: Duration,
    rss: (u64, u64),
) {
    super::report::heading(&format!(
        "delayd bench --intake: {} x {}-byte persistent messages with x-delay, {} rounds, one run",
        args.messages,
        args.size,
        r.ratios.len()
    ));
    row(
        "plain publish -> consume",
        &format!("{:.0} msg/s", median(&r.plain)),
        "median; confirmed publisher, one consumer acking with multiple",
    );
    row(
        "intake (publish -> stored)",
        &format!("{:.0} msg/s", median(&r.intake)),
        &format!("median; rounds {}", super::report::join_rates(&r.intake)),
    );
    row(
        "intake / plain",
        &format!("{:.3}", median(&r.ratios)),
        &format!(
            "median of per-round ratios {}",
            super::report::join_ratios(&r.ratios)
        ),
    );
    row(
        "Redis memory per pending message",
        &format!("{:.0} B", median(&r.memory)),
        &format!(
            "MEMORY USAGE of K and {{K}}:body, {}-byte bodies, x-delay header, no message_id",
            args.size
        ),
    );
    lateness_row(&format!("lateness at {STEADY_RATE}/s (x-delay)"), steady);
    lateness_row(&format!("  due while {BURST} are taken in"), burst);
    lateness_row("  the same, burst to a plain queue", control);
    row(
        "  burst publish time",
        &format!("{:.1} s", burst_took.as_secs_f64()),
        &format!(
            "{BURST} messages with x-delay 1 h, published while the {BURST_SECS} s above came due"
        ),
    );
    row(
        "delayd RSS",
        &format!("{:.1} MB", rss.1 as f64 / 1024.0),
        &format!("peak {:.1} MB", rss.0 as f64 / 1024.0),
    );
}

/// What the lateness phases publish with and measure by.
struct Phase<'a> {
    amqp: &'a Connection,
    cfg: &'a config::Config,
    intake: &'a IntakeNames,
    names: &'a Names,
    counter: &'a Counter,
    size: usize,
}

/// Lateness samples (ms, sorted) and how many were published.
struct Lateness {
    sorted: Vec<f64>,
    sent: usize,
}

fn lateness_row(label: &str, l: &Lateness) {
    if l.sorted.is_empty() {
        row(label, "no samples", "");
        return;
    }
    row(
        label,
        &format!("p99 {:.1} ms", percentile(&l.sorted, 0.99)),
        &format!(
            "publish + x-delay -> consumer; p50 {:.1} ms, max {:.1} ms, {} of {} received",
            percentile(&l.sorted, 0.50),
            l.sorted.last().copied().unwrap_or(0.0),
            l.sorted.len(),
            l.sent
        ),
    );
}

/// Publishes `n` messages with `x-delay = delay(i)` to `exchange` over two
/// confirm channels, at `rate` messages/s when given, else as fast as the
/// confirms allow. Bodies carry their due time (`late<ms>-`) so the
/// consumer can tell how late each arrived.
async fn publish(
    amqp: &Connection,
    exchange: &str,
    routing_key: &str,
    n: usize,
    size: usize,
    rate: Option<u32>,
    delay: impl Fn(usize) -> i64 + Copy + Send + 'static,
) -> Result<(), BenchError> {
    let channels = if rate.is_some() { 1 } else { 2 };
    let per = n.div_ceil(channels);
    let mut tasks = Vec::new();
    for c in 0..channels {
        let ch = confirm_channel(amqp).await?;
        let (exchange, rk) = (exchange.to_string(), routing_key.to_string());
        let range = (c * per)..((c + 1) * per).min(n);
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut inflight = FuturesUnordered::new();
            for i in range {
                if let Some(r) = rate {
                    let at = Duration::from_secs_f64(i as f64 / r as f64);
                    if let Some(wait) = at.checked_sub(started.elapsed()) {
                        tokio::time::sleep(wait).await;
                    }
                }
                while inflight.len() >= WINDOW {
                    if let Some(r) = inflight.next().await {
                        r?;
                    }
                }
                let ms = delay(i);
                let due = wall_ms_f() as i64 + ms;
                let body = body_of(&format!("late{due}"), i, size);
                let mut h = FieldTable::default();
                h.insert("x-delay".into(), AMQPValue::LongLongInt(ms));
                let props = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_headers(h);
                let to = (exchange.as_str(), rk.as_str());
                let options = BasicPublishOptions::default();
                super::publish_confirmed(&ch, &mut inflight, to, options, (&body, props)).await?;
            }
            drain_confirms(&ch, &mut inflight).await
        }));
    }
    join_publishers(tasks, "publisher").await?;
    Ok(())
}

/// The broker's own rate for the messages the intake takes: published as
/// the intake's are, consumed from a plain queue by a consumer that acks
/// with `multiple` under the intake's default prefetch. Returns messages/s.
async fn plain_rate(
    amqp: &Connection,
    intake: &IntakeNames,
    names: &Names,
    n: usize,
    size: usize,
) -> Result<f64, BenchError> {
    let prefetch = crate::config::intake_settings::defaults::PREFETCH;
    let ch = super::consumer_channel(amqp, prefetch).await?;
    let mut consumer = ch
        .basic_consume(
            intake.plain_queue.as_str().into(),
            "delayd-bench-plain".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| fail("consume")(e.to_string()))?;
    let start = Instant::now();
    let publisher = publish(
        amqp,
        &intake.plain_exchange,
        &names.routing_key,
        n,
        size,
        None,
        |_| FAR_MS,
    );
    let consume = async {
        let mut got = 0usize;
        while got < n {
            let Some(Ok(d)) = consumer.next().await else {
                return Err(fail("plain consumer")("the consumer ended".into()));
            };
            got += 1;
            if got.is_multiple_of(100) || got == n {
                d.ack(BasicAckOptions { multiple: true })
                    .await
                    .map_err(|e| fail("ack")(e.to_string()))?;
            }
        }
        Ok(())
    };
    let (p, c) = tokio::join!(publisher, consume);
    p?;
    c?;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let _ = ch.close(200, "done".into()).await;
    Ok(rate)
}

/// Publishes at [`STEADY_RATE`] for `secs` with `x-delay` [`NEAR_MS`] and
/// returns how late each arrived at the target's consumer.
async fn lateness(p: &Phase<'_>, secs: u64) -> Result<Lateness, BenchError> {
    let sent = (STEADY_RATE as u64 * secs.max(1)) as usize;
    let steady = publish(
        p.amqp,
        &p.intake.exchange,
        &p.names.routing_key,
        sent,
        p.size,
        Some(STEADY_RATE),
        |_| NEAR_MS,
    );
    record(p.counter, sent, steady).await
}

/// How late messages come due while [`BURST`] others are being taken in:
/// [`STEADY_RATE`] × `secs` messages are published ahead, due one per
/// millisecond from a moment T; at T − 200 ms the burst starts, at full
/// speed, to `burst_to`: the intake exchange, or for comparison a plain
/// queue's, which costs the broker the same publishes without delayd.
/// The intake must not hold up delivery. Also returns how long the
/// burst took to publish, so the overlap can be read.
async fn lateness_under_burst(
    p: &Phase<'_>,
    burst_to: &str,
    secs: u64,
) -> Result<(Lateness, Duration), BenchError> {
    let sent = (STEADY_RATE as u64 * secs.max(1)) as usize;
    let t = wall_ms_f() as i64 + 3000;
    let spacing = 1000.0 / STEADY_RATE as f64;
    let ahead = publish(
        p.amqp,
        &p.intake.exchange,
        &p.names.routing_key,
        sent,
        p.size,
        None,
        move |i| t + (i as f64 * spacing) as i64 - wall_ms_f() as i64,
    );
    // The burst runs on a thread, runtime and connection of its own, as
    // another producer would: the consumer timing the lateness must not
    // wait behind its publishes in this process.
    let amqp_cfg = p.cfg.amqp.clone();
    let exchange = burst_to.to_string();
    let size = p.size;
    let flood = tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| fail("burst runtime")(e.to_string()))?;
        rt.block_on(async {
            let conn = crate::amqp::connect(&amqp_cfg, "delayd bench burst")
                .await
                .map_err(|e| fail("burst connection")(e.to_string()))?;
            let wait = (t - 200 - wall_ms_f() as i64).max(0) as u64;
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let start = Instant::now();
            publish(&conn, &exchange, "bench-burst", BURST, size, None, |_| {
                FAR_MS
            })
            .await?;
            let took = start.elapsed();
            let _ = conn.close(200, "done".into()).await;
            Ok::<Duration, BenchError>(took)
        })
    });
    let (l, f) = tokio::join!(record(p.counter, sent, ahead), flood);
    let took = f.map_err(|e| fail("burst")(e.to_string()))??;
    Ok((l?, took))
}

/// Runs `publishing`, then waits up to 30 s for `sent` lateness samples.
async fn record(
    counter: &Counter,
    sent: usize,
    publishing: impl std::future::Future<Output = Result<(), BenchError>>,
) -> Result<Lateness, BenchError> {
    if let Ok(mut v) = counter.lateness_ms.lock() {
        v.clear();
    }
    counter.record.store(true, Ordering::Relaxed);
    publishing.await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while counter.lateness_ms.lock().map(|v| v.len()).unwrap_or(0) < sent
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    counter.record.store(false, Ordering::Relaxed);
    let mut sorted: Vec<f64> = counter
        .lateness_ms
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    sorted.sort_by(|a, b| a.total_cmp(b));
    Ok(Lateness { sorted, sent })
}

/// Waits until delayd consumes `queue` (it declares it on start).
async fn wait_consumer(amqp: &Connection, queue: &str) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(n)) = crate::intake::topology::consumers(amqp, queue).await {
            if n > 0 {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(fail("intake")(format!(
        "delayd did not consume {queue} within 30 s"
    )))
}

/// Waits until the keys hold `n` members in all.
async fn wait_stored(
    redis: &mut RedisConn,
    fams: &[KeyFamily],
    n: usize,
    limit: Duration,
) -> Result<(), BenchError> {
    let start = Instant::now();
    loop {
        let mut total = 0usize;
        for f in fams {
            let c: usize = redis::cmd("ZCARD")
                .arg(&f.pending)
                .query_async(redis)
                .await
                .map_err(|e| fail("redis")(e.to_string()))?;
            total += c;
        }
        if total >= n {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(fail("intake")(format!(
                "only {total} of {n} stored within {limit:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Bytes Redis holds for the keys' pending sets and body hashes.
async fn memory_per_task(redis: &mut RedisConn, fams: &[KeyFamily]) -> Result<f64, BenchError> {
    let mut bytes = 0u64;
    for f in fams {
        for k in [&f.pending, &f.body] {
            bytes += memory_usage(redis, k, 0).await?;
        }
    }
    Ok(bytes as f64)
}

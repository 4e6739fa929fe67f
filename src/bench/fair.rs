//! `delayd bench --fair`: one heavy tenant's burst beside light tenants
//! writing members due at once, on a business with tenants and on the same
//! load without tenants, first with no `max_rate` and then with one; then
//! two saturated tenants weighted 3:1. One delayd serves every business of
//! the run, each pass writing into one of them while the others idle.

use super::fair_load::{self, Target};
use super::fair_release;
use super::fair_report::{self, Burst, Capped, Pass, Share};
use super::fair_sizes::FairSizes;
use super::*;

/// The run's businesses, in the order the config lists them.
const BUSINESSES: [(&str, bool, bool); 7] = [
    // (name, tenants, max_rate)
    ("plain", false, false),
    ("tenants", true, false),
    ("plain_rated", false, true),
    ("tenants_rated", true, true),
    ("tenants_window", true, false),
    ("weights", true, false),
    ("capped", true, false),
];

/// Weights of the weights pass: tenant `a` 3, tenant `b` 1.
const WEIGHTS: (u32, u32) = (3, 1);

/// What every pass shares: the consumer and the run's names.
struct Setup<'a> {
    ctx: &'a Ctx<'a>,
    counter: Counter,
    sizes: &'a FairSizes,
    light_tenants: Vec<String>,
}

/// Runs the passes in order and prints the table.
pub(super) async fn bench(
    ctx: &Ctx<'_>,
    redis: &mut RedisConn,
    state: &mut BenchState,
) -> Result<(), BenchError> {
    let sizes = &ctx.args.fair_sizes;
    let s = setup(ctx, state).await?;
    let mut passes = Vec::new();
    for (name, tenants, rated) in &BUSINESSES[..5] {
        let target = target(ctx, name, *tenants);
        eprintln!("bench: burst pass on {name} ...");
        let burst = burst_pass(&s, redis, &target).await?;
        passes.push(Pass {
            tenants: *tenants,
            max_rate: rated.then_some(sizes.max_rate),
            window: (*name == "tenants_window").then_some(sizes.window),
            burst,
        });
    }
    eprintln!("bench: weights {}:{} ...", WEIGHTS.0, WEIGHTS.1);
    let share = weights_pass(&s, redis, &target(ctx, "weights", true)).await?;
    eprintln!("bench: a tenant capped at {} ...", capped_rate(sizes));
    let capped = capped_pass(&s, redis, &target(ctx, "capped", true)).await?;
    fair_report::print(sizes, ctx.args.size, &passes, (&share, &capped));
    Ok(())
}

/// The business `name` of the run as a target.
fn target(ctx: &Ctx<'_>, name: &str, tenants: bool) -> Target {
    Target {
        fam: KeyFamily::new(&format!("{}:{name}", ctx.names.key)),
        tenants,
    }
}

/// Declares the bench queue, starts its consumer and delayd on the run's
/// businesses, and notes every key they may leave for the clean-up.
async fn setup<'a>(ctx: &'a Ctx<'a>, state: &mut BenchState) -> Result<Setup<'a>, BenchError> {
    let sizes = &ctx.args.fair_sizes;
    declare_bench_queue(ctx.amqp, ctx.names).await?;
    let counter = Counter::default();
    start_consumer(ctx.amqp, ctx.names, &counter).await?;
    start_daemon(ctx.names, state, &config_toml(ctx))?;
    let light_tenants: Vec<String> = (0..sizes.light_tenants).map(|i| format!("l{i}")).collect();
    let mut named = light_tenants.clone();
    named.extend(["heavy", "a", "b", "c", "u"].map(String::from));
    state.keys.clear();
    for (name, tenants, _) in BUSINESSES {
        let t = target(ctx, name, tenants);
        state.keys.push(t.fam.pending.clone());
        state.extra_keys.extend(t.extra_keys(&named));
    }
    // Let delayd start its scanners before the first pass.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(Setup {
        ctx,
        counter,
        sizes,
        light_tenants,
    })
}

/// The temporary config: the server sections, then one business per pass,
/// all publishing to the bench queue.
fn config_toml(ctx: &Ctx<'_>) -> String {
    let sizes = &ctx.args.fair_sizes;
    let extra = ctx.args.business.join("\n");
    let mut toml = format!(
        "{}{}[http]\nlisten = \"off\"\n[log]\nlevel = \"warn\"\n",
        ctx.cfg.redis.to_toml(),
        ctx.cfg.amqp.to_toml()
    );
    for (name, tenants, rated) in BUSINESSES {
        toml.push_str(&format!(
            "[businesses.{name}]\nkey = \"{}:{name}\"\nexchange = \"{}\"\nrouting_key = \"{}\"\n{extra}\n",
            ctx.names.key, ctx.names.exchange, ctx.names.routing_key
        ));
        if tenants {
            toml.push_str("tenants = true\n");
        }
        if rated {
            toml.push_str(&format!("max_rate = {}\n", sizes.max_rate));
        }
        if name == "tenants_window" {
            toml.push_str(&format!("tenant_window = {}\n", sizes.window));
        }
        if name == "capped" {
            toml.push_str(&format!(
                "[businesses.{name}.tenant_max_rate]\nc = {}\n",
                capped_rate(sizes)
            ));
        }
        if name == "weights" {
            toml.push_str(&format!(
                "[businesses.{name}.tenant_weights]\na = {}\nb = {}\n",
                WEIGHTS.0, WEIGHTS.1
            ));
        }
    }
    toml
}

/// Starts recording classed lateness afresh, and returns this machine's
/// clock minus Redis's and a due time far enough ahead to stage `n`
/// members before it.
async fn start_pass(
    s: &Setup<'_>,
    redis: &mut RedisConn,
    n: usize,
) -> Result<(f64, i64), BenchError> {
    wait_consumed(&s.counter, Duration::from_secs(60)).await;
    if let Ok(mut v) = s.counter.classed_ms.lock() {
        v.clear();
    }
    s.counter.record.store(true, Ordering::Relaxed);
    let offset = clock_offset_ms(redis).await?;
    // Staging writes well over 50,000 members a second even here.
    let due = fair_load::redis_now_ms(redis).await? + 2000 + (n / 50) as i64;
    Ok((offset, due))
}

/// Sleeps until `due` (Redis's clock) has passed on this machine's clock.
async fn sleep_until_due(due: i64, offset: f64) {
    let wait = due as f64 + offset - wall_ms_f();
    if wait > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(wait / 1000.0)).await;
    }
}

/// Ends a pass: waits for everything to be delivered, stops recording,
/// and returns the lateness of each class, in ms on Redis's clock, sorted.
async fn end_pass(
    s: &Setup<'_>,
    redis: &mut RedisConn,
    target: &Target,
    offset: f64,
) -> Result<std::collections::BTreeMap<u8, Vec<f64>>, BenchError> {
    fair_load::wait_idle(redis, target, Duration::from_secs(300)).await?;
    wait_consumed(&s.counter, Duration::from_secs(60)).await;
    s.counter.record.store(false, Ordering::Relaxed);
    let mut by_class = std::collections::BTreeMap::<u8, Vec<f64>>::new();
    for (class, late) in s
        .counter
        .classed_ms
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default()
    {
        by_class.entry(class).or_default().push(late - offset);
    }
    for v in by_class.values_mut() {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    Ok(by_class)
}

/// The heavy burst, due at once, while the light tenants write members due
/// as they are written for the pass's seconds; then what is left of the
/// burst is cancelled.
async fn burst_pass(
    s: &Setup<'_>,
    redis: &mut RedisConn,
    target: &Target,
) -> Result<Burst, BenchError> {
    let z = s.sizes;
    let (offset, due) = start_pass(s, redis, z.heavy).await?;
    let heavy = ("heavy", b'h');
    fair_load::burst(redis, target, heavy, z.heavy, due, s.ctx.args.size).await?;
    let staged_late = fair_load::redis_now_ms(redis).await? - due;
    sleep_until_due(due, offset).await;
    let load = (z.light_rate, z.secs);
    let size = s.ctx.args.size;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let heavy_set = fair_release::Heavy {
        set: target.set("heavy"),
        due,
    };
    let limit = Duration::from_secs(300);
    let (closed_tx, closed) = tokio::sync::oneshot::channel();
    let client = s.ctx.client.clone();
    let watcher = fair_release::watch_apart(client, heavy_set, rx, closed_tx, limit)?;
    let tenants = &s.light_tenants;
    let written = fair_load::light(redis, target, tenants, load, (size, offset), &tx).await;
    drop(tx);
    let written = written?;
    // The watcher stops counting heavy members before the cancel below.
    let _ = closed.await;
    let cancelled = fair_load::cancel_rest(redis, target, "heavy", due).await?;
    let mut late = end_pass(s, redis, target, offset).await?;
    let released = watcher.await.map_err(|e| fail("bench")(e.to_string()))??;
    Ok(Burst {
        heavy: late.remove(&b'h').unwrap_or_default(),
        light: late.remove(&b'l').unwrap_or_default(),
        released,
        light_written: written,
        cancelled,
        staged_late: staged_late.max(0),
        secs: z.secs,
    })
}

/// Starts a pass of two saturated tenants, each with its burst all due at
/// once, and waits until it is due; returns [`start_pass`]'s offset and due.
async fn saturated_pair(
    s: &Setup<'_>,
    redis: &mut RedisConn,
    target: &Target,
    pair: [(&str, u8); 2],
) -> Result<(f64, i64), BenchError> {
    let (n, size) = (s.sizes.saturated, s.ctx.args.size);
    let (offset, due) = start_pass(s, redis, 2 * n).await?;
    for tenant in pair {
        fair_load::burst(redis, target, tenant, n, due, size).await?;
    }
    sleep_until_due(due, offset).await;
    Ok((offset, due))
}

/// Two saturated tenants weighted 3:1, both due at once; the pass ends when
/// either has drained (or after its seconds), the rest cancelled.
async fn weights_pass(
    s: &Setup<'_>,
    redis: &mut RedisConn,
    target: &Target,
) -> Result<Share, BenchError> {
    let (offset, due) = saturated_pair(s, redis, target, [("a", b'a'), ("b", b'b')]).await?;
    tokio::time::sleep(Duration::from_secs(s.sizes.secs)).await;
    for tenant in ["a", "b"] {
        fair_load::cancel_rest(redis, target, tenant, due).await?;
    }
    let mut late = end_pass(s, redis, target, offset).await?;
    Ok(Share::new(
        late.remove(&b'a').unwrap_or_default(),
        late.remove(&b'b').unwrap_or_default(),
        WEIGHTS,
        s.sizes.secs,
    ))
}

/// The capped pass's tenant `max_rate`: half the business `max_rate` of
/// the burst passes.
fn capped_rate(sizes: &FairSizes) -> u32 {
    (sizes.max_rate / 2).max(1)
}

/// Two saturated tenants due at once, `c` with a tenant `max_rate` and `u`
/// without: each one's release rate read from its set's size every 20 ms
/// for the pass's seconds; then the rest is cancelled.
async fn capped_pass(
    s: &Setup<'_>,
    redis: &mut RedisConn,
    target: &Target,
) -> Result<Capped, BenchError> {
    let n = s.sizes.saturated;
    let (offset, due) = saturated_pair(s, redis, target, [("c", b'c'), ("u", b'u')]).await?;
    let samples = fair_load::set_sizes(redis, target, &["c", "u"], s.sizes.secs).await?;
    for tenant in ["c", "u"] {
        fair_load::cancel_rest(redis, target, tenant, due).await?;
    }
    end_pass(s, redis, target, offset).await?;
    let of = |i: usize| -> Vec<(f64, i64)> { samples.iter().map(|(t, n)| (*t, n[i])).collect() };
    Ok(Capped {
        rate: capped_rate(s.sizes),
        released: fair_report::released_rate(&of(0), n as i64, 1.0),
        uncapped: fair_report::released_rate(&of(1), n as i64, 0.0),
    })
}

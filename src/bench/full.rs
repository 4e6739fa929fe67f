//! The default run (neither `--intake` nor `--scale`): the raw publisher's
//! best settings, rounds of ceiling, same-format publish and delayd's drain
//! (with the shard comparison when asked), the common recipe, lateness, idle
//! cost and far-future writes, then one table.

use lapin::Channel;

use super::*;

/// What the phases share: the bench queue, its consumer and the bench
/// business's delayd.
struct Setup {
    ch: Channel,
    counter: Counter,
    pid: u32,
    /// The bench business as delayd loaded it (its message format, member
    /// mode and keys).
    business: config::Business,
    keys: Vec<String>,
    fams: Vec<KeyFamily>,
    watch: CpuWatch,
}

/// The raw publisher's best channels and window.
#[derive(Clone, Copy)]
struct Best {
    channels: usize,
    window: usize,
}

/// Lateness samples (ms, sorted) of the lateness phase.
struct Lateness {
    ms: Vec<f64>,
    scheduled: usize,
}

/// What the run measured, for the table.
struct Results {
    best: Best,
    rounds: Rounds,
    compare: Option<shards::ShardCompare>,
    recipe: f64,
    lateness: Lateness,
    idle_per_s: f64,
    far: far_writes::FarWrites,
    rss_after_drain: (u64, u64),
    rss_end: (u64, u64),
}

/// Runs every phase in order and prints the table.
pub(super) async fn bench(
    ctx: &Ctx<'_>,
    redis: &mut RedisConn,
    state: &mut BenchState,
) -> Result<(), BenchError> {
    let s = setup(ctx, redis, state).await?;
    let mut compare = match ctx.args.compare_shards {
        Some(n) => Some(shard_compare(ctx.args, state, &s, n as usize)?),
        None => None,
    };
    let best = best_publisher(ctx.args, ctx.names, ctx.amqp, &s).await?;
    let rounds = drain_rounds(
        ctx.args,
        ctx.names,
        redis,
        ctx.amqp,
        &s,
        best,
        compare.as_mut(),
    )
    .await?;
    let rss_after_drain = rss_kb(s.pid);
    if ctx.args.no_consumer {
        start_consumer(ctx.amqp, ctx.names, &s.counter).await?;
    }
    eprintln!("bench: the common recipe (one member per Lua call, no confirms) ...");
    let recipe = common_recipe_drain(
        redis,
        ctx.amqp,
        ctx.names,
        &s.keys[0],
        ctx.args.messages,
        ctx.args.size,
    )
    .await?;
    wait_consumed(&s.counter, Duration::from_secs(60)).await;
    let lateness = lateness(ctx.args, redis, &s).await?;
    eprintln!(
        "bench: idle Redis commands over {} s ...",
        ctx.args.idle_secs
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = idle_commands(ctx.client, redis, &s.keys, ctx.args.idle_secs.max(1)).await?;
    eprintln!("bench: producers writing {FAR_RATE} members/s due in a week for {FAR_SECS} s ...");
    let far = far_writes::run(redis, &s.fams, FAR_RATE, FAR_SECS).await?;
    let results = Results {
        best,
        rounds,
        compare,
        recipe,
        lateness,
        idle_per_s: idle as f64 / ctx.args.idle_secs.max(1) as f64,
        far,
        rss_after_drain,
        rss_end: rss_kb(s.pid),
    };
    print_table(ctx.args, &s, &results);
    Ok(())
}

/// Declares the bench queue, starts its consumer (unless `--no-consumer`)
/// and delayd on a temporary business, as users run it.
async fn setup(
    ctx: &Ctx<'_>,
    redis: &mut RedisConn,
    state: &mut BenchState,
) -> Result<Setup, BenchError> {
    let ch = declare_bench_queue(ctx.amqp, ctx.names).await?;
    // One consumer for every phase, so the broker does the same work in
    // each; with --no-consumer, only from the common recipe on, and the
    // queue is purged between phases instead.
    let counter = Counter::default();
    if !ctx.args.no_consumer {
        start_consumer(ctx.amqp, ctx.names, &counter).await?;
    }
    let extra = ctx.args.business.join("\n");
    let mut toml = format!(
        "{}{}[http]\nlisten = \"off\"\n[log]\nlevel = \"warn\"\n[businesses.bench]\nkey = \"{}\"\nexchange = \"{}\"\nrouting_key = \"{}\"\n{extra}\n",
        ctx.cfg.redis.to_toml(),
        ctx.cfg.amqp.to_toml(),
        ctx.names.key,
        ctx.names.exchange,
        ctx.names.routing_key
    );
    if let Some(shards) = ctx.args.compare_shards {
        toml.push_str(&format!(
            "[businesses.bench_sharded]\nkey = \"{}:sharded\"\nexchange = \"{}\"\nrouting_key = \"{}\"\nshards = {shards}\n{extra}\n",
            ctx.names.key, ctx.names.exchange, ctx.names.routing_key
        ));
    }
    let (pid, business) = start_daemon(ctx.names, state, &toml)?;
    // With `shards = M` delayd reads M keys: the backlog is spread over them
    // as producers would spread it.
    let keys = business.keys();
    state.keys = keys.clone();
    let fams = keys.iter().map(|k| KeyFamily::new(k)).collect();
    let watch = CpuWatch {
        redis: redis_processes(ctx.client, redis).await,
        daemon: pid,
    };
    Ok(Setup {
        ch,
        counter,
        pid,
        business,
        keys,
        fams,
        watch,
    })
}

/// The comparison's second business, as the started delayd loaded it; its
/// keys join the ones cleaned up at the end.
fn shard_compare(
    args: &BenchArgs,
    state: &mut BenchState,
    s: &Setup,
    shards: usize,
) -> Result<shards::ShardCompare, BenchError> {
    let path = state
        .config_path
        .clone()
        .ok_or_else(|| BenchError::Usage("bench: no bench config".into()))?;
    let loaded =
        config::load(&path).map_err(|e| BenchError::Usage(format!("bench: --business: {e}")))?;
    let sharded: Vec<String> = loaded
        .businesses
        .iter()
        .find(|b| b.name == "bench_sharded")
        .map(|b| b.keys())
        .ok_or_else(|| BenchError::Usage("bench: no sharded business".into()))?;
    state.keys.extend(sharded.iter().cloned());
    let backlog = shards::Backlog {
        n: args.messages,
        size: args.size,
        id_mode: s.business.member.is_id(),
    };
    Ok(shards::ShardCompare::new(
        shards,
        backlog,
        s.fams.clone(),
        sharded.iter().map(|k| KeyFamily::new(k)).collect(),
    ))
}

/// Tries a few channel and window settings of the raw publisher and keeps
/// the fastest, so the ceiling is the broker's and not the publisher's.
async fn best_publisher(
    args: &BenchArgs,
    names: &Names,
    amqp: &Connection,
    s: &Setup,
) -> Result<Best, BenchError> {
    eprintln!("bench: finding the raw publisher's best channels and window ...");
    let trial_n = (args.messages / 4).max(1000);
    let mut best = (
        0.0f64,
        Best {
            channels: 1,
            window: 256,
        },
    );
    for (channels, window) in [(1, 256), (1, 1024), (2, 1024), (4, 1024), (2, 4096)] {
        let rate = raw_publish(amqp, names, trial_n, args.size, channels, window, None).await?;
        between_phases(&s.ch, names, &s.counter, args.no_consumer).await?;
        eprintln!("bench:   {channels} channel(s) x window {window}: {rate:.0} msg/s");
        if rate > best.0 {
            best = (rate, Best { channels, window });
        }
    }
    Ok(best.1)
}

/// Each round: the ceiling, the same publisher with delayd's message
/// format, delayd's drain and, when asked, the shard comparison.
async fn drain_rounds(
    args: &BenchArgs,
    names: &Names,
    redis: &mut RedisConn,
    amqp: &Connection,
    s: &Setup,
    best: Best,
    mut compare: Option<&mut shards::ShardCompare>,
) -> Result<Rounds, BenchError> {
    let mut rounds = Rounds::default();
    for round in 1..=args.rounds.max(1) {
        // The ceiling, then the same properties delayd will send, so the
        // broker's cost of the message format can be told apart from
        // delayd's own.
        let mut rates = [0.0; 2];
        for (rate, format) in rates.iter_mut().zip([None, Some(&s.business)]) {
            let (n, size) = (args.messages, args.size);
            *rate = raw_publish(amqp, names, n, size, best.channels, best.window, format).await?;
            between_phases(&s.ch, names, &s.counter, args.no_consumer).await?;
        }
        let [raw, same] = rates;
        let (drain, bytes_per_task, ticks, daemon_ticks) = delayd_drain(
            redis,
            &s.fams,
            args.messages,
            args.size,
            round,
            s.business.member.is_id(),
            &s.watch,
        )
        .await?;
        // /proc counts CPU time in USER_HZ ticks, 100 per second on Linux.
        let per = |t: u64| t as f64 * 10_000.0 / args.messages.max(2) as f64;
        let r = Round {
            raw,
            same,
            drain,
            bytes_per_task,
            cpu_daemon: per(daemon_ticks),
            cpu_redis: ticks.map(|(m, r)| (per(m), per(r))),
        };
        between_phases(&s.ch, names, &s.counter, args.no_consumer).await?;
        if let Some(c) = compare.as_deref_mut() {
            c.round(redis, round, &s.watch).await?;
            between_phases(&s.ch, names, &s.counter, args.no_consumer).await?;
        }
        eprintln!(
            "bench: round {round}: raw ceiling {raw:.0} msg/s, raw with delayd's format {same:.0} msg/s, delayd drain {drain:.0} msg/s, ratio {:.3} ({:.3} to the same format)",
            r.ratio(),
            r.same_ratio()
        );
        rounds.push(r);
    }
    Ok(rounds)
}

/// Members written `args.rate` per second, each due a moment later; each
/// one's lateness is its consumer receipt against its due time, on Redis's
/// clock.
async fn lateness(
    args: &BenchArgs,
    redis: &mut RedisConn,
    s: &Setup,
) -> Result<Lateness, BenchError> {
    eprintln!(
        "bench: lateness at {} members/s for {} s ...",
        args.rate, args.lateness_secs
    );
    let offset = clock_offset_ms(redis).await?;
    s.counter.record.store(true, Ordering::Relaxed);
    let scheduled = lateness_phase(
        redis,
        &s.fams,
        s.business.member.is_id(),
        args.rate,
        args.lateness_secs,
        args.size,
    )
    .await?;
    let received = || s.counter.lateness_ms.lock().map(|v| v.len()).unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while received() < scheduled && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.counter.record.store(false, Ordering::Relaxed);
    let mut ms: Vec<f64> = s
        .counter
        .lateness_ms
        .lock()
        .map(|v| v.iter().map(|l| l - offset).collect())
        .unwrap_or_default();
    ms.sort_by(|a, b| a.total_cmp(b));
    Ok(Lateness { ms, scheduled })
}

/// The table: the drain against the ceiling, then what it costs, then
/// lateness, idle cost, far-future writes and memory.
fn print_table(args: &BenchArgs, s: &Setup, r: &Results) {
    report::heading(&format!(
        "delayd bench: {} x {}-byte persistent messages into a durable queue ({}), {} rounds, one run",
        args.messages,
        args.size,
        if args.no_consumer {
            "no consumer while timed"
        } else {
            "one consumer"
        },
        r.rounds.len()
    ));
    rate_rows(s, r);
    cost_rows(args, s, r);
    traffic_rows(args, r);
}

/// The ceiling, the same-format publisher, delayd's drain and their ratios.
fn rate_rows(s: &Setup, r: &Results) {
    let rounds = &r.rounds;
    let med_raw = rounds.median(|r| r.raw);
    let med_same = rounds.median(|r| r.same);
    row(
        "raw confirmed publish (ceiling)",
        &format!("{med_raw:.0} msg/s"),
        &format!(
            "median; best of sweep: {} channel(s), window {}",
            r.best.channels, r.best.window
        ),
    );
    row(
        "raw publish, delayd's format",
        &format!("{med_same:.0} msg/s"),
        &format!(
            "median; {}; the broker's cost of the format: {:.0}%",
            match s.business.properties {
                Properties::Standard => {
                    "message_id, type, app_id, timestamp (the default, no headers)"
                }
                Properties::Full => "message_id, timestamp, x-delayd-* headers",
                Properties::NoHeaders => "message_id, timestamp, no headers",
                Properties::Bare => "no properties: the ceiling's own message",
            },
            (1.0 - med_same / med_raw) * 100.0
        ),
    );
    row(
        "delayd drain (claim+publish+ack)",
        &format!("{:.0} msg/s", rounds.median(|r| r.drain)),
        &format!("median; rounds {}", join_rates(&rounds.each(|r| r.drain))),
    );
    let ratios = [
        ("delayd / ceiling", Round::ratio as fn(&Round) -> f64, ""),
        (
            "delayd / same-format publisher",
            Round::same_ratio,
            "; delayd's own overhead",
        ),
    ];
    for (label, ratio, why) in ratios {
        let each = join_ratios(&rounds.each(ratio));
        let note = format!("median of per-round ratios {each}{why}");
        row(label, &format!("{:.3}", rounds.median(ratio)), &note);
    }
    for (label, value, note) in r.compare.iter().flat_map(|c| c.rows()) {
        row(&label, &value, &note);
    }
}

/// Memory per task and CPU per drained member, Redis's and delayd's, and
/// the common recipe for comparison.
fn cost_rows(args: &BenchArgs, s: &Setup, r: &Results) {
    let rounds = &r.rounds;
    row(
        "Redis memory per pending task",
        &format!("{:.0} B", rounds.median(|r| r.bytes_per_task)),
        &format!(
            "MEMORY USAGE of the loaded backlog{}, {}-byte bodies",
            if s.business.member.is_id() {
                " (ids and {K}:body)"
            } else {
                ""
            },
            args.size
        ),
    );
    let redis_procs = &s.watch.redis;
    match rounds.cpu_redis() {
        None => row(
            "Redis CPU per drained member",
            "unknown",
            "its redis-server processes are not on this machine",
        ),
        Some((masters, replicas)) => {
            let replicas = if redis_procs.iter().any(|p| p.replica) {
                format!("; its replicas {:.1} µs more", median(&replicas))
            } else {
                String::new()
            };
            row(
                "Redis CPU per drained member",
                &format!("{:.1} µs", median(&masters)),
                &format!(
                    "median; rounds {}; user+system of {} master(s){replicas}",
                    join_us(&masters),
                    redis_procs.iter().filter(|p| !p.replica).count()
                ),
            );
        }
    }
    row(
        "delayd CPU per drained member",
        &format!("{:.1} µs", rounds.median(|r| r.cpu_daemon)),
        &format!(
            "median; rounds {}; user+system of the delayd process",
            join_us(&rounds.each(|r| r.cpu_daemon))
        ),
    );
    row(
        "common recipe drain",
        &format!("{:.0} msg/s", r.recipe),
        &format!(
            "one member per Lua call, no confirms; delayd drains {:.1}x faster",
            rounds.median(|r| r.drain) / r.recipe.max(1.0)
        ),
    );
}

/// Lateness, idle cost, far-future writes and delayd's RSS.
fn traffic_rows(args: &BenchArgs, r: &Results) {
    let lat = &r.lateness.ms;
    if lat.is_empty() {
        row("lateness", "no samples", "");
    } else {
        row(
            &format!("lateness at {}/s (due -> consumer)", args.rate),
            &format!("p99 {:.1} ms", percentile(lat, 0.99)),
            &format!(
                "p50 {:.1} ms, max {:.1} ms, min {:.1} ms, {} of {} received",
                percentile(lat, 0.50),
                lat.last().copied().unwrap_or(0.0),
                lat.first().copied().unwrap_or(0.0),
                lat.len(),
                r.lateness.scheduled
            ),
        );
    }
    row(
        "idle Redis commands",
        &format!("{:.2} /s", r.idle_per_s),
        "one business, nothing due (MONITOR, commands naming its key)",
    );
    row(
        &format!("far-future writes at {FAR_RATE}/s"),
        &format!("{:.3} /write", r.far.calls_per_write),
        &format!(
            "Redis commands per producer ZADD due in a week ({:.4} scripts), Redis time {:.2}x the producers'; {} writes",
            r.far.scripts_per_write, r.far.time_ratio, r.far.writes
        ),
    );
    row(
        "delayd RSS",
        &format!("{:.1} MB", r.rss_end.1 as f64 / 1024.0),
        &format!(
            "peak {:.1} MB after the drains, {:.1} MB at the end",
            r.rss_after_drain.0 as f64 / 1024.0,
            r.rss_end.0 as f64 / 1024.0
        ),
    );
}

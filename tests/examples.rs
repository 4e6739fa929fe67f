//! The producer examples under examples/ (Python, Node, Ruby, PHP, each with
//! its usual Redis client) write exactly the keys, members, scores and
//! bodies docs/wire-format.md describes, byte for byte the same in every
//! language, and a running delayd delivers what they schedule (body mode,
//! and id mode with a reschedule and a cancel by id) to a real consumer,
//! and nothing they cancelled. The clients come from deploy/local/clients.sh.

use delayd_test_support as common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use common::*;

/// 2100-01-01T00:00:00Z: far enough that nothing written at it comes due.
const FAR_MS: i64 = 4_102_444_800_000;

/// What an example leaves in Redis: body-mode members and scores, id-mode
/// ids and scores, and the bodies beside the ids.
#[derive(Debug, PartialEq)]
struct Written {
    body_mode: Vec<(Vec<u8>, String)>,
    ids: Vec<(Vec<u8>, String)>,
    bodies: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// What examples/README.md says every example leaves for `due_ms`.
fn documented(due_ms: i64) -> Written {
    let order = |n: u32| format!("{{\"order\":{n},\"action\":\"expire\"}}").into_bytes();
    Written {
        body_mode: vec![(order(41), due_ms.to_string())],
        ids: vec![
            (b"order-42".to_vec(), due_ms.to_string()),
            (b"order-43".to_vec(), (due_ms + 1).to_string()),
        ],
        bodies: [
            (b"order-42".to_vec(), order(42)),
            (b"order-43".to_vec(), order(43)),
        ]
        .into(),
    }
}

/// Runs the example of `lang` against the shared Redis, for the body-mode
/// key `body_key` and the id-mode key `id_key`, due at `due_ms`.
async fn run_example(lang: &'static str, body_key: &str, id_key: &str, due_ms: i64) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let (body_key, id_key) = (body_key.to_string(), id_key.to_string());
    tokio::task::spawn_blocking(move || {
        let (program, script, extra): (String, &str, Vec<(&str, String)>) = match lang {
            "python" => (client("python"), "python/producer.py", vec![]),
            "node" => (
                "node".into(),
                "node/producer.js",
                vec![("NODE_PATH", client("node"))],
            ),
            "ruby" => (client("ruby"), "ruby/producer.rb", vec![]),
            "php" => (client("php"), "php/producer.php", vec![]),
            other => panic!("no example in {other}"),
        };
        let mut cmd = std::process::Command::new(program);
        cmd.arg(dir.join(script))
            .env("REDIS_URL", redis_url())
            .env("BODY_KEY", &body_key)
            .env("ID_KEY", &id_key)
            .env("DUE_MS", due_ms.to_string())
            .envs(extra);
        output_ok(cmd, &format!("examples/{script}"));
    })
    .await
    .unwrap();
}

/// What is in Redis under the two keys and the id-mode body hash.
async fn written(
    redis: &mut redis::aio::MultiplexedConnection,
    body_key: &str,
    id_key: &str,
) -> Written {
    let with_scores = |key: &str| {
        let mut c = redis::cmd("ZRANGE");
        c.arg(key).arg(0).arg(-1).arg("WITHSCORES");
        c
    };
    let body_mode: Vec<(Vec<u8>, String)> = with_scores(body_key).query_async(redis).await.unwrap();
    let ids: Vec<(Vec<u8>, String)> = with_scores(id_key).query_async(redis).await.unwrap();
    let bodies: BTreeMap<Vec<u8>, Vec<u8>> = redis::cmd("HGETALL")
        .arg(delayd::keys::helper_key(id_key, "body"))
        .query_async(redis)
        .await
        .unwrap();
    Written {
        body_mode,
        ids,
        bodies,
    }
}

/// The example of `lang` writes the documented bytes (once with a plain
/// id-mode key, once with a hash-tagged one, whose body hash is `K:body`),
/// and delayd delivers what it schedules for now, and nothing it cancelled.
async fn example_writes_the_documented_bytes_and_is_delivered(lang: &'static str) {
    let mut redis = redis().await;
    for id_key in [unique("ex:id"), format!("ex:{{{}}}:id", unique("tag"))] {
        let body_key = unique("ex:body");
        run_example(lang, &body_key, &id_key, FAR_MS).await;
        let got = written(&mut redis, &body_key, &id_key).await;
        let bodies = delayd::keys::helper_key(&id_key, "body");
        del(
            &mut redis,
            &[body_key.as_str(), id_key.as_str(), bodies.as_str()],
        )
        .await;
        assert_eq!(got, documented(FAR_MS), "{lang} example, id key {id_key}");
    }

    let body_mode = BusinessSpec::random("by_body");
    let id_mode = BusinessSpec::with_extra("by_id", "member = \"id\"");
    let t = Setup::new(&[&body_mode, &id_mode]).await;
    let d = Daemon::start(&t.config);
    let now = redis_now_ms(&mut redis).await;
    run_example(lang, &body_mode.key, &id_mode.key, now).await;
    let want = documented(now);
    let (by_body, by_id) = (&t.inboxes[0], &t.inboxes[1]);
    by_body.wait_for(1, Duration::from_secs(20)).await;
    by_id.wait_for(2, Duration::from_secs(20)).await;
    // Anything cancelled or removed would come now, had it been claimed.
    by_id.settle(Duration::from_millis(500)).await;
    let bodies: HashSet<Vec<u8>> = want.body_mode.iter().map(|(m, _)| m.clone()).collect();
    by_body.assert_each_once(&bodies, &format!("{lang} example, body mode"));
    let bodies: HashSet<Vec<u8>> = want.bodies.values().cloned().collect();
    let got = by_id.assert_each_once(&bodies, &format!("{lang} example, id mode"));
    for m in &got {
        assert!(
            m.due() >= now,
            "{lang}: delivered with due {} < {now}",
            m.due()
        );
    }
    wait_family_empty(&mut redis, &id_mode.key, Duration::from_secs(10)).await;
    drop(d);
    for b in [&body_mode, &id_mode] {
        del_family(&mut redis, &b.key).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_writes_the_documented_bytes_and_its_tasks_are_delivered() {
    example_writes_the_documented_bytes_and_is_delivered("python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_example_writes_the_documented_bytes_and_its_tasks_are_delivered() {
    example_writes_the_documented_bytes_and_is_delivered("node").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ruby_example_writes_the_documented_bytes_and_its_tasks_are_delivered() {
    example_writes_the_documented_bytes_and_is_delivered("ruby").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_php_example_writes_the_documented_bytes_and_its_tasks_are_delivered() {
    example_writes_the_documented_bytes_and_is_delivered("php").await;
}

/// Runs examples/python/traced.py in `mode` with `env`; its stdout.
async fn traced(mode: &'static str, env: Vec<(&'static str, String)>) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python/traced.py");
    tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(client("python"));
        cmd.arg(&script).arg(mode).envs(env);
        let out = output_ok(cmd, &format!("examples/python/traced.py {mode}"));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
    .await
    .unwrap()
}

/// Schedules one traced task with examples/python/traced.py on an id-mode
/// business with envelopes and `extra`, consumes it with the same script;
/// (the trace id the producer injected, the one the consumer extracted as
/// the producer's, the consumer span's own, the `traceparent` received).
async fn traced_through_the_delay(extra: &str) -> (String, String, String, String) {
    let mut b = BusinessSpec::with_extra(
        "traced",
        format!("member = \"id\"\nenvelopes = true\n{extra}"),
    );
    b.routing_key = "order.timeout".into();
    let amqp = amqp_at(&amqp_url()).await;
    let ch = amqp.create_channel().await.unwrap();
    let queue = unique("traced");
    declare(&ch, &b.exchange, &queue, &b.routing_key).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&b]);
    let d = Daemon::start(&config);
    let mut redis = redis().await;
    let due = redis_now_ms(&mut redis).await + 500;
    let produced = traced(
        "produce",
        vec![
            ("REDIS_URL", redis_url()),
            ("ID_KEY", b.key.clone()),
            ("DUE_MS", due.to_string()),
        ],
    )
    .await;
    let consumed = traced(
        "consume",
        vec![("AMQP_URL", amqp_url()), ("QUEUE", queue.clone())],
    )
    .await;
    assert_eq!(produced.len(), 32, "a trace id: {produced:?}");
    assert_ne!(produced, "0".repeat(32), "the producer had no valid span");
    wait_family_empty(&mut redis, &b.key, Duration::from_secs(10)).await;
    drop(d);
    delete_topology(&ch, &[queue.as_str()], &[b.exchange.as_str()]).await;
    let mut lines = consumed.lines().map(str::to_string);
    let mut next = || lines.next().unwrap_or_default();
    (produced, next(), next(), next())
}

/// The trace id a producer's OpenTelemetry span injected (as `traceparent`
/// in an envelope on the `ZADD` road) is the one the consumer extracts after
/// the delay, with OpenTelemetry's own propagator on both ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_trace_id_is_the_one_its_consumer_extracts_after_the_delay() {
    let (produced, extracted, _, received) = traced_through_the_delay("").await;
    assert_eq!(extracted, produced, "the consumer extracted another trace");
    assert!(
        received.contains(&produced),
        "traceparent as sent: {received}"
    );
}

/// With `trace = "link"`, the consumer's span continues delayd's publish, a
/// new trace, and still finds the producer's trace id to link to (in
/// `x-delayd-producer-traceparent`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_trace_link_the_consumer_continues_a_new_trace_and_links_the_producers() {
    let (produced, extracted, own, received) = traced_through_the_delay("trace = \"link\"").await;
    assert_eq!(extracted, produced, "the producer's trace id is not found");
    assert_ne!(
        own, produced,
        "the consumer span continued the producer's trace"
    );
    let fields: Vec<&str> = received.split('-').collect();
    assert_eq!(fields.len(), 4, "delayd's traceparent: {received:?}");
    assert_eq!(
        own, fields[1],
        "the consumer span does not continue delayd's publish"
    );
}

/// The README's Python producer is lines of examples/python/producer.py, in
/// its order (`# ...` marks what is left out), so what readers copy is what
/// the tests above run.
#[test]
fn the_readmes_producer_example_is_an_excerpt_of_the_python_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let block = readme
        .split("```python\n# examples/python/producer.py, shortened\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README.md shows examples/python/producer.py in a ```python block");
    let example = std::fs::read_to_string(root.join("examples/python/producer.py")).unwrap();
    let mut lines = example.lines();
    for want in block
        .lines()
        .filter(|l| !l.trim().is_empty() && *l != "# ...")
    {
        assert!(
            lines.any(|l| l == want),
            "README.md's line {want:?} is not in examples/python/producer.py (or not in its order)"
        );
    }
}

//! Who sees what: every route of the console, its API, `/metrics` and the
//! probes, asked by every kind of caller (no token, each business's own
//! tokens, the global read token, the admin token), against two running
//! delayd on the same keys (one with reads open, one with a global read
//! token) and real Redis and RabbitMQ. Each answer has the status the
//! table says, and names no business with a token of its own, nor shows
//! its data, unless the caller may read that business.

use delayd_test_support as common;

use std::time::Duration;

use common::*;
use serde_json::json;

const ADMIN: &str = "tok-global-admin-5b1e07";
const READER: &str = "tok-global-read-c4d2a9";
const A_READ: &str = "tok-first-read-93be11";
const A_ADMIN: &str = "tok-first-admin-0f6c52";
const B_READ: &str = "tok-second-read-7d4e80";

/// One caller: on the daemon with reads open or the one with a global read
/// token, with a token or none, and the protected businesses (`A`: its
/// own read and admin tokens, `B`: its own read token) it may read.
struct Caller {
    who: &'static str,
    closed: bool,
    token: Option<&'static str>,
    reads: &'static [char],
}

/// The columns of the table, in order.
#[rustfmt::skip]
const CALLERS: [Caller; 7] = [
    Caller { who: "no token", closed: false, token: None, reads: &[] },
    Caller { who: "no token, read token set", closed: true, token: None, reads: &[] },
    Caller { who: "A's read token", closed: false, token: Some(A_READ), reads: &['A'] },
    Caller { who: "A's admin token", closed: false, token: Some(A_ADMIN), reads: &['A'] },
    Caller { who: "B's read token", closed: false, token: Some(B_READ), reads: &['B'] },
    Caller { who: "the read token", closed: true, token: Some(READER), reads: &['A', 'B'] },
    Caller { who: "the admin token", closed: false, token: Some(ADMIN), reads: &['A', 'B'] },
];

const OPEN: [u16; 7] = [200; 7];
const API_READ: [u16; 7] = [200, 401, 200, 200, 200, 200, 200];
const READ_A: [u16; 7] = [401, 401, 200, 200, 403, 200, 200];
const WRITE_A: [u16; 7] = [401, 401, 403, 200, 403, 403, 200];
const CREATE_A: [u16; 7] = [401, 401, 403, 201, 403, 403, 201];
const MISSING_A: [u16; 7] = [401, 401, 403, 404, 403, 403, 404];
const READ_B: [u16; 7] = [401, 401, 403, 403, 200, 200, 200];
const WRITE_B: [u16; 7] = [401, 401, 403, 403, 403, 403, 200];
const READ_G: [u16; 7] = [200, 401, 403, 403, 403, 200, 200];
const WRITE_G: [u16; 7] = [401, 401, 403, 403, 403, 403, 200];
const UNKNOWN_READ: [u16; 7] = [404, 401, 403, 403, 403, 404, 404];
const UNKNOWN_WRITE: [u16; 7] = [404; 7];

/// Every route: method, path (`{A}`, `{B}`, `{G}` stand for the business
/// names), JSON body, the status per caller, and whether the answer must
/// name every protected business the caller may read.
#[rustfmt::skip]
const ROUTES: &[(&str, &str, &str, [u16; 7], bool)] = &[
    ("GET", "/", "", OPEN, false),
    ("GET", "/console.js", "", OPEN, false),
    ("GET", "/console.css", "", OPEN, false),
    ("GET", "/healthz", "", OPEN, false),
    ("GET", "/readyz", "", [503; 7], false),
    ("GET", "/metrics", "", OPEN, true),
    ("GET", "/api/v1/businesses", "", API_READ, true),
    ("GET", "/api/v1/audit?limit=1000", "", API_READ, true),
    ("GET", "/api/v1/no/such/path", "", [404, 401, 404, 404, 404, 404, 404], false),
    ("GET", "/api/v1/businesses/{A}/histogram", "", READ_A, false),
    ("GET", "/api/v1/businesses/{A}/tasks", "", READ_A, false),
    ("GET", "/api/v1/businesses/{A}/tasks/{A}_data-1", "", READ_A, false),
    ("GET", "/api/v1/businesses/{A}/search?prefix={A}_data", "", READ_A, false),
    ("GET", "/api/v1/businesses/{A}/search?body={A}_data", "", READ_A, false),
    ("GET", "/api/v1/businesses/{A}/dead", "", READ_A, false),
    ("GET", "/api/v1/businesses/{A}/schedules", "", READ_A, false),
    ("POST", "/api/v1/businesses/{A}/tasks", r#"{"id":"{A}_data-new","body":"{A}_data","in":"1d"}"#, CREATE_A, false),
    ("POST", "/api/v1/businesses/{A}/tasks/{A}_data-1/reschedule", r#"{"in":"2d"}"#, WRITE_A, false),
    ("POST", "/api/v1/businesses/{A}/tasks/{A}_data-none/run", "", MISSING_A, false),
    ("DELETE", "/api/v1/businesses/{A}/tasks/{A}_data-none", "", MISSING_A, false),
    ("POST", "/api/v1/businesses/{A}/dead/requeue", r#"{"reason":"{A}_data","dry_run":true}"#, READ_A, false),
    ("POST", "/api/v1/businesses/{A}/dead/purge", r#"{"member":"{A}_data-none"}"#, WRITE_A, false),
    ("POST", "/api/v1/businesses/{A}/bulk/cancel", r#"{"prefix":"{A}_data","dry_run":true}"#, READ_A, false),
    ("POST", "/api/v1/businesses/{A}/bulk/cancel", r#"{"prefix":"{A}_data-none","confirm":1}"#, WRITE_A, false),
    ("GET", "/api/v1/businesses/{A}/tenants", "", READ_A, false),
    ("POST", "/api/v1/businesses/{A}/tenants/{A}_data/pause", "", WRITE_A, false),
    ("POST", "/api/v1/businesses/{A}/tenants/{A}_data/resume", "", WRITE_A, false),
    ("POST", "/api/v1/businesses/{A}/tenants/{A}_data/weight", r#"{"weight":2}"#, WRITE_A, false),
    ("POST", "/api/v1/businesses/{A}/tenants/{A}_data/max_rate", r#"{"max_rate":500}"#, WRITE_A, false),
    ("POST", "/api/v1/businesses/{A}/pause", "", WRITE_A, false),
    ("POST", "/api/v1/businesses/{A}/resume", "", WRITE_A, false),
    ("POST", "/api/v1/businesses/{A}/schedules/{A}_data/pause", "", WRITE_A, false),
    ("POST", "/api/v1/businesses/{A}/schedules/{A}_data/resume", "", WRITE_A, false),
    ("POST", "/api/v1/businesses/{A}/schedules/{A}_data/run", "", WRITE_A, false),
    ("POST", "/api/v1/businesses/{A}/schedules/none/run", "", MISSING_A, false),
    ("GET", "/api/v1/businesses/{B}/tasks", "", READ_B, false),
    ("GET", "/api/v1/businesses/{B}/dead", "", READ_B, false),
    ("POST", "/api/v1/businesses/{B}/bulk/requeue", r#"{"reason":"{B}_data","dry_run":true}"#, READ_B, false),
    ("POST", "/api/v1/businesses/{B}/dead/purge", r#"{"member":"{B}_data-none"}"#, WRITE_B, false),
    ("GET", "/api/v1/businesses/{G}/tasks", "", READ_G, false),
    ("GET", "/api/v1/businesses/{G}/histogram", "", READ_G, false),
    ("POST", "/api/v1/businesses/{G}/bulk/cancel", r#"{"prefix":"{G}_data","dry_run":true}"#, READ_G, false),
    ("POST", "/api/v1/businesses/{G}/pause", "", WRITE_G, false),
    ("POST", "/api/v1/businesses/{G}/resume", "", WRITE_G, false),
    ("GET", "/api/v1/businesses/nosuch/tasks", "", UNKNOWN_READ, false),
    ("POST", "/api/v1/businesses/nosuch/dead/purge", r#"{"all":true,"dry_run":true}"#, UNKNOWN_WRITE, false),
    ("POST", "/api/v1/businesses/nosuch/pause", "", UNKNOWN_WRITE, false),
];

/// An id-mode business named `prefix_<random>`, with `extra` lines.
fn business(prefix: &str, extra: &str) -> BusinessSpec {
    let name = unique(prefix).replace('-', "_");
    BusinessSpec {
        extra: format!("member = \"id\"\nproperties = \"full\"\n{extra}"),
        ..BusinessSpec::random(&name)
    }
}

/// Writes `id` with a body holding the business's data marker, due at `due`.
async fn seed(r: &mut redis::aio::MultiplexedConnection, b: &BusinessSpec, id: &str, due: i64) {
    let _: () = redis::pipe()
        .atomic()
        .hset(family(&b.key).body, id, format!("body of {id}"))
        .zadd(&b.key, id, due)
        .query_async(r)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_each_caller_only_with_the_businesses_it_may_read() {
    let a = business(
        "first",
        &format!("read_token = \"{A_READ}\"\nadmin_token = \"{A_ADMIN}\"\ntenants = true"),
    );
    let a = BusinessSpec {
        extra: format!(
            "{}\n[businesses.{n}.recurring.{n}_data]\ncron = \"0 0 3 * * *\"\nbody = \"{n}_data\"\n",
            a.extra,
            n = a.name
        ),
        ..a
    };
    let b = business("second", &format!("read_token = \"{B_READ}\""));
    let g = business("third", "");
    let open =
        ConsoleDaemon::start_with_env(&[&a, &b, &g], &[("DELAYD_HTTP__ADMIN_TOKEN", ADMIN)]).await;
    let closed = ConsoleDaemon::start_with_env(
        &[&a, &b, &g],
        &[
            ("DELAYD_HTTP__ADMIN_TOKEN", ADMIN),
            ("DELAYD_HTTP__READ_TOKEN", READER),
        ],
    )
    .await;

    let mut r = redis().await;
    let now = redis_now_ms(&mut r).await;
    for x in [&a, &b, &g] {
        seed(&mut r, x, &format!("{}_data-1", x.name), now + 86_400_000).await;
        seed_dead(
            &mut r,
            &x.key,
            &[(
                &format!("{}_data-dead", x.name),
                &format!("{}_data reason", x.name),
            )],
        )
        .await;
    }
    // B's exchange goes away with a task due: its publishing pauses, which
    // the overview and /readyz say, naming it.
    open.setup
        .ch
        .exchange_delete(b.exchange.as_str().into(), Default::default())
        .await
        .unwrap();
    seed(&mut r, &b, &format!("{}_data-stuck", b.name), now).await;
    for d in [&open, &closed] {
        let paused = eventually(Duration::from_secs(20), || async {
            let o = call(d.port, "GET", "/api/v1/businesses", Some(ADMIN), None).await;
            o.json["businesses"].as_array().is_some_and(|rows| {
                rows.iter()
                    .any(|x| x["name"] == b.name && x["paused"].is_string())
            })
        })
        .await;
        assert!(paused, "{} never paused; log:\n{}", b.name, d.daemon.tail());
    }
    // Each protected business has an entry in the audit log.
    for (x, body) in [
        (&a, json!({"member": format!("{}_data-none", a.name)})),
        (&b, json!({"member": format!("{}_data-none", b.name)})),
    ] {
        let path = format!("/api/v1/businesses/{}/dead/purge", x.name);
        assert_eq!(
            api_post(open.port, &path, Some(ADMIN), &body).await.status,
            200
        );
    }

    let names = |s: &str| {
        s.replace("{A}", &a.name)
            .replace("{B}", &b.name)
            .replace("{G}", &g.name)
    };
    let protected = [('A', &a), ('B', &b)];
    let mut wrong = Vec::new();
    for (method, path, body, want, shows) in ROUTES {
        let (path, body) = (names(path), names(body));
        for (caller, want) in CALLERS.iter().zip(want) {
            let port = if caller.closed {
                closed.port
            } else {
                open.port
            };
            let got = call(
                port,
                method,
                &path,
                caller.token,
                (!body.is_empty()).then_some(body.as_str()),
            )
            .await;
            let what = format!("{method} {path} with {}", caller.who);
            if got.status != *want {
                wrong.push(format!(
                    "{what}: {} (want {want}): {}",
                    got.status, got.text
                ));
            }
            for (tag, x) in protected {
                let named = path.contains(&format!("/businesses/{}", x.name));
                let may = caller.reads.contains(&tag);
                let data = format!("{}_data", x.name);
                let leaked = !may
                    && (got.text.contains(&data)
                        || got.text.contains(&x.key)
                        || (!named && got.text.contains(&x.name)));
                if leaked {
                    wrong.push(format!(
                        "{what}: shows {} or its data: {}",
                        x.name, got.text
                    ));
                }
                if *shows && may && *want == 200 && !got.text.contains(&x.name) {
                    wrong.push(format!(
                        "{what}: does not show {}, which it may read",
                        x.name
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong answers:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    for x in [&a, &b, &g] {
        del_family(&mut r, &x.key).await;
    }
}

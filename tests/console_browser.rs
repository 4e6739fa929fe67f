//! The console page in a real browser (Debian's chromium, driven over
//! WebDriver by chromium-driver), against a running delayd and real Redis
//! and RabbitMQ. `deploy/local/test.sh` installs both packages; a missing
//! browser is a failure, not a skip. Each test saves screenshots under
//! `target/tmp/console-screenshots/`.

use delayd_test_support as common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

const TOKEN: &str = "browser-test-token-0123456789";

/// chromedriver and a session on it. Dropping it kills the browser the
/// session started and the driver, by their process ids.
struct Browser {
    driver: Child,
    client: Client,
    browser_pid: Option<u64>,
}

impl Browser {
    async fn start(width: u32, height: u32) -> Self {
        let driver_bin = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("chromedriver not found: install Debian's chromium and chromium-driver (deploy/local/test.sh does)");
        let port = free_port(20000..25000, &[]);
        let driver = Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start chromedriver");
        let mut caps = serde_json::Map::new();
        let mut opts = json!({ "args": [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--hide-scrollbars", format!("--window-size={width},{height}"),
        ]});
        if std::path::Path::new("/usr/bin/chromium").exists() {
            opts["binary"] = "/usr/bin/chromium".into();
        }
        caps.insert("goog:chromeOptions".into(), opts);
        let started = Instant::now();
        let client = loop {
            let attempt =
                ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                    .capabilities(caps.clone())
                    .connect(&format!("http://127.0.0.1:{port}"))
                    .await;
            match attempt {
                Ok(c) => break c,
                Err(e) if started.elapsed() > Duration::from_secs(30) => {
                    panic!("no WebDriver session within 30 s: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let browser_pid = client
            .capabilities()
            .and_then(|c| c.get("goog:processID"))
            .and_then(|p| p.as_u64());
        Self {
            driver,
            client,
            browser_pid,
        }
    }

    /// Saves a screenshot as `NAME.png` and returns its path.
    /// What `script` returns in the page.
    async fn js(&self, script: &str) -> serde_json::Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Asserts that `script`, the pixels something overflows its width
    /// by, returns at most 0; `what` says what is too wide.
    async fn assert_fits(&self, script: &str, what: &str) {
        let overflow = self.js(script).await;
        assert!(overflow.as_i64().unwrap() <= 0, "{what} by {overflow}px");
    }

    async fn screenshot(&self, name: &str) -> PathBuf {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, self.client.screenshot().await.unwrap()).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }

    /// The text of the first element matching `css`, once `ok` accepts
    /// it; panics after 15 s with what it saw.
    async fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        let mut seen = String::from("(no such element)");
        while started.elapsed() < Duration::from_secs(15) {
            if let Ok(e) = self.client.find(Locator::Css(css)).await {
                if let Ok(t) = e.text().await {
                    if ok(&t) {
                        return t;
                    }
                    seen = t;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css}: still {seen:?} after 15 s");
    }

    /// Waits until the `field` cell of the table row `row` (a selector
    /// such as `tr[data-tenant="acme"]`) says exactly `want`.
    async fn wait_cell(&self, row: &str, field: &str, want: &str) {
        let css = format!("{row} td[data-field=\"{field}\"]");
        self.wait_text(&css, |t| t == want).await;
    }

    /// The first element matching `css` once it is shown and enabled: the
    /// page renders its view after reading the URL, so an element can be in
    /// the document before it can take a click or keys. Panics after 15 s.
    async fn interactable(&self, css: &str) -> fantoccini::elements::Element {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(15) {
            if let Ok(e) = self.client.find(Locator::Css(css)).await {
                let shown = e.is_displayed().await.unwrap_or(false);
                if shown && e.is_enabled().await.unwrap_or(false) {
                    return e;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css}: not shown and enabled after 15 s");
    }

    /// Opens the console at `port`, at the view `fragment` names.
    async fn open(&self, port: u16, fragment: &str) {
        let url = format!("http://127.0.0.1:{port}/{fragment}");
        self.client
            .goto(&url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// Saves `token` as the page's bearer token.
    async fn use_token(&self, token: &str) {
        self.type_into("#token", token).await;
        self.click("#token-save").await;
    }

    /// Pauses the schedule or tenant of the table row `row` with its button
    /// and waits for the row to show it paused by the admin token.
    async fn pause_row(&self, row: &str) {
        self.click(&format!("{row} button[data-act=\"pause\"]"))
            .await;
        let state = format!("{row} td[data-field=\"state\"]");
        self.wait_text(&state, |t| t.starts_with("paused by admin_token"))
            .await;
    }

    /// Resumes the schedule or tenant of `row` and waits for it to run.
    async fn resume_row(&self, row: &str) {
        self.click(&format!("{row} button[data-act=\"resume\"]"))
            .await;
        self.wait_cell(row, "state", "running").await;
    }

    async fn click(&self, css: &str) {
        self.interactable(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    async fn type_into(&self, css: &str, text: &str) {
        let e = self.interactable(css).await;
        e.clear()
            .await
            .unwrap_or_else(|err| panic!("clear {css}: {err}"));
        e.send_keys(text)
            .await
            .unwrap_or_else(|err| panic!("type into {css}: {err}"));
    }

    /// Whether the first element matching `css` is shown (false when there
    /// is none).
    async fn shown(&self, css: &str) -> bool {
        match self.client.find(Locator::Css(css)).await {
            Ok(e) => e.is_displayed().await.unwrap_or(false),
            Err(_) => false,
        }
    }

    /// Ends the session; the driver goes when `self` drops.
    async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A browser left by a failed test would outlive it; its helper
        // processes end with it.
        if let Some(pid) = self.browser_pid.filter(|p| *p > 1) {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn id_business(name: &str) -> BusinessSpec {
    let mut b = BusinessSpec::random(name);
    b.extra = "member = \"id\"".into();
    b
}

async fn schedule_id(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    id: &str,
    body: &str,
    due: i64,
) {
    let _: () = redis::pipe()
        .atomic()
        .hset(family(key).body, id, body)
        .zadd(key, id, due)
        .query_async(r)
        .await
        .unwrap();
}

/// The console of an id-mode business `billing` with the admin token, and
/// a Redis connection.
async fn billing_console() -> (
    BusinessSpec,
    ConsoleDaemon,
    redis::aio::MultiplexedConnection,
) {
    let billing = id_business("billing");
    let c = ConsoleDaemon::start(&[&billing], Some(TOKEN)).await;
    let r = c.setup.redis.clone();
    (billing, c, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_counts_the_api_returns_on_a_laptop_and_a_phone() {
    let billing = id_business("billing");
    let mail = BusinessSpec::random("mail");
    let c = ConsoleDaemon::start(&[&billing, &mail], Some(TOKEN)).await;
    let mut r = c.setup.redis.clone();
    let now = redis_now_ms(&mut r).await;
    for i in 0..7 {
        schedule_id(
            &mut r,
            &billing.key,
            &format!("inv-{i}"),
            "{}",
            now + 60_000 * (i + 1) * 7,
        )
        .await;
    }
    seed_dead(
        &mut r,
        &billing.key,
        &[(
            "inv-x",
            "returned as unroutable (312 NO_ROUTE) after 5 attempts",
        )],
    )
    .await;
    let items: Vec<(f64, Vec<u8>)> = (0..40)
        .map(|i| {
            (
                (now + 3_600_000 * (i % 30 + 1)) as f64,
                format!("mail-{i}").into_bytes(),
            )
        })
        .collect();
    zadd_many(&mut r, &mail.key, &items).await;

    let b = Browser::start(1280, 900).await;
    b.open(c.port, "").await;
    let api = api_get(c.port, "/api/v1/businesses").await;
    for row in api.json["businesses"].as_array().unwrap() {
        let name = row["name"].as_str().unwrap();
        for field in ["pending", "due_now", "in_flight", "dead"] {
            let want = row[field].to_string();
            b.wait_cell(&format!("tr[data-business=\"{name}\"]"), field, &want)
                .await;
        }
    }
    b.wait_cell("tr[data-business=\"billing\"]", "pending", "7")
        .await;
    b.wait_cell("tr[data-business=\"mail\"]", "pending", "40")
        .await;
    // On a laptop the whole overview row is in view, with no sideways scroll.
    let overview = "const s = document.querySelector('#overview .scroll'); return s.scrollWidth - s.clientWidth;";
    b.assert_fits(overview, "the overview is wider than a 1280px window")
        .await;
    b.screenshot("overview").await;

    // The histogram of what comes due, from the link in the overview.
    b.click("tr[data-business=\"billing\"] a").await;
    b.wait_text("#histogram h3", |t| {
        t.starts_with("overdue and the next hour, by minute: 7")
    })
    .await;
    let url = b.client.current_url().await.unwrap();
    assert!(
        url.fragment().unwrap_or("").contains("tab=histogram"),
        "{url}"
    );
    b.screenshot("histogram").await;

    // On a phone the page fits its width; wide tables scroll in place.
    b.client.set_window_size(390, 844).await.unwrap();
    b.open(c.port, "#b=mail&tab=pending").await;
    b.wait_text("#pending tbody tr td.text", |t| t == "mail-0")
        .await;
    let page = "return document.documentElement.scrollWidth - window.innerWidth;";
    b.assert_fits(page, "the page is wider than a phone").await;
    b.screenshot("pending-phone").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_found_by_id_and_a_hostile_body_renders_as_text() {
    let (billing, c, mut r) = billing_console().await;
    let now = redis_now_ms(&mut r).await;
    let hostile =
        "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\"><b>bold?</b>";
    schedule_id(&mut r, &billing.key, "order-42", hostile, now + 3_600_000).await;

    let b = Browser::start(1280, 900).await;
    b.open(c.port, "#b=billing&tab=find").await;
    b.type_into("#find-input", "order-42").await;
    b.click("#find-go").await;
    b.wait_text("dd[data-field=\"state\"]", |t| t == "pending")
        .await;
    let shown = b.wait_text("#task-body", |t| !t.is_empty()).await;
    assert_eq!(shown, hostile, "the body is shown as the text it is");
    let checks = b
        .client
        .execute(
            "return [typeof window.__pwned, document.querySelectorAll('#task img, #task script, #task b').length];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        checks,
        json!(["undefined", 0]),
        "markup in a body must not become elements"
    );
    b.screenshot("task").await;

    // The view is in the URL: a reload shows the same task.
    b.client.refresh().await.unwrap();
    b.wait_text("dd[data-field=\"id\"]", |t| t == "order-42")
        .await;
    b.open(c.port, "#b=billing&tab=find&id=nope").await;
    b.wait_text("dd[data-field=\"state\"]", |t| t == "not_found")
        .await;
    b.close().await;
}

/// A dead task `id` of the id-mode business on `key`, with its body, dead
/// for `reason`.
async fn dead_invoice(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    id: &str,
    reason: &str,
) {
    let _: () = query(r, "HSET", (&family(key).body, id, "the invoice")).await;
    seed_dead(r, key, &[(id, reason)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_task_is_requeued_with_the_token_and_refused_without_it() {
    let (billing, c, mut r) = billing_console().await;
    let fam = family(&billing.key);
    let unroutable = "returned as unroutable (312 NO_ROUTE) after 5 attempts";
    dead_invoice(&mut r, &billing.key, "inv-7", unroutable).await;
    seed_dead(&mut r, &billing.key, &[("<i>odd</i>", "rejected")]).await;

    let b = Browser::start(1280, 900).await;
    b.open(c.port, "#b=billing&tab=dead").await;
    b.wait_text("tr[data-member=\"inv-7\"] td:nth-child(3)", |t| {
        t.contains("NO_ROUTE")
    })
    .await;
    b.wait_text("#dead-summary", |t| t.starts_with("2 dead"))
        .await;
    b.screenshot("dead").await;

    // No token typed: the page is read-only, its write buttons hidden.
    b.wait_text("#mode", |t| t.contains("read-only")).await;
    assert!(
        !b.shown("tr[data-member=\"inv-7\"] button[data-act=\"requeue\"]")
            .await,
        "a write button shows without the admin token"
    );
    let still: Option<f64> = zscore(&mut r, &fam.dead, "inv-7").await;
    assert!(still.is_some(), "refused, so still dead");

    // With the token: requeued, then delivered.
    b.use_token(TOKEN).await;
    b.wait_text("#token-state", |t| t.contains("token set"))
        .await;
    b.click("tr[data-member=\"inv-7\"] button[data-act=\"requeue\"]")
        .await;
    b.wait_text("#dead-confirm", |t| t.contains("requeue 1 dead member"))
        .await;
    b.click("#dead-confirm-go").await;
    b.wait_text("#result", |t| t == "requeue: 1 done").await;
    c.setup.inbox().wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(c.setup.inbox().all()[0].body, b"the invoice");
    b.wait_text("#dead-summary", |t| t.starts_with("1 dead"))
        .await;
    b.screenshot("requeued").await;
    let stored = b
        .client
        .execute(
            "return sessionStorage.length + ':' + document.cookie;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        stored,
        json!("1:"),
        "the token lives in sessionStorage, no cookie"
    );
    b.close().await;
}

/// The page refreshes every few seconds and used to rebuild its tables:
/// a click on its way to a button landed on one already replaced, and was
/// lost (seen as a stale element in a whole run). A refresh that changes
/// nothing in a row keeps its buttons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_button_found_before_a_refresh_still_takes_the_click_after_it() {
    let (billing, c, mut r) = billing_console().await;
    dead_invoice(&mut r, &billing.key, "inv-8", "rejected").await;
    let b = Browser::start(1280, 900).await;
    b.open(c.port, "#b=billing&tab=dead").await;
    b.use_token(TOKEN).await;
    let button = b
        .interactable("tr[data-member=\"inv-8\"] button[data-act=\"requeue\"]")
        .await;
    // Refreshes every 2 s; two of them shown means one whole refresh,
    // its tables too, came after the button was found.
    let select = b.interactable("#poll").await;
    select.select_by_value("2000").await.unwrap();
    let first = b
        .wait_text("#poll-state", |t| t.contains("every 2 s"))
        .await;
    let second = b.wait_text("#poll-state", |t| t != first).await;
    b.wait_text("#poll-state", |t| t != second).await;
    button
        .click()
        .await
        .unwrap_or_else(|e| panic!("the requeue button found before the refreshes: {e}"));
    b.wait_text("#dead-confirm", |t| t.contains("requeue 1 dead member"))
        .await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_need_the_read_token_and_the_admin_token_pauses_and_is_audited() {
    const READ: &str = "browser-read-token-0123456789";
    let billing = id_business("billing");
    let c = ConsoleDaemon::start_with_tokens(&[&billing], READ, TOKEN).await;
    let mut r = c.setup.redis.clone();
    let later = redis_now_ms(&mut r).await + 3_600_000;
    schedule_id(&mut r, &billing.key, "inv-1", "an invoice", later).await;

    let b = Browser::start(1280, 900).await;
    b.open(c.port, "#b=billing&tab=pending").await;
    b.wait_text("#error", |t| t.contains("needs a token to read"))
        .await;
    b.screenshot("token-needed").await;

    // The read token: everything shows, nothing can be changed.
    b.use_token(READ).await;
    b.wait_text("#mode", |t| t.contains("read-only")).await;
    b.wait_text("#pending tbody", |t| t.contains("inv-1")).await;
    assert!(!b.shown("#pause-toggle").await, "pause shows to a reader");
    b.wait_text("#pause-state", |t| t == "running").await;

    // The admin token: pause, shown at once, in the overview and the log.
    b.use_token(TOKEN).await;
    b.wait_text("#mode", |t| t.contains("writes allowed")).await;
    b.click("#pause-toggle").await;
    b.wait_text("#pause-state", |t| t.starts_with("paused by admin_token"))
        .await;
    b.wait_text(
        "tr[data-business=\"billing\"] td[data-field=\"paused\"]",
        |t| t.starts_with("paused by admin_token"),
    )
    .await;
    b.screenshot("paused").await;
    let key: Option<String> = query(&mut r, "GET", family(&billing.key).paused).await;
    assert!(key.is_some_and(|v| v.ends_with(" admin_token")));

    b.click("#audit-link").await;
    b.wait_text("#audit-log tbody tr[data-action=\"pause\"]", |t| {
        t.contains("admin_token") && t.contains("billing")
    })
    .await;
    b.screenshot("audit").await;
    let page = b.client.source().await.unwrap();
    assert!(
        !page.contains(READ) && !page.contains(TOKEN),
        "a token in the page"
    );
    b.close().await;
    let (code, _, _) = delayd(&["resume", "-c", c.setup.config.to_str().unwrap(), "billing"]);
    assert_eq!(code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_searched_and_a_bulk_cancel_counts_first_then_cancels_the_count_confirmed() {
    let (billing, c, mut r) = billing_console().await;
    let now = redis_now_ms(&mut r).await;
    let fam = family(&billing.key);
    let mut p = redis::pipe();
    for i in 0..1500 {
        let id = format!("batch-{i}");
        p.hset(
            &fam.body,
            &id,
            format!("{{\"order\":{i},\"for\":\"ACME-{i};\"}}"),
        )
        .ignore();
        p.zadd(&billing.key, &id, now + 86_400_000).ignore();
    }
    for id in ["keep-1", "keep-2", "keep-3"] {
        p.hset(&fam.body, id, "kept").ignore();
        p.zadd(&billing.key, id, now + 86_400_000).ignore();
    }
    let _: () = p.query_async(&mut r).await.unwrap();

    let b = Browser::start(1280, 900).await;
    b.open(c.port, "#b=billing&tab=find").await;
    b.use_token(TOKEN).await;
    b.wait_text("#token-state", |t| t.contains("token set"))
        .await;
    b.type_into("#body-input", "ACME-77;").await;
    b.click("#body-go").await;
    b.wait_text("#search-note", |t| t.starts_with("1 found"))
        .await;
    let row = b
        .wait_text("#search tbody tr", |t| t.contains("batch-77"))
        .await;
    assert!(row.contains("\"for\":\"ACME-77;\""), "{row}");
    b.screenshot("body-search").await;

    b.open(c.port, "#b=billing&tab=bulk").await;
    b.type_into("#bulk-prefix", "batch-").await;
    b.click("#bulk-count").await;
    b.wait_text("#bulk-confirm", |t| t.starts_with("cancel 1500 "))
        .await;
    assert_eq!(
        zcard(&mut r, &billing.key).await,
        1503,
        "a count changes nothing"
    );
    b.screenshot("bulk-count").await;
    b.click("#bulk-go").await;
    b.wait_text("#result", |t| t == "cancel: 1500 done").await;
    b.wait_text("#bulk-progress", |t| {
        t.contains("1500 of at most 1500 done")
    })
    .await;
    b.screenshot("bulk-done").await;
    assert_eq!(
        zcard(&mut r, &billing.key).await,
        3,
        "only the other ids are left"
    );
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedules_tab_shows_each_schedule_and_pauses_resumes_and_runs_one_now() {
    let mut reports = BusinessSpec::random("reports");
    reports.extra = format!(
        "properties = \"standard\"\n[businesses.{n}.recurring.nightly]\ncron = \"0 30 2 * * *\"\ntz = \"Europe/Berlin\"\nbody = \"nightly report\"\n[businesses.{n}.recurring.tick]\ncron = \"* * * * * *\"\nbody = \"tick\"\nwrite_ahead = \"2s\"\n",
        n = reports.name
    );
    let c = ConsoleDaemon::start(&[&reports], Some(TOKEN)).await;
    let inbox = c.setup.inbox().clone();
    inbox.wait_for(2, Duration::from_secs(15)).await;
    let b = Browser::start(1280, 900).await;
    b.open(c.port, "#b=reports&tab=schedules").await;
    b.use_token(TOKEN).await;
    b.wait_text(
        "tr[data-schedule=\"nightly\"] td[data-field=\"next\"]",
        |t| t.contains("02:30:00 CE"),
    )
    .await;
    b.wait_text("tr[data-schedule=\"tick\"] td[data-field=\"last\"]", |t| {
        t.contains("ago")
    })
    .await;

    b.pause_row("tr[data-schedule=\"tick\"]").await;
    let api = api_get(c.port, "/api/v1/businesses/reports/schedules").await;
    let tick = &api.json["schedules"][1];
    assert_eq!(tick["name"], "tick");
    assert_eq!(tick["paused"]["by"], "admin_token", "{}", api.text);

    b.click("tr[data-schedule=\"nightly\"] button[data-act=\"run\"]")
        .await;
    b.wait_text("#result", |t| t.starts_with("due_now")).await;
    let ran = eventually(Duration::from_secs(10), || async {
        inbox.all().iter().any(|m| m.body == b"nightly report")
    })
    .await;
    assert!(ran, "run now delivered nothing");
    b.screenshot("schedules").await;

    b.resume_row("tr[data-schedule=\"tick\"]").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_refresh_without_a_reload_at_the_chosen_interval_beside_the_intake() {
    let mut billing = id_business("billing");
    let intake_ex = unique("intake-ex");
    billing.extra = format!(
        "member = \"id\"\nproperties = \"standard\"\n[businesses.billing.intake]\nexchange = \"{intake_ex}\"\nqueue = \"{}\"\n",
        unique("intake-q")
    );
    let c = ConsoleDaemon::start(&[&billing], Some(TOKEN)).await;
    let b = Browser::start(1280, 900).await;
    b.open(c.port, "").await;
    b.wait_cell("#intake tr[data-business=\"billing\"]", "consumer", "up")
        .await;
    // Two seconds between refreshes, shown and kept.
    let select = b.interactable("#poll").await;
    select.select_by_value("2000").await.unwrap();
    b.wait_text("#poll-state", |t| t.contains("every 2 s"))
        .await;

    // Tasks arrive through the intake; the page shows them without a reload.
    b.js("window.firstLoad = 42; return 1").await;
    for i in 0..3 {
        let props = delayed(lapin::types::AMQPValue::LongInt(3_600_000));
        let body = format!("order {i}");
        publish_props(&c.setup.ch, &intake_ex, "", body.as_bytes(), props).await;
    }
    b.wait_cell("tr[data-business=\"billing\"]", "pending", "3")
        .await;
    b.wait_cell("#intake tr[data-business=\"billing\"]", "taken_in", "3")
        .await;
    let same = b.js("return window.firstLoad === 42").await;
    assert_eq!(same, json!(true), "the page was reloaded");
    b.screenshot("live").await;
    let kept = b.js("return localStorage.getItem('delayd-poll-ms')").await;
    assert_eq!(kept, json!("2000"));
    let row = c.overview_of("billing").await;
    assert_eq!(row["intake"]["consuming"], true, "{row}");
    assert_eq!(row["intake"]["taken_in_total"], 3, "{row}");
    b.close().await;
}

/// Types `value` into globex's input labelled `label` on the tenants tab,
/// clicks its `act` button, and waits for the row's `act` cell to say `shown`.
async fn set_globex(b: &Browser, act: &str, label: &str, value: &str, shown: &str) {
    let row = "tr[data-tenant=\"globex\"]";
    b.type_into(&format!("{row} input[aria-label=\"{label}\"]"), value)
        .await;
    b.click(&format!("{row} button[data-act=\"{act}\"]")).await;
    b.wait_cell(row, act, shown).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenants_tab_lists_each_tenant_and_pauses_weighs_caps_and_resumes_one_and_the_pending_and_find_tabs_take_one_tenant(
) {
    let shop = BusinessSpec::with_extra("shop", "tenants = true");
    let c = ConsoleDaemon::start(&[&shop], Some(TOKEN)).await;
    let mut r = c.setup.redis.clone();
    let f = family(&shop.key);
    // Two tenants as a producer writes them, due in an hour: acme 3, globex 1.
    let due = redis_now_ms(&mut r).await + 3_600_000;
    for (tenant, n) in [("acme", 3), ("globex", 1)] {
        let items: Vec<(f64, Vec<u8>)> = (0..n)
            .map(|i| ((due + i) as f64, format!("{tenant}-{i}").into_bytes()))
            .collect();
        zadd_tenant(&mut r, &shop.key, tenant, &items).await;
    }
    let b = Browser::start(1280, 900).await;
    b.open(c.port, "#b=shop&tab=tenants").await;
    b.use_token(TOKEN).await;
    b.wait_cell("tr[data-tenant=\"acme\"]", "pending", "3")
        .await;
    b.wait_cell("tr[data-tenant=\"globex\"]", "pending", "1")
        .await;

    b.pause_row("tr[data-tenant=\"acme\"]").await;
    let api = api_get(c.port, "/api/v1/businesses/shop/tenants").await;
    let acme = find_row(&api.json["rows"], "tenant", "acme").unwrap();
    assert_eq!(acme["paused"]["by"], "admin_token", "{}", api.text);
    assert_eq!(api.json["paused"], 1, "{}", api.text);

    set_globex(&b, "weight", "weight of globex", "3", "3 (set)").await;
    let weight: Option<String> = query(&mut r, "HGET", (f.tenant_weights(), "globex")).await;
    assert_eq!(weight.as_deref(), Some("3"));
    set_globex(&b, "max_rate", "max rate of globex", "500", "500/s (set)").await;
    let max_rate: Option<String> = query(&mut r, "HGET", (f.tenant_max_rates(), "globex")).await;
    assert_eq!(max_rate.as_deref(), Some("500"));
    b.screenshot("tenants").await;

    b.resume_row("tr[data-tenant=\"acme\"]").await;

    // The pending tab lists the tenants' tasks, or one tenant's.
    b.click("#tabs a[data-tab=\"pending\"]").await;
    b.wait_text("#pending tbody", |t| {
        t.contains("acme-2") && t.contains("globex-0")
    })
    .await;
    // A refresh every 2 s, and one of them between typing and submitting:
    // the refresh must not wipe what was typed.
    let select = b.interactable("#poll").await;
    select.select_by_value("2000").await.unwrap();
    b.type_into("#pending-tenant", "globex").await;
    let first = b
        .wait_text("#poll-state", |t| t.contains("every 2 s"))
        .await;
    b.wait_text("#poll-state", |t| t != first).await;
    b.click("#pending-form button[type=\"submit\"]").await;
    b.wait_text("#pending tbody", |t| {
        t.contains("globex-0") && !t.contains("acme")
    })
    .await;

    // The find tab's prefix search walks every tenant's set, or one's.
    b.click("#tabs a[data-tab=\"find\"]").await;
    b.type_into("#find-input", "acme-").await;
    b.click("#find-go").await;
    b.wait_text("#search-note", |t| t == "3 found; searched to the end")
        .await;
    b.type_into("#find-tenant", "globex").await;
    b.click("#find-go").await;
    b.wait_text("#search-note", |t| t == "0 found; searched to the end")
        .await;
    b.close().await;
}

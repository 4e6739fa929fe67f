//! The alert rules (deploy/prometheus/alerts.yml) and the Grafana dashboard
//! name only metrics and labels a running delayd exports, every alert has its
//! runbook in docs/operations.md, and the Prometheus of docker-compose.yml
//! loads the rules. (promtool checks and unit-tests the rules themselves:
//! deploy/local/test.sh.) The `*_is_caught` tests feed altered input to the
//! same checks, so a drift cannot pass unnoticed.

use delayd_test_support as common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::*;
use serde_norway::Value;

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

/// Sample name -> the label names its samples carry, from a `/metrics` page.
type Exported = BTreeMap<String, BTreeSet<String>>;

/// Reads the sample lines of Prometheus text exposition.
fn exported(page: &str) -> Exported {
    let mut out = Exported::new();
    for line in page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..end].to_string()).or_default();
        if line[end..].starts_with('{') {
            labels.extend(label_names_of_sample(&line[end + 1..]));
        }
    }
    out
}

/// The label names of `a="x",b="y\"z"}...`.
fn label_names_of_sample(rest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = rest.chars();
    loop {
        let name: String = chars.by_ref().take_while(|&c| c != '=').collect();
        let name = name.trim_start_matches(',').trim();
        if name.is_empty() || name.starts_with('}') {
            return names;
        }
        names.push(name.to_string());
        chars.next(); // the opening quote
        let mut escaped = false;
        for c in chars.by_ref() {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => break,
                _ => escaped = false,
            }
        }
    }
}

/// The metric names and label names a PromQL expression (or a Grafana
/// `label_values(metric, label)` query) uses.
#[derive(Debug, Default)]
struct Uses {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

/// Functions and modifiers whose parenthesised list names labels.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn uses(expr: &str) -> Uses {
    let mut u = Uses::default();
    let s: Vec<char> = expr.chars().collect();
    let mut i = 0;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i);
        } else if c == '[' {
            // A range or subquery duration, or a Grafana variable in it.
            while i < s.len() && s[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            i += 1;
            while i < s.len() && s[i] != '}' {
                if s[i] == '"' || s[i] == '\'' || s[i] == '`' {
                    i = skip_string(&s, i);
                } else if ident(s[i]) {
                    let start = i;
                    while i < s.len() && ident(s[i]) {
                        i += 1;
                    }
                    u.labels.insert(s[start..i].iter().collect());
                } else {
                    i += 1;
                }
            }
            i += 1;
        } else if c == '$' {
            // A Grafana variable.
            i += 1;
            while i < s.len() && ident(s[i]) {
                i += 1;
            }
        } else if ident(c) && !c.is_ascii_digit() {
            let start = i;
            while i < s.len() && ident(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let mut j = i;
            while j < s.len() && s[j].is_whitespace() {
                j += 1;
            }
            let call = j < s.len() && s[j] == '(';
            if call && (LABEL_LISTS.contains(&word.as_str()) || word == "label_values") {
                let close = j + s[j..].iter().position(|&c| c == ')').unwrap_or(s.len() - j);
                let inner: String = s[j + 1..close].iter().collect();
                let mut parts: Vec<&str> = inner.split(',').map(str::trim).collect();
                if word == "label_values" {
                    // label_values(metric, label) or label_values(label).
                    let label = parts.pop().unwrap_or_default();
                    u.labels.insert(label.to_string());
                    for p in parts {
                        u.metrics.extend(uses(p).metrics);
                        u.labels.extend(uses(p).labels);
                    }
                } else {
                    u.labels.extend(
                        parts
                            .into_iter()
                            .filter(|p| !p.is_empty())
                            .map(String::from),
                    );
                }
                i = close + 1;
            } else if word.starts_with("delayd_") && !call {
                u.metrics.insert(word);
            }
        } else {
            i += 1;
        }
    }
    u
}

/// The index after the string literal that starts at `i`.
fn skip_string(s: &[char], i: usize) -> usize {
    let quote = s[i];
    let mut j = i + 1;
    while j < s.len() && s[j] != quote {
        if s[j] == '\\' && quote != '`' {
            j += 1;
        }
        j += 1;
    }
    j + 1
}

/// Labels Prometheus adds to every scraped series (target labels), and the
/// bucket bound of histogram samples.
fn label_is_prometheus_own(label: &str, u: &Uses) -> bool {
    matches!(label, "instance" | "job")
        || (label == "le" && u.metrics.iter().any(|m| m.ends_with("_bucket")))
}

/// What `exprs` (from `file`) name that `exported` lacks: a metric delayd
/// does not export, or a label none of the expression's metrics carry.
fn naming_problems(file: &str, exprs: &[String], exported: &Exported) -> Vec<String> {
    let mut p = Vec::new();
    for expr in exprs {
        let u = uses(expr);
        let mut carried = BTreeSet::new();
        for m in &u.metrics {
            match exported.get(m) {
                Some(labels) => carried.extend(labels.iter().cloned()),
                None => p.push(format!(
                    "{file}: {m} is not a metric delayd exports (in `{}`)",
                    expr.trim()
                )),
            }
        }
        for l in &u.labels {
            if !carried.contains(l) && !label_is_prometheus_own(l, &u) {
                p.push(format!(
                    "{file}: label {l} is carried by none of {:?} (in `{}`)",
                    u.metrics,
                    expr.trim()
                ));
            }
        }
    }
    p
}

/// (alert name, its expression, its runbook annotation) for every rule.
fn alert_rules(text: &str) -> Vec<(String, String, Option<String>)> {
    let doc: Value = serde_norway::from_str(text).expect("alerts.yml is YAML");
    let mut out = Vec::new();
    for group in doc["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("an alert name").to_string();
            let expr = rule["expr"].as_str().expect("an expr").to_string();
            let runbook = rule["annotations"]["runbook"].as_str().map(String::from);
            out.push((name, expr, runbook));
        }
    }
    out
}

/// Every query of a Grafana dashboard: panel targets (in rows too) and
/// template variables.
fn dashboard_queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", serde_json::Value::String(s))
                        if s.contains("delayd_") =>
                    {
                        out.push(s.clone())
                    }
                    _ => dashboard_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

fn dashboard_exprs() -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/delayd-dashboard.json")).unwrap();
    let mut out = Vec::new();
    dashboard_queries(&v, &mut out);
    assert!(out.len() > 10, "found only {} dashboard queries", out.len());
    out
}

fn rule_exprs() -> Vec<String> {
    alert_rules(&read("deploy/prometheus/alerts.yml"))
        .into_iter()
        .map(|(_, e, _)| e)
        .collect()
}

/// A daemon with a business that delivers, one whose every publish comes
/// back unroutable (so the by-reason counters appear), and one with an
/// intake, driven until each has done its part: its `/metrics` page.
async fn metrics_of_a_driven_daemon() -> String {
    let delivered = BusinessSpec::random("delivered");
    let unroutable =
        BusinessSpec::with_extra("unroutable", "max_attempts = 2\nretry_backoff = \"10ms\"");
    let c = Consumers::on(&amqp_url(), &[&delivered]).await;
    declare_exchange(&c.ch, &unroutable.exchange).await;
    let (intake_ex, intake_q) = (unique("intake-ex"), unique("intake-q"));
    let intake = BusinessSpec {
        name: "taken_in".into(),
        key: unique("test:intake"),
        exchange: delivered.exchange.clone(),
        routing_key: String::new(),
        extra: format!(
            "member = \"id\"\nproperties = \"standard\"\n[businesses.taken_in.intake]\nexchange = \"{intake_ex}\"\nqueue = \"{intake_q}\"\n"
        ),
    };
    let config = write_config(
        c.dir.path(),
        &redis_url(),
        &amqp_url(),
        &[&delivered, &unroutable, &intake],
    );
    let port = listen_on_free_port(&config, 17100..17600);
    let d = Daemon::start(&config);
    let mut redis = redis().await;
    schedule_due_now(&mut redis, &delivered.key, "m", 1).await;
    schedule_due_now(&mut redis, &unroutable.key, "u", 1).await;
    c.inbox().wait_for(1, Duration::from_secs(20)).await;
    let dead_line = "delayd_dead_lettered_total{business=\"unroutable\",reason=";
    let page = poll_for(
        Duration::from_secs(20),
        "the unroutable member was not dead-lettered within 20 s",
        || {
            http_get(port, "/metrics")
                .map(|(_, page)| page)
                .filter(|page| page.contains(dead_line))
        },
    );
    drop(d);
    let ch = c.amqp.create_channel().await.unwrap();
    delete_topology(
        &ch,
        &[c.queues[0].as_str(), intake_q.as_str()],
        &[
            delivered.exchange.as_str(),
            unroutable.exchange.as_str(),
            intake_ex.as_str(),
        ],
    )
    .await;
    for b in [&delivered, &unroutable, &intake] {
        del_family(&mut redis, &b.key).await;
    }
    page
}

#[tokio::test]
async fn the_dashboard_and_the_alert_rules_name_only_metrics_and_labels_delayd_exports() {
    let page = metrics_of_a_driven_daemon().await;
    let exported = exported(&page);
    let mut problems = naming_problems("deploy/prometheus/alerts.yml", &rule_exprs(), &exported);
    problems.extend(naming_problems(
        "deploy/grafana/delayd-dashboard.json",
        &dashboard_exprs(),
        &exported,
    ));
    assert_none(problems);
    assert!(
        exported.len() > 20,
        "only {} series names on /metrics:\n{page}",
        exported.len()
    );
}

#[test]
fn a_metric_or_label_delayd_does_not_export_is_caught() {
    let exported = exported(
        "# HELP delayd_pending x\ndelayd_pending{business=\"a\"} 3\n\
         delayd_lateness_seconds_bucket{business=\"a\",le=\"+Inf\"} 1\n",
    );
    let ok = [
        "max by (business) (delayd_pending{business=~\"$business\"})",
        "histogram_quantile(0.99, sum by (business, le) (rate(delayd_lateness_seconds_bucket[$__rate_interval])))",
        "label_values(delayd_pending, business)",
        "up{job=\"delayd\"} == 0",
    ]
    .map(String::from);
    assert_none(naming_problems("ok", &ok, &exported));
    let bad = [
        "max by (business) (delayd_pendng)",
        "max by (shard) (delayd_pending)",
        "delayd_pending{tenant=\"x\"}",
        "sum by (le) (delayd_pending)",
        "label_values(delayd_pending, queue)",
    ]
    .map(String::from);
    let problems = naming_problems("bad", &bad, &exported);
    for what in [
        "delayd_pendng is not a metric",
        "label shard",
        "label tenant",
        "label le",
        "label queue",
    ] {
        assert!(
            problems.iter().any(|p| p.contains(what)),
            "{what:?} not caught: {problems:?}"
        );
    }
}

/// The `### Name` headings of docs/operations.md as GitHub anchors.
fn operations_anchors(doc: &str) -> BTreeSet<String> {
    doc.lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| {
            h.trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

fn runbook_problems(rules: &str, doc: &str) -> Vec<String> {
    let anchors = operations_anchors(doc);
    let mut p = Vec::new();
    for (name, _, runbook) in alert_rules(rules) {
        let want = format!("docs/operations.md#{}", name.to_lowercase());
        match runbook {
            Some(r) if r == want && anchors.contains(&name.to_lowercase()) => {}
            Some(r) if r == want => p.push(format!(
                "{name}: docs/operations.md has no \"### {name}\" section"
            )),
            other => p.push(format!("{name}: runbook {other:?}, expected {want}")),
        }
    }
    p
}

#[test]
fn every_alert_has_a_runbook_section_in_operations_md() {
    let rules = read("deploy/prometheus/alerts.yml");
    assert!(alert_rules(&rules).len() >= 8);
    assert_none(runbook_problems(&rules, &read("docs/operations.md")));
}

#[test]
fn an_alert_without_its_runbook_section_is_caught() {
    let rules = read("deploy/prometheus/alerts.yml");
    let doc = read("docs/operations.md").replace("### DelaydDeadSetGrowing", "### Dead set");
    let problems = runbook_problems(&rules, &doc);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("DelaydDeadSetGrowing"), "{problems:?}");
    let rules = rules.replace("#delaydpublishblocked", "#blocked");
    let problems = runbook_problems(&rules, &read("docs/operations.md"));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("DelaydPublishBlocked"), "{problems:?}");
}

#[test]
fn the_compose_prometheus_loads_the_alert_rules() {
    let prom: Value = serde_norway::from_str(&read("deploy/prometheus/prometheus.yml")).unwrap();
    let compose: Value = serde_norway::from_str(&read("docker-compose.yml")).unwrap();
    let files: Vec<&str> = prom["rule_files"]
        .as_sequence()
        .expect("prometheus.yml has rule_files")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mounts: Vec<&str> = compose["services"]["prometheus"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let want = "./deploy/prometheus/alerts.yml:";
    let mounted = mounts
        .iter()
        .find_map(|m| m.strip_prefix(want))
        .map(|rest| rest.trim_end_matches(":ro"));
    assert!(
        mounted.is_some_and(|at| files.contains(&at)),
        "compose mounts alerts.yml at {mounted:?}; prometheus.yml loads {files:?}"
    );
}

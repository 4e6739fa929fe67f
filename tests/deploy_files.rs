//! The deployment files name images, ports, probe paths, the config path,
//! environment overrides and a user. These tests hold each of them against
//! what the image (deploy/Dockerfile) and the binary really use: the config
//! each file mounts is loaded through delayd's own loader with the file's
//! environment, and the probe paths are asked of a running daemon. The
//! `*_is_caught` tests feed altered files to the same checks, so a drift
//! cannot pass unnoticed.

use delayd_test_support as common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::assert_none;
use delayd::config::{Config, LogFormat};
use serde_norway::Value;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(REPO).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn yaml(text: &str) -> Value {
    serde_norway::from_str(text).expect("valid YAML")
}

fn yaml_docs(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("valid YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

/// `v` at a dotted path of mapping keys.
fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// A scalar as text (numbers and booleans too).
fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_sequence)
        .map(|s| s.iter().filter_map(|x| text(Some(x))).collect())
        .unwrap_or_default()
}

// --- the image -----------------------------------------------------------------

/// What deploy/Dockerfile says about the image it builds.
#[derive(Debug, Default)]
struct Image {
    /// Global `ARG` defaults, with `${VAR}` of earlier ones expanded.
    args: BTreeMap<String, String>,
    froms: Vec<String>,
    user: String,
    expose: Vec<u16>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    stop_signal: String,
    /// (sources, destination) of every COPY of the last stage.
    copies: Vec<(Vec<String>, String)>,
    /// `--uid`/`--gid` given to useradd/groupadd.
    created_uid: Option<u32>,
    created_gid: Option<u32>,
}

impl Image {
    fn parse(dockerfile: &str) -> Image {
        let mut img = Image::default();
        let mut lines = Vec::new();
        let mut cur = String::new();
        for line in dockerfile.lines() {
            let t = line.trim();
            if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
                continue;
            }
            match t.strip_suffix('\\') {
                Some(part) => {
                    cur.push_str(part);
                    cur.push(' ');
                }
                None => {
                    cur.push_str(t);
                    lines.push(std::mem::take(&mut cur));
                }
            }
        }
        let flag = |words: &[&str], name: &str| -> Option<u32> {
            words
                .windows(2)
                .find(|w| w[0] == name)
                .and_then(|w| w[1].parse().ok())
        };
        for line in lines {
            let (instr, rest) = line.split_once(' ').unwrap_or((&line, ""));
            let rest = rest.trim();
            let words: Vec<&str> = rest.split_whitespace().collect();
            match instr.to_ascii_uppercase().as_str() {
                "ARG" if img.froms.is_empty() => {
                    if let Some((k, v)) = rest.split_once('=') {
                        let mut v = v.to_string();
                        for (name, val) in &img.args {
                            v = v.replace(&format!("${{{name}}}"), val);
                        }
                        img.args.insert(k.to_string(), v);
                    }
                }
                "FROM" => {
                    img.froms.push(words[0].to_string());
                    img.copies.clear();
                }
                "USER" => img.user = rest.to_string(),
                "EXPOSE" => img.expose.extend(
                    words
                        .iter()
                        .filter_map(|w| w.trim_end_matches("/tcp").parse::<u16>().ok()),
                ),
                "ENTRYPOINT" => img.entrypoint = serde_json::from_str(rest).expect("exec form"),
                "CMD" => img.cmd = serde_json::from_str(rest).expect("exec form"),
                "STOPSIGNAL" => img.stop_signal = rest.to_string(),
                "COPY" => {
                    let paths: Vec<String> = words
                        .iter()
                        .filter(|w| !w.starts_with("--"))
                        .map(|w| w.to_string())
                        .collect();
                    if let Some((dest, srcs)) = paths.split_last() {
                        img.copies.push((srcs.to_vec(), dest.clone()));
                    }
                }
                "RUN" => {
                    if words.contains(&"useradd") {
                        img.created_uid = flag(&words, "--uid");
                    }
                    if words.contains(&"groupadd") {
                        img.created_gid = flag(&words, "--gid");
                    }
                }
                _ => {}
            }
        }
        img
    }

    fn uid_gid(&self) -> (Option<u32>, Option<u32>) {
        let (u, g) = self.user.split_once(':').unwrap_or((&self.user, ""));
        (u.parse().ok(), g.parse().ok())
    }

    /// The config path of the default command (`run --config PATH`).
    fn config_path(&self) -> Option<&str> {
        config_arg(&self.cmd)
    }
}

fn config_arg(args: &[String]) -> Option<&str> {
    args.windows(2)
        .find(|w| w[0] == "--config" || w[0] == "-c")
        .map(|w| w[1].as_str())
}

fn image() -> Image {
    Image::parse(&read("deploy/Dockerfile"))
}

// --- the binary's view: config file + environment through delayd's loader ----

static ENV_LOCK: Mutex<()> = Mutex::new(());

/// Loads `toml` with exactly the `DELAYD_*` settings in `env`, as the daemon
/// in that container would.
fn load_with_env(toml: &str, env: &[(String, String)]) -> Result<Config, String> {
    let _guard = ENV_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delayd.toml");
    std::fs::write(&path, toml).unwrap();
    for (k, _) in std::env::vars() {
        if k.starts_with("DELAYD_") && !k.starts_with("DELAYD_TEST_") {
            std::env::remove_var(k);
        }
    }
    for (k, v) in env {
        std::env::set_var(k, v);
    }
    let loaded = delayd::config::load(&path).map_err(|e| e.to_string());
    for (k, _) in env {
        std::env::remove_var(k);
    }
    loaded
}

/// Each override must address a setting delayd reads and end up as its
/// value. (The loader ignores DELAYD_ names outside its sections, e.g.
/// `DELAYD_AMQP_URL` with one underscore, so loading alone proves nothing.)
/// The config delayd would run with, its overrides' problems noted in
/// `p`; `None`, with the refusal noted, when delayd refuses its `what`.
fn load_checked(
    f: &str,
    toml: &str,
    env: &[(String, String)],
    what: &str,
    p: &mut Vec<String>,
) -> Option<Config> {
    match load_with_env(toml, env) {
        Ok(cfg) => {
            p.extend(override_problems(f, env, &cfg));
            Some(cfg)
        }
        Err(e) => {
            p.push(format!(
                "{f}: delayd refuses its {what} and environment: {e}"
            ));
            None
        }
    }
}

/// Asserts that one of `problems` says `what`.
#[track_caller]
fn assert_caught(problems: &[String], what: &str) {
    assert!(problems.iter().any(|p| p.contains(what)), "{problems:?}");
}

fn override_problems(file: &str, env: &[(String, String)], cfg: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    for (k, v) in env {
        let effective = match k.as_str() {
            "DELAYD_REDIS__URL" => Some(cfg.redis.urls[0].expose().to_string()),
            "DELAYD_AMQP__URL" => Some(cfg.amqp.urls[0].expose().to_string()),
            "DELAYD_AMQP__URLS" => Some(
                cfg.amqp
                    .urls
                    .iter()
                    .map(|u| u.expose())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            "DELAYD_HTTP__LISTEN" => Some(
                cfg.http_listen
                    .map_or_else(|| "off".to_string(), |a| a.to_string()),
            ),
            "DELAYD_LOG__FORMAT" => Some(
                match cfg.log_format {
                    LogFormat::Json => "json",
                    LogFormat::Text => "text",
                }
                .to_string(),
            ),
            "DELAYD_LOG__LEVEL" => Some(cfg.log_level.clone()),
            "DELAYD_HTTP__READ_TOKEN" => {
                cfg.http_read_token.as_ref().map(|t| t.expose().to_string())
            }
            "DELAYD_HTTP__ADMIN_TOKEN" => cfg
                .http_admin_token
                .as_ref()
                .map(|t| t.expose().to_string()),
            _ => None,
        };
        match effective {
            Some(e) if &e == v => {}
            Some(e) => problems.push(format!(
                "{file}: {k}={v} does not take effect (delayd runs with {e})"
            )),
            None if k.starts_with("DELAYD_BUSINESSES__") => {
                let name = k["DELAYD_BUSINESSES__".len()..]
                    .split("__")
                    .next()
                    .unwrap_or("")
                    .to_ascii_lowercase();
                if !cfg.businesses.iter().any(|b| b.name == name) {
                    problems.push(format!("{file}: {k} names no business of its config"));
                }
            }
            None => problems.push(format!(
                "{file}: {k} is not a setting delayd reads (DELAYD_<SECTION>__<FIELD>, sections REDIS, AMQP, HTTP, LOG, BUSINESSES)"
            )),
        }
    }
    problems
}

/// Listen port of a loaded config, and a problem if it is not reachable from
/// outside the container (loopback) or turned off.
fn listen_port(file: &str, cfg: &Config, problems: &mut Vec<String>) -> Option<u16> {
    match cfg.http_listen {
        Some(a) if a.ip().is_unspecified() => Some(a.port()),
        Some(a) => {
            problems.push(format!(
                "{file}: delayd listens on {a}, which probes and Prometheus cannot reach from outside the container (use 0.0.0.0)"
            ));
            Some(a.port())
        }
        None => {
            problems.push(format!(
                "{file}: the HTTP server is off, so no probe can answer"
            ));
            None
        }
    }
}

fn max_shutdown(cfg: &Config) -> Duration {
    cfg.businesses
        .iter()
        .map(|b| b.shutdown_timeout)
        .max()
        .unwrap_or_default()
}

/// Host and port of a `scheme://[user[:pass]@]host:port/...` URL.
fn url_host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.split_once("://")?.1;
    let hostport = rest.split('/').next()?;
    let hostport = hostport.rsplit_once('@').map_or(hostport, |(_, h)| h);
    let (h, p) = hostport.rsplit_once(':')?;
    Some((h.to_string(), p.parse().ok()?))
}

// --- the checks ------------------------------------------------------------------

const PUBLIC_BUILDER: &str = "rust:1-bookworm";
const PUBLIC_RUNTIME: &str = "debian:bookworm-slim";
/// The tag docker-compose.yml, docs/operations.md and deploy/container/test.sh use.
const LOCAL_TAG: &str = "delayd:local";

fn image_problems(img: &Image) -> Vec<String> {
    let mut p = Vec::new();
    let f = "deploy/Dockerfile";
    for (arg, want) in [
        ("BUILDER_IMAGE", PUBLIC_BUILDER),
        ("RUNTIME_IMAGE", PUBLIC_RUNTIME),
    ] {
        let got = img.args.get(arg).map(String::as_str);
        if got != Some(want) {
            p.push(format!(
                "{f}: ARG {arg} defaults to {got:?}, expected the public {want}"
            ));
        }
    }
    if img.froms != ["${BUILDER_IMAGE}", "${RUNTIME_IMAGE}"] {
        p.push(format!(
            "{f}: FROM lines {:?} do not use the base image arguments",
            img.froms
        ));
    }
    let (uid, gid) = img.uid_gid();
    if uid.is_none() || uid == Some(0) || uid != img.created_uid || gid != img.created_gid {
        p.push(format!(
            "{f}: USER {} does not match the created user (uid {:?}, gid {:?})",
            img.user, img.created_uid, img.created_gid
        ));
    }
    if img.entrypoint != ["delayd"] || !img.copies.iter().any(|(_, d)| d == "/usr/local/bin/delayd")
    {
        p.push(format!(
            "{f}: ENTRYPOINT {:?} is not the delayd binary on PATH",
            img.entrypoint
        ));
    }
    if img.cmd.first().map(String::as_str) != Some("run") {
        p.push(format!("{f}: CMD {:?} does not run the daemon", img.cmd));
    }
    if img.stop_signal != "SIGTERM" {
        p.push(format!(
            "{f}: STOPSIGNAL {} is not SIGTERM, on which delayd stops cleanly",
            img.stop_signal
        ));
    }
    match img.config_path() {
        None => p.push(format!("{f}: CMD {:?} names no --config", img.cmd)),
        Some(path) => match img.copies.iter().find(|(_, d)| d == path) {
            None => p.push(format!("{f}: nothing is copied to the CMD's config {path}")),
            Some((srcs, _)) => {
                let src = &srcs[0];
                match std::fs::read_to_string(Path::new(REPO).join(src))
                    .map_err(|e| e.to_string())
                    .and_then(|t| load_with_env(&t, &[]))
                {
                    Err(e) => p.push(format!("{f}: default config {src}: {e}")),
                    Ok(cfg) => {
                        if let Some(port) = listen_port(src, &cfg, &mut p) {
                            if !img.expose.contains(&port) {
                                p.push(format!(
                                    "{f}: EXPOSE {:?} misses the listen port {port} of {src}",
                                    img.expose
                                ));
                            }
                        }
                    }
                }
            }
        },
    }
    p
}

/// Environment of a compose service: a mapping or a list of `K=V`.
fn compose_env(svc: &Value) -> Vec<(String, String)> {
    match svc.get("environment") {
        Some(Value::Mapping(m)) => m
            .iter()
            .filter_map(|(k, v)| Some((text(Some(k))?, text(Some(v)).unwrap_or_default())))
            .collect(),
        Some(Value::Sequence(s)) => s
            .iter()
            .filter_map(|x| x.as_str()?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        _ => Vec::new(),
    }
}

/// Container-side port of a compose `ports` entry ("127.0.0.1:9464:9464").
fn container_port(entry: &str) -> Option<u16> {
    entry.rsplit(':').next()?.split('/').next()?.parse().ok()
}

fn compose_problems(compose: &Value, img: &Image) -> Vec<String> {
    let f = "docker-compose.yml";
    let mut p = Vec::new();
    let Some(svc) = at(compose, "services.delayd") else {
        return vec![format!("{f}: no delayd service")];
    };
    if text(svc.get("image")).as_deref() != Some(LOCAL_TAG) {
        p.push(format!(
            "{f}: delayd image {:?}, expected {LOCAL_TAG}",
            svc.get("image")
        ));
    }
    let dockerfile = text(at(svc, "build.dockerfile"));
    if text(at(svc, "build.context")).as_deref() != Some(".")
        || dockerfile.as_deref() != Some("deploy/Dockerfile")
    {
        p.push(format!(
            "{f}: delayd must build deploy/Dockerfile with the repository root as context"
        ));
    }
    let args = args_or_cmd(f, "command", strings(svc.get("command")), img, &mut p);
    let Some(config_path) = config_arg(&args).map(str::to_string) else {
        p.push(format!("{f}: command {args:?} names no --config"));
        return p;
    };
    // The file mounted at the config path.
    let mounted = strings(svc.get("volumes")).into_iter().find_map(|v| {
        let parts: Vec<&str> = v.split(':').collect();
        (parts.get(1) == Some(&config_path.as_str())).then(|| parts[0].to_string())
    });
    let Some(source) = mounted else {
        p.push(format!(
            "{f}: nothing is mounted at {config_path}, the config delayd is told to read"
        ));
        return p;
    };
    let toml = match std::fs::read_to_string(Path::new(REPO).join(&source)) {
        Ok(t) => t,
        Err(e) => {
            p.push(format!("{f}: mounted config {source}: {e}"));
            return p;
        }
    };
    let env = compose_env(svc);
    let Some(cfg) = load_checked(f, &toml, &env, "config", &mut p) else {
        return p;
    };
    if let Some(port) = listen_port(f, &cfg, &mut p) {
        let published: Vec<u16> = strings(svc.get("ports"))
            .iter()
            .filter_map(|e| container_port(e))
            .collect();
        if !published.contains(&port) {
            p.push(format!(
                "{f}: ports publish {published:?}, but delayd listens on {port}"
            ));
        }
        if !img.expose.contains(&port) {
            p.push(format!(
                "{f}: delayd listens on {port}, the image EXPOSEs {:?}",
                img.expose
            ));
        }
        let health = strings(at(svc, "healthcheck.test")).join(" ");
        let tcp_port = health
            .split("/dev/tcp/")
            .nth(1)
            .and_then(|r| r.split('/').nth(1))
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|d| d.parse::<u16>().ok());
        if tcp_port != Some(port) {
            p.push(format!(
                "{f}: the healthcheck asks port {tcp_port:?}, delayd listens on {port}"
            ));
        }
    }
    // The servers the URLs name are services of this file, on their ports.
    let services = at(compose, "services").and_then(Value::as_mapping);
    for (what, url) in [
        ("redis", cfg.redis.urls[0].expose()),
        ("amqp", cfg.amqp.urls[0].expose()),
    ] {
        let Some((host, port)) = url_host_port(url) else {
            p.push(format!("{f}: the {what} URL names no host:port"));
            continue;
        };
        let target = services.and_then(|s| s.get(host.as_str()));
        let ports: Vec<u16> = target
            .map(|t| {
                strings(t.get("ports"))
                    .iter()
                    .filter_map(|e| container_port(e))
                    .collect()
            })
            .unwrap_or_default();
        if target.is_none() || !ports.contains(&port) {
            p.push(format!(
                "{f}: the {what} URL names {host}:{port}, which is no service port of this file"
            ));
        }
    }
    if text(svc.get("stop_signal")).as_deref().unwrap_or("SIGTERM") != img.stop_signal {
        p.push(format!(
            "{f}: stop_signal differs from the image's {}",
            img.stop_signal
        ));
    }
    let grace = text(svc.get("stop_grace_period"))
        .and_then(|g| humantime::parse_duration(&g).ok())
        .unwrap_or(Duration::from_secs(10));
    if grace <= max_shutdown(&cfg) {
        p.push(format!(
            "{f}: stop_grace_period {grace:?} leaves no room for shutdown_timeout {:?}",
            max_shutdown(&cfg)
        ));
    }
    if let Some(user) = text(svc.get("user")) {
        if user != img.user && user.split(':').next() != img.user.split(':').next() {
            p.push(format!(
                "{f}: user {user} differs from the image's {}",
                img.user
            ));
        }
    }
    p
}

/// The arguments delayd runs with: `given` (compose's `command`, the
/// container's `args`, as `what` names them), or the image's CMD when none
/// are given; a problem in `f` when they differ from CMD.
fn args_or_cmd(
    f: &str,
    what: &str,
    given: Vec<String>,
    img: &Image,
    p: &mut Vec<String>,
) -> Vec<String> {
    let args = if given.is_empty() {
        img.cmd.clone()
    } else {
        given
    };
    let differ = if what == "args" { "differ" } else { "differs" };
    if args != img.cmd {
        let cmd = &img.cmd;
        p.push(format!(
            "{f}: {what} {args:?} {differ} from the image's CMD {cmd:?}"
        ));
    }
    args
}

/// The entry of the sequence `seq` whose `key` is `name`.
fn named<'a>(seq: Option<&'a Value>, key: &str, name: &str) -> Option<&'a Value> {
    let seq = seq.and_then(Value::as_sequence)?;
    seq.iter()
        .find(|e| text(e.get(key)).as_deref() == Some(name))
}

/// The Deployment among the Kubernetes documents, to change it.
fn deployment_mut(docs: &mut [Value]) -> &mut Value {
    let is_deployment = |d: &&mut Value| text(d.get("kind")).as_deref() == Some("Deployment");
    docs.iter_mut().find(is_deployment).unwrap()
}

fn find_doc<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter().find(|d| {
        text(d.get("kind")).as_deref() == Some(kind)
            && text(at(d, "metadata.name")).as_deref() == Some(name)
    })
}

fn k8s_problems(docs: &[Value], img: &Image) -> Vec<String> {
    let f = "deploy/kubernetes/delayd.yaml";
    let mut p = Vec::new();
    let Some(deploy) = find_doc(docs, "Deployment", "delayd") else {
        return vec![format!("{f}: no Deployment delayd")];
    };
    let Some(ctr) = named(
        at(deploy, "spec.template.spec.containers"),
        "name",
        "delayd",
    ) else {
        return vec![format!("{f}: no container delayd")];
    };
    let want_image = format!("delayd:{}", env!("CARGO_PKG_VERSION"));
    if text(ctr.get("image")) != Some(want_image.clone()) {
        p.push(format!(
            "{f}: image {:?}, expected {want_image} (the crate version)",
            ctr.get("image")
        ));
    }
    let command = strings(ctr.get("command"));
    if !command.is_empty() && command != img.entrypoint {
        p.push(format!(
            "{f}: command {command:?} replaces the image's ENTRYPOINT {:?}",
            img.entrypoint
        ));
    }
    let args = args_or_cmd(f, "args", strings(ctr.get("args")), img, &mut p);
    let Some(config_path) = config_arg(&args).map(str::to_string) else {
        p.push(format!("{f}: args {args:?} name no --config"));
        return p;
    };
    // The ConfigMap key that lands at the config path.
    let pod = at(deploy, "spec.template.spec").unwrap();
    let toml = ctr
        .get("volumeMounts")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .find_map(|m| {
            let dir = text(m.get("mountPath"))?;
            let rel = config_path
                .strip_prefix(&format!("{}/", dir.trim_end_matches('/')))?
                .to_string();
            let vol_name = text(m.get("name"))?;
            let vol = pod
                .get("volumes")?
                .as_sequence()?
                .iter()
                .find(|v| text(v.get("name")).as_deref() == Some(vol_name.as_str()))?;
            let cm = find_doc(docs, "ConfigMap", &text(at(vol, "configMap.name"))?)?;
            let key = match vol.get("configMap")?.get("items") {
                Some(items) => items
                    .as_sequence()?
                    .iter()
                    .find(|i| text(i.get("path")).as_deref() == Some(rel.as_str()))
                    .and_then(|i| text(i.get("key")))?,
                None => rel,
            };
            text(cm.get("data")?.get(key.as_str()))
        });
    let Some(toml) = toml else {
        p.push(format!(
            "{f}: no ConfigMap key is mounted at {config_path}, the config delayd is told to read"
        ));
        return p;
    };
    let mut env: Vec<(String, String)> = ctr
        .get("env")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .filter_map(|e| Some((text(e.get("name"))?, text(e.get("value"))?)))
        .collect();
    for from in ctr
        .get("envFrom")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        let Some(name) = text(at(from, "secretRef.name")) else {
            continue;
        };
        match find_doc(docs, "Secret", &name)
            .and_then(|s| s.get("stringData"))
            .and_then(Value::as_mapping)
        {
            Some(m) => env.extend(
                m.iter()
                    .filter_map(|(k, v)| Some((text(Some(k))?, text(Some(v))?))),
            ),
            None => p.push(format!(
                "{f}: envFrom names Secret {name}, which has no stringData here"
            )),
        }
    }
    let Some(cfg) = load_checked(f, &toml, &env, "ConfigMap", &mut p) else {
        return p;
    };
    if let Some(port) = listen_port(f, &cfg, &mut p) {
        let named: BTreeMap<String, u16> = ctr
            .get("ports")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
            .filter_map(|x| {
                Some((
                    text(x.get("name")).unwrap_or_default(),
                    text(x.get("containerPort"))?.parse().ok()?,
                ))
            })
            .collect();
        if !named.values().any(|&v| v == port) {
            p.push(format!(
                "{f}: containerPorts {named:?}, but delayd listens on {port}"
            ));
        }
        let resolve = |v: Option<String>| -> Option<u16> {
            let v = v?;
            v.parse().ok().or_else(|| named.get(&v).copied())
        };
        for probe in ["readinessProbe", "livenessProbe"] {
            let got = resolve(text(at(ctr, &format!("{probe}.httpGet.port"))));
            if got != Some(port) {
                p.push(format!(
                    "{f}: {probe} asks port {got:?}, delayd listens on {port}"
                ));
            }
        }
        let annotated = text(
            at(deploy, "spec.template.metadata.annotations")
                .and_then(|a| a.get("prometheus.io/port")),
        );
        if annotated.as_deref().is_some_and(|a| a != port.to_string()) {
            p.push(format!(
                "{f}: prometheus.io/port {annotated:?}, delayd listens on {port}"
            ));
        }
        match find_doc(docs, "Service", "delayd")
            .and_then(|s| at(s, "spec.ports"))
            .and_then(Value::as_sequence)
        {
            Some(ports) => {
                for sp in ports {
                    let target =
                        resolve(text(sp.get("targetPort")).or_else(|| text(sp.get("port"))));
                    if target != Some(port) {
                        p.push(format!(
                            "{f}: Service targetPort {target:?}, delayd listens on {port}"
                        ));
                    }
                }
            }
            None => p.push(format!("{f}: no Service delayd with ports")),
        }
        if !img.expose.contains(&port) {
            p.push(format!(
                "{f}: delayd listens on {port}, the image EXPOSEs {:?}",
                img.expose
            ));
        }
    }
    // The user: what the pod asks for must be the image's user.
    let (uid, gid) = img.uid_gid();
    let num = |path: &str| text(at(pod, path)).and_then(|v| v.parse::<u32>().ok());
    for (field, want) in [
        ("securityContext.runAsUser", uid),
        ("securityContext.runAsGroup", gid),
        ("securityContext.fsGroup", gid),
    ] {
        if num(field) != want {
            p.push(format!(
                "{f}: pod {field} {:?}, the image runs as {}",
                num(field),
                img.user
            ));
        }
    }
    if text(at(pod, "securityContext.runAsNonRoot")).as_deref() != Some("true") {
        p.push(format!("{f}: pod securityContext.runAsNonRoot is not true"));
    }
    if let Some(u) = text(at(ctr, "securityContext.runAsUser")) {
        if u.parse::<u32>().ok() != uid {
            p.push(format!(
                "{f}: container runAsUser {u}, the image runs as {}",
                img.user
            ));
        }
    }
    let grace = num("terminationGracePeriodSeconds")
        .map_or(Duration::from_secs(30), |s| Duration::from_secs(s.into()));
    if grace <= max_shutdown(&cfg) {
        p.push(format!(
            "{f}: terminationGracePeriodSeconds {grace:?} leaves no room for shutdown_timeout {:?}",
            max_shutdown(&cfg)
        ));
    }
    p
}

/// Prometheus finds delayd by the compose service name, on its listen port.
fn prometheus_problems(prom: &Value, compose: &Value) -> Vec<String> {
    let f = "deploy/prometheus/prometheus.yml";
    let mut p = Vec::new();
    let Some(job) = named(prom.get("scrape_configs"), "job_name", "delayd") else {
        return vec![format!("{f}: no delayd job")];
    };
    let svc = at(compose, "services.delayd").expect("compose has delayd");
    let toml = read("config/docker.toml");
    let cfg = load_with_env(&toml, &compose_env(svc)).expect("compose config loads");
    let port = cfg.http_listen.map(|a| a.port());
    for sd in job
        .get("dns_sd_configs")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        if !strings(sd.get("names")).iter().any(|n| n == "delayd") {
            p.push(format!(
                "{f}: dns_sd names {:?} miss the compose service delayd",
                sd.get("names")
            ));
        }
        if text(sd.get("port")).and_then(|x| x.parse().ok()) != port {
            p.push(format!(
                "{f}: scrapes port {:?}, delayd listens on {port:?}",
                sd.get("port")
            ));
        }
    }
    p
}

// --- the tests ------------------------------------------------------------------

#[test]
fn dockerfile_builds_from_the_public_images_as_uid_10001_with_its_config() {
    let img = image();
    assert_eq!(
        img.uid_gid(),
        (Some(10001), Some(10001)),
        "USER {}",
        img.user
    );
    assert_eq!(img.config_path(), Some("/etc/delayd/delayd.toml"));
    assert_eq!(img.expose, [9464]);
    assert_none(image_problems(&img));
}

#[test]
fn compose_matches_the_image_and_the_binary() {
    assert_none(compose_problems(
        &yaml(&read("docker-compose.yml")),
        &image(),
    ));
}

#[test]
fn kubernetes_manifest_matches_the_image_and_the_binary() {
    assert_none(k8s_problems(
        &yaml_docs(&read("deploy/kubernetes/delayd.yaml")),
        &image(),
    ));
}

#[test]
fn prometheus_scrapes_the_compose_service_on_its_listen_port() {
    assert_none(prometheus_problems(
        &yaml(&read("deploy/prometheus/prometheus.yml")),
        &yaml(&read("docker-compose.yml")),
    ));
}

#[test]
fn container_test_builds_the_tag_compose_runs() {
    let script = read("deploy/container/test.sh");
    assert!(
        script.contains(&format!("IMAGE=\"${{DELAYD_IMAGE:-{LOCAL_TAG}}}\"")),
        "deploy/container/test.sh does not build {LOCAL_TAG} by default"
    );
}

// --- server versions ---------------------------------------------------------

/// The servers and versions the tests run against, from the table under
/// "## Server versions" in docs/operations.md: server -> every version its
/// row names (oldest and newest).
fn tested_versions() -> BTreeMap<String, Vec<String>> {
    let doc = read("docs/operations.md");
    let table = doc
        .split("## Server versions")
        .nth(1)
        .expect("docs/operations.md has a \"## Server versions\" section");
    let mut out = BTreeMap::new();
    for row in table.lines().take_while(|l| !l.starts_with("## ")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        if cells.len() < 4 || !["RabbitMQ", "Redis", "Valkey"].contains(&cells[1]) {
            continue;
        }
        let versions = cells[2..4].iter().filter_map(|c| major_minor(c)).collect();
        out.insert(cells[1].to_string(), versions);
    }
    out
}

/// The first "N.N" in `text`.
fn major_minor(text: &str) -> Option<String> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let v: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut parts = v.split('.').filter(|p| !p.is_empty());
    Some(format!("{}.{}", parts.next()?, parts.next()?))
}

/// (file, server, version) for each server image docker-compose.yml runs.
fn compose_server_versions(compose: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let Some(services) = at(compose, "services").and_then(Value::as_mapping) else {
        return out;
    };
    for svc in services.values() {
        let Some(image) = text(svc.get("image")) else {
            continue;
        };
        let (name, tag) = image.rsplit_once(':').unwrap_or((&image, "latest"));
        let server = match name.rsplit('/').next().unwrap_or(name) {
            "rabbitmq" => "RabbitMQ",
            "redis" => "Redis",
            "valkey" => "Valkey",
            _ => continue,
        };
        let version = major_minor(tag).unwrap_or_else(|| tag.to_string());
        out.push(("docker-compose.yml".into(), server.into(), version));
    }
    out
}

/// (file, server, version) for each "RabbitMQ N.N", "Redis N.N" and
/// "Valkey N.N" in the comments that open the Kubernetes manifest.
fn manifest_server_versions(manifest: &str) -> Vec<(String, String, String)> {
    let f = "deploy/kubernetes/delayd.yaml";
    let header: String = manifest
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#'))
        .collect::<Vec<_>>()
        .join(" ");
    let words: Vec<&str> = header.split_whitespace().collect();
    let mut out = Vec::new();
    for w in words.windows(2) {
        let names_version = w[1].starts_with(|c: char| c.is_ascii_digit());
        if ["RabbitMQ", "Redis", "Valkey"].contains(&w[0]) && names_version {
            if let Some(v) = major_minor(w[1]) {
                out.push((f.to_string(), w[0].to_string(), v));
            }
        }
    }
    out
}

fn server_version_problems(
    named: &[(String, String, String)],
    tested: &BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    named
        .iter()
        .filter(|(_, server, v)| !tested.get(server).is_some_and(|t| t.contains(v)))
        .map(|(f, server, v)| {
            format!(
                "{f}: {server} {v} is not a version the tests run against ({:?}, docs/operations.md)",
                tested.get(server)
            )
        })
        .collect()
}

#[test]
fn compose_and_manifest_name_server_versions_the_tests_run_against() {
    let tested = tested_versions();
    for server in ["RabbitMQ", "Redis", "Valkey"] {
        assert!(
            tested.contains_key(server),
            "no {server} row in docs/operations.md: {tested:?}"
        );
    }
    // The table says what deploy/local/lib.sh's server sets run.
    let sets = read("deploy/local/lib.sh");
    for (server, versions) in &tested {
        for v in versions {
            assert!(
                sets.contains(&format!("{server} {v}")),
                "docs/operations.md names {server} {v}, which no server set in deploy/local/lib.sh runs"
            );
        }
    }
    let compose = compose_server_versions(&yaml(&read("docker-compose.yml")));
    assert!(
        compose.iter().any(|(_, s, _)| s == "RabbitMQ"),
        "{compose:?}"
    );
    let manifest = manifest_server_versions(&read("deploy/kubernetes/delayd.yaml"));
    assert!(
        manifest.iter().any(|(_, s, _)| s == "RabbitMQ"),
        "{manifest:?}"
    );
    assert_none(server_version_problems(
        &[compose, manifest].concat(),
        &tested,
    ));
}

#[test]
fn a_compose_server_version_the_tests_do_not_run_is_caught() {
    let mut compose = yaml(&read("docker-compose.yml"));
    set(
        &mut compose,
        "services.rabbitmq.image",
        Value::String("rabbitmq:3.13-management".into()),
    );
    let problems = server_version_problems(&compose_server_versions(&compose), &tested_versions());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("RabbitMQ 3.13"), "{problems:?}");
}

/// The probe paths (and what each must mean), from every file that names one.
fn named_paths() -> Vec<(String, String, &'static str)> {
    let mut out = Vec::new();
    let compose = yaml(&read("docker-compose.yml"));
    let health = strings(at(&compose, "services.delayd.healthcheck.test")).join(" ");
    let path = health
        .split("GET ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("compose healthcheck sends a GET");
    out.push((
        "docker-compose.yml healthcheck".to_string(),
        path.to_string(),
        "ready",
    ));
    let docs = yaml_docs(&read("deploy/kubernetes/delayd.yaml"));
    let deploy = find_doc(&docs, "Deployment", "delayd").expect("Deployment delayd");
    let ctr = &at(deploy, "spec.template.spec.containers")
        .unwrap()
        .as_sequence()
        .unwrap()[0];
    for (probe, role) in [("readinessProbe", "ready"), ("livenessProbe", "alive")] {
        let path = text(at(ctr, &format!("{probe}.httpGet.path"))).expect("probe path");
        out.push((format!("delayd.yaml {probe}"), path, role));
    }
    if let Some(path) = text(
        at(deploy, "spec.template.metadata.annotations").and_then(|a| a.get("prometheus.io/path")),
    ) {
        out.push((
            "delayd.yaml prometheus.io/path".to_string(),
            path,
            "metrics",
        ));
    }
    let prom = yaml(&read("deploy/prometheus/prometheus.yml"));
    for job in prom
        .get("scrape_configs")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        if text(job.get("job_name")).as_deref() == Some("delayd") {
            let path = text(job.get("metrics_path")).unwrap_or_else(|| "/metrics".into());
            out.push(("prometheus.yml metrics_path".to_string(), path, "metrics"));
        }
    }
    out
}

/// GET `path` on 127.0.0.1:`port`: (status, body).
fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, resp))
}

#[test]
fn probe_paths_the_files_name_are_served_by_the_binary_with_their_meaning() {
    // Redis is there, RabbitMQ refuses: delayd keeps retrying, alive but
    // not ready, which tells a readiness route from a liveness one. (It
    // serves HTTP only once Redis has answered.)
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port(15000..16000, &[]);
    let config: PathBuf = dir.path().join("delayd.toml");
    std::fs::write(
        &config,
        format!(
            "[redis]\nurl = \"{}\"\n[amqp]\nurl = \"amqp://127.0.0.1:1/%2f\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n[businesses.probe]\nkey = \"{}\"\nexchange = \"x\"\nrouting_key = \"r\"\n",
            common::redis_url(),
            common::unique("probe")
        ),
    )
    .unwrap();
    // Spawned under the lock: a child inherits the environment at spawn, and
    // the loader tests set DELAYD_* overrides process-wide while they hold it.
    let daemon = {
        let _guard = ENV_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        common::Daemon::start(&config)
    };
    let start = Instant::now();
    while get(port, "/healthz").is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "delayd did not serve HTTP within 20s; log:\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (unknown, _) = get(port, "/no-such-probe").unwrap();
    assert_eq!(
        unknown, 404,
        "an unknown path must be refused, or this test proves nothing"
    );
    let mut problems = Vec::new();
    for (who, path, role) in named_paths() {
        let (status, body) = get(port, &path).unwrap();
        let ok = match role {
            "ready" => status == 503,
            "alive" => status == 200,
            _ => status == 200 && body.contains("delayd_"),
        };
        if !ok {
            problems.push(format!("{who}: GET {path} answered {status}; a {role} path must answer {} while RabbitMQ is away", if role == "ready" { 503 } else { 200 }));
        }
    }
    drop(daemon);
    assert_none(problems);
}

// --- the checks can fail ---------------------------------------------------------

fn set(v: &mut Value, path: &str, new: Value) {
    let mut cur = v;
    for k in path.split('.') {
        cur = cur.get_mut(k).unwrap_or_else(|| panic!("no {k} in {path}"));
    }
    *cur = new;
}

#[test]
fn a_compose_port_delayd_does_not_listen_on_is_caught() {
    let mut compose = yaml(&read("docker-compose.yml"));
    set(
        &mut compose,
        "services.delayd.ports",
        yaml("['127.0.0.1:9464:9465']"),
    );
    let problems = compose_problems(&compose, &image());
    assert_caught(&problems, "[9465]");
}

#[test]
fn an_override_delayd_does_not_read_is_caught() {
    let mut compose = yaml(&read("docker-compose.yml"));
    let env = at(&compose, "services.delayd.environment").unwrap().clone();
    let mut env = env.as_mapping().unwrap().clone();
    env.insert(
        "DELAYD_AMQP_URL".into(),
        "amqp://x:y@rabbitmq:5672/%2f".into(),
    );
    set(
        &mut compose,
        "services.delayd.environment",
        Value::Mapping(env),
    );
    let problems = compose_problems(&compose, &image());
    assert_caught(&problems, "DELAYD_AMQP_URL is not a setting");
}

#[test]
fn a_kubernetes_user_other_than_the_images_is_caught() {
    let mut docs = yaml_docs(&read("deploy/kubernetes/delayd.yaml"));
    let user = "spec.template.spec.securityContext.runAsUser";
    set(deployment_mut(&mut docs), user, 1000.into());
    let problems = k8s_problems(&docs, &image());
    assert_caught(&problems, "runAsUser Some(1000)");
}

#[test]
fn a_kubernetes_config_mount_elsewhere_is_caught() {
    let mut docs = yaml_docs(&read("deploy/kubernetes/delayd.yaml"));
    let deploy = deployment_mut(&mut docs);
    let ctr = deploy
        .get_mut("spec")
        .and_then(|s| s.get_mut("template"))
        .and_then(|s| s.get_mut("spec"))
        .and_then(|s| s.get_mut("containers"))
        .and_then(|c| c.get_mut(0))
        .unwrap();
    set(ctr, "args", yaml("[run, --config, /etc/delayd.toml]"));
    let problems = k8s_problems(&docs, &image());
    assert_caught(&problems, "CMD");
    assert_caught(&problems, "no ConfigMap key is mounted at /etc/delayd.toml");
}

#[test]
fn a_dockerfile_with_another_default_base_is_caught() {
    let df = read("deploy/Dockerfile").replace(
        "ARG RUNTIME_IMAGE=debian:${DEBIAN_SUITE}-slim",
        "ARG RUNTIME_IMAGE=debian:${DEBIAN_SUITE}",
    );
    let problems = image_problems(&Image::parse(&df));
    assert_caught(&problems, "RUNTIME_IMAGE");
}

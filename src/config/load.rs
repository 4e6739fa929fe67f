//! Reading the file and the environment, and validating every section,
//! collecting every problem with its place.

use super::*;

/// Reads, layers and validates the configuration at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let env = delayd_env().map_err(|reason| ConfigError::Parse {
        path: path.to_path_buf(),
        reason,
    })?;
    load_with_env(path, env)
}

/// Reads and validates the file at `path` alone, without the `DELAYD_*`
/// environment: for a file delayd wrote itself from a configuration
/// already layered (the bench's), where the environment counted once.
pub fn load_as_written(path: &Path) -> Result<Config, ConfigError> {
    load_with_env(path, config::Map::new())
}

/// Whether the environment variable `name` addresses a config section
/// (`DELAYD_REDIS__URL`, …), so that [`load`] reads it.
pub fn is_config_var(name: &str) -> bool {
    const SECTIONS: [&str; 5] = ["REDIS__", "AMQP__", "HTTP__", "LOG__", "BUSINESSES__"];
    name.strip_prefix("DELAYD_").is_some_and(|rest| {
        SECTIONS
            .iter()
            .any(|s| rest.to_ascii_uppercase().starts_with(s))
    })
}

/// [`load`] with the given `DELAYD_*` variables instead of the process's.
pub(crate) fn load_with_env(
    path: &Path,
    env: config::Map<String, String>,
) -> Result<Config, ConfigError> {
    if let Err(e) = std::fs::metadata(path).and_then(|_| std::fs::read(path)) {
        return Err(ConfigError::Unreadable {
            path: path.to_path_buf(),
            reason: format!("cannot read it ({e}); pass an existing file with --config"),
        });
    }
    let built = config::Config::builder()
        .add_source(config::File::from(path).format(config::FileFormat::Toml))
        .add_source(
            config::Environment::with_prefix("DELAYD")
                .prefix_separator("_")
                .separator("__")
                // Every value stays the string it was (`1.10` is not 1.1);
                // numbers and booleans parse where a field wants one.
                .try_parsing(false)
                .source(Some(env)),
        )
        .build()
        .map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            reason: located_toml_error(path).unwrap_or_else(|| one_line(&e.to_string())),
        })?;
    let raw: RawConfig = built.try_deserialize().map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        reason: describe_parse_error(&e.to_string()),
    })?;
    validate(path, raw)
}

/// The `DELAYD_*` variables that address a config section. Others with the
/// same prefix are not ours: Kubernetes, for one, injects `DELAYD_PORT` and
/// `DELAYD_SERVICE_HOST` for a Service named `delayd`.
pub(super) fn delayd_env() -> Result<config::Map<String, String>, String> {
    let mut ours = config::Map::new();
    // `vars_os`: a variable that is not UTF-8 (ours or anyone's) must not
    // panic; only ours is refused, by name, its value unshown (a secret).
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if !is_config_var(name) {
            continue;
        }
        let value = value.into_string().map_err(|_| {
            format!("environment variable {name} is not valid UTF-8; set it to text")
        })?;
        ours.insert(name.to_string(), value);
    }
    Ok(ours)
}

pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The file's TOML error with the place it names, when the file does not
/// parse: the `config` crate drops the place for some errors (a number too
/// large for 64 bits), and a user needs the field.
fn located_toml_error(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let e = toml::from_str::<toml::Table>(&text).err()?;
    let at = e.span()?.start.min(text.len());
    let line_no = text[..at].matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or("");
    let place = match (table_header_before(&text[..at]), line.split_once('=')) {
        (Some(table), Some((key, _))) => {
            format!(
                "{} (line {line_no})",
                describe_key(&format!("{table}.{}", key.trim()))
            )
        }
        _ => format!("line {line_no}"),
    };
    Some(format!("{place}: {}", one_line(e.message())))
}

/// The name of the last `[table]` header in `text`, if any.
fn table_header_before(text: &str) -> Option<&str> {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && !l.starts_with("[["))
        .and_then(|l| l.strip_prefix('['))
        .and_then(|l| l.split(']').next())
        .map(str::trim)
}

/// Rewrites the `config` crate's "... for key `businesses.x.y`" into a
/// sentence that starts with the place, which is what a user looks for.
pub(super) fn describe_parse_error(msg: &str) -> String {
    let msg = one_line(msg);
    const MARK: &str = " for key `";
    if let Some(idx) = msg.find(MARK) {
        let rest = &msg[idx + MARK.len()..];
        if let Some(end) = rest.find('`') {
            return format!("{}: {}", describe_key(&rest[..end]), &msg[..idx]);
        }
    }
    msg
}

pub(super) fn describe_key(key: &str) -> String {
    let parts: Vec<&str> = key.split('.').collect();
    match parts.as_slice() {
        ["businesses", name] => format!("business \"{name}\""),
        ["businesses", name, field @ ..] => {
            format!("business \"{name}\", field \"{}\"", field.join("."))
        }
        [section] => format!("section [{section}]"),
        [section, field @ ..] => format!("[{section}] field \"{}\"", field.join(".")),
        [] => key.to_string(),
    }
}

/// Why `pem` is not a usable certificate file (or key file), if it is not.
pub(super) fn validate(path: &Path, raw: RawConfig) -> Result<Config, ConfigError> {
    let mut problems = Vec::new();
    let redis = validate_redis(raw.redis, &mut problems);
    let amqp = validate_amqp(raw.amqp, &mut problems);
    let http = http_section::validate(raw.http, &mut problems);
    let (log_format, log_level) = {
        let log = raw.log.unwrap_or(RawLog {
            format: None,
            level: None,
        });
        let format = one_of(
            "[log] field \"format\"",
            log.format.as_deref(),
            &[("text", "", LogFormat::Text), ("json", "", LogFormat::Json)],
            &mut problems,
        );
        (format, log.level.unwrap_or_else(|| "info".into()))
    };

    let mut businesses = Vec::new();
    match raw.businesses {
        None => problems.push(
            "no businesses configured: add at least one [businesses.NAME] section with key, exchange and routing_key".into(),
        ),
        Some(map) if map.is_empty() => problems.push(
            "no businesses configured: add at least one [businesses.NAME] section with key, exchange and routing_key".into(),
        ),
        Some(map) => {
            for (name, rb) in map {
                if let Some(b) = validate_business(&name, rb, redis.mode, path, &mut problems) {
                    businesses.push(b);
                }
            }
        }
    }
    problems.extend(overlapping_families(&businesses));
    problems.extend(intake_settings::shared_queues(&businesses));
    problems.extend(http_section::reused_tokens(&http, &businesses));

    if !problems.is_empty() {
        return Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        });
    }
    Ok(Config {
        path: path.to_path_buf(),
        redis,
        amqp,
        http_listen: http.listen,
        http_admin_token: http.admin_token,
        http_read_token: http.read_token,
        http_allowed_hosts: http.allowed_hosts,
        log_format,
        log_level,
        businesses,
    })
}

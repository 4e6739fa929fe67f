use super::*;
use crate::secret::redact_url;
use std::io::Write;

const BASE: &str = r#"
[redis]
url = "redis://127.0.0.1:6379/0"
[amqp]
url = "amqp://guest:secret@127.0.0.1:5672/%2f"
"#;

fn load_str(body: &str) -> Result<Config, ConfigError> {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(body.as_bytes()).unwrap();
    load(f.path())
}

fn err_of(body: &str) -> String {
    load_str(body).unwrap_err().to_string()
}

/// Asserts that `body` is refused with an error naming every one of
/// `needles`; returns the error for the test's other checks.
#[track_caller]
fn refused(body: &str, needles: &[&str]) -> String {
    let e = err_of(body);
    for n in needles {
        assert!(e.contains(n), "{n:?} missing from {e}");
    }
    e
}

fn business(extra: &str) -> String {
    format!(
        "{BASE}\n[businesses.billing]\nkey = \"k\"\nexchange = \"e\"\nrouting_key = \"r\"\n{extra}\n"
    )
}

/// The `billing` business with `extra`, and a `zeta` business on `key`.
fn second_business(extra: &str, key: &str) -> String {
    format!(
        "{}\n[businesses.zeta]\nkey = \"{key}\"\nexchange = \"e\"\nrouting_key = \"r\"\n",
        business(extra)
    )
}

#[test]
fn a_valid_file_gets_defaults() {
    let c = load_str(&business("")).unwrap();
    let b = c.business("billing").unwrap();
    assert_eq!(b.scanners, defaults::SCANNERS);
    assert_eq!(b.batch_size, defaults::BATCH_SIZE);
    assert_eq!(b.lease, Duration::from_secs(30));
    assert_eq!(b.score_unit, ScoreUnit::Millis);
    assert!(b.persistent);
    assert_eq!(b.properties, Properties::Standard);
    assert_eq!(b.keys(), vec!["k".to_string()]);
}

#[test]
fn unknown_field_is_refused_and_named() {
    refused(&business("batchsize = 5"), &["batchsize", "billing"]);
}

#[test]
fn unknown_top_level_section_is_refused() {
    refused(
        &format!("{}\n[redsi]\nurl = \"x\"\n", business("")),
        &["redsi"],
    );
}

#[test]
fn missing_key_exchange_routing_key_are_all_reported() {
    let body = format!("{BASE}\n[businesses.billing]\nscanners = 1\n");
    refused(
        &body,
        &["\"key\"", "\"exchange\"", "\"routing_key\"", "billing"],
    );
}

#[test]
fn zero_batch_size_is_refused() {
    refused(
        &business("batch_size = 0"),
        &["business \"billing\", field \"batch_size\" must be at least 1 (got 0)"],
    );
}

#[test]
fn negative_scanners_is_refused() {
    refused(
        &business("scanners = -2"),
        &["field \"scanners\" must be at least 1 (got -2)"],
    );
}

#[test]
fn unparseable_duration_is_refused() {
    refused(
        &business("lease = \"thirty seconds\""),
        &["field \"lease\"", "thirty seconds"],
    );
}

#[test]
fn no_businesses_is_refused() {
    refused(BASE, &["no businesses"]);
}

#[test]
fn missing_file_is_refused() {
    let e = load(Path::new("/nonexistent/delayd.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/delayd.toml"), "{e}");
}

#[test]
fn wrong_type_names_business_and_field() {
    let field = "business \"billing\", field \"batch_size\"";
    refused(
        &business("batch_size = \"abc\""),
        &[field, "string \"abc\", expected a whole number"],
    );
}

/// A file with a valid business and `[amqp]` as given.
fn amqp_body(section: &str) -> String {
    business("").replace(
        "[amqp]\nurl = \"amqp://guest:secret@127.0.0.1:5672/%2f\"\n",
        &format!("[amqp]\n{section}\n"),
    )
}

/// Like [`refused`], for a file whose `[amqp]` section is `section`.
#[track_caller]
fn amqp_refused(section: &str, needles: &[&str]) -> String {
    refused(&amqp_body(section), needles)
}

/// `deploy/local/certs.sh` certificates, made once for these tests.
fn certs() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("delayd-unit-certs-{}", std::process::id()));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/local/certs.sh");
        let out = std::process::Command::new(script).arg(&dir).output();
        let out = out.unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        dir
    })
}

fn tls_section(url: &str, ca: &str, cert: &str, key: &str) -> String {
    let c = certs();
    let mut s = format!("url = \"{url}\"\n");
    for (field, file) in [
        ("tls_ca_file", ca),
        ("tls_cert_file", cert),
        ("tls_key_file", key),
    ] {
        if !file.is_empty() {
            s.push_str(&format!("{field} = \"{}\"\n", c.join(file).display()));
        }
    }
    s
}

#[test]
fn amqps_with_a_private_ca_and_client_certificate_is_accepted() {
    let body = business("").replace(
        "url = \"amqp://guest:secret@127.0.0.1:5672/%2f\"",
        &tls_section(
            "amqps://guest:secret@127.0.0.1:5671/%2f",
            "ca.crt",
            "client.crt",
            "client.key",
        ),
    );
    let c = load_str(&body).unwrap();
    assert_eq!(c.amqp.urls.len(), 1);
    assert!(c.amqp.tls.cert_file.is_some());
    assert_eq!(c.amqp.connect_timeout, Duration::from_secs(10));
}

#[test]
fn amqps_without_tls_files_is_accepted() {
    let c = load_str(&business("").replace("amqp://guest", "amqps://guest")).unwrap();
    assert!(c.amqp.urls[0].expose().starts_with("amqps://"));
}

#[test]
fn the_node_list_comes_from_the_environment_comma_separated() {
    let body = business("").replace("url = \"amqp://guest:secret@127.0.0.1:5672/%2f\"\n", "");
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(body.as_bytes()).unwrap();
    let env = config::Map::from([(
        "DELAYD_AMQP__URLS".to_string(),
        "amqp://u:p1@a:5672/%2f,amqp://u:p2@b:5672/%2f".to_string(),
    )]);
    let c = load_with_env(f.path(), env).unwrap();
    let urls: Vec<&str> = c.amqp.urls.iter().map(|u| u.expose()).collect();
    assert_eq!(urls, ["amqp://u:p1@a:5672/%2f", "amqp://u:p2@b:5672/%2f"]);
}

#[test]
fn url_and_urls_together_are_refused() {
    amqp_refused(
        "url = \"amqp://h/%2f\"\nurls = [\"amqp://h/%2f\"]",
        &["[amqp] fields \"url\" and \"urls\" are both set"],
    );
}

#[test]
fn neither_url_nor_urls_is_refused() {
    amqp_refused(
        "connect_timeout = \"5s\"",
        &["[amqp] field \"url\" is required"],
    );
}

#[test]
fn empty_urls_is_refused() {
    amqp_refused(
        "urls = []",
        &["[amqp] field \"urls\" must list at least one node"],
    );
}

#[test]
fn a_node_list_is_kept_in_order() {
    let body = business("").replace(
        "url = \"amqp://guest:secret@127.0.0.1:5672/%2f\"",
        "urls = [\"amqp://u:p@a:5672/%2f\", \"amqp://u:p@b:5672/%2f\", \"amqp://u:p@c:5672/%2f\"]",
    );
    let c = load_str(&body).unwrap();
    let hosts: Vec<String> = c.amqp.urls.iter().map(|u| u.redacted()).collect();
    assert_eq!(
        hosts,
        [
            "amqp://u:***@a:5672/%2f",
            "amqp://u:***@b:5672/%2f",
            "amqp://u:***@c:5672/%2f"
        ]
    );
    assert_eq!(c.amqp.to_string(), hosts.join(", "));
}

#[test]
fn a_node_with_another_scheme_is_named_by_position() {
    amqp_refused("urls = [\"amqp://a/%2f\", \"http://u:pw@b/\"]", &["[amqp] field \"urls\", entry 2 must start with amqp:// or amqps:// (got http://u:***@b/)"]);
}

#[test]
fn an_unparseable_node_url_is_named() {
    let url = "url = \"amqp://u:pw@host:notaport/%2f\"";
    let e = amqp_refused(url, &["[amqp] field \"url\" is not a valid AMQP URL"]);
    assert!(!e.contains("pw@"), "{e}");
}

#[test]
fn mixing_clear_text_and_tls_nodes_is_refused() {
    amqp_refused(
        "urls = [\"amqp://a/%2f\", \"amqps://b/%2f\"]",
        &["mixes amqp:// and amqps://"],
    );
}

#[test]
fn tls_files_with_a_clear_text_url_are_refused() {
    amqp_refused(
        &tls_section("amqp://h/%2f", "ca.crt", "", ""),
        &["[amqp] field \"tls_ca_file\" is set but", "amqps://"],
    );
}

#[test]
fn a_client_certificate_without_its_key_is_refused() {
    amqp_refused(
        &tls_section("amqps://h/%2f", "", "client.crt", ""),
        &["[amqp] field \"tls_cert_file\" is set without \"tls_key_file\""],
    );
}

#[test]
fn a_key_without_its_client_certificate_is_refused() {
    amqp_refused(
        &tls_section("amqps://h/%2f", "", "", "client.key"),
        &["[amqp] field \"tls_key_file\" is set without \"tls_cert_file\""],
    );
}

#[test]
fn an_unreadable_tls_file_is_named() {
    amqp_refused(
        "url = \"amqps://h/%2f\"\ntls_ca_file = \"/nonexistent/ca.pem\"",
        &["[amqp] field \"tls_ca_file\": cannot read /nonexistent/ca.pem"],
    );
}

#[test]
fn a_ca_file_without_a_certificate_is_refused() {
    // A key is PEM, but not a certificate.
    amqp_refused(
        &tls_section("amqps://h/%2f", "client.key", "", ""),
        &["[amqp] field \"tls_ca_file\"", "holds no PEM certificate"],
    );
}

#[test]
fn a_key_file_without_a_key_is_refused() {
    let section = tls_section("amqps://h/%2f", "", "client.crt", "client.crt");
    amqp_refused(
        &section,
        &[
            "[amqp] field \"tls_key_file\"",
            "no usable unencrypted private key",
        ],
    );
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused() {
    let section = tls_section("amqps://h/%2f", "", "client.crt", "server.key");
    amqp_refused(&section, &["do not make a usable client certificate"]);
}

#[test]
fn external_login_without_a_client_certificate_is_refused() {
    amqp_refused(
        "url = \"amqps://h/%2f?auth_mechanism=external\"",
        &["auth_mechanism=external", "tls_cert_file"],
    );
}

#[test]
fn a_zero_or_unparseable_connect_timeout_is_refused() {
    amqp_refused(
        "url = \"amqp://h/%2f\"\nconnect_timeout = \"0s\"",
        &["[amqp] field \"connect_timeout\" must be longer than zero"],
    );
    amqp_refused(
        "url = \"amqp://h/%2f\"\nconnect_timeout = \"soon\"",
        &["[amqp] field \"connect_timeout\": cannot parse \"soon\""],
    );
}

#[test]
fn properties_take_three_values_and_refuse_others() {
    let b = business("properties = \"bare\"");
    assert_eq!(
        load_str(&b).unwrap().businesses[0].properties,
        Properties::Bare
    );
    refused(
        &business("properties = \"none\""),
        &["properties", "no-headers"],
    );
}

#[test]
fn bad_score_unit_is_refused() {
    refused(&business("score_unit = \"minutes\""), &["score_unit"]);
}

#[test]
fn every_problem_is_reported_at_once() {
    refused(
        &business("batch_size = 0\nscanners = 0\nlease = \"x\""),
        &["batch_size", "scanners", "lease"],
    );
}

#[test]
fn shared_key_is_refused() {
    assert!(err_of(&second_business("", "k")).contains("also used"));
}

#[test]
fn member_defaults_to_body() {
    let c = load_str(&business("")).unwrap();
    assert_eq!(c.businesses[0].member, MemberMode::Body);
}

#[test]
fn member_id_takes_an_optional_dedup_window() {
    let c = load_str(&business("member = \"id\"")).unwrap();
    assert_eq!(
        c.businesses[0].member,
        MemberMode::Id { dedup_window: None }
    );
    let c = load_str(&business("member = \"id\"\ndedup_window = \"1h\"")).unwrap();
    assert_eq!(
        c.businesses[0].member.dedup_window(),
        Some(Duration::from_secs(3600))
    );
}

#[test]
fn unknown_member_mode_is_refused() {
    refused(
        &business("member = \"ids\""),
        &["business \"billing\", field \"member\" must be \"body\" or \"id\" (got \"ids\")"],
    );
}

#[test]
fn dedup_window_without_id_mode_is_refused() {
    refused(
        &business("dedup_window = \"1h\""),
        &["business \"billing\", field \"dedup_window\" needs member = \"id\""],
    );
}

#[test]
fn trace_is_off_by_default_link_on_request_and_any_other_word_is_named() {
    let c = load_str(&business("")).unwrap();
    assert_eq!(c.businesses[0].trace, Trace::Off);
    let c = load_str(&business("trace = \"link\"")).unwrap();
    assert_eq!(c.businesses[0].trace, Trace::Link);
    refused(
        &business("trace = \"child\""),
        &["business \"billing\", field \"trace\" must be \"off\" or \"link\" (a new trace per publish, linked to the producer's) (got \"child\")"],
    );
}

#[test]
fn envelopes_are_off_by_default_and_read_only_in_id_mode() {
    let c = load_str(&business("member = \"id\"")).unwrap();
    assert!(!c.businesses[0].stores_envelopes());
    let c = load_str(&business("member = \"id\"\nenvelopes = true")).unwrap();
    assert!(c.businesses[0].stores_envelopes());
    refused(
        &business("envelopes = true"),
        &["business \"billing\", field \"envelopes\" needs member = \"id\""],
    );
}

#[test]
fn unparseable_or_zero_dedup_window_is_refused() {
    refused(
        &business("member = \"id\"\ndedup_window = \"soon\""),
        &["field \"dedup_window\": cannot parse \"soon\""],
    );
    refused(
        &business("member = \"id\"\ndedup_window = \"0s\""),
        &["field \"dedup_window\" must be longer than zero"],
    );
}

#[test]
fn sharded_business_lists_every_shard() {
    let c = load_str(&business("shards = 3")).unwrap();
    assert_eq!(c.businesses[0].keys(), vec!["k:0", "k:1", "k:2"]);
}

#[test]
fn passwords_are_redacted() {
    let c = load_str(&business("")).unwrap();
    let shown = format!("{:?} {}", c.amqp, c.amqp);
    assert!(!shown.contains("secret"), "{shown}");
    assert!(shown.contains("guest:***@127.0.0.1"), "{shown}");
    assert_eq!(redact_url("redis://:pw@h:1/0"), "redis://:***@h:1/0");
    assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
}

fn redis_section(redis: &str) -> String {
    format!(
        "[redis]\n{redis}\n[amqp]\nurl = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n[businesses.billing]\nkey = \"k\"\nexchange = \"e\"\nrouting_key = \"r\"\n"
    )
}

/// Like [`refused`], for a file whose `[redis]` section is `section`.
#[track_caller]
fn redis_refused(section: &str, needles: &[&str]) -> String {
    refused(&redis_section(section), needles)
}

fn pem_files() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    // A syntactically valid PEM certificate and key (not a usable pair:
    // validation checks the files' form, the handshake checks the rest).
    let cert = dir.path().join("c.pem");
    std::fs::write(
        &cert,
        "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let key = dir.path().join("k.pem");
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nMAA=\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let (c, k) = (cert.display().to_string(), key.display().to_string());
    (dir, c, k)
}

/// A self-signed certificate and its key, made by `openssl`: validation
/// checks that the two make a usable client identity.
fn pem_pair() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
    let ok = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args([
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=t",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl is needed by the tests");
    assert!(ok.success());
    let (c, k) = (cert.display().to_string(), key.display().to_string());
    (dir, c, k)
}

#[test]
fn redis_mode_defaults_to_standalone_and_refuses_others() {
    let c = load_str(&business("")).unwrap();
    assert_eq!(c.redis.mode, RedisMode::Standalone);
    redis_refused("mode = \"replicated\"\nurl = \"redis://h\"", &["[redis] field \"mode\" must be \"standalone\", \"cluster\" or \"sentinel\" (got \"replicated\")"]);
}

#[test]
fn urls_are_refused_in_standalone_mode() {
    redis_refused(
        "url = \"redis://h\"\nurls = [\"redis://a\"]",
        &["[redis] field \"urls\" is for mode = \"cluster\""],
    );
}

#[test]
fn cluster_and_sentinel_need_urls() {
    for mode in ["cluster", "sentinel"] {
        let want = format!("[redis] field \"urls\" is required for mode = \"{mode}\"");
        redis_refused(&format!("mode = \"{mode}\"\nmaster_name = \"m\""), &[&want]);
    }
}

#[test]
fn cluster_takes_url_and_urls_as_seeds_and_names_shards_as_everywhere() {
    let c = load_str(&redis_section(
        "mode = \"cluster\"\nurl = \"redis://a:7000\"\nurls = [\"redis://b:7000\"]",
    ))
    .unwrap();
    assert_eq!(c.redis.urls.len(), 2);
    let c = load_str(
        &redis_section("mode = \"cluster\"\nurls = [\"redis://b:7000\"]")
            .replace("routing_key = \"r\"", "routing_key = \"r\"\nshards = 3"),
    )
    .unwrap();
    // The names do not depend on the Redis mode; spread is a choice.
    assert_eq!(c.businesses[0].shard_names, ShardNames::Index);
    assert_eq!(c.businesses[0].keys()[0], "k:0");
}

#[test]
fn redis_url_scheme_is_checked_per_field() {
    redis_refused(
        "mode = \"cluster\"\nurls = [\"redis://a:1\", \"unix:///tmp/r.sock\"]",
        &["[redis] field \"urls[1]\" must start with redis:// or rediss://"],
    );
    redis_refused(
        "url = \"http://h\"",
        &["[redis] field \"url\" must start with"],
    );
}

#[test]
fn insecure_tls_is_refused() {
    redis_refused(
        "url = \"rediss://h:6380/#insecure\"",
        &["[redis] field \"url\": \"insecure\" would turn off the check"],
    );
}

#[test]
fn cluster_refuses_a_database_other_than_0() {
    redis_refused(
        "mode = \"cluster\"\nurls = [\"redis://a:7000/3\"]",
        &["[redis] field \"urls[0]\": a cluster has only database 0"],
    );
}

#[test]
fn mixed_tls_and_clear_text_urls_are_refused() {
    redis_refused(
        "mode = \"cluster\"\nurls = [\"rediss://a:7000\", \"redis://b:7000\"]",
        &["mix rediss:// (TLS) and redis://"],
    );
}

#[test]
fn sentinel_needs_master_name() {
    redis_refused(
        "mode = \"sentinel\"\nurls = [\"redis://s:26379\"]",
        &["[redis] field \"master_name\" is required for mode = \"sentinel\""],
    );
    let c = load_str(&redis_section(
        "mode = \"sentinel\"\nurls = [\"redis://:pw@s:26379/2\"]\nmaster_name = \"main\"\nsentinel_password = \"spw\"",
    ))
    .unwrap();
    assert_eq!(c.redis.master_name.as_deref(), Some("main"));
    assert!(!format!("{:?}", c.redis).contains("spw"));
}

#[test]
fn master_name_outside_sentinel_mode_is_refused() {
    redis_refused(
        "url = \"redis://h\"\nmaster_name = \"m\"",
        &["[redis] field \"master_name\" is for mode = \"sentinel\" (mode is \"standalone\")"],
    );
}

#[test]
fn sentinel_password_outside_sentinel_mode_is_refused() {
    let e = redis_refused(
        "url = \"redis://h\"\nsentinel_password = \"x\"",
        &["[redis] field \"sentinel_password\" is for mode = \"sentinel\""],
    );
    assert!(!e.contains("\"x\""), "{e}");
}

#[test]
fn tls_files_need_rediss_urls() {
    let (_d, cert, _) = pem_files();
    redis_refused(
        &format!("url = \"redis://h\"\ntls_ca_file = \"{cert}\""),
        &["[redis] field \"tls_ca_file\" needs rediss:// URLs"],
    );
}

#[test]
fn unreadable_tls_file_is_named() {
    redis_refused(
        "url = \"rediss://h\"\ntls_ca_file = \"/nonexistent/ca.pem\"",
        &["[redis] field \"tls_ca_file\": cannot read /nonexistent/ca.pem"],
    );
}

#[test]
fn tls_file_without_pem_is_refused() {
    let (_d, cert, key) = pem_files();
    redis_refused(
        &format!("url = \"rediss://h\"\ntls_ca_file = \"{key}\""),
        &["field \"tls_ca_file\"", "holds no PEM certificate"],
    );
    redis_refused(
        &format!("url = \"rediss://h\"\ntls_cert_file = \"{cert}\"\ntls_key_file = \"{cert}\""),
        &[
            "field \"tls_key_file\"",
            "holds no usable unencrypted private key",
        ],
    );
}

#[test]
fn client_cert_and_key_come_together() {
    let (_d, cert, key) = pem_files();
    redis_refused(
        &format!("url = \"rediss://h\"\ntls_cert_file = \"{cert}\""),
        &["[redis] field \"tls_cert_file\" is set without \"tls_key_file\""],
    );
    redis_refused(
        &format!("url = \"rediss://h\"\ntls_key_file = \"{key}\""),
        &["[redis] field \"tls_key_file\" is set without \"tls_cert_file\""],
    );
    let (_d, cert, key) = pem_pair();
    let c = load_str(&redis_section(&format!(
        "url = \"rediss://h\"\ntls_ca_file = \"{cert}\"\ntls_cert_file = \"{cert}\"\ntls_key_file = \"{key}\""
    )))
    .unwrap();
    assert!(c.redis.is_tls() && c.redis.tls.key_file.is_some());
}

#[test]
fn hash_tagged_key_with_shards_is_refused_in_cluster_mode() {
    let body = redis_section("mode = \"cluster\"\nurls = [\"redis://a:7000\"]")
        .replace("key = \"k\"", "key = \"{k}\"\nshards = 4");
    refused(
        &body,
        &["business \"billing\", field \"key\": \"{k}\" has a hash tag"],
    );
    // One shard, or standalone, is fine.
    let body = business("shards = 4").replace("key = \"k\"", "key = \"{k}\"");
    assert!(load_str(&body).is_ok());
}

#[test]
fn bad_shard_names_is_refused() {
    refused(
        &business("shard_names = \"hashed\""),
        &["business \"billing\", field \"shard_names\" must be \"index\""],
    );
    let c = load_str(&business("shards = 2\nshard_names = \"spread\"")).unwrap();
    assert_eq!(c.businesses[0].keys().len(), 2);
    assert!(c.businesses[0].keys()[1].starts_with("k:{s1."));
}

#[test]
fn bad_max_rate_scope_is_refused() {
    refused(&business("max_rate = 5\nmax_rate_scope = \"global\""), &["business \"billing\", field \"max_rate_scope\" must be \"process\" or \"cluster\" (got \"global\")"]);
}

#[test]
fn cluster_rate_scope_needs_max_rate() {
    refused(
        &business("max_rate_scope = \"cluster\""),
        &["field \"max_rate_scope\" = \"cluster\" needs max_rate"],
    );
    let c = load_str(&business("max_rate = 5\nmax_rate_scope = \"cluster\"")).unwrap();
    assert_eq!(c.businesses[0].max_rate_scope, RateScope::Cluster);
    let c = load_str(&business("max_rate = 5\nmax_rate_scope = \"process\"")).unwrap();
    assert_eq!(c.businesses[0].max_rate_scope, RateScope::Process);
}

#[test]
fn redis_section_round_trips_through_toml() {
    let c = load_str(&redis_section(
        "mode = \"sentinel\"\nurls = [\"redis://:p\\\"w@s:26379\"]\nmaster_name = \"main\"",
    ))
    .unwrap();
    let again = load_str(&format!(
        "{}[amqp]\nurl = \"amqp://h\"\n[businesses.b]\nkey = \"k\"\nexchange = \"e\"\nrouting_key = \"r\"\n",
        c.redis.to_toml()
    ))
    .unwrap();
    assert_eq!(again.redis.urls[0].expose(), c.redis.urls[0].expose());
    assert_eq!(again.redis.master_name.as_deref(), Some("main"));
}
fn load_env(body: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(body.as_bytes()).unwrap();
    let env = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    load_with_env(f.path(), env.collect())
}

#[test]
fn environment_values_reach_delayd_byte_for_byte() {
    let c = load_env(
        &business(""),
        &[
            ("DELAYD_BUSINESSES__BILLING__ROUTING_KEY", "1.10"),
            ("DELAYD_BUSINESSES__BILLING__KEY", "00123"),
            ("DELAYD_BUSINESSES__BILLING__EXCHANGE", "true"),
            ("DELAYD_AMQP__URL", "amqp://guest:0042@127.0.0.1:5672/%2f"),
            ("DELAYD_BUSINESSES__BILLING__BATCH_SIZE", "50"),
            ("DELAYD_BUSINESSES__BILLING__PERSISTENT", "false"),
        ],
    )
    .unwrap();
    let b = c.business("billing").unwrap();
    assert_eq!(b.routing_key, "1.10");
    assert_eq!(b.key, "00123");
    assert_eq!(b.exchange, "true");
    assert_eq!(
        c.amqp.urls[0].expose(),
        "amqp://guest:0042@127.0.0.1:5672/%2f"
    );
    assert_eq!(b.batch_size, 50, "numbers still parse from the environment");
    assert!(!b.persistent, "booleans still parse from the environment");
}

#[test]
fn a_node_list_from_the_environment_keeps_commas_in_passwords() {
    let body = business("").replace("url = \"amqp://guest:secret@127.0.0.1:5672/%2f\"\n", "");
    for list in [
        "amqp://u:p,1@a:5672/%2f,amqp://u:p2@b:5672/%2f",
        "amqp://u:p,1@a:5672/%2f amqp://u:p2@b:5672/%2f",
        "amqp://u:p,1@a:5672/%2f\namqp://u:p2@b:5672/%2f\n",
    ] {
        let c = load_env(&body, &[("DELAYD_AMQP__URLS", list)]).unwrap();
        let urls: Vec<&str> = c.amqp.urls.iter().map(|u| u.expose()).collect();
        assert_eq!(
            urls,
            ["amqp://u:p,1@a:5672/%2f", "amqp://u:p2@b:5672/%2f"],
            "{list:?}"
        );
    }
}

#[test]
fn names_the_broker_cannot_take_are_refused_at_load() {
    let long = "x".repeat(256);
    for field in ["exchange", "routing_key", "content_type"] {
        let body = business(&format!("{field} = \"{long}\""))
            .replace(&format!("\n{field} = \"e\"\n"), "\n")
            .replace(&format!("\n{field} = \"r\"\n"), "\n");
        let want =
            format!("business \"billing\", field \"{field}\" must be at most 255 bytes (got 256)");
        refused(&body, &[&want]);
    }
    refused(
        &business("").replace("[businesses.billing]", &format!("[businesses.{long}]")),
        &["at most 255 bytes"],
    );
    // 255 bytes is still fine.
    let ok = "y".repeat(255);
    load_str(&business("").replace("routing_key = \"r\"", &format!("routing_key = \"{ok}\"")))
        .unwrap();
}

#[test]
fn durations_beyond_their_stated_maximum_are_refused() {
    for (field, value) in [
        ("lease", "300y"),
        ("lease", "2days"),
        ("shutdown_timeout", "100000000y"),
        ("poll_interval", "100000000y"),
        ("watchdog_interval", "2h"),
        ("retry_backoff", "10000y"),
        ("retry_backoff_max", "10000y"),
    ] {
        let want = format!("business \"billing\", field \"{field}\" must be at most");
        refused(&business(&format!("{field} = \"{value}\"")), &[&want]);
    }
    refused(
        &business("member = \"id\"\ndedup_window = \"100000000y\""),
        &["field \"dedup_window\" must be at most"],
    );
    amqp_refused(
        "url = \"amqp://h/%2f\"\nconnect_timeout = \"100000000y\"",
        &["[amqp] field \"connect_timeout\" must be at most"],
    );
}

#[test]
fn key_families_that_overlap_are_refused() {
    for other in ["{k}:dead", "{k}:inflight", "{k}:meta", "{k}:body", "{k}"] {
        let body = second_business("", other);
        refused(&body, &["\"billing\"", "\"zeta\"", "overlap"]);
    }
    // A shard key of one business is another's key.
    assert!(err_of(&second_business("shards = 2", "k:1")).contains("overlap"));
}

#[test]
fn no_form_of_url_shows_its_password() {
    for (url, secret) in [
        ("redis+unix:///run/redis.sock?db=0&pass=s3cr3t", "s3cr3t"),
        ("redis://127.0.0.1:6379/0?password=s3cr3t", "s3cr3t"),
        ("redis://:pa/ss@127.0.0.1:6379/0", "pa/ss"),
        ("redis://user:p?w#d@127.0.0.1/0", "p?w#d"),
        ("amqp://guest:p@ss@host:5672/%2f", "p@ss"),
        ("amqp://guest:x,y@host:5672/%2f", "x,y"),
    ] {
        let shown = redact_url(url);
        assert!(!shown.contains(secret), "{url} shown as {shown}");
        assert!(shown.contains("***"), "{shown}");
    }
}

#[test]
fn a_bad_url_error_does_not_echo_its_password() {
    for (section, url) in [
        ("redis", "redis://:pa/ss@127.0.0.1:6379/0"),
        ("redis", "redis://u:pa ss@127.0.0.1:6379/0"),
        ("amqp", "amqp://guest:pa/ss@127.0.0.1:5672/%2f"),
    ] {
        let body = business("").replace(
            if section == "redis" {
                "redis://127.0.0.1:6379/0"
            } else {
                "amqp://guest:secret@127.0.0.1:5672/%2f"
            },
            url,
        );
        match load_str(&body) {
            Err(e) => {
                let e = e.to_string();
                assert!(
                    !e.contains("pa/ss") && !e.contains("pa ss") && !e.contains("ss@"),
                    "{e}"
                );
            }
            Ok(c) => {
                let shown = format!("{:?} {:?}", c.redis, c.amqp);
                assert!(!shown.contains("pa/ss"), "{shown}");
            }
        }
    }
}

#[test]
fn a_number_too_large_for_64_bits_is_refused_naming_its_field_and_line() {
    let e = refused(
        &business("batch_size = 12345678901234567890123"),
        &[
            "business \"billing\", field \"batch_size\" (line 11)",
            "12345678901234567890123",
        ],
    );
    assert!(!e.contains('\n'), "{e}");
    let e = refused(
        &business(
            "[businesses.billing.intake]\nexchange = \"x\"\nreplicas = -99999999999999999999999",
        ),
        &["business \"billing\", field \"intake.replicas\" (line 13)"],
    );
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn control_characters_in_a_refused_value_are_shown_escaped() {
    let e = refused(
        &business("score_unit = \"a\\u001b[31m\\nred\""),
        &["field \"score_unit\"", "a\\u{1b}[31m\\nred"],
    );
    assert!(!e.chars().any(char::is_control), "{e:?}");
}

#[test]
fn tenants_are_off_unless_set_and_weights_default_to_one() {
    let c = load_str(&business("")).unwrap();
    assert!(c.businesses[0].tenants.is_none());
    let c = load_str(&business(
        "tenants = true\n[businesses.billing.tenant_weights]\nacme = 3",
    ))
    .unwrap();
    let t = c.businesses[0].tenants.as_ref().unwrap();
    assert_eq!(t.weight(b"acme"), 3);
    assert_eq!(t.weight(b"other"), 1);
}

#[test]
fn tenant_weights_need_tenants_and_a_weight_from_1_to_1000() {
    refused(
        &business("[businesses.billing.tenant_weights]\nacme = 3"),
        &["section \"tenant_weights\" needs tenants = true"],
    );
    refused(
        &business("tenants = true\n[businesses.billing.tenant_weights]\nacme = 0"),
        &["tenant_weights.\"acme\" must be from 1 to 1000 (got 0)"],
    );
}

#[test]
fn a_tenant_max_rate_needs_tenants_and_a_rate_of_at_least_one() {
    let c = load_str(&business(
        "tenants = true\n[businesses.billing.tenant_max_rate]\nacme = 500",
    ))
    .unwrap();
    let t = c.businesses[0].tenants.as_ref().unwrap();
    assert_eq!(t.max_rate(b"acme"), Some(500));
    assert_eq!(t.max_rate(b"other"), None);
    refused(
        &business("[businesses.billing.tenant_max_rate]\nacme = 500"),
        &["section \"tenant_max_rate\" needs tenants = true; add it or remove the section"],
    );
    refused(
        &business("tenants = true\n[businesses.billing.tenant_max_rate]\nacme = 0"),
        &["tenant_max_rate.\"acme\" must be from 1 to 10000000 (got 0)"],
    );
}

#[test]
fn a_tenant_window_needs_tenants_and_is_from_1_to_100000() {
    let c = load_str(&business("tenants = true\ntenant_window = 64")).unwrap();
    assert_eq!(c.businesses[0].tenants.as_ref().unwrap().window, Some(64));
    let c = load_str(&business("tenants = true")).unwrap();
    assert_eq!(c.businesses[0].tenants.as_ref().unwrap().window, None);
    refused(
        &business("tenant_window = 64"),
        &["tenant_window needs tenants = true; add it or remove tenant_window"],
    );
    for bad in ["0", "100001"] {
        refused(
            &business(&format!("tenants = true\ntenant_window = {bad}")),
            &[&format!(
                "tenant_window must be from 1 to 100000 (got {bad})"
            )],
        );
    }
}

#[test]
fn an_intake_tenant_header_needs_tenants_and_a_name() {
    let intake = "[businesses.billing.intake]\nexchange = \"in\"\nqueue = \"in\"\n";
    refused(
        &business(&format!("{intake}tenant_header = \"x-tenant\"")),
        &["field \"intake.tenant_header\" needs tenants = true"],
    );
    refused(
        &business(&format!("tenants = true\n{intake}tenant_header = \"\"")),
        &["field \"intake.tenant_header\" is empty"],
    );
    let c = load_str(&business(&format!(
        "tenants = true\n{intake}tenant_header = \"x-tenant\""
    )))
    .unwrap();
    let i = c.businesses[0].intake.as_ref().unwrap();
    assert_eq!(i.tenant_header.as_deref(), Some("x-tenant"));
}

#[test]
fn a_fraction_or_a_boolean_where_a_whole_number_belongs_is_refused_and_named() {
    let field = |f: &str| format!("business \"billing\", field \"{f}\"");
    refused(
        &business("max_rate = 2.5"),
        &[&field("max_rate"), "2.5", "whole number"],
    );
    refused(
        &business("batch_size = true"),
        &[&field("batch_size"), "whole number"],
    );
    refused(
        &business("tenants = true\n[businesses.billing.tenant_max_rate]\nacme = 0.5"),
        &["tenant_max_rate", "0.5", "whole number"],
    );
    refused(
        &business("tenants = true\n[businesses.billing.tenant_weights]\nacme = 1.5"),
        &["tenant_weights", "1.5", "whole number"],
    );
    // What the environment gives is a string: "1.9" is not 1.
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(business("").as_bytes()).unwrap();
    let env = |v: &str| {
        config::Map::from([(
            "DELAYD_BUSINESSES__BILLING__SCANNERS".to_string(),
            v.to_string(),
        )])
    };
    let e = load_with_env(f.path(), env("1.9")).unwrap_err().to_string();
    assert!(
        e.contains(&field("scanners")) && e.contains("whole number"),
        "{e}"
    );
    let e = load_with_env(f.path(), env("true"))
        .unwrap_err()
        .to_string();
    assert!(e.contains(&field("scanners")), "{e}");
    // A whole number stays accepted, written as an integer or exactly.
    let c = load_with_env(f.path(), env("3")).unwrap();
    assert_eq!(c.business("billing").unwrap().scanners, 3);
    let c = load_str(&business("max_rate = 2000.0")).unwrap();
    assert_eq!(c.business("billing").unwrap().max_rate, Some(2000));
}

//! Members under key names a business does not read stop the start, named
//! with the setting that reads them, instead of waiting forever unseen.

use delayd_test_support as common;

use std::time::Duration;

use common::*;
use delayd::keys::{shard_keys, ShardNames};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_under_names_a_business_does_not_read_stop_the_start_with_one_line() {
    let b = BusinessSpec::with_extra("unread", "shards = 6");
    let mut s = Setup::new(&[&b]).await;
    // A producer using the spread names, and one using a seventh shard.
    let spread0 = shard_keys(&b.key, 6, ShardNames::Spread)[0].clone();
    let seventh = format!("{}:7", b.key);
    let now = redis_now_ms(&mut s.redis).await;
    zadd_many(
        &mut s.redis,
        &spread0,
        &[(now as f64, b"a".to_vec()), (now as f64, b"b".to_vec())],
    )
    .await;
    zadd_many(&mut s.redis, &seventh, &[(now as f64, b"c".to_vec())]).await;
    let cfg = s.config.to_str().unwrap().to_string();

    let mut d = Daemon::start(&s.config);
    let status = d.wait(Duration::from_secs(15));
    assert!(!status.success(), "run started");
    let err = d.logs();
    // The log lines before it, then one line that says what and what to do.
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("delayd: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{err}");
    let err = errors[0];
    for want in [
        spread0.as_str(),
        seventh.as_str(),
        "shard_names = \"spread\"",
        "shards = 8",
        "3 member(s)",
        "ignore_unread_keys",
    ] {
        assert!(err.contains(want), "{want} missing from: {err}");
    }
    let f = assert_check_fails(&s.config);
    assert!(
        f.line.contains(&spread0) && f.line.contains(&seventh),
        "{}",
        f.line
    );

    // Told to ignore them, it starts, warns, and leaves them alone.
    let text = std::fs::read_to_string(&s.config)
        .unwrap()
        .replace("shards = 6", "shards = 6\nignore_unread_keys = true");
    std::fs::write(&s.config, text).unwrap();
    let (code, out, err) = delayd(&["check", "--config", &cfg]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("WARNING") && out.contains(&spread0), "{out}");
    let d = Daemon::start(&s.config);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(d.logs().contains("does not read"), "{}", d.logs());
    assert_eq!(zcard(&mut s.redis, &spread0).await, 2);
    del(&mut s.redis, &[spread0, seventh]).await;
}

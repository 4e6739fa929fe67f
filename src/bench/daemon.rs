//! delayd as the bench runs it: a child process on a temporary config, stopped
//! with SIGTERM, and its resident memory.

use super::*;

/// Writes `toml` to a temporary file readable by us only (it holds the
/// URLs with their passwords) and starts `delayd run` on it, as users run
/// it. Returns the child's pid and the bench business as loaded.
pub(super) fn start_daemon(
    names: &Names,
    state: &mut BenchState,
    toml: &str,
) -> Result<(u32, config::Business), BenchError> {
    let path = std::env::temp_dir().join(format!("delayd-bench-{}.toml", names.queue));
    std::fs::write(&path, toml).map_err(|e| fail("write temp config")(e.to_string()))?;
    state.config_path = Some(path.clone());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    }
    // The file holds the configuration as the environment layered it
    // already: read it, and run the child on it, without the environment.
    let bench_cfg = config::load_as_written(&path)
        .map_err(|e| BenchError::Usage(format!("bench: --business: {e}")))?;
    let business = bench_cfg
        .businesses
        .into_iter()
        .next()
        .ok_or_else(|| BenchError::Usage("bench: no bench business".into()))?;
    state.keys = business.keys();
    let exe = std::env::current_exe().map_err(|e| fail("own path")(e.to_string()))?;
    let mut run = Command::new(exe);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(config::is_config_var) {
            run.env_remove(name);
        }
    }
    let child = run
        .args(["run", "--config"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| fail("start delayd")(e.to_string()))?;
    let pid = child.id();
    state.daemon = Some(child);
    Ok((pid, business))
}

pub(super) fn stop_child(child: &mut Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// (peak, current) resident set of a process, in KiB.
pub(super) fn rss_kb(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

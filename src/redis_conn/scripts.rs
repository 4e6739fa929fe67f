//! The script registry: every Lua script delayd runs, declared once, each
//! the shared prelude followed by its own file, and known by its SHA1 so a
//! `NOSCRIPT` answer to `EVALSHA` is retried as `EVAL` on the same node.

use super::*;

static SCRIPTS: LazyLock<Mutex<HashMap<String, &'static str>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// A script delayd runs: registered by its SHA1 so that a `NOSCRIPT`
/// answer to `EVALSHA` can be retried as `EVAL` with the same keys.
pub fn script(code: &'static str) -> Script {
    let s = Script::new(code);
    if let Ok(mut m) = SCRIPTS.lock() {
        m.insert(s.get_hash().to_string(), code);
    }
    s
}

/// A script from `src/lua/NAME.lua`, after `prelude.lua`: the helpers whose
/// formulas (Redis's clock, the claim tag in an in-flight score, the
/// wrong-type check) must agree between scripts.
macro_rules! lua {
    ($name:literal) => {
        LazyLock::new(|| {
            script(concat!(
                include_str!("../lua/prelude.lua"),
                include_str!(concat!("../lua/", $name, ".lua"))
            ))
        })
    };
}

/// Recovers expired leases, then claims due members (`claim.lua`).
pub static CLAIM: LazyLock<Script> = lua!("claim");
/// Claims for a business with tenants (`claim_tenants.lua`): moves the
/// chosen tenants' due members into `K`, runs `claim.lua` itself on `K`,
/// and reports the tenants with due work. A business without tenants never
/// loads it.
pub static CLAIM_TENANTS: LazyLock<Script> = LazyLock::new(|| {
    script(concat!(
        include_str!("../lua/prelude.lua"),
        include_str!("../lua/claim_tenants.lua"),
        "local function claim()\n",
        include_str!("../lua/claim.lua"),
        "\nend\nreturn fair_claim(claim)\n"
    ))
});
/// Forgets members the broker confirmed (`ack.lua`).
pub static ACK: LazyLock<Script> = lua!("ack");
/// Hands members back to pending, or to the dead set (`retry.lua`).
pub static RETRY: LazyLock<Script> = lua!("retry");
/// Extends the leases of held members (`extend.lua`).
pub static EXTEND: LazyLock<Script> = lua!("extend");
/// Deletes retry state and claim records nothing needs (`sweep.lua`).
pub static SWEEP: LazyLock<Script> = lua!("sweep");
/// Deletes bodies no task owns any more (`sweep_body.lua`).
pub static SWEEP_BODY: LazyLock<Script> = lua!("sweep_body");
/// One key family's counts (`stats.lua`).
pub static STATS: LazyLock<Script> = lua!("stats");
/// Dead members with their reasons (`dead_list.lua`).
pub static DEAD_LIST: LazyLock<Script> = lua!("dead_list");
/// Dead members back to pending (`dead_requeue.lua`).
pub static DEAD_REQUEUE: LazyLock<Script> = lua!("dead_requeue");
/// Deletes dead members (`dead_purge.lua`).
pub static DEAD_PURGE: LazyLock<Script> = lua!("dead_purge");
/// Counts the dead members a requeue or purge would pick (`dead_match.lua`).
pub static DEAD_MATCH: LazyLock<Script> = lua!("dead_match");
/// Pending counts per due-time bucket (`histogram.lua`).
pub static HISTOGRAM: LazyLock<Script> = lua!("histogram");
/// Cancels one pending task (`cancel.lua`).
pub static CANCEL: LazyLock<Script> = lua!("cancel");
/// Cancels or moves one batch of pending tasks a bulk action picks
/// (`bulk_pending.lua`).
pub static BULK_PENDING: LazyLock<Script> = lua!("bulk_pending");
/// The start of one body and its size (`body_head.lua`).
pub static BODY_HEAD: LazyLock<Script> = lua!("body_head");
/// Ids whose body contains a text, one `HSCAN` step (`body_search.lua`).
pub static BODY_SEARCH: LazyLock<Script> = lua!("body_search");
/// One page of pending tasks after a cursor (`list.lua`).
pub static LIST: LazyLock<Script> = lua!("list");
/// One `ZSCAN` step of a search by prefix (`scan_glimpse.lua`).
pub static SCAN_GLIMPSE: LazyLock<Script> = lua!("scan_glimpse");
/// Takes from the shared `max_rate` budget (`rate.lua`).
pub static RATE: LazyLock<Script> = lua!("rate");
/// Stores intake messages (`intake.lua`).
pub static INTAKE: LazyLock<Script> = lua!("intake");
/// Stages messages read from the delayed-message plugin (`adopt_stage.lua`).
pub static ADOPT_STAGE: LazyLock<Script> = lua!("adopt_stage");
/// Makes staged messages pending, or drops them (`adopt_promote.lua`).
pub static ADOPT_PROMOTE: LazyLock<Script> = lua!("adopt_promote");
/// Writes recurring occurrences ahead (`recurring.lua`).
pub static RECURRING: LazyLock<Script> = lua!("recurring");
/// Pauses or resumes one recurring schedule (`schedule_pause.lua`).
pub static SCHEDULE_PAUSE: LazyLock<Script> = lua!("schedule_pause");

/// The earliest head among tenants not paused (`tenants_head.lua`).
pub static TENANTS_HEAD: LazyLock<Script> = lua!("tenants_head");
/// Resumes one paused tenant (`tenant_resume.lua`).
pub static TENANT_RESUME: LazyLock<Script> = lua!("tenant_resume");
/// A page of a business's tenants with their counts (`tenants_list.lua`).
pub static TENANTS_LIST: LazyLock<Script> = lua!("tenants_list");

/// The `EVAL` equivalent of an `EVALSHA` command whose script is known.
pub(crate) fn eval_for(cmd: &Cmd) -> Option<Cmd> {
    let mut args = cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(b) => b,
        _ => &[][..],
    });
    if !args.next()?.eq_ignore_ascii_case(b"EVALSHA") {
        return None;
    }
    let sha = std::str::from_utf8(args.next()?).ok()?;
    let code = *SCRIPTS.lock().ok()?.get(sha)?;
    let mut eval = redis::cmd("EVAL");
    eval.arg(code);
    for a in args {
        eval.arg(a);
    }
    Some(eval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evalsha_of_a_known_script_becomes_eval_with_the_same_keys() {
        let s = script("return KEYS[1]");
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(s.get_hash()).arg(1).arg("k").arg("a");
        let eval = eval_for(&cmd).unwrap();
        let args: Vec<Vec<u8>> = eval
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => vec![],
            })
            .collect();
        assert_eq!(
            args,
            vec![
                b"EVAL".to_vec(),
                b"return KEYS[1]".to_vec(),
                b"1".to_vec(),
                b"k".to_vec(),
                b"a".to_vec()
            ]
        );
        assert!(eval_for(&redis::cmd("GET")).is_none());
    }
}

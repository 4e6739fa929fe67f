//! Running an expression on a broker node with `rabbitmqctl eval`. The
//! expression is the last argument, never standard input: from RabbitMQ
//! 3.12 on, the `rabbitmqctl` script starts the CLI with `-noinput` unless
//! `eval` is its only argument, and `-n NODE eval` then waits for ever for
//! an expression it never reads. An argument is limited to 128 KiB on
//! Linux ([`MAX_EXPRESSION`]): callers split what could be longer. The
//! command may be a wrapper with arguments of its own (one that sets `HOME`
//! for the Erlang cookie, say); delayd appends `-n NODE eval EXPRESSION`.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// Longest one expression may run: a chunk is small, so a node that takes
/// this long is stuck, and the command says so rather than wait for ever.
const TIMEOUT: Duration = Duration::from_secs(600);

/// Longest expression delayd passes: below Linux's 128 KiB limit on one
/// argument (`MAX_ARG_STRLEN`), with room for a wrapper's own quoting.
pub const MAX_EXPRESSION: usize = 120 << 10;

/// How delayd reaches the broker's nodes.
#[derive(Debug, Clone)]
pub struct Ctl {
    program: String,
    args: Vec<String>,
}

/// Why an expression did not run.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The command could not be started.
    #[error("cannot run {program}: {error}")]
    Spawn {
        /// The program.
        program: String,
        /// What the system said.
        error: std::io::Error,
    },
    /// It ran and failed (the node unreachable, the expression raised).
    #[error("{program} -n {node} eval failed ({status}): {said}")]
    Failed {
        /// The program.
        program: String,
        /// The node.
        node: String,
        /// Its exit status.
        status: String,
        /// The end of what it printed.
        said: String,
    },
    /// The expression is longer than [`MAX_EXPRESSION`] (a caller's bug:
    /// callers split what could be longer).
    #[error(
        "an expression of {len} bytes is longer than one argument may be ({} bytes)",
        MAX_EXPRESSION
    )]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// It did not finish within [`TIMEOUT`].
    #[error("{program} -n {node} eval did not finish within {} s", TIMEOUT.as_secs())]
    TimedOut {
        /// The program.
        program: String,
        /// The node.
        node: String,
    },
}

impl Ctl {
    /// `command`: a program and its arguments, split at whitespace (no
    /// quoting: a path with spaces needs a wrapper script).
    pub fn new(command: &str) -> Option<Self> {
        let mut words = command.split_whitespace().map(str::to_string);
        let program = words.next()?;
        Some(Self {
            program,
            args: words.collect(),
        })
    }

    /// Runs `expression` on `node`; what it printed on standard output.
    pub async fn eval(&self, node: &str, expression: &str) -> Result<String, CtlError> {
        if expression.len() > MAX_EXPRESSION {
            return Err(CtlError::TooLong {
                len: expression.len(),
            });
        }
        let child = Command::new(&self.program)
            .args(&self.args)
            .args(["-n", node, "eval", expression])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| CtlError::Spawn {
                program: self.program.clone(),
                error,
            })?;
        let out = tokio::time::timeout(TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| CtlError::TimedOut {
                program: self.program.clone(),
                node: node.to_string(),
            })?
            .map_err(|error| CtlError::Spawn {
                program: self.program.clone(),
                error,
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            let all = format!("{}{}", String::from_utf8_lossy(&out.stderr), stdout);
            return Err(CtlError::Failed {
                program: self.program.clone(),
                node: node.to_string(),
                status: out.status.to_string(),
                said: last_words(&all),
            });
        }
        Ok(stdout)
    }
}

/// The last few non-empty lines of a command's output, on one line.
fn last_words(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let tail = &lines[lines.len().saturating_sub(4)..];
    let mut out = tail.join(" | ");
    if out.len() > 600 {
        let mut cut = 600;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_expression_is_the_last_argument_and_standard_input_is_empty() {
        // Prints its arguments, one a line, then what standard input holds.
        let ctl = Ctl::new("sh -c printf${IFS}'%s\\n'${IFS}\"$@\";cat sh").unwrap();
        let expr = "begin\n  A = 1,\n  A + 1\nend.";
        let out = ctl.eval("rabbit@a", expr).await.unwrap();
        assert_eq!(out, format!("-n\nrabbit@a\neval\n{expr}\n"));
    }

    #[tokio::test]
    async fn an_expression_too_long_for_one_argument_is_refused_before_running() {
        let ctl = Ctl::new("false").unwrap();
        let long = "x".repeat(MAX_EXPRESSION + 1);
        let e = ctl.eval("rabbit@a", &long).await.unwrap_err();
        assert!(matches!(e, CtlError::TooLong { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_failing_command_is_an_error_with_its_last_words() {
        let ctl = Ctl::new("sh -c echo${IFS}unreachable>&2;exit${IFS}3 sh").unwrap();
        let e = ctl.eval("rabbit@a", "x.").await.unwrap_err().to_string();
        assert!(e.contains("unreachable"), "{e}");
        assert!(e.contains("-n rabbit@a"), "{e}");
    }
}

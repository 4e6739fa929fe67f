//! Running an expression on a broker node with `rabbitmqctl eval`. The
//! expression is an argument, never standard input: from RabbitMQ 3.12 on,
//! the `rabbitmqctl` script starts the CLI with `-noinput` unless `eval` is
//! its only argument, and `-n NODE eval` then waits for ever for an
//! expression it never reads. Bulk data (a commit's refs) follows as
//! further arguments, which `eval` binds to `_1`, `_2`, ... as binaries.
//! Linux limits one argument to 128 KiB and all of them to about 2 MiB
//! ([`MAX_ARGUMENT`], [`MAX_ARGUMENTS`]): callers split what could be
//! longer. The command may be a wrapper with arguments of its own (one that
//! sets `HOME` for the Erlang cookie, say); delayd appends
//! `-n NODE eval EXPRESSION [VALUE ...]`.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// Longest one expression may run: a chunk is small, so a node that takes
/// this long is stuck, and the command says so rather than wait for ever.
const TIMEOUT: Duration = Duration::from_secs(600);

/// Longest argument delayd passes (the expression, or one value): below
/// Linux's 128 KiB limit on one argument (`MAX_ARG_STRLEN`).
pub const MAX_ARGUMENT: usize = 120 << 10;

/// Most bytes of arguments in one call: half of Linux's usual 2 MiB for
/// arguments and environment together (`ARG_MAX`), leaving room for the
/// environment and a wrapper's own.
pub const MAX_ARGUMENTS: usize = 1 << 20;

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
    /// The expression or a value is longer than [`MAX_ARGUMENT`], or all
    /// of them than [`MAX_ARGUMENTS`] (a caller's bug: callers split what
    /// could be longer).
    #[error("{len} bytes of arguments are more than one rabbitmqctl call may take")]
    TooLong {
        /// The longest argument's length, or all of them.
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
        self.eval_with(node, expression, &[]).await
    }

    /// Runs `expression` on `node` with `values` bound to `_1`, `_2`, ...
    pub async fn eval_with(
        &self,
        node: &str,
        expression: &str,
        values: &[String],
    ) -> Result<String, CtlError> {
        let longest = values.iter().map(String::len).max().unwrap_or(0);
        let all = expression.len() + values.iter().map(String::len).sum::<usize>();
        if expression.len().max(longest) > MAX_ARGUMENT || all > MAX_ARGUMENTS {
            return Err(CtlError::TooLong {
                len: if all > MAX_ARGUMENTS {
                    all
                } else {
                    expression.len().max(longest)
                },
            });
        }
        let child = Command::new(&self.program)
            .args(&self.args)
            .args(["-n", node, "eval", expression])
            .args(values)
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
    async fn values_follow_the_expression_as_arguments_of_their_own() {
        let ctl = Ctl::new("sh -c printf${IFS}'%s|'${IFS}\"$@\" sh").unwrap();
        let values = ["1 QUJD".to_string(), "2\n3 RA==".to_string()];
        let out = ctl.eval_with("rabbit@a", "x.", &values).await.unwrap();
        assert_eq!(out, "-n|rabbit@a|eval|x.|1 QUJD|2\n3 RA==|");
    }

    #[tokio::test]
    async fn arguments_too_long_for_one_call_are_refused_before_running() {
        let ctl = Ctl::new("false").unwrap();
        let long = "x".repeat(MAX_ARGUMENT + 1);
        let e = ctl.eval("rabbit@a", &long).await.unwrap_err();
        assert!(matches!(e, CtlError::TooLong { .. }), "{e}");
        let many = vec!["y".repeat(MAX_ARGUMENT); MAX_ARGUMENTS / MAX_ARGUMENT + 1];
        let e = ctl.eval_with("rabbit@a", "x.", &many).await.unwrap_err();
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

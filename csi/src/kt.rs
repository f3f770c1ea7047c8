//! The `kt` binary: where it is, and the CLI calls kt-csi makes with it.
//!
//! kt-csi reads what `kt` did from its machine-readable contract, never from its human text:
//! the exit code says how a call failed ([`ErrorKind`], the one copy of kt's table here), and
//! with `--json` stdout carries one object, the result on success or
//! `{"error": {"kind", "exit_code", "message"}}` on failure (stderr keeps a human line
//! `kt: error: ...`). [`parse_output`] turns what a call printed into a result without running
//! anything, so the contract is tested on sample outputs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// How a `kt` call failed: kt's documented exit codes, and the `kind` names of its `--json`
/// errors. (Exit code 0 is success and has no kind.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// 1: any other failure.
    Other,
    /// 2: a bad command line.
    Usage,
    /// 3: the key or prefix does not exist.
    NotFound,
    /// 4: a bad key, namespace or argument.
    Invalid,
    /// 5: the store server or the agent cannot be reached.
    Unreachable,
    /// 6: the key exists, the destination differs, or it changed concurrently.
    Conflict,
    /// 7: the call timed out.
    Timeout,
    /// 8: no source could give every block.
    Unavailable,
    /// 9: permission denied, or not authenticated.
    Denied,
}

impl ErrorKind {
    /// kt's table: each kind, its exit code and its JSON name.
    const TABLE: [(ErrorKind, i32, &'static str); 9] = [
        (ErrorKind::Other, 1, "other"),
        (ErrorKind::Usage, 2, "usage"),
        (ErrorKind::NotFound, 3, "not_found"),
        (ErrorKind::Invalid, 4, "invalid"),
        (ErrorKind::Unreachable, 5, "unreachable"),
        (ErrorKind::Conflict, 6, "conflict"),
        (ErrorKind::Timeout, 7, "timeout"),
        (ErrorKind::Unavailable, 8, "unavailable"),
        (ErrorKind::Denied, 9, "denied"),
    ];

    /// The kind of a failed call's exit code. A code outside the table (a panic's 101, or 0,
    /// which is no failure) is [`ErrorKind::Other`].
    pub fn from_code(code: i32) -> ErrorKind {
        Self::TABLE
            .iter()
            .find(|(_, c, _)| *c == code)
            .map_or(ErrorKind::Other, |(k, _, _)| *k)
    }

    /// The kind a `--json` error names, if kt's table has it.
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        Self::TABLE
            .iter()
            .find(|(_, _, n)| *n == name)
            .map(|(k, _, _)| *k)
    }

    fn entry(self) -> (i32, &'static str) {
        let (_, code, name) = Self::TABLE
            .iter()
            .find(|(k, _, _)| *k == self)
            .expect("every kind is in the table");
        (*code, name)
    }

    /// The exit code kt ends with for this kind.
    pub fn code(self) -> i32 {
        self.entry().0
    }

    /// The name kt's `--json` errors give this kind.
    pub fn name(self) -> &'static str {
        self.entry().1
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KtError {
    #[error("running {kt}: {source}")]
    Spawn {
        kt: String,
        #[source]
        source: std::io::Error,
    },
    /// kt ran and failed; `kind` comes from its exit code (`code`, `None` when a signal ended
    /// it), `message` from its `--json` error, else from its stderr.
    #[error("kt {args}: {message} ({kind}, {})", exit_text(*.code))]
    Failed {
        args: String,
        kind: ErrorKind,
        code: Option<i32>,
        message: String,
    },
}

impl KtError {
    /// How the call failed; a kt that could not be started is [`ErrorKind::Other`].
    pub fn kind(&self) -> ErrorKind {
        match self {
            KtError::Spawn { .. } => ErrorKind::Other,
            KtError::Failed { kind, .. } => *kind,
        }
    }
}

fn exit_text(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exit code {c}"),
        None => "ended by a signal".into(),
    }
}

/// The one JSON object a `kt --json` call printed on stdout (the last line that is one, should
/// anything precede it).
fn json_object(stdout: &[u8]) -> Option<serde_json::Map<String, Value>> {
    let text = String::from_utf8_lossy(stdout);
    let whole = serde_json::from_str::<Value>(text.trim()).ok();
    whole
        .or_else(|| {
            text.lines()
                .rev()
                .find_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        })
        .and_then(|v| match v {
            Value::Object(map) => Some(map),
            _ => None,
        })
}

/// What a `kt ... --json` call (its command line `args`, for messages) ended with: its exit
/// `code` (`None`: a signal), stdout and stderr. On success, the object it printed (`Null` if
/// stdout held none: the exit code is what says it succeeded). On failure, a
/// [`KtError::Failed`] whose kind is the exit code's and whose message is the JSON error's,
/// else the stderr's. Runs nothing.
pub fn parse_output(
    args: &str,
    code: Option<i32>,
    stdout: &[u8],
    stderr: &[u8],
) -> Result<Value, KtError> {
    let object = json_object(stdout);
    if code == Some(0) {
        return Ok(object.map_or(Value::Null, Value::Object));
    }
    let from_json = object
        .as_ref()
        .and_then(|o| o.get("error")?.get("message")?.as_str())
        .map(str::to_string)
        .filter(|m| !m.trim().is_empty());
    let message = from_json.unwrap_or_else(|| {
        let stderr = String::from_utf8_lossy(stderr);
        let line = stderr.split_whitespace().collect::<Vec<_>>().join(" ");
        if line.is_empty() {
            "(no message)".into()
        } else {
            line
        }
    });
    Err(KtError::Failed {
        args: args.to_string(),
        kind: code.map_or(ErrorKind::Other, ErrorKind::from_code),
        code,
        message,
    })
}

/// What `kt rm --json` reported, from [`parse_output`]'s result: `true` when it removed keys,
/// `false` when there was nothing to remove (exit code 3, not found, or an empty `removed`
/// list). A success whose stdout lists nothing readable counts as removed: the exit code is
/// the contract, the list only adds detail.
pub fn rm_outcome(parsed: Result<Value, KtError>) -> Result<bool, KtError> {
    match parsed {
        Ok(v) => Ok(v
            .get("removed")
            .and_then(Value::as_array)
            .is_none_or(|keys| !keys.is_empty())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// `kt` next to the running executable, else the first `kt` on `PATH`, else plain `kt` (which
/// then fails with a clear error when first used).
pub fn find_kt() -> PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("kt")))
        .filter(|p| is_executable(p));
    beside
        .or_else(|| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join("kt"))
                    .find(|p| is_executable(p))
            })
        })
        .unwrap_or_else(|| PathBuf::from("kt"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Removes key `prefix` of namespace `ns` and every key below it
/// (`kt rm --json --recursive PREFIX`). Returns `false` when there was nothing to remove (see
/// [`rm_outcome`]). Blocking.
pub fn remove_tree(kt: &Path, server: &str, ns: &str, prefix: &str) -> Result<bool, KtError> {
    // `--` last but one: a key may start with '-'.
    let args = [
        "rm",
        "--json",
        "--recursive",
        "-n",
        ns,
        "--server",
        server,
        "--",
        prefix,
    ];
    let out = Command::new(kt)
        .args(args)
        .env_remove("KT_NAMESPACE")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .map_err(|source| KtError::Spawn {
            kt: kt.display().to_string(),
            source,
        })?;
    rm_outcome(parse_output(
        &args.join(" "),
        out.status.code(),
        &out.stdout,
        &out.stderr,
    ))
}

/// A stand-in for `kt` in unit tests: a shell script.
#[cfg(test)]
pub(crate) fn fake_kt(dir: &Path, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("kt");
    let script = format!("#!/bin/sh\n[ \"$1\" = --probe ] && exit 0\n{body}\n");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A child forked elsewhere in the test process may hold the script open for writing until
    // it execs (ETXTBSY); once one run started, no one writes to it any more.
    for _ in 0..100 {
        match Command::new(&path).arg("--probe").status() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            r => {
                assert!(r.unwrap().success(), "{} does not run", path.display());
                return path;
            }
        }
    }
    panic!("{} stayed busy", path.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARGS: &str = "rm --json --recursive -n team --server s:7447 -- vol";

    fn rm(code: Option<i32>, stdout: &str, stderr: &str) -> Result<bool, KtError> {
        rm_outcome(parse_output(
            ARGS,
            code,
            stdout.as_bytes(),
            stderr.as_bytes(),
        ))
    }

    fn failed(r: Result<bool, KtError>) -> (ErrorKind, Option<i32>, String) {
        match r {
            Err(KtError::Failed {
                kind,
                code,
                message,
                ..
            }) => (kind, code, message),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn the_exit_code_table() {
        for (code, kind, name) in [
            (1, ErrorKind::Other, "other"),
            (2, ErrorKind::Usage, "usage"),
            (3, ErrorKind::NotFound, "not_found"),
            (4, ErrorKind::Invalid, "invalid"),
            (5, ErrorKind::Unreachable, "unreachable"),
            (6, ErrorKind::Conflict, "conflict"),
            (7, ErrorKind::Timeout, "timeout"),
            (8, ErrorKind::Unavailable, "unavailable"),
            (9, ErrorKind::Denied, "denied"),
        ] {
            assert_eq!(ErrorKind::from_code(code), kind);
            assert_eq!(kind.code(), code);
            assert_eq!(kind.name(), name);
            assert_eq!(ErrorKind::from_name(name), Some(kind));
        }
        // A panic (101), anything else outside the table: some other failure.
        for code in [0, 10, 101, 255, -1] {
            assert_eq!(ErrorKind::from_code(code), ErrorKind::Other, "{code}");
        }
        assert_eq!(ErrorKind::from_name("gone"), None);
    }

    #[test]
    fn success_reports_what_was_removed() {
        assert!(rm(Some(0), "{\"removed\":[\"vol\",\"vol/a.txt\"]}\n", "").unwrap());
        // Nothing under the prefix was removed.
        assert!(!rm(Some(0), "{\"removed\":[]}\n", "").unwrap());
        // A success without a readable list still succeeded.
        assert!(rm(Some(0), "", "").unwrap());
        assert!(rm(Some(0), "removed vol\n", "").unwrap());
        assert_eq!(
            parse_output(ARGS, Some(0), b"{\"removed\":[\"vol\"]}", b"").unwrap()["removed"][0],
            "vol"
        );
    }

    #[test]
    fn not_found_is_nothing_to_remove() {
        let stdout =
            r#"{"error":{"kind":"not_found","exit_code":3,"message":"key vol not found"}}"#;
        assert!(!rm(Some(3), stdout, "kt: error: key vol not found\n").unwrap());
        // The exit code is what counts, with or without the JSON.
        assert!(!rm(Some(3), "", "kt: error: whatever it says\n").unwrap());
        // Human text that says "not found" under another exit code is not trusted.
        let (kind, ..) = failed(rm(Some(1), "", "kt: error: key vol not found\n"));
        assert_eq!(kind, ErrorKind::Other);
    }

    #[test]
    fn failures_carry_their_kind_and_the_json_message() {
        let stdout = concat!(
            r#"{"error":{"kind":"unreachable","exit_code":5,"#,
            r#""message":"store server s:7447 unreachable: connection refused"}}"#,
            "\n"
        );
        let r = rm(
            Some(5),
            stdout,
            "kt: error: store server s:7447 unreachable\n",
        );
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unreachable);
        assert_eq!(
            e.to_string(),
            format!(
                "kt {ARGS}: store server s:7447 unreachable: connection refused \
                 (unreachable, exit code 5)"
            )
        );
        let (kind, code, message) = failed(rm(
            Some(7),
            r#"{"error":{"kind":"timeout","exit_code":7,"message":"timed out"}}"#,
            "",
        ));
        assert_eq!(
            (kind, code, message.as_str()),
            (ErrorKind::Timeout, Some(7), "timed out")
        );
        assert_eq!(
            failed(rm(
                Some(4),
                r#"{"error":{"kind":"invalid","exit_code":4,"message":"bad key"}}"#,
                ""
            ))
            .0,
            ErrorKind::Invalid
        );
    }

    #[test]
    fn garbage_on_stdout_falls_back_to_stderr() {
        let (kind, code, message) = failed(rm(
            Some(9),
            "Segmentation fault? <html>\n{not json",
            "kt: error: permission denied\n  for namespace team\n",
        ));
        assert_eq!(kind, ErrorKind::Denied);
        assert_eq!(code, Some(9));
        assert_eq!(message, "kt: error: permission denied for namespace team");
        // An error object without a message, a JSON value that is not an object.
        assert_eq!(
            failed(rm(
                Some(6),
                r#"{"error":{"kind":"conflict"}}"#,
                "kt: error: changed"
            ))
            .2,
            "kt: error: changed"
        );
        assert_eq!(failed(rm(Some(6), "[1,2]", "")).2, "(no message)");
        // A panic, and a kill: other failures.
        let (kind, code, _) = failed(rm(Some(101), "", "thread 'main' panicked at ..."));
        assert_eq!((kind, code), (ErrorKind::Other, Some(101)));
        let e = rm(None, "", "").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Other);
        assert!(e.to_string().ends_with("(other, ended by a signal)"), "{e}");
    }

    #[test]
    fn log_lines_before_the_object_are_skipped() {
        let stdout = "note: something\n{\"removed\":[]}\n";
        assert!(!rm(Some(0), stdout, "").unwrap());
    }

    /// The call itself, against a stand-in for `kt` that prints what the contract says.
    #[test]
    fn remove_tree_passes_json_and_reads_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        let args_file = dir.path().join("args");
        let body = format!(
            "printf '%s\\n' \"$@\" > '{}'\n\
             case \"$9\" in\n\
             gone) echo '{{\"error\":{{\"kind\":\"not_found\",\"exit_code\":3,\"message\":\"key gone not found\"}}}}'; \
                   echo 'kt: error: key gone not found' >&2; exit 3;;\n\
             down) echo 'kt: error: store server unreachable' >&2; exit 5;;\n\
             *) echo '{{\"removed\":[\"'\"$9\"'\"]}}';;\n\
             esac",
            args_file.display()
        );
        let kt = fake_kt(dir.path(), &body);
        let run = |prefix: &str| remove_tree(&kt, "s:7447", "team", prefix);
        assert!(run("-vol").unwrap());
        let args = std::fs::read_to_string(&args_file).unwrap();
        assert_eq!(
            args.lines().collect::<Vec<_>>(),
            [
                "rm",
                "--json",
                "--recursive",
                "-n",
                "team",
                "--server",
                "s:7447",
                "--",
                "-vol"
            ]
        );
        assert!(!run("gone").unwrap());
        let e = run("down").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unreachable);
        assert!(
            e.to_string()
                .contains("kt: error: store server unreachable"),
            "{e}"
        );
        let missing = remove_tree(&dir.path().join("no-kt"), "s:7447", "team", "vol");
        assert!(matches!(missing, Err(KtError::Spawn { .. })), "{missing:?}");
    }
}

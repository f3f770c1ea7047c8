//! The check's child processes: itself again, with `--child` and a mode, answering one JSON
//! line on stdout. A child that hangs is killed at its deadline, so the check always ends.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A child started with [`spawn`], its output read as it comes (a full pipe must not stall it).
pub struct Running {
    what: String,
    child: Child,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

/// Starts this binary as `--child MODE ARGS...` with `envs` added to its environment.
pub fn spawn(mode: &str, args: &[String], envs: &[(&str, String)]) -> Result<Running, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("--child")
        .arg(mode)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting the {mode} child: {e}"))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    Ok(Running {
        what: format!(
            "the {mode} child {}",
            args.first().cloned().unwrap_or_default()
        ),
        child,
        stdout,
        stderr,
    })
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut s);
        }
        s
    })
}

impl Running {
    /// Waits for the child until `deadline` (then kills it) and returns the JSON object it
    /// printed last; an error when it failed, printed nothing or ran out of time.
    pub fn wait(mut self, deadline: Instant) -> Result<Value, String> {
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() >= deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("waiting for {}: {e}", self.what)),
            }
        };
        let out = self.stdout.join().unwrap_or_default();
        let err = self.stderr.join().unwrap_or_default();
        let answer: Option<Value> = out
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l.trim()).ok());
        let tail = || tail_of(&err, 1500);
        match (status, answer) {
            (None, _) => Err(format!(
                "{} did not finish in time and was killed; stderr: {}",
                self.what,
                tail()
            )),
            (Some(s), Some(v)) if s.success() => Ok(v),
            (Some(s), Some(v)) => Err(format!(
                "{} failed ({s}): {}; stderr: {}",
                self.what,
                v.get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given"),
                tail()
            )),
            (Some(s), None) => Err(format!(
                "{} ended ({s}) without an answer; stderr: {}",
                self.what,
                tail()
            )),
        }
    }
}

/// The last `max` bytes of `s` or so, on a character boundary.
fn tail_of(s: &str, max: usize) -> String {
    let s = s.trim();
    let mut at = s.len().saturating_sub(max);
    while !s.is_char_boundary(at) {
        at += 1;
    }
    s[at..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_keep_the_end_on_a_character_boundary() {
        assert_eq!(tail_of("  short \n", 100), "short");
        assert_eq!(tail_of("abcdef", 3), "def");
        assert_eq!(tail_of("aéb", 2), "b");
    }
}

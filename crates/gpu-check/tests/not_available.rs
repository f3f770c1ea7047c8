//! `kt-gpu-check` where CUDA is not usable: a `not_available` report and exit status 2, never a
//! panic. `KT_GPU_TRANSPORT=host` makes any machine such a one; a machine without libcuda is
//! one anyway.

use std::process::Command;

use serde_json::Value;

fn run(envs: &[(&str, &str)]) -> (i32, Value, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kt-gpu-check"));
    cmd.args(["--bytes", "4096"]);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("kt-gpu-check runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not a JSON report ({e}): {stdout}\nstderr: {stderr}"));
    (out.status.code().expect("an exit status"), report, stderr)
}

#[test]
fn the_host_transport_reports_not_available_with_exit_status_2() {
    let (code, report, stderr) = run(&[("KT_GPU_TRANSPORT", "host")]);
    assert_eq!(code, 2, "{report}\n{stderr}");
    assert_eq!(report["status"], "not_available", "{report}");
    assert_eq!(report["tool"], "kt-gpu-check");
    let reason = report["reason"].as_str().unwrap();
    assert!(reason.contains("KT_GPU_TRANSPORT=host"), "{reason}");
    assert_eq!(report["probe"]["cuda"]["ok"], false);
    assert_eq!(report["checks"], serde_json::json!([]));
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_machine_without_cuda_reports_not_available() {
    let (code, report, stderr) = run(&[]);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if report["probe"]["cuda"]["ok"] == true {
        // A GPU machine: the check ran for real; its outcome is the device check's business.
        assert!(code == 0 || code == 1, "{report}");
        return;
    }
    assert_eq!(code, 2, "{report}\n{stderr}");
    assert_eq!(report["status"], "not_available", "{report}");
    assert!(
        report["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{report}"
    );
}

#[test]
fn bad_arguments_are_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_kt-gpu-check"))
        .arg("--frobnicate")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage: kt-gpu-check"));
}

//! The Kubernetes manifests under deploy/, checked offline: rendered, validated against the
//! Kubernetes schemas in strict mode, and cross-checked for names, ports, sockets and images
//! (deploy/check.sh). CI installs what the check needs; a missing tool fails the test.

use std::process::Command;

#[test]
fn deploy_manifests_render_validate_and_agree() {
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/check.sh"))
        .output()
        .expect("run deploy/check.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "deploy/check.sh failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("documents valid"),
        "unexpected output:\n{stdout}"
    );
}

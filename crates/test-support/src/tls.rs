//! A throwaway certificate authority for TLS tests: one CA and one server certificate for the
//! names (DNS names or IP addresses) a test dials, and more certificates of the same CA.

use std::path::{Path, PathBuf};

pub struct Pki {
    ca: String,
    cert: String,
    key: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    pub fn new(names: &[&str]) -> Self {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "ktfs test CA");
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let (cert, key) = leaf(&issuer, names);
        Pki {
            ca: ca_cert.pem(),
            cert,
            key,
            issuer,
        }
    }

    /// Another server certificate of this CA, for `names`, written as `STEM.pem` and
    /// `STEM-key.pem` into `dir`; returns their paths.
    pub fn write_another(&self, names: &[&str], dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = leaf(&self.issuer, names);
        let paths = (
            dir.join(format!("{stem}.pem")),
            dir.join(format!("{stem}-key.pem")),
        );
        std::fs::write(&paths.0, cert).expect("write a certificate");
        std::fs::write(&paths.1, key).expect("write a key");
        paths
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca
    }

    /// Writes `ca.pem`, `cert.pem` and `key.pem` into `dir`; returns their paths in that order.
    pub fn write(&self, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let paths = (
            dir.join("ca.pem"),
            dir.join("cert.pem"),
            dir.join("key.pem"),
        );
        std::fs::write(&paths.0, &self.ca).expect("write ca.pem");
        std::fs::write(&paths.1, &self.cert).expect("write cert.pem");
        std::fs::write(&paths.2, &self.key).expect("write key.pem");
        paths
    }
}

/// A certificate for `names` signed by `issuer`, and its key, as PEM.
fn leaf(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, names: &[&str]) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("server key");
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let params = rcgen::CertificateParams::new(names).expect("server params");
    let cert = params.signed_by(&key, issuer).expect("server certificate");
    (cert.pem(), key.serialize_pem())
}

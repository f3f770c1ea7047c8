//! A throwaway certificate authority for TLS tests: one CA and one server certificate for the
//! names (DNS names or IP addresses) a test dials.

use std::path::{Path, PathBuf};

pub struct Pki {
    ca: String,
    cert: String,
    key: String,
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
        let key = rcgen::KeyPair::generate().expect("server key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let leaf = rcgen::CertificateParams::new(names).expect("server params");
        let cert = leaf.signed_by(&key, &issuer).expect("server certificate");
        Pki {
            ca: ca_cert.pem(),
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
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

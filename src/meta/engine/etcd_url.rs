//! The address of an etcd cluster as a store server is given it, and this store's prefix in it.

use std::path::PathBuf;

/// An engine address: `etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/PREFIX[?TLS]`, as
/// JuiceFS names its metadata engines. The prefix is required: it is this store's part of the
/// keyspace. TLS, as etcd's own `--cacert`, `--cert` and `--key`: `ca=FILE` (the CA that signed
/// the members' certificates; it turns TLS on), `cert=FILE&key=FILE` (this client's, for a
/// cluster with `--client-cert-auth`), `server_name=NAME` (checked instead of the host dialled).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub user: Option<(String, String)>,
    pub tls: Option<EtcdTls>,
}

/// Where the files of an etcd client's TLS are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub server_name: Option<String>,
}

impl std::fmt::Debug for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("EtcdUrl")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("bad etcd address {url:?}: {why} (expected etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/PREFIX)")]
pub struct BadEtcdUrl {
    url: String,
    why: &'static str,
}

impl std::str::FromStr for EtcdUrl {
    type Err = BadEtcdUrl;

    fn from_str(url: &str) -> Result<Self, BadEtcdUrl> {
        let bad = |why| BadEtcdUrl {
            // A password in the address stays out of the error.
            url: match url.rsplit_once('@') {
                Some((_, host)) => format!("etcd://...@{host}"),
                None => url.to_string(),
            },
            why,
        };
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("not an etcd:// address"))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, prefix) = rest
            .split_once('/')
            .ok_or_else(|| bad("no /PREFIX after the hosts"))?;
        let prefix = prefix.trim_end_matches('/');
        let mut tls = EtcdTls::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| bad("a query without ="))?;
            match name {
                "ca" => tls.ca = PathBuf::from(value),
                "cert" => tls.cert = Some(PathBuf::from(value)),
                "key" => tls.key = Some(PathBuf::from(value)),
                "server_name" => tls.server_name = Some(value.to_string()),
                _ => return Err(bad("an unknown option (ca, cert, key, server_name)")),
            }
        }
        let tls = match (tls.ca.as_os_str().is_empty(), &tls) {
            (true, t) if *t == EtcdTls::default() => None,
            (true, _) => return Err(bad("TLS options without ca=FILE")),
            (false, t) if t.cert.is_some() != t.key.is_some() => {
                return Err(bad("cert= and key= go together"))
            }
            (false, _) => Some(tls),
        };
        let scheme = match tls {
            Some(_) => "https",
            None => "http",
        };
        if prefix.is_empty() {
            return Err(bad("the prefix is empty"));
        }
        let (user, hosts) = match hosts.rsplit_once('@') {
            Some((cred, hosts)) => {
                let (u, p) = cred
                    .split_once(':')
                    .ok_or_else(|| bad("a user without a password"))?;
                (Some((u.to_string(), p.to_string())), hosts)
            }
            None => (None, hosts),
        };
        let endpoints: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("{scheme}://{h}"))
            .collect();
        if endpoints.is_empty() {
            return Err(bad("no hosts"));
        }
        if hosts.split(',').any(|h| !h.contains(':')) {
            return Err(bad("a host without a port"));
        }
        Ok(EtcdUrl {
            endpoints,
            prefix: format!("{prefix}/"),
            user,
            tls,
        })
    }
}

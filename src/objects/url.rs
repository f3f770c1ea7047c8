//! Where objects live, as `kt server --blocks` names it.

use std::path::PathBuf;

/// An object store's address: `s3://BUCKET[/PREFIX][?endpoint=URL&region=R&...]`,
/// `gs://BUCKET[/PREFIX]`, `az://CONTAINER[/PREFIX]`, or `file:///DIR` (a directory every
/// replica mounts). Credentials come from the environment each cloud's tools read
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `GOOGLE_APPLICATION_CREDENTIALS`,
/// `AZURE_STORAGE_ACCOUNT_NAME`, ...), never from the address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectUrl {
    Cloud {
        /// `s3`, `gs` or `az`.
        scheme: String,
        bucket: String,
        /// Object names start with it (no leading or trailing `/`; may be empty).
        prefix: String,
        /// Options of the query, as `object_store`'s configuration keys name them
        /// (`endpoint`, `region`, `allow_http`, ...).
        options: Vec<(String, String)>,
    },
    Dir(PathBuf),
}

#[derive(Debug, thiserror::Error)]
#[error("bad object store address {url}: {why} (s3://BUCKET/PREFIX?endpoint=URL&region=R, gs://BUCKET/PREFIX, az://CONTAINER/PREFIX, or file:///DIR)")]
pub struct BadObjectUrl {
    url: String,
    why: &'static str,
}

impl std::str::FromStr for ObjectUrl {
    type Err = BadObjectUrl;

    fn from_str(url: &str) -> Result<Self, BadObjectUrl> {
        let bad = |why| BadObjectUrl {
            url: url.to_string(),
            why,
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        if scheme == "file" {
            if rest.contains('?') {
                return Err(bad("a directory takes no options"));
            }
            let dir = PathBuf::from(rest);
            if !dir.is_absolute() {
                return Err(bad("file:// needs an absolute directory (file:///DIR)"));
            }
            return Ok(ObjectUrl::Dir(dir));
        }
        if !["s3", "gs", "az"].contains(&scheme) {
            return Err(bad("an unknown scheme"));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        if bucket.contains('@') {
            return Err(bad("credentials go in the environment, not the address"));
        }
        let prefix = prefix.trim_matches('/').to_string();
        if prefix.split('/').any(|s| s == "." || s == "..") {
            return Err(bad("a prefix with . or .."));
        }
        let mut options = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| bad("an option without ="))?;
            if name.contains("secret") || name.contains("key") || name.contains("token") {
                return Err(bad("credentials go in the environment, not the address"));
            }
            options.push((name.to_string(), value.to_string()));
        }
        Ok(ObjectUrl::Cloud {
            scheme: scheme.to_string(),
            bucket: bucket.to_string(),
            prefix,
            options,
        })
    }
}

impl std::fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectUrl::Dir(d) => write!(f, "file://{}", d.display()),
            ObjectUrl::Cloud {
                scheme,
                bucket,
                prefix,
                ..
            } => write!(f, "{scheme}://{bucket}/{prefix}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_credentials_stay_out_of_them() {
        let u: ObjectUrl = "s3://b/some/prefix/?endpoint=http://127.0.0.1:9000&region=r"
            .parse()
            .unwrap();
        assert_eq!(
            u,
            ObjectUrl::Cloud {
                scheme: "s3".into(),
                bucket: "b".into(),
                prefix: "some/prefix".into(),
                options: vec![
                    ("endpoint".into(), "http://127.0.0.1:9000".into()),
                    ("region".into(), "r".into())
                ],
            }
        );
        assert_eq!(u.to_string(), "s3://b/some/prefix");
        assert_eq!(
            "file:///srv/kt".parse::<ObjectUrl>().unwrap(),
            ObjectUrl::Dir("/srv/kt".into())
        );
        for bad in [
            "b/prefix",
            "ftp://b/x",
            "s3:///x",
            "file://relative/dir",
            "s3://b/x?secret_access_key=s",
            "s3://k:s@b/x",
            "s3://b/../x",
            "s3://b/x?endpoint",
        ] {
            assert!(bad.parse::<ObjectUrl>().is_err(), "{bad} parsed");
        }
    }
}

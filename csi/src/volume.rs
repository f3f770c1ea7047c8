//! What a ktfs volume is: a key prefix in a namespace, with the default locale of files written
//! into it. Its id is `NAMESPACE/PREFIX`; its volume context carries the same three attributes,
//! which is also what an ephemeral inline volume gives in its `volumeAttributes`.

use std::collections::BTreeMap;
use std::collections::HashMap;

/// Volume context / parameter keys.
pub const NAMESPACE: &str = "namespace";
pub const PREFIX: &str = "prefix";
pub const LOCALE: &str = "locale";
/// Set by the kubelet in the volume context of a CSI ephemeral inline volume.
pub const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// Keys under this prefix are added by Kubernetes (`--extra-create-metadata`, pod info on
/// mount); they are accepted and ignored.
pub const K8S_PREFIX: &str = "csi.storage.k8s.io/";
pub const DEFAULT_NAMESPACE: &str = "default";

const MAX_KEY: usize = 4096;
const MAX_SEGMENT: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    #[error(
        "bad namespace {0:?}: 1-63 characters a-z, 0-9 or '-', not starting or ending with '-'"
    )]
    BadNamespace(String),
    #[error("bad prefix {0:?}: {1}")]
    BadPrefix(String, &'static str),
    #[error("bad locale {0:?}: store or local")]
    BadLocale(String),
    #[error("malformed volume id {0:?}: expected NAMESPACE/PREFIX")]
    BadId(String),
    #[error("unknown parameter {0:?} (known: namespace, prefix, locale)")]
    UnknownParameter(String),
    #[error("an ephemeral volume needs the attribute \"prefix\"")]
    MissingPrefix,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Locale {
    #[default]
    Store,
    Local,
}

impl Locale {
    pub fn parse(s: &str) -> Result<Self, VolumeError> {
        match s {
            "" | "store" => Ok(Locale::Store),
            "local" => Ok(Locale::Local),
            other => Err(VolumeError::BadLocale(other.to_string())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Locale::Store => "store",
            Locale::Local => "local",
        }
    }
}

/// A volume: `prefix` inside namespace `namespace`, files written into it published with
/// `locale` unless a directory below says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    pub namespace: String,
    pub prefix: String,
    pub locale: Locale,
}

impl VolumeSpec {
    pub fn new(namespace: &str, prefix: &str, locale: Locale) -> Result<Self, VolumeError> {
        Ok(VolumeSpec {
            namespace: check_namespace(namespace)?,
            prefix: check_prefix(prefix)?,
            locale,
        })
    }

    /// The spec a CreateVolume request asks for: `parameters` of the StorageClass, the PV name
    /// as the prefix unless `prefix` is given.
    pub fn from_parameters(
        name: &str,
        params: &HashMap<String, String>,
    ) -> Result<Self, VolumeError> {
        for k in params.keys() {
            if ![NAMESPACE, PREFIX, LOCALE].contains(&k.as_str()) && !k.starts_with(K8S_PREFIX) {
                return Err(VolumeError::UnknownParameter(k.clone()));
            }
        }
        let namespace = params
            .get(NAMESPACE)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_NAMESPACE);
        let prefix = params
            .get(PREFIX)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or(name);
        let locale = Locale::parse(params.get(LOCALE).map(String::as_str).unwrap_or(""))?;
        Self::new(namespace, prefix, locale)
    }

    /// Parses a volume id `NAMESPACE/PREFIX` (the locale is not part of the id).
    pub fn from_id(id: &str) -> Result<Self, VolumeError> {
        let (ns, prefix) = id
            .split_once('/')
            .ok_or_else(|| VolumeError::BadId(id.to_string()))?;
        match Self::new(ns, prefix, Locale::Store) {
            // Ids are made by `id()`: no slashes to trim.
            Ok(v) if v.prefix == prefix => Ok(v),
            _ => Err(VolumeError::BadId(id.to_string())),
        }
    }

    /// The volume a NodePublishVolume request names: its context when it has one (a PVC's
    /// context from CreateVolume, or an ephemeral volume's attributes), else its id.
    pub fn from_publish(id: &str, ctx: &HashMap<String, String>) -> Result<Self, VolumeError> {
        let ephemeral = ctx.get(EPHEMERAL).is_some_and(|v| v == "true");
        let prefix = ctx.get(PREFIX).filter(|s| !s.is_empty());
        let locale = Locale::parse(ctx.get(LOCALE).map(String::as_str).unwrap_or(""))?;
        match prefix {
            Some(prefix) => {
                let ns = ctx
                    .get(NAMESPACE)
                    .map(String::as_str)
                    .filter(|s| !s.is_empty())
                    .unwrap_or(DEFAULT_NAMESPACE);
                Self::new(ns, prefix, locale)
            }
            None if ephemeral => Err(VolumeError::MissingPrefix),
            None => Ok(VolumeSpec {
                locale,
                ..Self::from_id(id)?
            }),
        }
    }

    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.prefix)
    }

    /// The volume context CreateVolume hands back, and NodePublishVolume reads.
    pub fn context(&self) -> HashMap<String, String> {
        HashMap::from([
            (NAMESPACE.to_string(), self.namespace.clone()),
            (PREFIX.to_string(), self.prefix.clone()),
            (LOCALE.to_string(), self.locale.as_str().to_string()),
        ])
    }

    /// A stable, ordered form for comparing requests.
    pub fn fields(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            (NAMESPACE, self.namespace.clone()),
            (PREFIX, self.prefix.clone()),
            (LOCALE, self.locale.as_str().to_string()),
        ])
    }
}

/// Namespace rules of ktfs (a Kubernetes namespace name).
pub fn check_namespace(ns: &str) -> Result<String, VolumeError> {
    let ok = !ns.is_empty()
        && ns.len() <= 63
        && ns
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !ns.starts_with('-')
        && !ns.ends_with('-');
    if ok {
        Ok(ns.to_string())
    } else {
        Err(VolumeError::BadNamespace(ns.to_string()))
    }
}

/// Key rules of ktfs: relative, segments non-empty, never `.` or `..`, no NUL, at most 255 bytes
/// each and 4096 in all. One leading or trailing `/` is dropped.
pub fn check_prefix(raw: &str) -> Result<String, VolumeError> {
    let bad = |why| Err(VolumeError::BadPrefix(raw.to_string(), why));
    let p = raw.strip_prefix('/').unwrap_or(raw);
    let p = p.strip_suffix('/').unwrap_or(p);
    if p.is_empty() {
        return bad("empty");
    }
    if p.len() > MAX_KEY {
        return bad("longer than 4096 bytes");
    }
    if p.contains('\0') {
        return bad("contains NUL");
    }
    for seg in p.split('/') {
        if seg.is_empty() {
            return bad("empty segment");
        }
        if seg == "." || seg == ".." {
            return bad("'.' or '..' segment");
        }
        if seg.len() > MAX_SEGMENT {
            return bad("a segment longer than 255 bytes");
        }
    }
    Ok(p.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parameters_default_to_the_pv_name_in_default() {
        let v = VolumeSpec::from_parameters("pvc-1", &map(&[])).unwrap();
        assert_eq!(v.id(), "default/pvc-1");
        assert_eq!(v.locale, Locale::Store);
        let v = VolumeSpec::from_parameters(
            "pvc-1",
            &map(&[
                ("namespace", "team-a"),
                ("prefix", "/svc/data/"),
                ("locale", "local"),
                ("csi.storage.k8s.io/pvc/name", "x"),
            ]),
        )
        .unwrap();
        assert_eq!(v.id(), "team-a/svc/data");
        assert_eq!(v.locale, Locale::Local);
    }

    #[test]
    fn bad_parameters_are_refused() {
        for p in [
            map(&[("namespace", "Team")]),
            map(&[("prefix", "a/../b")]),
            map(&[("locale", "nearby")]),
            map(&[("colour", "red")]),
        ] {
            assert!(VolumeSpec::from_parameters("pvc", &p).is_err(), "{p:?}");
        }
    }

    #[test]
    fn ids_round_trip_and_malformed_ids_fail() {
        let v = VolumeSpec::from_id("ns-1/a/b").unwrap();
        assert_eq!((v.namespace.as_str(), v.prefix.as_str()), ("ns-1", "a/b"));
        for bad in ["", "nons", "/a", "ns/", "NS/a", "ns//a", "ns/a/../b"] {
            assert!(VolumeSpec::from_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn publish_prefers_the_context_and_needs_a_prefix_when_ephemeral() {
        let v = VolumeSpec::from_publish(
            "csi-abc",
            &map(&[
                (EPHEMERAL, "true"),
                ("namespace", "default"),
                ("prefix", "my-svc/weights"),
            ]),
        )
        .unwrap();
        assert_eq!(v.id(), "default/my-svc/weights");
        assert_eq!(
            VolumeSpec::from_publish("csi-abc", &map(&[(EPHEMERAL, "true")])),
            Err(VolumeError::MissingPrefix)
        );
        let v = VolumeSpec::from_publish("ns/p", &map(&[("locale", "local")])).unwrap();
        assert_eq!((v.id().as_str(), v.locale), ("ns/p", Locale::Local));
    }
}

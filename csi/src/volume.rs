//! What a ktfs volume is: a key prefix in a namespace, with the default locale of files written
//! into it. Its id is `NAMESPACE/PREFIX`; its volume context carries the same three attributes
//! (and the StorageClass's `shareWithNamespaces`, where it has one), which is also what an
//! ephemeral inline volume gives in its `volumeAttributes`.
//!
//! Who may mount what: a volume's keys are its namespace's, and a pod mounts only its own
//! namespace's keys unless an administrator said otherwise. An inline volume's attributes are
//! written by the pod's author, so its namespace is the pod's, never an attribute's. A
//! persistent volume's context comes from its StorageClass (an administrator's), whose
//! `namespace` may name another namespace; its pods must then be in a namespace the class's
//! `shareWithNamespaces` lists. The pod's namespace is what the kubelet puts in the volume
//! context (`podInfoOnMount`), over anything the pod's author wrote there.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::collections::HashMap;

/// Volume context / parameter keys.
pub const NAMESPACE: &str = "namespace";
pub const PREFIX: &str = "prefix";
pub const LOCALE: &str = "locale";
/// The pod namespaces besides its own that may mount a volume: a comma-separated list, or `*`.
pub const SHARE: &str = "shareWithNamespaces";
/// `"true"`: with no store server reachable, the volume goes on reading what its node holds,
/// read-only (`kt mount --stale-reads`); `"false"` or absent: such reads fail.
pub const STALE_READS: &str = "staleReads";
/// Set by the kubelet in the volume context of a CSI ephemeral inline volume.
pub const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// Set by the kubelet in every volume context when the CSIDriver has `podInfoOnMount`.
pub const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
/// Set by the external provisioner in CreateVolume's parameters (`--extra-create-metadata`).
pub const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
/// Keys under this prefix are added by Kubernetes (`--extra-create-metadata`, pod info on
/// mount); they are accepted and ignored, but for the ones above.
pub const K8S_PREFIX: &str = "csi.storage.k8s.io/";
/// What `shareWithNamespaces` names to let pods of every namespace mount a volume.
pub const SHARE_ALL: &str = "*";

const MAX_KEY: usize = 4096;
const MAX_SEGMENT: usize = 255;
/// The CSI spec's bound on a volume name; a longer one is hashed like an unusual one.
const MAX_NAME: usize = 128;
/// Starts the prefix made from a volume name that is not a plain key segment. No plain name
/// starts with it, so a hashed name never meets a plain one.
const HASHED_NAME: char = '~';

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
    #[error("bad {SHARE} {0:?}: a comma-separated list of namespaces, or \"*\"")]
    BadShare(String),
    #[error("bad {STALE_READS} {0:?}: true or false")]
    BadStaleReads(String),
    #[error("unknown parameter {0:?} (known: namespace, prefix, locale, {SHARE}, {STALE_READS})")]
    UnknownParameter(String),
    #[error("an ephemeral volume needs the attribute \"prefix\"")]
    MissingPrefix,
    #[error(
        "the StorageClass names no namespace and the request carries no {PVC_NAMESPACE} \
         (the external-provisioner needs --extra-create-metadata): the volume's namespace \
         would be unknown"
    )]
    NoNamespace,
    #[error(
        "the volume context carries no {0}: the CSIDriver kt.ktfs.io needs podInfoOnMount: \
         true, as kt-csi takes a volume's namespace from its pod"
    )]
    NoPodInfo(&'static str),
    #[error("{0}")]
    Denied(String),
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
/// `locale` unless a directory below says otherwise. Pods of namespace `namespace` may mount
/// it, and those of the namespaces in `share` (`*`: all). With `stale_reads` it is served by
/// the namespace's mount that keeps reading while no store server answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    pub namespace: String,
    pub prefix: String,
    pub locale: Locale,
    pub share: BTreeSet<String>,
    pub stale_reads: bool,
}

fn non_empty<'a>(map: &'a HashMap<String, String>, key: &str) -> Option<&'a str> {
    map.get(key).map(String::as_str).filter(|s| !s.is_empty())
}

impl VolumeSpec {
    pub fn new(namespace: &str, prefix: &str, locale: Locale) -> Result<Self, VolumeError> {
        Ok(VolumeSpec {
            namespace: check_namespace(namespace)?,
            prefix: check_prefix(prefix)?,
            locale,
            share: BTreeSet::new(),
            stale_reads: false,
        })
    }

    /// The spec a CreateVolume request asks for: `parameters` of the StorageClass, the PV name
    /// as the prefix unless `prefix` is given (see [`name_prefix`]). The namespace is the
    /// class's `namespace`, else the PVC's.
    pub fn from_parameters(
        name: &str,
        params: &HashMap<String, String>,
    ) -> Result<Self, VolumeError> {
        for k in params.keys() {
            if ![NAMESPACE, PREFIX, LOCALE, SHARE, STALE_READS].contains(&k.as_str())
                && !k.starts_with(K8S_PREFIX)
            {
                return Err(VolumeError::UnknownParameter(k.clone()));
            }
        }
        let namespace = non_empty(params, NAMESPACE)
            .or_else(|| non_empty(params, PVC_NAMESPACE))
            .ok_or(VolumeError::NoNamespace)?;
        let prefix = match non_empty(params, PREFIX) {
            Some(p) => p.to_string(),
            None => name_prefix(name),
        };
        let locale = Locale::parse(params.get(LOCALE).map(String::as_str).unwrap_or(""))?;
        Ok(VolumeSpec {
            share: parse_share(params.get(SHARE).map(String::as_str).unwrap_or(""))?,
            stale_reads: parse_stale_reads(params)?,
            ..Self::new(namespace, &prefix, locale)?
        })
    }

    /// Checks StorageClass parameters as [`VolumeSpec::from_parameters`] does, for a request
    /// that has no PVC (ValidateVolumeCapabilities).
    pub fn check_parameters(params: &HashMap<String, String>) -> Result<(), VolumeError> {
        let mut params = params.clone();
        // A PVC's namespace stands in for the one the provisioner would add.
        params.insert(PVC_NAMESPACE.to_string(), "default".to_string());
        Self::from_parameters("x", &params).map(drop)
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

    /// The volume a NodePublishVolume request names, if its pod may mount it.
    ///
    /// An ephemeral volume is `prefix` of its attributes in the pod's namespace; an attribute
    /// `namespace` naming another one is [`VolumeError::Denied`], as is an attribute
    /// `shareWithNamespaces` (only a StorageClass grants that). A persistent volume is its
    /// context (from CreateVolume, or the PV's `volumeAttributes`), else its id; one in
    /// another namespace than the pod's is denied unless its `shareWithNamespaces` names the
    /// pod's. Without the pod's namespace nothing is mounted ([`VolumeError::NoPodInfo`]).
    pub fn from_publish(id: &str, ctx: &HashMap<String, String>) -> Result<Self, VolumeError> {
        let pod_ns = check_namespace(
            non_empty(ctx, POD_NAMESPACE).ok_or(VolumeError::NoPodInfo(POD_NAMESPACE))?,
        )?;
        // The kubelet sets both with podInfoOnMount; without this one an inline volume could
        // not be told from a persistent one, whose context is trusted.
        let ephemeral = match ctx.get(EPHEMERAL).map(String::as_str) {
            Some("true") => true,
            Some("false") => false,
            _ => return Err(VolumeError::NoPodInfo(EPHEMERAL)),
        };
        let locale = Locale::parse(ctx.get(LOCALE).map(String::as_str).unwrap_or(""))?;
        let prefix = non_empty(ctx, PREFIX);
        if ephemeral {
            if ctx.contains_key(SHARE) {
                return Err(VolumeError::Denied(format!(
                    "an inline volume cannot set {SHARE}: only a StorageClass grants a volume \
                     to pods of other namespaces"
                )));
            }
            if let Some(ns) = non_empty(ctx, NAMESPACE).filter(|ns| *ns != pod_ns) {
                return Err(VolumeError::Denied(format!(
                    "an inline volume of a pod in namespace {pod_ns:?} names namespace {ns:?}: \
                     an inline volume mounts its pod's namespace only"
                )));
            }
            // How the pod's own mount reads is the pod author's to choose.
            return Ok(VolumeSpec {
                stale_reads: parse_stale_reads(ctx)?,
                ..Self::new(&pod_ns, prefix.ok_or(VolumeError::MissingPrefix)?, locale)?
            });
        }
        let mut spec = match prefix {
            // A context that names no namespace means the pod's, as a StorageClass that names
            // none does.
            Some(prefix) => {
                Self::new(non_empty(ctx, NAMESPACE).unwrap_or(&pod_ns), prefix, locale)?
            }
            None => VolumeSpec {
                locale,
                ..Self::from_id(id)?
            },
        };
        spec.share = parse_share(ctx.get(SHARE).map(String::as_str).unwrap_or(""))?;
        spec.stale_reads = parse_stale_reads(ctx)?;
        if !spec.mountable_from(&pod_ns) {
            return Err(VolumeError::Denied(format!(
                "volume {} is in namespace {:?}; a pod in namespace {pod_ns:?} may mount it \
                 only if its StorageClass's {SHARE} names {pod_ns:?} (or \"*\")",
                spec.id(),
                spec.namespace
            )));
        }
        Ok(spec)
    }

    /// Whether a pod of namespace `pod_ns` may mount this volume.
    pub fn mountable_from(&self, pod_ns: &str) -> bool {
        self.namespace == pod_ns || self.share.contains(pod_ns) || self.share.contains(SHARE_ALL)
    }

    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.prefix)
    }

    /// The volume context CreateVolume hands back, and NodePublishVolume reads.
    pub fn context(&self) -> HashMap<String, String> {
        self.fields()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    /// A stable, ordered form for comparing requests. `shareWithNamespaces` is there only when
    /// it names a namespace, and `staleReads` only when on, so the records of volumes made
    /// before them compare as they did.
    pub fn fields(&self) -> BTreeMap<&'static str, String> {
        let mut fields = BTreeMap::from([
            (NAMESPACE, self.namespace.clone()),
            (PREFIX, self.prefix.clone()),
            (LOCALE, self.locale.as_str().to_string()),
        ]);
        if !self.share.is_empty() {
            fields.insert(
                SHARE,
                self.share.iter().cloned().collect::<Vec<_>>().join(","),
            );
        }
        if self.stale_reads {
            fields.insert(STALE_READS, "true".to_string());
        }
        fields
    }
}

/// `staleReads` of a StorageClass or a volume context: `true`, `false`, or absent (off).
fn parse_stale_reads(map: &HashMap<String, String>) -> Result<bool, VolumeError> {
    match map.get(STALE_READS).map(|s| s.trim()) {
        None | Some("" | "false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(VolumeError::BadStaleReads(other.to_string())),
    }
}

/// `shareWithNamespaces`: namespaces separated by commas (blanks around them ignored), or `*`.
pub fn parse_share(raw: &str) -> Result<BTreeSet<String>, VolumeError> {
    let mut share = BTreeSet::new();
    for ns in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if ns == SHARE_ALL {
            share.insert(ns.to_string());
        } else {
            share.insert(check_namespace(ns).map_err(|_| VolumeError::BadShare(raw.to_string()))?);
        }
    }
    if share.contains(SHARE_ALL) {
        share.retain(|ns| ns == SHARE_ALL);
    }
    Ok(share)
}

/// The prefix of a volume whose StorageClass names none: its CSI name where that is a plain key
/// segment (as the PV names `pvc-UUID` of Kubernetes are), else `~` and the name's hash. The
/// spec allows a name any characters but a few control ones, `/`, `..` and spaces included, and
/// such a name taken as a key would be refused, or be a directory of another volume.
pub fn name_prefix(name: &str) -> String {
    let plain = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if plain {
        name.to_string()
    } else {
        format!("{HASHED_NAME}{}", name_hash(name))
    }
}

/// A fixed-length form of any volume name, safe in a key or a file name: its BLAKE3 hash in hex.
pub fn name_hash(name: &str) -> String {
    blake3::hash(name.as_bytes()).to_hex().to_string()
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

    /// What the kubelet adds to the volume context of a pod in namespace `ns`.
    fn pod(ns: &str, ephemeral: bool, attrs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut ctx = map(attrs);
        ctx.extend(map(&[
            (POD_NAMESPACE, ns),
            ("csi.storage.k8s.io/pod.name", "p"),
            (EPHEMERAL, if ephemeral { "true" } else { "false" }),
        ]));
        ctx
    }

    fn denied(r: Result<VolumeSpec, VolumeError>) -> String {
        match r {
            Err(VolumeError::Denied(why)) => why,
            other => panic!("not denied: {other:?}"),
        }
    }

    #[test]
    fn parameters_default_to_the_pv_name_in_the_pvcs_namespace() {
        let v = VolumeSpec::from_parameters("pvc-1", &map(&[(PVC_NAMESPACE, "team-a")])).unwrap();
        assert_eq!(v.id(), "team-a/pvc-1");
        assert_eq!(v.locale, Locale::Store);
        assert!(v.share.is_empty());
        assert!(!v.context().contains_key(SHARE));
        // The StorageClass's namespace is the administrator's: it wins over the PVC's.
        let v = VolumeSpec::from_parameters(
            "pvc-1",
            &map(&[
                ("namespace", "shared"),
                ("prefix", "/svc/data/"),
                ("locale", "local"),
                ("csi.storage.k8s.io/pvc/name", "x"),
                (PVC_NAMESPACE, "team-a"),
            ]),
        )
        .unwrap();
        assert_eq!(v.id(), "shared/svc/data");
        assert_eq!(v.locale, Locale::Local);
        // Neither: no namespace to put the keys in, rather than a guess.
        assert_eq!(
            VolumeSpec::from_parameters("pvc-1", &map(&[])),
            Err(VolumeError::NoNamespace)
        );
        assert!(VolumeSpec::check_parameters(&map(&[("locale", "local")])).is_ok());
    }

    #[test]
    fn share_is_parsed_and_carried_in_the_context() {
        let v = VolumeSpec::from_parameters(
            "pvc-1",
            &map(&[("namespace", "shared"), (SHARE, " team-b, team-a,,team-b ")]),
        )
        .unwrap();
        assert_eq!(v.context()[SHARE], "team-a,team-b");
        assert_eq!(v.fields()[SHARE], "team-a,team-b");
        let all = parse_share("team-a,*").unwrap();
        assert_eq!(all, BTreeSet::from(["*".to_string()]));
        for bad in ["Team", "a b", "team-a,-x"] {
            assert_eq!(
                parse_share(bad),
                Err(VolumeError::BadShare(bad.to_string()))
            );
        }
    }

    /// `staleReads` travels from the class to the context a publish reads, and an inline
    /// volume's attributes set it for their pod's mount.
    #[test]
    fn stale_reads_is_parsed_and_carried_in_the_context() {
        let on = VolumeSpec::from_parameters(
            "pvc-1",
            &map(&[("namespace", "team-a"), (STALE_READS, "true")]),
        )
        .unwrap();
        assert!(on.stale_reads);
        assert_eq!(on.context()[STALE_READS], "true");
        let off = VolumeSpec::from_parameters(
            "pvc-1",
            &map(&[("namespace", "team-a"), (STALE_READS, "false")]),
        )
        .unwrap();
        assert!(!off.stale_reads && !off.context().contains_key(STALE_READS));
        let fields = on.fields();
        let ctx: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let ctx = pod("team-a", false, &ctx);
        assert!(
            VolumeSpec::from_publish(&on.id(), &ctx)
                .unwrap()
                .stale_reads
        );
        let inline = pod(
            "team-a",
            true,
            &[(PREFIX, "scratch"), (STALE_READS, "true")],
        );
        assert!(
            VolumeSpec::from_publish("csi-x", &inline)
                .unwrap()
                .stale_reads
        );
        assert_eq!(
            VolumeSpec::from_parameters("p", &map(&[("namespace", "a"), (STALE_READS, "yes")])),
            Err(VolumeError::BadStaleReads("yes".into()))
        );
    }

    #[test]
    fn bad_parameters_are_refused() {
        for p in [
            map(&[("namespace", "Team")]),
            map(&[(PVC_NAMESPACE, "Team")]),
            map(&[("namespace", "ns"), ("prefix", "a/../b")]),
            map(&[("namespace", "ns"), ("locale", "nearby")]),
            map(&[("namespace", "ns"), ("colour", "red")]),
            map(&[("namespace", "ns"), (SHARE, "Team")]),
        ] {
            assert!(VolumeSpec::from_parameters("pvc", &p).is_err(), "{p:?}");
            if !p.contains_key(PVC_NAMESPACE) {
                assert!(VolumeSpec::check_parameters(&p).is_err(), "{p:?}");
            }
        }
    }

    #[test]
    fn any_name_the_spec_allows_makes_a_safe_prefix() {
        // The spec's longest name, of what it allows: slashes, dots, spaces, non-ASCII.
        let unusual = format!("../ a/b\t\u{e9}/{}xy", "\u{2603}/.".repeat(23));
        assert_eq!(unusual.len(), 128);
        let v = VolumeSpec::from_parameters(&unusual, &map(&[(NAMESPACE, "ns")])).unwrap();
        assert_eq!(v.prefix, format!("~{}", name_hash(&unusual)));
        assert_eq!(v.prefix.len(), 65);
        assert_eq!(VolumeSpec::from_id(&v.id()).unwrap().prefix, v.prefix);
        // Deterministic, and apart for names that differ.
        assert_eq!(name_prefix(&unusual), v.prefix);
        assert_ne!(name_prefix(&unusual[..127]), v.prefix);
        // A plain name of 128 bytes stays as it is; the names a "/" would have made a
        // directory of another volume, and the ones a key refuses, do not.
        let long = "p".repeat(128);
        assert_eq!(name_prefix(&long), long);
        assert_eq!(name_prefix("pvc-1.b_c"), "pvc-1.b_c");
        for odd in ["a/b", "..", ".", ".hidden", "a b", "~x", &"p".repeat(129)] {
            let p = name_prefix(odd);
            assert!(p.starts_with('~') && !p.contains('/'), "{odd:?} -> {p:?}");
            check_prefix(&p).unwrap();
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
    fn an_inline_volume_is_in_its_pods_namespace() {
        // Naming the pod's namespace, or none: the pod's.
        for attrs in [
            &[("namespace", "team-a"), ("prefix", "my-svc/weights")][..],
            &[("prefix", "my-svc/weights")][..],
            &[("namespace", ""), ("prefix", "my-svc/weights")][..],
        ] {
            let v = VolumeSpec::from_publish("csi-abc", &pod("team-a", true, attrs)).unwrap();
            assert_eq!(v.id(), "team-a/my-svc/weights", "{attrs:?}");
        }
        // Naming another: refused, whatever else it says.
        let why = denied(VolumeSpec::from_publish(
            "csi-abc",
            &pod(
                "team-a",
                true,
                &[("namespace", "team-b"), ("prefix", "keys")],
            ),
        ));
        assert!(
            why.contains("\"team-a\"") && why.contains("\"team-b\""),
            "{why}"
        );
        let why = denied(VolumeSpec::from_publish(
            "team-b/keys",
            &pod(
                "team-a",
                true,
                &[("namespace", "team-a"), ("prefix", "keys"), (SHARE, "*")],
            ),
        ));
        assert!(why.contains(SHARE), "{why}");
        assert_eq!(
            VolumeSpec::from_publish("csi-abc", &pod("team-a", true, &[])),
            Err(VolumeError::MissingPrefix)
        );
    }

    #[test]
    fn a_persistent_volume_of_another_namespace_needs_a_grant() {
        let class = |extra: &[(&str, &str)]| {
            let mut p = map(&[("namespace", "shared"), (PVC_NAMESPACE, "team-a")]);
            p.extend(map(extra));
            VolumeSpec::from_parameters("pvc-1", &p).unwrap()
        };
        let publish = |spec: &VolumeSpec, ns: &str| {
            let ctx = pod(ns, false, &[]);
            let mut ctx2 = spec.context();
            ctx2.extend(ctx);
            VolumeSpec::from_publish(&spec.id(), &ctx2)
        };
        // No grant: only pods of the volume's namespace.
        let plain = class(&[]);
        let why = denied(publish(&plain, "team-a"));
        assert!(why.contains("shared/pvc-1") && why.contains(SHARE), "{why}");
        assert_eq!(publish(&plain, "shared").unwrap().id(), "shared/pvc-1");
        // A grant names who.
        let granted = class(&[(SHARE, "team-a")]);
        assert_eq!(publish(&granted, "team-a").unwrap().id(), "shared/pvc-1");
        denied(publish(&granted, "team-b"));
        let all = class(&[(SHARE, "*")]);
        assert_eq!(publish(&all, "team-b").unwrap().id(), "shared/pvc-1");
        // A class that names no namespace: the PVC's, which its pods are in.
        let own = VolumeSpec::from_parameters("pvc-2", &map(&[(PVC_NAMESPACE, "team-a")])).unwrap();
        assert_eq!(publish(&own, "team-a").unwrap().id(), "team-a/pvc-2");
        denied(publish(&own, "team-b"));
        // A PV with no context (made by hand) is its id, under the same rule.
        let v = VolumeSpec::from_publish("team-a/p", &pod("team-a", false, &[("locale", "local")]))
            .unwrap();
        assert_eq!((v.id().as_str(), v.locale), ("team-a/p", Locale::Local));
        denied(VolumeSpec::from_publish(
            "team-b/p",
            &pod("team-a", false, &[]),
        ));
    }

    #[test]
    fn without_the_pods_namespace_nothing_is_mounted() {
        let attrs = map(&[
            (EPHEMERAL, "true"),
            ("namespace", "team-a"),
            ("prefix", "p"),
        ]);
        assert_eq!(
            VolumeSpec::from_publish("csi-abc", &attrs),
            Err(VolumeError::NoPodInfo(POD_NAMESPACE))
        );
        assert!(VolumeError::NoPodInfo(POD_NAMESPACE)
            .to_string()
            .contains("podInfoOnMount"));
        assert_eq!(
            VolumeSpec::from_publish("team-a/p", &map(&[])),
            Err(VolumeError::NoPodInfo(POD_NAMESPACE))
        );
        // Nor when the kubelet does not say whether it is inline.
        let mut ctx = pod("team-a", true, &[("prefix", "p")]);
        ctx.remove(EPHEMERAL);
        assert_eq!(
            VolumeSpec::from_publish("csi-abc", &ctx),
            Err(VolumeError::NoPodInfo(EPHEMERAL))
        );
    }
}

//! The `-o` options of `mount -t kt` and `/etc/fstab`: ktfs's own (`cache_dir=`, `namespace=`,
//! ...) become `kt mount` flags; the generic ones mount(8) and systemd pass along are ignored.

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("unknown mount option {0:?}")]
    Unknown(String),
    #[error("mount option {0:?} needs a value ({0}=...)")]
    MissingValue(String),
    #[error("mount option {0:?} takes no value")]
    UnexpectedValue(String),
    #[error("bad value for {option}: {value:?} ({why})")]
    BadValue {
        option: String,
        value: String,
        why: &'static str,
    },
    #[error("mount option {0:?} is not supported by ktfs")]
    Unsupported(String),
}

/// What the options ask of `kt mount`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KtOptions {
    pub cache_dir: Option<PathBuf>,
    pub cache_size: Option<String>,
    /// `store` or `local`.
    pub locale: Option<String>,
    pub namespace: Option<String>,
    pub node_id: Option<String>,
    pub listen: Option<String>,
    pub advertise: Option<String>,
    pub socket: Option<PathBuf>,
    pub zone: Option<String>,
    /// Where `kt mount` logs (default: `CACHE_DIR/kt-mount.log`).
    pub log: Option<PathBuf>,
    /// The `kt` binary to run.
    pub kt: Option<PathBuf>,
    /// Seconds to wait for the mount to come up.
    pub timeout_secs: Option<u64>,
    pub read_only: bool,
    /// Options that were accepted and have no effect (generic ones, or unknown ones with `-s`).
    pub ignored: Vec<String>,
}

/// Options that mount(8), fstab or systemd use for their own purposes, or that every FUSE
/// mount of kt has anyway (nosuid, nodev).
const GENERIC: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "exec",
    "noexec",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "async",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "diratime",
    "nodiratime",
    "lazytime",
    "nolazytime",
    "silent",
    "loud",
    "iversion",
    "noiversion",
    "mand",
    "nomand",
];

/// Options refused outright, whatever `-s` says: silently ignoring them would surprise.
const UNSUPPORTED: &[&str] = &["remount", "bind", "rbind", "move", "sync", "dirsync"];

fn is_generic(name: &str, value: Option<&str>) -> bool {
    (value.is_none() && GENERIC.contains(&name))
        || name.starts_with("x-")
        || name == "comment"
        || name == "context"
        || name == "fscontext"
        || name == "defcontext"
        || name == "rootcontext"
}

/// Parses one `-o` string (comma-separated, `name` or `name=value`) into `opts`; later options
/// override earlier ones. With `sloppy` (`mount -s`), unknown options are ignored.
pub fn parse_into(opts: &mut KtOptions, s: &str, sloppy: bool) -> Result<(), OptionError> {
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (raw_name, value) = match item.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (item, None),
        };
        let name = raw_name.replace('-', "_");
        let need = |v: Option<&str>| -> Result<String, OptionError> {
            match v {
                Some(v) if !v.is_empty() => Ok(v.to_string()),
                _ => Err(OptionError::MissingValue(raw_name.to_string())),
            }
        };
        match name.as_str() {
            "cache_dir" => opts.cache_dir = Some(PathBuf::from(need(value)?)),
            "cache_size" => {
                let v = need(value)?;
                check_size(&v)?;
                opts.cache_size = Some(v);
            }
            "locale" => {
                let v = need(value)?;
                if v != "store" && v != "local" {
                    return Err(OptionError::BadValue {
                        option: "locale".into(),
                        value: v,
                        why: "store or local",
                    });
                }
                opts.locale = Some(v);
            }
            "namespace" | "ns" => opts.namespace = Some(need(value)?),
            "node_id" => opts.node_id = Some(need(value)?),
            "listen" => opts.listen = Some(need(value)?),
            "advertise" => opts.advertise = Some(need(value)?),
            "socket" => opts.socket = Some(PathBuf::from(need(value)?)),
            "zone" => opts.zone = Some(need(value)?),
            "log" => opts.log = Some(PathBuf::from(need(value)?)),
            "kt" => opts.kt = Some(PathBuf::from(need(value)?)),
            "timeout" => {
                let v = need(value)?;
                let secs = v.parse::<u64>().ok().filter(|s| *s > 0).ok_or_else(|| {
                    OptionError::BadValue {
                        option: "timeout".into(),
                        value: v.clone(),
                        why: "a positive number of seconds",
                    }
                })?;
                opts.timeout_secs = Some(secs);
            }
            "ro" | "rw" => {
                if value.is_some() {
                    return Err(OptionError::UnexpectedValue(raw_name.to_string()));
                }
                opts.read_only = name == "ro";
            }
            n if UNSUPPORTED.contains(&n) => return Err(OptionError::Unsupported(item.into())),
            _ if is_generic(raw_name, value) => opts.ignored.push(item.to_string()),
            _ if sloppy => opts.ignored.push(item.to_string()),
            _ => return Err(OptionError::Unknown(item.to_string())),
        }
    }
    Ok(())
}

/// Parses one `-o` string on its own.
pub fn parse_options(s: &str, sloppy: bool) -> Result<KtOptions, OptionError> {
    let mut opts = KtOptions::default();
    parse_into(&mut opts, s, sloppy)?;
    Ok(opts)
}

/// A byte count as `kt mount --cache-size` takes it: digits with an optional K/M/G/T suffix
/// (and an optional trailing `i`/`B`).
fn check_size(v: &str) -> Result<(), OptionError> {
    let t = v.trim_end_matches(['i', 'B', 'b']);
    let digits = t.trim_end_matches(|c: char| "kKmMgGtT".contains(c));
    let suffix_len = t.len() - digits.len();
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && suffix_len <= 1 {
        Ok(())
    } else {
        Err(OptionError::BadValue {
            option: "cache_size".into(),
            value: v.to_string(),
            why: "a byte count such as 512M or 20G",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fstab_style_options() {
        let o = parse_options(
            "cache_dir=/var/cache/kt,cache_size=20G,locale=local,ro,_netdev",
            false,
        )
        .unwrap();
        assert_eq!(o.cache_dir, Some(PathBuf::from("/var/cache/kt")));
        assert_eq!(o.cache_size.as_deref(), Some("20G"));
        assert_eq!(o.locale.as_deref(), Some("local"));
        assert!(o.read_only);
        assert_eq!(o.ignored, vec!["_netdev"]);
    }

    #[test]
    fn every_kt_option_and_the_generic_ones() {
        let o = parse_options(
            "defaults,noauto,user,nofail,auto,exec,suid,dev,noatime,x-systemd.automount,\
             x-systemd.idle-timeout=60,comment=kt,namespace=team-a,node-id=n1,\
             listen=127.0.0.1:0,socket=/run/kt.sock,zone=z1,advertise=10.0.0.1:7448,\
             log=/tmp/kt.log,kt=/opt/kt,timeout=30,rw",
            false,
        )
        .unwrap();
        assert_eq!(o.namespace.as_deref(), Some("team-a"));
        assert_eq!(o.node_id.as_deref(), Some("n1"));
        assert_eq!(o.listen.as_deref(), Some("127.0.0.1:0"));
        assert_eq!(o.socket, Some(PathBuf::from("/run/kt.sock")));
        assert_eq!(o.zone.as_deref(), Some("z1"));
        assert_eq!(o.advertise.as_deref(), Some("10.0.0.1:7448"));
        assert_eq!(o.log, Some(PathBuf::from("/tmp/kt.log")));
        assert_eq!(o.kt, Some(PathBuf::from("/opt/kt")));
        assert_eq!(o.timeout_secs, Some(30));
        assert!(!o.read_only);
        assert_eq!(o.ignored.len(), 12);
    }

    #[test]
    fn later_options_win_and_ro_rw_toggle() {
        let mut o = KtOptions::default();
        parse_into(&mut o, "ro,namespace=a", false).unwrap();
        parse_into(&mut o, "rw,ns=b", false).unwrap();
        assert!(!o.read_only);
        assert_eq!(o.namespace.as_deref(), Some("b"));
    }

    #[test]
    fn errors() {
        assert_eq!(
            parse_options("colour=red", false),
            Err(OptionError::Unknown("colour=red".into()))
        );
        assert!(parse_options("colour=red", true).is_ok());
        assert_eq!(
            parse_options("cache_dir", false),
            Err(OptionError::MissingValue("cache_dir".into()))
        );
        assert_eq!(
            parse_options("cache_dir=", false),
            Err(OptionError::MissingValue("cache_dir".into()))
        );
        assert!(parse_options("locale=nearby", false).is_err());
        assert!(parse_options("cache_size=lots", false).is_err());
        assert!(parse_options("cache_size=12GG", false).is_err());
        assert!(parse_options("cache_size=512MiB", false).is_ok());
        assert!(parse_options("timeout=0", false).is_err());
        assert!(parse_options("ro=1", false).is_err());
        // Refused even when sloppy.
        assert!(parse_options("remount", true).is_err());
        assert!(parse_options("sync", true).is_err());
        // Empty items are harmless.
        assert_eq!(parse_options(",,", false), Ok(KtOptions::default()));
    }
}

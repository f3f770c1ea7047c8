//! The command line mount(8) gives a helper: `mount.kt SPEC DIR [-sfnv] [-o OPTIONS]
//! [-t TYPE]`, and the `kt mount` command line it becomes.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::options::{self, KtOptions, OptionError};

/// The default cache directory when no `cache_dir=` is given.
pub const DEFAULT_CACHE_DIR: &str = "/var/cache/kt";
/// The store server's port when SPEC names only a host.
pub const DEFAULT_PORT: u16 = 7447;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    #[error("{0}")]
    Option(#[from] OptionError),
    #[error("option {0} needs a value")]
    MissingValue(String),
    #[error("unknown flag {0}")]
    UnknownFlag(String),
    #[error("-N (mount in another namespace) is not supported")]
    Namespace,
    #[error("expected SERVER and MOUNTPOINT, got {0} positional arguments")]
    Positionals(usize),
    #[error("the type {0:?} is not kt")]
    Type(String),
}

/// One call of the helper.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Invocation {
    /// The store server, host:port.
    pub server: String,
    pub mountpoint: PathBuf,
    pub options: KtOptions,
    /// `-s`: ignore unknown options.
    pub sloppy: bool,
    /// `-f`: do everything but the mount.
    pub fake: bool,
    /// `-n`: do not write /etc/mtab (there is none to write; accepted).
    pub no_mtab: bool,
    /// `-v`: say what happens.
    pub verbose: bool,
    /// `-h`/`--help`.
    pub help: bool,
}

pub const USAGE: &str = "usage: mount.kt SERVER[:PORT] MOUNTPOINT [-sfnv] [-o OPTION[,OPTION...]]
  options: cache_dir=DIR cache_size=SIZE locale=store|local namespace=NS node_id=ID
           listen=ADDR advertise=ADDR socket=PATH zone=Z log=FILE kt=PATH timeout=SECS ro rw
  generic mount options (defaults, _netdev, noauto, nofail, user, x-*, ...) are ignored";

/// `host` gets the default port; `host:port` and `[v6]:port` stay as they are.
pub fn server_address(spec: &str) -> String {
    let has_port = match spec.rsplit_once(':') {
        Some((host, port)) => {
            !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!host.contains(':') || host.ends_with(']'))
        }
        None => false,
    };
    if has_port {
        spec.to_string()
    } else if spec.contains(':') && !spec.starts_with('[') {
        format!("[{spec}]:{DEFAULT_PORT}")
    } else {
        format!("{spec}:{DEFAULT_PORT}")
    }
}

/// Parses the helper's arguments (without the program name).
pub fn parse_args<I, S>(args: I) -> Result<Invocation, UsageError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut inv = Invocation::default();
    let mut positional = Vec::new();
    let mut option_strings = Vec::new();
    let mut it = args.into_iter().map(Into::into);
    let mut only_positional = false;
    while let Some(arg) = it.next() {
        if only_positional || !arg.starts_with('-') || arg == "-" {
            positional.push(arg);
            continue;
        }
        if arg == "--" {
            only_positional = true;
            continue;
        }
        if arg == "--help" {
            inv.help = true;
            continue;
        }
        // Short flags, possibly combined (-sv), the last one maybe taking a value (-oOPTS).
        let flags: Vec<char> = arg[1..].chars().collect();
        let mut i = 0;
        while i < flags.len() {
            match flags[i] {
                's' => inv.sloppy = true,
                'f' => inv.fake = true,
                'n' => inv.no_mtab = true,
                'v' => inv.verbose = true,
                'h' => inv.help = true,
                c @ ('o' | 't' | 'N') => {
                    let rest: String = flags[i + 1..].iter().collect();
                    let value = if rest.is_empty() {
                        it.next()
                            .ok_or_else(|| UsageError::MissingValue(format!("-{c}")))?
                    } else {
                        rest
                    };
                    match c {
                        'o' => option_strings.push(value),
                        't' => {
                            let t = value.strip_prefix("fuse.").unwrap_or(&value);
                            if t != "kt" {
                                return Err(UsageError::Type(value));
                            }
                        }
                        _ => return Err(UsageError::Namespace),
                    }
                    break;
                }
                c => return Err(UsageError::UnknownFlag(format!("-{c}"))),
            }
            i += 1;
        }
    }
    if inv.help {
        return Ok(inv);
    }
    // Options are parsed after the flags, so that -s applies wherever it stands.
    for s in &option_strings {
        options::parse_into(&mut inv.options, s, inv.sloppy)?;
    }
    let [spec, dir] = <[String; 2]>::try_from(positional)
        .map_err(|p: Vec<String>| UsageError::Positionals(p.len()))?;
    inv.server = server_address(&spec);
    inv.mountpoint = PathBuf::from(dir);
    Ok(inv)
}

impl Invocation {
    pub fn cache_dir(&self) -> PathBuf {
        self.options
            .cache_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE_DIR))
    }

    pub fn log_path(&self) -> PathBuf {
        self.options
            .log
            .clone()
            .unwrap_or_else(|| self.cache_dir().join("kt-mount.log"))
    }

    /// The arguments of `kt` (after the program name) that mount this invocation.
    pub fn kt_args(&self) -> Vec<OsString> {
        let o = &self.options;
        let mut a: Vec<OsString> = vec!["mount".into(), self.mountpoint.clone().into()];
        let mut flag = |name: &str, value: OsString| {
            a.push(name.into());
            a.push(value);
        };
        flag("--server", self.server.clone().into());
        flag("--cache-dir", self.cache_dir().into());
        let pairs: [(&str, Option<OsString>); 8] = [
            ("--cache-size", o.cache_size.clone().map(Into::into)),
            ("--locale", o.locale.clone().map(Into::into)),
            ("--namespace", o.namespace.clone().map(Into::into)),
            ("--node-id", o.node_id.clone().map(Into::into)),
            ("--listen", o.listen.clone().map(Into::into)),
            ("--advertise", o.advertise.clone().map(Into::into)),
            ("--socket", o.socket.clone().map(Into::into)),
            ("--zone", o.zone.clone().map(Into::into)),
        ];
        for (name, value) in pairs {
            if let Some(v) = value {
                flag(name, v);
            }
        }
        if o.read_only {
            a.push("--read-only".into());
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[OsString]) -> Vec<String> {
        v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn as_mount_calls_it() {
        let inv = parse_args([
            "10.0.0.5:7447",
            "/kt",
            "-o",
            "cache_dir=/var/cache/kt,cache_size=20G,locale=local,ro,_netdev",
        ])
        .unwrap();
        assert_eq!(inv.server, "10.0.0.5:7447");
        assert_eq!(inv.mountpoint, PathBuf::from("/kt"));
        assert_eq!(
            strs(&inv.kt_args()),
            [
                "mount",
                "/kt",
                "--server",
                "10.0.0.5:7447",
                "--cache-dir",
                "/var/cache/kt",
                "--cache-size",
                "20G",
                "--locale",
                "local",
                "--read-only"
            ]
        );
        assert_eq!(inv.log_path(), PathBuf::from("/var/cache/kt/kt-mount.log"));
    }

    #[test]
    fn flags_anywhere_combined_and_attached() {
        let inv = parse_args([
            "-sv",
            "store",
            "-onamespace=ns,colour=red",
            "/mnt/x",
            "-n",
            "-f",
            "-t",
            "kt",
        ])
        .unwrap();
        assert!(inv.sloppy && inv.verbose && inv.no_mtab && inv.fake);
        assert_eq!(inv.server, "store:7447");
        assert_eq!(inv.options.namespace.as_deref(), Some("ns"));
        assert_eq!(inv.options.ignored, vec!["colour=red"]);
        assert!(strs(&inv.kt_args()).contains(&"--namespace".to_string()));
    }

    #[test]
    fn usage_errors() {
        assert!(matches!(
            parse_args(["a:1", "/m", "-o", "colour=red"]),
            Err(UsageError::Option(_))
        ));
        assert_eq!(parse_args(["a:1"]), Err(UsageError::Positionals(1)));
        assert_eq!(
            parse_args(["a:1", "/m", "-o"]),
            Err(UsageError::MissingValue("-o".into()))
        );
        assert_eq!(
            parse_args(["a:1", "/m", "-x"]),
            Err(UsageError::UnknownFlag("-x".into()))
        );
        assert_eq!(
            parse_args(["a:1", "/m", "-t", "nfs"]),
            Err(UsageError::Type("nfs".into()))
        );
        assert_eq!(
            parse_args(["a:1", "/m", "-N", "/proc/1/ns/mnt"]),
            Err(UsageError::Namespace)
        );
        assert!(parse_args(["--help"]).unwrap().help);
        assert!(parse_args(["a:1", "/m", "-t", "fuse.kt"]).is_ok());
    }

    #[test]
    fn server_addresses() {
        assert_eq!(server_address("host"), "host:7447");
        assert_eq!(server_address("host:80"), "host:80");
        assert_eq!(server_address("[::1]:80"), "[::1]:80");
        assert_eq!(server_address("::1"), "[::1]:7447");
        assert_eq!(server_address("[::1]"), "[::1]:7447");
    }
}

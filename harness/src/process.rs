//! The process backend: every host is a process on its own loopback address, given its
//! identity through environment variables, since it cannot have a host name or `/etc` of its
//! own without root.
//!
//! The variables are the runtime's documented test-only parameters; another runtime plugs in
//! its own by replacing [`DEFAULT_IDENTITY_ENV`] in the cluster spec.

/// Environment given to every process started on a host. `{host}`, `{hosts_file}` and
/// `{conf}` are replaced by the host name, the cluster's hosts file and the host's
/// `prte.conf`.
pub const DEFAULT_IDENTITY_ENV: &[(&str, &str)] = &[
    ("PRTE_MCA_prte_bootstrap_conf", "{conf}"),
    ("PRTE_MCA_dvmlab_test_hostname", "{host}"),
    ("PRTE_MCA_dvmlab_test_hosts_file", "{hosts_file}"),
];

/// What the placeholders of a host's environment templates stand for.
pub struct Placeholders<'a> {
    pub host: &'a str,
    pub hosts_file: &'a str,
    pub conf: &'a str,
    pub key: &'a str,
}

/// Fills the placeholders (`{host}`, `{hosts_file}`, `{conf}`, `{key}`) of an environment
/// template.
pub fn expand(template: &str, p: &Placeholders) -> String {
    template
        .replace("{host}", p.host)
        .replace("{hosts_file}", p.hosts_file)
        .replace("{conf}", p.conf)
        .replace("{key}", p.key)
}

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

/// Fills the placeholders of an identity-environment template.
pub fn expand(template: &str, host: &str, hosts_file: &str, conf: &str) -> String {
    template
        .replace("{host}", host)
        .replace("{hosts_file}", hosts_file)
        .replace("{conf}", conf)
}

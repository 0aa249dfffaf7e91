//! The same cluster for other orchestrators: a Kubernetes StatefulSet behind a headless
//! Service with prte.conf in a ConfigMap, and a compose file. Both run the lab image and the
//! identical `prted --bootstrap` on every host.
//!
//! Kubernetes names StatefulSet pods `<set>-<ordinal>`, so there the nodes are `node-0` …
//! `node-<N-1>` (DVMNodes lists them in two fixed-width ranges) and the controller is
//! `ctl-0`; they find each other through the Service's DNS records (its domain is added to
//! the pods' search list), so prte.conf names no network there.
//!
//! The DVM key is never written into a manifest: `lab export` writes it as `dvm.key` (mode
//! 0600, kept when it exists) beside them; compose mounts that file, and for Kubernetes it is
//! made into a Secret by hand.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, PodDNSConfig, PodSpec,
    PodTemplateSpec, SecretVolumeSource, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde_json::json;

use crate::image::IMAGE;
use crate::plan::{Plan, CONTROLLER, DVM_PORT, KEY_PATH, PREFIX, SUBNET_V4, SUBNET_V6};

/// The DVM key's file, written beside the exported manifests (compose mounts it; for
/// Kubernetes it becomes the Secret [`KEY_SECRET`]).
pub const KEY_FILE: &str = "dvm.key";
/// The Secret the Kubernetes pods mount the key from.
pub const KEY_SECRET: &str = "dvmlab-lab-key";

/// The headless Service that gives every pod a DNS name.
const SERVICE: &str = "dvm";
const NODE_SET: &str = "node";

/// DVMNodes for `node-0` … `node-<n-1>`: one fixed-width range per number of digits.
fn k8s_nodes(n: usize) -> String {
    let mut parts = Vec::new();
    let mut lo = 0;
    let mut width = 1;
    while lo < n {
        let hi = (10usize.pow(width) - 1).min(n - 1);
        parts.push(format!("{NODE_SET}-[{width}:{lo}-{hi}]"));
        lo = hi + 1;
        width += 1;
    }
    parts.join(",")
}

/// prte.conf for the Kubernetes form of the plan.
pub fn k8s_conf(plan: &Plan) -> String {
    plan.conf_text(
        "lab export --k8s",
        &k8s_nodes(plan.nodes),
        &format!("{CONTROLLER}-0"),
        None,
        KEY_PATH,
    )
}

fn labels(role: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app".to_string(), PREFIX.to_string()),
        ("dvmlab/role".to_string(), role.to_string()),
    ])
}

fn stateful_set(name: &str, replicas: i32, namespace: &str) -> StatefulSet {
    let pod = PodSpec {
        subdomain: Some(SERVICE.into()),
        dns_config: Some(PodDNSConfig {
            searches: Some(vec![format!("{SERVICE}.{namespace}.svc.cluster.local")]),
            ..Default::default()
        }),
        containers: vec![Container {
            name: "prted".into(),
            image: Some(IMAGE.into()),
            image_pull_policy: Some("Never".into()),
            ports: Some(vec![ContainerPort {
                container_port: i32::from(DVM_PORT),
                name: Some("dvm".into()),
                ..Default::default()
            }]),
            volume_mounts: Some(vec![
                VolumeMount {
                    name: "prte-conf".into(),
                    mount_path: "/etc/prte.conf".into(),
                    sub_path: Some("prte.conf".into()),
                    read_only: Some(true),
                    ..Default::default()
                },
                VolumeMount {
                    name: "dvm-key".into(),
                    mount_path: KEY_PATH.into(),
                    sub_path: Some(KEY_FILE.into()),
                    read_only: Some(true),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }],
        volumes: Some(vec![
            Volume {
                name: "prte-conf".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: format!("{PREFIX}-conf"),
                    ..Default::default()
                }),
                ..Default::default()
            },
            // The key is never in a manifest: `kubectl create secret generic dvmlab-lab-key
            // --from-file=dvm.key` makes this Secret from the exported file.
            Volume {
                name: "dvm-key".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(KEY_SECRET.into()),
                    default_mode: Some(0o400),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]),
        termination_grace_period_seconds: Some(5),
        ..Default::default()
    };
    StatefulSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels(name)),
            ..Default::default()
        },
        spec: StatefulSetSpec {
            service_name: Some(SERVICE.into()),
            replicas: Some(replicas),
            // Every daemon boots at once, as the bootstrap method intends.
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(labels(name)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(name)),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The Kubernetes manifests: ConfigMap, headless Service, and the controller's and the
/// nodes' StatefulSets, as one multi-document YAML.
pub fn k8s(plan: &Plan, namespace: &str) -> Result<String, String> {
    let conf = ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("{PREFIX}-conf")),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("prte.conf".to_string(), k8s_conf(plan))])),
        ..Default::default()
    };
    let service = Service {
        metadata: ObjectMeta {
            name: Some(SERVICE.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // Daemons must find each other before any is "ready".
            publish_not_ready_addresses: Some(true),
            selector: Some(BTreeMap::from([("app".to_string(), PREFIX.to_string())])),
            ports: Some(vec![ServicePort {
                name: Some("dvm".into()),
                port: i32::from(DVM_PORT),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let replicas = i32::try_from(plan.nodes).map_err(|e| e.to_string())?;
    let docs = [
        yaml(&conf)?,
        yaml(&service)?,
        yaml(&stateful_set(CONTROLLER, 1, namespace))?,
        yaml(&stateful_set(NODE_SET, replicas, namespace))?,
    ];
    Ok(docs.join("---\n"))
}

fn yaml<T: serde::Serialize + k8s_openapi::Resource>(r: &T) -> Result<String, String> {
    // The typed structs omit apiVersion and kind; their serializers add them.
    serde_norway::to_string(r).map_err(|e| format!("{}: {e}", T::KIND))
}

/// The compose file: the lab exactly as `lab up` makes it (names, addresses, hosts
/// entries, init, the prte.conf next to the file).
pub fn compose(plan: &Plan) -> Result<String, String> {
    let mut services = serde_json::Map::new();
    for h in plan.hosts() {
        services.insert(
            h.name.clone(),
            json!({
                "image": IMAGE,
                "hostname": h.name,
                "init": true,
                "stop_grace_period": "5s",
                "environment": {"DVMLAB_LOG": "info"},
                "volumes": [
                    "./prte.conf:/etc/prte.conf:ro",
                    format!("./{KEY_FILE}:{KEY_PATH}:ro"),
                ],
                "extra_hosts": plan.extra_hosts(),
                "dns_opt": ["timeout:1", "attempts:1"],
                "networks": {
                    "dvm": {"ipv4_address": h.v4.to_string(), "ipv6_address": h.v6.to_string()}
                },
            }),
        );
    }
    let doc = json!({
        "services": services,
        "networks": {
            "dvm": {
                "name": PREFIX,
                "enable_ipv6": true,
                "ipam": {"config": [{"subnet": SUBNET_V4}, {"subnet": SUBNET_V6}]},
            }
        },
    });
    serde_norway::to_string(&doc).map_err(|e| format!("compose file: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::IpVersion;

    #[test]
    fn k8s_node_names_are_covered_by_dvmnodes_ranges() {
        assert_eq!(k8s_nodes(1), "node-[1:0-0]");
        assert_eq!(k8s_nodes(32), "node-[1:0-9],node-[2:10-31]");
        assert_eq!(k8s_nodes(100), "node-[1:0-9],node-[2:10-99]");
        assert_eq!(
            k8s_nodes(101),
            "node-[1:0-9],node-[2:10-99],node-[3:100-100]"
        );
    }

    /// The manifests parse back into the Kubernetes API types, with every field we rely on.
    #[test]
    fn k8s_manifests_are_valid_kubernetes_api_objects() {
        let plan = Plan::new(32, 2, IpVersion::V6).unwrap();
        let text = k8s(&plan, "lab").unwrap();
        let docs: Vec<&str> = text.split("---\n").collect();
        assert_eq!(docs.len(), 4);
        let cm: ConfigMap = serde_norway::from_str(docs[0]).unwrap();
        let conf = &cm.data.unwrap()["prte.conf"];
        assert!(
            conf.contains("DVMNodes = node-[1:0-9],node-[2:10-31]"),
            "{conf}"
        );
        assert!(conf.contains("DVMControllerHost = ctl-0"));
        assert!(conf.contains("DVMIPVersion = 6"));
        assert!(conf.contains("DVMKeyFile = /etc/dvm.key"), "{conf}");
        assert!(!text.contains("kind: Secret"), "no key in a manifest");
        let svc: Service = serde_norway::from_str(docs[1]).unwrap();
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "headless");
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        for (doc, name, replicas) in [(docs[2], "ctl", 1), (docs[3], "node", 32)] {
            assert!(doc.contains("apiVersion: apps/v1") && doc.contains("kind: StatefulSet"));
            let set: StatefulSet = serde_norway::from_str(doc).unwrap();
            assert_eq!(set.metadata.name.as_deref(), Some(name));
            let spec = set.spec;
            assert_eq!(spec.replicas, Some(replicas));
            assert_eq!(spec.service_name.as_deref(), Some(SERVICE));
            assert_eq!(
                spec.selector.match_labels,
                spec.template.metadata.unwrap().labels,
                "the selector selects the pods"
            );
            let pod = spec.template.spec.unwrap();
            assert_eq!(pod.containers[0].image.as_deref(), Some(IMAGE));
            let mounts = pod.containers[0].volume_mounts.as_ref().unwrap();
            assert_eq!(mounts[0].mount_path, "/etc/prte.conf");
            assert_eq!(mounts[0].read_only, Some(true));
            // The key, from its Secret, where prte.conf says, readable by the owner only.
            assert_eq!(mounts[1].mount_path, KEY_PATH);
            let key = &pod.volumes.as_ref().unwrap()[1];
            assert_eq!(key.name, mounts[1].name);
            let secret = key.secret.as_ref().unwrap();
            assert_eq!(secret.secret_name.as_deref(), Some(KEY_SECRET));
            assert_eq!(secret.default_mode, Some(0o400));
        }
    }

    /// prte.conf text resolved exactly as a daemon resolves it (no environment), by the
    /// runtime's own reader and resolver.
    fn resolve(text: &str) -> dvmlab_core::conf::settings::Settings {
        use dvmlab_core::conf::{reader::ConfFile, settings::Params, settings::Settings};
        let path = std::path::Path::new("/etc/prte.conf");
        let conf = ConfFile::parse(text, path).unwrap_or_else(|d| panic!("{d}"));
        let params = Params::new(Vec::new(), Vec::<(String, String)>::new());
        let no_files = |p: &std::path::Path| -> std::io::Result<String> {
            Err(std::io::Error::other(format!(
                "{} is not in the ConfigMap",
                p.display()
            )))
        };
        Settings::resolve(&conf, &params, &no_files).unwrap_or_else(|d| panic!("{d}"))
    }

    /// Beyond the types: the objects name each other consistently, the headless Service
    /// gives every pod the name DVMNodes lists, and the ConfigMap's prte.conf, byte for
    /// byte, is what the runtime accepts.
    #[test]
    fn k8s_names_selectors_dns_and_prte_conf_agree_with_each_other_and_the_runtime() {
        for (nodes, namespace, ip) in [(32, "lab", IpVersion::V4), (150, "hpc", IpVersion::V6)] {
            let plan = Plan::new(nodes, 4, ip).unwrap();
            let text = k8s(&plan, namespace).unwrap();
            let docs: Vec<&str> = text.split("---\n").collect();
            let cm: ConfigMap = serde_norway::from_str(docs[0]).unwrap();
            let svc: Service = serde_norway::from_str(docs[1]).unwrap();
            let sets: Vec<StatefulSet> = docs[2..]
                .iter()
                .map(|d| serde_norway::from_str(d).unwrap())
                .collect();
            let settings = resolve(&cm.data.as_ref().unwrap()["prte.conf"]);

            let svc_name = svc.metadata.name.clone().unwrap();
            let spec = svc.spec.unwrap();
            assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "headless");
            let selector = spec.selector.unwrap();
            assert_eq!(
                spec.ports.unwrap()[0].port,
                i32::from(settings.port),
                "the Service's port is DVMPort"
            );
            let mut pods = Vec::new();
            for set in &sets {
                let s = &set.spec;
                let name = set.metadata.name.clone().unwrap();
                let template = s
                    .template
                    .metadata
                    .as_ref()
                    .unwrap()
                    .labels
                    .clone()
                    .unwrap();
                assert_eq!(s.selector.match_labels.as_ref(), Some(&template), "{name}");
                assert!(
                    selector.iter().all(|(k, v)| template.get(k) == Some(v)),
                    "the Service selects {name}'s pods"
                );
                assert_eq!(s.service_name.as_deref(), Some(svc_name.as_str()));
                let pod = s.template.spec.as_ref().unwrap();
                // A StatefulSet pod's host name is its own name; with the Service as its
                // subdomain it is <pod>.<service>.<namespace>.svc.cluster.local, and the
                // search list makes the bare name DVMNodes uses resolve to that.
                assert_eq!(pod.subdomain.as_deref(), Some(svc_name.as_str()));
                assert!(pod.hostname.is_none(), "{name}: pods keep their own names");
                let search = format!("{svc_name}.{namespace}.svc.cluster.local");
                let dns = pod.dns_config.as_ref().unwrap();
                assert!(dns.searches.as_ref().unwrap().contains(&search), "{name}");
                let volumes = pod.volumes.as_ref().unwrap();
                let conf_volume = volumes.iter().find(|v| v.name == "prte-conf").unwrap();
                assert_eq!(
                    conf_volume.config_map.as_ref().unwrap().name,
                    cm.metadata.name.clone().unwrap(),
                    "{name} mounts the ConfigMap"
                );
                let c = &pod.containers[0];
                assert_eq!(
                    c.ports.as_ref().unwrap()[0].container_port,
                    i32::from(settings.port)
                );
                let key = c
                    .volume_mounts
                    .as_ref()
                    .unwrap()
                    .iter()
                    .find(|m| m.name == "dvm-key")
                    .unwrap();
                assert_eq!(
                    Some(std::path::Path::new(&key.mount_path)),
                    settings.key_file.as_ref().map(|(p, _)| p.as_path()),
                    "the key is mounted where prte.conf says"
                );
                for ordinal in 0..s.replicas.unwrap() {
                    pods.push((name.clone(), format!("{name}-{ordinal}")));
                }
            }
            let listed: Vec<String> = settings.nodes.iter().map(|n| n.name.clone()).collect();
            let node_pods: Vec<String> = pods
                .iter()
                .filter(|(set, _)| set == NODE_SET)
                .map(|(_, p)| p.clone())
                .collect();
            assert_eq!(listed, node_pods, "DVMNodes lists every node pod, in order");
            let controllers: Vec<&String> = pods
                .iter()
                .filter(|(set, _)| set == CONTROLLER)
                .map(|(_, p)| p)
                .collect();
            assert_eq!(controllers, [&settings.controller_host]);
            assert_eq!(settings.radix, 4);
            assert_eq!(
                settings.family,
                match ip {
                    IpVersion::V4 => dvmlab_core::conf::settings::Family::V4,
                    IpVersion::V6 => dvmlab_core::conf::settings::Family::V6,
                }
            );
        }
    }
}

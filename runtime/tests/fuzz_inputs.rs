//! Every checked-in fuzz input (the corpora and the regressions: inputs that once crashed a
//! target) through the fuzz targets' own bodies, on stable Rust in the ordinary suite, so a
//! crash once found stays fixed without a nightly toolchain.

#[path = "../fuzz/targets.rs"]
mod targets;

use std::path::Path;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 4] = [
    ("frame_decoder", targets::frame_decoder),
    ("handshake", targets::handshake),
    ("conf", targets::conf),
    ("idset", targets::idset),
];

#[test]
fn every_corpus_and_regression_input_passes_its_fuzz_target() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for (name, target) in TARGETS {
        let mut seen = 0;
        for kind in ["corpus", "regressions"] {
            let Ok(dir) = std::fs::read_dir(fuzz.join(kind).join(name)) else {
                continue;
            };
            for entry in dir {
                let path = entry.unwrap().path();
                let data = std::fs::read(&path).unwrap();
                if std::panic::catch_unwind(|| target(&data)).is_err() {
                    panic!("fuzz target {name} fails on {}", path.display());
                }
                seen += 1;
            }
        }
        assert!(seen > 0, "no checked-in input for fuzz target {name}");
    }
}

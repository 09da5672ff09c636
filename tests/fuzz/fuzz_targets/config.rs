//! Fuzz target `config`: the config loader, `Config::parse`, on arbitrary
//! text. Never panics: every input is a config or a `ConfigError` whose
//! message can be printed. Relative `file:` secrets resolve under a folder
//! that does not exist; inputs naming an absolute `file:/` path are skipped
//! (reading `/dev/zero` or a FIFO is the operator's own choice, not input).

#![no_main]

use std::path::{Path, PathBuf};

use idemhook::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if text.contains("file:/") || text.contains("file:\\") {
        return;
    }
    let base = Path::new("/nonexistent-idemhook-fuzz");
    let file = Some(PathBuf::from("/nonexistent-idemhook-fuzz/idemhook.toml"));
    match Config::parse(text, "fuzz.toml", base, file) {
        Ok(config) => {
            let _ = format!("{config:?}");
            for source in &config.sources {
                let _ = source.needs_json();
                let _ = source.hash_rule();
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});

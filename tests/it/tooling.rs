//! The tools operators already use: shell completions and man pages from
//! the real binary (bash parses the script, groff renders the pages), the
//! alert rules checked and unit-tested by promtool, and the names in the
//! alert rules and the Grafana dashboard checked against what a running
//! server's `/metrics` really exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use prometheus_parse::{Scrape, Value};

use crate::downstream::Downstream;
use crate::harness::{CLI_TIMEOUT, CliOutput, Server, ServerConfig, run_binary, toml_str};

/// The commands a user types, as `idemhook help` lists them.
const COMMANDS: [&str; 21] = [
    "serve",
    "check",
    "send",
    "events",
    "replay",
    "resolve",
    "pause",
    "resume",
    "prune",
    "reconcile",
    "erase",
    "backup",
    "migrate",
    "rejected",
    "reingest",
    "catchup",
    "probe",
    "completions",
    "man",
    "notify",
    "help",
];

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("idemhook-tooling-")
        .tempdir()
        .expect("create temp dir")
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the binary in `cwd` with a scrubbed environment.
fn idemhook(cwd: &Path, args: &[&str]) -> CliOutput {
    let args: Vec<String> = args.iter().map(ToString::to_string).collect();
    run_binary(cwd, &BTreeMap::new(), &args, CLI_TIMEOUT)
}

/// Whether `program` runs here (`program --version` exits 0).
fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Says loudly that a check did not run because `program` is missing; under
/// `CI=true` (where `.ci/run` installs it) that is a failure instead, as
/// for the PostgreSQL tests.
fn skipped_without(program: &str, test: &str, install: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: {program} is not installed under CI=true ({install})"
    );
    eprintln!("\n*** SKIPPED {test}: {program} is not installed ({install}) ***\n");
}

/// The folder's entries, to show that a command created nothing.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the temp dir")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

// ---------------------------------------------------------------------------
// Completions
// ---------------------------------------------------------------------------

#[test]
fn bash_completions_parse_and_complete_every_command() {
    let dir = tempdir();
    let out = idemhook(dir.path(), &["completions", "bash"]);
    out.assert_success();
    let script = dir.path().join("idemhook.bash");
    std::fs::write(&script, &out.stdout).expect("write the script");
    let parsed = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .expect("run bash -n");
    assert!(
        parsed.status.success() && parsed.stderr.is_empty(),
        "bash -n on `idemhook completions bash`\n  expected: exit 0, no output\n  got: {}\n{}",
        parsed.status,
        String::from_utf8_lossy(&parsed.stderr)
    );
    // Loaded into a shell, it completes `idemhook <TAB>` to every command
    // and `idemhook completions <TAB>` to the shells.
    let complete = |words: &str| -> BTreeSet<String> {
        let program = format!(
            "source {}\nCOMP_WORDS=({words}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n\
             COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}\n\
             _idemhook idemhook \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        );
        let out = Command::new("bash")
            .args(["--norc", "--noprofile", "-c", &program])
            .output()
            .expect("run bash");
        assert!(
            out.status.success(),
            "completing {words:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let offered = complete("idemhook ''");
    for command in COMMANDS {
        assert!(
            offered.contains(command),
            "`idemhook <TAB>` does not offer {command}: {offered:?}"
        );
    }
    let shells = complete("idemhook completions ''");
    for shell in ["bash", "zsh", "fish"] {
        assert!(
            shells.contains(shell),
            "`idemhook completions <TAB>` does not offer {shell}: {shells:?}"
        );
    }
}

#[test]
fn zsh_and_fish_completions_name_every_command() {
    let dir = tempdir();
    for (shell, head) in [
        ("zsh", "#compdef idemhook"),
        ("fish", "complete -c idemhook"),
    ] {
        let out = idemhook(dir.path(), &["completions", shell]);
        out.assert_success();
        assert!(
            out.stdout.contains(head),
            "`idemhook completions {shell}` does not contain {head:?}:\n{}",
            &out.stdout[..out.stdout.len().min(200)]
        );
        for command in COMMANDS {
            assert!(
                out.stdout.contains(command),
                "`idemhook completions {shell}` never names {command}"
            );
        }
        if installed(shell) {
            let script = dir.path().join(format!("idemhook.{shell}"));
            std::fs::write(&script, &out.stdout).expect("write the script");
            let flag = if shell == "zsh" { "-n" } else { "--no-execute" };
            let parsed = Command::new(shell)
                .arg(flag)
                .arg(&script)
                .output()
                .expect("run the shell");
            assert!(
                parsed.status.success(),
                "{shell} {flag} on the script: {}",
                String::from_utf8_lossy(&parsed.stderr)
            );
        }
    }
}

#[test]
fn an_unknown_shell_is_one_line_and_exit_2() {
    let dir = tempdir();
    for shell in ["tcsh", "", "BASH"] {
        let out = idemhook(dir.path(), &["completions", shell]);
        assert_eq!(out.status.code(), Some(2), "completions {shell:?}: {out:?}");
        assert!(out.stdout.is_empty(), "completions {shell:?}: {out:?}");
        assert_eq!(
            out.stderr,
            format!(
                "idemhook: unknown shell {shell:?}: completions are made for bash, zsh, fish\n"
            ),
            "completions {shell:?}"
        );
    }
    let missing = idemhook(dir.path(), &["completions"]);
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
}

// ---------------------------------------------------------------------------
// Man pages
// ---------------------------------------------------------------------------

/// The page rendered as text by groff (warnings on), which must say nothing
/// on stderr.
fn render(page: &Path) -> String {
    let out = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-P-c"])
        .arg(page)
        .output()
        .expect("run groff");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "groff -man -ww {}\n  expected: exit 0, no warnings\n  got: {}\n{}",
        page.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // Bold and underlined text come back plain without -c overstriking;
    // drop any backspace pairs anyway.
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut plain = String::new();
    for c in text.chars() {
        if c == '\u{8}' {
            plain.pop();
        } else {
            plain.push(c);
        }
    }
    plain
}

#[test]
fn the_man_page_renders_and_names_every_command() {
    let dir = tempdir();
    let out = idemhook(dir.path(), &["man"]);
    out.assert_success();
    let th = out
        .stdout
        .lines()
        .find(|l| l.starts_with(".TH "))
        .unwrap_or_else(|| panic!("no .TH header in `idemhook man`:\n{}", out.stdout));
    assert!(
        th.starts_with(".TH idemhook 1 ") && th.contains(env!("CARGO_PKG_VERSION")),
        "{th}"
    );
    for command in COMMANDS.iter().filter(|c| **c != "help") {
        assert!(
            out.stdout.contains(&format!("idemhook\\-{command}(1)")),
            "`idemhook man` does not name idemhook-{command}(1)"
        );
    }
    let page = dir.path().join("idemhook.1");
    std::fs::write(&page, &out.stdout).expect("write the page");
    if !installed("groff") {
        skipped_without(
            "groff",
            "the_man_page_renders_and_names_every_command (rendering)",
            "apt-get install -y groff-base",
        );
        return;
    }
    let text = render(&page);
    for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "SUBCOMMANDS"] {
        assert!(
            text.lines().any(|l| l == section),
            "the rendered page has no {section} section:\n{text}"
        );
    }
    for command in COMMANDS.iter().filter(|c| **c != "help") {
        assert!(
            text.contains(&format!("idemhook-{command}(1)")),
            "the rendered page does not name idemhook-{command}(1):\n{text}"
        );
    }
    // man itself reads it too (a local file, no pager).
    if installed("man") {
        let shown = Command::new("man")
            .arg("-l")
            .arg(&page)
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "80")
            .output()
            .expect("run man -l");
        let shown_text = String::from_utf8_lossy(&shown.stdout);
        assert!(
            shown.status.success() && shown_text.contains("idemhook-serve(1)"),
            "man -l idemhook.1: {}\n{shown_text}{}",
            shown.status,
            String::from_utf8_lossy(&shown.stderr)
        );
    }
}

#[test]
fn man_dir_writes_a_page_per_command_into_an_existing_folder_only() {
    let dir = tempdir();
    let pages = dir.path().join("man1");
    std::fs::create_dir(&pages).expect("mkdir man1");
    let out = idemhook(dir.path(), &["man", "--dir", "man1"]);
    out.assert_success();
    let listed: BTreeSet<PathBuf> = out.stdout.lines().map(PathBuf::from).collect();
    let mut expected: BTreeSet<PathBuf> = [
        "idemhook",
        "idemhook-events-list",
        "idemhook-events-show",
        "idemhook-rejected-list",
        "idemhook-rejected-show",
        "idemhook-notify-test",
        "idemhook-notify-list",
    ]
    .iter()
    .map(|name| Path::new("man1").join(format!("{name}.1")))
    .collect();
    for command in COMMANDS.iter().filter(|c| **c != "help") {
        expected.insert(Path::new("man1").join(format!("idemhook-{command}.1")));
    }
    assert_eq!(listed, expected, "the pages `man --dir` printed");
    let written: BTreeSet<PathBuf> = entries(&pages)
        .iter()
        .map(|name| Path::new("man1").join(name))
        .collect();
    assert_eq!(written, expected, "the pages in the folder");
    if installed("groff") {
        let serve = render(&pages.join("idemhook-serve.1"));
        assert!(
            serve.contains("--listen") && serve.contains("--database"),
            "idemhook-serve(1) lacks serve's flags:\n{serve}"
        );
        for page in &expected {
            render(&dir.path().join(page));
        }
    }

    // A folder that does not exist: one line, exit 2, nothing created.
    let before = entries(dir.path());
    let out = idemhook(dir.path(), &["man", "--dir", "no/such/folder"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(
        out.stderr,
        "idemhook: man --dir no/such/folder: no such folder (it is not created)\n"
    );
    assert_eq!(entries(dir.path()), before, "man --dir created something");
    let out = idemhook(dir.path(), &["man", "--dir", "man1/idemhook.1"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        out.stderr,
        "idemhook: man --dir man1/idemhook.1: not a folder\n"
    );
}

// ---------------------------------------------------------------------------
// Alert rules and the dashboard
// ---------------------------------------------------------------------------

fn promtool(args: &[&str]) -> Option<(bool, String)> {
    if !installed("promtool") {
        return None;
    }
    let out = Command::new("promtool")
        .args(args)
        .current_dir(root().join("examples/prometheus"))
        .output()
        .expect("run promtool");
    Some((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

const PROMTOOL_INSTALL: &str = "apt-get install -y prometheus";

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let Some((ok, text)) = promtool(&["check", "rules", "alerts.yml"]) else {
        skipped_without(
            "promtool",
            "the_alert_rules_pass_promtool_check_and_their_unit_tests",
            PROMTOOL_INSTALL,
        );
        return;
    };
    assert!(
        ok,
        "promtool check rules examples/prometheus/alerts.yml\n{text}"
    );
    let Some((ok, text)) = promtool(&["test", "rules", "alerts_test.yml"]) else {
        unreachable!("promtool was found a moment ago");
    };
    assert!(
        ok,
        "promtool test rules examples/prometheus/alerts_test.yml\n{text}"
    );
    // Every alert has a unit test.
    let rules = std::fs::read_to_string(root().join("examples/prometheus/alerts.yml"))
        .expect("read alerts.yml");
    let tests = std::fs::read_to_string(root().join("examples/prometheus/alerts_test.yml"))
        .expect("read alerts_test.yml");
    for line in rules.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            assert!(
                tests.contains(&format!("alertname: {name}\n")),
                "alert {name} has no test in alerts_test.yml"
            );
        }
    }
}

#[test]
fn the_dashboards_expressions_are_valid_promql() {
    // promtool checks expressions only inside rule files: each of the
    // dashboard's becomes a recording rule, Grafana's variables replaced
    // by values they take.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in dashboard_expressions().iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$source", ".*");
        rules.push_str(&format!(
            "      - record: dashboard:expr{i}\n        expr: {}\n",
            serde_json::to_string(&expr).expect("a JSON string is a YAML string")
        ));
    }
    let dir = tempdir();
    let file = dir.path().join("dashboard-rules.yml");
    std::fs::write(&file, rules).expect("write the rules");
    let path = file.to_string_lossy().into_owned();
    let Some((ok, text)) = promtool(&["check", "rules", &path]) else {
        skipped_without(
            "promtool",
            "the_dashboards_expressions_are_valid_promql",
            PROMTOOL_INSTALL,
        );
        return;
    };
    assert!(
        ok,
        "promtool check rules on the dashboard's expressions\n{text}"
    );
}

/// Every PromQL text of the dashboard: its panels' targets and its
/// template variables' queries.
fn dashboard_expressions() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("examples/grafana/idemhook.json"))
        .expect("read examples/grafana/idemhook.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("idemhook.json is JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(
                target["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("a target without expr: {target}"))
                    .to_string(),
            );
        }
    }
    assert!(
        exprs.len() >= 10,
        "the dashboard has {} expressions",
        exprs.len()
    );
    exprs
}

/// The template variables' queries (`label_values(metric, label)`).
fn dashboard_variable_queries() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("examples/grafana/idemhook.json"))
        .expect("read examples/grafana/idemhook.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("idemhook.json is JSON");
    dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter_map(|v| v["definition"].as_str().map(str::to_string))
        .collect()
}

/// A metric a text names, with the label values its selector requires
/// (`name{l="v"}`: v; `name{l=~"a|b"}`: a and b when they are plain words).
#[derive(Debug)]
struct Selector {
    metric: String,
    labels: Vec<(String, String)>,
}

/// Every `idemhook_...` name in a PromQL (or promtool series) text, with
/// its selector's equality and plain-alternative matchers.
fn selectors(text: &str) -> Vec<Selector> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("idemhook_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail.find(|c: char| !is_name(c)).unwrap_or(tail.len());
        let metric = tail[..end].to_string();
        rest = &tail[end..];
        if before.is_some_and(is_name) {
            continue;
        }
        let mut labels = Vec::new();
        if let Some(body) = rest.strip_prefix('{') {
            let close = body.find('}').unwrap_or(body.len());
            for matcher in body[..close].split(',') {
                let matcher = matcher.trim();
                let (name, op, value) = if let Some((n, v)) = matcher.split_once("=~") {
                    (n, "=~", v)
                } else if let Some((n, v)) = matcher.split_once("!=") {
                    (n, "!=", v)
                } else if let Some((n, v)) = matcher.split_once('=') {
                    (n, "=", v)
                } else {
                    continue;
                };
                let value = value.trim().trim_matches('"');
                if op == "!=" || value.contains('$') {
                    continue;
                }
                let plain = |v: &str| v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if op == "=" || value.split('|').all(plain) {
                    for v in value
                        .split('|')
                        .filter(|_| op == "=~")
                        .chain((op == "=").then_some(value))
                    {
                        labels.push((name.trim().to_string(), v.to_string()));
                    }
                }
            }
        }
        found.push(Selector { metric, labels });
    }
    found
}

/// The series names a scrape holds, a histogram's as its `_bucket`, `_sum`
/// and `_count` series, each with the label values seen on it.
fn exported(scrape: &Scrape) -> BTreeMap<String, BTreeSet<(String, String)>> {
    let mut names: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for sample in &scrape.samples {
        let labels: BTreeSet<(String, String)> = sample
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let series: Vec<String> = match &sample.value {
            Value::Histogram(buckets) => {
                let mut with_le = labels.clone();
                for b in buckets {
                    let le = if b.less_than.is_infinite() {
                        "+Inf".to_string()
                    } else {
                        b.less_than.to_string()
                    };
                    with_le.insert(("le".to_string(), le));
                }
                names
                    .entry(format!("{}_bucket", sample.metric))
                    .or_default()
                    .extend(with_le);
                vec![
                    format!("{}_sum", sample.metric),
                    format!("{}_count", sample.metric),
                ]
            }
            Value::Summary(_) => vec![
                sample.metric.clone(),
                format!("{}_sum", sample.metric),
                format!("{}_count", sample.metric),
            ],
            _ => vec![sample.metric.clone()],
        };
        for name in series {
            names
                .entry(name)
                .or_default()
                .extend(labels.iter().cloned());
        }
    }
    names
}

/// A real server whose every metric family has series: a forward action
/// with a check (the checks' counter exists only then), on SQLite (where
/// the file sizes are exported).
fn scrape_a_running_server() -> Scrape {
    let downstream = Downstream::start();
    let config = ServerConfig::new().tables(&format!(
        "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"whsec_tooling_test\"]\n\n\
         [[sources.stripe.actions]]\nname = \"notify-app\"\nforward = {}\ncheck = {}\n",
        toml_str(&downstream.url()),
        toml_str(&format!("{}/effects/{{idempotency_key}}", downstream.url())),
    ));
    let server = Server::start(&config, &[]);
    let resp = server.get("/metrics");
    assert_eq!(resp.status, 200, "GET /metrics: {}", resp.text());
    let text = resp.text();
    Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("/metrics does not parse: {e}\n{text}"))
}

#[test]
fn the_dashboard_and_the_alert_rules_name_only_exported_metrics() {
    let names = exported(&scrape_a_running_server());
    let read = |path: &str| {
        std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
    };
    let mut texts: Vec<(String, String)> = dashboard_expressions()
        .into_iter()
        .chain(dashboard_variable_queries())
        .map(|e| ("examples/grafana/idemhook.json".to_string(), e))
        .collect();
    for path in [
        "examples/prometheus/alerts.yml",
        "examples/prometheus/alerts_test.yml",
    ] {
        texts.push((path.to_string(), read(path)));
    }
    let mut problems = Vec::new();
    let mut named = BTreeSet::new();
    for (file, text) in &texts {
        for selector in selectors(text) {
            let Some(seen) = names.get(&selector.metric) else {
                problems.push(format!(
                    "{file} names {}, which /metrics does not export",
                    selector.metric
                ));
                continue;
            };
            named.insert(selector.metric.clone());
            for (label, value) in &selector.labels {
                // Series made up for a test carry labels of the test's
                // own config; only fixed vocabularies must match.
                let variable = ["source", "action", "instance"].contains(&label.as_str());
                if !variable && !seen.contains(&(label.clone(), value.clone())) {
                    problems.push(format!(
                        "{file} selects {}{{{label}=\"{value}\"}}, which /metrics never exports",
                        selector.metric
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "names in the examples\n  expected: only what /metrics exports ({:?})\n  got:\n    {}",
        names.keys().collect::<Vec<_>>(),
        problems.join("\n    ")
    );
    // The dashboard shows every metric family /metrics exports.
    let dashboard: String = dashboard_expressions().join("\n");
    let shown: BTreeSet<String> = selectors(&dashboard)
        .into_iter()
        .map(|s| s.metric)
        .collect();
    let families: BTreeSet<String> = names
        .keys()
        .map(|n| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    n.strip_suffix(s)
                        .filter(|base| names.contains_key(&format!("{base}_bucket")))
                })
                .unwrap_or(n)
                .to_string()
        })
        .collect();
    let shown_families: BTreeSet<String> = shown
        .iter()
        .map(|n| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s).filter(|base| families.contains(*base)))
                .unwrap_or(n)
                .to_string()
        })
        .collect();
    let missing: Vec<_> = families.difference(&shown_families).collect();
    assert!(
        missing.is_empty(),
        "the dashboard shows no panel of {missing:?}"
    );
    assert!(named.len() >= 10, "only {named:?} were checked");
}

#[test]
fn the_selector_reader_finds_names_and_label_values() {
    let found = selectors(
        r#"sum(rate(idemhook_deliveries_total{source=~"$source",outcome=~"mismatch|bad_signature"}[5m])) / idemhook_jobs{status="failed"} + my_idemhook_x"#,
    );
    let shown: Vec<(String, Vec<(String, String)>)> =
        found.into_iter().map(|s| (s.metric, s.labels)).collect();
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert_eq!(
        shown,
        vec![
            (
                "idemhook_deliveries_total".to_string(),
                vec![
                    pair("outcome", "mismatch"),
                    pair("outcome", "bad_signature")
                ]
            ),
            ("idemhook_jobs".to_string(), vec![pair("status", "failed")]),
        ]
    );
}

//! The tools operators already use: shell completions and man pages from
//! the real binary (bash parses the script, groff renders the pages).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::harness::{CLI_TIMEOUT, CliOutput, run_binary};

/// The commands a user types, as `idemhook help` lists them.
const COMMANDS: [&str; 16] = [
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
    "completions",
    "man",
    "help",
];

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("idemhook-tooling-")
        .tempdir()
        .expect("create temp dir")
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
    let mut expected: BTreeSet<PathBuf> =
        ["idemhook", "idemhook-events-list", "idemhook-events-show"]
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
}

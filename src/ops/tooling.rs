//! What operators' own tools read, made from the clap definitions in
//! `cli`: shell completions (`idemhook completions bash|zsh|fish`,
//! clap_complete) and the man pages (`idemhook man`, clap_mangen). Neither
//! loads a config or opens a database.

use std::ffi::OsStr;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::builder::{PossibleValue, TypedValueParser};

use crate::ops::{CommandError, Outcome};

/// The shells `idemhook completions` writes for.
pub const SHELLS: [&str; 3] = ["bash", "zsh", "fish"];

/// The value parser of `completions SHELL`: it offers the shells to help
/// and to the completions themselves, but takes any word, so that an
/// unknown shell is refused by [`completions`] in one line (clap's own
/// refusal is several).
#[derive(Clone, Debug)]
pub struct ShellName;

impl TypedValueParser for ShellName {
    type Value = String;

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<String, clap::Error> {
        Ok(value.to_string_lossy().into_owned())
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(SHELLS.iter().map(PossibleValue::new)))
    }
}

/// `idemhook completions SHELL`: the completion script for the command
/// tree `cli` on stdout.
pub fn completions(shell: &str, mut cli: clap::Command) -> Result<Outcome, CommandError> {
    let generator = match shell {
        "bash" => clap_complete::Shell::Bash,
        "zsh" => clap_complete::Shell::Zsh,
        "fish" => clap_complete::Shell::Fish,
        other => {
            return Err(CommandError::Usage(format!(
                "unknown shell {other:?}: completions are made for {}",
                SHELLS.join(", ")
            )));
        }
    };
    let mut script = Vec::new();
    clap_complete::generate(generator, &mut cli, "idemhook", &mut script);
    print_out(&script)
}

/// `idemhook man`: the page idemhook(1) on stdout; with `--dir DIR`, that
/// page and one per command (idemhook-serve(1), idemhook-events-list(1),
/// ...), the ones idemhook(1) refers to, written into DIR, which must
/// exist (no folder is created). Prints the files it wrote.
pub fn man(dir: Option<&Path>, cli: clap::Command) -> Result<Outcome, CommandError> {
    let Some(dir) = dir else {
        let mut page = Vec::new();
        clap_mangen::Man::new(man_tree(cli))
            .render(&mut page)
            .context("rendering the man page")?;
        return print_out(&page);
    };
    if !dir.is_dir() {
        let why = if dir.exists() {
            "not a folder"
        } else {
            "no such folder (it is not created)"
        };
        return Err(CommandError::Usage(format!(
            "man --dir {}: {why}",
            dir.display()
        )));
    }
    let mut written = Vec::new();
    write_pages(man_tree(cli), dir, &mut written)
        .with_context(|| format!("writing the man pages into {}", dir.display()))?;
    let list: String = written
        .iter()
        .map(|path| format!("{}\n", path.display()))
        .collect();
    print_out(list.as_bytes())
}

/// The command tree as the man pages show it: no `help` subcommand
/// (every command takes `--help`), built so that each subcommand's name
/// reads `idemhook-events-list`.
fn man_tree(cli: clap::Command) -> clap::Command {
    let mut cmd = cli.disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// One page per command, depth first, as `clap_mangen::generate_to` does,
/// noting each file written.
fn write_pages(cmd: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
        write_pages(sub, dir, written)?;
    }
    written.push(clap_mangen::Man::new(cmd).generate_to(dir)?);
    Ok(())
}

/// Writes to stdout; its error is the command's (`cli` makes a reader
/// that went away, `idemhook man | head`, a quiet exit 0).
fn print_out(bytes: &[u8]) -> Result<Outcome, CommandError> {
    let mut out = crate::ops::text::stdout();
    out.write_all(bytes)?;
    out.flush()?;
    Ok(Outcome::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_shell_is_one_line_naming_the_known_ones() {
        let Err(CommandError::Usage(message)) =
            completions("tcsh\n", clap::Command::new("idemhook"))
        else {
            panic!("tcsh was not refused as usage");
        };
        assert_eq!(
            message,
            r#"unknown shell "tcsh\n": completions are made for bash, zsh, fish"#
        );
    }
}

//! `sluice shell`: one connection, many commands.

use crate::commands::{connect, execute, ClientCmd};
use anyhow::Result;
use clap::Parser;
use std::io::{BufRead, IsTerminal, Write};

#[derive(Parser)]
#[command(
    name = "",
    no_binary_name = true,
    disable_version_flag = true,
    override_usage = "[--json] <COMMAND> [ARGS]...",
    after_help = "quit (or exit, or end of input) leaves the shell. Words are split at \
                  whitespace; quote a word with '...' or \"...\", escape with a backslash."
)]
struct Line {
    /// Print this command's result as JSON.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    cmd: ClientCmd,
}

/// The shell's command tree (for the test that every option has help).
#[cfg(test)]
pub(crate) fn command() -> clap::Command {
    <Line as clap::CommandFactory>::command()
}

/// Splits a line into words: whitespace-separated, with '...' and "..."
/// quoting and backslash escapes.
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(ch) = chars.next() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), '\\') | (None, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                    in_word = true;
                }
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(ch);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err("unterminated quote".into());
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

pub fn run(addr: &str, timeout_ms: u64, json: bool) -> Result<()> {
    let c = connect(addr, timeout_ms)?;
    let interactive = std::io::stdin().is_terminal();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if interactive {
        writeln!(
            out,
            "connected to {addr} (node {}). Type `help`, `quit` to leave.",
            c.server_info().node_id
        )?;
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            write!(out, "sluice> ")?;
            out.flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        let words = match split_words(&line) {
            Ok(w) => w,
            Err(e) => {
                writeln!(out, "error: {e}")?;
                continue;
            }
        };
        match words.first().map(String::as_str) {
            None => continue,
            Some("quit" | "exit") => break,
            _ => {}
        }
        match Line::try_parse_from(&words) {
            Ok(l) => {
                if let Err(e) = execute(&c, l.cmd, json || l.json, &mut out, false) {
                    writeln!(out, "error: {e:#}")?;
                }
            }
            Err(e) => write!(out, "{e}")?,
        }
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::split_words;

    #[test]
    fn splits_with_quotes_and_escapes() {
        assert_eq!(
            split_words(r#"put /vol/a "hello world""#).unwrap(),
            vec!["put", "/vol/a", "hello world"]
        );
        assert_eq!(
            split_words(r"put /vol/a it\'s").unwrap(),
            vec!["put", "/vol/a", "it's"]
        );
        assert_eq!(
            split_words("put /vol/a ''").unwrap(),
            vec!["put", "/vol/a", ""]
        );
        assert!(split_words("put 'x").is_err());
        assert!(split_words("   ").unwrap().is_empty());
    }
}

//! The check that every flag of a program explains itself.

use clap::{ArgAction, Command};

/// Units a flag's name may end in, and the word its help must then use.
const UNITS: &[(&str, &str)] = &[
    ("-secs", "second"),
    ("-ms", "millisecond"),
    ("-bytes", "byte"),
    ("-percent", "percent"),
    ("-per-sec", "per second"),
    ("-per-min", "per minute"),
];

/// What is wrong with the help of `cmd`'s arguments and of all its
/// subcommands', one line per problem (`agentmesh-node run --routers: no
/// help`); empty when every argument has a one-line help, names the unit its
/// flag name ends in (`-secs`: "second", `-bytes`: "byte", ...) and, for a
/// single value with no default clap can print, says its default in words
/// (a repeatable flag's default is none; a switch's is off).
/// Each program's tests assert this is empty for its whole command.
pub fn help_problems(cmd: &Command) -> Vec<String> {
    let mut cmd = cmd.clone();
    cmd.build();
    let mut out = Vec::new();
    walk(&cmd, cmd.get_name(), &mut out);
    out
}

fn walk(cmd: &Command, path: &str, out: &mut Vec<String>) {
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if matches!(id, "help" | "version") {
            continue;
        }
        let name = arg
            .get_long()
            .map(|l| format!("--{l}"))
            .unwrap_or_else(|| id.to_uppercase());
        let help = arg
            .get_help()
            .or(arg.get_long_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let help = help.trim();
        if help.is_empty() {
            out.push(format!("{path} {name}: no help"));
            continue;
        }
        if help.contains('\n') {
            out.push(format!("{path} {name}: help is more than one line"));
        }
        let lower = help.to_lowercase();
        // A repeatable flag's default, none, goes without saying.
        if matches!(arg.get_action(), ArgAction::Set)
            && !arg.is_required_set()
            && arg.get_default_values().is_empty()
            && !lower.contains("default")
        {
            out.push(format!(
                "{path} {name}: no default clap can show, and the help does not say it"
            ));
        }
        if let Some(long) = arg.get_long()
            && let Some((_, word)) = UNITS.iter().find(|(suffix, _)| long.ends_with(suffix))
            && !lower.contains(word)
        {
            out.push(format!(
                "{path} {name}: help does not name its unit ({word}s)"
            ));
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let sub_path = format!("{path} {}", sub.get_name());
        if sub
            .get_about()
            .is_none_or(|a| a.to_string().trim().is_empty())
        {
            out.push(format!("{sub_path}: no about"));
        }
        walk(sub, &sub_path, out);
    }
}

/// The long flags of `cmd` and its subcommands that `doc` (a README) does
/// not name as `` `--flag`` (followed by a space, backtick, `=` or `[`), so
/// each program's tests can keep its flag table complete.
pub fn flags_missing_from(cmd: &Command, doc: &str) -> Vec<String> {
    fn walk(cmd: &Command, doc: &str, out: &mut Vec<String>) {
        for long in cmd.get_arguments().filter_map(|a| a.get_long()) {
            if matches!(long, "help" | "version") {
                continue;
            }
            let named = [" ", "`", "=", "["]
                .iter()
                .any(|end| doc.contains(&format!("`--{long}{end}")));
            if !named && !out.iter().any(|f| f == &format!("--{long}")) {
                out.push(format!("--{long}"));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, doc, out);
        }
    }
    let mut out = Vec::new();
    walk(cmd, doc, &mut out);
    out
}

/// A Markdown table of `cmd`'s own flags (not its subcommands'): flag,
/// default, help. For writing a README's flag table from the program itself.
pub fn flag_table(cmd: &Command) -> String {
    let mut cmd = cmd.clone();
    cmd.build();
    let mut out = String::from("| flag | default | meaning |\n|---|---|---|\n");
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") {
            continue;
        }
        let default: Vec<_> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = if default.is_empty() {
            "—".to_string()
        } else {
            format!("`{}`", default.join(","))
        };
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        let help = help.replace('|', "\\|");
        out.push_str(&format!("| `--{long}` | {default} | {help} |\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    #[test]
    fn a_command_with_complete_help_has_no_problems() {
        let cmd = Command::new("p")
            .arg(
                Arg::new("wait_secs")
                    .long("wait-secs")
                    .default_value("3")
                    .help("How long to wait, seconds."),
            )
            .arg(
                Arg::new("addr")
                    .long("addr")
                    .help("Where to listen (default: none, off)."),
            )
            .arg(
                Arg::new("quiet")
                    .long("quiet")
                    .action(ArgAction::SetTrue)
                    .help("Say less."),
            )
            .subcommand(
                Command::new("call")
                    .about("Call something.")
                    .arg(Arg::new("name").required(true).help("What to call.")),
            );
        assert_eq!(help_problems(&cmd), Vec::<String>::new());
    }

    #[test]
    fn flags_a_readme_does_not_name_are_listed_once() {
        let cmd = Command::new("p")
            .arg(Arg::new("a").long("routers"))
            .arg(Arg::new("b").long("router"))
            .subcommand(Command::new("s").arg(Arg::new("c").long("router")));
        let doc = "| `--routers` | 2 |";
        assert_eq!(flags_missing_from(&cmd, doc), vec!["--router"]);
        assert!(flags_missing_from(&cmd, "`--routers`, `--router N`").is_empty());
        let table = flag_table(&cmd);
        assert!(table.contains("| `--routers` | — |"), "{table}");
    }

    #[test]
    fn each_kind_of_gap_is_named_down_to_subcommands() {
        let cmd = Command::new("p").subcommand(
            Command::new("run")
                .about("Run.")
                .arg(Arg::new("routers").long("routers").default_value("2"))
                .arg(
                    Arg::new("limit_bytes")
                        .long("limit-bytes")
                        .default_value("9")
                        .help("The limit."),
                )
                .arg(Arg::new("addr").long("addr").help("Where to listen."))
                .arg(
                    Arg::new("two")
                        .long("two")
                        .action(ArgAction::SetTrue)
                        .help("One.\nTwo."),
                )
                .subcommand(Command::new("deep")),
        );
        let problems = help_problems(&cmd);
        assert_eq!(
            problems,
            vec![
                "p run --routers: no help",
                "p run --limit-bytes: help does not name its unit (bytes)",
                "p run --addr: no default clap can show, and the help does not say it",
                "p run --two: help is more than one line",
                "p run deep: no about",
            ],
        );
    }
}

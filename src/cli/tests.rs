use super::args::*;
use super::operator::*;
use crate::auth::Permission;
use crate::broker::OldChain;
use crate::config::Settings;
use crate::task::TaskState;

/// Every command says what it does and every argument what it takes,
/// in `--help`: an empty line there is a question left to the reader.
#[test]
fn every_command_and_argument_has_help() {
    use clap::CommandFactory;
    fn walk(command: &clap::Command, path: &str, silent: &mut Vec<String>) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if arg.get_help().is_none() && !matches!(id, "help" | "version") {
                silent.push(format!("{path} {id}"));
            }
        }
        for sub in command.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none() && sub.get_name() != "help" {
                silent.push(path.clone());
            }
            walk(sub, &path, silent);
        }
    }
    let mut silent = Vec::new();
    walk(&Cli::command(), "delayline", &mut silent);
    assert!(silent.is_empty(), "without help: {silent:#?}");
}

#[test]
fn states_and_permissions_are_checked_from_the_codes_own_lists() {
    use clap::CommandFactory;
    let parse = |args: &[&str]| Cli::command().try_get_matches_from(args);
    let bulk = [
        "delayline",
        "bulk",
        "cancel",
        "--destination",
        "#",
        "--state",
    ];
    for state in TaskState::ALL {
        assert!(parse(&[&bulk[..], &[state.as_str()]].concat()).is_ok());
    }
    let error = parse(&[&bulk[..], &["done"]].concat())
        .unwrap_err()
        .to_string();
    assert_eq!(error.matches("possible values").count(), 1, "{error}");
    let create = [
        "delayline",
        "token",
        "create",
        "--name",
        "n",
        "--permission",
    ];
    for permission in Permission::ALL {
        assert!(parse(&[&create[..], &[permission.as_str()]].concat()).is_ok());
    }
    assert!(parse(&[&create[..], &["everything"]].concat()).is_err());
}

#[test]
fn from_is_a_version_or_a_settings_file() {
    let new = Settings::default().cascade().unwrap();
    let by_version = old_chain("3", &new).unwrap();
    assert_eq!(by_version, OldChain::version_of(&new, 3));
    assert_eq!(by_version.levels, None);

    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/delayline.example.toml");
    let by_file = old_chain(example, &new).unwrap();
    assert_eq!((by_file.version, by_file.levels), (1, Some(29)));

    let missing = old_chain("no-such.toml", &new).unwrap_err().to_string();
    assert!(missing.contains("--from no-such.toml"), "{missing}");
}

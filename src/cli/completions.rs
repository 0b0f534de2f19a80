//! The shell completion scripts: clap_complete's, from the same command
//! tree as `--help`, with what it gets wrong or cannot say put right.

use clap::Command;
use clap_complete::Shell;

use crate::config::flags::PRESET_NAMES;

const BIN_NAME: &str = "tcpx-rxdm";

/// The completion script for `shell`.
pub fn script(mut cmd: Command, shell: Shell) -> String {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, BIN_NAME, &mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    match shell {
        Shell::Bash => bash_presets_and_files(&bash_case_labels_fixed(&text)),
        Shell::Zsh => zsh_presets_and_files(&text),
        Shell::Fish => fish_presets_and_files(&text),
        _ => text,
    }
}

/// clap_complete (4.6.11, the newest) names a subcommand's state in bash
/// `tcpx__rxdm__subcmd__inject` where it walks the words, but labels the
/// branch that completes its options `tcpx__subcmd__rxdm__subcmd__inject`
/// (the hyphen in the binary's name turned into a separator): no branch
/// matched, so no subcommand's options were offered. The labels are renamed
/// to the states.
fn bash_case_labels_fixed(text: &str) -> String {
    let wrong = format!("{}__subcmd__", BIN_NAME.replace('-', "__subcmd__"));
    let right = format!("{}__subcmd__", BIN_NAME.replace('-', "__"));
    text.replace(&wrong, &right)
}

// `--gpu_nic_preset` takes a preset's name or a file's path: clap_complete
// offers only the names it lists, so each shell gets the file names too.

/// Bash: its branch for a file path splits words at newlines only
/// (`IFS=$'\n'`, for names with spaces), so the names go one a line: as
/// clap_complete writes them, the list would be one word.
fn bash_presets_and_files(text: &str) -> String {
    let only_names = format!(r#"COMPREPLY=($(compgen -W "{}" -- "${{cur}}"))"#, PRESET_NAMES.join(" "));
    let with_files = format!(
        r#"COMPREPLY=($(compgen -W "$(printf '%s\n' {})" -- "${{cur}}") $(compgen -f -- "${{cur}}"))"#,
        PRESET_NAMES.join(" ")
    );
    text.replace(&only_names, &with_files)
}

/// Zsh: the names and `_files` as alternatives (a colon inside the action
/// of an `_arguments` spec is escaped).
fn zsh_presets_and_files(text: &str) -> String {
    let names = PRESET_NAMES.join(" ");
    let only_names = format!(":GPU_NIC_PRESET:({names})'");
    let with_files =
        format!(r#":GPU_NIC_PRESET:_alternative "presets\:preset\:({names})" "files\:preset file\:_files"'"#);
    text.replace(&only_names, &with_files)
}

/// Fish: `-F` (files too) instead of `-f` (no files) on the flag's lines.
fn fish_presets_and_files(text: &str) -> String {
    let lines = text.split_inclusive('\n').map(|l| match l.contains(" -l gpu_nic_preset ") {
        true => l.replacen(" -r -f -a ", " -r -F -a ", 1),
        false => l.to_string(),
    });
    lines.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_offers_files_after_gpu_nic_preset_as_well_as_the_names() {
        let cmd = super::super::command();
        let zsh = script(cmd.clone(), Shell::Zsh);
        let specs: Vec<&str> = zsh.lines().filter(|l| l.contains("'--gpu_nic_preset=")).collect();
        // The daemon, doctor, nccl-env, inject and inject serve.
        assert_eq!(specs.len(), 5, "{specs:?}");
        for l in &specs {
            assert!(
                l.contains(r#"_alternative "presets\:preset\:(auto a3vm"#) && l.contains("_files"),
                "{l}"
            );
        }
        let fish = script(cmd.clone(), Shell::Fish);
        let lines: Vec<&str> = fish.lines().filter(|l| l.contains(" -l gpu_nic_preset ")).collect();
        assert_eq!(lines.len(), 5, "{lines:?}");
        for l in lines {
            assert!(l.contains(r#" -r -F -a "auto"#), "{l}");
        }
        // Bash's are run by tests/cli.rs.
        let bash = script(cmd, Shell::Bash);
        assert_eq!(bash.matches(r#"$(compgen -f -- "${cur}"))"#).count(), 5);
    }
}

use super::*;

fn words(ws: &[&str]) -> Vec<String> {
    ws.iter().map(|w| w.to_string()).collect()
}

fn bash(script: &str) -> Option<Result<Script, String>> {
    started(&words(&["bash", "-c", script]))
}

const DAEMON: &str = "/tcpgpudmarxd/build/app/tcpgpudmarxd";
const RECIPE_FLAGS: [&str; 6] =
    ["--gpu_nic_preset", "a3vm", "--gpu_shmem_type", "fd", "--setup_param", "--verbose 128 2 0"];

fn recipe_argv() -> Vec<String> {
    let mut argv = vec![DAEMON.to_string()];
    argv.extend(words(&RECIPE_FLAGS));
    argv
}

#[test]
fn the_recipes_script_gives_the_daemons_command_line_and_the_file_it_waits_for() {
    let script = "/tcpgpudmarxd/build/app/tcpgpudmarxd --gpu_nic_preset a3vm --gpu_shmem_type fd \
                  --setup_param \"--verbose 128 2 0\" &\n\
                  while [ ! -e \"/usr/share/workload/workload_terminated\" ]; do sleep 10; echo \"sleeping\"; done\n";
    let s = bash(script).unwrap().unwrap();
    assert_eq!(s.shell, "bash");
    assert_eq!(s.argv, recipe_argv());
    assert_eq!(s.wait_file.as_deref(), Some("/usr/share/workload/workload_terminated"));
}

#[test]
fn small_variations_of_the_loop_are_read_alike() {
    let d = "/tcpgpudmarxd/build/app/tcpgpudmarxd --gpu_nic_preset a3vm --gpu_shmem_type fd \
             --setup_param '--verbose 128 2 0'";
    for script in [
        format!("{d} & while [ ! -e /done/f ]; do sleep 5; done"),
        format!("{d} &\nwhile [ ! -f '/done/f' ]\ndo\n  sleep 10\n  echo sleeping\ndone"),
        format!("# start the daemon\n{d} &\nuntil [ -e /done/f ]; do sleep 1s; done;\n"),
        format!("{d} \\\n  &\nwhile [[ ! -e \"/done/f\" ]]; do :; done"),
        format!("{d} &\n\nwhile test ! -e /done/f; do echo waiting for it; sleep 0.5; true; done  # end\n"),
    ] {
        let s =
            started(&words(&["/bin/sh", "-c", &script])).unwrap().unwrap_or_else(|e| panic!("{script}: {e}"));
        assert_eq!(s.argv, recipe_argv(), "{script}");
        assert_eq!(s.wait_file.as_deref(), Some("/done/f"), "{script}");
        assert_eq!(s.shell, "sh");
    }
}

#[test]
fn the_daemons_command_line_alone_is_read_with_or_without_exec() {
    for script in [
        format!("{DAEMON} --gpu_nic_preset a3vm --gpu_shmem_type fd --setup_param \"--verbose 128 2 0\""),
        format!(
            "exec {DAEMON} --gpu_nic_preset a3vm --gpu_shmem_type fd --setup_param \"--verbose 128 2 0\";\n"
        ),
    ] {
        let s = bash(&script).unwrap().unwrap();
        assert_eq!((s.argv, s.wait_file), (recipe_argv(), None), "{script}");
    }
    let ours = bash("tcpx-rxdm --uds_path=/run/tcpx").unwrap().unwrap();
    assert_eq!(ours.argv, words(&["tcpx-rxdm", "--uds_path=/run/tcpx"]));
}

#[test]
fn scripts_of_other_shapes_are_refused_saying_why() {
    let d = format!("{DAEMON} --gpu_nic_preset a3vm");
    let wait = "while [ ! -e /done/f ]; do sleep 10; done";
    for (script, says) in [
        (String::new(), "it is empty"),
        ("# nothing\n".to_string(), "it is empty"),
        (format!("{d} | tee /log"), "a pipe, a redirection or a group"),
        (format!("{d} > /log 2>&1"), "a pipe, a redirection or a group"),
        (format!("{d} --uds_path $DIR"), "`$` or a backquote"),
        (format!("{d} --uds_path \"$DIR\""), "`$` or a backquote"),
        (format!("{d} --uds_path `pwd`"), "`$` or a backquote"),
        (format!("{d} && {wait}"), "`&&`"),
        (format!("{d} --uds_path /run/*"), "expanded as a pattern"),
        (format!("{d} --uds_path ~/x"), "starts with `~`"),
        (format!("{d} '--uds_path"), "a quote (') is not closed"),
        (format!("{d} \"--uds_path"), "a quote (\") is not closed"),
        (format!("{d} \\"), "ends in a backslash"),
        (format!("set -e; {d}"), "its first command is \"set\", not the daemon"),
        (format!("python train.py & {wait}"), "its first command is \"python\""),
        (format!("GLOG_v=1 {d}"), "its first command is \"GLOG_v=1\""),
        (format!("{d} &"), "only starts the daemon in the background"),
        (format!("{d}; {wait}"), "runs in the foreground, and more follows it"),
        (format!("{d} & sleep infinity"), "holds no `while [ ! -e FILE ]"),
        (format!("{d} & while [ -e /done/f ]; do sleep 1; done"), "holds no `while"),
        (format!("{d} & while [ ! -e /done/f ]; sleep 1; done"), "holds no `while"),
        (format!("{d} & while [ ! -e /done/f ]; do sleep 1"), "holds no `while"),
        (format!("{d} & while [ ! -e done/f ]; do sleep 1; done"), "not an absolute path"),
        (format!("{d} & while [ ! -e /a/../f ]; do sleep 1; done"), "not an absolute path"),
        (format!("{d} & while [ ! -e /done/f ]; do rm -f /x; done"), "its loop runs \"rm -f /x\""),
        (format!("{d} & while [ ! -e /done/f ]; do sleep forever; done"), "its loop runs \"sleep forever\""),
        (format!("{d} & while [ ! -e /done/f ]; do done"), "its loop does nothing"),
        (format!("{d} & {wait}; kill %1"), "more follows the loop"),
        (format!("{d} & {wait} &"), "starts a command in the background"),
        (format!("{d} & & {wait}"), "a `&` follows no command"),
        (format!("{d} & while [ ! -e /done/f ]; do sleep 1;; done"), "`;;`"),
        (format!("{d} & {}", "x".repeat(MAX_SCRIPT)), "longer than 16384 bytes"),
    ] {
        let e = bash(&script).unwrap().unwrap_err();
        assert!(e.contains(says), "{script:?}: {e}");
    }
}

#[test]
fn only_a_shells_dash_c_is_a_script_and_other_forms_are_named() {
    assert!(started(&words(&[DAEMON, "--gpu_nic_preset", "a3vm"])).is_none());
    assert!(started(&words(&["python", "-c", "print()"])).is_none());
    assert!(started(&[]).is_none());
    for (argv, says) in [
        (&["bash", "/start.sh"][..], "bash is not run as `bash -c SCRIPT`"),
        (&["sh", "-ec", "x"][..], "sh is not run as `sh -c SCRIPT`"),
        (&["bash"][..], "bash is not run"),
        (&["bash", "-c", "x", "name", "arg"][..], "2 more word(s) after it"),
    ] {
        let e = started(&words(argv)).unwrap().unwrap_err();
        assert!(e.contains(says), "{argv:?}: {e}");
    }
}

/// Reading is bounded whatever the text: no panic on any short input, and
/// a long one of nothing but separators or quotes is read in one pass.
#[test]
fn any_text_is_read_or_refused_without_a_panic() {
    let alphabet = [' ', '\n', ';', '&', '\\', '\'', '"', '#', '[', 'a', '-', '/', '!', '$'];
    let mut text = String::new();
    for i in 0..20_000usize {
        text.clear();
        let mut n = i;
        while n > 0 {
            text.push(alphabet[n % alphabet.len()]);
            n /= alphabet.len();
        }
        let _ = bash(&text);
    }
    for filler in [";", "\n", "'", "\\\n", "# "] {
        let long = filler.repeat(MAX_SCRIPT / filler.len());
        let _ = bash(&long);
    }
}

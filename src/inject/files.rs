//! The manifests `inject -f` reads, as kubectl reads them: every `-f` in
//! the order given, `-` for stdin, a folder's `.yaml`, `.yml` and `.json`
//! files in name order (its subfolders' too with `-R`).

use std::io::Read as _;
use std::path::Path;

/// Extensions of the files a folder is read for.
const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("-f -: stdin is given twice; it can be read once")]
    StdinTwice,
    #[error("{0}: a URL; inject reads files and stdin: `curl -fsSL {0} | tcpx-rxdm inject -f -`")]
    Url(String),
    #[error("{path}: {why}")]
    Read { path: String, why: String },
    #[error("{0}: a folder with no .yaml, .yml or .json file{1}")]
    Empty(String, &'static str),
}

impl FilesError {
    /// How the command ends: usage for a command line that cannot be right,
    /// failed for input not there.
    pub fn exit(&self) -> crate::types::exit::Exit {
        use crate::types::exit::Exit;
        match self {
            FilesError::StdinTwice | FilesError::Url(_) => Exit::Usage,
            _ => Exit::Failed,
        }
    }
}

/// One input: where it came from (`None`: stdin) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub path: Option<String>,
    pub text: String,
}

fn read_error(path: &Path, e: &std::io::Error) -> FilesError {
    let why = match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or folder".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => e.to_string(),
    };
    FilesError::Read { path: path.display().to_string(), why }
}

/// The files of folder `dir` to read, in name order; its subfolders' too
/// (each in its place in that order) when `recursive`.
fn folder(dir: &Path, recursive: bool, out: &mut Vec<std::path::PathBuf>) -> Result<(), FilesError> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| read_error(dir, &e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| read_error(dir, &e)))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if recursive {
                folder(&p, recursive, out)?;
            }
        } else if p.extension().and_then(|x| x.to_str()).is_some_and(|x| EXTENSIONS.contains(&x)) {
            out.push(p);
        }
    }
    Ok(())
}

/// Reads every input named by `files` (none: stdin), in order.
pub fn read(files: &[String], recursive: bool) -> Result<Vec<Source>, FilesError> {
    let stdin = || -> Result<Source, FilesError> {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| FilesError::Read { path: "stdin".into(), why: e.to_string() })?;
        Ok(Source { path: None, text })
    };
    if files.is_empty() {
        return Ok(vec![stdin()?]);
    }
    if files.iter().filter(|f| *f == "-").count() > 1 {
        return Err(FilesError::StdinTwice);
    }
    if let Some(url) = files.iter().find(|f| f.starts_with("http://") || f.starts_with("https://")) {
        return Err(FilesError::Url(url.clone()));
    }
    let mut out = Vec::new();
    for f in files {
        if f == "-" {
            out.push(stdin()?);
            continue;
        }
        let path = Path::new(f);
        let meta = std::fs::metadata(path).map_err(|e| read_error(path, &e))?;
        let paths = if meta.is_dir() {
            let mut found = Vec::new();
            folder(path, recursive, &mut found)?;
            if found.is_empty() {
                let hint = if recursive { "" } else { " (-R reads its subfolders too)" };
                return Err(FilesError::Empty(f.clone(), hint));
            }
            found
        } else {
            vec![path.to_path_buf()]
        };
        for p in paths {
            let text = std::fs::read_to_string(&p).map_err(|e| read_error(&p, &e))?;
            out.push(Source { path: Some(p.display().to_string()), text });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_read_in_name_order_and_its_subfolders_only_with_r() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("sub")).unwrap();
        for (f, t) in
            [("b.yaml", "b"), ("a.yml", "a"), ("c.json", "c"), ("notes.txt", "x"), ("sub/d.yaml", "d")]
        {
            std::fs::write(d.join(f), t).unwrap();
        }
        let texts = |r| -> Vec<String> {
            read(&[d.display().to_string()], r).unwrap().into_iter().map(|s| s.text).collect()
        };
        assert_eq!(texts(false), ["a", "b", "c"]);
        assert_eq!(texts(true), ["a", "b", "c", "d"]);
        let empty = d.join("sub");
        std::fs::remove_file(empty.join("d.yaml")).unwrap();
        let e = read(&[empty.display().to_string()], false).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("a folder with no .yaml, .yml or .json file (-R reads its subfolders too)"),
            "{e}"
        );
    }

    #[test]
    fn files_in_order_and_what_cannot_be_read_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
        std::fs::write(&a, "a").unwrap();
        std::fs::write(&b, "b").unwrap();
        let names = [b.display().to_string(), a.display().to_string()];
        let got: Vec<String> = read(&names, false).unwrap().into_iter().map(|s| s.text).collect();
        assert_eq!(got, ["b", "a"]);
        let e = read(&["/nonexistent/x.yaml".into()], false).unwrap_err();
        assert_eq!(
            (e.to_string().as_str(), e.exit()),
            ("/nonexistent/x.yaml: no such file or folder", crate::types::exit::Exit::Failed)
        );
        let e = read(&["-".into(), "-".into()], false).unwrap_err();
        assert_eq!(e.exit(), crate::types::exit::Exit::Usage);
        let e = read(&["https://example.com/job.yaml".into()], false).unwrap_err();
        assert!(
            e.to_string().contains("curl -fsSL https://example.com/job.yaml | tcpx-rxdm inject -f -"),
            "{e}"
        );
    }
}

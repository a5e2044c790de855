//! Recordings and exports: the recording format a capture writes and everything reads
//! ([`recording`]), its exports to Parquet, CSV and Perfetto ([`export`]), other
//! instruments' traces imported as recordings ([`import`]), a recording summarised
//! ([`inspect`]), decimated to pixel columns ([`decimate`]) and drawn (`plot`, with the
//! `plots` feature).
pub mod decimate;
pub mod export;
pub mod import;
pub mod inspect;
#[cfg(feature = "plots")]
pub mod plot;
pub mod recording;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Why an output is refused when it is a symbolic link.
const LINK: &str = "it is a symbolic link: railtrace never writes through a link nor replaces one (give the file it points to, or another name)";

/// The rule for every output railtrace writes (recordings, exports, pictures, reports):
/// a path that is a symbolic link is refused, never written through and never replaced.
pub fn refuse_link(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(io::Error::other(LINK)),
        _ => Ok(()),
    }
}

/// `options` opening `path` without following a symbolic link there (see
/// [`refuse_link`]): a link makes the open fail, saying so.
pub fn open_no_link(options: &mut std::fs::OpenOptions, path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    options
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(code) if code == nix::errno::Errno::ELOOP as i32 => io::Error::other(LINK),
            _ => e,
        })
}

/// Where an output is written before it is renamed to its name: `.partial` put before
/// its extension (`run.png` → `run.partial.png`, which a writer that goes by the
/// extension still takes for a PNG), or after a name that has none.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_stem().unwrap_or_default().to_os_string();
    name.push(".partial");
    if let Some(ext) = path.extension() {
        name.push(".");
        name.push(ext);
    }
    path.with_file_name(name)
}

/// Writes the output `path` whole or not at all, refusing a symbolic link (see
/// [`refuse_link`]): `write` writes its [`partial_path`] (created empty, not through a
/// link), which is renamed over `path` once `write` succeeds and removed if it fails, so
/// that a run stopped (Ctrl-C, SIGTERM, a full disk) leaves `path` as it was or complete,
/// never cut.
pub fn through_partial<T, E: From<io::Error>>(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<T, E>,
) -> Result<T, E> {
    refuse_link(path)?;
    let partial = partial_path(path);
    create_output(&partial)?;
    let written = write(&partial).and_then(|v| Ok(std::fs::rename(&partial, path).map(|()| v)?));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// Writes `bytes` to the output `path`, whole or not at all ([`through_partial`]).
pub fn write_output(path: &Path, bytes: impl AsRef<[u8]>) -> io::Result<()> {
    use std::io::Write;
    through_partial(path, |partial| {
        let mut f = create_output(partial)?;
        f.write_all(bytes.as_ref())?;
        f.sync_all()
    })
}

/// Creates (or empties) the output `path`, refusing a symbolic link (see [`refuse_link`]).
pub fn create_output(path: &Path) -> io::Result<File> {
    open_no_link(
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true),
        path,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No output is written through a symbolic link, nor replaces one, `--force` or not:
    /// a link planted at an output's name leaves its target as it was.
    #[test]
    fn no_output_goes_through_a_link() {
        let dir = std::env::temp_dir().join(format!("railtrace-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("someone-elses.txt");
        std::fs::write(&target, "theirs").unwrap();
        let link = dir.join("out.arrow");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = create_output(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(write_output(&link, "ours").is_err());
        assert!(refuse_link(&link).is_err());
        for replace in [false, true] {
            let e = recording::Claim::new(&link, replace)
                .unwrap_err()
                .to_string();
            assert!(e.contains("symbolic link"), "{e}");
        }
        let meta = recording::Meta::new("test", &["r"]);
        let rec = recording::Recording {
            path: dir.join("none.arrow"),
            schema: std::sync::Arc::new(recording::schema(&meta)),
            meta,
            batches: vec![],
            finalised: true,
            damage: vec![],
        };
        let csv = export::Options::new(export::Format::Csv);
        let e = export::export(&rec, &link, &csv).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "theirs");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        // A plain file is written as asked, and replaced whole: through its `.partial`,
        // which is gone after; a write that fails leaves the file as it was.
        let plain = dir.join("plain.txt");
        write_output(&plain, "ours").unwrap();
        write_output(&plain, "ours again").unwrap();
        assert_eq!(std::fs::read_to_string(&plain).unwrap(), "ours again");
        assert!(!partial_path(&plain).exists());
        std::fs::create_dir(partial_path(&plain)).unwrap();
        assert!(write_output(&plain, "lost").is_err());
        assert_eq!(std::fs::read_to_string(&plain).unwrap(), "ours again");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

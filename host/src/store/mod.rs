//! Recordings and exports: the recording format a capture writes and everything reads
//! ([`recording`]), its exports to Parquet, CSV and Perfetto ([`export`]), other
//! instruments' traces imported as recordings ([`import`]), a recording summarised
//! ([`inspect`]) and drawn ([`plot`]).
pub mod export;
pub mod import;
pub mod inspect;
pub mod plot;
pub mod recording;

use std::fs::File;
use std::io;
use std::path::Path;

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

/// Writes `bytes` to the output `path` (created or emptied), refusing a symbolic link
/// (see [`refuse_link`]).
pub fn write_output(path: &Path, bytes: impl AsRef<[u8]>) -> io::Result<()> {
    use std::io::Write;
    create_output(path)?.write_all(bytes.as_ref())
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
        // A plain file is written as asked.
        write_output(&dir.join("plain.txt"), "ours").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

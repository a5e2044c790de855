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

//! The twin's serial port lives in a folder of its own: one that nobody else could have
//! prepared, open to its user alone, and gone when the twin stops.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// Links planted at `links`, all to the folder `target`; removed when dropped.
struct Planted {
    target: PathBuf,
    links: Vec<PathBuf>,
}

impl Drop for Planted {
    fn drop(&mut self) {
        for l in &self.links {
            let _ = std::fs::remove_file(l);
        }
        let _ = std::fs::remove_dir_all(&self.target);
    }
}

#[test]
fn links_planted_where_the_port_used_to_go_are_not_followed() {
    let tmp = std::env::temp_dir();
    let pid = std::process::id();
    let target = tmp.join(format!("railtrace-port-elsewhere-{pid}"));
    let _ = std::fs::remove_dir_all(&target);
    std::fs::create_dir(&target).unwrap();
    // The names the port's folder once had: the process id and a count of twins.
    let links = (0..16)
        .map(|n| tmp.join(format!("railtrace-twin-{pid}-{n}")))
        .collect();
    let planted = Planted { target, links };
    for l in &planted.links {
        let _ = std::fs::remove_file(l);
        std::os::unix::fs::symlink(&planted.target, l).unwrap();
    }
    let twin = railtrace_twin::Twin::start(&railtrace_twin::default_scenario()).unwrap();
    let dir = twin.path().parent().unwrap().to_path_buf();
    let meta = std::fs::symlink_metadata(&dir).unwrap();
    assert!(meta.is_dir(), "{}: {meta:?}", dir.display());
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o700,
        "{}",
        dir.display()
    );
    assert!(!planted.links.contains(&dir), "{}", dir.display());
    assert!(std::fs::metadata(twin.path()).is_ok(), "the port is there");
    twin.stop().unwrap();
    assert!(!dir.exists(), "{} is left behind", dir.display());
    let written: Vec<_> = std::fs::read_dir(&planted.target).unwrap().collect();
    assert!(
        written.is_empty(),
        "the twin wrote through a planted link: {written:?}"
    );
}

//! `amaranth upgrade IMAGE` (docs/SURGERY.md §2.4), without mounting: a format-2 image (full keys,
//! as the previous build wrote it) is refused by `fsck` with the command spelled for it, upgraded
//! once, then reported current; an image that was not closed cleanly is refused and left as it
//! was; odd targets get an error, never a panic.

mod support;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use amaranth_device::{BlockDevice, FileDevice};
use amaranth_engine::{downgrade_for_tests, Superblock};
use support::*;

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A new file system, rewritten as the format-2 image the previous build made.
fn format_2_image(s: &Scratch) -> std::path::PathBuf {
    let image = s.path("old.img");
    let o = s.run(&[
        "mkfs".as_ref(),
        image.as_os_str(),
        "--size".as_ref(),
        "256M".as_ref(),
    ]);
    assert!(o.status.success(), "mkfs: {:?}", text(&o));
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&image).unwrap());
    downgrade_for_tests(dev, 2).unwrap();
    image
}

fn version(image: &Path) -> u32 {
    let dev = FileDevice::open_read_only(image).unwrap();
    Superblock::locate(&dev, false).unwrap().sb.version
}

#[test]
fn a_format_2_image_is_named_upgraded_once_then_current() {
    let s = Scratch::new("upgrade");
    let image = format_2_image(&s);
    let img = image.display().to_string();
    let o = s.run(&["fsck".as_ref(), image.as_os_str()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(8), "{err}");
    assert!(
        err.contains(&format!("run `amaranth upgrade {img}`")),
        "{err}"
    );
    let o = s.run(&["upgrade".as_ref(), image.as_os_str()]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("from format 2 to format 4"), "{out}");
    assert!(
        out.contains("upgraded") && err.contains("nodes"),
        "{out}{err}"
    );
    assert_eq!(version(&image), 4);
    let o = s.run(&["upgrade".as_ref(), image.as_os_str()]);
    let (out, _) = text(&o);
    assert!(
        o.status.success() && out.contains("already at format 4"),
        "{out}"
    );
    let o = s.run(&["fsck".as_ref(), image.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
}

#[test]
fn an_unclean_image_is_refused_and_odd_targets_are_errors() {
    let s = Scratch::new("upgrade-refused");
    let image = format_2_image(&s);
    {
        let dev = FileDevice::open(&image).unwrap();
        let mut sb = Superblock::locate(&dev, false).unwrap().sb;
        sb.clean = false;
        sb.forge_for_tests(&dev).unwrap();
    }
    let before = std::fs::read(&image).unwrap();
    let o = s.run(&["upgrade".as_ref(), image.as_os_str()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("not closed cleanly") && err.contains("mount and unmount"),
        "{err}"
    );
    assert!(
        std::fs::read(&image).unwrap() == before,
        "a refused upgrade wrote"
    );
    for target in [s.path("missing.img"), s.dir.clone()] {
        let o = s.run(&["upgrade".as_ref(), target.as_os_str()]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.starts_with("amaranth: upgrade:") && !err.contains("panicked"),
            "{err}"
        );
    }
    let zeros = s.path("zeros.img");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let o = s.run(&["upgrade".as_ref(), zeros.as_os_str()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("amaranth mkfs"), "{err}");
}

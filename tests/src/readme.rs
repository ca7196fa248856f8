//! What the README and the shipped config say, read at run time: a test of
//! a claim of the README runs the README's own example, never a copy of it
//! that could drift from it.

use std::path::PathBuf;

fn workspace_file(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// The README as it is in the tree.
pub fn readme() -> String {
    workspace_file("README.md")
}

/// The first ```toml block of the README's section `heading` (a line as
/// written, `## Service and config file`), as written.
pub fn toml_block(heading: &str) -> String {
    let text = readme();
    let mut lines = text.lines().skip_while(|l| l.trim_end() != heading);
    assert!(lines.next().is_some(), "README.md has no section `{heading}`");
    let mut lines = lines.skip_while(|l| {
        assert!(!l.starts_with("## "), "README.md's `{heading}` has no ```toml block");
        l.trim_end() != "```toml"
    });
    assert!(lines.next().is_some(), "README.md's `{heading}` has no ```toml block");
    let mut out = String::new();
    for l in lines {
        if l.trim_end() == "```" {
            return out;
        }
        out.push_str(l);
        out.push('\n');
    }
    panic!("README.md's `{heading}`: the ```toml block never ends");
}

/// The README's example config: the one its "Service and config file"
/// section shows.
pub fn example_config() -> String {
    toml_block("## Service and config file")
}

/// The config the package installs as /etc/policer/policer.toml.
pub fn deploy_config() -> String {
    workspace_file("deploy/policer.toml")
}

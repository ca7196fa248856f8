//! Test hooks of a start: environment variables with which the test tiers
//! make one binary play an older build, or fail or pause a start after its
//! Nth kernel change (to check each change is undone, and to signal a start
//! mid-way); and one for a running daemon: fail every change of its rules
//! between the slots and the rule maps (to check the slots are put back).
//! (Two more live where they act: `POLICER_TEST_SLOW_SYNC_MS` in
//! `config/write.rs`, a slow disk under every write of the config file;
//! `POLICER_TEST_SYN_EXACT_MS` in `loader.rs`, how long the SYN path looks
//! listeners up by each SYN's own tuple.)
//!
//! Compiled in only with the `test-hooks` feature of policer-user, which
//! `cargo xtask test` turns on for the binary its tiers run. Without it
//! (release builds, `cargo xtask dist`, `cargo xtask install`) the product
//! reads none of these variables and does not even carry their names.

pub(in crate::daemon) use imp::{Steps, layout_version, rule_maps_write};

#[cfg(feature = "test-hooks")]
mod imp {
    use crate::error::{Error, Result};

    /// The version a started program is stamped with: a number, or `none`
    /// for no stamp (a build from before layout versions).
    const LAYOUT_VERSION: &str = "POLICER_TEST_LAYOUT_VERSION";
    /// Fail the start right after its Nth kernel change.
    const FAIL_AT: &str = "POLICER_TEST_FAIL_AT";
    /// Pause the start for a second after its Nth kernel change.
    const PAUSE_AT: &str = "POLICER_TEST_PAUSE_AT";

    /// Fail every change of a running daemon's rules between writing the
    /// rule slots and writing the rule maps.
    const FAIL_RULE_MAPS: &str = "POLICER_TEST_FAIL_RULE_MAPS";

    /// Runs before a running daemon writes its rule maps.
    pub(in crate::daemon) fn rule_maps_write() -> Result<()> {
        if std::env::var_os(FAIL_RULE_MAPS).is_some() {
            return Err(Error::Invalid(format!(
                "failing on purpose before writing the rule maps ({FAIL_RULE_MAPS}, for tests)"
            )));
        }
        Ok(())
    }

    /// The layout version to stamp a started program with (None: none).
    pub(in crate::daemon) fn layout_version() -> Result<Option<u32>> {
        match std::env::var(LAYOUT_VERSION) {
            Err(_) => Ok(Some(policer_common::LAYOUT_VERSION)),
            Ok(v) if v == "none" => Ok(None),
            Ok(v) => v.parse().map(Some).map_err(|_| Error::Invalid(format!("{LAYOUT_VERSION}: '{v}'"))),
        }
    }

    /// Where the tests asked a start to fail or pause.
    #[derive(Debug)]
    pub(in crate::daemon) struct Steps {
        fail_at: Option<usize>,
        pause_at: Option<usize>,
    }

    impl Steps {
        pub(in crate::daemon) fn from_env() -> Result<Steps> {
            let step = |name: &str| -> Result<Option<usize>> {
                match std::env::var(name) {
                    Err(_) => Ok(None),
                    Ok(v) => v.parse().map(Some).map_err(|_| Error::Invalid(format!("{name}: '{v}'"))),
                }
            };
            Ok(Steps { fail_at: step(FAIL_AT)?, pause_at: step(PAUSE_AT)? })
        }

        /// Runs after the start's `n`th kernel change (counted from 1).
        pub(in crate::daemon) fn after_change(&self, n: usize) -> Result<()> {
            if self.pause_at == Some(n) {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
            if self.fail_at == Some(n) {
                return Err(Error::Invalid(format!(
                    "failing on purpose after kernel change {n} ({FAIL_AT}, for tests)"
                )));
            }
            Ok(())
        }
    }
}

#[cfg(not(feature = "test-hooks"))]
mod imp {
    use crate::error::Result;

    /// The product's programs carry this build's layout version.
    pub(in crate::daemon) fn layout_version() -> Result<Option<u32>> {
        Ok(Some(policer_common::LAYOUT_VERSION))
    }

    /// No hooks: a change of the rules never fails on purpose.
    pub(in crate::daemon) fn rule_maps_write() -> Result<()> {
        Ok(())
    }

    /// No hooks: a start neither fails nor pauses on purpose.
    #[derive(Debug)]
    pub(in crate::daemon) struct Steps;

    impl Steps {
        pub(in crate::daemon) fn from_env() -> Result<Steps> {
            Ok(Steps)
        }

        pub(in crate::daemon) fn after_change(&self, _n: usize) -> Result<()> {
            Ok(())
        }
    }
}

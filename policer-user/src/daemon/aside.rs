//! What the owner does beside a long change (issue 41, point 2): an import
//! of a million entries takes the kernel seconds; its steps run on a
//! thread of their own while the owner serves the changes queued meanwhile
//! that cannot meet it. The change says which prefixes it touches
//! ([`Guard`], `sets.rs`); the owner says what it serves ([`Aside`],
//! `owner.rs`: `Serve`).

use ipnet::IpNet;

use super::Daemon;

/// What the owner may do while a long change (an import of a million
/// entries takes the kernel seconds) is under way, between two of its
/// steps: the change's prefixes are `guard`'s, and what it leaves between
/// steps is whole (`owner.rs`: `Daemon::write_import`).
pub(super) trait Aside {
    fn serve(&mut self, d: &mut Daemon, guard: &Guard<'_>);
    /// Anything to serve at all (else the long steps just run).
    fn serves(&self) -> bool {
        true
    }
}

/// Nothing aside: a dry run's import, a reload's.
pub(super) struct Nothing;

impl Aside for Nothing {
    fn serve(&mut self, _: &mut Daemon, _: &Guard<'_>) {}

    fn serves(&self) -> bool {
        false
    }
}

/// The prefixes a long import changes (the set's before and after): a
/// change served beside it ([`Aside`]) must not meet them.
pub(super) struct Guard<'a> {
    pub lists: [&'a [IpNet]; 2],
    /// The import writes entries: the tries decide meanwhile (the fast
    /// path stays off).
    pub tries: bool,
}

impl Guard<'_> {
    /// `p` holds, or lies inside, one of the import's prefixes.
    pub fn meets(&self, p: IpNet) -> bool {
        self.lists.iter().any(|l| crate::sets::overlaps(l, p))
    }
}

//! A render shared by every request waiting for it.
//!
//! One task per view renders on one blocking thread, only when asked, and
//! publishes each result on a `watch` channel. A request notes when it
//! arrived, asks for a render, and waits (as a task, holding no thread)
//! for the first result whose render began after that: its answer is
//! never older than the request, and any number of requests at once cost
//! at most two renders (the one running when they came, and the next).
//! A scrape storm therefore holds one blocking thread, not all of them.
//! A paced render ([`Shared::paced`], `/metrics`) also rests as long as it
//! took before the next begins: however many scrapers, renders take at
//! most half of one core.

use std::{sync::Arc, time::Instant};

use tokio::sync::watch;

use crate::error::{Error, Result};

/// The last render: when it began, and what it gave (an error as text:
/// every waiter gets a copy).
type Rendered<T> = Option<(Instant, std::result::Result<T, String>)>;

/// The longest a paced render rests after rendering.
const MAX_REST: std::time::Duration = std::time::Duration::from_secs(1);

pub struct Shared<T> {
    /// The latest time a request arrived; the render task follows it.
    asked: watch::Sender<Option<Instant>>,
    done: watch::Receiver<Rendered<T>>,
}

impl<T: Clone + Send + Sync + 'static> Shared<T> {
    /// Starts the render task on the current runtime; it ends when this is
    /// dropped.
    pub fn new(render: impl Fn() -> Result<T> + Send + Sync + 'static) -> Shared<T> {
        Shared::start(render, false)
    }

    /// [`Shared::new`], resting after each render as long as it took.
    pub fn paced(render: impl Fn() -> Result<T> + Send + Sync + 'static) -> Shared<T> {
        Shared::start(render, true)
    }

    fn start(render: impl Fn() -> Result<T> + Send + Sync + 'static, paced: bool) -> Shared<T> {
        let (asked, mut want) = watch::channel(None::<Instant>);
        let (publish, done) = watch::channel(None);
        let render = Arc::new(render);
        tokio::spawn(async move {
            let mut last: Option<Instant> = None;
            loop {
                // A request that came after the last render began (the
                // current value is checked first: one made while it ran).
                let fresh = |a: &Option<Instant>| a.is_some_and(|a| last.is_none_or(|l| a > l));
                if want.wait_for(fresh).await.is_err() {
                    return;
                }
                let began = Instant::now();
                let r = render.clone();
                let out = super::blocking(move || r()).await.map_err(|e| e.to_string());
                last = Some(began);
                publish.send_replace(Some((began, out)));
                if paced {
                    // At most a second: a scrape that just missed a render
                    // waits the rest, then a whole render, within its
                    // timeout even when a render takes seconds.
                    tokio::time::sleep(began.elapsed().min(MAX_REST)).await;
                }
            }
        });
        Shared { asked, done }
    }

    /// The first render that began at or after this call.
    pub async fn get(&self) -> Result<T> {
        let now = Instant::now();
        let mut done = self.done.clone();
        self.asked.send_if_modified(|a| {
            let later = a.is_none_or(|a| now > a);
            if later {
                *a = Some(now);
            }
            later
        });
        let fresh = |d: &Rendered<T>| d.as_ref().is_some_and(|(began, _)| *began >= now);
        match done.wait_for(fresh).await {
            Ok(d) => match d.as_ref() {
                Some((_, Ok(v))) => Ok(v.clone()),
                Some((_, Err(e))) => Err(Error::Invalid(e.clone())),
                None => Err(Error::Invalid("internal error: no render".into())),
            },
            Err(_) => Err(Error::ShuttingDown { note: "" }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::{AtomicUsize, Ordering},
        time::Duration,
    };

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_waiters_share_few_renders_and_none_is_older_than_its_request() {
        let renders = Arc::new(AtomicUsize::new(0));
        let n = renders.clone();
        let shared = Arc::new(Shared::new(move || {
            // When the render began: an answer begun before its request
            // would be older than it.
            let began = Instant::now();
            std::thread::sleep(Duration::from_millis(50));
            Ok((n.fetch_add(1, Ordering::SeqCst) + 1, began))
        }));
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let s = shared.clone();
            tasks.push(tokio::spawn(async move {
                let asked = Instant::now();
                let (_, rendered_at) = s.get().await.unwrap();
                assert!(rendered_at >= asked, "an answer older than its request");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // All 200 arrived within the first render or two.
        let count = renders.load(Ordering::SeqCst);
        assert!((1..=3).contains(&count), "{count} renders for 200 requests at once");
        // A later request gets a new render.
        let (k, _) = shared.get().await.unwrap();
        assert_eq!(k, count + 1);
    }

    /// Requests back to back on a paced render: it rests as long as it
    /// took between renders.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paced_render_rests_as_long_as_it_took() {
        let shared = Shared::paced(|| {
            std::thread::sleep(Duration::from_millis(40));
            Ok(())
        });
        let t0 = Instant::now();
        for _ in 0..5 {
            shared.get().await.unwrap();
        }
        // 5 renders of 40 ms and 4 rests between them.
        let ms = t0.elapsed().as_millis();
        assert!(ms >= 5 * 40 + 4 * 40, "{ms} ms");
    }

    #[tokio::test]
    async fn an_error_reaches_every_waiter() {
        let shared = Shared::<u32>::new(|| Err(Error::Invalid("no map".into())));
        let (a, b) = tokio::join!(shared.get(), shared.get());
        assert_eq!(a.unwrap_err().to_string(), "no map");
        assert_eq!(b.unwrap_err().to_string(), "no map");
    }
}

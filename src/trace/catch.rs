//! A subscriber that keeps every span and event it is shown, for the tracing tests (the unit
//! tests beside `trace.rs` and `tests/tracing.rs`): not API.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tracing::field::{Field, Visit};
use tracing::{Event, Metadata, Subscriber, span};

/// One span opened or event raised: its name (a span's) or message (an event's), its fields,
/// and for an event the span it was raised in.
#[derive(Clone, Debug, Default)]
pub struct Caught {
    /// A span (else an event).
    pub span: bool,
    /// The span's name or the event's message.
    pub name: String,
    /// The fields, each as text (`&str` values as they are, others as `Debug` prints them).
    pub fields: BTreeMap<String, String>,
    /// For an event, the name of the span it was raised in.
    pub within: Option<String>,
}

impl Caught {
    /// The field `name`'s text, empty if it has none.
    #[must_use]
    pub fn field(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", String::as_str)
    }
}

/// One line: `span NAME k=v ...` or `event MESSAGE k=v ... in SPAN`.
impl fmt::Display for Caught {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}",
            if self.span { "span" } else { "event" },
            self.name
        )?;
        for (k, v) in &self.fields {
            write!(f, " {k}={v}")?;
        }
        match &self.within {
            Some(span) => write!(f, " in {span}"),
            None => Ok(()),
        }
    }
}

impl Visit for Caught {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.name);
        } else {
            self.fields
                .insert(field.name().to_owned(), value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        if field.name() == "message" {
            self.name = text;
        } else {
            self.fields.insert(field.name().to_owned(), text);
        }
    }
}

/// The subscriber: install it (`tracing::subscriber::with_default`, or as the global default
/// in a child process), then [`take`](Self::take) what it caught.
#[derive(Clone, Debug, Default)]
pub struct Catch {
    caught: Arc<Mutex<Vec<Caught>>>,
    /// Span names by id (id `i` is entry `i - 1`), and the spans entered now.
    spans: Arc<Mutex<(Vec<String>, Vec<u64>)>>,
}

impl Catch {
    /// Everything caught since the last take, in order.
    #[must_use]
    pub fn take(&self) -> Vec<Caught> {
        std::mem::take(&mut *lock(&self.caught))
    }
}

/// A test's lock: a panic elsewhere leaves what was caught readable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Subscriber for Catch {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, attrs: &span::Attributes<'_>) -> span::Id {
        let mut caught = Caught {
            span: true,
            name: attrs.metadata().name().to_owned(),
            ..Caught::default()
        };
        attrs.record(&mut caught);
        let mut spans = lock(&self.spans);
        spans.0.push(caught.name.clone());
        lock(&self.caught).push(caught);
        span::Id::from_u64(spans.0.len() as u64)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let spans = lock(&self.spans);
        let within = event
            .parent()
            .map(span::Id::into_u64)
            .or_else(|| spans.1.last().copied())
            .and_then(|id| {
                spans
                    .0
                    .get(usize::try_from(id).ok()?.checked_sub(1)?)
                    .cloned()
            });
        let mut caught = Caught {
            within,
            ..Caught::default()
        };
        event.record(&mut caught);
        lock(&self.caught).push(caught);
    }

    fn enter(&self, id: &span::Id) {
        lock(&self.spans).1.push(id.into_u64());
    }

    fn exit(&self, _: &span::Id) {
        lock(&self.spans).1.pop();
    }
}

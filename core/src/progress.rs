//! One terminal area for every progress bar, so a grid of runs (`ssl compare`) keeps its own bar
//! above the bars of the run and evaluation in progress.

use std::sync::OnceLock;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

fn area() -> &'static MultiProgress {
    static AREA: OnceLock<MultiProgress> = OnceLock::new();
    AREA.get_or_init(MultiProgress::new)
}

/// Whether the bars are drawn (on stderr, the default) or hidden, for callers that show their
/// own progress (the Python package's `progress=False`).
pub fn set_visible(visible: bool) {
    area().set_draw_target(match visible {
        true => indicatif::ProgressDrawTarget::stderr(),
        false => indicatif::ProgressDrawTarget::hidden(),
    });
}

/// A bar of `len` steps drawn with `template` (indicatif syntax) in the shared area.
pub fn bar(len: u64, template: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(template)
        .expect("progress templates are literals checked by the tests")
        .progress_chars("=> ");
    area().add(ProgressBar::new(len).with_style(style))
}

/// Prints a line above the bars without tearing them, or on stderr where no bars are drawn
/// (not a terminal, or bars turned off): indicatif drops such lines.
pub fn println(line: impl AsRef<str>) {
    match area().is_hidden() {
        true => eprintln!("{}", line.as_ref()),
        false => {
            let _ = area().println(line);
        }
    }
}

/// A ticking spinner with `message` in the shared area, for work of unknown length (e.g.
/// decoding a data set into its cache on first use); cleared when dropped.
pub fn spinner(message: impl Into<std::borrow::Cow<'static, str>>) -> Spinner {
    let bar = bar(0, "{spinner} {msg} ({elapsed})");
    bar.set_message(message);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    Spinner(bar)
}

/// See [`spinner`].
pub struct Spinner(ProgressBar);

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

//! Why a policy was refused: every problem found, each with its place.

use std::fmt;
use std::ops::Range;

/// One problem in a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line of the construct at fault (0 when it has no place,
    /// such as a limit on the whole document).
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            f.write_str(&self.message)
        } else {
            write!(
                f,
                "line {}, column {}: {}",
                self.line, self.column, self.message
            )
        }
    }
}

/// A refused policy: nothing of it applies.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct PolicyError {
    /// At least one.
    pub problems: Vec<Problem>,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "policy refused ({n} problem{}):",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

/// Turns byte spans into lines and columns of one text.
pub(crate) struct Locator<'a> {
    text: &'a str,
    pub(crate) problems: Vec<Problem>,
}

impl<'a> Locator<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Locator {
            text,
            problems: Vec::new(),
        }
    }

    pub(crate) fn text(&self) -> &'a str {
        self.text
    }

    pub(crate) fn at(&mut self, span: Range<usize>, message: impl Into<String>) {
        let (line, column) = if span == (0..0) {
            (0, 0)
        } else {
            line_column(self.text, span.start)
        };
        self.problems.push(Problem {
            line,
            column,
            message: message.into(),
        });
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

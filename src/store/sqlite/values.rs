//! Batches bound as a `VALUES` list of parameters, for the writer's
//! statements that take many rows at once. A JSON array read by
//! `jsonb_each` costs one extraction per column and row, which was a tenth
//! of the server's instructions (BENCHMARKS.md, "SQLite's JSON batches");
//! a bound value is read as it is. A statement's text depends on its row
//! count, so a batch is padded with rows of NULL up to the next power of
//! two, and each statement is made once per size: a handful of cached
//! statements serve every batch.

use std::sync::OnceLock;

use rusqlite::ToSql;
use rusqlite::types::Null;

/// Most rows of one statement: SQLite takes at most 32 766 parameters.
pub const ROWS_MAX: usize = 256;

/// A statement over a `VALUES` list of `columns` parameters a row
/// (`column1`, `column2`, … in SQL), made once for each padded size.
pub struct Sized {
    columns: usize,
    /// The statement, given the `VALUES` list.
    build: fn(&str) -> String,
    texts: OnceLock<Vec<String>>,
}

impl Sized {
    pub const fn new(columns: usize, build: fn(&str) -> String) -> Self {
        Self {
            columns,
            build,
            texts: OnceLock::new(),
        }
    }

    /// The statement for `params` (whole rows, at most [`ROWS_MAX`]), and
    /// `params` padded with rows of NULL to its size.
    pub fn bind<'p>(&self, mut params: Vec<&'p dyn ToSql>) -> (&str, Vec<&'p dyn ToSql>) {
        let rows = (params.len() / self.columns).max(1).next_power_of_two();
        params.resize(rows * self.columns, &Null);
        let texts = self.texts.get_or_init(|| {
            (0..=ROWS_MAX.trailing_zeros())
                .map(|k| {
                    let row = format!("({})", vec!["?"; self.columns].join(", "));
                    (self.build)(&vec![row; 1 << k].join(", "))
                })
                .collect()
        });
        (&texts[rows.trailing_zeros() as usize], params)
    }
}

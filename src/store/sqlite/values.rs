//! Batches bound as a `VALUES` list of parameters, for the writer's
//! statements that take many rows at once. A JSON array read by
//! `jsonb_each` costs one extraction per column and row, which was a tenth
//! of the server's instructions (docs/perf-log/sqlite.md, "SQLite's JSON batches");
//! a bound value is read as it is. A statement's text depends on its row
//! count, so a batch is padded with rows of NULL up to the next power of
//! two, and each statement is made once per size: a handful of cached
//! statements serve every batch.

use std::collections::HashSet;
use std::sync::OnceLock;

use rusqlite::types::Null;
use rusqlite::{Connection, ToSql, params_from_iter};

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

    /// The statement's text for `rows` rows (a power of two, at most
    /// [`ROWS_MAX`]); tests read its plan.
    pub fn text(&self, rows: usize) -> String {
        let row = format!("({})", vec!["?"; self.columns].join(", "));
        (self.build)(&vec![row; rows].join(", "))
    }

    /// The statement for `params` (whole rows, at most [`ROWS_MAX`]), and
    /// `params` padded with rows of NULL to its size.
    fn bind<'p>(&self, mut params: Vec<&'p dyn ToSql>) -> (&str, Vec<&'p dyn ToSql>) {
        let rows = (params.len() / self.columns).max(1).next_power_of_two();
        params.resize(rows * self.columns, &Null);
        let texts = self.texts.get_or_init(|| {
            (0..=ROWS_MAX.trailing_zeros())
                .map(|k| self.text(1 << k))
                .collect()
        });
        (&texts[rows.trailing_zeros() as usize], params)
    }

    /// Run the statement over `rows`, [`ROWS_MAX`] a statement, and gather
    /// the ids it returns (its first column).
    pub fn ids<R: Row>(&self, conn: &Connection, rows: &[R]) -> rusqlite::Result<HashSet<String>> {
        let mut ids = HashSet::new();
        for chunk in rows.chunks(ROWS_MAX) {
            let mut params = Vec::with_capacity(chunk.len() * self.columns);
            for row in chunk {
                row.push_to(&mut params);
            }
            debug_assert_eq!(params.len(), chunk.len() * self.columns, "columns a row");
            let (sql, params) = self.bind(params);
            let mut stmt = conn.prepare_cached(sql)?;
            for id in stmt.query_map(params_from_iter(params), |r| r.get::<_, String>(0))? {
                ids.insert(id?);
            }
        }
        Ok(ids)
    }
}

/// A row of a [`Sized`] statement: its values as parameters, in order.
pub trait Row {
    fn push_to<'p>(&'p self, params: &mut Vec<&'p dyn ToSql>);
}

/// [`Row`] for a tuple whose every field is a column.
macro_rules! tuple_row {
    ($($t:ident . $i:tt),+) => {
        impl<$($t: ToSql),+> Row for ($($t,)+) {
            fn push_to<'p>(&'p self, params: &mut Vec<&'p dyn ToSql>) {
                params.extend([$(&self.$i as &dyn ToSql),+]);
            }
        }
    };
}

tuple_row!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7);
tuple_row!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8);
tuple_row!(
    A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12, N.13, O.14, P.15
);
